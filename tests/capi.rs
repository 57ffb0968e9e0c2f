//! The C ABI called from Rust (the C program in tests/c and the Python tests drive the
//! same functions through the real shared library; these run under `cargo test`).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::{null, null_mut};
use strata::capi::*;

fn last(comm: strataComm_t) -> String {
    // SAFETY: strataGetLastError returns a valid C string for any argument.
    unsafe { CStr::from_ptr(strataGetLastError(comm)) }
        .to_string_lossy()
        .into_owned()
}

/// A config of this header: `topology` and `algo` NULL or C strings, default links.
fn config(
    transport: strataTransport_t,
    topology: *const c_char,
    algo: *const c_char,
    timeout_ms: c_int,
) -> strataConfig_t {
    strataConfig_t {
        size: std::mem::size_of::<strataConfig_t>(),
        magic: STRATA_CONFIG_MAGIC,
        version: STRATA_VERSION_CODE as u32,
        transport,
        topology,
        algo,
        timeout_ms,
        links: null(),
    }
}

/// `strataAllGather` of `count` f32 from `x` into `y`, blocking (in place when `x` is
/// `y`'s block of this rank).
///
/// # Safety
/// `x` is readable for `count` floats, `y` writable for `count` times the world's size;
/// `c` is live.
unsafe fn all_gather_f32(
    x: *const f32,
    y: *mut f32,
    count: usize,
    c: strataComm_t,
) -> strataResult_t {
    // SAFETY: the caller's contract.
    unsafe { strataAllGather(x.cast(), y.cast(), count, strataFloat32, c, null_mut()) }
}

/// `strataAllReduce` (sum) of `count` f32 from `x` into `y`, blocking (in place when
/// `x == y`).
///
/// # Safety
/// `x` is readable and `y` writable for `count` floats; `c` is live.
unsafe fn all_reduce_sum_f32(
    x: *const f32,
    y: *mut f32,
    count: usize,
    c: strataComm_t,
) -> strataResult_t {
    // SAFETY: the caller's contract.
    unsafe {
        strataAllReduce(
            x.cast(),
            y.cast(),
            count,
            strataFloat32,
            strataSum,
            c,
            null_mut(),
        )
    }
}

/// `strataAllGatherCoalesced` of f32 pairs: `counts[i]` floats from `sends[i]` into
/// `recvs[i]`, blocking (or grouped).
///
/// # Safety
/// Each `sends[i]` is readable for `counts[i]` floats and `recvs[i]` writable for
/// `counts[i]` times the world's size; `c` is live.
unsafe fn all_gather_coalesced_f32(
    sends: &[*const c_void],
    recvs: &[*mut c_void],
    counts: &[usize],
    c: strataComm_t,
) -> strataResult_t {
    assert!(sends.len() == counts.len() && recvs.len() == counts.len());
    // SAFETY: three lists of `counts.len()` entries; the caller's contract on them.
    unsafe {
        strataAllGatherCoalesced(
            sends.as_ptr(),
            recvs.as_ptr(),
            counts.as_ptr(),
            counts.len(),
            strataFloat32,
            c,
            null_mut(),
        )
    }
}

/// `strataCommGetTraffic(c, all_members)`, which must succeed: every member's sends
/// (collective) or this rank's own.
fn traffic(c: strataComm_t, all_members: c_int) -> strataTraffic_t {
    let mut t = strataTraffic_t::default();
    // SAFETY: a valid out-pointer; handles are never dereferenced.
    let rc = unsafe { strataCommGetTraffic(c, all_members, &mut t) };
    assert_eq!(rc, strataSuccess, "{}", last(c));
    t
}

