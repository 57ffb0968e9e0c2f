//! The C ABI called from Rust (the C program in tests/c and the Python tests drive the
//! same functions through the real shared library; these run under `cargo test`).

use std::ffi::{c_void, CStr, CString};
use std::ptr::{null, null_mut};
use strata::capi::*;

fn last(comm: strataComm_t) -> String {
    // SAFETY: strataGetLastError returns a valid C string for any argument.
    unsafe { CStr::from_ptr(strataGetLastError(comm)) }
        .to_string_lossy()
        .into_owned()
}

fn local(n: usize, topo: &str) -> Vec<usize> {
    let mut comms = vec![null_mut(); n];
    let t = CString::new(topo).unwrap();
    // SAFETY: room for n handles; valid C string; NULL config.
    let r = unsafe { strataCommInitLocal(comms.as_mut_ptr(), n as i32, t.as_ptr(), null()) };
    assert_eq!(r, strataSuccess, "{}", last(null_mut()));
    comms.into_iter().map(|c| c as usize).collect()
}

#[test]
fn all_reduce_and_in_place_all_gather_from_threads() {
    let comms = local(4, "nodes:2x2");
    let hs: Vec<_> = comms
        .iter()
        .enumerate()
        .map(|(r, &c)| {
            std::thread::spawn(move || {
                let c = c as strataComm_t;
                let x = [r as f32, 1.0];
                let mut y = [0f32; 2];
                // SAFETY: 2 floats each; live communicator.
                let rc = unsafe {
                    strataAllReduce(
                        x.as_ptr() as *const c_void,
                        y.as_mut_ptr() as *mut c_void,
                        2,
                        strataFloat32,
                        strataSum,
                        c,
                        null_mut(),
                    )
                };
                assert_eq!(rc, strataSuccess, "{}", last(c));
                assert_eq!(y, [6.0, 4.0]);
                let mut g = [0f32; 8];
                g[2 * r] = r as f32;
                g[2 * r + 1] = -(r as f32);
                let base = g.as_mut_ptr();
                // SAFETY: in place: sendbuff = recvbuff + rank * 2; 8 floats.
                let rc = unsafe {
                    strataAllGather(
                        base.add(2 * r) as *const c_void,
                        base as *mut c_void,
                        2,
                        strataFloat32,
                        c,
                        null_mut(),
                    )
                };
                assert_eq!(rc, strataSuccess, "{}", last(c));
                assert_eq!(g, [0.0, 0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0]);
                // SAFETY: live communicator, destroyed once.
                assert_eq!(unsafe { strataCommDestroy(c) }, strataSuccess);
            })
        })
        .collect();
    hs.into_iter().for_each(|h| h.join().unwrap());
}

#[test]
fn bad_calls_return_nccl_codes_with_messages() {
    let c = local(1, "nodes:1x1")[0] as strataComm_t;
    let x = [0f32; 4];
    let mut y = [0f32; 4];
    let (xp, yp) = (x.as_ptr() as *const c_void, y.as_mut_ptr() as *mut c_void);
    // SAFETY: every call below gets valid or NULL pointers; strata checks them first.
    unsafe {
        assert_eq!(strataAllReduce(xp, yp, 4, 7, 0, null_mut(), null_mut()), 4);
        assert!(last(null_mut()).contains("comm is NULL"));
        assert_eq!(strataAllReduce(null(), yp, 4, 7, 0, c, null_mut()), 4);
        assert!(last(c).contains("sendbuff is NULL"), "{}", last(c));
        assert_eq!(
            strataAllReduce(xp, yp, usize::MAX / 2, 7, 0, c, null_mut()),
            4
        );
        assert_eq!(strataAllReduce(xp, yp, 4, 8, 0, c, null_mut()), 4);
        assert!(last(c).contains("datatype 8"));
        assert_eq!(strataAllReduce(xp, yp, 4, 7, 9, c, null_mut()), 4);
        assert_eq!(strataBroadcast(xp, yp, 4, 7, 1, c, null_mut()), 4);
        assert_eq!(strataGroupEnd(), 5);
        let mut n = 0;
        assert_eq!(strataCommCount(c, &mut n), 0);
        assert_eq!(n, 1);
        assert_eq!(strataCommDestroy(c), 0);
        assert_eq!(strataCommCount(c, &mut n), 5);
        assert!(last(c).contains("destroyed"));
        assert_eq!(strataCommDestroy(c), 5);
        assert_eq!(strataCommDestroy(null_mut()), 0);
    }
}

