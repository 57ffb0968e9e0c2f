//! What the GPU transports (`nccl`, `rccl`, `cuda-local`) share: the device face of a
//! transport ([`GpuTransport`]: blocking collectives and point-to-point on device
//! memory, enqueued on the communicator's stream and waited for with its timeout),
//! per-communicator scratch allocated once and grown on demand ([`Scratch`]), and the
//! host face written once over the device one ([`staged`]: host slices are copied into
//! scratch, moved on the device, and copied back), so host buffers, the ring defaults
//! and every algorithm keep working on a GPU communicator.
//!
//! The transports exist as types in every build; without their feature constructing
//! one is [`Error::NotCompiled`] with the feature to turn on.

#![forbid(unsafe_code)]

use crate::device::{DevEvent, DevStream, Device, Region};
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::memory::Buffer;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The device face of a GPU transport. Every call is blocking: it enqueues on
/// [`GpuTransport::stream`] and returns when the stream has run it (or with
/// `Error::Remote` after the timeout, the communicator then aborted). Regions are this
/// rank's device memory; in-place rules are the host trait's.
pub trait GpuTransport: Send + Sync {
    /// The device, the communicator's stream and its staging scratch.
    fn face(&self) -> &DeviceFace;
    /// The GPU this rank runs on.
    fn device(&self) -> &Arc<dyn Device> {
        &self.face().dev
    }
    /// The communicator's stream (algorithms enqueue their copies and kernels on it).
    fn stream(&self) -> &Arc<dyn DevStream> {
        &self.face().stream
    }
    /// Scratch for staging host bytes ([`staged`]).
    fn staging(&self) -> &Scratch {
        &self.face().stage
    }
    /// Wait for the stream, polling the communicator's asynchronous errors.
    fn finish(&self, on: On<'_>, what: &str) -> Result<()>;
    /// The communicator's asynchronous error, if any, without waiting
    /// (`ncclCommGetAsyncError`): what the watchdog polls beside a launched call's end
    /// event. Default: none.
    fn probe(&self) -> Result<()> {
        Ok(())
    }
    /// `c`, one of the collective or point-to-point calls every GPU transport makes
    /// ([`DevCall`]), on [`work_stream`]`(self, on)`.
    fn call(&self, on: On<'_>, c: DevCall) -> Result<()>;
    /// Run `body`'s calls as one group (NCCL: between ncclGroupStart and ncclGroupEnd,
    /// enqueued without waiting, then waited for together). Default: one after another.
    fn group(&self, _on: On<'_>, body: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        body()
    }
    /// True when a launched call may enqueue this transport's collectives on any stream
    /// of its device, one call's work on the caller's own stream (what NCCL does with
    /// the stream it is given): the fast path of a one-call collective
    /// ([`crate::runtime::launch`]). Default: false (the launch stream only).
    fn any_stream(&self) -> bool {
        false
    }
    /// `c` in the library's one call: `None` where the transport has no such call (the
    /// caller then composes it: a copy first, or the sum and then the division). Default:
    /// none.
    fn library_call(&self, _on: On<'_>, _c: LibCall) -> Option<Result<()>> {
        None
    }
}

/// The calls every GPU transport makes ([`GpuTransport::call`]), as NCCL describes each
/// collective in one `ncclInfo` and enqueues them all the same way. Regions are this
/// rank's device memory; in-place rules are the host trait's.
#[derive(Clone, Copy, Debug)]
pub enum DevCall {
    /// All-gather in place.
    AllGather {
        /// `size()` chunks of `chunk` bytes, this rank's at `rank()·chunk`.
        buf: Region,
        /// The bytes of each rank's chunk.
        chunk: usize,
    },
    /// Reduce-scatter of `send` into `recv` (`Avg` sums).
    ReduceScatter {
        /// `size()` chunks of `recv.len` bytes.
        send: Region,
        /// This rank's result (may be this rank's chunk of `send`).
        recv: Region,
        /// The element type.
        dtype: DataType,
        /// The reduction.
        op: ReduceOp,
    },
    /// All-reduce in place (`Avg` sums).
    AllReduce {
        /// The input and output.
        buf: Region,
        /// The element type.
        dtype: DataType,
        /// The reduction.
        op: ReduceOp,
    },
    /// All-to-all.
    AllToAll {
        /// Block j goes to rank j.
        send: Region,
        /// Block i comes from rank i.
        recv: Region,
    },
    /// Broadcast in place from `root`.
    Broadcast {
        /// The root's input, every rank's output.
        buf: Region,
        /// The root.
        root: usize,
    },
    /// Send `data` to `peer`.
    Send {
        /// The receiver.
        peer: usize,
        /// The bytes sent.
        data: Region,
    },
    /// Receive exactly `data.len` bytes from `peer`.
    Recv {
        /// The sender.
        peer: usize,
        /// Where the bytes go.
        data: Region,
    },
    /// Send to `dst` and receive from `src` at once.
    SendRecv {
        /// The receiver of `send`.
        dst: usize,
        /// The bytes sent.
        send: Region,
        /// The sender of `recv`.
        src: usize,
        /// Where the received bytes go.
        recv: Region,
    },
}

impl DevCall {
    /// The call's name in messages ("all-gather", "send/receive", ...).
    pub fn name(&self) -> &'static str {
        match self {
            DevCall::AllGather { .. } => "all-gather",
            DevCall::ReduceScatter { .. } => "reduce-scatter",
            DevCall::AllReduce { .. } => "all-reduce",
            DevCall::AllToAll { .. } => "all-to-all",
            DevCall::Broadcast { .. } => "broadcast",
            DevCall::Send { .. } => "send",
            DevCall::Recv { .. } => "receive",
            DevCall::SendRecv { .. } => "send/receive",
        }
    }
}

/// The calls only some libraries make in one go ([`GpuTransport::library_call`]): NCCL's
/// out-of-place forms and its own mean (`ncclAvg`).
#[derive(Clone, Copy, Debug)]
pub enum LibCall {
    /// Reduce-scatter of `send` into `recv` with `Avg` done by the library in the same
    /// call (`ncclAvg`, NCCL >= 2.10).
    ReduceScatterMean {
        /// `size()` chunks of `recv.len` bytes.
        send: Region,
        /// This rank's chunk (may lie in `send`: in place).
        recv: Region,
        /// The element type.
        dtype: DataType,
    },
    /// All-reduce of `send` into `recv` (the same range: in place) with `Avg` done by
    /// the library.
    AllReduceMean {
        /// The input.
        send: Region,
        /// The output, as long as `send`.
        recv: Region,
        /// The element type.
        dtype: DataType,
    },
    /// All-reduce of `send` into `recv` (same length, apart) in one out-of-place call
    /// (`ncclAllReduce(send, recv)`); without it the caller copies, then reduces in
    /// place (one stream entry and one pass over the data more).
    AllReduceFrom {
        /// The input.
        send: Region,
        /// The output, apart from `send`.
        recv: Region,
        /// The element type.
        dtype: DataType,
        /// The reduction (`Avg` sums).
        op: ReduceOp,
    },
    /// All-gather of `send` (this rank's chunk) into `recv` (`size()` chunks), apart.
    AllGatherFrom {
        /// This rank's chunk.
        send: Region,
        /// Every rank's chunk, in rank order.
        recv: Region,
    },
    /// Broadcast from `root`'s `send` into every rank's `recv` (`send` read on the root
    /// only).
    BroadcastFrom {
        /// The root's input.
        send: Region,
        /// Every rank's output.
        recv: Region,
        /// The root.
        root: usize,
    },
}

/// Where a call's device work goes: `Some(stream)` inside a launched call
/// ([`crate::runtime::launch`]: its launch stream, or a sub-communicator's side stream
/// forked from it), where a transport enqueues only and never waits for the device on
/// the host (its `finish` returns at once; the stream orders the work); `None` outside
/// one: the transport's own stream, waited for before the call returns.
pub type On<'a> = Option<&'a Arc<dyn DevStream>>;

/// The stream `g`'s device work goes on: `on` inside a launch, else `g`'s own.
#[inline]
pub fn work_stream<'a>(g: &'a dyn GpuTransport, on: On<'a>) -> &'a Arc<dyn DevStream> {
    on.unwrap_or_else(|| g.stream())
}

/// An eager message: its bytes in a device block of its own and, launched ([`On`]),
/// the event after the staging copy (nothing waited for it).
pub type Eager = (Buffer, Option<Arc<dyn DevEvent>>);

/// Stage `data` for an eager send on `g`'s work stream: copied into a block of its own
/// (not zeroed first; launched, a new block is allocated in the stream's order), so the
/// sender's region is free once this returns. Launched, the event after the copy goes
/// with the message; otherwise the stream is finished here.
pub fn stage(
    g: &dyn GpuTransport,
    on: On<'_>,
    timeout: Duration,
    data: Region,
    what: &str,
) -> Result<Eager> {
    let s = work_stream(g, on);
    let msg = Buffer::on_device_uninit(g.device(), data.len, on)?;
    {
        let w = msg.dev_write_timeout(timeout)?;
        s.copy(w.addr(), data.addr, data.len)?;
    }
    let ev = if on.is_some() {
        Some(s.record()?)
    } else {
        None
    };
    g.finish(on, what)?;
    Ok((msg, ev))
}

/// Copy an eager message into `data` on `g`'s work stream, after its event. Launched,
/// the block goes back to the cache once the copy has run, as the watcher sees it
/// (nothing waits here); otherwise it is dropped on return, after the stream is finished.
pub fn unstage(
    g: &dyn GpuTransport,
    on: On<'_>,
    timeout: Duration,
    (msg, ev): Eager,
    data: Region,
    what: &str,
) -> Result<()> {
    let s = work_stream(g, on);
    {
        let r = msg.dev_read_timeout(timeout)?;
        if let Some(ev) = &ev {
            s.wait_event(ev.as_ref())?;
        }
        s.copy(data.addr, r.addr(), data.len)?;
    }
    if on.is_some() {
        crate::device::watch::keep_until(s.record()?, msg);
    }
    g.finish(on, what)
}

/// What every GPU transport holds for its device face ([`GpuTransport::face`]).
pub struct DeviceFace {
    /// The GPU this rank runs on.
    pub dev: Arc<dyn Device>,
    /// The communicator's own stream.
    pub stream: Arc<dyn DevStream>,
    /// Scratch for staging host bytes.
    pub stage: Scratch,
}

impl DeviceFace {
    /// A face on `dev` with a new stream of its own and empty staging scratch.
    pub fn new(dev: &Arc<dyn Device>) -> Result<DeviceFace> {
        Ok(DeviceFace {
            dev: dev.clone(),
            stream: dev.new_stream()?,
            stage: Scratch::new(dev),
        })
    }
}

/// Device scratch of one communicator: allocated on first use, grown to the largest
/// request, then reused (never freed while the communicator lives).
pub struct Scratch {
    dev: Arc<dyn Device>,
    buf: Mutex<Option<Buffer>>,
}

impl Scratch {
    /// Empty scratch on `dev`.
    pub fn new(dev: &Arc<dyn Device>) -> Scratch {
        Scratch {
            dev: dev.clone(),
            buf: Mutex::new(None),
        }
    }

