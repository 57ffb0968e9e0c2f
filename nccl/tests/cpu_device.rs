//! The served functions on strata's CPU device, driven in-process through the exported
//! `extern "C"` functions, one thread driving every rank inside groups (as a program
//! with `ncclCommInitAll` does). Every test sets `STRATA_NCCL_DEVICE=cpu` first (the
//! mode is read once per process).

#![allow(non_upper_case_globals)]
// Rank-indexed loops over several per-rank vectors read as the ranks they are.
#![allow(clippy::needless_range_loop)]

use std::ffi::{c_int, c_void, CStr};
use std::ptr::{null, null_mut};
use strata::DataType;
use strata_nccl::abi::*;
use strata_nccl::collectives::*;
use strata_nccl::errors::{ncclGetErrorString, ncclGetLastError};
use strata_nccl::group::*;
use strata_nccl::init::*;
use strata_nccl::memory::*;
use strata_nccl::redop::*;

fn cpu() {
    std::env::set_var("STRATA_NCCL_DEVICE", "cpu");
    assert!(strata_nccl::real::cpu_device());
}

fn ok(r: ncclResult_t) {
    if r != ncclSuccess {
        // SAFETY: NULL asks for the thread's message.
        let m = unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) };
        panic!("result {r}: {m:?}");
    }
}

fn init_all(n: usize) -> Vec<ncclComm_t> {
    let mut comms = vec![null_mut(); n];
    // SAFETY: room for n handles.
    ok(unsafe { ncclCommInitAll(comms.as_mut_ptr(), n as c_int, null()) });
    comms
}

fn destroy(comms: &[ncclComm_t]) {
    for &c in comms {
        // SAFETY: a live communicator.
        ok(unsafe { ncclCommDestroy(c) });
    }
}

/// Run `f(rank)` for every rank inside one group.
fn group(n: usize, mut f: impl FnMut(usize) -> ncclResult_t) {
    // SAFETY: no arguments.
    ok(unsafe { ncclGroupStart() });
    for r in 0..n {
        ok(f(r));
    }
    // SAFETY: every buffer lives in the caller.
    ok(unsafe { ncclGroupEnd() });
}

/// `ncclAllReduce` of one element of `dtype` in place on `z` with `op` on `comm`: the
/// misuse checks' call.
fn one_all_reduce(
    z: &mut [f64; 1],
    dtype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
) -> ncclResult_t {
    let p = z.as_mut_ptr();
    // SAFETY: 8 live bytes read and written: one element of any type up to 8 bytes.
    unsafe { ncclAllReduce(p.cast(), p.cast(), 1, dtype, op, comm, null_mut()) }
}

fn nccl_dt(d: DataType) -> ncclDataType_t {
    d as ncclDataType_t
}

fn buf(d: DataType, vals: &[f64]) -> Vec<u8> {
    let mut b = vec![0u8; vals.len() * d.size()];
    for (i, v) in vals.iter().enumerate() {
        d.set(&mut b, i, *v);
    }
    b
}

fn vals(d: DataType, b: &[u8]) -> Vec<f64> {
    (0..b.len() / d.size()).map(|i| d.get(b, i)).collect()
}

fn input(r: usize, i: usize) -> f64 {
    ((i + r) % 3) as f64
}

fn reference(d: DataType, op: ncclRedOp_t, n: usize, i: usize) -> f64 {
    let xs: Vec<f64> = (0..n).map(|r| input(r, i)).collect();
    match op {
        ncclSum => xs.iter().sum(),
        ncclProd => xs.iter().product(),
        ncclMax => xs.iter().cloned().fold(f64::MIN, f64::max),
        ncclMin => xs.iter().cloned().fold(f64::MAX, f64::min),
        ncclAvg if d.is_float() => xs.iter().sum::<f64>() / n as f64,
        ncclAvg => strata::dtype::int_avg(xs.iter().sum::<f64>() as i128, n) as f64,
        _ => unreachable!(),
    }
}

fn close(d: DataType, got: f64, want: f64) -> bool {
    if d.is_float() {
        (got - want).abs() <= 1e-2 * want.abs().max(1.0)
    } else {
        got == want
    }
}

const DTYPES: [DataType; 7] = [
    DataType::F32,
    DataType::F64,
    DataType::F16,
    DataType::BF16,
    DataType::I64,
    DataType::U8,
    DataType::I32,
];
const OPS: [ncclRedOp_t; 5] = [ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg];

