//! Collectives, point-to-point and groups over host memory (host transports) and
//! device memory (GPU transports), each export with ONE body for both:
//!
//! 1. check the communicator, dtype, op, ranks and sizes, and describe the user ranges
//!    ([`UserBuf`]); recognise NCCL's in-place layout from the raw pointers with the one
//!    rule, [`Kind::in_place`] ([`Pair`]), else require disjoint byte ranges
//!    ([`disjoint`], across the whole list for the coalesced calls);
//! 2. turn the ranges into strata buffers ([`CallBuffers`]) used in place, no copies:
//!    the host memory itself on host transports, checked wraps of the device pointers
//!    on GPU transports; an in-place pair is one buffer and a view of it on both;
//! 3. hand the call's one checked request to the communicator and finish
//!    ([`CallBuffers::run`]): the checks of steps 1-2 are the call's only ones (the
//!    request goes through [`Comm::submit`](crate::comm::Comm::submit) /
//!    `call` / `enqueue_on` as a [`Checked`](crate::runtime::request::Checked) request,
//!    which their check returns at once), and the in-place layout recognised in step 1
//!    is the one the transport follows. On GPU transports the call is stream-ordered on
//!    the caller's stream; on a strata host stream enqueue and return; otherwise outside
//!    a group wait, inside a group hold the work for `strataGroupEnd`.

use super::buffers::{disjoint, end_group, CallBuffers, Pair, UserBuf};
use super::*;
use crate::comm::in_group;
use crate::comm::{group_end, group_start};
use crate::comm::{Op, Request};
use crate::dtype::{DataType, ReduceOp};
use crate::kinds::{Algo, Kind};
use crate::memory::Buffer;

// ---- argument helpers ----

fn dtype(v: strataDataType_t) -> Result<DataType> {
    DataType::from_raw(v).map_err(|_| {
        Error::InvalidArgument(format!(
            "datatype {v} is not supported (strataInt8 0 to strataBfloat16 9: int8, uint8, int32, uint32, int64, uint64, float16, float32, float64, bfloat16)"
        ))
    })
}

fn redop(v: strataRedOp_t) -> Result<ReduceOp> {
    ReduceOp::from_raw(v).map_err(|_| {
        Error::InvalidArgument(format!(
            "reduction op {v} is not supported (strataSum 0, strataProd 1, strataMax 2, strataMin 3, strataAvg 4)"
        ))
    })
}

/// `count * mult` elements of `dt` in bytes, checked against overflow and `isize::MAX`.
fn nbytes(count: usize, mult: usize, dt: DataType, what: &str) -> Result<usize> {
    count
        .checked_mul(mult)
        .and_then(|n| n.checked_mul(dt.size()))
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{what}: {count} x {mult} elements of {dt} overflow the address space"
            ))
        })
}

fn peer_arg(v: c_int, size: usize, what: &str) -> Result<usize> {
    if v < 0 || v as usize >= size {
        return Err(Error::InvalidArgument(format!(
            "{what} {v} is out of range for a communicator of {size} ranks"
        )));
    }
    Ok(v as usize)
}

/// A validated quantization format for float data.
fn quant_spec(bits: c_int, block: usize, dt: DataType) -> Result<crate::kernels::QuantSpec> {
    if !matches!(dt, DataType::F32 | DataType::F16 | DataType::BF16) {
        return Err(Error::InvalidArgument(format!(
            "quantized collectives take f32, f16 or bf16, not {dt}"
        )));
    }
    let bits = u32::try_from(bits)
        .map_err(|_| Error::InvalidArgument(format!("bits {bits} must be 4 or 8")))?;
    crate::kernels::QuantSpec::new(bits, block)
}

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
pub unsafe extern "C" fn strataAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: strataDataType_t,
    comm: strataComm_t,
    stream: strataStream_t,
) -> strataResult_t {
    // SAFETY: forwarded caller contract.
    ffi_boundary!("strataAllGather", comm, {
        unsafe {
            all_gather(
                "strataAllGather",
                sendbuff,
                recvbuff,
                sendcount,
                datatype,
                None,
                comm,
                stream,
            )
        }
    })
}

