//! Stream-ordered calls on device transports, the front's side (NCCL's semantics): a
//! call names the caller's stream and returns once every stage is enqueued; on the
//! device, the collective runs after the work queued on that stream before the call, and
//! the work queued on it after the call runs after the collective.
//!
//! Here: the stream-ordered entries ([`Comm::enqueue`], [`Comm::enqueue_on`],
//! [`Comm::enqueue_checked`]), what they check besides the arguments (the device, the
//! stream's device, device buffers), and the algorithm's side of a launch
//! ([`launch::Algorithm`]: the selection of the fast path, the algorithm's stages, the
//! `Avg` division). The launch itself (fork, stages on the launch stream, join, end
//! event, watchdog; the fast path) is the runtime's: [`crate::runtime::launch`].

#![forbid(unsafe_code)]

use super::{Comm, How, Submitted, Work};
use crate::device::direct::Scope;
use crate::device::{DevStream, Device};
use crate::error::{Error, Result};
use crate::runtime::launch;
pub use crate::runtime::launch::CallerStream;
use crate::runtime::ordered::Launcher;
use crate::runtime::request::{Checked, Op, Request};
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

    /// A blocking call's wait for its launched work ([`Comm::call`]): the host waits for
    /// the end event itself, not for the watchdog's next look at it, then makes the
    /// checks the watchdog makes when an event passes (an abort meanwhile, the
    /// communicator's asynchronous error). The watchdog still completes the `Work`.
    pub(super) fn wait_launched(&self, w: &Work) -> Result<()> {
        let core = &self.0;
        let Some(ev) = w.event().filter(|_| !w.is_done()) else {
            return w.wait();
        };
        crate::device::wait_event(ev.as_ref(), core.timeout(), "a blocking launched call")?;
        crate::runtime::watchdog::passed(core)
    }

    /// [`Comm::enqueue`] for any [`CallerStream`] (the C ABI passes its raw handles).
    pub fn enqueue_on(&self, req: Request, stream: Rc<dyn CallerStream>) -> Result<Work> {
        let mine = self.ordered_on(&req, stream.as_ref())?;
        let req = self.front(req)?;
        self.launch(req, &mine, Some(stream))
    }

    /// [`Comm::enqueue_on`] of a request checked already ([`Comm::submit_checked`]).
    pub fn enqueue_checked(&self, req: Checked, stream: Rc<dyn CallerStream>) -> Result<Work> {
        let mine = self.ordered_on(req.request(), stream.as_ref())?;
        let req = self.0.note(req.on(self.rank(), self.size()))?;
        self.launch(req, &mine, Some(stream))
    }

    /// What a stream-ordered call needs besides its arguments' checks: a live
    /// communicator on a device transport, `stream` on its device and device buffers.
    /// Its device.
    fn ordered_on(&self, req: &Request, stream: &dyn CallerStream) -> Result<Arc<dyn Device>> {
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
        Ok(mine)
    }

    /// The launch of a checked request ([`crate::runtime::launch`]), with this
    /// communicator's algorithm side.
    pub(super) fn launch(
        &self,
        req: Checked,
        dev: &Arc<dyn Device>,
        caller: Option<Rc<dyn CallerStream>>,
    ) -> Result<Work> {
        launch::launch(&self.0, req, dev, caller, self)
    }
}

impl launch::Algorithm for &Comm {
    fn one_call(&self, req: &Request) -> bool {
        let core = &self.0;
        core.transport().gpu().is_some_and(|g| g.any_stream())
            && launch::one_call_op(&req.op)
            && req.deps.iter().all(|d| d.event().is_some() || d.is_done())
            && crate::algo::select::choose_algo(core, req) == crate::kinds::Algo::Ring
    }

    fn stages(&self, req: Checked, l: &Arc<Launcher>, sc: Scope) -> Result<Work> {
        Ok(match self.submit_as(req, How::Launch(l.clone(), sc))? {
            Submitted::Queued(w) => w,
            Submitted::Ran(r) => Work::ready(r),
        })
    }

    fn divide_avg(&self, op: &Op, dtype: crate::dtype::DataType, sc: &Scope) -> Result<()> {
        crate::algo::divide_avg(&self.0.launched(sc.clone()), op, dtype)
    }
}
