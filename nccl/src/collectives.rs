//! The collectives and point-to-point calls, plain and `*Config`, on strata's CPU
//! device (host pointers; the `cudaStream_t` argument is ignored, any value, NULL
//! included). Outside a group each call has completed, its result in the receive
//! buffer, when it returns; inside a group it is recorded and runs at the outermost
//! `ncclGroupEnd` (`group.rs`). With the real library each is passed to it unchanged.
//!
//! What each is on strata:
//! - `ncclAllGather`, `ncclReduceScatter`, `ncclAllReduce`, `ncclBroadcast`,
//!   `ncclBcast`, `ncclAlltoAll`, `ncclSend`, `ncclRecv`: strata's call of the same
//!   shape (same in-place layouts, same data type and op values; `ncclAvg` is strata's
//!   exact mean).
//! - `ncclReduce`: strata's all-reduce into `recvbuff` on the root, into a scratch
//!   buffer elsewhere (`recvbuff` may be NULL there), so the root's result is exactly
//!   the all-reduce's.
//! - `ncclGather` / `ncclScatter`: strata sends and receives to / from the root in one
//!   strata group (the root's own block moves through strata too, unless in place).
//! - a PreMulSum op (`redop.rs`): the input scaled into a scratch buffer, then a sum.
//! - `*Config` variants: the config must be NULL or set up with
//!   `NCCL_COLLCONFIG_INITIALIZER` (size and magic checked); its tuning fields
//!   (CTAs, `algSelection`, profiler tag, completion event) are NCCL's and ignored.
//!
//! Checked at the call (also inside a group): a NULL communicator, an unknown data type,
//! fp8 (`ncclInvalidArgument`: strata's CPU device has no fp8), a negative or unknown
//! op, a PreMulSum op of another communicator or data type. Everything else strata
//! checks when the call runs (counts, aliasing, ranks, peers).
//!
//! Host cost: a call outside a group is these checks and one strata call (no lock, no
//! allocation on the built-in ops).

use crate::abi::*;
use crate::comm::sc;
use crate::errors::{fail, guard, strata_result};
use crate::join::With;
use crate::passthrough::pass;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use strata::capi as s;

/// Which call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    AllGather,
    ReduceScatter,
    AllReduce,
    Broadcast,
    Reduce,
    AlltoAll,
    Gather,
    Scatter,
    Send,
    Recv,
}

/// One call's arguments (kept by a group until its end).
#[derive(Clone, Copy)]
pub struct Call {
    pub func: &'static str,
    pub kind: Kind,
    pub send: *const c_void,
    pub recv: *mut c_void,
    pub count: usize,
    pub dtype: ncclDataType_t,
    pub op: ncclRedOp_t,
    /// Root, or the peer of a send / receive.
    pub root: c_int,
    pub comm: ncclComm_t,
}

impl Kind {
    fn reduces(self) -> bool {
        matches!(self, Kind::ReduceScatter | Kind::AllReduce | Kind::Reduce)
    }
}

/// A data type strata's CPU device serves, or the error (fp8 named).
pub fn check_dtype(d: ncclDataType_t) -> Result<(), (ncclResult_t, String)> {
    match d {
        ncclFloat8e4m3 | ncclFloat8e5m2 => Err((
            ncclInvalidArgument,
            format!(
                "{} (fp8) is not served on strata's CPU device",
                dtype_name(d)
            ),
        )),
        d if dtype_size(d).is_none() => Err((
            ncclInvalidArgument,
            format!(
                "datatype {d} is not an ncclDataType_t (0..{})",
                ncclNumTypes - 1
            ),
        )),
        _ => Ok(()),
    }
}

#[inline]
fn precheck(c: &Call) -> Result<(), (ncclResult_t, String)> {
    if c.comm.is_null() {
        return Err((ncclInvalidArgument, "comm is NULL".into()));
    }
    check_dtype(c.dtype)?;
    if c.kind.reduces() && !(0..ncclNumOps).contains(&c.op) {
        if c.op < 0 {
            return Err((
                ncclInvalidArgument,
                format!("op {} is not an ncclRedOp_t", c.op),
            ));
        }
        crate::redop::scalar_of(c.op, c.dtype, c.comm).map_err(|m| (ncclInvalidArgument, m))?;
    }
    Ok(())
}