/// `f(rank, comm)` for every communicator of `comms`, each on a thread of its own; the
/// results in rank order.
fn on_each_rank<R: Send>(comms: &[usize], f: impl Fn(usize, strataComm_t) -> R + Sync) -> Vec<R> {
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, &c)| s.spawn(move || f(r, c as strataComm_t)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Destroy every communicator of `comms` (each must be live).
fn destroy_all(comms: &[usize]) {
    for &c in comms {
        // SAFETY: handles are never dereferenced.
        assert_eq!(
            unsafe { strataCommDestroy(c as strataComm_t) },
            strataSuccess
        );
    }
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
    on_each_rank(&comms, |r, c| {
        let x = [r as f32, 1.0];
        let mut y = [0f32; 2];
        // SAFETY: 2 floats each; live communicator.
        let rc = unsafe { all_reduce_sum_f32(x.as_ptr(), y.as_mut_ptr(), 2, c) };
        assert_eq!(rc, strataSuccess, "{}", last(c));
        assert_eq!(y, [6.0, 4.0]);
        let mut g = [0f32; 8];
        g[2 * r] = r as f32;
        g[2 * r + 1] = -(r as f32);
        let base = g.as_mut_ptr();
        // SAFETY: in place: sendbuff = recvbuff + rank * 2; 8 floats.
        let rc = unsafe { all_gather_f32(base.add(2 * r), base, 2, c) };
        assert_eq!(rc, strataSuccess, "{}", last(c));
        assert_eq!(g, [0.0, 0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0]);
        // SAFETY: live communicator, destroyed once.
        assert_eq!(unsafe { strataCommDestroy(c) }, strataSuccess);
    });
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
        assert_eq!(strataAllReduce(xp, yp, 4, 10, 0, c, null_mut()), 4);
        assert!(last(c).contains("datatype 10"));
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
    let mut cfg = config(strataTransportLocal, null(), null(), 100);
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
    on_each_rank(&comms, |r, c| {
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
        let mut gather = |dtype, bits, block| {
            // SAFETY: n floats in, 8n out; live communicator.
            unsafe {
                strataAllGatherQuantized(
                    mine.as_ptr() as *const c_void,
                    all.as_mut_ptr() as *mut c_void,
                    n,
                    dtype,
                    bits,
                    block,
                    c,
                    null_mut(),
                )
            }
        };
        let rc = gather(strataFloat32, 8, 64);
        assert_eq!(rc, strataSuccess, "{}", last(c));
        // Bad formats: 3 bits, odd int4 block, integer data.
        for (dtype, bits, block) in [
            (strataFloat32, 3, 64),
            (strataFloat32, 4, 7),
            (strataInt32, 8, 64),
        ] {
            assert_eq!(gather(dtype, bits, block), strataInvalidArgument);
        }
        for (j, v) in all.iter().enumerate() {
            let exact = (j / n) as f32 * 0.5 + (j % n) as f32;
            assert!((v - exact).abs() <= 103.5 / 254.0 + 1e-3, "{v} vs {exact}");
        }
        assert!(last(c).contains("block") || last(c).contains("i32") || !last(c).is_empty());
    });
    destroy_all(&comms);
}

/// The one body of each collective on a host transport: NCCL's in-place layouts of
/// every kind (raw pointers, `Kind::in_place`), other overlaps refused with the same
/// message, coalesced lists mixing in-place and separate pairs, copy-out at
/// `strataGroupEnd`, and the last error kept per communicator and per thread.
#[test]
fn in_place_layouts_aliasing_groups_and_last_errors() {
    let comms = local(2, "nodes:1x2");
    on_each_rank(&comms, |r, c| {
        let rf = r as f32;
        // SAFETY: every pointer below is valid for the counts passed; live comm.
        unsafe {
            // Reduce-scatter in place: recvbuff == sendbuff + rank * recvcount.
            let mut s = [1.0 + rf, 2.0 + rf, 3.0 + rf, 4.0 + rf];
            let p = s.as_mut_ptr();
            let rc = strataReduceScatter(
                p as *const c_void,
                p.add(2 * r) as *mut c_void,
                2,
                strataFloat32,
                strataSum,
                c,
                null_mut(),
            );
            assert_eq!(rc, strataSuccess, "{}", last(c));
            let want = [[3.0f32, 5.0], [7.0, 9.0]][r];
            assert_eq!(&s[2 * r..2 * r + 2], &want);
            // All-reduce in place (send == recv).
            let mut a = [rf, 10.0];
            let ap = a.as_mut_ptr();
            let rc = strataAllReduce(
                ap as *const c_void,
                ap as *mut c_void,
                2,
                strataFloat32,
                strataMax,
                c,
                null_mut(),
            );
            assert_eq!(rc, strataSuccess, "{}", last(c));
            assert_eq!(a, [1.0, 10.0]);
            // Broadcast in place from root 1 (strataBcast).
            let mut b = [rf * 5.0; 3];
            let rc = strataBcast(
                b.as_mut_ptr() as *mut c_void,
                3,
                strataFloat32,
                1,
                c,
                null_mut(),
            );
            assert_eq!(rc, strataSuccess, "{}", last(c));
            assert_eq!(b, [5.0; 3]);
            // Coalesced all-gather: pair 0 in place, pair 1 separate, in a group
            // (results copied out by strataGroupEnd).
            let mut g0 = [0f32; 4];
            g0[2 * r] = rf;
            g0[2 * r + 1] = rf + 0.5;
            let x1 = [rf * 10.0];
            let mut g1 = [0f32; 2];
            let g0p = g0.as_mut_ptr();
            let sends = [
                g0p.add(2 * r) as *const c_void,
                x1.as_ptr() as *const c_void,
            ];
            let recvs = [g0p as *mut c_void, g1.as_mut_ptr() as *mut c_void];
            let counts = [2usize, 1];
            assert_eq!(strataGroupStart(), strataSuccess);
            let rc = all_gather_coalesced_f32(&sends, &recvs, &counts, c);
            assert_eq!(rc, strataSuccess, "{}", last(c));
            assert_eq!(g1, [0.0; 2], "copied out at strataGroupEnd, not before");
            assert_eq!(strataGroupEnd(), strataSuccess, "{}", last(null_mut()));
            assert_eq!(g0, [0.0, 0.5, 1.0, 1.5]);
            assert_eq!(g1, [0.0, 10.0]);
        }
    });

    // Refusals on one rank (checked before anything is queued, so no peer is needed).
    let c = comms[0] as strataComm_t;
    let mut m = [0f32; 8];
    let p = m.as_mut_ptr();
    // SAFETY: every range lies inside `m`; the calls fail their argument checks.
    unsafe {
        // All-gather with send one element off NCCL's layout (rank 0: send == recv).
        let rc = all_gather_f32(p.add(1), p, 2, c);
        assert_eq!(rc, strataInvalidArgument);
        let msg = last(c);
        assert!(
            msg.starts_with("strataAllGather: ") && msg.contains("in-place layout"),
            "{msg}"
        );
        assert_eq!(last(null_mut()), msg, "the thread holds the same message");
        // All-to-all has no in-place form.
        let rc = strataAllToAll(
            p as *const c_void,
            p as *mut c_void,
            1,
            strataFloat32,
            c,
            null_mut(),
        );
        assert_eq!(rc, strataInvalidArgument);
        assert!(last(c).starts_with("strataAllToAll: "), "{}", last(c));
        // Coalesced: two in-place pairs that overlap each other.
        let sends = [p as *const c_void, p.add(1) as *const c_void];
        let recvs = [p as *mut c_void, p.add(1) as *mut c_void];
        let counts = [2usize, 2];
        let rc = all_gather_coalesced_f32(&sends, &recvs, &counts, c);
        assert_eq!(rc, strataInvalidArgument);
        assert!(last(c).contains("strataAllGatherCoalesced"), "{}", last(c));
        // A failure naming no communicator changes the thread's message only.
        let before = last(c);
        assert_eq!(strataGetVersion(null_mut()), strataInvalidArgument);
        assert!(last(null_mut()).starts_with("strataGetVersion: "));
        assert_eq!(last(c), before);
    }
    destroy_all(&comms);
}

/// The device path of the collectives (GPU transports) through a cuda-local world:
/// without a GPU the world cannot be made (an error code and a message, never a crash);
/// with one, host pointers are refused by the device check, NCCL's in-place layout
/// is recognised on device memory as on the host, and a bad overlap is refused with the
/// host path's message.
#[cfg(feature = "cuda")]
#[test]
fn device_path_of_the_collectives_on_cuda_local() {
    use strata::device::{count, Api};
    let cfg = config(strataTransportCudaLocal, null(), null(), 20_000);
    let mut comms = [null_mut(); 1];
    // SAFETY: room for 1 handle; a valid config.
    let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 1, null(), &cfg) };
    if count(Api::Cuda) == 0 {
        assert_ne!(rc, strataSuccess, "cuda-local without a GPU");
        assert!(!last(null_mut()).is_empty());
        assert!(comms[0].is_null(), "nothing written on failure");
        return;
    }
    assert_eq!(rc, strataSuccess, "{}", last(null_mut()));
    let c = comms[0];
    let x = [1f32; 4];
    let mut y = [0f32; 4];
    // SAFETY: host pointers to a device communicator are refused before any access.
    unsafe {
        let rc = all_reduce_sum_f32(x.as_ptr(), y.as_mut_ptr(), 4, c);
        assert_eq!(rc, strataInvalidArgument, "{}", last(c));
        assert!(last(c).contains("sendbuff"), "{}", last(c));
        // A bad overlap is refused before the device check, with the host path's message.
        let p = y.as_mut_ptr();
        let rc = all_gather_f32(p.add(1), p, 2, c);
        assert_eq!(rc, strataInvalidArgument);
        assert!(last(c).contains("in-place layout"), "{}", last(c));
    }
    // Device memory, in place.
    let dev = strata::device::open(Api::Cuda, 0).unwrap();
    let buf = strata::Buffer::on_device(&dev, 16).unwrap();
    buf.write_bytes(&[2f32, 3.0, 4.0, 5.0].map(f32::to_le_bytes).concat())
        .unwrap();
    let addr = buf
        .dev_write_timeout(std::time::Duration::from_secs(10))
        .unwrap()
        .addr() as usize as *mut c_void;
    // SAFETY: 16 bytes of the communicator's device memory, kept alive by `buf`.
    let rc = unsafe { all_reduce_sum_f32(addr.cast(), addr.cast(), 4, c) };
    assert_eq!(rc, strataSuccess, "{}", last(c));
    assert_eq!(
        buf.to_bytes().unwrap(),
        [2f32, 3.0, 4.0, 5.0].map(f32::to_le_bytes).concat()
    );
    // SAFETY: live handle, destroyed once.
    assert_eq!(unsafe { strataCommDestroy(c) }, strataSuccess);
}

