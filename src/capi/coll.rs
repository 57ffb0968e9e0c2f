//! The C entry points of the collectives, point-to-point calls and groups, as a table:
//! each export is its C signature and one line naming its collective ([`Coll`]) for the
//! one body every collective goes through ([`super::enqueue`], NCCL's
//! `ncclEnqueueCheck`), over host memory (host transports) and device memory (GPU
//! transports) alike. The docs here are the C header's (`include/strata.h`).
//!
//! One signature a line, one body a line (`#[rustfmt::skip]` on this module, as NCCL
//! writes its `NCCL_API` table): a new collective is one export here plus its arm in
//! [`Coll`]. On GPU transports a call is stream-ordered on the caller's stream; on a
//! strata host stream it is enqueued and returns; otherwise outside a group it waits,
//! inside a group its work is held for `strataGroupEnd`.

use super::abi::*;
use super::boundary::ffi_boundary;
use super::buffers::end_group;
use super::enqueue::{enqueue, enqueue_lists, Args, Coll, Hint, Lists};
use crate::comm::in_group;
use crate::comm::{group_end, group_start};
use std::ffi::{c_int, c_void};
use std::ptr::{null, null_mut};

// ---- collectives ----

/// All-gather (NCCL's `ncclAllGather`): `recvbuff` (`nranks * sendcount` elements) receives
/// every rank's `sendbuff` (`sendcount` elements), rank-major.
///
/// In place when `sendbuff == recvbuff + rank * sendcount` (in elements); any other overlap
/// of the two ranges is `strataInvalidArgument`. `sendcount == 0` is a no-op (NULL buffers
/// allowed).
///
/// Host transports (local, mpi): the buffers are host memory, read and written in place
/// (no copies). Blocking, unless `stream` is a strata host stream (`strataStreamCreate`):
/// then the call is enqueued after that stream's earlier calls and returns at once, and
/// the buffers belong to strata until its completion is observed
/// (`strataStreamSynchronize`, `strataStreamQuery`, an event). Any other `stream` value is
/// ignored (may be NULL). Inside a group the call returns at once and both buffers are
/// used until `strataGroupEnd` returns (keep them valid and untouched until then).
/// strata keeps no pointer after the call (the group, the stream's synchronize) ends.
///
/// GPU transports (nccl, rccl, cuda-local): the buffers are device memory of the
/// communicator's device (anything else, a host pointer included, is
/// `strataInvalidArgument`), used in place without copies; `stream` is the caller's
/// `cudaStream_t` / `hipStream_t` on that device (NULL: the legacy default stream).
/// Stream-ordered, as NCCL: the collective runs after the work queued on `stream` before
/// the call and before the work queued on it after the call, and the call returns
/// without waiting for the device (inside a group: the group runs at `strataGroupEnd`,
/// which does not wait either; `stream` must stay alive until then). The buffers belong
/// to strata until `stream` has passed the call (`cudaStreamSynchronize`, an event): keep
/// them allocated and untouched until then. Failures after the call are reported by
/// `strataCommGetAsyncError` and release `stream` all the same. On a stream being captured
/// into a CUDA/HIP graph the call is recorded into the graph (run each call shape once
/// uncaptured first; docs/gpu.md, "Graph capture"). host-local: buffers from `strataMemAlloc`,
/// driven as on a host transport (blocking, or on a strata host stream).
///
/// Thread-safety: one thread at a time per communicator.
///
/// Errors: `strataInvalidArgument` for a NULL/foreign comm, NULL buffers with a nonzero
/// count, `nranks * sendcount * size` overflow, an unknown datatype, aliasing buffers,
/// pointers that are not the communicator's device memory (GPU transports);
/// `strataInvalidUsage` for a destroyed comm; `strataRemoteError` when a peer fails or
/// times out; `strataUnhandledCudaError` when a device call fails.
///
/// # Safety
/// `sendbuff` readable for `sendcount` elements, `recvbuff` writable for
/// `nranks * sendcount` elements, both host memory (host transports) or device memory of
/// the communicator's device (GPU transports), neither accessed by other threads or
/// other streams during the call (or the group). On GPU transports `stream` is NULL or a
/// live stream of the communicator's device.
#[no_mangle]
pub unsafe extern "C" fn strataAllGather(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: strataDataType_t, comm: strataComm_t, stream: strataStream_t) -> strataResult_t {
    // SAFETY: forwarded caller contract.
    unsafe { enqueue("strataAllGather", Coll::AllGather, Hint::Model, Args(sendbuff, recvbuff, sendcount, datatype, comm, stream)) }
}

