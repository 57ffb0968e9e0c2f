//! The launch of collectives on device transports (NCCL's semantics, NCCL's way): a call
//! names the caller's stream and returns once every stage is enqueued; on the device,
//! the collective runs after the work queued on that stream before the call, and the
//! work queued on it after the call runs after the collective.
//!
//! **One launch path** (the only one for device buffers; contract "launch-only" of the
//! architecture): at the call, on the calling thread,
//! 1. the communicator's device is made current (the caller's is restored on return);
//! 2. the communicator's launch stream ([`super::ordered::Launcher`]) waits for
//!    an event recorded on the caller's stream (fork);
//! 3. the algorithm runs on this thread with every stage enqueued on the launch stream:
//!    vendor calls, copies, kernels, the `Avg` division, HO-Ring's rings, qgZ's hops,
//!    the sub-communicators' calls included, in program order (the same on every
//!    rank), grouped where the algorithm groups them; in-process device ranks exchange
//!    events, never wait for each other's streams;
//! 4. an event recorded on the launch stream after the last stage is what the caller's
//!    stream waits for (join), what a dependent call waits for (`Request::after` with
//!    this call's [`Work`]), and what the watchdog ([`super::watchdog`])
//!    queries to complete the `Work`, or to fail it and abort the communicator past the
//!    timeout.
//!
//! No thread of strata waits on the host for the device between the call's entry and
//! its return ([`crate::device::waits`] counts any that would; the host-local tests
//! assert none). A stream being captured into a graph takes the same path (the launch
//! stream joins the capture through the fork event and leaves it through the join);
//! the captured call's `Work` is complete once recorded, and failures of a replay
//! surface through `Comm::async_error`.
//!
//! Scratch comes from the communicator's arena ([`crate::device::direct`]): a block is
//! held while the call is enqueued and reused by the next call on the same launch
//! stream, so a repeated call allocates nothing and a graph's addresses stay valid.
//!
//! **The fast path** (contract "launch cost": a collective that is one vendor call is
//! that call, as NCCL's own): a `ring` collective on a transport that may enqueue on any
//! stream, not captured, skips 2-4: the transport's call goes on the caller's stream (on
//! the launch stream for `submit`/`call`), then one pooled end event, which the
//! watchdog queries; grouped, the calls of one group on one stream share that event.
//! `Avg` is the library's own (`ncclAvg`) where it has one. A communicator's launched
//! calls still run in launch order on the device: a call on another stream than the
//! latest one waits for that one's end event ([`super::ordered::Launcher`]).

//! **Who calls what** (one way down): the front ([`crate::comm`]) checks the request
//! once (a [`Checked`] value, the only form [`launch`] takes), and gives the launch
//! what only it knows as an [`Algorithm`] (its selection, the algorithm's stages, the
//! `Avg` division); the launch orders the streams, runs the stages or the one
//! transport call ([`super::native`]) with the call's scope, and hands the end event to
//! the watchdog ([`super::watchdog`]).

#![forbid(unsafe_code)]

use super::ordered::Launcher;
use super::request::{Checked, Op, Request};
use super::stream::Work;
use super::CommCore;
use crate::device::direct::{Launched, Scope};
use crate::device::{waits, DevEvent, DevStream, Device};
use crate::error::{Error, Result};
use std::rc::Rc;
use std::sync::Arc;

/// What the front gives a launch: the algorithm's side of the call, which the runtime
/// does not choose (the front, [`crate::comm`], implements it over [`crate::algo`]).
pub trait Algorithm {
    /// True when `req` runs as one call of a transport that may enqueue on any stream
    /// (the fast path's condition, grouped or not).
    fn one_call(&self, req: &Request) -> bool;
    /// Run `req`'s algorithm within the call's launch context `sc` (every stage enqueued
    /// on its stream, scratch from its arena), or hold it in the thread's group: the
    /// host side's [`Work`].
    fn stages(&self, req: Checked, l: &Arc<Launcher>, sc: Scope) -> Result<Work>;
    /// After the fast path's one call (in `sc`): divide an `Avg` result where the
    /// library has no mean of its own.
    fn divide_avg(&self, op: &Op, dtype: crate::dtype::DataType, sc: &Scope) -> Result<()>;
}

