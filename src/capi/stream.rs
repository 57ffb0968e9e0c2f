//! Host streams and events: the nonblocking C ABI of the host transports (local, mpi),
//! shaped as CUDA streams are for NCCL users.
//!
//! - `strataStreamCreate` makes a strata host stream. Passed as the `stream` argument of a
//!   collective on a host communicator it makes the call nonblocking: the call is checked
//!   (bad arguments fail at once, nothing queued), enqueued after everything enqueued
//!   on that stream before it, on any communicator, and returns. Calls on one stream run
//!   in the order they were made; calls on different streams (or without one) are
//!   ordered only by `strataStreamWaitEvent`.
//! - Completion: `strataStreamSynchronize` (wait for all), `strataStreamQuery`
//!   (`strataSuccess` when all completed, `strataInProgress` otherwise, never blocking),
//!   and events: `strataEventRecord(ev, stream)` marks the calls enqueued so far,
//!   `strataEventQuery` / `strataEventSynchronize` test or wait for them,
//!   `strataStreamWaitEvent(stream, ev)` makes later calls on `stream` wait for them.
//!   The first failure among the calls a synchronize or query (of a stream or an event)
//!   sees completed is its result, and is recorded on the failing call's communicator.
//! - Ownership: from the call until its completion has been observed (a synchronize or a
//!   successful query covering it), the buffers belong to strata: the caller must not
//!   write the send buffer, nor read or write the receive buffer, and must keep both
//!   allocated. strata reads and writes them in place, with no copies.
//! - Handles are registry keys, never dereferenced; a destroyed or foreign handle is an
//!   error, not a crash. Looking one up takes no process-wide lock ([`Slots`]). A value that is not a strata stream in a host collective's
//!   `stream` argument is ignored as before (the call blocks); a strata stream given to a
//!   GPU communicator is `strataInvalidArgument`.

use super::abi::*;
use super::boundary::{ffi_boundary, guard, write_out};
use super::registry::{store_error, Handle};
use super::slots::{Found, Slots};
use crate::comm::Work;
use crate::error::{Error, Result};
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// A call enqueued on a host stream whose completion nobody has observed yet.
struct Pending {
    work: Work,
    function: &'static str,
    handle: Arc<Handle>,
}

#[derive(Default)]
struct StreamState {
    /// What the next call waits for: the last call enqueued, and the events waited
    /// for since.
    tail: Vec<Work>,
    /// The group holding the stream's latest calls: (its number, the calls before it,
    /// its calls).
    open: Option<(u64, Vec<Work>, Vec<Work>)>,
    /// Calls not yet seen complete by a query or synchronize, in the order they were
    /// made, less those at the front that completed without an error
    /// ([`StreamState::prune`]).
    pending: Vec<Pending>,
}

impl StreamState {
    /// Drop the calls at the front that completed without an error: a query or a
    /// synchronize would find nothing to report for them. Without it a program that
    /// observes its calls through events alone (as `async_op=True` and the torch
    /// backend do) grew the list by one call per call, and every event record copied
    /// all of it. A failed call stays until observed; calls on one stream complete in
    /// order (each waits for the one before), so the front is where completed ones are.
    fn prune(&mut self) {
        let n = self
            .pending
            .iter()
            .take_while(|p| p.work.is_done() && p.work.wait_timeout(Duration::ZERO).is_ok())
            .count();
        self.pending.drain(..n);
    }
}

/// A strata host stream.
#[derive(Default)]
pub(crate) struct HostStream {
    state: Mutex<StreamState>,
}

