//! The watchdog of launched collectives (as PyTorch's NCCL watchdog): a launched call's
//! end event is handed to the device layer's watcher ([`crate::device::watch`]), which
//! queries it, never waits for a stream. When the event passes the call's [`Work`]
//! completes; when it reports a device error, when the communicator reports an
//! asynchronous error ([`crate::transport::gpu::GpuTransport::probe`]), or when the call
//! is still running past the communicator's timeout, the `Work` fails, the error is kept
//! for `Comm::async_error` / `strataCommGetAsyncError`, and the communicator is aborted
//! (an abort never frees a vendor communicator a call is inside: see the vendor
//! transport). A call whose event passes after its communicator was aborted, or while
//! the communicator reports an asynchronous error, fails too: an aborted NCCL kernel
//! returns early and its end event passes like a good one's, so passing alone proves
//! nothing then (the caller learns it from `wait()`, the next call and the async error,
//! never a success).

#![forbid(unsafe_code)]

use super::stream::Work;
use super::CommCore;
use crate::device::DevEvent;
use crate::error::Error;
use std::sync::Arc;

/// Watch `ev`, the end of the launched call `what` on `core` recorded on its launch
/// stream (`stream`: that stream's identity; its calls end in order): `work` completes
/// when it passes, or fails (and `core` is aborted) on a device error, an asynchronous
/// error or after `core`'s timeout. `keep` (the call's buffers) lives until then: the
/// device work enqueued before `ev` may still use them after every other handle is gone.
pub fn watch(
    ev: Arc<dyn DevEvent>,
    stream: u64,
    work: Work,
    core: &CommCore,
    what: impl std::fmt::Display + Send + 'static,
    keep: Box<dyn std::any::Any + Send>,
) {
    let probe_core = core.clone();
    let probe: crate::device::watch::Probe = Box::new(move || match probe_core.transport().gpu() {
        Some(g) => g.probe(),
        None => Ok(()),
    });
    let c = core.clone();
    let timeout = core.timeout();
    crate::device::watch::after(
        ev,
        Some(stream),
        Some(timeout),
        Some(probe),
        Box::new(move |r| {
            drop(keep);
            // Passed: still a failure when the communicator was aborted meanwhile or
            // reports an asynchronous error (the kernels of an aborted call end early).
            let r = r.and_then(|_| passed(&c));
            let r = r.map_err(|e| match e {
                Error::Remote(m) => Error::Remote(format!(
                    "launched {what}: {m} (a peer died or never joined, or the work queued \
                     before it on the caller's stream never finished)"
                )),
                other => other.in_collective(|| format!("launched {what}")),
            });
            if let Err(e) = &r {
                tracing::warn!(
                    rank = c.rank(),
                    "launched {what} failed, aborting the communicator: {e}"
                );
                c.fail(e);
                let _ = c.note::<()>(Err(e.clone()));
            }
            work.complete(r);
        }),
    );
}

/// What a launched call's end event passing still has to be checked against: an abort
/// of `core` meanwhile (the kernels of an aborted call end early, and their event passes
/// like a good one's) and the communicator's asynchronous error. The watchdog's check,
/// and a blocking call's after it waited for the event itself.
pub fn passed(core: &CommCore) -> crate::error::Result<()> {
    if core.was_aborted() {
        return Err(core.async_error().unwrap_or_else(|| {
            Error::Remote("the communicator was aborted before the call was seen complete".into())
        }));
    }
    match core.transport().gpu() {
        Some(g) => g.probe(),
        None => Ok(()),
    }
}