/// Quantized all-gather (ZeRO++ qwZ, `docs/quantization.md`): as `strataAllGather`, but
/// every rank's `sendbuff` travels block-quantized to `bits` (4 or 8) with one f32 scale
/// per `block` elements, and is dequantized into `recvbuff` (f32, f16 or bf16). Each
/// element is within the format's bound (half a quantization step of its block) of the
/// exact value. In place when `sendbuff == recvbuff + rank * sendcount`.
///
/// Errors: as `strataAllGather`, plus `strataInvalidArgument` for bits other than 4/8,
/// a block of 0 or above 2^20 or odd with 4 bits, and integer datatypes.
///
/// # Safety
/// As `strataAllGather`.
#[no_mangle]
pub unsafe extern "C" fn strataAllGatherQuantized(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: strataDataType_t, bits: c_int, block: usize, comm: strataComm_t, stream: strataStream_t) -> strataResult_t {
    // SAFETY: forwarded caller contract.
    unsafe { enqueue("strataAllGatherQuantized", Coll::AllGather, Hint::Quant(bits, block), Args(sendbuff, recvbuff, sendcount, datatype, comm, stream)) }
}

/// Quantized reduce-scatter (ZeRO++ qgZ, 2-hop all-to-all: intra-node then inter-node,
/// with fused dequantize-reduce-quantize in between; `docs/quantization.md`): as
/// `strataReduceScatter` with `op` = `strataSum` or `strataAvg` (the exact mean over all
/// ranks), the gradients travel block-quantized to `bits` (4 or 8) with one f32 scale
/// per `block` elements. Results are within the format's bound of the exact reduction.
///
/// Errors: as `strataReduceScatter`, plus `strataInvalidArgument` for bits other than
/// 4/8, a bad block, integer datatypes, and ops other than sum/avg.
///
/// # Safety
/// As `strataReduceScatter`.
#[no_mangle]
pub unsafe extern "C" fn strataReduceScatterQuantized(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: strataDataType_t, op: strataRedOp_t, bits: c_int, block: usize, comm: strataComm_t, stream: strataStream_t) -> strataResult_t {
    // SAFETY: forwarded caller contract.
    unsafe { enqueue("strataReduceScatterQuantized", Coll::ReduceScatter(op), Hint::Quant(bits, block), Args(sendbuff, recvbuff, recvcount, datatype, comm, stream)) }
}

/// Reduce-scatter (NCCL's `ncclReduceScatter`): `recvbuff` (`recvcount` elements) =
/// `op` over all ranks of their `sendbuff[rank * recvcount ..]` (`sendbuff` holds
/// `nranks * recvcount` elements). `strataAvg` is the exact mean.
///
/// In place when `recvbuff == sendbuff + rank * recvcount` (in elements); any other
/// overlap is `strataInvalidArgument`. Only `recvbuff`'s range is written. Blocking,
/// streams, groups, ownership and thread-safety as `strataAllGather`.
///
/// Errors: as `strataAllGather`, plus an unknown reduction op (`strataInvalidArgument`).
///
/// # Safety
/// `sendbuff` readable for `nranks * recvcount` elements, `recvbuff` writable for
/// `recvcount`, both host or device memory as in `strataAllGather`, not accessed by others
/// during the call; `stream` as in `strataAllGather`.
#[no_mangle]
pub unsafe extern "C" fn strataReduceScatter(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: strataDataType_t, op: strataRedOp_t, comm: strataComm_t, stream: strataStream_t) -> strataResult_t {
    // SAFETY: forwarded caller contract.
    unsafe { enqueue("strataReduceScatter", Coll::ReduceScatter(op), Hint::Model, Args(sendbuff, recvbuff, recvcount, datatype, comm, stream)) }
}

/// All-reduce (NCCL's `ncclAllReduce`): `recvbuff` (`count` elements) = `op` over all
/// ranks' `sendbuff` (`count` elements). In place when `sendbuff == recvbuff`; any other
/// overlap is `strataInvalidArgument`. Blocking, streams, groups, ownership,
/// thread-safety and errors as `strataReduceScatter`.
///
/// # Safety
/// `sendbuff` readable and `recvbuff` writable for `count` elements of host or device
/// memory as in `strataAllGather`, not accessed by others during the call; `stream` as
/// in `strataAllGather`.
#[no_mangle]
pub unsafe extern "C" fn strataAllReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: strataDataType_t, op: strataRedOp_t, comm: strataComm_t, stream: strataStream_t) -> strataResult_t {
    // SAFETY: forwarded caller contract.
    unsafe { enqueue("strataAllReduce", Coll::AllReduce(op), Hint::Model, Args(sendbuff, recvbuff, count, datatype, comm, stream)) }
}