/// The one body of `strataAllGather` and `strataAllGatherQuantized` (`quant`: bits,
/// block), host and device alike.
///
/// # Safety
/// As `strataAllGather`.
unsafe fn all_gather(
    name: &'static str,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: strataDataType_t,
    quant: Option<(c_int, usize)>,
    comm: strataComm_t,
    stream: strataStream_t,
) -> Result<()> {
    let h = lookup(comm)?;
    let dt = dtype(datatype)?;
    let q = quant.map(|(b, k)| quant_spec(b, k, dt)).transpose()?;
    let (n, r) = (h.comm.size(), h.comm.rank());
    let c = nbytes(sendcount, 1, dt, "sendcount")?;
    let total = nbytes(sendcount, n, dt, "sendcount x nranks")?;
    let pair = Pair::new(
        Kind::AllGather,
        r,
        c,
        UserBuf::new(sendbuff, c, false, "sendbuff")?,
        UserBuf::new(recvbuff, total, true, "recvbuff")?,
    );
    if sendcount == 0 {
        return Ok(());
    }
    let mut bufs = CallBuffers::new(&h.comm);
    // SAFETY: the caller's contract: `sendbuff` readable for `c` bytes, `recvbuff`
    // writable for `total`, memory of the transport's kind, untouched by others until the
    // call (or group) ends.
    let (send, recv) = unsafe { bufs.checked_pair(&pair, name) }?;
    let req = Request::new(
        Op::AllGather {
            send,
            recv,
            count: sendcount,
        },
        dt,
    );
    let req = match q {
        Some(q) => req.with_algo(Algo::Qwz).with_quant(q),
        None => req,
    };
    // SAFETY: the caller's contract on `stream` and the buffers.
    unsafe { bufs.run(name, h, req, stream) }
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
pub unsafe extern "C" fn strataAllGatherQuantized(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: strataDataType_t,
    bits: c_int,
    block: usize,
    comm: strataComm_t,
    stream: strataStream_t,
) -> strataResult_t {
    // SAFETY: forwarded caller contract.
    ffi_boundary!("strataAllGatherQuantized", comm, {
        unsafe {
            all_gather(
                "strataAllGatherQuantized",
                sendbuff,
                recvbuff,
                sendcount,
                datatype,
                Some((bits, block)),
                comm,
                stream,
            )
        }
    })
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
pub unsafe extern "C" fn strataReduceScatterQuantized(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: strataDataType_t,
    op: strataRedOp_t,
    bits: c_int,
    block: usize,
    comm: strataComm_t,
    stream: strataStream_t,
) -> strataResult_t {
    // SAFETY: forwarded caller contract.
    ffi_boundary!("strataReduceScatterQuantized", comm, {
        unsafe {
            reduce_scatter(
                "strataReduceScatterQuantized",
                sendbuff,
                recvbuff,
                recvcount,
                datatype,
                op,
                Some((bits, block)),
                comm,
                stream,
            )
        }
    })
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
pub unsafe extern "C" fn strataReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: strataDataType_t,
    op: strataRedOp_t,
    comm: strataComm_t,
    stream: strataStream_t,
) -> strataResult_t {
    // SAFETY: forwarded caller contract.
    ffi_boundary!("strataReduceScatter", comm, {
        unsafe {
            reduce_scatter(
                "strataReduceScatter",
                sendbuff,
                recvbuff,
                recvcount,
                datatype,
                op,
                None,
                comm,
                stream,
            )
        }
    })
}

/// The one body of `strataReduceScatter` and `strataReduceScatterQuantized`.
///
/// # Safety
/// As `strataReduceScatter`.
unsafe fn reduce_scatter(
    name: &'static str,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: strataDataType_t,
    op: strataRedOp_t,
    quant: Option<(c_int, usize)>,
    comm: strataComm_t,
    stream: strataStream_t,
) -> Result<()> {
    let h = lookup(comm)?;
    let dt = dtype(datatype)?;
    let op = redop(op)?;
    let q = match quant {
        Some(_) if !matches!(op, ReduceOp::Sum | ReduceOp::Avg) => {
            return Err(Error::InvalidArgument(format!(
                "quantized reduce-scatter reduces with sum or avg, not {op}"
            )));
        }
        Some((b, k)) => Some(quant_spec(b, k, dt)?),
        None => None,
    };
    let (n, r) = (h.comm.size(), h.comm.rank());
    let c = nbytes(recvcount, 1, dt, "recvcount")?;
    let total = nbytes(recvcount, n, dt, "recvcount x nranks")?;
    let pair = Pair::new(
        Kind::ReduceScatter,
        r,
        c,
        UserBuf::new(sendbuff, total, false, "sendbuff")?,
        UserBuf::new(recvbuff, c, true, "recvbuff")?,
    );
    if recvcount == 0 {
        return Ok(());
    }
    let mut bufs = CallBuffers::new(&h.comm);
    // SAFETY: the caller's contract: `sendbuff` readable for `total` bytes, `recvbuff`
    // writable for `c`, memory of the transport's kind, untouched by others until the
    // call (or group) ends.
    let (send, recv) = unsafe { bufs.checked_pair(&pair, name) }?;
    let req = Request::new(
        Op::ReduceScatter {
            send,
            recv,
            count: recvcount,
            op,
        },
        dt,
    );
    let req = match q {
        Some(q) => req.with_algo(Algo::Qgz).with_quant(q),
        None => req,
    };
    // SAFETY: the caller's contract on `stream` and the buffers.
    unsafe { bufs.run(name, h, req, stream) }
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
pub unsafe extern "C" fn strataAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: strataDataType_t,
    op: strataRedOp_t,
    comm: strataComm_t,
    stream: strataStream_t,
) -> strataResult_t {
    ffi_boundary!("strataAllReduce", comm, {
        let h = lookup(comm)?;
        let dt = dtype(datatype)?;
        let op = redop(op)?;
        let c = nbytes(count, 1, dt, "count")?;
        let pair = Pair::new(
            Kind::AllReduce,
            h.comm.rank(),
            c,
            UserBuf::new(sendbuff, c, false, "sendbuff")?,
            UserBuf::new(recvbuff, c, true, "recvbuff")?,
        );
        if count == 0 {
            return Ok(());
        }
        let mut bufs = CallBuffers::new(&h.comm);
        // SAFETY: the caller's contract: `c` bytes each, readable / writable, memory of
        // the transport's kind, untouched by others until the call (or group) ends.
        let (send, recv) = unsafe { bufs.checked_pair(&pair, "strataAllReduce") }?;
        let req = Request::new(
            Op::AllReduce {
                send,
                recv,
                count,
                op,
            },
            dt,
        );
        // SAFETY: the caller's contract on `stream` and the buffers.
        unsafe { bufs.run("strataAllReduce", h, req, stream) }
    })
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
pub unsafe extern "C" fn strataAllToAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: strataDataType_t,
    comm: strataComm_t,
    stream: strataStream_t,
) -> strataResult_t {
    ffi_boundary!("strataAllToAll", comm, {
        let h = lookup(comm)?;
        let dt = dtype(datatype)?;
        let total = nbytes(count, h.comm.size(), dt, "count x nranks")?;
        let pair = Pair::new(
            Kind::AllToAll,
            h.comm.rank(),
            total,
            UserBuf::new(sendbuff, total, false, "sendbuff")?,
            UserBuf::new(recvbuff, total, true, "recvbuff")?,
        );
        if count == 0 {
            return Ok(());
        }
        let mut bufs = CallBuffers::new(&h.comm);
        // SAFETY: the caller's contract: `total` bytes each, readable / writable, memory
        // of the transport's kind, untouched by others until the call (or group) ends.
        let (send, recv) = unsafe { bufs.checked_pair(&pair, "strataAllToAll") }?;
        let req = Request::new(Op::AllToAll { send, recv, count }, dt);
        // SAFETY: the caller's contract on `stream` and the buffers.
        unsafe { bufs.run("strataAllToAll", h, req, stream) }
    })
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
pub unsafe extern "C" fn strataBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: strataDataType_t,
    root: c_int,
    comm: strataComm_t,
    stream: strataStream_t,
) -> strataResult_t {
    ffi_boundary!("strataBroadcast", comm, {
        let h = lookup(comm)?;
        let dt = dtype(datatype)?;
        let root = peer_arg(root, h.comm.size(), "root")?;
        let c = nbytes(count, 1, dt, "count")?;
        let recv = UserBuf::new(recvbuff, c, true, "recvbuff")?;
        let rank = h.comm.rank();
        // `sendbuff` is the root's only.
        let pair = if rank == root {
            let send = UserBuf::new(sendbuff, c, false, "sendbuff")?;
            Some(Pair::new(
                Kind::Broadcast { root },
                rank,
                c,
                send,
                recv.clone(),
            ))
        } else {
            None
        };
        if count == 0 {
            return Ok(());
        }
        let mut bufs = CallBuffers::new(&h.comm);
        let (send, recv) = match &pair {
            // SAFETY: the caller's contract: on the root `sendbuff` readable and
            // `recvbuff` writable for `c` bytes, memory of the transport's kind, untouched
            // by others until the call (or group) ends.
            Some(p) => unsafe { bufs.checked_pair(p, "strataBroadcast") }?,
            None => {
                bufs.note_layout(None);
                // SAFETY: as above for `recvbuff`.
                (Buffer::zeroed(0), unsafe { bufs.output(&recv) }?)
            }
        };
        let req = Request::new(
            Op::Broadcast {
                send,
                recv,
                count,
                root,
            },
            dt,
        );
        // SAFETY: the caller's contract on `stream` and the buffers.
        unsafe { bufs.run("strataBroadcast", h, req, stream) }
    })
}

/// In-place broadcast (NCCL's legacy `ncclBcast`): `strataBroadcast(buff, buff, ...)`.
///
/// # Safety
/// `buff` readable (root) and writable for `count` elements of host or device memory as
/// in `strataAllGather`; `stream` as in `strataAllGather`.
#[no_mangle]
pub unsafe extern "C" fn strataBcast(
    buff: *mut c_void,
    count: usize,
    datatype: strataDataType_t,
    root: c_int,
    comm: strataComm_t,
    stream: strataStream_t,
) -> strataResult_t {
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
pub unsafe extern "C" fn strataSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: strataDataType_t,
    peer: c_int,
    comm: strataComm_t,
    stream: strataStream_t,
) -> strataResult_t {
    ffi_boundary!("strataSend", comm, {
        let h = lookup(comm)?;
        let dt = dtype(datatype)?;
        let peer = peer_arg(peer, h.comm.size(), "peer")?;
        let c = nbytes(count, 1, dt, "count")?;
        let user = UserBuf::new(sendbuff, c, false, "sendbuff")?;
        if count == 0 {
            return Ok(());
        }
        let mut bufs = CallBuffers::new(&h.comm);
        // SAFETY: the caller's contract: `sendbuff` readable for `c` bytes of the
        // transport's kind of memory, untouched by others until the call (or group) ends.
        let buf = unsafe { bufs.input(&user) }?;
        let req = Request::new(Op::Send { buf, count, peer }, dt);
        // SAFETY: the caller's contract on `stream` and the buffer.
        unsafe { bufs.run("strataSend", h, req, stream) }
    })
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
pub unsafe extern "C" fn strataRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: strataDataType_t,
    peer: c_int,
    comm: strataComm_t,
    stream: strataStream_t,
) -> strataResult_t {
    ffi_boundary!("strataRecv", comm, {
        let h = lookup(comm)?;
        let dt = dtype(datatype)?;
        let peer = peer_arg(peer, h.comm.size(), "peer")?;
        let c = nbytes(count, 1, dt, "count")?;
        let user = UserBuf::new(recvbuff, c, true, "recvbuff")?;
        if count == 0 {
            return Ok(());
        }
        let mut bufs = CallBuffers::new(&h.comm);
        // SAFETY: the caller's contract: `recvbuff` writable for `c` bytes of the
        // transport's kind of memory, untouched by others until the call (or group) ends.
        let buf = unsafe { bufs.output(&user) }?;
        let req = Request::new(Op::Recv { buf, count, peer }, dt);
        // SAFETY: the caller's contract on `stream` and the buffer.
        unsafe { bufs.run("strataRecv", h, req, stream) }
    })
}

/// # Safety
/// `p` is NULL or readable for `n` values of `T`.
unsafe fn array<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::InvalidArgument(format!(
            "{what} is NULL with nbuffers {n}"
        )));
    }
    if n.checked_mul(std::mem::size_of::<T>())
        .map_or(true, |b| b > isize::MAX as usize)
    {
        return Err(Error::InvalidArgument(format!("nbuffers {n} overflows")));
    }
    // SAFETY: non-NULL, size checked, readable for `n` values by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// The pairs of a coalesced call of `kind` (all-gather or reduce-scatter): sizes, NULLs,