/// `strataCommGetTraffic`: on `nodes:3x2` (p = 6, k = 2), one all-gather of M bytes
/// sends (p-k)/p·M out of each node with `hier` (MiCS §3.3) and (p-1)/p·M with `ring`
/// (docs/algorithms.md); a rank's own reading is its row; the collective reading of a
/// split sub-communicator counts its members only; bad arguments are refused.
#[test]
fn traffic_counters_show_the_hierarchical_egress() {
    const P: usize = 6;
    const C: usize = 10; // floats per rank
    let m = (P * C * 4) as u64;
    for (algo, egress) in [
        ("hier", (P - 2) as u64 * m / P as u64),
        ("ring", (P - 1) as u64 * m / P as u64),
    ] {
        let a = CString::new(algo).unwrap();
        let t = CString::new("nodes:3x2").unwrap();
        let cfg = config(strataTransportLocal, t.as_ptr(), a.as_ptr(), 20_000);
        let mut comms = [null_mut(); P];
        // SAFETY: room for P handles; a valid config.
        let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), P as i32, null(), &cfg) };
        assert_eq!(rc, strataSuccess, "{}", last(null_mut()));
        let comms: Vec<usize> = comms.iter().map(|&c| c as usize).collect();
        let rows = on_each_rank(&comms, |_, c| {
            let x = [1f32; C];
            let mut y = [0f32; P * C];
            // SAFETY: C and P*C floats; live communicator.
            let rc = unsafe { all_gather_f32(x.as_ptr(), y.as_mut_ptr(), C, c) };
            assert_eq!(rc, strataSuccess, "{}", last(c));
            // Collective over the live world, then this rank's own.
            let all = traffic(c, 1);
            (traffic(c, 0), all)
        });
        let all = rows[0].1;
        assert_eq!(all.measured, 1);
        assert_eq!(all.max_node_egress, egress, "{algo}");
        assert_eq!(all.inter_node, 3 * egress, "{algo}: three nodes alike");
        let per_rank: u64 = rows
            .iter()
            .map(|(mine, _)| mine.inter_node + mine.intra_node)
            .sum();
        assert_eq!(
            per_rank,
            all.inter_node + all.intra_node,
            "{algo}: the rows add up"
        );
        assert!(rows.iter().all(|(_, a)| a.inter_node == all.inter_node));
        destroy_all(&comms);
    }

    // A split communicator of one node's ranks: its collective reading counts its
    // members' sends only; NULL out-pointer and a destroyed communicator are refused.
    let comms = local(4, "nodes:2x2");
    let out = on_each_rank(&comms, |r, c| {
        let mut sub = null_mut();
        // SAFETY: live communicator; valid out-pointer; NULL config.
        let rc = unsafe { strataCommSplit(c, (r / 2) as i32, 0, &mut sub, null()) };
        assert_eq!(rc, strataSuccess, "{}", last(c));
        let x = [r as f32; 3];
        let mut y = [0f32; 12];
        // SAFETY: 3 and 12 floats; live communicator.
        let rc = unsafe { all_gather_f32(x.as_ptr(), y.as_mut_ptr(), 3, c) };
        assert_eq!(rc, strataSuccess, "{}", last(c));
        let t = traffic(sub, 1);
        // SAFETY: a NULL out-pointer, then a valid one; `sub` and `c` destroyed once.
        unsafe {
            assert_eq!(
                strataCommGetTraffic(sub, 0, null_mut()),
                strataInvalidArgument
            );
            assert_eq!(strataCommDestroy(sub), strataSuccess);
            assert_eq!(
                strataCommGetTraffic(sub, 0, &mut t.clone()),
                strataInvalidUsage
            );
            assert_eq!(strataCommDestroy(c), strataSuccess);
        }
        t
    });
    // The world all-gather (12 floats out, 2 nodes): the two members of a node sent
    // exactly half of the world's bytes.
    let world_total = out[0].inter_node + out[0].intra_node + out[2].inter_node + out[2].intra_node;
    assert!(out[0].inter_node + out[0].intra_node > 0);
    assert_eq!(out[0], out[1]);
    assert_eq!(
        world_total,
        4 * 3 * 3 * 4,
        "4 ranks each send 3 chunks of 12 bytes on a ring"
    );
}

