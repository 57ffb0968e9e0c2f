//! `ncclGroupStart`, `ncclGroupEnd`, `ncclGroupSimulateEnd`.
//!
//! On strata's CPU device a group is this thread's (groups are per thread, as NCCL's):
//! `ncclGroupStart` counts the depth; calls made inside it are checked for what this
//! library itself decides (NULL communicator, fp8, unknown or foreign ops) and recorded
//! (a small copy of their arguments, no allocation once the thread's list has grown),
//! and return at once. At the outermost `ncclGroupEnd`:
//! 1. communicator calls held by the group (init, split, shrink: one thread may create
//!    every rank of a world inside a group, as with NCCL) run concurrently, one thread
//!    each, and their handles are written;
//! 2. the recorded calls are handed to strata in call order inside one strata group
//!    (`strataGroupStart` / `strataGroupEnd`), which runs them all: a thread can drive
//!    every rank of a local world, and sends pair with receives. They have completed
//!    (results in the buffers) when `ncclGroupEnd` returns. strata's own checks (counts,
//!    aliasing, peers) report here, at the end, as the group's result.
//!
//! `ncclGroupSimulateEnd` ends the group as NCCL does with a `simInfo`: the held
//! communicator calls run, the recorded operations are NOT executed (NCCL plans them and
//! launches nothing), and `simInfo->estimatedTime` is set to strata's model of the
//! group's time in microseconds (the links of the communicator's topology, the
//! algorithm each call would run). The struct is checked (`magic` of `NCCL_SIM_INFO_INITIALIZER`) and written
//! only as far as its `size`.
//!
//! With the real library every function is passed to it, and counted per thread by
//! `join.rs`, which holds and replays what a group routes to strata.

use crate::abi::*;
use crate::collectives::{execute, Call};
use crate::errors::{fail, guard, strata_result};
use crate::passthrough::pass;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// A communicator call held for the group's end (it writes its own output handle).
pub type Held = Box<dyn FnOnce() -> ncclResult_t + Send>;

thread_local! {
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    static CALLS: RefCell<Vec<Call>> = const { RefCell::new(Vec::new()) };
    static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
}

/// How many threads have a group open: while none has, [`in_group`] is one load of a
/// line no call writes (a thread-local costs `__tls_get_addr` in a loaded library).
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// True inside a group on this thread. (A thread's own increment of [`OPEN`] is seen by
/// that thread, so a 0 there means no group here.)
#[inline(always)]
pub fn in_group() -> bool {
    OPEN.load(Relaxed) != 0 && depth_here()
}

/// This thread's group depth is not 0 (out of line: kept off the path where no group
/// is open, which the compiler would otherwise enter early).
#[inline(never)]
fn depth_here() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

/// Record a call for the group's end.
pub fn record(c: Call) {
    CALLS.with(|v| v.borrow_mut().push(c));
}

/// Hold a communicator call for the group's end.
pub fn hold(h: Held) {
    HELD.with(|v| v.borrow_mut().push(h));
}

/// NCCL's `ncclGroupStart`: starts (or nests) a group on this thread.
///
/// # Safety
/// None.
#[no_mangle]
pub unsafe extern "C" fn ncclGroupStart() -> ncclResult_t {
    if !crate::real::cpu_device() {
        return crate::join::group_start();
    }
    open();
    ncclSuccess
}

/// Start or nest this thread's group.
fn open() {
    if DEPTH.with(|d| d.replace(d.get() + 1)) == 0 {
        OPEN.fetch_add(1, Relaxed);
    }
}

/// NCCL's `ncclGroupEnd`: ends a group; the outermost end runs what the group holds
/// (see the module doc) and returns its first failure. Without a matching start:
/// `ncclInvalidUsage`.
///
/// # Safety
/// The buffers of the group's calls are still valid and untouched by others.
#[no_mangle]
pub unsafe extern "C" fn ncclGroupEnd() -> ncclResult_t {
    if !crate::real::cpu_device() {
        return guard("ncclGroupEnd", std::ptr::null_mut(), || {
            crate::join::group_end(false, || pass!("GroupEnd", ()))
        });
    }
    guard("ncclGroupEnd", std::ptr::null_mut(), || {
        end("ncclGroupEnd", true)
    })
}

/// NCCL's `ncclGroupSimulateEnd`: ends the group without executing its operations and
/// writes `simInfo->estimatedTime` (strata's model, microseconds: [`end_estimated`]).
///
/// # Safety
/// `simInfo` is NULL (then as `ncclGroupEnd` without running, NCCL's plain path) or
/// points to `simInfo->size` readable and writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
    if !crate::real::cpu_device() {
        return guard("ncclGroupSimulateEnd", std::ptr::null_mut(), || {
            crate::join::group_end(
                true,
                || pass!("GroupSimulateEnd", (simInfo: *mut ncclSimInfo_t)),
            )
        });
    }
    const F: &str = "ncclGroupSimulateEnd";
    guard(F, std::ptr::null_mut(), || {
        if simInfo.is_null() {
            return end(F, true);
        }
        // SAFETY: non-NULL; `size` is the first field.
        let size = unsafe { std::ptr::addr_of!((*simInfo).size).read_unaligned() };
        let mut info = ncclSimInfo_t {
            size,
            magic: 0,
            version: 0,
            estimatedTime: -1.0,
        };
        let n = size.min(std::mem::size_of::<ncclSimInfo_t>());
        // SAFETY: the caller's struct holds `size` bytes; `n` bytes are copied into a
        // local of at least `n` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                simInfo.cast::<u8>(),
                (&mut info as *mut ncclSimInfo_t).cast::<u8>(),
                n,
            )
        };
        if info.magic != NCCL_SIM_INFO_MAGIC {
            // NCCL fails the group as a whole (its calls are dropped).
            let _ = end(F, false);
            return fail(
                F,
                std::ptr::null_mut(),
                ncclInvalidArgument,
                "simInfo was not initialised with NCCL_SIM_INFO_INITIALIZER",
            );
        }
        let (r, estimate) = end_estimated(F, false);
        if r == ncclSuccess {
            info.estimatedTime = estimate as f32;
            // SAFETY: as above, back into the caller's `n` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (&info as *const ncclSimInfo_t).cast::<u8>(),
                    simInfo.cast::<u8>(),
                    n,
                )
            };
        }
        r
    })
}