    /// A view of at least `bytes` bytes (contents unspecified) for work on `on` ([`On`]).
    /// Callers are the communicator's stream thread, one at a time; the view borrows the
    /// memory like any buffer, so misuse waits or errors instead of racing.
    pub fn get(&self, on: On<'_>, bytes: usize) -> Result<Buffer> {
        let mut g = self
            .buf
            .lock()
            .map_err(|_| Error::Internal("scratch lock poisoned".into()))?;
        if g.as_ref().is_none_or(|b| b.len() < bytes) {
            // Kept across calls: never a call's arena block; not zeroed (its contents
            // are unspecified), so growing it waits for no work of the caller's. In a
            // launch a new GPU block is allocated in the work stream's order; otherwise
            // (or where it cannot be) it is cleared on the device's private stream, which
            // is waited for: outside the launch contract, as a first allocation (no
            // steady-state call grows it).
            let b = crate::device::waits::outside(|| {
                Buffer::on_device_uninit(&self.dev, bytes.max(4096), on)
            })?;
            if let Some(old) = g.replace(b) {
                // Work already enqueued may still use the old block: on a launch, keep it
                // until the launch stream passes that work (nothing waits); otherwise the
                // stream was finished before this call.
                if let Some(st) = on {
                    crate::device::watch::keep_until(st.record()?, old);
                }
            }
        }
        g.as_ref()
            .ok_or_else(|| Error::Internal("scratch vanished".into()))?
            .slice(0..bytes)
    }
}

/// The host face of a GPU transport, written once over its device face: host bytes are
/// staged through the transport's scratch (`htod`, the device call, `dtoh`). The
/// [`super::Transport`] defaults call these for every transport with a device face;
/// the transports themselves only route `send`/`recv`/`sendrecv` here.
pub mod staged {
    use super::*;

