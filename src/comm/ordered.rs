//! Stream-ordered collectives on device transports (NCCL semantics): a call names the
//! caller's stream and returns at once; on the device, the collective runs after the
//! work queued on that stream before the call, and the work queued on it after the call
//! runs after the collective.
//!
//! How: at the call, an event is recorded on the caller's stream and a wait for the
//! communicator's completion word ([`crate::runtime::ordered`]) to reach this call's
//! number is enqueued on it; the call is queued on the communicator's stream thread,
//! which waits for the event, runs the collective on the communicator's device streams
//! (every stage, kernel and copy), and then writes the word. The caller's thread never
//! waits for the device; the caller's stream waits on the device. Scratch comes from the
//! device's cache ([`crate::device::pool`]), so a repeated call allocates nothing and no
//! call synchronizes the device while a caller's stream is waiting.
//!
//! Failures after the call (a dead peer, a device fault, the caller's earlier work not
//! completing within the timeout) complete the [`Work`] with the error, abort the
//! communicator, are kept for [`Comm::async_error`], and still write the word, so the
//! caller's stream and later calls never hang.
//!
//! **Graph capture** (the capturable path, [`crate::device::direct`]): on a stream being
//! captured, the call forks the communicator's capture stream from the caller's with an
//! event (it joins the capture), runs the job with every stage on that one stream and no
//! host wait for the device (device-local ranks exchange events instead of waiting), and
//! joins the capture stream back into the caller's stream once the work is recorded.
//! Scratch comes from the communicator's arena on both paths, so after one uncaptured
//! call of a shape the captured call allocates nothing and the graph's addresses stay
//! valid while the communicator lives.

#![forbid(unsafe_code)]

use super::{Comm, Submitted, Work};
use crate::device::direct::{self, Scope};
use crate::device::{DevAddr, DevEvent, DevStream, Device};
use crate::error::{Error, Result};
use crate::runtime::ordered::Release;
use crate::runtime::request::Request;
use crate::runtime::CommCore;
use std::rc::Rc;
use std::sync::Arc;

/// What a stream-ordered call carries to its job.
pub(super) struct Ordered {
    ev_in: Arc<dyn DevEvent>,
    _release: Release,
}

impl Ordered {
    /// Before the collective: the caller's earlier work, waited for on the host (the
    /// watchdog: past the communicator's timeout the call fails instead of waiting).
    pub(super) fn before(&self, c: &CommCore) -> Result<()> {
        crate::device::wait_event(
            self.ev_in.as_ref(),
            c.timeout(),
            "the work queued on the caller's stream before a stream-ordered collective",
        )
    }
}

impl Comm {
    /// The failure that aborted this communicator after its call returned (a
    /// stream-ordered or queued collective that failed while running), if any: as
    /// `ncclCommGetAsyncError`.
    pub fn async_error(&self) -> Option<Error> {
        self.0.async_error()
    }

    /// Stream-ordered submit (NCCL semantics, see [`self`]): `req`'s buffers are device
    /// memory of this communicator's device and `stream` a stream of that device. Returns
    /// at once with the call's [`Work`] (complete when the collective is); work enqueued
    /// on `stream` after this call sees the results. The buffers belong to strata until
    /// the work completes (do not free or reuse them before `stream` passes the call or
    /// the `Work` completes). Inside a group the call runs when the group ends, and
    /// `stream` waits for it all the same. Errors in the arguments are returned here and
    /// nothing is enqueued; later failures as [`Comm::submit`]'s.
    ///
    /// On a stream being captured into a graph the call is recorded into the capture
    /// (the capturable path, see [`self`]) and returns once recorded.
    pub fn enqueue(&self, req: Request, stream: &Arc<dyn DevStream>) -> Result<Work> {
        self.enqueue_on(req, Rc::new(stream.clone()))
    }