/// Check a call and run it now, or record it for the group's end.
///
/// The common call (a communicator, a type strata serves, a built-in op, one strata call
/// of the same shape, no group open on any thread, no `STRATA_NCCL` list) goes straight
/// to strata's call: what the general path checks holds, and strata's entry catches its
/// own panics.
#[inline(always)]
fn submit(c: Call) -> ncclResult_t {
    let plain = !c.comm.is_null()
        && (0..ncclFloat8e4m3).contains(&c.dtype)
        && (0..ncclNumOps).contains(&c.op)
        && !matches!(c.kind, Kind::Reduce | Kind::Gather | Kind::Scatter)
        && !crate::group::in_group()
        && !matches!(crate::serve::serve(), Ok(crate::serve::Serve::Algos(_)));
    if plain {
        // SAFETY: outside a group the caller's buffers are valid for this call.
        return unsafe { one(&c) }.unwrap_or_else(|| unreachable_kind(&c));
    }
    guard(c.func, c.comm, || {
        if let Err((code, m)) = precheck(&c) {
            return fail(c.func, c.comm, code, m);
        }
        if crate::group::in_group() {
            crate::group::record(c);
            return ncclSuccess;
        }
        // SAFETY: outside a group the caller's buffers are valid for this call.
        unsafe { execute(&c) }
    })
}

/// Check a per-call config, then [`submit`].
///
/// # Safety
/// `cfg` is NULL or points to `cfg->size` readable bytes.
unsafe fn submit_cfg(c: Call, cfg: *const ncclCollConfig_t) -> ncclResult_t {
    // SAFETY: the caller's contract.
    if let Err(m) = unsafe { check_coll_config(cfg) } {
        return fail(c.func, c.comm, ncclInvalidArgument, m);
    }
    submit(c)
}

/// Run a checked call through strata now (inside a strata group when one is open).
///
/// # Safety
/// The call's buffers are valid as NCCL's signature of `c.func` requires, until the
/// call (or the open strata group) ends.
pub unsafe fn execute(c: &Call) -> ncclResult_t {
    let premul = c.kind.reduces() && c.op >= ncclNumOps;
    if let Some(r) = listed(c, premul) {
        return strata_result(c.func, c.comm, r);
    }
    // SAFETY: the caller's contract (`one` and `composed` have `execute`'s).
    unsafe {
        if premul {
            return composed(c);
        }
        one(c).unwrap_or_else(|| composed(c))
    }
}

/// A call of a built-in op that is one strata call of the same shape, run; `None` for
/// the others (reduce, gather, scatter).
///
/// # Safety
/// As [`execute`]'s.
#[inline(always)]
unsafe fn one(c: &Call) -> Option<ncclResult_t> {
    let (comm, st) = (sc(c.comm), null_mut());
    // SAFETY (every strata call below): the caller's buffers, as NCCL's contract for
    // this call gives them, passed to strata's call of the same contract; strata checks
    // the handle, the counts and the layouts.
    let r = unsafe {
        match c.kind {
            Kind::AllReduce => s::strataAllReduce(c.send, c.recv, c.count, c.dtype, c.op, comm, st),
            Kind::ReduceScatter => {
                s::strataReduceScatter(c.send, c.recv, c.count, c.dtype, c.op, comm, st)
            }
            Kind::AllGather => s::strataAllGather(c.send, c.recv, c.count, c.dtype, comm, st),
            Kind::Broadcast => {
                s::strataBroadcast(c.send, c.recv, c.count, c.dtype, c.root, comm, st)
            }
            Kind::AlltoAll => s::strataAllToAll(c.send, c.recv, c.count, c.dtype, comm, st),
            Kind::Send => s::strataSend(c.send, c.count, c.dtype, c.root, comm, st),
            Kind::Recv => s::strataRecv(c.recv, c.count, c.dtype, c.root, comm, st),
            Kind::Reduce | Kind::Gather | Kind::Scatter => return None,
        }
    };
    Some(strata_result(c.func, c.comm, r))
}

/// [`submit`]'s direct path was given a kind [`one`] does not run (it excludes them).
#[cold]
fn unreachable_kind(c: &Call) -> ncclResult_t {
    fail(
        c.func,
        c.comm,
        ncclInternalError,
        format!("internal error: {:?} reached the direct path", c.kind),
    )
}