/// All-to-all (NCCL's `ncclAlltoAll`): block j (`count` elements) of `sendbuff` goes to
/// rank j; block i of `recvbuff` comes from rank i (both `nranks * count` elements). No
/// in-place form: the buffers must not overlap. Blocking, streams, groups, ownership,
/// thread-safety and errors as `strataAllGather`.
///
/// # Safety
/// `sendbuff` readable and `recvbuff` writable for `nranks * count` elements of host
/// memory, not accessed by other threads during the call.
#[no_mangle]
pub unsafe extern "C" fn strataAllToAll(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: strataDataType_t, comm: strataComm_t, stream: strataStream_t) -> strataResult_t {
    // SAFETY: forwarded caller contract.
    unsafe { enqueue("strataAllToAll", Coll::AllToAll, Hint::Model, Args(sendbuff, recvbuff, count, datatype, comm, stream)) }
}

/// Broadcast (NCCL's `ncclBroadcast`): `recvbuff` (`count` elements) on every rank =
/// `sendbuff` of rank `root`. `sendbuff` is read on the root only (may be NULL
/// elsewhere). In place when `sendbuff == recvbuff` on the root; any other overlap there
/// is `strataInvalidArgument`. Blocking, streams, groups, ownership, thread-safety and
/// errors as `strataAllGather`, plus `root` outside `0..nranks` (`strataInvalidArgument`).
///
/// # Safety
/// On the root `sendbuff` readable for `count` elements; `recvbuff` writable for `count`
/// elements; host or device memory as in `strataAllGather`, not accessed by others during
/// the call; `stream` as in `strataAllGather`.
#[no_mangle]
pub unsafe extern "C" fn strataBroadcast(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: strataDataType_t, root: c_int, comm: strataComm_t, stream: strataStream_t) -> strataResult_t {
    // SAFETY: forwarded caller contract.
    unsafe { enqueue("strataBroadcast", Coll::Broadcast(root), Hint::Model, Args(sendbuff, recvbuff, count, datatype, comm, stream)) }
}

/// In-place broadcast (NCCL's legacy `ncclBcast`): `strataBroadcast(buff, buff, ...)`.
///
/// # Safety
/// `buff` readable (root) and writable for `count` elements of host or device memory as
/// in `strataAllGather`; `stream` as in `strataAllGather`.
#[no_mangle]
pub unsafe extern "C" fn strataBcast(buff: *mut c_void, count: usize, datatype: strataDataType_t, root: c_int, comm: strataComm_t, stream: strataStream_t) -> strataResult_t {
    // SAFETY: the caller's contract is strataBroadcast's with both buffers `buff`.
    unsafe { strataBroadcast(buff, buff, count, datatype, root, comm, stream) }
}

/// Sends `count` elements of `sendbuff` to rank `peer` (NCCL's `ncclSend`); the peer
/// posts a matching `strataRecv`. Outside a group, on `local` a send returns once its
/// bytes are handed over; on `mpi` one past MPI's eager limit returns once the peer has
/// received it. Put matching sends and receives of several peers in one group (as with
/// NCCL): they are then in flight together, so any exchange pattern of any size
/// completes. `sendbuff` is read during the call. GPU transports: stream-ordered, as
/// the collectives (pair sends and receives in a group, as with NCCL; a send to itself
/// outside a group, which NCCL refuses, strata holds until the receive from itself).
/// Memory, streams, ownership and thread-safety as `strataAllGather`.
///
/// Errors: `strataInvalidArgument` for a NULL/foreign comm, a NULL buffer with a nonzero
/// count, overflow, an unknown datatype, `peer` outside `0..nranks`; `strataInvalidUsage`
/// for a destroyed comm or a count that differs from the receiver's;
/// `strataRemoteError` when the peer fails or times out.
///
/// # Safety
/// `sendbuff` readable for `count` elements of host or device memory as in
/// `strataAllGather`; `stream` as in `strataAllGather`.
#[no_mangle]
pub unsafe extern "C" fn strataSend(sendbuff: *const c_void, count: usize, datatype: strataDataType_t, peer: c_int, comm: strataComm_t, stream: strataStream_t) -> strataResult_t {
    // SAFETY: forwarded caller contract.
    unsafe { enqueue("strataSend", Coll::Send(peer), Hint::Model, Args(sendbuff, null_mut(), count, datatype, comm, stream)) }
}