#[test]
fn allreduce_every_dtype_and_op_at_1_to_4_ranks() {
    cpu();
    for n in 1..=4 {
        let comms = init_all(n);
        for d in DTYPES {
            for op in OPS {
                for count in [1usize, 7, 1000] {
                    for in_place in [false, true] {
                        let mut send: Vec<Vec<u8>> = (0..n)
                            .map(|r| buf(d, &(0..count).map(|i| input(r, i)).collect::<Vec<_>>()))
                            .collect();
                        let mut recv: Vec<Vec<u8>> =
                            (0..n).map(|_| vec![0u8; count * d.size()]).collect();
                        group(n, |r| {
                            let s = send[r].as_mut_ptr();
                            let o = if in_place { s } else { recv[r].as_mut_ptr() };
                            // SAFETY: buffers of `count` elements, alive past the group.
                            unsafe {
                                ncclAllReduce(
                                    s.cast(),
                                    o.cast(),
                                    count,
                                    nccl_dt(d),
                                    op,
                                    comms[r],
                                    null_mut(),
                                )
                            }
                        });
                        for r in 0..n {
                            let got = vals(d, if in_place { &send[r] } else { &recv[r] });
                            for (i, g) in got.iter().enumerate() {
                                let w = reference(d, op, n, i);
                                assert!(close(d, *g, w), "n={n} {d:?} op={op} count={count} in_place={in_place} rank {r} [{i}]: {g} != {w}");
                            }
                        }
                    }
                }
            }
        }
        destroy(&comms);
    }
}