/// With `STRATA_NCCL` naming algorithms: an all-gather, reduce-scatter or all-reduce
/// (not PreMulSum) runs the first that fits it ([`crate::route::route_call`]; none, or
/// `ring`: strata's native form), through [`s::collective_with`]. `None`: not such a
/// call, or no list (strata's own choice runs).
fn listed(c: &Call, premul: bool) -> Option<i32> {
    use crate::route::Route;
    use crate::serve::Serve;
    let Ok(serve @ Serve::Algos(_)) = crate::serve::serve() else {
        return None;
    };
    let with = match c.kind {
        Kind::AllGather => s::With::AllGather,
        Kind::ReduceScatter if !premul => s::With::ReduceScatter(c.op),
        Kind::AllReduce if !premul => s::With::AllReduce(c.op),
        _ => return None,
    };
    let comm = s::comm_of(sc(c.comm)).ok()?;
    let algo = match crate::route::route_call(serve, &comm, with, c.count, c.dtype) {
        Route::Strata(a) => a,
        Route::Native => strata::Algo::Ring,
    };
    // SAFETY: as in `execute`: the caller's buffers under NCCL's contract for the call.
    Some(unsafe {
        s::collective_with(
            with,
            algo,
            c.send,
            c.recv,
            c.count,
            c.dtype,
            sc(c.comm),
            null_mut(),
        )
    })
}

/// This rank and the communicator's size.
fn rank_size(c: &Call) -> Result<(c_int, c_int), ncclResult_t> {
    let (mut rank, mut n) = (0, 0);
    // SAFETY: live ints; strata checks the handle.
    let r = unsafe { s::strataCommUserRank(sc(c.comm), &mut rank) };
    if r != ncclSuccess {
        return Err(strata_result(c.func, c.comm, r));
    }
    // SAFETY: as above.
    let r = unsafe { s::strataCommCount(sc(c.comm), &mut n) };
    if r != ncclSuccess {
        return Err(strata_result(c.func, c.comm, r));
    }
    Ok((rank, n))
}

fn check_root(c: &Call, n: c_int) -> Result<(), ncclResult_t> {
    if (0..n).contains(&c.root) {
        Ok(())
    } else {
        Err(fail(
            c.func,
            c.comm,
            ncclInvalidArgument,
            format!("root {} is outside 0..{n}", c.root),
        ))
    }
}

fn bytes_of(c: &Call, elems: usize) -> Result<usize, ncclResult_t> {
    let es = dtype_size(c.dtype).unwrap_or(1);
    elems.checked_mul(es).ok_or_else(|| {
        fail(
            c.func,
            c.comm,
            ncclInvalidArgument,
            format!("count {elems} overflows"),
        )
    })
}

