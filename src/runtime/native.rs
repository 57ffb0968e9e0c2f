//! Runs a checked request on the transport's native collective: borrows the buffers
//! (shared for what is read, exclusive for what is written), follows NCCL's in-place
//! layouts, and calls the blocking transport on the stream thread. `Avg` is left as a
//! sum: `crate::algo::run` divides once at the very end. The in-place layout is the one
//! the check derived and the op's buffers record ([`Op::layout`]); it is read, not
//! derived again (debug builds compare it with NCCL's rule, [`Op::is_in_place`]).

#![forbid(unsafe_code)]

use super::request::Op;
use crate::device::direct::Launched;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::kinds::InPlace;
use crate::memory::Buffer;
use crate::transport::{Fold, Transport};
use std::sync::Arc;
use std::time::Duration;

/// A group's host point-to-point ops (`Send`/`Recv` only) in flight together
/// ([`P2p::exchange`](crate::transport::P2p::exchange)): what makes a grouped ring or
/// all-to-all exchange of any size deadlock-free on every host transport.
pub fn exchange(t: &dyn Transport, ops: &[Op], timeout: Duration) -> Result<()> {
    let mut reads = Vec::new();
    let mut writes = Vec::new();
    // Empty messages are left out on both sides (their counts agree), so empty device
    // buffers, which have no host view, never reach the host path.
    for op in ops.iter().filter(|o| o.has_bytes()) {
        match op {
            Op::Send { buf, peer, .. } => reads.push((*peer, buf.read_timeout(timeout)?)),
            Op::Recv { buf, peer, .. } => writes.push((*peer, buf.write_timeout(timeout)?)),
            _ => return Err(Error::Internal(format!("{} in a p2p exchange", op.name()))),
        }
    }
    let sends: Vec<(usize, &[u8])> = reads.iter().map(|(p, g)| (*p, &g[..])).collect();
    let mut recvs: Vec<(usize, &mut [u8])> =
        writes.iter_mut().map(|(p, g)| (*p, &mut g[..])).collect();
    t.exchange(&sends, &mut recvs)
}

/// Execute `op` (already checked) with the transport's own algorithm. Device buffers
/// go to the transport's device face ([`crate::transport::gpu::GpuTransport`]); host
/// buffers to its host face (GPU transports stage them through scratch).
///
/// Inside a launched call, `at` is its context and the stream the device work goes on
/// (enqueued only, scratch from the call's arena); `None`: the transport's own stream,
/// waited for.
pub fn run(
    t: &dyn Transport,
    at: Option<Launched<'_>>,
    op: &Op,
    dtype: DataType,
    timeout: Duration,
) -> Result<()> {
    match placement(op)? {
        Place::Device(place) => device::run(t, at, op, dtype, timeout, place, false).map(|_| ()),
        Place::Host => host(t, op, dtype, timeout),
        // Nothing to move on any rank (counts agree): NCCL returns at once too. Empty
        // device buffers have no host view, so the host path must not see them.
        Place::Empty => Ok(()),
    }
}

/// [`run`] on a transport without a device face ([`Transport::gpu`] is `None`),
/// without first looking at where every buffer is: a device buffer fails at its borrow
/// (it has no host view) before anything moves, and the error is then [`run`]'s.
/// `crate::algo::run` takes it for `ring` (blocking calls run inline, and queued ones).
#[inline]
pub fn run_host(t: &dyn Transport, op: &Op, dtype: DataType, timeout: Duration) -> Result<()> {
    if !op.has_bytes() {
        return Ok(());
    }
    host(t, op, dtype, timeout).or_else(|e| not_host(t, op, dtype, timeout, e))
}

#[cold]
#[inline(never)]
fn not_host(
    t: &dyn Transport,
    op: &Op,
    dtype: DataType,
    timeout: Duration,
    e: Error,
) -> Result<()> {
    match op.device() {
        Some(_) => run(t, None, op, dtype, timeout),
        None => Err(e),
    }
}