#[test]
fn reduce_scatter_all_gather_broadcast_reduce_alltoall_gather_scatter() {
    cpu();
    let d = DataType::F32;
    let dt = nccl_dt(d);
    for n in [1usize, 3, 4] {
        let comms = init_all(n);
        for count in [1usize, 7, 1000] {
            // Reduce-scatter, out of place and in place (recv = send + rank*count).
            for in_place in [false, true] {
                let mut send: Vec<Vec<u8>> = (0..n)
                    .map(|r| buf(d, &(0..n * count).map(|i| input(r, i)).collect::<Vec<_>>()))
                    .collect();
                let mut recv: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; count * 4]).collect();
                group(n, |r| {
                    let s = send[r].as_mut_ptr();
                    // SAFETY: inside send's n*count elements.
                    let o = if in_place {
                        unsafe { s.add(r * count * 4) }
                    } else {
                        recv[r].as_mut_ptr()
                    };
                    // SAFETY: live buffers of the right sizes.
                    unsafe {
                        ncclReduceScatter(
                            s.cast(),
                            o.cast(),
                            count,
                            dt,
                            ncclSum,
                            comms[r],
                            null_mut(),
                        )
                    }
                });
                for r in 0..n {
                    let got = if in_place {
                        vals(d, &send[r][r * count * 4..(r + 1) * count * 4])
                    } else {
                        vals(d, &recv[r])
                    };
                    for (i, g) in got.iter().enumerate() {
                        assert_eq!(
                            *g,
                            reference(d, ncclSum, n, r * count + i),
                            "rs n={n} count={count}"
                        );
                    }
                }
            }
            // All-gather, in place (send = recv + rank*count) and not.
            for in_place in [false, true] {
                let mut recv: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; n * count * 4]).collect();
                let send: Vec<Vec<u8>> = (0..n)
                    .map(|r| buf(d, &vec![r as f64 + 1.0; count]))
                    .collect();
                if in_place {
                    for r in 0..n {
                        recv[r][r * count * 4..(r + 1) * count * 4].copy_from_slice(&send[r]);
                    }
                }
                group(n, |r| {
                    let o = recv[r].as_mut_ptr();
                    // SAFETY: inside recv.
                    let s = if in_place {
                        unsafe { o.add(r * count * 4) as *const u8 }
                    } else {
                        send[r].as_ptr()
                    };
                    // SAFETY: live buffers.
                    unsafe { ncclAllGather(s.cast(), o.cast(), count, dt, comms[r], null_mut()) }
                });
                for r in 0..n {
                    let got = vals(d, &recv[r]);
                    for (i, g) in got.iter().enumerate() {
                        assert_eq!(*g, (i / count) as f64 + 1.0);
                    }
                }
            }
            // Broadcast from the last rank, Bcast from rank 0.
            let root = n - 1;
            let mut b: Vec<Vec<u8>> = (0..n).map(|r| buf(d, &vec![r as f64; count])).collect();
            group(n, |r| {
                let p = b[r].as_mut_ptr();
                // SAFETY: live buffer, in place.
                unsafe {
                    ncclBroadcast(
                        p.cast(),
                        p.cast(),
                        count,
                        dt,
                        root as c_int,
                        comms[r],
                        null_mut(),
                    )
                }
            });
            assert!(b
                .iter()
                .all(|x| vals(d, x).iter().all(|v| *v == root as f64)));
            let mut b: Vec<Vec<u8>> = (0..n)
                .map(|r| buf(d, &vec![r as f64 + 5.0; count]))
                .collect();
            group(n, |r| {
                // SAFETY: live buffer.
                unsafe { ncclBcast(b[r].as_mut_ptr().cast(), count, dt, 0, comms[r], null_mut()) }
            });
            assert!(b.iter().all(|x| vals(d, x).iter().all(|v| *v == 5.0)));
            // Reduce to the last rank; other ranks pass a NULL recvbuff.
            let send: Vec<Vec<u8>> = (0..n)
                .map(|r| buf(d, &(0..count).map(|i| input(r, i)).collect::<Vec<_>>()))
                .collect();
            let mut out = vec![0u8; count * 4];
            group(n, |r| {
                let o = if r == root {
                    out.as_mut_ptr()
                } else {
                    null_mut()
                };
                // SAFETY: live buffers; recv only on the root.
                unsafe {
                    ncclReduce(
                        send[r].as_ptr().cast(),
                        o.cast(),
                        count,
                        dt,
                        ncclMax,
                        root as c_int,
                        comms[r],
                        null_mut(),
                    )
                }
            });
            for (i, g) in vals(d, &out).iter().enumerate() {
                assert_eq!(*g, reference(d, ncclMax, n, i));
            }
            // All-to-all.
            let send: Vec<Vec<u8>> = (0..n)
                .map(|r| {
                    buf(
                        d,
                        &(0..n * count)
                            .map(|i| (r * 1000 + i / count) as f64)
                            .collect::<Vec<_>>(),
                    )
                })
                .collect();
            let mut recv: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; n * count * 4]).collect();
            group(n, |r| {
                // SAFETY: live buffers of n*count elements.
                unsafe {
                    ncclAlltoAll(
                        send[r].as_ptr().cast(),
                        recv[r].as_mut_ptr().cast(),
                        count,
                        dt,
                        comms[r],
                        null_mut(),
                    )
                }
            });
            for r in 0..n {
                for (i, g) in vals(d, &recv[r]).iter().enumerate() {
                    assert_eq!(*g, ((i / count) * 1000 + r) as f64);
                }
            }
            // Gather to rank 0 in place (its block already at recv + 0), scatter from it.
            let send: Vec<Vec<u8>> = (0..n)
                .map(|r| buf(d, &vec![r as f64 * 2.0; count]))
                .collect();
            let mut all = vec![0u8; n * count * 4];
            all[..count * 4].copy_from_slice(&send[0]);
            group(n, |r| {
                let (s, o) = if r == 0 {
                    (all.as_ptr(), all.as_mut_ptr())
                } else {
                    (send[r].as_ptr(), null_mut())
                };
                // SAFETY: live buffers; in place on the root.
                unsafe { ncclGather(s.cast(), o.cast(), count, dt, 0, comms[r], null_mut()) }
            });
            for (i, g) in vals(d, &all).iter().enumerate() {
                assert_eq!(*g, (i / count) as f64 * 2.0);
            }
            let mut got: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; count * 4]).collect();
            group(n, |r| {
                let s = if r == 0 { all.as_ptr() } else { null() };
                // SAFETY: live buffers; send only on the root.
                unsafe {
                    ncclScatter(
                        s.cast(),
                        got[r].as_mut_ptr().cast(),
                        count,
                        dt,
                        0,
                        comms[r],
                        null_mut(),
                    )
                }
            });
            for r in 0..n {
                assert!(vals(d, &got[r]).iter().all(|v| *v == r as f64 * 2.0));
            }
        }
        destroy(&comms);
    }
}