/// overflow and NCCL's in-place layout of every pair, and no aliasing across the whole
/// list ([`disjoint`]). Returns the non-empty members' pairs and counts, in order.
fn coalesced_pairs(
    comm: &Comm,
    kind: Kind,
    sb: &[*const c_void],
    rb: &[*mut c_void],
    counts: &[usize],
    dt: DataType,
    name: &str,
) -> Result<(Vec<Pair>, Vec<usize>)> {
    let (n, r) = (comm.size(), comm.rank());
    let gather = kind == Kind::AllGather;
    let what = if gather { "sendcounts" } else { "recvcounts" };
    let (mut pairs, mut cs) = (Vec::new(), Vec::new());
    for (i, &count) in counts.iter().enumerate() {
        let c = nbytes(count, 1, dt, &format!("{what}[{i}]"))?;
        let total = nbytes(count, n, dt, &format!("{what}[{i}] x nranks"))?;
        let (send_len, recv_len) = if gather { (c, total) } else { (total, c) };
        let send = UserBuf::new(sb[i], send_len, false, format!("sendbuffs[{i}]"))?;
        let recv = UserBuf::new(rb[i], recv_len, true, format!("recvbuffs[{i}]"))?;
        if count == 0 {
            continue;
        }
        pairs.push(Pair::new(kind, r, c, send, recv));
        cs.push(count);
    }
    disjoint(&pairs, name)?;
    Ok((pairs, cs))
}

