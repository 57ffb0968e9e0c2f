//! strata joining a program's real NCCL communicator (a GPU machine with the real
//! library; built with `--features cuda`).
//!
//! **Joining.** When an init (`ncclCommInitRank`, `...Config`, `...Scalable`,
//! `ncclCommInitAll`), `ncclCommSplit` or `ncclCommShrink` of the real library has made
//! a blocking communicator `R` (a NULL config: blocking unless `NCCL_COMM_BLOCKING=0`; a
//! split's NULL config: its parent's) and `STRATA_NCCL` asks strata to serve (`exact`
//! with two ranks or more, or a list of names at any size), this library makes strata's
//! communicator from `R`: `ncclCommSplit(R, 0, rank)` on the real library (no second
//! bootstrap; `R` stays the program's), the topology from `STRATA_TOPOLOGY` or the ranks'
//! hosts all-gathered over it, and the sub-communicators strata's algorithms use split
//! from that ([`strata::Comm::vendor_adopt`]). The program's handle stays `R` itself, so
//! every forwarded function receives it untouched; this library keeps `R -> strata's
//! communicator` in a table ([`joined`]: one relaxed load and nothing else while no
//! communicator was joined, else a read lock and a hash lookup). A join that fails fails
//! the init call with the reason. Communicators made inside a group are joined at the
//! group's outermost end (one thread each, as they are collective), nonblocking ones are
//! not joined (every call on them goes to the real library).
//!
//! **Per call.** `ncclAllGather`, `ncclReduceScatter`, `ncclAllReduce` (and their
//! `*Config` forms) on a joined communicator, with one of strata's data types (not fp8)
//! and a built-in op (not PreMulSum), go where [`crate::route::route`] says: strata's
//! algorithm, enqueued on the caller's stream through strata's C ABI
//! ([`strata::capi::collective_with`]), or the real call unchanged. Calls on a stream
//! being captured into a CUDA graph, and calls whose buffers lie in a window registered
//! with `ncclCommWindowRegister` (NCCL's symmetric kernels), go to the real library.
//! Every other function goes to the real library.
//!
//! **Groups.** `ncclGroupStart` / `ncclGroupEnd` go to the real library and are counted
//! here per thread. Calls routed to the real library go to it at once (into its open
//! group) until the group's first call routed to strata; that one and every later call on
//! a joined communicator are held, in order. At the outermost `ncclGroupEnd` the real
//! group ends (launching what it holds), then the held calls run in call order: runs of
//! strata's calls in one strata group, runs of real calls in one real group. So the order
//! of strata's and NCCL's calls is kept and the program calls `ncclGroupEnd` once;
//! errors of held calls are the group end's result.
//!
//! **Ending.** `ncclCommDestroy`, `ncclCommFinalize` + destroy, `ncclCommAbort` of `R`
//! end strata's communicator first (destroy, or abort), then pass `R` to the real
//! library. `ncclCommGetAsyncError(R)` reports the real library's error, else strata's.

use crate::abi::*;
use crate::errors::fail;
use crate::passthrough::pass;
use crate::route::Route;
use crate::serve::{serve, Serve};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use strata::capi as s;

/// strata's communicator joined to a real one.
pub struct Joined {
    /// strata's C handle of it (a registry key, never dereferenced).
    strata: usize,
    /// The same communicator, for the route's shape (topology, members, hierarchy).
    comm: strata::Comm,
    /// Its device (whether a caller's stream is being captured).
    dev: Arc<dyn strata::device::Device>,
    /// Routes already chosen, by call shape: the model's estimates walk the ranks (2.7 us
    /// a call at 128 ranks, 31 us at 1024, measured in release), and a training step
    /// repeats a few shapes (FSDP's layers), so each shape is estimated once.
    routes: RwLock<HashMap<RouteKey, Route>>,
}

/// What a route depends on that varies per call: the collective and its op, the data
/// type and the count (the rest is the communicator's).
type RouteKey = (u8, ncclRedOp_t, ncclDataType_t, usize);

/// Shapes remembered per communicator at most (the table is cleared when full).
const ROUTES_KEPT: usize = 4096;

impl Joined {
    fn handle(&self) -> s::strataComm_t {
        self.strata as s::strataComm_t
    }
}