/// The calls strata has no single call for: PreMulSum reductions, Reduce, Gather,
/// Scatter.
///
/// # Safety
/// As [`execute`].
unsafe fn composed(c: &Call) -> ncclResult_t {
    match (|| -> Result<ncclResult_t, ncclResult_t> {
        let st = null_mut();
        let comm = sc(c.comm);
        match c.kind {
            Kind::AllReduce | Kind::ReduceScatter | Kind::Reduce => {
                let (rank, n) = if c.kind == Kind::AllReduce {
                    (0, 1)
                } else {
                    rank_size(c)?
                };
                if c.kind == Kind::Reduce {
                    check_root(c, n)?;
                }
                // The input, scaled into scratch for PreMulSum.
                let in_elems = if c.kind == Kind::ReduceScatter {
                    c.count.checked_mul(n as usize).ok_or_else(|| {
                        fail(c.func, c.comm, ncclInvalidArgument, "count overflows")
                    })?
                } else {
                    c.count
                };
                let mut scaled = None;
                let (mut src, mut op) = (c.send, c.op);
                if c.op >= ncclNumOps {
                    let k = crate::redop::scalar_of(c.op, c.dtype, c.comm)
                        .map_err(|m| fail(c.func, c.comm, ncclInvalidArgument, m))?;
                    let bytes = bytes_of(c, in_elems)?;
                    if in_elems > 0 && c.send.is_null() {
                        return Err(fail(
                            c.func,
                            c.comm,
                            ncclInvalidArgument,
                            "sendbuff is NULL",
                        ));
                    }
                    let mut buf = crate::scratch::take(bytes);
                    // SAFETY: `send` readable for `in_elems` (the caller's contract);
                    // `buf` holds `bytes`, 8-byte aligned, and is ours.
                    unsafe {
                        crate::redop::scale(c.send, buf.as_mut_ptr().cast(), in_elems, c.dtype, k)
                    };
                    src = buf.as_ptr().cast();
                    op = ncclSum;
                    scaled = Some(buf);
                }
                // SAFETY: strata's calls of the same contract; `src` is the user's or
                // our scratch of the input's size.
                let r = unsafe {
                    match c.kind {
                        Kind::AllReduce => {
                            s::strataAllReduce(src, c.recv, c.count, c.dtype, op, comm, st)
                        }
                        Kind::ReduceScatter => {
                            s::strataReduceScatter(src, c.recv, c.count, c.dtype, op, comm, st)
                        }
                        _ if rank == c.root => {
                            s::strataAllReduce(src, c.recv, c.count, c.dtype, op, comm, st)
                        }
                        _ => match &mut scaled {
                            // Off the root: reduce in place in the scratch.
                            Some(b) => s::strataAllReduce(
                                src,
                                b.as_mut_ptr().cast(),
                                c.count,
                                c.dtype,
                                op,
                                comm,
                                st,
                            ),
                            None => {
                                let mut tmp = crate::scratch::take(bytes_of(c, c.count)?);
                                let r = s::strataAllReduce(
                                    src,
                                    tmp.as_mut_ptr().cast(),
                                    c.count,
                                    c.dtype,
                                    op,
                                    comm,
                                    st,
                                );
                                crate::scratch::give(tmp);
                                r
                            }
                        },
                    }
                };
                if let Some(b) = scaled {
                    crate::scratch::give(b);
                }
                Ok(strata_result(c.func, c.comm, r))
            }
            Kind::Gather | Kind::Scatter => {
                let (rank, n) = rank_size(c)?;
                check_root(c, n)?;
                if c.count == 0 {
                    return Ok(ncclSuccess);
                }
                let blk = bytes_of(c, c.count)?;
                let gather = c.kind == Kind::Gather;
                // The root's block of the rank-major buffer, and whether the other
                // buffer is it (in place: the root's own block does not move).
                let (big, small) = if gather {
                    (c.recv as usize, c.send as usize)
                } else {
                    (c.send as usize, c.recv as usize)
                };
                let in_place =
                    rank == c.root && big.checked_add(c.root as usize * blk) == Some(small);
                if rank == c.root && big == 0 {
                    let which = if gather { "recvbuff" } else { "sendbuff" };
                    return Err(fail(
                        c.func,
                        c.comm,
                        ncclInvalidArgument,
                        format!("{which} is NULL on the root"),
                    ));
                }
                // SAFETY: opens a (nested) strata group on this thread.
                unsafe { s::strataGroupStart() };
                let mut first = ncclSuccess;
                let mut note = |r: i32| {
                    if first == ncclSuccess && r != ncclSuccess {
                        first = r;
                    }
                };
                // SAFETY: block i of the root's buffer is `blk` bytes at `big + i*blk`
                // within its `n * count` elements; the other buffer is `count`
                // elements (the caller's contract).
                unsafe {
                    if rank == c.root {
                        for i in 0..n {
                            if i == c.root && in_place {
                                continue;
                            }
                            let p = (big + i as usize * blk) as *mut c_void;
                            note(if gather {
                                s::strataRecv(p, c.count, c.dtype, i, comm, st)
                            } else {
                                s::strataSend(p, c.count, c.dtype, i, comm, st)
                            });
                        }
                    }
                    if !in_place {
                        note(if gather {
                            s::strataSend(c.send, c.count, c.dtype, c.root, comm, st)
                        } else {
                            s::strataRecv(c.recv, c.count, c.dtype, c.root, comm, st)
                        });
                    }
                }
                let r = strata_result(c.func, c.comm, first);
                // SAFETY: closes the group opened above.
                let e = strata_result(c.func, c.comm, unsafe { s::strataGroupEnd() });
                Ok(if r != ncclSuccess { r } else { e })
            }
            _ => Err(fail(
                c.func,
                c.comm,
                ncclInternalError,
                "not a composed call",
            )),
        }
    })() {
        Ok(r) | Err(r) => r,
    }
}

fn call(
    func: &'static str,
    kind: Kind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
) -> Call {
    Call {
        func,
        kind,
        send,
        recv,
        count,
        dtype,
        op,
        root,
        comm,
    }
}