/// The host half of [`run`]: the op's buffers are host memory with a byte somewhere.
fn host(t: &dyn Transport, op: &Op, dtype: DataType, timeout: Duration) -> Result<()> {
    let rank = t.rank();
    let in_place = layout(op, rank, dtype).is_some();
    match op {
        Op::AllGather { send, recv, count } => {
            let c = count * dtype.size();
            let mut out = recv.write_timeout(timeout)?;
            if !in_place {
                out[rank * c..(rank + 1) * c].copy_from_slice(&send.read_timeout(timeout)?);
            }
            t.all_gather(&mut out, c)
        }
        Op::ReduceScatter { send, recv, op, .. } => {
            if in_place {
                // In place: the input is the whole buffer, the output one chunk of it.
                let c = recv.len();
                t.reduce_scatter_in_place(&mut send.write_timeout(timeout)?, c, dtype, *op)
            } else {
                let src = send.read_timeout(timeout)?;
                let mut out = recv.write_timeout(timeout)?;
                t.reduce_scatter(&src, &mut out, dtype, *op)
            }
        }
        Op::AllReduce { send, recv, op, .. } => {
            if in_place {
                t.all_reduce(&mut recv.write_timeout(timeout)?, dtype, *op)
            } else {
                let src = send.read_timeout(timeout)?;
                t.all_reduce_from(&src, &mut recv.write_timeout(timeout)?, dtype, *op)
            }
        }
        Op::AllToAll { send, recv, .. } => t.all_to_all(
            &send.read_timeout(timeout)?,
            &mut recv.write_timeout(timeout)?,
        ),
        Op::Broadcast {
            send, recv, root, ..
        } => {
            if rank == *root && !in_place {
                copy(send, recv, timeout)?;
            }
            t.broadcast(&mut recv.write_timeout(timeout)?, *root)
        }
        Op::Send { buf, peer, .. } => t.send(*peer, &buf.read_timeout(timeout)?),
        Op::Recv { buf, peer, .. } => t.recv(*peer, &mut buf.write_timeout(timeout)?),
        Op::SendRecv {
            send,
            recv,
            dst,
            src,
            reduce,
            ..
        } => {
            let out = send.read_timeout(timeout)?;
            match reduce {
                None => t.sendrecv(*dst, &out, *src, &mut recv.write_timeout(timeout)?),
                Some(op) => t.sendrecv_reduce(
                    *dst,
                    &out,
                    *src,
                    Fold::Into(&mut recv.write_timeout(timeout)?),
                    dtype,
                    op.partial(),
                ),
            }
        }
        Op::AllGatherCoalesced { .. } | Op::ReduceScatterCoalesced { .. } => {
            Err(Error::Internal(format!(
                "{} reached the native path unpacked (size {})",
                op.name(),
                t.size()
            )))
        }
    }
}

/// The in-place layout `op`'s buffers record ([`Op::layout`]); debug builds check it is
/// NCCL's for `rank` (an op of an algorithm's own is built that way too) wherever it
/// matters (an empty buffer has no layout to follow).
fn layout(op: &Op, rank: usize, dtype: DataType) -> Option<InPlace> {
    let l = op.layout();
    if cfg!(debug_assertions) {
        let mut empty = false;
        op.for_each_buffer(&mut |b| empty |= b.is_empty());
        assert!(
            empty || l.is_some() == op.is_in_place(rank, dtype),
            "{}: recorded in-place layout {l:?} is not NCCL's on rank {rank}",
            op.name()
        );
    }
    l
}

/// [`run`] of a device op whose `Avg` the library may finish itself (`ncclAvg`,
/// [`crate::transport::gpu::LibCall::ReduceScatterMean`]): true when it did (the
/// result is the mean), false when the result is the sum, for the caller to divide. The fast path of a
/// launched one-call collective ([`crate::runtime::launch`]).
pub fn run_device_mean(
    t: &dyn Transport,
    at: Launched<'_>,
    op: &Op,
    dtype: DataType,
    timeout: Duration,
) -> Result<bool> {
    match placement(op)? {
        Place::Device(place) => device::run(t, Some(at), op, dtype, timeout, place, true),
        Place::Host | Place::Empty => Err(Error::Internal(format!(
            "{}: host buffers on the device path",
            op.name()
        ))),
    }
}

fn copy(src: &Buffer, dst: &Buffer, timeout: Duration) -> Result<()> {
    let data = src.read_timeout(timeout)?;
    dst.write_timeout(timeout)?.copy_from_slice(&data);
    Ok(())
}

/// Where an op's bytes are ([`placement`]).
enum Place {
    /// Every buffer is empty: nothing to move.
    Empty,
    /// Host memory.
    Host,
    /// Memory of this device.
    Device(Arc<dyn crate::device::Device>),
}

