//! Collectives, point-to-point and groups over host memory (host transports) and
//! device memory (GPU transports).
//!
//! Every call: check the communicator, dtype, op, ranks and sizes; recognise NCCL's
//! in-place layout from the raw pointers (else require disjoint byte ranges); then
//! - host transports: copy the inputs into strata [`Buffer`]s (one buffer and a view of
//!   it for in-place calls); submit through [`Comm`]'s one submit path; then wait and
//!   copy the results into the user's receive buffers, or, inside a group, hold the
//!   copy-out for `strataGroupEnd`;
//! - GPU transports (the communicator has a device): check every pointer against the
//!   device and wrap it ([`Buffer::from_device_ptr`], no copies; in-place calls wrap one
//!   range and view it); make the communicator's stream wait for the caller's stream and
//!   wait for that on the host; submit; wait (or, inside a group, hold the work for
//!   `strataGroupEnd`). Nothing is copied out.

use super::*;
use crate::comm::{group_end, group_start, Work};
use crate::comm::{Op, Request};
use crate::device::{DevAddr, Device};
use crate::dtype::{DataType, ReduceOp};
use crate::memory::Buffer;
use crate::Algo;

// ---- argument helpers ----

fn dtype(v: strataDataType_t) -> Result<DataType> {
    DataType::from_raw(v).map_err(|_| {
        Error::InvalidArgument(format!(
            "datatype {v} is not supported (strataInt8 0, strataUint8 1, strataInt32 2, strataFloat16 6, strataFloat32 7, strataBfloat16 9)"
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

/// A byte range of user memory; `write` when the call stores into it.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: usize,
    len: usize,
    write: bool,
}

fn span(p: *const c_void, len: usize, write: bool, what: &str) -> Result<Span> {
    if p.is_null() && len > 0 {
        return Err(Error::InvalidArgument(format!(
            "{what} is NULL but the call needs {len} bytes"
        )));
    }
    let start = p as usize;
    start
        .checked_add(len)
        .ok_or_else(|| Error::InvalidArgument(format!("{what} + {len} bytes wraps around")))?;
    Ok(Span { start, len, write })
}

/// No byte may be both written by the call and touched by another range of it (NCCL's
/// in-place layouts are recognised before and passed as one span).
fn disjoint(spans: &mut [Span], what: &str) -> Result<()> {
    spans.sort_by_key(|s| s.start);
    let (mut end_any, mut end_write) = (0usize, 0usize);
    for s in spans.iter().filter(|s| s.len > 0) {
        if (s.write && s.start < end_any) || s.start < end_write {
            return Err(Error::InvalidArgument(format!(
                "{what}: send and receive buffers overlap without being NCCL's in-place layout"
            )));
        }
        end_any = end_any.max(s.start + s.len);
        if s.write {
            end_write = end_write.max(s.start + s.len);
        }
    }
    Ok(())
}

/// `len` bytes of user memory at `p`.
///
/// # Safety
/// `p` is valid for reads of `len` initialised bytes (non-NULL when `len > 0`) that are
/// not written while the slice lives.
unsafe fn user_bytes<'a>(p: *const c_void, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's contract: `len` readable, initialised bytes at `p`, which is
    // non-NULL; `len <= isize::MAX` was checked by `nbytes`.
    unsafe { std::slice::from_raw_parts(p as *const u8, len) }
}

/// A new buffer holding a copy of `len` bytes of user memory at `p`.
///
/// # Safety
/// As [`user_bytes`].
unsafe fn copy_in(p: *const c_void, len: usize) -> Buffer {
    // SAFETY: the caller's contract.
    Buffer::from_bytes(unsafe { user_bytes(p, len) })
}

// ---- device memory (GPU transports) ----

/// The caller's `len` bytes of device memory at `p` as a buffer, after checking that
/// they are memory of `dev` (a host pointer is a clear `InvalidArgument`).
///
/// # Safety
/// The range stays allocated, and untouched by anyone else, until the work using the
/// buffer completes (the device-path contract of every collective).
unsafe fn wrap(dev: &Arc<dyn Device>, p: *const c_void, len: usize, what: &str) -> Result<Buffer> {
    if len == 0 {
        return Ok(Buffer::zeroed(0));
    }
    let addr = p as usize as DevAddr;
    dev.check_pointer(addr, len).map_err(|e| match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{what}: {m}")),
        other => other,
    })?;
    // SAFETY: `len` bytes at `addr` are memory of `dev` (checked just above); that they
    // stay allocated and unshared while the buffer lives is the caller's contract.
    Ok(unsafe { Buffer::from_device_ptr(dev, addr, len) })
}

/// Make `comm`'s stream wait for the work queued on the caller's `stream`, then wait on
/// the host until that has run: the caller's earlier work (which produced the inputs,
/// or still reads the outputs) is complete before the collective starts on any stream
/// (sub-communicators' included).
///
/// # Safety
/// `stream` is NULL (the legacy default stream) or a live stream of `comm`'s device.
unsafe fn after_caller_stream(comm: &Comm, stream: strataStream_t, name: &str) -> Result<()> {
    let g = comm.transport().gpu().ok_or_else(|| {
        Error::Internal(format!(
            "{name}: a communicator with a device but no GPU transport"
        ))
    })?;
    let s = g.stream();
    // SAFETY: the caller's contract on `stream`.
    unsafe { s.wait_foreign(stream) }?;
    crate::device::finish(
        s.as_ref(),
        comm.timeout(),
        &format!("{name}: waiting for the work queued on the caller's stream"),
        || Ok(()),
    )
}

/// The device path's common end: wait for the caller's stream, submit `req`, and wait
/// for the work (inside a group: hold it for `strataGroupEnd`).
///
/// # Safety
/// As [`after_caller_stream`]; the buffers of `req` as [`wrap`].
unsafe fn run_device(
    name: &'static str,
    h: Arc<Handle>,
    req: Request,
    stream: strataStream_t,
) -> Result<()> {
    // SAFETY: forwarded caller contract on `stream`.
    unsafe { after_caller_stream(&h.comm, stream, name) }?;
    let work = h.comm.submit(req)?;
    // SAFETY: nothing to copy out (results are written in place on the device).
    unsafe { finish(name, h, work, Vec::new()) }
}

/// Results to copy from a strata buffer into user memory once the work is done.
struct Out {
    buf: Buffer,
    dst: *mut u8,
}

fn out(buf: Buffer, dst: *mut c_void) -> Out {
    Out {
        buf,
        dst: dst as *mut u8,
    }
}

/// # Safety
/// Every `dst` is valid for writes of its buffer's length and not accessed concurrently.
unsafe fn copy_out(outs: &[Out]) -> Result<()> {
    for o in outs {
        let g = o.buf.read()?;
        if g.is_empty() {
            continue;
        }
        // SAFETY: the caller's contract on `dst`; the source is strata-owned memory
        // distinct from user memory, so the ranges cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(g.as_ptr(), o.dst, g.len()) };
    }
    Ok(())
}

struct Held {
    function: &'static str,
    handle: Arc<Handle>,
    work: Work,
    outs: Vec<Out>,
}

thread_local! {
    static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
}

/// Outside a group: wait and copy the results out. Inside: hold them for `strataGroupEnd`.
///
/// # Safety
/// As [`copy_out`], until the work completes (inside a group: until `strataGroupEnd`).
unsafe fn finish(
    function: &'static str,
    handle: Arc<Handle>,
    work: Work,
    outs: Vec<Out>,
) -> Result<()> {
    if crate::comm::group::in_group() {
        HELD.with(|h| {
            h.borrow_mut().push(Held {
                function,
                handle,
                work,
                outs,
            })
        });
        return Ok(());
    }
    work.wait()?;
    // SAFETY: the caller's contract on the destinations.
    unsafe { copy_out(&outs) }
}

// ---- collectives ----

/// All-gather (NCCL's `ncclAllGather`): `recvbuff` (`nranks * sendcount` elements) receives
/// every rank's `sendbuff` (`sendcount` elements), rank-major.
///
/// In place when `sendbuff == recvbuff + rank * sendcount` (in elements); any other overlap
/// of the two ranges is `strataInvalidArgument`. `sendcount == 0` is a no-op (NULL buffers
/// allowed).
///
/// Host transports (local, mpi): the buffers are host memory; blocking; the stream is
/// ignored (may be NULL); inside a group the call returns at once, `sendbuff` is read now
/// and `recvbuff` is written by `strataGroupEnd` (keep both valid until it returns).
/// Ownership: the buffers stay the caller's; strata copies from and into them and keeps
/// no pointer after the call (or the group) ends.
///
/// GPU transports (nccl, rccl, cuda-local): the buffers are device memory of the
/// communicator's device (anything else, a host pointer included, is
/// `strataInvalidArgument`), used in place without copies; `stream` is the caller's
/// `cudaStream_t` / `hipStream_t` on that device (NULL: the legacy default stream). The
/// collective starts after the work queued on `stream` before the call, and the call
/// returns once it has completed on the device (host-synchronous), so work queued on
/// `stream` afterwards sees the results. Inside a group the call returns once `stream`'s
/// earlier work is done, and the collective completes in `strataGroupEnd` (keep the
/// buffers valid and untouched until it returns). strata keeps no pointer after the call
/// (or the group) ends.
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

/// The body of `strataAllGather` and `strataAllGatherQuantized` (`quant`: bits, block).
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
    let s = span(sendbuff, c, false, "sendbuff")?;
    let rv = span(recvbuff, total, true, "recvbuff")?;
    if sendcount == 0 {
        return Ok(());
    }
    if let Some(dev) = h.comm.device() {
        let in_place = s.start == rv.start + r * c;
        if !in_place {
            disjoint(&mut [s, rv], name)?;
        }
        // SAFETY: the caller's contract: device memory of the communicator's device,
        // `c` / `total` bytes, untouched by others until the call (or group) ends.
        let recv = unsafe { wrap(&dev, recvbuff, total, "recvbuff") }?;
        let send = if in_place {
            recv.slice(r * c..r * c + c)?
        } else {
            // SAFETY: as above.
            unsafe { wrap(&dev, sendbuff, c, "sendbuff") }?
        };
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
        return unsafe { run_device(name, h, req, stream) };
    }
    let recv = Buffer::zeroed(total);
    let send = if s.start == rv.start + r * c {
        recv.slice(r * c..r * c + c)?
    } else {
        disjoint(&mut [s, rv], name)?;
        Buffer::zeroed(c)
    };
    // SAFETY: `sendbuff` is readable for `c` bytes (caller's contract).
    send.write_bytes(unsafe { user_bytes(sendbuff, c) })?;
    let req = Request::new(
        Op::AllGather {
            send,
            recv: recv.clone(),
            count: sendcount,
        },
        dt,
    );
    let work = h.comm.submit(match q {
        Some(q) => req.with_algo(Algo::Qwz).with_quant(q),
        None => req,
    })?;
    // SAFETY: `recvbuff` is writable for `total` bytes (caller's contract).
    unsafe { finish(name, h, work, vec![out(recv, recvbuff)]) }
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

/// The body of `strataReduceScatter` and `strataReduceScatterQuantized`.
///
/// # Safety
/// As `strataReduceScatter`.
#[allow(clippy::too_many_arguments)]
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
    let s = span(sendbuff, total, false, "sendbuff")?;
    let rv = span(recvbuff, c, true, "recvbuff")?;
    if recvcount == 0 {
        return Ok(());
    }
    if let Some(dev) = h.comm.device() {
        let in_place = rv.start == s.start + r * c;
        if !in_place {
            disjoint(&mut [s, rv], name)?;
        }
        // SAFETY: the caller's contract: device memory of the communicator's device,
        // `total` / `c` bytes, untouched by others until the call (or group) ends.
        let send = unsafe { wrap(&dev, sendbuff, total, "sendbuff") }?;
        let recv = if in_place {
            send.slice(r * c..r * c + c)?
        } else {
            // SAFETY: as above.
            unsafe { wrap(&dev, recvbuff, c, "recvbuff") }?
        };
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
        return unsafe { run_device(name, h, req, stream) };
    }
    // SAFETY: `sendbuff` is readable for `total` bytes (caller's contract).
    let send = unsafe { copy_in(sendbuff, total) };
    let recv = if rv.start == s.start + r * c {
        send.slice(r * c..r * c + c)?
    } else {
        disjoint(&mut [s, rv], name)?;
        Buffer::zeroed(c)
    };
    let req = Request::new(
        Op::ReduceScatter {
            send,
            recv: recv.clone(),
            count: recvcount,
            op,
        },
        dt,
    );
    let work = h.comm.submit(match q {
        Some(q) => req.with_algo(Algo::Qgz).with_quant(q),
        None => req,
    })?;
    // SAFETY: `recvbuff` is writable for `c` bytes (caller's contract).
    unsafe { finish(name, h, work, vec![out(recv, recvbuff)]) }
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
        let s = span(sendbuff, c, false, "sendbuff")?;
        let rv = span(recvbuff, c, true, "recvbuff")?;
        if count == 0 {
            return Ok(());
        }
        if let Some(dev) = h.comm.device() {
            if s.start != rv.start {
                disjoint(&mut [s, rv], "strataAllReduce")?;
            }
            // SAFETY: the caller's contract: `c` bytes of the communicator's device
            // memory each, untouched by others until the call (or group) ends.
            let send = unsafe { wrap(&dev, sendbuff, c, "sendbuff") }?;
            let recv = if s.start == rv.start {
                send.clone()
            } else {
                // SAFETY: as above.
                unsafe { wrap(&dev, recvbuff, c, "recvbuff") }?
            };
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
            return unsafe { run_device("strataAllReduce", h, req, stream) };
        }
        // SAFETY: `sendbuff` is readable for `c` bytes (caller's contract).
        let send = unsafe { copy_in(sendbuff, c) };
        let recv = if s.start == rv.start {
            send.clone()
        } else {
            disjoint(&mut [s, rv], "strataAllReduce")?;
            Buffer::zeroed(c)
        };
        let work = h.comm.all_reduce(&send, &recv, count, dt, op)?;
        // SAFETY: `recvbuff` is writable for `c` bytes (caller's contract).
        unsafe { finish("strataAllReduce", h, work, vec![out(recv, recvbuff)]) }
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
        let s = span(sendbuff, total, false, "sendbuff")?;
        let rv = span(recvbuff, total, true, "recvbuff")?;
        if count == 0 {
            return Ok(());
        }
        disjoint(&mut [s, rv], "strataAllToAll")?;
        if let Some(dev) = h.comm.device() {
            // SAFETY: the caller's contract: `total` bytes of the communicator's device
            // memory each, untouched by others until the call (or group) ends.
            let (send, recv) = unsafe {
                (
                    wrap(&dev, sendbuff, total, "sendbuff")?,
                    wrap(&dev, recvbuff, total, "recvbuff")?,
                )
            };
            let req = Request::new(Op::AllToAll { send, recv, count }, dt);
            // SAFETY: the caller's contract on `stream` and the buffers.
            return unsafe { run_device("strataAllToAll", h, req, stream) };
        }
        // SAFETY: `sendbuff` is readable for `total` bytes (caller's contract).
        let send = unsafe { copy_in(sendbuff, total) };
        let recv = Buffer::zeroed(total);
        let work = h.comm.all_to_all(&send, &recv, count, dt)?;
        // SAFETY: `recvbuff` is writable for `total` bytes (caller's contract).
        unsafe { finish("strataAllToAll", h, work, vec![out(recv, recvbuff)]) }
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
        let rv = span(recvbuff, c, true, "recvbuff")?;
        let is_root = h.comm.rank() == root;
        let s = if is_root {
            Some(span(sendbuff, c, false, "sendbuff")?)
        } else {
            None
        };
        if count == 0 {
            return Ok(());
        }
        if let Some(dev) = h.comm.device() {
            let (send, recv) = match s {
                Some(s) if s.start == rv.start => {
                    // SAFETY: the caller's contract: `c` bytes of the communicator's
                    // device memory, untouched by others until the call (or group) ends.
                    let b = unsafe { wrap(&dev, recvbuff, c, "recvbuff") }?;
                    (b.clone(), b)
                }
                Some(s) => {
                    disjoint(&mut [s, rv], "strataBroadcast")?;
                    // SAFETY: as above, for both buffers.
                    unsafe {
                        (
                            wrap(&dev, sendbuff, c, "sendbuff")?,
                            wrap(&dev, recvbuff, c, "recvbuff")?,
                        )
                    }
                }
                // SAFETY: as above.
                None => (Buffer::zeroed(0), unsafe {
                    wrap(&dev, recvbuff, c, "recvbuff")
                }?),
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
            return unsafe { run_device("strataBroadcast", h, req, stream) };
        }
        let (send, recv) = match s {
            Some(s) => {
                // SAFETY: on the root `sendbuff` is readable for `c` bytes.
                let send = unsafe { copy_in(sendbuff, c) };
                if s.start == rv.start {
                    (send.clone(), send)
                } else {
                    disjoint(&mut [s, rv], "strataBroadcast")?;
                    (send, Buffer::zeroed(c))
                }
            }
            None => (Buffer::zeroed(0), Buffer::zeroed(c)),
        };
        let work = h.comm.broadcast(&send, &recv, count, dt, root)?;
        // SAFETY: `recvbuff` is writable for `c` bytes (caller's contract).
        unsafe { finish("strataBroadcast", h, work, vec![out(recv, recvbuff)]) }
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
/// posts a matching `strataRecv`. Host transports send eagerly, so a send outside a group
/// returns once its bytes are handed over; put matching sends and receives of several
/// peers in one group (as with NCCL) to exchange without ordering concerns. `sendbuff` is
/// read during the call. GPU transports: the call returns once the peer has received
/// the data (so pair sends and receives in a group, as with NCCL). Memory, streams,
/// ownership and thread-safety as `strataAllGather`.
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
        span(sendbuff, c, false, "sendbuff")?;
        if count == 0 {
            return Ok(());
        }
        if let Some(dev) = h.comm.device() {
            // SAFETY: the caller's contract: `c` bytes of the communicator's device
            // memory, untouched by others until the call (or group) ends.
            let buf = unsafe { wrap(&dev, sendbuff, c, "sendbuff") }?;
            let req = Request::new(Op::Send { buf, count, peer }, dt);
            // SAFETY: the caller's contract on `stream` and the buffer.
            return unsafe { run_device("strataSend", h, req, stream) };
        }
        // SAFETY: `sendbuff` is readable for `c` bytes (caller's contract).
        let buf = unsafe { copy_in(sendbuff, c) };
        let work = h.comm.send(&buf, count, dt, peer)?;
        // SAFETY: nothing to copy out.
        unsafe { finish("strataSend", h, work, Vec::new()) }
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
        span(recvbuff, c, true, "recvbuff")?;
        if count == 0 {
            return Ok(());
        }
        if let Some(dev) = h.comm.device() {
            // SAFETY: the caller's contract: `c` bytes of the communicator's device
            // memory, untouched by others until the call (or group) ends.
            let buf = unsafe { wrap(&dev, recvbuff, c, "recvbuff") }?;
            let req = Request::new(Op::Recv { buf, count, peer }, dt);
            // SAFETY: the caller's contract on `stream` and the buffer.
            return unsafe { run_device("strataRecv", h, req, stream) };
        }
        let buf = Buffer::zeroed(c);
        let work = h.comm.recv(&buf, count, dt, peer)?;
        // SAFETY: `recvbuff` is writable for `c` bytes (caller's contract).
        unsafe { finish("strataRecv", h, work, vec![out(buf, recvbuff)]) }
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
        let r = h.comm.rank();
        let items = coalesced_items(
            &h.comm,
            sb,
            rb,
            counts,
            dt,
            true,
            "strataAllGatherCoalesced",
        )?;
        if items.is_empty() {
            return Ok(());
        }
        if let Some(dev) = h.comm.device() {
            let (mut sends, mut recvs, mut cs) = (vec![], vec![], vec![]);
            for (i, c, total, in_place) in items {
                // SAFETY: the caller's contract: each buffer is the communicator's device
                // memory of its size, untouched by others until the call (or group) ends.
                let recv = unsafe { wrap(&dev, rb[i], total, &format!("recvbuffs[{i}]")) }?;
                let send = if in_place {
                    recv.slice(r * c..r * c + c)?
                } else {
                    // SAFETY: as above.
                    unsafe { wrap(&dev, sb[i], c, &format!("sendbuffs[{i}]")) }?
                };
                sends.push(send);
                recvs.push(recv);
                cs.push(counts[i]);
            }
            let req = Request::new(
                Op::AllGatherCoalesced {
                    sends,
                    recvs,
                    counts: cs,
                },
                dt,
            );
            // SAFETY: the caller's contract on `stream` and the buffers.
            return unsafe { run_device("strataAllGatherCoalesced", h, req, stream) };
        }
        let (mut sends, mut recvs, mut cs, mut outs) = (vec![], vec![], vec![], vec![]);
        for (i, c, total, in_place) in items {
            let recv = Buffer::zeroed(total);
            let send = if in_place {
                let mine = recv.slice(r * c..r * c + c)?;
                // SAFETY: `sendbuffs[i]` is readable for `c` bytes (caller's contract).
                mine.write_bytes(unsafe { user_bytes(sb[i], c) })?;
                mine
            } else {
                // SAFETY: as above.
                unsafe { copy_in(sb[i], c) }
            };
            sends.push(send);
            recvs.push(recv.clone());
            cs.push(counts[i]);
            outs.push(out(recv, rb[i]));
        }
        let work = h.comm.all_gather_coalesced(&sends, &recvs, &cs, dt)?;
        // SAFETY: each `recvbuffs[i]` is writable for its size (caller's contract).
        unsafe { finish("strataAllGatherCoalesced", h, work, outs) }
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
        let r = h.comm.rank();
        let items = coalesced_items(
            &h.comm,
            sb,
            rb,
            counts,
            dt,
            false,
            "strataReduceScatterCoalesced",
        )?;
        if items.is_empty() {
            return Ok(());
        }
        if let Some(dev) = h.comm.device() {
            let (mut sends, mut recvs, mut cs) = (vec![], vec![], vec![]);
            for (i, c, total, in_place) in items {
                // SAFETY: the caller's contract: each buffer is the communicator's device
                // memory of its size, untouched by others until the call (or group) ends.
                let send = unsafe { wrap(&dev, sb[i], total, &format!("sendbuffs[{i}]")) }?;
                let recv = if in_place {
                    send.slice(r * c..r * c + c)?
                } else {
                    // SAFETY: as above.
                    unsafe { wrap(&dev, rb[i], c, &format!("recvbuffs[{i}]")) }?
                };
                sends.push(send);
                recvs.push(recv);
                cs.push(counts[i]);
            }
            let req = Request::new(
                Op::ReduceScatterCoalesced {
                    sends,
                    recvs,
                    counts: cs,
                    op,
                },
                dt,
            );
            // SAFETY: the caller's contract on `stream` and the buffers.
            return unsafe { run_device("strataReduceScatterCoalesced", h, req, stream) };
        }
        let (mut sends, mut recvs, mut cs, mut outs) = (vec![], vec![], vec![], vec![]);
        for (i, c, total, in_place) in items {
            // SAFETY: `sendbuffs[i]` is readable for `total` bytes (caller's contract).
            let send = unsafe { copy_in(sb[i], total) };
            let recv = if in_place {
                send.slice(r * c..r * c + c)?
            } else {
                Buffer::zeroed(c)
            };
            sends.push(send);
            recvs.push(recv.clone());
            cs.push(counts[i]);
            outs.push(out(recv, rb[i]));
        }
        let work = h
            .comm
            .reduce_scatter_coalesced(&sends, &recvs, &cs, dt, op)?;
        // SAFETY: each `recvbuffs[i]` is writable for its size (caller's contract).
        unsafe { finish("strataReduceScatterCoalesced", h, work, outs) }
    })
}

