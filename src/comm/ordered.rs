//! Launched collectives on device transports (NCCL's semantics, NCCL's way): a call
//! names the caller's stream and returns once every stage is enqueued; on the device,
//! the collective runs after the work queued on that stream before the call, and the
//! work queued on it after the call runs after the collective.
//!
//! **One launch path** (the only one for device buffers; contract "launch-only" of the
//! architecture): at the call, on the calling thread,
//! 1. the communicator's device is made current (the caller's is restored on return);
//! 2. the communicator's launch stream ([`crate::runtime::ordered::Launcher`]) waits for
//!    an event recorded on the caller's stream (fork);
//! 3. the algorithm runs on this thread with every stage enqueued on the launch stream:
//!    vendor calls, copies, kernels, the `Avg` division, HO-Ring's rings, qgZ's hops,
//!    the sub-communicators' calls included, in program order (the same on every
//!    rank), grouped where the algorithm groups them; in-process device ranks exchange
//!    events, never wait for each other's streams;
//! 4. an event recorded on the launch stream after the last stage is what the caller's
//!    stream waits for (join), what a dependent call waits for ([`Request::after`] with
//!    this call's [`Work`]), and what the watchdog ([`crate::runtime::watchdog`])
//!    queries to complete the `Work`, or to fail it and abort the communicator past the
//!    timeout.
//!
//! No thread of strata waits on the host for the device between the call's entry and
//! its return ([`crate::device::waits`] counts any that would; the host-local tests
//! assert none). A stream being captured into a graph takes the same path (the launch
//! stream joins the capture through the fork event and leaves it through the join);
//! the captured call's `Work` is complete once recorded, and failures of a replay
//! surface through [`Comm::async_error`].
//!
//! Scratch comes from the communicator's arena ([`crate::device::direct`]): a block is
//! held while the call is enqueued and reused by the next call on the same launch
//! stream, so a repeated call allocates nothing and a graph's addresses stay valid.

#![forbid(unsafe_code)]

use super::{Comm, How, Submitted, Work};
use crate::device::direct::{self, Scope};
use crate::device::{waits, DevEvent, DevStream, Device};
use crate::error::{Error, Result};
use crate::runtime::request::Request;
use std::rc::Rc;
use std::sync::Arc;

impl Comm {
    /// The failure that aborted this communicator after its call returned (a launched
    /// or queued collective that failed while running), if any: as
    /// `ncclCommGetAsyncError`.
    pub fn async_error(&self) -> Option<Error> {
        self.0.async_error()
    }