/// Defines a collective export (plain or `*Config`): with the real library, the real
/// call (held by a diverted group, `join.rs`), or for the collectives named with `join`
/// on a joined communicator the route's choice ([`crate::join::collective`]); else the
/// [`Call`] its arguments make, submitted.
macro_rules! export {
    ($(#[$doc:meta])* $name:ident, $real:literal, ($($a:ident : $t:ty),*), $call:expr) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> ncclResult_t {
            if !crate::real::cpu_device() {
                return crate::join::hold_or_run(move || pass!($real, ($($a: $t),*)));
            }
            $call
        }
    };
    ($(#[$doc:meta])* $name:ident, $real:literal, join $r:ident => $gpu:expr, ($($a:ident : $t:ty),*), $call:expr) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> ncclResult_t {
            if !crate::real::cpu_device() {
                let $r = move || pass!($real, ($($a: $t),*));
                // SAFETY: the caller's NCCL contract for this call, passed on unchanged.
                return unsafe { $gpu };
            }
            $call
        }
    };
}

export!(
    /// NCCL's `ncclAllGather` (see the module doc).
    ///
    /// # Safety
    /// As NCCL's, with host pointers on strata's CPU device.
    ncclAllGather, "AllGather", join real => crate::join::collective("ncclAllGather", With::AllGather, sendbuff, recvbuff, sendcount, datatype, comm, stream, real),
    (sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t),
    { let _ = stream; submit(call("ncclAllGather", Kind::AllGather, sendbuff, recvbuff, sendcount, datatype, 0, 0, comm)) }
);
export!(
    /// NCCL's `ncclReduceScatter` (see the module doc).
    ///
    /// # Safety
    /// As NCCL's, with host pointers on strata's CPU device.
    ncclReduceScatter, "ReduceScatter", join real => crate::join::collective("ncclReduceScatter", With::ReduceScatter(op), sendbuff, recvbuff, recvcount, datatype, comm, stream, real),
    (sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t),
    { let _ = stream; submit(call("ncclReduceScatter", Kind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm)) }
);
export!(
    /// NCCL's `ncclAllReduce` (see the module doc).
    ///
    /// # Safety
    /// As NCCL's, with host pointers on strata's CPU device.
    ncclAllReduce, "AllReduce", join real => crate::join::collective("ncclAllReduce", With::AllReduce(op), sendbuff, recvbuff, count, datatype, comm, stream, real),
    (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t),
    { let _ = stream; submit(call("ncclAllReduce", Kind::AllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm)) }
);
export!(
    /// NCCL's legacy in-place `ncclBcast` (see the module doc).
    ///
    /// # Safety
    /// As NCCL's, with host pointers on strata's CPU device.
    ncclBcast, "Bcast",
    (buff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t),
    { let _ = stream; submit(call("ncclBcast", Kind::Broadcast, buff, buff, count, datatype, 0, root, comm)) }
);
export!(
    /// NCCL's `ncclBroadcast` (see the module doc).
    ///
    /// # Safety
    /// As NCCL's, with host pointers on strata's CPU device.
    ncclBroadcast, "Broadcast",
    (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t),
    { let _ = stream; submit(call("ncclBroadcast", Kind::Broadcast, sendbuff, recvbuff, count, datatype, 0, root, comm)) }
);
export!(
    /// NCCL's `ncclReduce` (see the module doc).
    ///
    /// # Safety
    /// As NCCL's, with host pointers on strata's CPU device.
    ncclReduce, "Reduce",
    (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t),
    { let _ = stream; submit(call("ncclReduce", Kind::Reduce, sendbuff, recvbuff, count, datatype, op, root, comm)) }
);
export!(
    /// NCCL's `ncclAlltoAll` (see the module doc).
    ///
    /// # Safety
    /// As NCCL's, with host pointers on strata's CPU device.
    ncclAlltoAll, "AlltoAll",
    (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t),
    { let _ = stream; submit(call("ncclAlltoAll", Kind::AlltoAll, sendbuff, recvbuff, count, datatype, 0, 0, comm)) }
);
export!(
    /// NCCL's `ncclGather` (see the module doc).
    ///
    /// # Safety
    /// As NCCL's, with host pointers on strata's CPU device.
    ncclGather, "Gather",
    (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t),
    { let _ = stream; submit(call("ncclGather", Kind::Gather, sendbuff, recvbuff, count, datatype, 0, root, comm)) }
);
export!(
    /// NCCL's `ncclScatter` (see the module doc).
    ///
    /// # Safety
    /// As NCCL's, with host pointers on strata's CPU device.
    ncclScatter, "Scatter",
    (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t),
    { let _ = stream; submit(call("ncclScatter", Kind::Scatter, sendbuff, recvbuff, count, datatype, 0, root, comm)) }
);
export!(
    /// NCCL's `ncclSend` (see the module doc).
    ///
    /// # Safety
    /// As NCCL's, with host pointers on strata's CPU device.
    ncclSend, "Send",
    (sendbuff: *const c_void, count: usize, datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t),
    { let _ = stream; submit(call("ncclSend", Kind::Send, sendbuff, null_mut(), count, datatype, 0, peer, comm)) }
);
export!(
    /// NCCL's `ncclRecv` (see the module doc).
    ///
    /// # Safety
    /// As NCCL's, with host pointers on strata's CPU device.
    ncclRecv, "Recv",
    (recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t),
    { let _ = stream; submit(call("ncclRecv", Kind::Recv, std::ptr::null(), recvbuff, count, datatype, 0, peer, comm)) }
);