// ---- groups ----

/// Starts (or nests) a group on this thread (NCCL's `ncclGroupStart`): until the
/// matching outermost `strataGroupEnd`, calls on any communicator return at once and are
/// launched together, one launch per communicator. This lets one thread drive several
/// ranks of a local world, and pairs sends with receives. Groups are per thread.
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
/// calls, waits for all of them, and copies every result into its user buffer (host
/// transports; on GPU transports the results are already in place on the device when
/// this returns): the buffers of every call in the group must stay valid, and untouched
/// by other threads and streams, until this returns. Returns the first failure (each failing communicator also records
/// its own message); results of calls that succeeded are copied out regardless.
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
        if crate::comm::group::in_group() {
            return Ok(());
        }
        let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
        let mut first = Ok(());
        for hd in held {
            // SAFETY: the grouped calls' contract: destinations valid until now.
            let r = hd.work.wait().and_then(|_| unsafe { copy_out(&hd.outs) });
            if let Err(e) = r {
                hd.handle
                    .set_error(&format!("strataGroupEnd ({}): {e}", hd.function));
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    })
}

/// Validate the buffers of a coalesced call (`gather`: all-gather, else reduce-scatter):
/// sizes, NULLs, overflow, NCCL's in-place pairs and aliasing across the whole list.
/// Returns (index, chunk bytes, total bytes, in place) for every non-empty member.
fn coalesced_items(
    comm: &crate::comm::Comm,
    sb: &[*const c_void],
    rb: &[*mut c_void],
    counts: &[usize],
    dt: DataType,
    gather: bool,
    name: &str,
) -> Result<Vec<(usize, usize, usize, bool)>> {
    let (n, r) = (comm.size(), comm.rank());
    let what = if gather { "sendcounts" } else { "recvcounts" };
    let mut spans = Vec::new();
    let mut items = Vec::new();
    for i in 0..counts.len() {
        let c = nbytes(counts[i], 1, dt, &format!("{what}[{i}]"))?;
        let total = nbytes(counts[i], n, dt, &format!("{what}[{i}] x nranks"))?;
        let (send_len, recv_len) = if gather { (c, total) } else { (total, c) };
        let s = span(sb[i], send_len, false, &format!("sendbuffs[{i}]"))?;
        let rv = span(rb[i], recv_len, true, &format!("recvbuffs[{i}]"))?;
        if counts[i] == 0 {
            continue;
        }
        let in_place = if gather {
            s.start == rv.start + r * c
        } else {
            rv.start == s.start + r * c
        };
        match (in_place, gather) {
            // All-gather in place: the send range lies inside the written receive range.
            (true, true) => spans.push(rv),
            // Reduce-scatter in place: the whole send range is both read and written.
            (true, false) => spans.push(Span { write: true, ..s }),
            (false, _) => {
                spans.push(s);
                spans.push(rv);
            }
        }
        items.push((i, c, total, in_place));
    }
    disjoint(&mut spans, name)?;
    Ok(items)
}