    /// Stage `input` into scratch (and room for `out_len` result bytes after it unless
    /// `in_place`), run `f(input region, output region)`, return the output bytes.
    fn through(
        g: &dyn GpuTransport,
        t: Duration,
        input: &[u8],
        out_len: usize,
        in_place: bool,
        f: impl FnOnce(Region, Region) -> Result<()>,
    ) -> Result<Vec<u8>> {
        let off = if in_place {
            0
        } else {
            input.len().div_ceil(256) * 256
        };
        let b = g
            .staging()
            .get(None, if in_place { input.len() } else { off + out_len })?;
        let (ib, ob) = (b.slice(0..input.len())?, b.slice(off..off + out_len)?);
        ib.write_bytes(input)?;
        {
            let ig = ib.dev_write_timeout(t)?;
            let og = if in_place {
                None
            } else {
                Some(ob.dev_write_timeout(t)?)
            };
            let out = og.as_ref().map_or(ig.region(), |o| o.region());
            f(ig.region(), out)?;
        }
        ob.to_bytes()
    }

    /// Host all-gather in place.
    pub fn all_gather(
        g: &dyn GpuTransport,
        t: Duration,
        buf: &mut [u8],
        chunk: usize,
    ) -> Result<()> {
        let out = through(g, t, buf, buf.len(), true, |r, _| {
            g.call(None, DevCall::AllGather { buf: r, chunk })
        })?;
        buf.copy_from_slice(&out);
        Ok(())
    }