#[test]
fn unique_id_rendezvous_and_timeout() {
    let mut id = strataUniqueId {
        internal: [0; STRATA_UNIQUE_ID_BYTES],
    };
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { strataGetUniqueId(&mut id) }, 0);
    let hs: Vec<_> = (0..3)
        .map(|r| {
            std::thread::spawn(move || {
                let mut c = null_mut();
                // SAFETY: valid out-pointer; NULL config.
                let rc = unsafe { strataCommInitRank(&mut c, 3, id, r) };
                assert_eq!(rc, 0, "{}", last(null_mut()));
                let mut rank = -1;
                // SAFETY: live communicator, valid out-pointer; destroyed once.
                unsafe {
                    assert_eq!(strataCommUserRank(c, &mut rank), 0);
                    assert_eq!(rank, r);
                    assert_eq!(strataCommDestroy(c), 0);
                }
            })
        })
        .collect();
    hs.into_iter().for_each(|h| h.join().unwrap());
    let mut cfg = strataConfig_t {
        size: std::mem::size_of::<strataConfig_t>(),
        magic: STRATA_CONFIG_MAGIC,
        version: STRATA_VERSION_CODE as u32,
        transport: strataTransportLocal,
        topology: null(),
        algo: null(),
        timeout_ms: 100,
    };
    let mut c = null_mut();
    // SAFETY: valid pointers; a fresh id nobody else joins.
    unsafe {
        assert_eq!(strataGetUniqueId(&mut id), 0);
        assert_eq!(strataCommInitRankConfig(&mut c, 2, id, 0, &cfg), 6);
        assert!(last(null_mut()).contains("1 of 2 joined"));
        cfg.magic = 1;
        assert_eq!(strataCommInitRankConfig(&mut c, 1, id, 0, &cfg), 4);
    }
    assert!(c.is_null());
}

#[test]
fn quantized_variants_within_the_bound_and_bad_formats_rejected() {
    let comms = local(8, "nodes:2x4");
    let hs: Vec<_> = comms
        .iter()
        .enumerate()
        .map(|(r, &c)| {
            std::thread::spawn(move || {
                let c = c as strataComm_t;
                let n = 100usize;
                // Every rank sends r + i/100 to every block: the exact sum is known.
                let send: Vec<f32> = (0..8 * n)
                    .map(|i| r as f32 + (i % n) as f32 / 100.0)
                    .collect();
                let mut recv = vec![0f32; n];
                // SAFETY: 8n floats in, n out; live communicator.
                let rc = unsafe {
                    strataReduceScatterQuantized(
                        send.as_ptr() as *const c_void,
                        recv.as_mut_ptr() as *mut c_void,
                        n,
                        strataFloat32,
                        strataAvg,
                        8,
                        32,
                        c,
                        null_mut(),
                    )
                };
                assert_eq!(rc, strataSuccess, "{}", last(c));
                for (i, v) in recv.iter().enumerate() {
                    let exact = 3.5 + i as f32 / 100.0;
                    assert!((v - exact).abs() < 0.1, "{v} vs {exact}");
                }
                let mine: Vec<f32> = (0..n).map(|i| r as f32 * 0.5 + i as f32).collect();
                let mut all = vec![0f32; 8 * n];
                // SAFETY: n floats in, 8n out.
                let rc = unsafe {
                    strataAllGatherQuantized(
                        mine.as_ptr() as *const c_void,
                        all.as_mut_ptr() as *mut c_void,
                        n,
                        strataFloat32,
                        8,
                        64,
                        c,
                        null_mut(),
                    )
                };
                assert_eq!(rc, strataSuccess, "{}", last(c));
                for (j, v) in all.iter().enumerate() {
                    let exact = (j / n) as f32 * 0.5 + (j % n) as f32;
                    assert!((v - exact).abs() <= 103.5 / 254.0 + 1e-3, "{v} vs {exact}");
                }
                // Bad formats: 3 bits, odd int4 block, integer data.
                // SAFETY: as above.
                unsafe {
                    assert_eq!(
                        strataAllGatherQuantized(
                            mine.as_ptr() as *const c_void,
                            all.as_mut_ptr() as *mut c_void,
                            n,
                            strataFloat32,
                            3,
                            64,
                            c,
                            null_mut()
                        ),
                        strataInvalidArgument
                    );
                    assert_eq!(
                        strataAllGatherQuantized(
                            mine.as_ptr() as *const c_void,
                            all.as_mut_ptr() as *mut c_void,
                            n,
                            strataFloat32,
                            4,
                            7,
                            c,
                            null_mut()
                        ),
                        strataInvalidArgument
                    );
                    assert_eq!(
                        strataAllGatherQuantized(
                            mine.as_ptr() as *const c_void,
                            all.as_mut_ptr() as *mut c_void,
                            n,
                            strataInt32,
                            8,
                            64,
                            c,
                            null_mut()
                        ),
                        strataInvalidArgument
                    );
                }
                assert!(
                    last(c).contains("block") || last(c).contains("i32") || !last(c).is_empty()
                );
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    for c in comms {
        // SAFETY: live handle, destroyed once.
        assert_eq!(
            unsafe { strataCommDestroy(c as strataComm_t) },
            strataSuccess
        );
    }
}