    /// Stream-ordered submit (NCCL semantics, see [`self`]): `req`'s buffers are device
    /// memory of this communicator's device and `stream` a stream of that device. Returns
    /// once enqueued with the call's [`Work`] (complete when the collective is, as the
    /// watchdog observes); work enqueued on `stream` after this call sees the results.
    /// The buffers belong to strata until the work completes (do not free or reuse them
    /// before `stream` passes the call or the `Work` completes). Inside a group the call
    /// is enqueued when the outermost group ends, and `stream` waits for it all the same.
    /// Errors in the arguments are returned here and nothing is enqueued; a failure
    /// while enqueueing or running (a dead peer, a device fault) completes the `Work`
    /// with the error and aborts the communicator.
    ///
    /// On a stream being captured into a graph the call is recorded into the capture.
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
        self.launch(req, &mine, Some(stream))
    }

    /// The one launch path (see [`self`]): `caller` is the stream the call is ordered
    /// on, `None` for [`Comm::submit`] / [`Comm::call`] on device buffers (ordered after
    /// this communicator's earlier launched calls and `req`'s dependencies only).
    pub(super) fn launch(
        &self,
        req: Request,
        dev: &Arc<dyn Device>,
        caller: Option<Rc<dyn CallerStream>>,
    ) -> Result<Work> {
        let core = &self.0;
        let _bound = dev.bind()?;
        let _mark = waits::launching();
        let l = core.note(core.launcher(dev))?;
        let ls = l.stream().clone();
        let capturing = match &caller {
            Some(s) => core.note(s.is_capturing())?,
            None => false,
        };
        // Fork: after the caller's earlier work, and after the calls this one depends
        // on (on the device when they were launched, on the host otherwise).
        let fork = (|| {
            if let Some(s) = &caller {
                ls.wait_event(s.record()?.as_ref())?;
            }
            for d in &req.deps {
                match d.event() {
                    Some(ev) => ls.wait_event(ev.as_ref())?,
                    None => d.wait()?,
                }
            }
            Ok(())
        })();
        core.note(fork)?;
        let what = format!("{} ({})", req.op.name(), req.dtype);
        // The call's buffers live until its end event passes: the request (and with it
        // the last handle on a buffer the caller gave away) is dropped once enqueued,
        // while the device still reads and writes them (PyTorch's record_stream).
        let mut held: Vec<crate::memory::Buffer> = Vec::new();
        req.op.for_each_buffer(&mut |b| held.push(b.clone()));
        let req = Request {
            deps: Vec::new(),
            ..req
        };
        let sc = Scope::launch(l.arena(), Some(ls.clone()), core.identity());
        let host = match direct::scope(Some(sc), || self.submit_as(req, How::Launch(l.clone()))) {
            Ok(Submitted::Queued(w)) => w,
            Ok(Submitted::Ran(r)) => Work::ready(r),
            Err(e) => return Err(e),
        };
        // The join, the end event and the watch: now, or when the outermost group ends
        // (its calls are enqueued then).
        let core = core.clone();
        let out = Work::pending();
        let user = out.clone();
        let dev = dev.clone();
        crate::runtime::group::after_group(move || {
            let _bound = dev.bind()?;
            let _mark = waits::launching();
            let r = host
                .wait_timeout(std::time::Duration::ZERO)
                .and_then(|done| {
                    if done {
                        Ok(())
                    } else {
                        Err(Error::Internal(
                            "a launched call was not enqueued by its group's end".into(),
                        ))
                    }
                });
            // Joined back even after a failure, so the caller's stream moves on and a
            // capture can end (the side streams were joined into the launch stream when
            // the call's stages were enqueued).
            let end = ls.record();
            let joined = match (&end, &caller) {
                (Ok(ev), Some(s)) => s.wait_event(ev.as_ref()),
                (Ok(_), None) => Ok(()),
                (Err(e), _) => Err(e.clone()),
            };
            let order = l.id();
            match (r.and(joined), end) {
                (Err(e), end) => {
                    // Stages enqueued before the failure may still run: the buffers
                    // live until they have.
                    if let Ok(ev) = end {
                        crate::device::watch::keep_until(ev, held);
                    }
                    core.fail(&e);
                    user.complete(Err(e.clone()));
                    Err(e)
                }
                (Ok(()), Ok(ev)) => {
                    if capturing {
                        // A graph's replays use the buffers: the caller keeps them.
                        user.complete(Ok(()));
                    } else {
                        user.set_event(ev.clone());
                        let keep = Box::new(held);
                        crate::runtime::watchdog::watch(ev, order, user, &core, what, keep);
                    }
                    Ok(())
                }
                (Ok(()), Err(e)) => Err(e),
            }
        })
        .map(|_| out.clone())
        .or_else(|e| {
            // A failure after the arguments were accepted: the Work carries it (the
            // communicator is aborted), as an asynchronous NCCL error would.
            if out.is_done() {
                Ok(out)
            } else {
                Err(e)
            }
        })
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
    /// The stream itself, to enqueue on (borrowed: never destroyed by strata).
    fn stream(&self) -> Result<Arc<dyn DevStream>>;
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
    fn stream(&self) -> Result<Arc<dyn DevStream>> {
        Ok(self.clone())
    }
}
