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

#![forbid(unsafe_code)]

use super::{Comm, Submitted, Work};
use crate::device::{DevAddr, DevEvent, DevStream};
use crate::error::{Error, Result};
use crate::runtime::ordered::Release;
use crate::runtime::request::Request;
use crate::runtime::CommCore;
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
    pub fn enqueue(&self, req: Request, stream: &Arc<dyn DevStream>) -> Result<Work> {
        let ev_in = stream.record()?;
        let s = stream.clone();
        self.enqueue_after(req, &stream.device(), ev_in, move |word, n| {
            s.wait_value(word, n)
        })
    }

    /// The body of [`Comm::enqueue`] for callers holding a runtime stream handle (the C
    /// ABI): `ev_in` was recorded on the caller's stream at the call, `dev` is that
    /// stream's device, and `wait(word, n)` enqueues on the caller's stream a wait for
    /// the 8-byte word at `word` to reach `n` (inside a group: when the outermost group
    /// ends, so that a later call's event never covers an earlier call's wait, which
    /// would deadlock one thread driving several ranks on one stream).
    pub fn enqueue_after(
        &self,
        req: Request,
        dev: &Arc<dyn crate::device::Device>,
        ev_in: Arc<dyn DevEvent>,
        wait: impl FnOnce(DevAddr, u64) -> Result<()> + 'static,
    ) -> Result<Work> {
        let core = &self.0;
        core.alive()?;
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
        let release = signal.next()?;
        // The caller's stream waits first: should the submission fail, dropping the
        // release writes the word at once.
        let (word, n) = (signal.addr(), release.seq());
        crate::runtime::group::after_group(move || wait(word, n))?;
        let ordered = Ordered {
            ev_in,
            _release: release,
        };
        match self.submit_as(req, false, Some(ordered))? {
            Submitted::Queued(w) => Ok(w),
            Submitted::Ran(r) => Ok(Work::ready(r)),
        }
    }
}
