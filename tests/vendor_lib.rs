//! The NCCL / RCCL loader (features `cuda`, `rocm`): the real library from the
//! nvidia-nccl-cu12 wheel (scripts/gpu-toolchains exports STRATA_NCCL_LIB; with
//! STRATA_REQUIRE_NCCL=1 its absence fails the test), symbol resolution, versions,
//! unique ids, result-code mapping, and clear errors (never a panic) where a library or
//! a GPU is missing.
#![cfg(any(feature = "cuda", feature = "rocm"))]

use strata::transport::vendor::{Vendor, VendorLib, VendorUniqueId};

#[test]
fn nccl_loads_and_makes_unique_ids() {
    let lib = match VendorLib::get(Vendor::Nccl) {
        Ok(l) => l,
        Err(e) => {
            let m = e.to_string();
            assert!(
                m.contains("STRATA_NCCL_LIB") && m.contains("libnccl.so.2"),
                "{m}"
            );
            assert_eq!(e.code(), 2);
            assert!(
                std::env::var("STRATA_REQUIRE_NCCL").is_err(),
                "STRATA_REQUIRE_NCCL is set but NCCL did not load: {m}"
            );
            return;
        }
    };
    let (major, minor, _) = lib.version_triple();
    assert_eq!(major, 2, "version code {}", lib.version());
    assert!(minor >= 12, "NCCL 2.{minor} is older than strata supports");
    assert_eq!(lib.has_split(), minor >= 18);
    let a = lib.unique_id().unwrap().bytes();
    let b = lib.unique_id().unwrap().bytes();
    assert!(a.iter().any(|&x| x != 0));
    assert_ne!(a, b, "two unique ids must differ");
    assert_eq!(VendorUniqueId::from_bytes(&a).bytes(), a);
    // Result codes map to strata's (equal to NCCL's).
    assert!(lib.check(0, "x").is_ok());
    for code in [1, 2, 3, 4, 5, 6] {
        let e = lib.check(code, "call").unwrap_err();
        assert_eq!(e.code(), code, "{e}");
        assert!(e.to_string().contains("call: "), "{e}");
    }
    // Bad arguments are refused before the library sees them.
    let id = lib.unique_id().unwrap();
    assert_eq!(
        lib.comm_init_rank(2, &id, 5).err().map(|e| e.code()),
        Some(4)
    );
    // Without a GPU, joining fails with the library's error instead of crashing; with
    // one, a one-rank communicator comes up and goes down cleanly.
    match lib.comm_init_rank(1, &id, 0) {
        Ok(c) => {
            c.async_error().unwrap();
            c.abort().unwrap();
        }
        Err(e) => {
            eprintln!("one-rank NCCL communicator without a GPU: {e}");
            assert!(matches!(e.code(), 1 | 2 | 3 | 5), "{e}")
        }
    }
}

#[test]
fn missing_library_is_an_error_naming_the_candidates() {
    match VendorLib::load(Vendor::Rccl) {
        Ok(l) => assert!(l.version() > 0),
        Err(m) => {
            for c in [
                "STRATA_RCCL_LIB",
                "librccl.so.1",
                "/opt/rocm/lib/librccl.so",
            ] {
                assert!(m.contains(c), "{m}");
            }
        }
    }
}

/// nccl-tests' bootstrap on strata's own transport: rank 0 makes the id and broadcasts
/// it; every rank of a 4-rank local world holds the same id afterwards.
#[test]
fn unique_id_bootstrap_over_a_communicator() {
    use strata::{Comm, CommConfig};
    if strata::transport::vendor::VendorLib::get(Vendor::Nccl).is_err() {
        assert!(std::env::var("STRATA_REQUIRE_NCCL").is_err());
        return;
    }
    let comms = Comm::local_world(4, None, CommConfig::default()).unwrap();
    let ids: Vec<[u8; 128]> = comms
        .into_iter()
        .map(|c| std::thread::spawn(move || c.vendor_unique_id(Vendor::Nccl).unwrap().bytes()))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert!(ids[0].iter().any(|&b| b != 0));
    assert!(ids.iter().all(|i| *i == ids[0]));
}