/// Receives `count` elements from rank `peer` into `recvbuff` (NCCL's `ncclRecv`).
/// Blocking outside a group; inside one, `recvbuff` is written by `strataGroupEnd`.
/// Streams, ownership, thread-safety and errors as `strataSend`.
///
/// # Safety
/// `recvbuff` writable for `count` elements of host or device memory as in
/// `strataAllGather`, not accessed by others until the call (or the group) ends;
/// `stream` as in `strataAllGather`.
#[no_mangle]
pub unsafe extern "C" fn strataRecv(recvbuff: *mut c_void, count: usize, datatype: strataDataType_t, peer: c_int, comm: strataComm_t, stream: strataStream_t) -> strataResult_t {
    // SAFETY: forwarded caller contract.
    unsafe { enqueue("strataRecv", Coll::Recv(peer), Hint::Model, Args(null(), recvbuff, count, datatype, comm, stream)) }
}
/// Coalesced all-gather (MiCS §4): for every i < `nbuffers`, `recvbuffs[i]`
/// (`nranks * sendcounts[i]` elements) gathers every rank's `sendbuffs[i]`
/// (`sendcounts[i]` elements), all packed into one collective. Counts may differ between
/// buffers (not between ranks). Each pair may be in place as in `strataAllGather`; no
/// other byte of any buffer may be written by one entry and touched by another
/// (`strataInvalidArgument`). Entries with count 0 are skipped (NULL allowed). The three
/// arrays are read during the call only. Blocking, streams, groups, ownership,
/// thread-safety and errors as `strataAllGather`.
///
/// # Safety
/// The arrays are readable for `nbuffers` entries; each buffer as in `strataAllGather`.
#[no_mangle]
pub unsafe extern "C" fn strataAllGatherCoalesced(
    sendbuffs: *const *const c_void,
    recvbuffs: *const *mut c_void,
    sendcounts: *const usize,
    nbuffers: usize,
    datatype: strataDataType_t,
    comm: strataComm_t,
    stream: strataStream_t,
) -> strataResult_t {
    // SAFETY: forwarded caller contract.
    unsafe { enqueue_lists("strataAllGatherCoalesced", Coll::AllGather, Lists(sendbuffs, recvbuffs, sendcounts, nbuffers), Args(null(), null_mut(), nbuffers, datatype, comm, stream)) }
}

/// Coalesced reduce-scatter (MiCS §4): for every i < `nbuffers`, `recvbuffs[i]`
/// (`recvcounts[i]` elements) = `op` over all ranks of their
/// `sendbuffs[i][rank * recvcounts[i] ..]`, all packed into one collective. In-place
/// pairs as in `strataReduceScatter`; other rules as `strataAllGatherCoalesced`.
///
/// # Safety
/// The arrays are readable for `nbuffers` entries; each buffer as in
/// `strataReduceScatter`.
#[no_mangle]
pub unsafe extern "C" fn strataReduceScatterCoalesced(sendbuffs: *const *const c_void, recvbuffs: *const *mut c_void, recvcounts: *const usize, nbuffers: usize, datatype: strataDataType_t, op: strataRedOp_t, comm: strataComm_t, stream: strataStream_t) -> strataResult_t {
    // SAFETY: forwarded caller contract.
    unsafe { enqueue_lists("strataReduceScatterCoalesced", Coll::ReduceScatter(op), Lists(sendbuffs, recvbuffs, recvcounts, nbuffers), Args(null(), null_mut(), nbuffers, datatype, comm, stream)) }
}

// ---- groups ----

/// Starts (or nests) a group on this thread (NCCL's `ncclGroupStart`): until the
/// matching outermost `strataGroupEnd`, calls on any communicator return at once and are
/// launched together, one launch per communicator. This lets one thread drive several
/// ranks of a local world, and pairs sends with receives: a group's collectives run in
/// call order, then its sends and receives all together (any pattern, any size, on every
/// transport; never crossing the collectives' messages). Groups are per thread.
///
/// # Safety
/// None.
#[no_mangle]
pub unsafe extern "C" fn strataGroupStart() -> strataResult_t {
    ffi_boundary!("strataGroupStart", std::ptr::null_mut(), {
        group_start();
        Ok(())
    })
}

/// Ends a group (NCCL's `ncclGroupEnd`). At the outermost end it launches the group's
/// calls and waits for all of them (except calls made on a strata host stream, which
/// complete on their stream): their results are in place in the user buffers when this
/// returns, so the buffers of every call in the group must stay valid, and untouched by
/// other threads and streams, until then. Returns the first failure (each failing
/// communicator also records its own message).
///
/// Errors: `strataInvalidUsage` without a matching `strataGroupStart`; otherwise the
/// first error of the grouped calls.
///
/// # Safety
/// The buffers of the grouped calls are still valid (see above).
#[no_mangle]
pub unsafe extern "C" fn strataGroupEnd() -> strataResult_t {
    ffi_boundary!("strataGroupEnd", std::ptr::null_mut(), {
        group_end()?;
        if in_group() {
            return Ok(());
        }
        // SAFETY: the grouped calls' contract: their buffers are valid until now.
        unsafe { end_group() }
    })
}
