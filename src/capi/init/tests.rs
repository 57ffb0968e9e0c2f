use super::*;
use crate::capi::coll::strataAllReduce;
use crate::comm::bootstrap::parse_transport;
use std::ffi::{c_void, CString};
use std::ptr::{null, null_mut};

fn last() -> String {
    // SAFETY: strataGetLastError returns a valid C string for any argument.
    unsafe { CStr::from_ptr(strataGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

/// Every handle of `comms` runs on `transport`; destroys them.
fn destroy_on<const N: usize>(comms: [strataComm_t; N], transport: strataTransport_t) {
    for c in comms {
        let mut t = 0;
        // SAFETY: live handles, destroyed once.
        unsafe {
            assert_eq!(strataCommGetTransport(c, &mut t), strataSuccess);
            assert_eq!(t, transport);
            assert_eq!(strataCommDestroy(c), strataSuccess);
        }
    }
}

fn zero_id() -> strataUniqueId {
    strataUniqueId {
        internal: [0; STRATA_UNIQUE_ID_BYTES],
    }
}

#[test]
fn features_name_the_compiled_transports() {
    let mut p: *const c_char = null();
    // SAFETY: a valid out-pointer, then the static string it received.
    assert_eq!(unsafe { strataGetFeatures(&mut p) }, strataSuccess);
    let got = unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned();
    let all = [
        ("mpi", cfg!(feature = "mpi")),
        ("cuda", cfg!(feature = "cuda")),
        ("rocm", cfg!(feature = "rocm")),
    ];
    let want: Vec<&str> = all
        .into_iter()
        .filter(|&(_, on)| on)
        .map(|(f, _)| f)
        .collect();
    assert_eq!(got, want.join(","));
    // The same static string on every call.
    let mut q: *const c_char = null();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { strataGetFeatures(&mut q) }, strataSuccess);
    assert_eq!(p, q);
    // SAFETY: NULL is checked, never written.
    assert_eq!(
        unsafe { strataGetFeatures(null_mut()) },
        strataInvalidArgument
    );
    assert!(
        last().contains("strataGetFeatures") && last().contains("features is NULL"),
        "{}",
        last()
    );
}

fn id_for(t: strataTransport_t) -> (strataResult_t, strataUniqueId) {
    let mut id = zero_id();
    // SAFETY: a valid out-pointer.
    let rc = unsafe { strataGetUniqueIdForTransport(t, &mut id) };
    (rc, id)
}

fn config(transport: strataTransport_t, timeout_ms: c_int) -> strataConfig_t {
    strataConfig_t {
        size: std::mem::size_of::<strataConfig_t>(),
        magic: STRATA_CONFIG_MAGIC,
        version: STRATA_VERSION_CODE as u32,
        transport,
        topology: null(),
        algo: null(),
        timeout_ms,
        links: null(),
    }
}

#[test]
fn capi_unique_id_layout() {
    assert_eq!(std::mem::size_of::<strataUniqueId>(), 256);
    assert_eq!(STRATA_UNIQUE_ID_VENDOR_OFFSET, 128);
    for t in [strataTransportLocal, strataTransportDefault] {
        if t == strataTransportDefault
            && matches!(
                env_transport(),
                Ok(Some(TransportKind::Nccl | TransportKind::Rccl))
            )
        {
            continue; // the environment asks for a vendor id
        }
        let (rc, id) = id_for(t);
        assert_eq!(rc, strataSuccess, "{}", last());
        let b = id_bytes(&id);
        assert_eq!(&b[..8], b"STRATAID");
        assert_eq!(
            u32::from_le_bytes(b[8..12].try_into().unwrap()),
            STRATA_VERSION_CODE as u32
        );
        assert_ne!(&b[KEY], &[0u8; 16]);
        assert_eq!(b[VENDOR_FLAG], ID_VENDOR_NONE);
        assert!(
            b[VENDOR_FLAG..].iter().all(|&x| x == 0),
            "reserved and vendor bytes are zero"
        );
        let p = parse_id(&id).unwrap();
        assert!(p.vendor.is_none());
    }
    // Two ids name two worlds.
    let (_, a) = id_for(strataTransportLocal);
    let (_, b) = id_for(strataTransportLocal);
    assert_ne!(parse_id(&a).unwrap().key, parse_id(&b).unwrap().key);
    // A damaged vendor flag is refused.
    let mut bad = id_bytes(&a);
    bad[VENDOR_FLAG] = 7;
    let bad = strataUniqueId {
        internal: bad.map(|x| x as c_char),
    };
    assert_eq!(parse_id(&bad).err().unwrap().code(), strataInvalidArgument);
}

#[test]
fn capi_unique_id_for_transport_errors() {
    // SAFETY: NULL is checked first.
    let rc = unsafe { strataGetUniqueIdForTransport(strataTransportLocal, null_mut()) };
    assert_eq!(rc, strataInvalidArgument);
    for t in [-1, 7, 99] {
        let (rc, _) = id_for(t);
        assert_eq!(rc, strataInvalidArgument, "{t}");
        assert!(last().contains("not a strataTransport_t"), "{}", last());
    }
    for (t, kind) in [
        (strataTransportMpi, TransportKind::Mpi),
        (strataTransportNccl, TransportKind::Nccl),
        (strataTransportRccl, TransportKind::Rccl),
        (strataTransportCudaLocal, TransportKind::CudaLocal),
    ] {
        if kind.compiled() {
            continue;
        }
        let (rc, _) = id_for(t);
        assert_eq!(rc, strataInvalidUsage, "{}: {}", kind.name(), last());
        let f = kind.feature().unwrap();
        assert!(
            last().contains(&format!("`{f}` feature")) && last().contains(kind.name()),
            "{}",
            last()
        );
    }
    let (rc, id) = id_for(strataTransportCudaLocal);
    if TransportKind::CudaLocal.compiled() {
        assert_eq!(rc, strataSuccess);
        assert!(parse_id(&id).unwrap().vendor.is_none());
    }
    let (rc, id) = id_for(strataTransportHostLocal);
    assert_eq!(rc, strataSuccess, "{}", last());
    assert!(parse_id(&id).unwrap().vendor.is_none());
}

#[test]
fn capi_transport_names() {
    assert_eq!(parse_transport("").unwrap(), None);
    assert_eq!(
        parse_transport(" Local ").unwrap(),
        Some(TransportKind::Local)
    );
    assert_eq!(parse_transport("mpi").unwrap(), Some(TransportKind::Mpi));
    assert_eq!(parse_transport("nccl").unwrap(), Some(TransportKind::Nccl));
    assert_eq!(parse_transport("RCCL").unwrap(), Some(TransportKind::Rccl));
    assert_eq!(
        parse_transport("cuda-local").unwrap(),
        Some(TransportKind::CudaLocal)
    );
    let e = parse_transport("gloo").unwrap_err();
    assert_eq!(e.code(), strataInvalidArgument);
    assert!(e.to_string().contains("cuda-local"), "{e}");
    for k in TransportKind::ALL {
        assert_eq!(kind_of(transport_code(k)).unwrap(), k);
        assert_eq!(parse_transport(k.name()).unwrap(), Some(k));
    }
    assert_eq!(kind_of(strataTransportDefault).unwrap_err().code(), 4);
}

#[test]
fn capi_config_links() {
    std::env::set_var(
        "STRATA_LINKS_CACHE",
        std::env::temp_dir().join("strata-capi-links"),
    );
    let mut comms = [null_mut(); 2];
    let topo = CString::new("nodes:2x1").unwrap();
    let bad = CString::new("measured").unwrap();
    let mut cfg = config(strataTransportLocal, 20_000);
    cfg.topology = topo.as_ptr();
    cfg.links = bad.as_ptr();
    // SAFETY: room for 2 handles, a valid config.
    let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 2, null(), &cfg) };
    assert_eq!(rc, strataInvalidArgument);
    assert!(last().contains("preset, probe, reprobe"), "{}", last());
    // A config of the size before `links` is read without it.
    cfg.size = CONFIG_SIZE_BEFORE_LINKS;
    // SAFETY: as above; `links` lies beyond `size` and is not read.
    let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 2, null(), &cfg) };
    assert_eq!(rc, strataSuccess, "{}", last());
    for c in comms {
        assert!(lookup(c).unwrap().comm.topology().measured.is_none());
        // SAFETY: live handle, destroyed once.
        assert_eq!(unsafe { strataCommDestroy(c) }, strataSuccess);
    }
    cfg.size = std::mem::size_of::<strataConfig_t>();
    let probe = CString::new("reprobe").unwrap();
    cfg.links = probe.as_ptr();
    // SAFETY: as above.
    let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 2, null(), &cfg) };
    assert_eq!(rc, strataSuccess, "{}", last());
    let t0 = lookup(comms[0]).unwrap().comm.topology().clone();
    let m = t0.measured.as_ref().expect("probed");
    assert_eq!(m.classes, vec![crate::topology::LinkClass::InterNode]);
    for c in comms {
        assert_eq!(*lookup(c).unwrap().comm.topology(), t0);
        // SAFETY: live handle, destroyed once.
        assert_eq!(unsafe { strataCommDestroy(c) }, strataSuccess);
    }
}

