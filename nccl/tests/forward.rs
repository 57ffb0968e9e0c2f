//! The forwarding trampolines, from C programs (tests/c/): the forwarded functions that
//! work without a GPU return the same through libstrata_nccl.so as from the real
//! libnccl.so.2 (`STRATA_NCCL_LIB`); nothing loads the real library before the first
//! forwarded call; without a real library they return `ncclInvalidUsage` (5); and a
//! stand-in real library (tests/c/fake_nccl.c) shows every way of passing a value
//! (struct returns, stack arguments, doubles, varargs) goes through untouched, through
//! the lazy first call too. (`ncclGetLastError`, which reports the no-library message,
//! is served by the other half of the library; the message is `forward::last_error`.)

mod common;

use common::{cc, run, s, stdout};

/// The lines that must agree between two runs (all but where the function lives).
fn results(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| !l.starts_with("where:") && !l.starts_with("mapped"))
        .collect()
}

#[test]
fn forwarded_calls_match_the_real_library() {
    let Some(real) = common::real_lib() else {
        return;
    };
    let front = common::front_lib();
    let dir = common::scratch("forward");
    let wheel = real.parent().expect("the wheel's lib dir");
    let linked_real = dir.join("forward-real");
    let linked_front = dir.join("forward-front");
    let rpath = format!("-Wl,-rpath,{}", s(wheel));
    let l = format!("-L{}", s(wheel));
    let Some(()) = cc("forward.c", &linked_real, &[&l, "-l:libnccl.so.2", &rpath]) else {
        return;
    };
    let fdir = front.parent().unwrap();
    let (lf, rf) = (format!("-L{}", s(fdir)), format!("-Wl,-rpath,{}", s(fdir)));
    cc(
        "forward.c",
        &linked_front,
        &[&lf, "-l:libstrata_nccl.so", &rf],
    )
    .unwrap();

    // The real library, directly.
    let direct = stdout(&run(&linked_real, &[], &[]));
    assert!(
        direct.contains("ncclParamGetParameter(NCCL_DEBUG) = 0, WARN"),
        "{direct}"
    );
    assert!(direct.contains(&format!("where: {}", s(&real))), "{direct}");

    // The same program with libstrata_nccl.so preloaded: the front's trampolines answer,
    // the real library computes.
    let preloaded = stdout(&run(&linked_real, &[], &[("LD_PRELOAD", Some(s(&front)))]));
    assert_eq!(results(&preloaded), results(&direct), "{preloaded}");
    assert!(
        preloaded.contains(&format!("where: {}", s(&front))),
        "{preloaded}"
    );

    // A program linked with the front only: the real library is loaded at the first
    // forwarded call, not before.
    let env = [("STRATA_NCCL_REAL_LIB", Some(s(&real)))];
    let lazy = stdout(&run(&linked_front, &["lazy"], &env));
    assert_eq!(results(&lazy), results(&direct), "{lazy}");
    assert!(lazy.contains("mapped before: no\n"), "{lazy}");
    assert!(lazy.contains("mapped after: yes\n"), "{lazy}");
}

#[test]
fn without_a_real_library_forwarded_calls_fail_cleanly() {
    let front = common::front_lib();
    let dir = common::scratch("forward-none");
    let exe = dir.join("forward-front");
    let fdir = front.parent().unwrap();
    let (lf, rf) = (format!("-L{}", s(fdir)), format!("-Wl,-rpath,{}", s(fdir)));
    let Some(()) = cc("forward.c", &exe, &[&lf, "-l:libstrata_nccl.so", &rf]) else {
        return;
    };
    // run() clears LD_LIBRARY_PATH and STRATA_NCCL_LIB; the name libnccl.so.2 may still
    // be found in the loader's cache or default directories (a machine with NCCL
    // installed), which the program reports as mapped.
    let out = stdout(&run(
        &exe,
        &["lazy"],
        &[("STRATA_NCCL_REAL_LIB", Some("/nonexistent"))],
    ));
    if out.contains("mapped after: yes") {
        eprintln!("note: skipped: libnccl.so.2 is on the loader's default path here:\n{out}");
        return;
    }
    for line in [
        "ncclParamGetParameter(NCCL_DEBUG) = 5,",
        "ncclParamGetAllParameterKeys = 5,",
        "ncclParamBind(NCCL_DEBUG) = 5",
        // An int function returns -1, a void one returns.
        "ncclLLA2ACalcSlots(1024, 8) = -1",
        "ncclResetDebugInit returned",
    ] {
        assert!(out.contains(line), "{line:?} not in:\n{out}");
    }
}

#[test]
fn every_calling_convention_goes_through() {
    let front = common::front_lib();
    let dir = common::scratch("forward-abi");
    let fake = dir.join("libfake_nccl.so");
    let Some(()) = cc("fake_nccl.c", &fake, &["-shared", "-fPIC"]) else {
        return;
    };
    let exe = dir.join("abi");
    let fdir = front.parent().unwrap();
    let (lf, rf) = (format!("-L{}", s(fdir)), format!("-Wl,-rpath,{}", s(fdir)));
    cc("abi.c", &exe, &["-O2", &lf, "-l:libstrata_nccl.so", &rf]).unwrap();
    for first in ["team", "big", "stack", "xmm", "varargs"] {
        // run() fails on a nonzero exit: a value that came back wrong.
        let out = stdout(&run(
            &exe,
            &[first],
            &[("STRATA_NCCL_REAL_LIB", Some(s(&fake)))],
        ));
        assert_eq!(out.matches(": ok").count(), 6, "{first}:\n{out}");
    }
}