/// End a group level; at the outermost, run the held communicator calls and (when
/// `run`) the recorded calls.
fn end(func: &str, run: bool) -> ncclResult_t {
    end_estimated(func, run).0
}

/// [`end`], and when the calls are not run (`ncclGroupSimulateEnd`) strata's model of
/// their time in microseconds: per communicator the sum of its calls' estimates
/// ([`crate::route::estimate_us`]; the all-gathers, reduce-scatters and all-reduces, a
/// reduce as the all-reduce it runs; other calls add nothing), then the largest (one
/// thread may drive every rank of a world, whose calls run at once).
fn end_estimated(func: &str, run: bool) -> (ncclResult_t, f64) {
    let depth = DEPTH.with(|d| d.get());
    if depth == 0 {
        let r = fail(
            func,
            std::ptr::null_mut(),
            ncclInvalidUsage,
            "not in a group (no matching ncclGroupStart)",
        );
        return (r, 0.0);
    }
    DEPTH.with(|d| d.set(depth - 1));
    if depth > 1 {
        return (ncclSuccess, 0.0);
    }
    OPEN.fetch_sub(1, Relaxed);
    let held = HELD.with(|v| std::mem::take(&mut *v.borrow_mut()));
    let mut first = run_held(held);
    let mut calls = CALLS.with(|v| std::mem::take(&mut *v.borrow_mut()));
    if run && !calls.is_empty() {
        let r = run_calls(func, &calls);
        if first == ncclSuccess {
            first = r;
        }
    }
    let estimate = if run { 0.0 } else { estimate(&calls) };
    calls.clear();
    // Give the list (its capacity) back for the thread's next group.
    CALLS.with(|v| {
        let mut v = v.borrow_mut();
        if v.capacity() < calls.capacity() {
            *v = calls;
        }
    });
    (first, estimate)
}

/// strata's model of `calls`' time (see [`end_estimated`]).
fn estimate(calls: &[Call]) -> f64 {
    use crate::collectives::Kind;
    use strata::capi::With;
    let Ok(serve) = crate::serve::serve() else {
        return 0.0;
    };
    let mut per_comm: std::collections::HashMap<usize, f64> = Default::default();
    for c in calls {
        let with = match c.kind {
            Kind::AllGather => With::AllGather,
            Kind::ReduceScatter => With::ReduceScatter(c.op),
            Kind::AllReduce | Kind::Reduce => With::AllReduce(c.op),
            _ => continue,
        };
        let Ok(comm) = strata::capi::comm_of(crate::comm::sc(c.comm)) else {
            continue;
        };
        *per_comm.entry(c.comm as usize).or_default() +=
            crate::route::estimate_us(serve, &comm, with, c.count, c.dtype);
    }
    per_comm.into_values().fold(0.0, f64::max)
}

/// Run held communicator calls, concurrently (ranks of one world meet in them).
fn run_held(held: Vec<Held>) -> ncclResult_t {
    match held.len() {
        0 => ncclSuccess,
        1 => held.into_iter().next().map_or(ncclSuccess, |h| h()),
        _ => std::thread::scope(|s| {
            let hs: Vec<_> = held.into_iter().map(|h| s.spawn(h)).collect();
            let mut first = ncclSuccess;
            for h in hs {
                let r = h.join().unwrap_or(ncclInternalError);
                if first == ncclSuccess {
                    first = r;
                }
            }
            first
        }),
    }
}

/// Hand the recorded calls to strata in one strata group.
fn run_calls(func: &str, calls: &[Call]) -> ncclResult_t {
    // SAFETY: starts a group on this thread; no arguments.
    let r = unsafe { strata::capi::strataGroupStart() };
    if r != ncclSuccess {
        return strata_result(func, std::ptr::null_mut(), r);
    }
    let mut first = ncclSuccess;
    for c in calls {
        // SAFETY: the caller of each recorded call gave buffers valid until this
        // group's end (NCCL's group contract), which is now.
        let r = unsafe { execute(c) };
        if first == ncclSuccess {
            first = r;
        }
    }
    // SAFETY: ends the group started above; the buffers are still valid.
    let r = unsafe { strata::capi::strataGroupEnd() };
    crate::scratch::release_held();
    let r = strata_result(func, std::ptr::null_mut(), r);
    if first == ncclSuccess {
        first = r;
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group is its thread's: another thread's calls run at once while it is open, and
    /// the fast test ([`OPEN`]) is consistent with the depth through nesting and ends.
    #[test]
    fn a_group_is_its_threads_only() {
        assert!(!in_group());
        open();
        open();
        assert!(in_group());
        std::thread::spawn(|| assert!(!in_group())).join().unwrap();
        assert_eq!(end("ncclGroupEnd", true), ncclSuccess);
        assert!(in_group(), "still nested");
        assert_eq!(end("ncclGroupEnd", true), ncclSuccess);
        assert!(!in_group());
        assert_ne!(end("ncclGroupEnd", true), ncclSuccess, "no group to end");
        assert!(!in_group());
    }
}