/// Many threads drive collectives on different communicators through the C ABI at once
/// (blocking calls and calls on their own strata host streams), while another thread
/// keeps creating, using and destroying communicators and a third looks up destroyed
/// and foreign handles: a call finds its communicator without a process-wide lock, and
/// every result is right (values are distinct per world and iteration, so any
/// cross-talk between communicators would show), every stale handle an error.
#[test]
fn concurrent_calls_on_many_communicators_stay_correct() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    const WORLDS: usize = 6;
    const ITERS: usize = 60;
    const C: usize = 3;
    let worlds: Vec<Vec<usize>> = (0..WORLDS).map(|_| local(2, "nodes:1x2")).collect();
    let done = Arc::new(AtomicBool::new(false));

    // Churn: communicators made, used and destroyed while the worlds run.
    let churn = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut made = 0usize;
            let mut stale = Vec::new();
            while made < 20 || !done.load(Ordering::Relaxed) {
                let c = local(1, "nodes:1x1")[0] as strataComm_t;
                let mut x = [made as f32; 2];
                let xp = x.as_mut_ptr();
                // SAFETY: 2 floats in place; live communicator, destroyed once.
                unsafe {
                    let rc = all_reduce_sum_f32(xp, xp, 2, c);
                    assert_eq!(rc, strataSuccess, "{}", last(c));
                    assert_eq!(strataCommDestroy(c), strataSuccess);
                    let rc = all_reduce_sum_f32(xp, xp, 2, c);
                    assert_eq!(rc, strataInvalidUsage);
                }
                assert_eq!(x, [made as f32; 2]);
                stale.push(c as usize);
                made += 1;
            }
            stale
        })
    };
    // Lookups of a destroyed and a foreign handle, all along.
    let gone = local(1, "nodes:1x1")[0] as strataComm_t;
    // SAFETY: live communicator, destroyed once.
    assert_eq!(unsafe { strataCommDestroy(gone) }, strataSuccess);
    let gone = gone as usize;
    let prober = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut n = 0;
            let mut probes = 0;
            while probes < 100 || !done.load(Ordering::Relaxed) {
                // SAFETY: valid out-pointer; the handles are never dereferenced.
                unsafe {
                    assert_eq!(
                        strataCommCount(gone as strataComm_t, &mut n),
                        strataInvalidUsage
                    );
                    assert_eq!(
                        strataCommCount((gone + 8) as strataComm_t, &mut n),
                        strataInvalidArgument
                    );
                }
                probes += 1;
            }
        })
    };

    let ranks: Vec<_> = worlds
        .iter()
        .enumerate()
        .flat_map(|(w, comms)| comms.iter().enumerate().map(move |(r, &c)| (w, r, c)))
        .map(|(w, r, c)| {
            std::thread::spawn(move || {
                let c = c as strataComm_t;
                let mut s: strataStream_t = null_mut();
                // SAFETY: valid out-pointer.
                assert_eq!(unsafe { strataStreamCreate(&mut s) }, strataSuccess);
                for i in 0..ITERS {
                    let v =
                        |rank: usize, k: usize| (w * 1000 + i * 10 + rank) as f32 + k as f32 / 8.0;
                    // Out of place on the host stream every other iteration (returns at
                    // once; synchronized below), else blocking.
                    let stream = if i % 2 == 0 { s } else { null_mut() };
                    let x: Vec<f32> = (0..C).map(|k| v(r, k)).collect();
                    let mut g = vec![0f32; 2 * C];
                    // SAFETY: C floats in, 2C out; buffers kept until synchronized.
                    let rc = unsafe {
                        strataAllGather(
                            x.as_ptr().cast(),
                            g.as_mut_ptr().cast(),
                            C,
                            strataFloat32,
                            c,
                            stream,
                        )
                    };
                    assert_eq!(rc, strataSuccess, "{}", last(c));
                    // SAFETY: a live stream.
                    assert_eq!(
                        unsafe { strataStreamSynchronize(s) },
                        strataSuccess,
                        "{}",
                        last(c)
                    );
                    let want: Vec<f32> =
                        (0..2).flat_map(|p| (0..C).map(move |k| v(p, k))).collect();
                    assert_eq!(g, want, "world {w} rank {r} iteration {i}");
                    // All-gather in place (send = recv + rank·C).
                    let mut g = vec![0f32; 2 * C];
                    g[r * C..(r + 1) * C].copy_from_slice(&x);
                    let gp = g.as_mut_ptr();
                    // SAFETY: in place, 2C floats.
                    let rc = unsafe { all_gather_f32(gp.add(r * C), gp, C, c) };
                    assert_eq!(rc, strataSuccess, "{}", last(c));
                    assert_eq!(g, want, "in place: world {w} rank {r} iteration {i}");
                    // Reduce-scatter in place (recv = send + rank·C): block b summed.
                    let mut y: Vec<f32> = (0..2 * C).map(|k| v(r, k)).collect();
                    let yp = y.as_mut_ptr();
                    // SAFETY: in place, 2C floats.
                    let rc = unsafe {
                        strataReduceScatter(
                            yp.cast(),
                            yp.add(r * C).cast(),
                            C,
                            strataFloat32,
                            strataSum,
                            c,
                            null_mut(),
                        )
                    };
                    assert_eq!(rc, strataSuccess, "{}", last(c));
                    let sum: Vec<f32> = (0..C).map(|k| v(0, r * C + k) + v(1, r * C + k)).collect();
                    assert_eq!(
                        &y[r * C..(r + 1) * C],
                        &sum[..],
                        "world {w} rank {r} iteration {i}"
                    );
                }
                // SAFETY: live stream and communicator, each destroyed once.
                unsafe {
                    assert_eq!(strataStreamDestroy(s), strataSuccess);
                    assert_eq!(strataCommDestroy(c), strataSuccess);
                }
            })
        })
        .collect();
    ranks.into_iter().for_each(|h| h.join().unwrap());
    done.store(true, Ordering::Relaxed);
    let stale = churn.join().unwrap();
    prober.join().unwrap();
    // Keys are never reused: every destroyed handle stays destroyed.
    for c in stale {
        let mut n = 0;
        // SAFETY: valid out-pointer; the handle is never dereferenced.
        assert_eq!(
            unsafe { strataCommCount(c as strataComm_t, &mut n) },
            strataInvalidUsage
        );
    }
}