/// A strata event: the calls of a stream at the time it was recorded.
#[derive(Default)]
struct HostEvent {
    /// `None` until recorded (an unrecorded event counts as complete, as in CUDA).
    works: Mutex<Option<Vec<Work>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Outcome of completed works: the first failure, recorded on its communicator.
fn first_failure(done: &[Pending]) -> Result<()> {
    let mut first = Ok(());
    for p in done {
        if let Err(e) = p.work.wait_timeout(Duration::ZERO).and_then(|ok| {
            if ok {
                Ok(())
            } else {
                Err(Error::Internal("a completed call reported running".into()))
            }
        }) {
            store_error(Some(&p.handle), &format!("{}: {e}", p.function));
            if first.is_ok() {
                first = Err(e);
            }
        }
    }
    first
}

impl HostStream {
    /// The dependencies of the next call.
    pub(crate) fn deps(&self) -> Vec<Work> {
        let mut s = lock(&self.state);
        let now = crate::comm::group::current_group();
        if let Some((g, base, _)) = &s.open {
            if now == Some(*g) {
                // Inside the group holding the stream's latest calls: they run together
                // when it ends, so a call waits for what came before the group (and the
                // events waited for since), never for a call of its own group.
                let mut d = base.clone();
                d.extend(s.tail.iter().cloned());
                return d;
            }
        }
        Self::close_group(&mut s);
        s.tail.clone()
    }

    /// The open group has ended: later calls wait for all of its calls.
    fn close_group(s: &mut StreamState) {
        if let Some((_, _, mut members)) = s.open.take() {
            members.append(&mut s.tail);
            s.tail = members;
        }
    }

    /// A call was enqueued: later calls wait for it (inside a group: calls after the
    /// group wait for all of the group's calls).
    pub(crate) fn push(&self, work: Work, function: &'static str, handle: Arc<Handle>) {
        let mut s = lock(&self.state);
        match crate::comm::group::current_group() {
            Some(g) => match &mut s.open {
                Some((og, _, members)) if *og == g => members.push(work.clone()),
                _ => {
                    Self::close_group(&mut s);
                    let base = std::mem::take(&mut s.tail);
                    s.open = Some((g, base, vec![work.clone()]));
                }
            },
            None => {
                s.open = None;
                s.tail = vec![work.clone()];
            }
        }
        s.prune();
        s.pending.push(Pending {
            work,
            function,
            handle,
        });
    }

    /// True when every call enqueued so far completed (their first failure otherwise).
    fn query(&self) -> Result<bool> {
        let mut s = lock(&self.state);
        if !s.pending.iter().all(|p| p.work.is_done()) {
            return Ok(false);
        }
        let done = std::mem::take(&mut s.pending);
        drop(s);
        first_failure(&done).map(|_| true)
    }

    /// Wait for every call enqueued so far; their first failure.
    fn synchronize(&self) -> Result<()> {
        let done = std::mem::take(&mut lock(&self.state).pending);
        for p in &done {
            // Failures are collected below; waiting here only blocks until done (each
            // call ends within its communicator's timeout, a dead peer included).
            let _ = p.work.wait();
        }
        first_failure(&done)
    }
}

/// Key spaces of the two registries (communicators use their own, see `register`).
const STREAM_BASE: usize = 0x6000_0000;
const EVENT_BASE: usize = 0x7000_0000;

/// Live streams or events behind their C handles: a [`Slots`] table (no process-wide
/// lock on a lookup, so a collective given a stream takes none either).
struct Table<T> {
    slots: Slots<T>,
    what: &'static str,
}

impl<T> Table<T> {
    fn insert(&self, v: T) -> Result<usize> {
        self.slots.insert(v, self.what)
    }

    /// The live object behind `p`; `Ok(None)` for a value this table never issued.
    fn get(&self, p: *mut c_void) -> Result<Option<Arc<T>>> {
        match self.slots.get(p as usize) {
            Found::Live(v) => Ok(Some(v)),
            Found::Gone => Err(Error::InvalidUsage(format!(
                "{} {:#x} was destroyed",
                self.what, p as usize
            ))),
            Found::Foreign => Ok(None),
        }
    }

    /// [`Table::get`] where the value must be one of ours.
    fn find(&self, p: *mut c_void) -> Result<Arc<T>> {
        if p.is_null() {
            return Err(Error::InvalidArgument(format!("{} is NULL", self.what)));
        }
        self.get(p)?.ok_or_else(|| {
            Error::InvalidArgument(format!("{:#x} is not a {}", p as usize, self.what))
        })
    }