/// The one launch path (see [`self`]): `caller` is the stream the call is ordered on,
/// `None` for `Comm::submit` / `Comm::call` on device buffers (ordered after this
/// communicator's earlier launched calls and `req`'s dependencies only).
pub fn launch(
    core: &CommCore,
    mut req: Checked,
    dev: &Arc<dyn Device>,
    caller: Option<Rc<dyn CallerStream>>,
    algo: impl Algorithm,
) -> Result<Work> {
    let _bound = dev.bind()?;
    let _mark = waits::launching();
    let l = core.note(core.launcher(dev))?;
    let ls = l.stream().clone();
    let capturing = match &caller {
        Some(s) => core.note(s.is_capturing())?,
        None => false,
    };
    // The fast path: on the caller's stream, or without one (`submit`, `call`) on the
    // launch stream, which then plays the caller's part.
    if !capturing && !super::group::in_group() && algo.one_call(req.request()) {
        let on: Rc<dyn CallerStream> = match &caller {
            Some(s) => s.clone(),
            None => Rc::new(ls.clone()),
        };
        return run_direct(core, req, &on, &l, &algo);
    }
    // A grouped one-call collective: its vendor call goes on the caller's stream
    // inside the group (as NCCL's grouped calls do), no fork or join; the group's
    // calls on one stream share one end event.
    let grouped_on = match &caller {
        Some(s) if !capturing && super::group::in_group() && algo.one_call(req.request()) => {
            Some(core.note(s.stream())?)
        }
        _ => None,
    };
    let generation = super::group::current_group().unwrap_or(0);
    let target = grouped_on.clone().unwrap_or_else(|| ls.clone());
    // Fork: after the caller's earlier work, and after the calls this one depends
    // on (on the device when they were launched, on the host otherwise).
    let fork = (|| {
        if let (Some(s), None) = (&caller, &grouped_on) {
            ls.wait_event(s.record()?.as_ref())?;
        }
        // A graph's replays are ordered by the caller's stream alone: a capture
        // neither waits for an event recorded outside it (that invalidates it) nor
        // leaves one for later calls.
        if !capturing {
            l.follow(&target)?;
        }
        for d in &req.request().deps {
            match d.event() {
                Some(ev) => target.wait_event(ev.as_ref())?,
                None => d.wait()?,
            }
        }
        Ok(())
    })();
    core.note(fork)?;
    let what = Called(req.request().op.name(), req.request().dtype);
    // The call's buffers live until its end event passes: the request (and with it
    // the last handle on a buffer the caller gave away) is dropped once enqueued,
    // while the device still reads and writes them (PyTorch's record_stream).
    let mut held: Vec<crate::memory::Buffer> = Vec::new();
    req.request()
        .op
        .for_each_buffer(&mut |b| held.push(b.clone()));
    drop(req.take_deps());
    let sc = Scope::launch(l.arena(), target.clone(), core.identity());
    let host = algo.stages(req, &l, sc)?;
    // The join, the end event and the watch: now, or when the outermost group ends
    // (its calls are enqueued then).
    let core = core.clone();
    let out = Work::pending();
    let user = out.clone();
    let dev = dev.clone();
    super::group::after_group(move || {
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
        let (end, joined, order) = match &grouped_on {
            Some(ws) => (
                group_end_event(generation, ws),
                Ok(()),
                ws.raw() as usize as u64,
            ),
            None => {
                let end = ls.record();
                let joined = match (&end, &caller) {
                    (Ok(ev), Some(s)) => s.wait_event(ev.as_ref()),
                    (Ok(_), None) => Ok(()),
                    (Err(e), _) => Err(e.clone()),
                };
                (end, joined, l.id())
            }
        };
        if let (Ok(ev), false) = (&end, capturing) {
            l.ended(grouped_on.as_ref().unwrap_or(&ls), ev);
        }
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
                    super::watchdog::watch(ev, order, user, &core, what, keep);
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

/// The fast path (contract "launch cost"): a collective that is one call of a
/// transport that may enqueue on any stream ([`GpuTransport::any_stream`]: `nccl`,
/// `rccl`, and the in-process device transports) is that call on the caller's stream,
/// followed by one pooled end event for the watchdog: no launch stream, no fork or
/// join, no group, no job. An `Avg` is the library's own (`ncclAvg`) where it has one,
/// else the division kernel after the call on the same stream. Taken when
/// [`Algorithm::one_call`] holds and the call is neither grouped nor captured.
///
/// [`GpuTransport::any_stream`]: crate::transport::gpu::GpuTransport::any_stream
fn run_direct(
    core: &CommCore,
    req: Checked,
    caller: &Rc<dyn CallerStream>,
    l: &Arc<Launcher>,
    algo: &impl Algorithm,
) -> Result<Work> {
    let Request {
        op, dtype, deps, ..
    } = req.into_request();
    let name = op.name();
    let stream = core.note(caller.stream())?;
    let sc = Scope::launch(l.arena(), stream.clone(), core.identity());
    let to = core.timeout();
    let enqueued = (|| {
        core.still_running()?;
        l.follow(&stream)?;
        for d in &deps {
            match d.event() {
                Some(ev) => stream.wait_event(ev.as_ref())?,
                None => d.wait()?,
            }
        }
        let t = core.transport();
        let at = Launched {
            scope: &sc,
            stream: &stream,
        };
        if !super::native::run_device_mean(t.as_ref(), at, &op, dtype, to)? {
            algo.divide_avg(&op, dtype, &sc)?;
        }
        let ev = stream.record()?;
        l.ended(&stream, &ev);
        Ok::<_, Error>(ev)
    })();
    let ev = match enqueued {
        Ok(ev) => ev,
        Err(e) => {
            // As a failure of the general path after its checks: the communicator is
            // aborted and the Work carries the error.
            let e = e.in_collective(|| format!("launched {name} ({dtype})"));
            core.fail(&e);
            let _ = core.note::<()>(Err(e.clone()));
            return Ok(Work::ready(Err(e)));
        }
    };
    let work = Work::pending();
    work.set_event(ev.clone());
    // The buffers (and the call's scope: its arena lease, the borrowed stream) live
    // until the device passed the call.
    let keep = Box::new((op, sc));
    super::watchdog::watch(
        ev,
        stream.raw() as usize as u64,
        work.clone(),
        core,
        Called(name, dtype),
        keep,
    );
    Ok(work)
}

/// The name of a launched call for its watchdog's messages, formatted only when one is
/// written.
struct Called(&'static str, crate::dtype::DataType);

impl std::fmt::Display for Called {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.0, self.1)
    }
}

/// True for the ops a launched call may run as the transport's one call on the caller's
/// stream: the collectives (point-to-point calls pair with a peer's call and keep the
/// launch stream; coalesced calls are packed first).
pub fn one_call_op(op: &Op) -> bool {
    matches!(
        op,
        Op::AllGather { .. }
            | Op::ReduceScatter { .. }
            | Op::AllReduce { .. }
            | Op::AllToAll { .. }
            | Op::Broadcast { .. }
    )
}

thread_local! {
    /// The end event of the last group's calls on one stream: (group, stream, event).
    /// Per thread because groups are (NCCL's `ncclGroupStart`/`End` are per thread, as
    /// [`super::group`]'s depth and pending calls): this is part of the thread's open
    /// group, read by its calls at its end; it carries no single call's state.
    static GROUP_END: std::cell::RefCell<Option<(u64, usize, Arc<dyn DevEvent>)>> =
        const { std::cell::RefCell::new(None) };
}

/// The event after group `generation`'s work on `ws`, recorded once for all of that
/// group's calls on the stream (every call of the group is enqueued before the first
/// asks for it: the group's end runs its calls first).
fn group_end_event(generation: u64, ws: &Arc<dyn DevStream>) -> Result<Arc<dyn DevEvent>> {
    let raw = ws.raw() as usize;
    if let Some(ev) = GROUP_END.with(|g| {
        g.borrow()
            .as_ref()
            .filter(|(n, r, _)| *n == generation && *r == raw)
            .map(|(_, _, ev)| ev.clone())
    }) {
        return Ok(ev);
    }
    let ev = ws.record()?;
    GROUP_END.with(|g| *g.borrow_mut() = Some((generation, raw, ev.clone())));
    Ok(ev)
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