/// `strataCommShrink` (issue 51): rank 2 of nodes:2x2 is lost; the others shrink with
/// `STRATA_SHRINK_ABORT` (the parent's calls fail from then on) and all-reduce on the
/// three survivors; bad arguments are refused and write nothing.
#[test]
fn shrink_excludes_a_lost_rank() {
    let comms = local(4, "nodes:2x2");
    on_each_rank(&comms, |r, c| {
        if r == 2 {
            // SAFETY: live communicator, destroyed once (the lost rank's exit).
            assert_eq!(unsafe { strataCommDestroy(c) }, strataSuccess);
            return;
        }
        let lost = [2i32];
        let mut sub: strataComm_t = null_mut();
        // SAFETY (every call below): live communicator; the list readable for
        // the count given; valid or NULL out-pointers; NULL config.
        unsafe {
            for (list, n, out, flags) in [
                (lost.as_ptr(), 1, null_mut(), STRATA_SHRINK_DEFAULT),
                (
                    null(),
                    1,
                    &mut sub as *mut strataComm_t,
                    STRATA_SHRINK_DEFAULT,
                ),
                (
                    lost.as_ptr(),
                    -1,
                    &mut sub as *mut strataComm_t,
                    STRATA_SHRINK_DEFAULT,
                ),
                (lost.as_ptr(), 1, &mut sub as *mut strataComm_t, 7),
            ] {
                assert_eq!(
                    strataCommShrink(c, list, n, out, null(), flags),
                    strataInvalidArgument
                );
            }
            assert!(sub.is_null(), "a refused shrink wrote nothing");
            let me = [r as i32];
            assert_eq!(
                strataCommShrink(c, me.as_ptr(), 1, &mut sub, null(), 0),
                strataInvalidArgument,
                "the caller excluded"
            );
            let rc = strataCommShrink(c, lost.as_ptr(), 1, &mut sub, null(), STRATA_SHRINK_ABORT);
            assert_eq!(rc, strataSuccess, "{}", last(c));
            let (mut n, mut rank) = (0, 0);
            assert_eq!(strataCommCount(sub, &mut n), strataSuccess);
            assert_eq!(strataCommUserRank(sub, &mut rank), strataSuccess);
            assert_eq!((n, rank), (3, r as i32 - i32::from(r > 2)));
            let x = [r as f32 + 1.0; 5];
            let mut y = [0f32; 5];
            let rc = all_reduce_sum_f32(x.as_ptr(), y.as_mut_ptr(), 5, sub);
            assert_eq!(rc, strataSuccess, "{}", last(sub));
            assert_eq!(y, [1.0 + 2.0 + 4.0; 5]);
            // The parent was aborted by the flag.
            assert_ne!(
                all_reduce_sum_f32(x.as_ptr(), y.as_mut_ptr(), 5, c),
                strataSuccess
            );
            assert_eq!(strataCommDestroy(sub), strataSuccess);
            assert_eq!(strataCommDestroy(c), strataSuccess);
        }
    });
}