/// True once any communicator was joined in this process.
static ANY: AtomicBool = AtomicBool::new(false);

fn table() -> &'static RwLock<HashMap<usize, Arc<Joined>>> {
    static T: OnceLock<RwLock<HashMap<usize, Arc<Joined>>>> = OnceLock::new();
    T.get_or_init(Default::default)
}

/// strata's communicator joined to the real `comm`, if any.
#[inline]
pub fn joined(comm: ncclComm_t) -> Option<Arc<Joined>> {
    if !ANY.load(Ordering::Relaxed) {
        return None;
    }
    table()
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(&(comm as usize))
        .cloned()
}

/// Whether `STRATA_NCCL` asks strata to join a communicator of `nranks`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn wanted(nranks: c_int) -> bool {
    match serve() {
        Ok(Serve::Exact) => nranks > 1,
        Ok(Serve::Algos(_)) => nranks >= 1,
        Ok(Serve::Off) | Err(_) => false,
    }
}

/// Whether a communicator made with `config` (NULL: NCCL's default) is blocking.
///
/// # Safety
/// `config` NULL or an initialised `ncclConfig_t`.
pub unsafe fn blocking(config: *const ncclConfig_t) -> bool {
    // NCCL's default where the config leaves `blocking` unset (NULL, or
    // NCCL_CONFIG_UNDEF_INT): `NCCL_COMM_BLOCKING`, else blocking.
    let default = || std::env::var("NCCL_COMM_BLOCKING").map_or(true, |v| v.trim() != "0");
    if config.is_null() {
        return default();
    }
    // SAFETY: the caller's contract.
    let Ok(settings) = (unsafe { read_config(config) }) else {
        return false;
    };
    // SAFETY: `read_config` checked the header; `size` is its first field.
    let size = unsafe { std::ptr::addr_of!((*config).size).read_unaligned() };
    if size < std::mem::offset_of!(ncclConfig_t, cgaClusterSize) {
        return default();
    }
    // SAFETY: `size` covers `blocking`.
    let raw = unsafe { std::ptr::addr_of!((*config).blocking).read_unaligned() };
    if raw == NCCL_CONFIG_UNDEF_INT {
        default()
    } else {
        settings.blocking
    }
}

/// Communicators made nonblocking (never joined; a split's NULL config inherits it).
fn nonblocking() -> &'static Mutex<HashSet<usize>> {
    static N: OnceLock<Mutex<HashSet<usize>>> = OnceLock::new();
    N.get_or_init(Default::default)
}