export!(
    /// NCCL's `ncclAllGatherConfig`: `ncclAllGather` with a per-call config (module doc).
    ///
    /// # Safety
    /// As NCCL's; `config` NULL or initialised.
    ncclAllGatherConfig, "AllGatherConfig", join real => crate::join::collective("ncclAllGatherConfig", With::AllGather, sendbuff, recvbuff, sendcount, datatype, comm, stream, real),
    (sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t),
    { let _ = stream; unsafe { submit_cfg(call("ncclAllGatherConfig", Kind::AllGather, sendbuff, recvbuff, sendcount, datatype, 0, 0, comm), config) } }
);
export!(
    /// NCCL's `ncclReduceScatterConfig` (module doc).
    ///
    /// # Safety
    /// As NCCL's; `config` NULL or initialised.
    ncclReduceScatterConfig, "ReduceScatterConfig", join real => crate::join::collective("ncclReduceScatterConfig", With::ReduceScatter(op), sendbuff, recvbuff, recvcount, datatype, comm, stream, real),
    (sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t),
    { let _ = stream; unsafe { submit_cfg(call("ncclReduceScatterConfig", Kind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm), config) } }
);
export!(
    /// NCCL's `ncclAllReduceConfig` (module doc).
    ///
    /// # Safety
    /// As NCCL's; `config` NULL or initialised.
    ncclAllReduceConfig, "AllReduceConfig", join real => crate::join::collective("ncclAllReduceConfig", With::AllReduce(op), sendbuff, recvbuff, count, datatype, comm, stream, real),
    (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t),
    { let _ = stream; unsafe { submit_cfg(call("ncclAllReduceConfig", Kind::AllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm), config) } }
);
export!(
    /// NCCL's `ncclBroadcastConfig` (module doc).
    ///
    /// # Safety
    /// As NCCL's; `config` NULL or initialised.
    ncclBroadcastConfig, "BroadcastConfig",
    (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t),
    { let _ = stream; unsafe { submit_cfg(call("ncclBroadcastConfig", Kind::Broadcast, sendbuff, recvbuff, count, datatype, 0, root, comm), config) } }
);
export!(
    /// NCCL's `ncclReduceConfig` (module doc).
    ///
    /// # Safety
    /// As NCCL's; `config` NULL or initialised.
    ncclReduceConfig, "ReduceConfig",
    (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t),
    { let _ = stream; unsafe { submit_cfg(call("ncclReduceConfig", Kind::Reduce, sendbuff, recvbuff, count, datatype, op, root, comm), config) } }
);
export!(
    /// NCCL's `ncclAlltoAllConfig` (module doc).
    ///
    /// # Safety
    /// As NCCL's; `config` NULL or initialised.
    ncclAlltoAllConfig, "AlltoAllConfig",
    (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t),
    { let _ = stream; unsafe { submit_cfg(call("ncclAlltoAllConfig", Kind::AlltoAll, sendbuff, recvbuff, count, datatype, 0, 0, comm), config) } }
);
export!(
    /// NCCL's `ncclGatherConfig` (module doc).
    ///
    /// # Safety
    /// As NCCL's; `config` NULL or initialised.
    ncclGatherConfig, "GatherConfig",
    (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t),
    { let _ = stream; unsafe { submit_cfg(call("ncclGatherConfig", Kind::Gather, sendbuff, recvbuff, count, datatype, 0, root, comm), config) } }
);
export!(
    /// NCCL's `ncclScatterConfig` (module doc).
    ///
    /// # Safety
    /// As NCCL's; `config` NULL or initialised.
    ncclScatterConfig, "ScatterConfig",
    (sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t),
    { let _ = stream; unsafe { submit_cfg(call("ncclScatterConfig", Kind::Scatter, sendbuff, recvbuff, count, datatype, 0, root, comm), config) } }
);