#[test]
fn send_recv_ring_and_config_variants() {
    cpu();
    let n = 3;
    let comms = init_all(n);
    let send: Vec<Vec<i64>> = (0..n).map(|r| vec![r as i64 * 10; 7]).collect();
    let mut recv: Vec<Vec<i64>> = (0..n).map(|_| vec![0; 7]).collect();
    group(n, |r| {
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        // SAFETY: live buffers of 7 elements.
        unsafe {
            ok(ncclSend(
                send[r].as_ptr().cast(),
                7,
                ncclInt64,
                next as c_int,
                comms[r],
                null_mut(),
            ));
            ncclRecv(
                recv[r].as_mut_ptr().cast(),
                7,
                ncclInt64,
                prev as c_int,
                comms[r],
                null_mut(),
            )
        }
    });
    for r in 0..n {
        assert_eq!(recv[r], vec![((r + n - 1) % n) as i64 * 10; 7]);
    }
    // Config variants: NULL, an initialised config, a bad one.
    let good = ncclCollConfig_t {
        size: std::mem::size_of::<ncclCollConfig_t>(),
        magic: NCCL_API_MAGIC,
        version: 23203,
        ext: null_mut(),
        minCTAs: NCCL_CONFIG_UNDEF_INT,
        maxCTAs: NCCL_CONFIG_UNDEF_INT,
        nvlsCTAs: NCCL_CONFIG_UNDEF_INT,
        cgaClusterSize: NCCL_CONFIG_UNDEF_INT,
        algSelection: null(),
        forceAlgSelection: 1,
        CTAPolicy: NCCL_CONFIG_UNDEF_INT,
        userProfilerTag: 0,
        launchCompletionEvent: null_mut(),
    };
    for cfg in [null(), &good as *const ncclCollConfig_t] {
        let mut x: Vec<Vec<u32>> = (0..n).map(|r| vec![r as u32 + 1; 5]).collect();
        group(n, |r| {
            let p = x[r].as_mut_ptr();
            // SAFETY: live buffers, in place.
            unsafe {
                ncclAllReduceConfig(
                    p.cast(),
                    p.cast(),
                    5,
                    ncclUint32,
                    ncclSum,
                    comms[r],
                    null_mut(),
                    cfg,
                )
            }
        });
        assert!(x.iter().all(|v| v == &vec![6u32; 5]));
    }
    let bad = ncclCollConfig_t { magic: 1, ..good };
    let mut x = [0f32; 2];
    // SAFETY: a live buffer; the bad config is refused before any use.
    let r = unsafe {
        ncclAllReduceConfig(
            x.as_ptr().cast(),
            x.as_mut_ptr().cast(),
            2,
            ncclFloat32,
            ncclSum,
            comms[0],
            null_mut(),
            &bad,
        )
    };
    assert_eq!(r, ncclInvalidArgument);
    destroy(&comms);
}

