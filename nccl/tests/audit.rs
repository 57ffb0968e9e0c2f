//! `LD_AUDIT=libstrata_nccl_audit.so`: a program linked with `-lnccl` (its
//! `libnccl.so.2` found through its rpath, as PyTorch's wheels find theirs) binds its
//! NCCL calls to libstrata_nccl.so, whose forwarded calls still reach the real library
//! that the program's search found; without `LD_AUDIT` the same program binds to the real
//! library. Both rpath kinds: `DT_RUNPATH` (the linker's default) and `DT_RPATH`
//! (PyTorch's `--force-rpath`).

mod common;

use common::{cc, run, s, stdout};

#[test]
fn audit_sends_libnccl_to_the_front_library() {
    let Some(real) = common::real_lib() else {
        return;
    };
    let front = common::front_lib();
    let audit = common::audit_lib();
    let dir = common::scratch("audit");
    let wheel = real.parent().expect("the wheel's lib dir");
    let l = format!("-L{}", s(wheel));
    let rpath = format!("-Wl,-rpath,{}", s(wheel));
    for (kind, dtags) in [
        ("runpath", "-Wl,--enable-new-dtags"),
        ("rpath", "-Wl,--disable-new-dtags"),
    ] {
        let exe = dir.join(format!("audit-{kind}"));
        let Some(()) = cc("audit.c", &exe, &[&l, "-l:libnccl.so.2", &rpath, dtags]) else {
            return;
        };
        let plain = stdout(&run(&exe, &[], &[]));
        assert!(
            plain.contains(&format!("ncclGetVersion in: {}\n", s(&real))),
            "{kind}:\n{plain}"
        );
        assert!(
            plain.contains("ncclParamGetParameter(NCCL_DEBUG) = 0, WARN"),
            "{kind}:\n{plain}"
        );

        // The front library this test built (target/<profile>/deps/): the audit's default,
        // libstrata_nccl.so beside itself, is `cargo build`'s copy.
        let env = [
            ("LD_AUDIT", Some(s(&audit))),
            ("STRATA_NCCL_FRONT_LIB", Some(s(&front))),
        ];
        let audited = stdout(&run(&exe, &[], &env));
        assert!(
            audited.contains(&format!("ncclGetVersion in: {}\n", s(&front))),
            "{kind}: not bound to the front library:\n{audited}"
        );
        // The served ncclGetVersion reports the real library's version: it found it.
        assert!(
            audited.contains("ncclGetVersion = 0, 23203"),
            "{kind}:\n{audited}"
        );
        // The forwarded call reached the real library, loaded from where the program's
        // search found it.
        assert!(
            audited.contains("ncclParamGetParameter(NCCL_DEBUG) = 0, WARN"),
            "{kind}:\n{audited}"
        );
        assert!(
            audited.contains(&format!("libnccl.so.2 mapped: {}\n", s(&real))),
            "{kind}:\n{audited}"
        );
    }
}