#[test]
fn capi_config_transport_validation() {
    let mut comms = [null_mut(); 2];
    // Out of range.
    for t in [7, -1] {
        let cfg = config(t, 0);
        // SAFETY: room for 2 handles, a valid config.
        let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 2, null(), &cfg) };
        assert_eq!(rc, strataInvalidArgument);
        assert!(last().contains("6 host-local"), "{}", last());
    }
    // host-local: always built, an in-process world on the CPU device.
    let cfg = config(strataTransportHostLocal, 0);
    // SAFETY: as above.
    let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 2, null(), &cfg) };
    assert_eq!(rc, strataSuccess, "{}", last());
    destroy_on(comms, strataTransportHostLocal);
    // The GPU transports: not compiled, or not an in-process world (nccl, rccl).
    for (t, kind) in [
        (strataTransportNccl, TransportKind::Nccl),
        (strataTransportRccl, TransportKind::Rccl),
    ] {
        let cfg = config(t, 0);
        // SAFETY: as above.
        let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 2, null(), &cfg) };
        if kind.compiled() {
            assert_eq!(rc, strataInvalidArgument, "{}", last());
            assert!(last().contains("strataCommInitRankConfig"), "{}", last());
        } else {
            assert_eq!(rc, strataInvalidUsage, "{}", last());
            assert!(last().contains("feature"), "{}", last());
            // The same through strataCommInitRankConfig and strataCommSplit's check.
            let (_, id) = id_for(strataTransportLocal);
            let mut c = null_mut();
            // SAFETY: valid pointers.
            let rc = unsafe { strataCommInitRankConfig(&mut c, 1, id, 0, &cfg) };
            assert_eq!(rc, strataInvalidUsage, "{}", last());
            assert!(last().contains(&format!("`{}` feature", kind.feature().unwrap())));
            assert!(c.is_null());
        }
    }
    let cfg = config(strataTransportCudaLocal, 0);
    // SAFETY: as above.
    let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 2, null(), &cfg) };
    if !TransportKind::CudaLocal.compiled() {
        assert_eq!(rc, strataInvalidUsage, "{}", last());
        assert!(last().contains("`cuda` feature"), "{}", last());
    } else if crate::device::count(crate::device::Api::Cuda) == 0 {
        assert_ne!(rc, strataSuccess, "cuda-local without a GPU");
        assert!(!last().is_empty());
    } else {
        assert_eq!(rc, strataSuccess, "{}", last());
        destroy_on(comms, strataTransportCudaLocal);
    }
}