#[test]
fn premulsum_host_and_device_scalars() {
    cpu();
    let n = 2;
    let comms = init_all(n);
    // f32, host scalar 0.5: sum of halves. f16 device scalar read at run time. i32 x3.
    let mut ops = vec![0; n];
    let half = 0.5f32;
    for r in 0..n {
        // SAFETY: live op and scalar.
        ok(unsafe {
            ncclRedOpCreatePreMulSum(
                &mut ops[r],
                (&half as *const f32).cast_mut().cast(),
                ncclFloat32,
                ncclScalarHostImmediate,
                comms[r],
            )
        });
    }
    assert!(ops[0] >= ncclNumOps && ops[0] != ops[1]);
    for count in [1usize, 7, 1000] {
        let mut x: Vec<Vec<f32>> = (0..n)
            .map(|r| (0..count).map(|i| (i + r) as f32).collect())
            .collect();
        let mut y: Vec<Vec<f32>> = (0..n).map(|_| vec![0.0; count]).collect();
        group(n, |r| {
            // SAFETY: live buffers.
            unsafe {
                ncclAllReduce(
                    x[r].as_ptr().cast(),
                    y[r].as_mut_ptr().cast(),
                    count,
                    ncclFloat32,
                    ops[r],
                    comms[r],
                    null_mut(),
                )
            }
        });
        for r in 0..n {
            for i in 0..count {
                assert_eq!(y[r][i], (2 * i + 1) as f32 * 0.5);
            }
        }
        // In place; the input is not scaled where the caller can see it but replaced by the result.
        group(n, |r| {
            let p = x[r].as_mut_ptr();
            // SAFETY: live buffers.
            unsafe {
                ncclAllReduce(
                    p.cast(),
                    p.cast(),
                    count,
                    ncclFloat32,
                    ops[r],
                    comms[r],
                    null_mut(),
                )
            }
        });
        assert_eq!(x[0], y[0]);
    }
    // The op with another dtype, another comm, after destroy: refused.
    let mut z = [0f64; 1];
    assert_eq!(
        one_all_reduce(&mut z, ncclFloat64, ops[0], comms[0]),
        ncclInvalidArgument
    );
    assert_eq!(
        one_all_reduce(&mut z, ncclFloat32, ops[0], comms[1]),
        ncclInvalidArgument
    );
    // SAFETY: NULL: the thread's message.
    let m = unsafe { CStr::from_ptr(ncclGetLastError(comms[1])) }
        .to_string_lossy()
        .into_owned();
    assert!(m.contains("another communicator"), "{m}");
    for r in 0..n {
        // SAFETY: values.
        ok(unsafe { ncclRedOpDestroy(ops[r], comms[r]) });
    }
    // SAFETY: values.
    assert_eq!(
        unsafe { ncclRedOpDestroy(ops[0], comms[0]) },
        ncclInvalidArgument
    );
    assert_eq!(
        one_all_reduce(&mut z, ncclFloat32, ops[0], comms[0]),
        ncclInvalidArgument
    );

    // f16 with a device-residence scalar (read when the collective runs): reduce-scatter.
    let f16 = DataType::F16;
    let mut scalar = buf(f16, &[3.0]);
    for r in 0..n {
        // SAFETY: `scalar` outlives the op's use.
        ok(unsafe {
            ncclRedOpCreatePreMulSum(
                &mut ops[r],
                scalar.as_mut_ptr().cast(),
                ncclFloat16,
                ncclScalarDevice,
                comms[r],
            )
        });
    }
    f16.set(&mut scalar, 0, 0.25);
    let x: Vec<Vec<u8>> = (0..n)
        .map(|r| buf(f16, &(0..2 * 7).map(|i| (i + r) as f64).collect::<Vec<_>>()))
        .collect();
    let mut y: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; 7 * 2]).collect();
    group(n, |r| {
        // SAFETY: live buffers.
        unsafe {
            ncclReduceScatter(
                x[r].as_ptr().cast(),
                y[r].as_mut_ptr().cast(),
                7,
                ncclFloat16,
                ops[r],
                comms[r],
                null_mut(),
            )
        }
    });
    for r in 0..n {
        for (i, g) in vals(f16, &y[r]).iter().enumerate() {
            let j = r * 7 + i;
            assert_eq!(*g, (2 * j + 1) as f64 * 0.25, "rank {r} [{i}]");
        }
    }
    // i32 x3 via Reduce to rank 1 (rank 0 passes NULL).
    let three = 3i32;
    for r in 0..n {
        // SAFETY: live values.
        ok(unsafe {
            ncclRedOpCreatePreMulSum(
                &mut ops[r],
                (&three as *const i32).cast_mut().cast(),
                ncclInt32,
                ncclScalarHostImmediate,
                comms[r],
            )
        });
    }
    let x: Vec<Vec<i32>> = (0..n).map(|r| vec![r as i32 + 1; 7]).collect();
    let mut out = vec![0i32; 7];
    group(n, |r| {
        let o = if r == 1 { out.as_mut_ptr() } else { null_mut() };
        // SAFETY: live buffers.
        unsafe {
            ncclReduce(
                x[r].as_ptr().cast(),
                o.cast(),
                7,
                ncclInt32,
                ops[r],
                1,
                comms[r],
                null_mut(),
            )
        }
    });
    assert_eq!(out, vec![9; 7]);
    destroy(&comms);
}