    fn remove(&self, p: *mut c_void) -> Result<Arc<T>> {
        if p.is_null() {
            return Err(Error::InvalidArgument(format!("{} is NULL", self.what)));
        }
        match self.slots.remove(p as usize) {
            Found::Live(v) => Ok(v),
            Found::Gone => Err(Error::InvalidUsage(format!(
                "{} {:#x} was destroyed",
                self.what, p as usize
            ))),
            Found::Foreign => Err(Error::InvalidArgument(format!(
                "{:#x} is not a {}",
                p as usize, self.what
            ))),
        }
    }
}

static STREAMS: Table<HostStream> = Table {
    slots: Slots::new(STREAM_BASE),
    what: "strata stream",
};

static EVENTS: Table<HostEvent> = Table {
    slots: Slots::new(EVENT_BASE),
    what: "strata event",
};

/// The host stream `stream` names, `None` when it is not one (NULL, or a GPU stream);
/// a destroyed strata stream is `InvalidUsage`.
pub(crate) fn host_stream(stream: strataStream_t) -> Result<Option<Arc<HostStream>>> {
    if stream.is_null() {
        return Ok(None);
    }
    STREAMS.get(stream)
}

/// Opaque strata event (never defined: `strataEvent_t` values are registry keys).
pub struct strataEvent {
    _opaque: [u8; 0],
}

/// A strata event (`strataEventCreate`): marks the calls enqueued on a strata host
/// stream when it was recorded.
pub type strataEvent_t = *mut strataEvent;

/// Make a strata host stream (`*stream`): pass it as the `stream` argument of collectives
/// on host communicators (local, mpi) to make them nonblocking, in the order of the
/// calls. See `strataStreamSynchronize`, `strataStreamQuery` and the events. The buffers
/// of a call on it belong to strata until its completion has been observed.
///
/// # Safety
/// `stream` is NULL (`strataInvalidArgument`) or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn strataStreamCreate(stream: *mut strataStream_t) -> strataResult_t {
    ffi_boundary!("strataStreamCreate", std::ptr::null_mut(), {
        let key = STREAMS.insert(HostStream::default())?;
        // SAFETY: the caller's contract on `stream`.
        unsafe { write_out(stream, key as strataStream_t, "stream") }
    })
}

/// Wait for every call enqueued on `stream` (as `strataStreamSynchronize`), then release
/// it; later use of the handle is `strataInvalidUsage`. Returns the first failure among
/// those calls.
///
/// # Safety
/// None beyond passing a value (strata never dereferences it).
#[no_mangle]
pub unsafe extern "C" fn strataStreamDestroy(stream: strataStream_t) -> strataResult_t {
    ffi_boundary!("strataStreamDestroy", std::ptr::null_mut(), {
        STREAMS.remove(stream)?.synchronize()
    })
}

/// Block until every call enqueued on the strata stream so far has completed; the first
/// failure among them (also recorded on its communicator), else `strataSuccess`. The
/// buffers of those calls are the caller's again.
///
/// # Safety
/// None beyond passing a value (strata never dereferences it).
#[no_mangle]
pub unsafe extern "C" fn strataStreamSynchronize(stream: strataStream_t) -> strataResult_t {
    ffi_boundary!("strataStreamSynchronize", std::ptr::null_mut(), {
        STREAMS.find(stream)?.synchronize()
    })
}

/// Never blocks: `strataSuccess` when every call enqueued on the strata stream so far has
/// completed (their buffers are the caller's again), `strataInProgress` when one has not,
/// or the first failure among them.
///
/// # Safety
/// None beyond passing a value (strata never dereferences it).
#[no_mangle]
pub unsafe extern "C" fn strataStreamQuery(stream: strataStream_t) -> strataResult_t {
    guard_query("strataStreamQuery", || STREAMS.find(stream)?.query())
}

/// The body of a never-blocking query at the ABI: `strataInProgress` when `done` says
/// not yet, its error, or `strataSuccess`.
fn guard_query(name: &'static str, done: impl FnOnce() -> Result<bool>) -> strataResult_t {
    let mut finished = false;
    let f = &mut finished;
    let r = guard(name, std::ptr::null_mut(), move || {
        *f = done()?;
        Ok(())
    });
    if r == strataSuccess && !finished {
        strataInProgress
    } else {
        r
    }
}

