//! libstrata_nccl.so exports exactly NCCL 2.32.3's `nccl*` functions: the real library's
//! (`STRATA_NCCL_LIB`, read with `nm -D --defined-only`) are `SERVED` and `FORWARDED`,
//! split without overlap, and this library defines every one of them (a name it missed
//! would bind to the real library, which would receive strata's communicator).

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use strata_nccl::symbols::{FORWARDED, SERVED};

/// The `nccl*` functions `lib` defines in its dynamic symbol table; `None` (skipped)
/// without `nm`.
fn exports(lib: &Path) -> Option<BTreeSet<String>> {
    let out = match Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
    {
        Ok(o) => o,
        Err(e) => return common::skip(&format!("no nm ({e}): binutils")),
    };
    assert!(out.status.success(), "nm {}", lib.display());
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let (_addr, kind, name) = (f.next()?, f.next()?, f.next()?);
                (matches!(kind, "T" | "W" | "i") && name.starts_with("nccl"))
                    .then(|| name.to_owned())
            })
            .collect(),
    )
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn served_and_forwarded_split_the_real_exports() {
    let (served, forwarded) = (set(SERVED), set(FORWARDED));
    assert_eq!(served.len(), SERVED.len(), "SERVED lists a name twice");
    assert_eq!(
        forwarded.len(),
        FORWARDED.len(),
        "FORWARDED lists a name twice"
    );
    let both: Vec<_> = served.intersection(&forwarded).collect();
    assert!(both.is_empty(), "served and forwarded: {both:?}");
    let Some(real) = common::real_lib() else {
        return;
    };
    let Some(real) = exports(&real) else { return };
    let ours: BTreeSet<String> = served.union(&forwarded).cloned().collect();
    assert_eq!(
        ours.difference(&real).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "listed but not exported by the real library"
    );
    assert_eq!(
        real.difference(&ours).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "exported by the real library but in neither list"
    );
}

#[test]
fn forwarded_are_exported_and_nothing_else_is() {
    let Some(front) = exports(&common::front_lib()) else {
        return;
    };
    let missing: Vec<_> = FORWARDED.iter().filter(|n| !front.contains(**n)).collect();
    assert!(
        missing.is_empty(),
        "forwarded but not exported: {missing:?}"
    );
    let listed = set(SERVED)
        .union(&set(FORWARDED))
        .cloned()
        .collect::<BTreeSet<_>>();
    let extra: Vec<_> = front.difference(&listed).collect();
    assert!(
        extra.is_empty(),
        "exported but neither served nor forwarded: {extra:?}"
    );
}

#[test]
fn exports_equal_the_real_library() {
    let Some(real) = common::real_lib() else {
        return;
    };
    let (Some(real), Some(front)) = (exports(&real), exports(&common::front_lib())) else {
        return;
    };
    assert_eq!(
        real.difference(&front).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "the real library exports these and libstrata_nccl.so does not"
    );
    assert_eq!(
        front.difference(&real).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "libstrata_nccl.so exports these and the real library does not"
    );
}