/// After the real library made `comms` in `func` (all ranks of one world when several):
/// join them, now or at the group's end when inside one; a nonblocking one is only
/// remembered. The init's result: success, or why the join failed.
pub fn made_all(func: &'static str, comms: &[ncclComm_t], blocking: bool) -> ncclResult_t {
    let comms: Vec<(&'static str, usize)> = comms
        .iter()
        .filter(|c| !c.is_null())
        .map(|&c| (func, c as usize))
        .collect();
    if !blocking {
        let mut n = nonblocking().lock().unwrap_or_else(|p| p.into_inner());
        n.extend(comms.iter().map(|c| c.1));
        return ncclSuccess;
    }
    if DEPTH.with(Cell::get) > 0 {
        TO_JOIN.with(|t| t.borrow_mut().extend(comms));
        return ncclSuccess;
    }
    join_all(comms)
}

/// After a real `ncclCommSplit` / `ncclCommShrink` of `parent` returned `r`, writing
/// `*newcomm`: [`made_all`] for it, blocking as `config` says (NULL: as `parent`).
///
/// # Safety
/// `newcomm` NULL or readable for a handle; `config` NULL or an initialised config.
pub unsafe fn made_from(
    func: &'static str,
    r: ncclResult_t,
    parent: ncclComm_t,
    newcomm: *const ncclComm_t,
    config: *const ncclConfig_t,
) -> ncclResult_t {
    if r != ncclSuccess || newcomm.is_null() {
        return r;
    }
    // SAFETY: the real library wrote it (NULL for NCCL_SPLIT_NOCOLOR).
    let made = unsafe { *newcomm };
    let blocking = if config.is_null() {
        let n = nonblocking().lock().unwrap_or_else(|p| p.into_inner());
        !n.contains(&(parent as usize))
    } else {
        // SAFETY: the caller's contract.
        unsafe { blocking(config) }
    };
    made_all(func, &[made], blocking)
}

/// Join `comm` (collective over its ranks).
fn join(func: &str, comm: ncclComm_t) -> ncclResult_t {
    match try_join(comm) {
        Ok(()) => ncclSuccess,
        Err((code, why)) => fail(func, comm, code, format!("strata could not join the communicator: {why} (STRATA_NCCL=off leaves every call to NCCL)")),
    }
}

/// Join every communicator of `comms` at once, one thread each (they are ranks of the
/// same communicators, driven by this one thread). The first failure.
fn join_all(comms: Vec<(&'static str, usize)>) -> ncclResult_t {
    match comms.len() {
        0 => ncclSuccess,
        1 => join(comms[0].0, comms[0].1 as ncclComm_t),
        _ => std::thread::scope(|sc| {
            let hs: Vec<_> = comms
                .iter()
                .map(|&(f, c)| sc.spawn(move || join(f, c as ncclComm_t)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or(ncclInternalError))
                .find(|&r| r != ncclSuccess)
                .unwrap_or(ncclSuccess)
        }),
    }
}

#[cfg(feature = "cuda")]
fn try_join(comm: ncclComm_t) -> Result<(), (ncclResult_t, String)> {
    use strata::transport::vendor::{Vendor, VendorLib};
    let (mut n, mut r, mut d) = (0, 0, 0);
    let (count, rank, device) = (
        &mut n as *mut c_int,
        &mut r as *mut c_int,
        &mut d as *mut c_int,
    );
    for (rc, what) in [
        (
            pass!("CommCount", (comm: ncclComm_t, count: *mut c_int)),
            "ncclCommCount",
        ),
        (
            pass!("CommUserRank", (comm: ncclComm_t, rank: *mut c_int)),
            "ncclCommUserRank",
        ),
        (
            pass!("CommCuDevice", (comm: ncclComm_t, device: *mut c_int)),
            "ncclCommCuDevice",
        ),
    ] {
        if rc != ncclSuccess {
            return Err((rc, format!("{what} returned {rc}")));
        }
    }
    if !wanted(n) {
        return Ok(());
    }
    let e = |e: strata::Error| (e.code(), e.to_string());
    let real = crate::real::real().ok_or((ncclInternalError, "no real library".to_string()))?;
    let lib = VendorLib::get_at(Vendor::Nccl, &real.path).map_err(e)?;
    let dev = strata::device::open(strata::device::Api::Cuda, d as usize).map_err(e)?;
    let own = {
        let _bound = dev.bind().map_err(e)?;
        // SAFETY: `comm` is the live communicator the real library just made (the
        // program cannot have destroyed it: the init has not returned yet).
        unsafe { lib.split_foreign(comm.cast(), r) }.map_err(e)?
    };
    let config = strata::CommConfig::from_env().map_err(e)?;
    let sc = strata::Comm::vendor_adopt(own, &dev, r as usize, n as usize, config).map_err(e)?;
    let topo = sc.topology().to_string();
    let h = s::register_comm(sc.clone()).map_err(e)?;
    table().write().unwrap_or_else(|p| p.into_inner()).insert(
        comm as usize,
        Arc::new(Joined {
            strata: h as usize,
            comm: sc,
            dev,
            routes: RwLock::default(),
        }),
    );
    ANY.store(true, Ordering::Relaxed);
    crate::comm::joined_on(n, topo);
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn try_join(_comm: ncclComm_t) -> Result<(), (ncclResult_t, String)> {
    Ok(())
}

/// End strata's communicator joined to `comm` (before the real library ends `comm`):
/// abort it, or destroy it.
pub fn leave(comm: ncclComm_t, abort: bool) {
    nonblocking()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&(comm as usize));
    if !ANY.load(Ordering::Relaxed) {
        return;
    }
    let j = table()
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&(comm as usize));
    if let Some(j) = j {
        // SAFETY: strata's own handle, ended once (removed from the table above).
        let _ = unsafe {
            if abort {
                s::strataCommAbort(j.handle())
            } else {
                s::strataCommDestroy(j.handle())
            }
        };
    }
}

/// strata's asynchronous error of the communicator joined to `comm` (success if none).
pub fn async_error(comm: ncclComm_t) -> ncclResult_t {
    let Some(j) = joined(comm) else {
        return ncclSuccess;
    };
    let mut e = ncclSuccess;
    // SAFETY: strata's live handle; `e` is live.
    let rc = unsafe { s::strataCommGetAsyncError(j.handle(), &mut e) };
    if rc != ncclSuccess {
        rc
    } else {
        e
    }
}

/// A call held by a group that diverted (module doc).
enum Held {
    Strata(Box<dyn FnOnce() -> ncclResult_t>),
    Real(Box<dyn FnOnce() -> ncclResult_t>),
}

thread_local! {
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
    static TO_JOIN: RefCell<Vec<(&'static str, usize)>> = const { RefCell::new(Vec::new()) };
}

/// The collective [`collective`] is asked for.
pub use strata::capi::With;

/// An all-gather, reduce-scatter or all-reduce on the real `comm`: strata's algorithm
/// (run, or held by the thread's group) when `comm` is joined and the route says so,
/// else `real()` (run, or held when the group diverted).
///
/// # Safety
/// NCCL's contract for the call: the buffers device memory of `comm`'s device for the
/// call's counts, `stream` a live stream of that device.
#[allow(clippy::too_many_arguments)]
#[inline]
pub unsafe fn collective(
    func: &'static str,
    with: With,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
    real: impl FnOnce() -> ncclResult_t + 'static,
) -> ncclResult_t {
    let Some(j) = joined(comm) else {
        return real();
    };
    let algo = match choose(&j, with, count, dtype) {
        Route::Strata(a) if !in_window(comm, send, recv) && !capturing(&j, stream) => a,
        _ => return hold_or_run(real),
    };
    let run = move || {
        // SAFETY: the caller's NCCL contract on the buffers and stream is strata's on its
        // GPU transport (device memory of the communicator's device, a live stream).
        let rc = unsafe {
            s::collective_with(
                with,
                algo,
                send,
                recv,
                count,
                dtype,
                j.handle(),
                stream.cast(),
            )
        };
        if rc == ncclSuccess {
            return rc;
        }
        // SAFETY: strata's live handle; a NUL-terminated string, copied at once.
        let why = unsafe { CStr::from_ptr(s::strataGetLastError(j.handle())) }
            .to_string_lossy()
            .into_owned();
        fail(func, comm, rc, format!("strata's {algo}: {why}"))
    };
    if DEPTH.with(Cell::get) > 0 {
        HELD.with(|h| h.borrow_mut().push(Held::Strata(Box::new(run))));
        ncclSuccess
    } else {
        run()
    }
}

/// True when `stream` is being captured into a CUDA graph (or its state is unknown):
/// such calls go to NCCL, which captures its own kernels; strata's capture needs each
/// call shape run once before (docs/gpu.md, "Graph capture"), which a program written
/// for NCCL does not know to do.
fn capturing(j: &Joined, stream: cudaStream_t) -> bool {
    // SAFETY: `stream` is the caller's live stream of the communicator's device (NCCL's
    // contract for the call it passed it to).
    unsafe { j.dev.is_capturing(stream.cast()) }.unwrap_or(true)
}

/// Windows registered with `ncclCommWindowRegister` (buffer range, window, communicator):
/// a call touching one goes to NCCL (its symmetric kernels use the window).
static WINDOWS: RwLock<Vec<(usize, usize, usize, usize)>> = RwLock::new(Vec::new());
/// True while any window is registered.
static ANY_WINDOW: AtomicBool = AtomicBool::new(false);

/// The real library registered `[buff, buff + size)` as window `win` of `comm`.
pub fn window_registered(comm: ncclComm_t, buff: *const c_void, size: usize, win: usize) {
    let mut w = WINDOWS.write().unwrap_or_else(|p| p.into_inner());
    w.push((
        buff as usize,
        (buff as usize).saturating_add(size),
        win,
        comm as usize,
    ));
    ANY_WINDOW.store(true, Ordering::Relaxed);
}

/// Window `win` was deregistered.
pub fn window_deregistered(win: usize) {
    let mut w = WINDOWS.write().unwrap_or_else(|p| p.into_inner());
    w.retain(|e| e.2 != win);
    ANY_WINDOW.store(!w.is_empty(), Ordering::Relaxed);
}

/// True when `send` or `recv` lies in a window registered on `comm`.
fn in_window(comm: ncclComm_t, send: *const c_void, recv: *mut c_void) -> bool {
    if !ANY_WINDOW.load(Ordering::Relaxed) {
        return false;
    }
    let w = WINDOWS.read().unwrap_or_else(|p| p.into_inner());
    w.iter().any(|&(a, b, _, c)| {
        c == comm as usize
            && [send as usize, recv as usize]
                .iter()
                .any(|&p| a <= p && p < b)
    })
}

/// The route of a call on `j` ([`crate::route::route_call`]), remembered per shape.
fn choose(j: &Joined, with: With, count: usize, dtype: ncclDataType_t) -> Route {
    let key: RouteKey = match with {
        With::AllGather => (0, 0, dtype, count),
        With::ReduceScatter(op) => (1, op, dtype, count),
        With::AllReduce(op) => (2, op, dtype, count),
    };
    if let Some(&r) = j.routes.read().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return r;
    }
    let r = match serve() {
        Ok(serve) => crate::route::route_call(serve, &j.comm, with, count, dtype),
        Err(_) => Route::Native,
    };
    let mut routes = j.routes.write().unwrap_or_else(|p| p.into_inner());
    if routes.len() >= ROUTES_KEPT {
        routes.clear();
    }
    routes.insert(key, r);
    r
}

/// A call for the real library on a joined communicator: held when this thread's group
/// diverted, else run.
#[inline]
pub fn hold_or_run(real: impl FnOnce() -> ncclResult_t + 'static) -> ncclResult_t {
    if DEPTH.with(Cell::get) > 0 && HELD.with(|h| !h.borrow().is_empty()) {
        HELD.with(|h| h.borrow_mut().push(Held::Real(Box::new(real))));
        return ncclSuccess;
    }
    real()
}

/// `ncclGroupStart` with the real library.
pub fn group_start() -> ncclResult_t {
    let r = pass!("GroupStart", ());
    if r == ncclSuccess {
        DEPTH.with(|d| d.set(d.get() + 1));
    }
    r
}

/// `ncclGroupEnd` (`simulate`: `ncclGroupSimulateEnd`, whose held calls do not run) with
/// the real library: `end()` is the real call.
pub fn group_end(simulate: bool, end: impl FnOnce() -> ncclResult_t) -> ncclResult_t {
    group_end_with(simulate, end, &mut |side, open| match (side, open) {
        // SAFETY: strata's group on this thread, opened then closed by `replay`.
        (Side::Strata, true) => unsafe { s::strataGroupStart() },
        // SAFETY: as above.
        (Side::Strata, false) => unsafe { s::strataGroupEnd() },
        (Side::Real, true) => pass!("GroupStart", ()),
        (Side::Real, false) => pass!("GroupEnd", ()),
    })
}

/// Whose group [`replay`] opens or closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Strata,
    Real,
}

/// [`group_end`] with `groups(side, open)` opening and closing the replay's groups.
fn group_end_with(
    simulate: bool,
    end: impl FnOnce() -> ncclResult_t,
    groups: &mut dyn FnMut(Side, bool) -> ncclResult_t,
) -> ncclResult_t {
    let d = DEPTH.with(Cell::get);
    if d == 0 {
        return end(); // The real library reports the unmatched end.
    }
    DEPTH.with(|c| c.set(d - 1));
    if d > 1 {
        return end();
    }
    let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    let to_join = TO_JOIN.with(|t| std::mem::take(&mut *t.borrow_mut()));
    let r = end();
    if r != ncclSuccess && r != ncclInProgress {
        return r;
    }
    let mut first = r;
    let mut keep = |rc: ncclResult_t| {
        if first == ncclSuccess && rc != ncclSuccess {
            first = rc;
        }
    };
    if !simulate {
        replay(held, &mut keep, groups);
    }
    keep(join_all(to_join));
    first
}

/// Run held calls in order: each run of strata's in one strata group, each run of real
/// calls in one real group.
fn replay(
    held: Vec<Held>,
    keep: &mut impl FnMut(ncclResult_t),
    groups: &mut dyn FnMut(Side, bool) -> ncclResult_t,
) {
    let mut it = held.into_iter().peekable();
    while let Some(h) = it.next() {
        let side = match h {
            Held::Strata(_) => Side::Strata,
            Held::Real(_) => Side::Real,
        };
        keep(groups(side, true));
        let mut next = Some(h);
        while let Some(Held::Strata(f) | Held::Real(f)) = next {
            keep(f());
            next = match it.peek() {
                Some(Held::Strata(_)) if side == Side::Strata => it.next(),
                Some(Held::Real(_)) if side == Side::Real => it.next(),
                _ => None,
            };
        }
        keep(groups(side, false));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    type Log = Rc<RefCell<Vec<String>>>;

    fn call(log: &Log, name: &str, rc: ncclResult_t) -> impl FnOnce() -> ncclResult_t + 'static {
        let (log, name) = (log.clone(), name.to_string());
        move || {
            log.borrow_mut().push(name);
            rc
        }
    }

    /// A group on this thread as the exports make it: `body` inside, then the end with
    /// the groups logged; the end's result.
    fn group(log: &Log, body: impl FnOnce()) -> ncclResult_t {
        DEPTH.with(|d| d.set(d.get() + 1));
        body();
        let l = log.clone();
        let l2 = log.clone();
        group_end_with(
            false,
            move || {
                l.borrow_mut().push("end".into());
                ncclSuccess
            },
            &mut |side, open| {
                l2.borrow_mut()
                    .push(format!("{side:?}{}", if open { "(" } else { ")" }));
                ncclSuccess
            },
        )
    }

    fn strata_call(log: &Log, name: &str, rc: ncclResult_t) {
        let f = call(log, name, rc);
        HELD.with(|h| h.borrow_mut().push(Held::Strata(Box::new(f))));
    }

    #[test]
    fn real_calls_before_the_first_strata_call_go_at_once_and_the_order_is_kept() {
        let log: Log = Default::default();
        let r = group(&log, || {
            // NCCL's calls before any of strata's: into the real library's open group.
            assert_eq!(hold_or_run(call(&log, "r1", ncclSuccess)), ncclSuccess);
            strata_call(&log, "s1", ncclSuccess);
            strata_call(&log, "s2", ncclSuccess);
            // After strata's first: held, in order.
            assert_eq!(hold_or_run(call(&log, "r2", ncclSuccess)), ncclSuccess);
            assert_eq!(hold_or_run(call(&log, "r3", ncclSuccess)), ncclSuccess);
            strata_call(&log, "s3", ncclSuccess);
        });
        assert_eq!(r, ncclSuccess);
        let want = "r1 end Strata( s1 s2 Strata) Real( r2 r3 Real) Strata( s3 Strata)";
        assert_eq!(log.borrow().join(" "), want);
        assert!(HELD.with(|h| h.borrow().is_empty()));
        assert_eq!(DEPTH.with(Cell::get), 0);
    }

    #[test]
    fn nested_groups_replay_once_at_the_outermost_end() {
        let log: Log = Default::default();
        let r = group(&log, || {
            let inner = group(&log, || strata_call(&log, "s1", ncclSuccess));
            assert_eq!(inner, ncclSuccess);
            hold_or_run(call(&log, "r1", ncclSuccess));
        });
        assert_eq!(r, ncclSuccess);
        assert_eq!(
            log.borrow().join(" "),
            "end end Strata( s1 Strata) Real( r1 Real)"
        );
    }

    #[test]
    fn a_held_calls_error_is_the_group_ends_result_and_the_rest_still_run() {
        let log: Log = Default::default();
        let r = group(&log, || {
            strata_call(&log, "s1", ncclInvalidArgument);
            hold_or_run(call(&log, "r1", ncclSuccess));
        });
        assert_eq!(r, ncclInvalidArgument);
        assert_eq!(
            log.borrow().join(" "),
            "end Strata( s1 Strata) Real( r1 Real)"
        );
    }

    #[test]
    fn outside_a_group_and_in_a_group_without_strata_calls_nothing_is_held() {
        let log: Log = Default::default();
        assert_eq!(
            hold_or_run(call(&log, "r0", ncclRemoteError)),
            ncclRemoteError
        );
        let r = group(&log, || {
            hold_or_run(call(&log, "r1", ncclSuccess));
        });
        assert_eq!(r, ncclSuccess);
        assert_eq!(log.borrow().join(" "), "r0 r1 end");
    }

    #[test]
    fn groups_on_several_threads_at_once_are_each_their_own() {
        // NCCL's groups are per thread: each thread's held calls replay at its own end.
        let go = std::sync::Barrier::new(4);
        std::thread::scope(|sc| {
            for t in 0..4 {
                let go = &go;
                sc.spawn(move || {
                    for round in 0..50 {
                        let log: Log = Default::default();
                        let r = group(&log, || {
                            go.wait();
                            hold_or_run(call(&log, &format!("r{t}"), ncclSuccess));
                            strata_call(&log, &format!("s{t}.{round}"), ncclSuccess);
                            hold_or_run(call(&log, &format!("q{t}"), ncclSuccess));
                        });
                        assert_eq!(r, ncclSuccess);
                        assert_eq!(
                            log.borrow().join(" "),
                            format!("r{t} end Strata( s{t}.{round} Strata) Real( q{t} Real)")
                        );
                    }
                });
            }
        });
    }

    #[test]
    fn a_simulated_end_runs_nothing_held() {
        let log: Log = Default::default();
        DEPTH.with(|d| d.set(1));
        strata_call(&log, "s1", ncclSuccess);
        let r = group_end_with(true, || ncclSuccess, &mut |_, _| ncclSuccess);
        assert_eq!(r, ncclSuccess);
        assert!(log.borrow().is_empty());
        assert!(HELD.with(|h| h.borrow().is_empty()));
    }

    #[test]
    fn a_split_with_a_null_config_inherits_the_parents_blocking() {
        let parent = 0x5000usize as ncclComm_t;
        let child = 0x6000usize as ncclComm_t;
        assert_eq!(made_all("t", &[parent], false), ncclSuccess);
        // SAFETY: a live handle value; NULL config.
        let r = unsafe { made_from("t", ncclSuccess, parent, &child, std::ptr::null()) };
        assert_eq!(r, ncclSuccess);
        assert!(nonblocking().lock().unwrap().contains(&(child as usize)));
        leave(parent, false);
        leave(child, false);
        assert!(nonblocking().lock().unwrap().is_empty());
    }

    #[test]
    fn blocking_is_the_configs_else_nccls_default() {
        // SAFETY (each call): NULL or a live config of full size.
        assert!(unsafe { blocking(std::ptr::null()) });
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut c: ncclConfig_t = unsafe { std::mem::zeroed() };
        c.size = std::mem::size_of::<ncclConfig_t>();
        c.magic = NCCL_API_MAGIC;
        c.blocking = 0;
        assert!(!unsafe { blocking(&c) });
        c.blocking = 1;
        assert!(unsafe { blocking(&c) });
        c.blocking = NCCL_CONFIG_UNDEF_INT;
        assert!(unsafe { blocking(&c) });
        c.magic = 0;
        assert!(!unsafe { blocking(&c) }, "a bad config is never joined");
    }

    #[test]
    fn windows_route_their_buffers_to_nccl() {
        let comm = 0x7000usize as ncclComm_t;
        let buf = [0u8; 64];
        let p = buf.as_ptr() as *const c_void;
        assert!(!in_window(comm, p, std::ptr::null_mut()));
        window_registered(comm, p, 64, 42);
        assert!(in_window(comm, p.wrapping_add(10), std::ptr::null_mut()));
        assert!(!in_window(comm, p.wrapping_add(64), std::ptr::null_mut()));
        assert!(!in_window(
            0x7100usize as ncclComm_t,
            p,
            std::ptr::null_mut()
        ));
        window_deregistered(42);
        assert!(!in_window(comm, p, std::ptr::null_mut()));
    }
}