#[test]
fn split_shrink_and_abort() {
    cpu();
    let n = 4;
    let comms = init_all(n);
    // Split by parity, key reverses the order; rank 3 opts out.
    let mut sub: Vec<ncclComm_t> = vec![null_mut(); n];
    let p = sub.as_mut_ptr() as usize;
    group(n, |r| {
        let color = if r == 3 {
            NCCL_SPLIT_NOCOLOR
        } else {
            (r % 2) as c_int
        };
        // SAFETY: `sub` outlives the group.
        unsafe {
            ncclCommSplit(
                comms[r],
                color,
                -(r as c_int),
                (p as *mut ncclComm_t).add(r),
                null_mut(),
            )
        }
    });
    assert!(sub[3].is_null());
    let (mut cnt, mut rank) = (0, 0);
    // SAFETY: live comm and ints.
    unsafe {
        ok(ncclCommCount(sub[0], &mut cnt));
        ok(ncclCommUserRank(sub[0], &mut rank));
    }
    assert_eq!((cnt, rank), (2, 1));
    // SAFETY: live comm and int.
    unsafe { ok(ncclCommCount(sub[1], &mut cnt)) };
    assert_eq!(cnt, 1);
    let mut x: Vec<Vec<f32>> = (0..3).map(|r| vec![r as f32; 3]).collect();
    group(3, |r| {
        let q = x[r].as_mut_ptr();
        // SAFETY: live buffers.
        unsafe {
            ncclAllReduce(
                q.cast(),
                q.cast(),
                3,
                ncclFloat32,
                ncclSum,
                sub[r],
                null_mut(),
            )
        }
    });
    assert_eq!(x[0], vec![2.0; 3]);
    assert_eq!(x[1], vec![1.0; 3]);
    destroy(&sub[..3]);
    // Shrink away rank 1: the survivors make a 3-rank communicator.
    let mut small: Vec<ncclComm_t> = vec![null_mut(); n];
    let p = small.as_mut_ptr() as usize;
    let mut excl = [1 as c_int];
    let e = excl.as_mut_ptr() as usize;
    group(n, |r| {
        if r == 1 {
            return ncclSuccess;
        }
        // SAFETY: `excl` and `small` outlive the group.
        unsafe {
            ncclCommShrink(
                comms[r],
                e as *mut c_int,
                1,
                (p as *mut ncclComm_t).add(r),
                null_mut(),
                NCCL_SHRINK_DEFAULT,
            )
        }
    });
    // SAFETY: live comm and ints.
    unsafe {
        ok(ncclCommCount(small[3], &mut cnt));
        ok(ncclCommUserRank(small[3], &mut rank));
    }
    assert_eq!((cnt, rank), (3, 2));
    destroy(&[small[0], small[2], small[3]]);
    // Abort every rank; later use is an error, never a crash.
    for &c in &comms {
        // SAFETY: a live communicator.
        ok(unsafe { ncclCommAbort(c) });
    }
    // SAFETY: an aborted handle is detected.
    let r = unsafe { ncclCommCount(comms[0], &mut cnt) };
    assert!(r == ncclInvalidUsage || r == ncclInvalidArgument, "{r}");
}

#[test]
fn nonblocking_init_by_rank_in_a_group() {
    cpu();
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: a live id.
    ok(unsafe { ncclGetUniqueId(&mut id) });
    let mut cfg: ncclConfig_t = unsafe {
        // SAFETY: all-zero is a valid ncclConfig_t (integers and NULL pointers).
        std::mem::zeroed()
    };
    cfg.size = std::mem::size_of::<ncclConfig_t>();
    cfg.magic = NCCL_API_MAGIC;
    cfg.version = 23203;
    cfg.blocking = 0;
    let n = 3;
    let mut comms = vec![null_mut(); n];
    let p = comms.as_mut_ptr() as usize;
    group(n, |r| {
        // SAFETY: `comms` and `cfg` outlive the group.
        unsafe {
            ncclCommInitRankConfig(
                (p as *mut ncclComm_t).add(r),
                n as c_int,
                id,
                r as c_int,
                &mut cfg,
            )
        }
    });
    for (r, &c) in comms.iter().enumerate() {
        let (mut async_err, mut rank, mut dev) = (-1, -1, -1);
        // SAFETY: live comm and ints.
        unsafe {
            ok(ncclCommGetAsyncError(c, &mut async_err));
            ok(ncclCommUserRank(c, &mut rank));
            ok(ncclCommCuDevice(c, &mut dev));
            ok(ncclCommFinalize(c));
        }
        assert_eq!((async_err, rank, dev), (ncclSuccess, r as c_int, 0));
    }
    destroy(&comms);
}

