//! The watchdog of launched collectives (as PyTorch's NCCL watchdog): a launched call's
//! end event is handed to the device layer's watcher ([`crate::device::watch`]), which
//! queries it, never waits for a stream. When the event passes the call's [`Work`]
//! completes; when it reports a device error, when the communicator reports an
//! asynchronous error ([`crate::transport::gpu::GpuTransport::probe`]), or when the call
//! is still running past the communicator's timeout, the `Work` fails, the error is kept
//! for `Comm::async_error` / `strataCommGetAsyncError`, and the communicator is aborted
//! (an abort never frees a vendor communicator a call is inside: see the vendor
//! transport).

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
    what: String,
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