#[test]
fn capi_host_comm_reports_its_transport_and_stays_on_the_host() {
    let mut comms = [null_mut(); 1];
    let cfg = config(strataTransportLocal, 5000);
    // SAFETY: room for 1 handle, a valid config.
    let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 1, null(), &cfg) };
    assert_eq!(rc, strataSuccess, "{}", last());
    let c = comms[0];
    let mut t = -1;
    // SAFETY: live handle; valid and NULL out-pointers.
    unsafe {
        assert_eq!(strataCommGetTransport(c, &mut t), strataSuccess);
        assert_eq!(strataCommGetTransport(c, null_mut()), strataInvalidArgument);
        assert_eq!(
            strataCommGetTransport(null_mut(), &mut t),
            strataInvalidArgument
        );
    }
    assert_eq!(t, strataTransportLocal);
    assert!(lookup(c).unwrap().comm.device().is_none());
    // Host pointers (any pointer, to a host transport) are host memory: no device
    // check (none is possible here), copied in and out as before.
    let x = [1.5f32, -2.0];
    let mut y = [0f32; 2];
    let (xp, yp) = (x.as_ptr() as *const c_void, y.as_mut_ptr() as *mut c_void);
    let not_a_stream = 0x1234 as strataStream_t;
    // SAFETY: 2 floats each; live communicator; the stream is ignored.
    let rc = unsafe { strataAllReduce(xp, yp, 2, strataFloat32, strataSum, c, not_a_stream) };
    assert_eq!(rc, strataSuccess, "{}", last());
    assert_eq!(y, x);
    // SAFETY: live handle, destroyed once.
    assert_eq!(unsafe { strataCommDestroy(c) }, strataSuccess);
}