#[test]
fn bad_input_is_an_error_with_a_message() {
    cpu();
    let comms = init_all(1);
    let c = comms[0];
    let mut x = [0f32; 4];
    let (s, o) = (x.as_ptr().cast::<c_void>(), x.as_mut_ptr().cast::<c_void>());
    let last = || {
        // SAFETY: NULL: the thread's message.
        unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY (each call): live buffers; the arguments are checked.
    unsafe {
        assert_eq!(
            ncclAllReduce(s, o, 4, ncclFloat32, ncclSum, null_mut(), null_mut()),
            ncclInvalidArgument
        );
        assert!(last().contains("comm is NULL"));
        assert_eq!(
            ncclAllReduce(s, o, 4, ncclFloat8e4m3, ncclSum, c, null_mut()),
            ncclInvalidArgument
        );
        assert!(
            last().contains("fp8") && last().contains("ncclFloat8e4m3"),
            "{}",
            last()
        );
        assert_eq!(
            ncclAllGather(s, o, 1, ncclFloat8e5m2, c, null_mut()),
            ncclInvalidArgument
        );
        assert_eq!(
            ncclAllReduce(s, o, 4, 12, ncclSum, c, null_mut()),
            ncclInvalidArgument
        );
        assert_eq!(
            ncclAllReduce(s, o, 4, ncclFloat32, 99, c, null_mut()),
            ncclInvalidArgument
        );
        assert!(last().contains("op 99"), "{}", last());
        assert_eq!(
            ncclAllReduce(s, o, 4, ncclFloat32, -1, c, null_mut()),
            ncclInvalidArgument
        );
        assert_eq!(
            ncclBroadcast(s, o, 4, ncclFloat32, 5, c, null_mut()),
            ncclInvalidArgument
        );
        assert_eq!(
            ncclReduce(s, o, 4, ncclFloat32, ncclSum, 5, c, null_mut()),
            ncclInvalidArgument
        );
        assert!(last().contains("root 5"), "{}", last());
        assert_eq!(ncclGroupEnd(), ncclInvalidUsage);
        assert_eq!(ncclCommCount(c, null_mut()), ncclInvalidArgument);
        assert_eq!(ncclCommCuDevice(c, null_mut()), ncclInvalidArgument);
        // Inside a group: refused at the call, the group still ends cleanly.
        ok(ncclGroupStart());
        assert_eq!(
            ncclAllReduce(s, o, 4, ncclFloat8e4m3, ncclSum, c, null_mut()),
            ncclInvalidArgument
        );
        ok(ncclGroupEnd());
        assert!(!CStr::from_ptr(ncclGetErrorString(ncclInvalidArgument))
            .to_bytes()
            .is_empty());
        assert_eq!(
            CStr::from_ptr(ncclGetErrorString(ncclTimeout))
                .to_str()
                .unwrap(),
            "operation timed out"
        );
        assert_eq!(ncclCommDestroy(null_mut()), ncclSuccess);
        // The id and init arguments.
        assert_eq!(ncclGetUniqueId(null_mut()), ncclInvalidArgument);
        assert_eq!(ncclCommInitAll(null_mut(), 2, null()), ncclInvalidArgument);
        let id = ncclUniqueId { internal: [0; 128] };
        assert_eq!(
            ncclCommInitRankScalable(null_mut(), 1, 0, 0, null_mut(), null_mut()),
            ncclInvalidArgument
        );
        let mut cfg: ncclConfig_t = std::mem::zeroed();
        cfg.size = 8;
        let mut nc = null_mut();
        assert_eq!(
            ncclCommInitRankConfig(&mut nc, 1, id, 0, &mut cfg),
            ncclInvalidArgument
        );
        assert!(last().contains("NCCL_CONFIG_INITIALIZER"), "{}", last());
    }
    destroy(&comms);
}

#[test]
fn simulate_end_runs_nothing() {
    cpu();
    let comms = init_all(2);
    let mut x: Vec<Vec<f32>> = (0..2).map(|r| vec![r as f32 + 1.0; 3]).collect();
    let mut info = ncclSimInfo_t {
        size: std::mem::size_of::<ncclSimInfo_t>(),
        magic: NCCL_SIM_INFO_MAGIC,
        version: 23203,
        estimatedTime: -1.0,
    };
    // SAFETY: live buffers and info.
    unsafe {
        ok(ncclGroupStart());
        for r in 0..2 {
            let p = x[r].as_mut_ptr();
            ok(ncclAllReduce(
                p.cast(),
                p.cast(),
                3,
                ncclFloat32,
                ncclSum,
                comms[r],
                null_mut(),
            ));
        }
        ok(ncclGroupSimulateEnd(&mut info));
    }
    // strata's model of one all-reduce of 12 bytes over 2 ranks: the links' latency
    // (microseconds), neither 0 nor the -1 it was given.
    assert!(
        info.estimatedTime > 0.0 && info.estimatedTime < 1e4,
        "{}",
        info.estimatedTime
    );
    assert_eq!(x[0], vec![1.0; 3]);
    assert_eq!(x[1], vec![2.0; 3]);
    // A bigger call is estimated longer; a group of point-to-point calls adds nothing.
    let small = info.estimatedTime;
    let mut big: Vec<Vec<f32>> = (0..2).map(|_| vec![0.0; 1 << 20]).collect();
    // SAFETY: live buffers and info.
    unsafe {
        ok(ncclGroupStart());
        for r in 0..2 {
            let p = big[r].as_mut_ptr();
            ok(ncclAllReduce(
                p.cast(),
                p.cast(),
                1 << 20,
                ncclFloat32,
                ncclSum,
                comms[r],
                null_mut(),
            ));
        }
        ok(ncclGroupSimulateEnd(&mut info));
    }
    assert!(
        info.estimatedTime > small,
        "{} <= {small}",
        info.estimatedTime
    );
    // SAFETY: live buffers and info.
    unsafe {
        ok(ncclGroupStart());
        let (a, b) = x.split_at_mut(1);
        ok(ncclSend(
            a[0].as_ptr().cast(),
            3,
            ncclFloat32,
            1,
            comms[0],
            null_mut(),
        ));
        ok(ncclRecv(
            b[0].as_mut_ptr().cast(),
            3,
            ncclFloat32,
            0,
            comms[1],
            null_mut(),
        ));
        ok(ncclGroupSimulateEnd(&mut info));
    }
    assert_eq!(info.estimatedTime, 0.0);
    info.magic = 0;
    // SAFETY: live info.
    unsafe {
        ok(ncclGroupStart());
        assert_eq!(ncclGroupSimulateEnd(&mut info), ncclInvalidArgument);
    }
    destroy(&comms);
}

#[test]
fn memory_and_registration() {
    cpu();
    let comms = init_all(1);
    let mut p = null_mut();
    // SAFETY: live pointers; the memory is used within its size.
    unsafe {
        ok(ncclMemAlloc(&mut p, 1000));
        assert_eq!(p as usize % 4096, 0);
        std::ptr::write_bytes(p.cast::<u8>(), 7, 1000);
        let mut h = null_mut();
        ok(ncclCommRegister(comms[0], p, 1000, &mut h));
        assert!(!h.is_null());
        let mut w = null_mut();
        ok(ncclCommWindowRegister(comms[0], p, 1000, &mut w, 0));
        assert_eq!(ncclCommDeregister(comms[0], w.cast()), ncclInvalidArgument);
        ok(ncclCommDeregister(comms[0], h));
        assert_eq!(ncclCommDeregister(comms[0], h), ncclInvalidArgument);
        ok(ncclCommWindowDeregister(comms[0], w));
        ok(ncclMemFree(p));
        assert_eq!(ncclMemFree(p), ncclInvalidArgument);
        ok(ncclMemFree(null_mut()));
    }
    destroy(&comms);
}

/// Host cost of a 1 KiB all-reduce on one rank: `ncclAllReduce` against
/// `strataAllReduce` (run with `--release -- --ignored --nocapture`).
#[test]
#[ignore]
fn host_cost_1kib_allreduce() {
    cpu();
    let comms = init_all(1);
    let c = comms[0];
    let mut x = vec![1f32; 256];
    let p = x.as_mut_ptr().cast::<c_void>();
    let iters = 200_000;
    let time = |f: &dyn Fn() -> i32| {
        for _ in 0..10_000 {
            assert_eq!(f(), 0);
        }
        let t = std::time::Instant::now();
        for _ in 0..iters {
            f();
        }
        t.elapsed().as_nanos() as f64 / iters as f64
    };
    for round in 0..3 {
        // SAFETY: a live buffer of 256 floats, in place.
        let n = time(&|| unsafe { ncclAllReduce(p, p, 256, ncclFloat32, ncclSum, c, null_mut()) });
        // SAFETY: as above.
        let s = time(&|| unsafe {
            strata::capi::strataAllReduce(p, p, 256, ncclFloat32, ncclSum, c.cast(), null_mut())
        });
        eprintln!(
            "round {round}: ncclAllReduce {n:.0} ns, strataAllReduce {s:.0} ns, ratio {:.3}",
            n / s
        );
    }
    destroy(&comms);
}