/// Later calls on the strata stream `stream` start only after the calls `event` marks
/// (an event never recorded marks none).
///
/// # Safety
/// None beyond passing values (strata never dereferences them).
#[no_mangle]
pub unsafe extern "C" fn strataStreamWaitEvent(
    stream: strataStream_t,
    event: strataEvent_t,
) -> strataResult_t {
    ffi_boundary!("strataStreamWaitEvent", std::ptr::null_mut(), {
        let s = STREAMS.find(stream)?;
        let e = EVENTS.find(event.cast())?;
        let works = lock(&e.works).clone().unwrap_or_default();
        lock(&s.state).tail.extend(works);
        Ok(())
    })
}

/// Make a strata event (`*event`), not yet recorded.
///
/// # Safety
/// `event` is NULL (`strataInvalidArgument`) or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn strataEventCreate(event: *mut strataEvent_t) -> strataResult_t {
    ffi_boundary!("strataEventCreate", std::ptr::null_mut(), {
        let key = EVENTS.insert(HostEvent::default())?;
        // SAFETY: the caller's contract on `event`.
        unsafe { write_out(event, key as strataEvent_t, "event") }
    })
}

/// Release `event` (the calls it marks go on); later use is `strataInvalidUsage`.
///
/// # Safety
/// None beyond passing a value (strata never dereferences it).
#[no_mangle]
pub unsafe extern "C" fn strataEventDestroy(event: strataEvent_t) -> strataResult_t {
    ffi_boundary!("strataEventDestroy", std::ptr::null_mut(), {
        EVENTS.remove(event.cast()).map(|_| ())
    })
}

/// Mark in `event` the calls enqueued on the strata stream `stream` so far (replacing
/// what it marked before).
///
/// # Safety
/// None beyond passing values (strata never dereferences them).
#[no_mangle]
pub unsafe extern "C" fn strataEventRecord(
    event: strataEvent_t,
    stream: strataStream_t,
) -> strataResult_t {
    ffi_boundary!("strataEventRecord", std::ptr::null_mut(), {
        let e = EVENTS.find(event.cast())?;
        let s = STREAMS.find(stream)?;
        let mut st = lock(&s.state);
        st.prune();
        // The calls not yet observed, and what the next call would wait for (the
        // events waited for included).
        let marked = st
            .pending
            .iter()
            .map(|p| p.work.clone())
            .chain(st.tail.iter().cloned())
            .collect();
        drop(st);
        *lock(&e.works) = Some(marked);
        Ok(())
    })
}

/// Never blocks: `strataSuccess` when the calls `event` marks have completed (or it was
/// never recorded), `strataInProgress` when one has not, or the first failure among them.
///
/// # Safety
/// None beyond passing a value (strata never dereferences it).
#[no_mangle]
pub unsafe extern "C" fn strataEventQuery(event: strataEvent_t) -> strataResult_t {
    guard_query("strataEventQuery", || {
        let e = EVENTS.find(event.cast())?;
        let works = lock(&e.works).clone().unwrap_or_default();
        let done = works.iter().all(Work::is_done);
        if done {
            for w in &works {
                w.wait_timeout(Duration::ZERO)?;
            }
        }
        Ok(done)
    })
}

/// Block until the calls `event` marks have completed; the first failure among them.
///
/// # Safety
/// None beyond passing a value (strata never dereferences it).
#[no_mangle]
pub unsafe extern "C" fn strataEventSynchronize(event: strataEvent_t) -> strataResult_t {
    ffi_boundary!("strataEventSynchronize", std::ptr::null_mut(), {
        let e = EVENTS.find(event.cast())?;
        let works = lock(&e.works).clone().unwrap_or_default();
        let mut first = Ok(());
        for w in &works {
            let r = w.wait();
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
}

// In a file of its own: the test drives a collective through its export
// (`coll.rs`, which sits above this file), so it is not part of this file's imports.
#[cfg(test)]
mod tests;