/// Build the buffers of every pair of a coalesced call.
///
/// # Safety
/// As [`CallBuffers::pair`] for every pair.
unsafe fn coalesced_buffers(
    bufs: &mut CallBuffers,
    pairs: &[Pair],
) -> Result<(Vec<Buffer>, Vec<Buffer>)> {
    let (mut sends, mut recvs) = (Vec::new(), Vec::new());
    for p in pairs {
        // SAFETY: the caller's contract.
        let (s, r) = unsafe { bufs.pair(p) }?;
        sends.push(s);
        recvs.push(r);
    }
    Ok((sends, recvs))
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
    ffi_boundary!("strataAllGatherCoalesced", comm, {
        let h = lookup(comm)?;
        let dt = dtype(datatype)?;
        // SAFETY: the caller's contract on the arrays.
        let (sb, rb, counts) = unsafe {
            (
                array(sendbuffs, nbuffers, "sendbuffs")?,
                array(recvbuffs, nbuffers, "recvbuffs")?,
                array(sendcounts, nbuffers, "sendcounts")?,
            )
        };
        let name = "strataAllGatherCoalesced";
        let (pairs, counts) = coalesced_pairs(&h.comm, Kind::AllGather, sb, rb, counts, dt, name)?;
        if pairs.is_empty() {
            return Ok(());
        }
        let mut bufs = CallBuffers::new(&h.comm);
        // SAFETY: the caller's contract on every buffer, as in `strataAllGather`.
        let (sends, recvs) = unsafe { coalesced_buffers(&mut bufs, &pairs) }?;
        let req = Request::new(
            Op::AllGatherCoalesced {
                sends,
                recvs,
                counts,
            },
            dt,
        );
        // SAFETY: the caller's contract on `stream` and the buffers.
        unsafe { bufs.run(name, h, req, stream) }
    })
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
pub unsafe extern "C" fn strataReduceScatterCoalesced(
    sendbuffs: *const *const c_void,
    recvbuffs: *const *mut c_void,
    recvcounts: *const usize,
    nbuffers: usize,
    datatype: strataDataType_t,
    op: strataRedOp_t,
    comm: strataComm_t,
    stream: strataStream_t,
) -> strataResult_t {
    ffi_boundary!("strataReduceScatterCoalesced", comm, {
        let h = lookup(comm)?;
        let dt = dtype(datatype)?;
        let op = redop(op)?;
        // SAFETY: the caller's contract on the arrays.
        let (sb, rb, counts) = unsafe {
            (
                array(sendbuffs, nbuffers, "sendbuffs")?,
                array(recvbuffs, nbuffers, "recvbuffs")?,
                array(recvcounts, nbuffers, "recvcounts")?,
            )
        };
        let name = "strataReduceScatterCoalesced";
        let (pairs, counts) =
            coalesced_pairs(&h.comm, Kind::ReduceScatter, sb, rb, counts, dt, name)?;
        if pairs.is_empty() {
            return Ok(());
        }
        let mut bufs = CallBuffers::new(&h.comm);
        // SAFETY: the caller's contract on every buffer, as in `strataReduceScatter`.
        let (sends, recvs) = unsafe { coalesced_buffers(&mut bufs, &pairs) }?;
        let req = Request::new(
            Op::ReduceScatterCoalesced {
                sends,
                recvs,
                counts,
                op,
            },
            dt,
        );
        // SAFETY: the caller's contract on `stream` and the buffers.
        unsafe { bufs.run(name, h, req, stream) }
    })
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