#[test]
fn capi_vendor_transport_needs_a_vendor_id() {
    for (t, kind, what) in [
        (
            strataTransportNccl,
            TransportKind::Nccl,
            "STRATA_TRANSPORT=nccl",
        ),
        (
            strataTransportRccl,
            TransportKind::Rccl,
            "STRATA_TRANSPORT=rccl",
        ),
    ] {
        if !kind.compiled() {
            continue;
        }
        let (_, id) = id_for(strataTransportLocal);
        let cfg = config(t, 2000);
        let mut c = null_mut();
        // SAFETY: valid pointers.
        let rc = unsafe { strataCommInitRankConfig(&mut c, 1, id, 0, &cfg) };
        assert_eq!(rc, strataInvalidArgument, "{}", last());
        assert!(
            last().contains(what) && last().contains("strataGetUniqueIdForTransport"),
            "{}",
            last()
        );
        assert!(c.is_null());
    }
}

/// With `--features cuda` and libnccl loadable (the nvidia-nccl-cu12 wheel through
/// `STRATA_NCCL_LIB`): the id carries a real NCCL id; without a GPU, joining fails
/// with an error code (never a crash or a hang); with one, a 1-rank world works.
#[cfg(feature = "cuda")]
#[test]
fn capi_nccl_unique_id_and_init_without_a_gpu() {
    use std::time::Instant;
    if let Err(e) = bootstrap::new_vendor_unique_id(TransportKind::Nccl) {
        if std::env::var_os("STRATA_REQUIRE_NCCL").is_some() {
            panic!("STRATA_REQUIRE_NCCL is set but libnccl does not load: {e}");
        }
        eprintln!("skipped: libnccl does not load ({e})");
        let (rc, _) = id_for(strataTransportNccl);
        assert_ne!(rc, strataSuccess);
        assert!(!last().is_empty());
        return;
    }
    let (rc, id) = id_for(strataTransportNccl);
    assert_eq!(rc, strataSuccess, "{}", last());
    let b = id_bytes(&id);
    assert_eq!(&b[..8], b"STRATAID");
    assert_eq!(b[VENDOR_FLAG], ID_VENDOR_NCCL);
    assert!(
        b[VENDOR_ID].iter().any(|&x| x != 0),
        "the NCCL id is embedded"
    );
    let (_, id2) = id_for(strataTransportNccl);
    assert_ne!(&id_bytes(&id2)[VENDOR_ID], &b[VENDOR_ID], "fresh NCCL ids");
    assert!(matches!(
        parse_id(&id).unwrap().vendor,
        Some((ID_VENDOR_NCCL, _))
    ));

    let cfg = config(strataTransportNccl, 10_000);
    let mut c = null_mut();
    let t0 = Instant::now();
    // SAFETY: valid pointers.
    let rc = unsafe { strataCommInitRankConfig(&mut c, 1, id, 0, &cfg) };
    if crate::device::count(crate::device::Api::Cuda) == 0 {
        assert_ne!(rc, strataSuccess, "nccl without a GPU");
        assert!(
            [
                strataUnhandledCudaError,
                strataSystemError,
                strataInvalidUsage
            ]
            .contains(&rc),
            "{rc}: {}",
            last()
        );
        assert!(!last().is_empty());
        assert!(c.is_null());
        assert!(t0.elapsed() < std::time::Duration::from_secs(30));
    } else {
        assert_eq!(rc, strataSuccess, "{}", last());
        let mut t = 0;
        // SAFETY: live handle, destroyed once.
        unsafe {
            assert_eq!(strataCommGetTransport(c, &mut t), strataSuccess);
            assert_eq!(strataCommDestroy(c), strataSuccess);
        }
        assert_eq!(t, strataTransportNccl);
    }
    // An NCCL id on the rccl transport (when built) is refused by kind.
    if TransportKind::Rccl.compiled() {
        let cfg = config(strataTransportRccl, 2000);
        let mut c = null_mut();
        // SAFETY: valid pointers.
        let rc = unsafe { strataCommInitRankConfig(&mut c, 1, id, 0, &cfg) };
        assert_eq!(rc, strataInvalidArgument, "{}", last());
    }
}