/// Where the op's non-empty buffers are; buffers of both kinds, or of two devices, in
/// one op are an `InvalidArgument`. One pass over the buffers.
fn placement<'a>(op: &'a Op) -> Result<Place> {
    let mut dev: Option<&Arc<dyn crate::device::Device>> = None;
    let mut host = false;
    let mut two: Option<(usize, usize)> = None;
    let mut see = |b: &'a Buffer| {
        if b.is_empty() {
            return;
        }
        match b.device() {
            None => host = true,
            Some(d) => {
                if let Some(e) = dev {
                    if !Arc::ptr_eq(e, d) && e.ordinal() != d.ordinal() {
                        two.get_or_insert((e.ordinal(), d.ordinal()));
                    }
                }
                dev = Some(d);
            }
        }
    };
    op.for_each_buffer(&mut see);
    if let Some((a, b)) = two {
        return Err(Error::InvalidArgument(format!(
            "{}: buffers on two devices ({a} and {b})",
            op.name()
        )));
    }
    if host && dev.is_some() {
        return Err(Error::InvalidArgument(format!(
            "{}: host and device buffers mixed in one call",
            op.name()
        )));
    }
    Ok(match (dev, host) {
        (Some(d), _) => Place::Device(d.clone()),
        (None, true) => Place::Host,
        (None, false) => Place::Empty,
    })
}

/// The device path: the same ops on the transport's [`GpuTransport`].
mod device {
    use super::*;
    use crate::device::{Device, Elementwise};
    use crate::transport::gpu::{DevCall, GpuTransport, LibCall, On};