    /// Host reduce-scatter.
    pub fn reduce_scatter(
        g: &dyn GpuTransport,
        t: Duration,
        send: &[u8],
        recv: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let out = through(g, t, send, recv.len(), false, |s, r| {
            g.call(
                None,
                DevCall::ReduceScatter {
                    send: s,
                    recv: r,
                    dtype,
                    op,
                },
            )
        })?;
        recv.copy_from_slice(&out);
        Ok(())
    }

    /// Host all-reduce in place.
    pub fn all_reduce(
        g: &dyn GpuTransport,
        t: Duration,
        buf: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let out = through(g, t, buf, buf.len(), true, |r, _| {
            g.call(None, DevCall::AllReduce { buf: r, dtype, op })
        })?;
        buf.copy_from_slice(&out);
        Ok(())
    }

    /// Host all-to-all.
    pub fn all_to_all(
        g: &dyn GpuTransport,
        t: Duration,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<()> {
        let out = through(g, t, send, recv.len(), false, |s, r| {
            g.call(None, DevCall::AllToAll { send: s, recv: r })
        })?;
        recv.copy_from_slice(&out);
        Ok(())
    }

    /// Host broadcast in place.
    pub fn broadcast(g: &dyn GpuTransport, t: Duration, buf: &mut [u8], root: usize) -> Result<()> {
        let out = through(g, t, buf, buf.len(), true, |r, _| {
            g.call(None, DevCall::Broadcast { buf: r, root })
        })?;
        buf.copy_from_slice(&out);
        Ok(())
    }

    /// Host send.
    pub fn send(g: &dyn GpuTransport, t: Duration, peer: usize, data: &[u8]) -> Result<()> {
        through(g, t, data, 0, true, |r, _| {
            g.call(None, DevCall::Send { peer, data: r })
        })
        .map(|_| ())
    }

    /// Host receive.
    pub fn recv(g: &dyn GpuTransport, t: Duration, peer: usize, data: &mut [u8]) -> Result<()> {
        let out = through(g, t, &[], data.len(), false, |_, r| {
            g.call(None, DevCall::Recv { peer, data: r })
        })?;
        data.copy_from_slice(&out);
        Ok(())
    }

    /// Host send-receive.
    pub fn sendrecv(
        g: &dyn GpuTransport,
        t: Duration,
        dst: usize,
        send: &[u8],
        src: usize,
        recv: &mut [u8],
    ) -> Result<()> {
        let out = through(g, t, send, recv.len(), false, |s, r| {
            g.call(
                None,
                DevCall::SendRecv {
                    dst,
                    send: s,
                    src,
                    recv: r,
                },
            )
        })?;
        recv.copy_from_slice(&out);
        Ok(())
    }
}

/// The `NotCompiled` error of a transport whose feature is off (the GPU ones and mpi):
/// the feature and the cargo command (the Python package and the CLI tools replace the
/// command with their own: docs/errors.md).
pub fn not_compiled(name: &str, feature: &str) -> Error {
    Error::NotCompiled(format!(
        "the {name} transport needs the `{feature}` feature (cargo build --features {feature})"
    ))
}

/// The size of each element-wise step of a device reduction over `len` bytes of `dtype`.
pub fn count_of(len: usize, dtype: DataType) -> Result<usize> {
    if len % dtype.size() != 0 {
        return Err(Error::InvalidArgument(format!(
            "{len} bytes is not a whole number of {dtype} elements"
        )));
    }
    Ok(len / dtype.size())
}