    /// [`Comm::enqueue`] for any [`CallerStream`] (the C ABI passes its raw handles).
    pub fn enqueue_on(&self, req: Request, stream: Rc<dyn CallerStream>) -> Result<Work> {
        let core = &self.0;
        core.alive()?;
        let dev = stream.device();
        let mine = self.device().ok_or_else(|| {
            Error::InvalidUsage(format!(
                "stream-ordered calls need a device transport (nccl, rccl, cuda-local, \
                 host-local); this communicator's is {}",
                self.transport_kind().name()
            ))
        })?;
        if mine.api() != dev.api() || mine.ordinal() != dev.ordinal() {
            return Err(Error::InvalidArgument(format!(
                "the stream is on {} device {}, the communicator runs on {} device {}",
                dev.api().name(),
                dev.ordinal(),
                mine.api().name(),
                mine.ordinal()
            )));
        }
        let mut host = false;
        req.op
            .for_each_buffer(&mut |b| host |= !b.is_empty() && b.device().is_none());
        if host {
            return Err(Error::InvalidArgument(format!(
                "{}: a stream-ordered call takes device buffers of the communicator's device",
                req.op.name()
            )));
        }
        let signal = core.signal(&mine)?;
        if stream.is_capturing()? {
            return self.enqueue_captured(req, stream, &signal);
        }
        let ev_in = stream.record()?;
        let release = signal.next()?;
        // The caller's stream waits first: should the submission fail, dropping the
        // release writes the word at once. Inside a group: when the outermost group
        // ends, so that a later call's event never covers an earlier call's wait (which
        // would deadlock one thread driving several ranks on one stream).
        let (word, n) = (signal.addr(), release.seq());
        let st = stream.clone();
        crate::runtime::group::after_group(move || st.wait_value(word, n))?;
        let ordered = Ordered {
            ev_in,
            _release: release,
        };
        // Scratch from the communicator's arena (zeroed on the device's private stream).
        let sc = Scope::new(signal.arena(), None);
        match direct::scope(Some(sc), || self.submit_as(req, false, Some(ordered)))? {
            Submitted::Queued(w) => Ok(w),
            Submitted::Ran(r) => Ok(Work::ready(r)),
        }
    }

    /// The capturable path: fork the communicator's capture stream from the caller's
    /// (it joins the capture), enqueue every stage on it with no host wait, and join it
    /// back into the caller's stream once enqueued (inside a group: at the group's end).
    fn enqueue_captured(
        &self,
        req: Request,
        stream: Rc<dyn CallerStream>,
        signal: &Arc<crate::runtime::ordered::Signal>,
    ) -> Result<Work> {
        let cs = signal.capture_stream().clone();
        cs.wait_event(stream.record()?.as_ref())?;
        let sc = Scope::new(signal.arena(), Some(cs.clone()));
        let work = match direct::scope(Some(sc), || self.submit_as(req, true, None)) {
            Ok(Submitted::Queued(w)) => w,
            Ok(Submitted::Ran(r)) => Work::ready(r),
            Err(e) => Work::ready(Err(e)),
        };
        let w = work.clone();
        crate::runtime::group::after_group(move || {
            let r = w.wait();
            // Joined back even after a failure, so the capture can end.
            let joined = cs.record().and_then(|ev| stream.wait_event(ev.as_ref()));
            r.and(joined)
        })?;
        Ok(work)
    }
}

/// The caller's stream of a stream-ordered call, as the call uses it: an
/// `Arc<dyn DevStream>` from Rust, a raw `cudaStream_t` / `hipStream_t` from C.
pub trait CallerStream {
    /// Its device.
    fn device(&self) -> Arc<dyn Device>;
    /// An event after the work enqueued on it so far.
    fn record(&self) -> Result<Arc<dyn DevEvent>>;
    /// True while it is being captured into a graph.
    fn is_capturing(&self) -> Result<bool>;
    /// Make it wait (on the device) for `ev`.
    fn wait_event(&self, ev: &dyn DevEvent) -> Result<()>;
    /// Make it wait (on the device) until the 8-byte word at `word` is >= `n`.
    fn wait_value(&self, word: DevAddr, n: u64) -> Result<()>;
}

impl CallerStream for Arc<dyn DevStream> {
    fn device(&self) -> Arc<dyn Device> {
        DevStream::device(self.as_ref())
    }
    fn record(&self) -> Result<Arc<dyn DevEvent>> {
        DevStream::record(self.as_ref())
    }
    fn is_capturing(&self) -> Result<bool> {
        DevStream::is_capturing(self.as_ref())
    }
    fn wait_event(&self, ev: &dyn DevEvent) -> Result<()> {
        DevStream::wait_event(self.as_ref(), ev)
    }
    fn wait_value(&self, word: DevAddr, n: u64) -> Result<()> {
        DevStream::wait_value(self.as_ref(), word, n)
    }
}
