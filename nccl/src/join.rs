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
//! ([`strata::capi::collective_with`]), or the real call unchanged. Every other function
//! goes to the real library.
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
use crate::route::{route, Route};
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
}

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
    if config.is_null() {
        return std::env::var("NCCL_COMM_BLOCKING").map_or(true, |v| v.trim() != "0");
    }
    // SAFETY: the caller's contract.
    unsafe { read_config(config) }.map_or(false, |c| c.blocking)
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
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn collective(
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
        Route::Native => return hold_or_run(real),
        Route::Strata(a) => a,
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

/// The route of a call on `j`: the real library for what strata does not serve (an op
/// or data type of NCCL's only), else [`route`].
fn choose(j: &Joined, with: With, count: usize, dtype: ncclDataType_t) -> Route {
    use strata::kinds::Kind;
    let (kind, op) = match with {
        With::AllGather => (Kind::AllGather, None),
        With::ReduceScatter(op) => (Kind::ReduceScatter, Some(op)),
        With::AllReduce(op) => (Kind::AllReduce, Some(op)),
    };
    let Ok(dt) = strata::DataType::from_raw(dtype) else {
        return Route::Native;
    };
    let redop = match op.map(strata::ReduceOp::from_raw) {
        None => None,
        Some(Ok(o)) => Some(o),
        Some(Err(_)) => return Route::Native,
    };
    let Ok(serve) = serve() else {
        return Route::Native;
    };
    let core = j.comm.core();
    let shape = strata::algo::select::Shape {
        kind: Some(kind),
        redop,
        count,
        dtype: dt,
        topo: core.topology(),
        members: core.members(),
        hierarchy: core.hierarchy(),
        chunks: core.config().ho_ring_chunks,
    };
    route(serve, &shape)
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
        replay(held, &mut keep);
    }
    keep(join_all(to_join));
    first
}

/// Run held calls in order: each run of strata's in one strata group, each run of real
/// calls in one real group.
fn replay(held: Vec<Held>, keep: &mut impl FnMut(ncclResult_t)) {
    let mut it = held.into_iter().peekable();
    while let Some(h) = it.next() {
        match h {
            Held::Strata(f) => {
                // SAFETY: opens strata's group on this thread, closed below.
                keep(unsafe { s::strataGroupStart() });
                keep(f());
                while let Some(Held::Strata(_)) = it.peek() {
                    if let Some(Held::Strata(f)) = it.next() {
                        keep(f());
                    }
                }
                // SAFETY: closes the group opened above.
                keep(unsafe { s::strataGroupEnd() });
            }
            Held::Real(f) => {
                keep(pass!("GroupStart", ()));
                keep(f());
                while let Some(Held::Real(_)) = it.peek() {
                    if let Some(Held::Real(f)) = it.next() {
                        keep(f());
                    }
                }
                keep(pass!("GroupEnd", ()));
            }
        }
    }
}