    fn gpu<'a>(t: &'a dyn Transport, op: &Op) -> Result<&'a dyn GpuTransport> {
        t.gpu().ok_or_else(|| {
            Error::InvalidUsage(format!(
                "{} on device buffers needs a GPU transport (nccl, rccl, cuda-local); this \
                 communicator's transport is {}, which moves host memory",
                op.name(),
                t.kind().name()
            ))
        })
    }

    pub(super) fn run(
        t: &dyn Transport,
        at: Option<Launched<'_>>,
        op: &Op,
        dtype: DataType,
        to: Duration,
        place: Arc<dyn Device>,
        mean: bool,
    ) -> Result<bool> {
        let g = gpu(t, op)?;
        let on = at.map(|a| a.stream);
        let mean = |o: &crate::dtype::ReduceOp| mean && *o == crate::dtype::ReduceOp::Avg;
        if g.device().ordinal() != place.ordinal() || g.device().api() != place.api() {
            return Err(Error::InvalidArgument(format!(
                "{}: buffers on {} device {}, the communicator runs on device {}",
                op.name(),
                place.api().name(),
                place.ordinal(),
                g.device().ordinal()
            )));
        }
        let rank = t.rank();
        let layout = layout(op, rank, dtype);
        let in_place = layout.is_some();
        match op {
            Op::AllGather { send, recv, count } => {
                let c = count * dtype.size();
                let out = recv.dev_write_timeout(to)?;
                if !in_place {
                    let s = send.dev_read_timeout(to)?;
                    if let Some(r) = g.library_call(
                        on,
                        LibCall::AllGatherFrom {
                            send: s.region(),
                            recv: out.region(),
                        },
                    ) {
                        return r.map(|_| false);
                    }
                    crate::transport::gpu::work_stream(g, on).copy(
                        out.addr() + (rank * c) as u64,
                        s.addr(),
                        c,
                    )?;
                }
                let buf = out.region();
                g.call(on, DevCall::AllGather { buf, chunk: c })
                    .map(|_| false)
            }
            Op::ReduceScatter { send, recv, op, .. } => {
                let (whole, input, output);
                let (send, recv) = if let Some(InPlace::RecvInSend { offset }) = layout {
                    // In place: one exclusive borrow of the whole input covers the output.
                    whole = send.dev_write_timeout(to)?;
                    let r = crate::device::Region {
                        addr: whole.addr() + offset as u64,
                        len: recv.len(),
                    };
                    (whole.region(), r)
                } else {
                    input = send.dev_read_timeout(to)?;
                    output = recv.dev_write_timeout(to)?;
                    (input.region(), output.region())
                };
                if mean(op) {
                    let c = LibCall::ReduceScatterMean { send, recv, dtype };
                    if let Some(r) = g.library_call(on, c) {
                        return r.map(|_| true);
                    }
                }
                let op = *op;
                g.call(
                    on,
                    DevCall::ReduceScatter {
                        send,
                        recv,
                        dtype,
                        op,
                    },
                )
                .map(|_| false)
            }
            Op::AllReduce { send, recv, op, .. } => {
                if !in_place {
                    // The library's out-of-place call where it has one, else a copy first.
                    let (s, r) = (send.dev_read_timeout(to)?, recv.dev_write_timeout(to)?);
                    if mean(op) {
                        if let Some(x) = g.library_call(
                            on,
                            LibCall::AllReduceMean {
                                send: s.region(),
                                recv: r.region(),
                                dtype,
                            },
                        ) {
                            return x.map(|_| true);
                        }
                    }
                    if let Some(x) = g.library_call(
                        on,
                        LibCall::AllReduceFrom {
                            send: s.region(),
                            recv: r.region(),
                            dtype,
                            op: *op,
                        },
                    ) {
                        return x.map(|_| false);
                    }
                    drop((s, r));
                    copy_dev(g, on, send, recv, to)?;
                }
                let r = recv.dev_write_timeout(to)?;
                if mean(op) {
                    if let Some(x) = g.library_call(
                        on,
                        LibCall::AllReduceMean {
                            send: r.region(),
                            recv: r.region(),
                            dtype,
                        },
                    ) {
                        return x.map(|_| true);
                    }
                }
                let (buf, op) = (r.region(), *op);
                g.call(on, DevCall::AllReduce { buf, dtype, op })
                    .map(|_| false)
            }
            Op::AllToAll { send, recv, .. } => {
                let (s, r) = (send.dev_read_timeout(to)?, recv.dev_write_timeout(to)?);
                let (send, recv) = (s.region(), r.region());
                g.call(on, DevCall::AllToAll { send, recv }).map(|_| false)
            }
            Op::Broadcast {
                send, recv, root, ..
            } => {
                if rank == *root && !in_place {
                    let (s, r) = (send.dev_read_timeout(to)?, recv.dev_write_timeout(to)?);
                    if let Some(x) = g.library_call(
                        on,
                        LibCall::BroadcastFrom {
                            send: s.region(),
                            recv: r.region(),
                            root: *root,
                        },
                    ) {
                        return x.map(|_| false);
                    }
                    drop((s, r));
                    copy_dev(g, on, send, recv, to)?;
                }
                let buf = recv.dev_write_timeout(to)?;
                g.call(
                    on,
                    DevCall::Broadcast {
                        buf: buf.region(),
                        root: *root,
                    },
                )
                .map(|_| false)
            }
            Op::Send { buf, peer, .. } => {
                let b = buf.dev_read_timeout(to)?;
                let (data, peer) = (b.region(), *peer);
                g.call(on, DevCall::Send { peer, data }).map(|_| false)
            }
            Op::Recv { buf, peer, .. } => {
                let b = buf.dev_write_timeout(to)?;
                let (data, peer) = (b.region(), *peer);
                g.call(on, DevCall::Recv { peer, data }).map(|_| false)
            }
            Op::SendRecv {
                send,
                recv,
                dst,
                src,
                reduce,
                ..
            } => {
                let s = send.dev_read_timeout(to)?;
                let (send, dst, src) = (s.region(), *dst, *src);
                let call = |recv| DevCall::SendRecv {
                    dst,
                    send,
                    src,
                    recv,
                };
                match reduce {
                    None => {
                        let r = recv.dev_write_timeout(to)?;
                        g.call(on, call(r.region())).map(|_| false)
                    }
                    Some(op) => {
                        let tmp = match at {
                            Some(a) => recv.alloc_like_in(recv.len(), a.scope, a.stream)?,
                            None => recv.alloc_like(recv.len())?,
                        };
                        let tg = tmp.dev_write_timeout(to)?;
                        g.call(on, call(tg.region()))?;
                        let r = recv.dev_write_timeout(to)?;
                        let n = crate::transport::gpu::count_of(recv.len(), dtype)?;
                        let e = Elementwise::Reduce {
                            acc: r.addr(),
                            src: tg.addr(),
                            count: n,
                            dtype,
                            op: op.partial(),
                        };
                        crate::transport::gpu::work_stream(g, on).elementwise(e)?;
                        g.finish(on, "send-receive reduction").map(|_| false)
                    }
                }
            }
            Op::AllGatherCoalesced { .. } | Op::ReduceScatterCoalesced { .. } => Err(
                Error::Internal(format!("{} reached the native path unpacked", op.name())),
            ),
        }
    }

    fn copy_dev(
        g: &dyn GpuTransport,
        on: On<'_>,
        src: &Buffer,
        dst: &Buffer,
        to: Duration,
    ) -> Result<()> {
        let s = src.dev_read_timeout(to)?;
        let d = dst.dev_write_timeout(to)?;
        crate::transport::gpu::work_stream(g, on).copy(d.addr(), s.addr(), src.len())?;
        g.finish(on, "copy")
    }
}
