//! Communicators: unique ids, init (rank, config, scalable, all), split, shrink,
//! finalize, destroy, abort, and the queries.
//!
//! On strata's CPU device (`comm.rs` for the handle and the transport):
//! - `ncclGetUniqueId`: a strata unique id of the transport in use; strata's part of
//!   its id is the first 128 bytes (`STRATA_UNIQUE_ID_VENDOR_OFFSET`), which is all a
//!   local or mpi world needs, so it fits NCCL's 128 bytes exactly.
//! - `ncclCommInitRank` / `...Config` / `...Scalable` (the first of its `nId` ids):
//!   `strataCommInitRankConfig` with the transport, and `STRATA_NCCL`'s algorithm.
//!   Inside a group the init is held and run at the outermost `ncclGroupEnd`
//!   concurrently with the group's other inits, so one thread may create every rank.
//!   Nonblocking configs (`blocking = 0`) are accepted and complete at once: init
//!   returns `ncclSuccess` and `ncclCommGetAsyncError` reports `ncclSuccess` (NCCL
//!   allows a nonblocking call to finish before it returns).
//! - `ncclCommInitAll`: `strataCommInitLocal` for `ndev` ranks of this process
//!   (`devlist` is ignored: there is one CPU device).
//! - `ncclCommSplit` (`NCCL_SPLIT_NOCOLOR` gives NULL) and `ncclCommShrink`
//!   (`NCCL_SHRINK_DEFAULT` / `NCCL_SHRINK_ABORT`): strata's, also held inside a group.
//!   A config given to them is checked; the new communicator inherits its parent's
//!   settings.
//! - `ncclCommFinalize`: nothing is left in flight outside a group, so it checks the
//!   communicator and returns `ncclSuccess` (quiescent at once).
//! - `ncclCommDestroy` / `ncclCommAbort`: strata's (NULL: a no-op, as NCCL), and this
//!   library's state of the communicator (its PreMulSum ops, its last message) goes.
//! - `ncclCommCount`, `ncclCommUserRank`, `ncclCommGetAsyncError`: strata's;
//!   `ncclCommCuDevice`: 0, the CPU device.
//!
//! With the real library every function is passed to it; init also reads `STRATA_NCCL`
//! (a bad value fails) and prints the startup line.

use crate::abi::*;
use crate::comm::{announce, nc, sc, strata_config};
use crate::errors::{fail, guard, strata_result};
use crate::passthrough::pass;
use std::ffi::c_int;
use std::ptr::null_mut;
use strata::capi as s;

/// NCCL's `ncclGetUniqueId`: a new id for a world of this process's transport.
///
/// # Safety
/// `uniqueId` is NULL (`ncclInvalidArgument`) or writable for an `ncclUniqueId`.
#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t {
    if !crate::real::cpu_device() {
        return pass!("GetUniqueId", (uniqueId: *mut ncclUniqueId));
    }
    const F: &str = "ncclGetUniqueId";
    guard(F, null_mut(), || {
        if uniqueId.is_null() {
            return fail(F, null_mut(), ncclInvalidArgument, "uniqueId is NULL");
        }
        let t = match crate::comm::transport() {
            Ok((t, _)) => *t,
            Err(e) => return fail(F, null_mut(), ncclInvalidUsage, e),
        };
        let mut id = s::strataUniqueId {
            internal: [0; s::STRATA_UNIQUE_ID_BYTES],
        };
        // SAFETY: `id` is a live strataUniqueId.
        let r = unsafe { s::strataGetUniqueIdForTransport(t, &mut id) };
        if r != ncclSuccess {
            return strata_result(F, null_mut(), r);
        }
        let mut out = ncclUniqueId {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        };
        out.internal
            .copy_from_slice(&id.internal[..NCCL_UNIQUE_ID_BYTES]);
        // SAFETY: checked non-NULL; the caller's contract.
        unsafe { *uniqueId = out };
        ncclSuccess
    })
}

/// strata's 256-byte id of an NCCL id (strata's part; no vendor id follows).
fn strata_id(id: &ncclUniqueId) -> s::strataUniqueId {
    let mut sid = s::strataUniqueId {
        internal: [0; s::STRATA_UNIQUE_ID_BYTES],
    };
    sid.internal[..NCCL_UNIQUE_ID_BYTES].copy_from_slice(&id.internal);
    sid
}

/// Run now, or hold for the group's end.
fn now_or_held(f: impl FnOnce() -> ncclResult_t + Send + 'static) -> ncclResult_t {
    if crate::group::in_group() {
        crate::group::hold(Box::new(f));
        ncclSuccess
    } else {
        f()
    }
}

/// The CPU device's init of one rank.
///
/// # Safety
/// `out` writable for a handle (until the group's end when inside a group); `cfg` NULL
/// or readable for its `size`.
unsafe fn init_rank(
    func: &'static str,
    out: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
    cfg: *const ncclConfig_t,
) -> ncclResult_t {
    guard(func, null_mut(), || {
        if out.is_null() {
            return fail(func, null_mut(), ncclInvalidArgument, "comm is NULL");
        }
        // SAFETY: the caller's contract on `cfg`.
        if let Err(m) = unsafe { read_config(cfg) } {
            return fail(func, null_mut(), ncclInvalidArgument, m);
        }
        if let Err((c, m)) = strata_config() {
            return fail(func, null_mut(), c, m);
        }
        let sid = strata_id(&id);
        let out = out as usize;
        now_or_held(move || {
            let cfg = match strata_config() {
                Ok(c) => c,
                Err((c, m)) => return fail(func, null_mut(), c, m),
            };
            let mut c = null_mut();
            // SAFETY: `c` and `cfg` are live; strata checks the rest.
            let r = unsafe { s::strataCommInitRankConfig(&mut c, nranks, sid, rank, &cfg) };
            // SAFETY: the caller's `out`, valid until now (the group's end at the latest).
            unsafe { *(out as *mut ncclComm_t) = nc(c) };
            if r == ncclSuccess {
                announce(rank);
            }
            strata_result(func, null_mut(), r)
        })
    })
}

/// With the real library: `STRATA_NCCL` must parse; after the real init made `made`
/// (blocking or not, per `config`), strata joins them (`join.rs`: now, or at the group's
/// end), then the startup line.
///
/// # Safety
/// `made` NULL or readable for `n` handles (the real library wrote them); `config` NULL or
/// an initialised config.
unsafe fn real_init(
    func: &'static str,
    rank: c_int,
    r: ncclResult_t,
    made: *const ncclComm_t,
    n: c_int,
    config: *const ncclConfig_t,
) -> ncclResult_t {
    if let Err(e) = crate::serve::serve() {
        return fail(func, null_mut(), ncclInvalidArgument, e);
    }
    if r != ncclSuccess || made.is_null() || n < 1 {
        return r;
    }
    // SAFETY: the real library wrote `n` handles there.
    let comms = unsafe { std::slice::from_raw_parts(made, n as usize) };
    // SAFETY: the caller's contract on `config`.
    let blocking = unsafe { crate::join::blocking(config) };
    let j = crate::join::made_all(func, comms, blocking);
    announce(rank);
    j
}

/// NCCL's `ncclCommInitRank`: this rank's communicator of a world of `nranks` named by
/// `commId` (see the module doc).
///
/// # Safety
/// `comm` writable for a handle (until `ncclGroupEnd` inside a group).
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    if !crate::real::cpu_device() {
        if let Err(e) = crate::serve::serve() {
            return fail("ncclCommInitRank", null_mut(), ncclInvalidArgument, e);
        }
        let r = pass!("CommInitRank", (comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId, rank: c_int));
        // SAFETY: `comm` was written by the real init when it succeeded.
        return unsafe { real_init("ncclCommInitRank", rank, r, comm, 1, std::ptr::null()) };
    }
    // SAFETY: the caller's contract.
    unsafe {
        init_rank(
            "ncclCommInitRank",
            comm,
            nranks,
            commId,
            rank,
            std::ptr::null(),
        )
    }
}

/// NCCL's `ncclCommInitRankConfig`: as `ncclCommInitRank`, with a config (NULL, or one
/// set up with `NCCL_CONFIG_INITIALIZER`; read as far as its `size`).
///
/// # Safety
/// As `ncclCommInitRank`; `config` NULL or readable for its `size`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    if !crate::real::cpu_device() {
        if let Err(e) = crate::serve::serve() {
            return fail("ncclCommInitRankConfig", null_mut(), ncclInvalidArgument, e);
        }
        let r = pass!("CommInitRankConfig", (comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId, rank: c_int, config: *mut ncclConfig_t));
        // SAFETY: as in ncclCommInitRank; `config` the caller's.
        return unsafe { real_init("ncclCommInitRankConfig", rank, r, comm, 1, config) };
    }
    // SAFETY: the caller's contract.
    unsafe { init_rank("ncclCommInitRankConfig", comm, nranks, commId, rank, config) }
}

/// NCCL's `ncclCommInitRankScalable`: as `ncclCommInitRankConfig` with `nId` ids (the
/// same on every rank); strata needs one, the first.
///
/// # Safety
/// As `ncclCommInitRankConfig`; `commIds` readable for `nId` ids.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    nId: c_int,
    commIds: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    if !crate::real::cpu_device() {
        if let Err(e) = crate::serve::serve() {
            return fail(
                "ncclCommInitRankScalable",
                null_mut(),
                ncclInvalidArgument,
                e,
            );
        }
        let r = pass!("CommInitRankScalable", (newcomm: *mut ncclComm_t, nranks: c_int, myrank: c_int, nId: c_int, commIds: *mut ncclUniqueId, config: *mut ncclConfig_t));
        // SAFETY: as in ncclCommInitRank; `config` the caller's.
        return unsafe { real_init("ncclCommInitRankScalable", myrank, r, newcomm, 1, config) };
    }
    const F: &str = "ncclCommInitRankScalable";
    if nId < 1 || commIds.is_null() {
        return fail(
            F,
            null_mut(),
            ncclInvalidArgument,
            format!("nId is {nId} and commIds {commIds:?}: at least one id is needed"),
        );
    }
    // SAFETY: non-NULL with at least one id (the caller's contract).
    let id = unsafe { *commIds };
    // SAFETY: the caller's contract.
    unsafe { init_rank(F, newcomm, nranks, id, myrank, config) }
}

/// NCCL's `ncclCommInitAll`: `ndev` communicators of one world, ranks of this process,
/// written to `comm[0..ndev]` (see the module doc).
///
/// # Safety
/// `comm` writable for `ndev` handles; `devlist` NULL or readable for `ndev` ints.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(
    comm: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> ncclResult_t {
    if !crate::real::cpu_device() {
        if let Err(e) = crate::serve::serve() {
            return fail("ncclCommInitAll", null_mut(), ncclInvalidArgument, e);
        }
        let r = pass!("CommInitAll", (comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int));
        // SAFETY: the real init wrote `ndev` handles when it succeeded.
        return unsafe { real_init("ncclCommInitAll", 0, r, comm, ndev, std::ptr::null()) };
    }
    const F: &str = "ncclCommInitAll";
    guard(F, null_mut(), || {
        if comm.is_null() {
            return fail(F, null_mut(), ncclInvalidArgument, "comm is NULL");
        }
        if ndev < 1 {
            return fail(
                F,
                null_mut(),
                ncclInvalidArgument,
                format!("ndev is {ndev}"),
            );
        }
        let mut cfg = match strata_config() {
            Ok(c) => c,
            Err((c, m)) => return fail(F, null_mut(), c, m),
        };
        // InitAll makes a world of this process: strata's local transport.
        cfg.transport = s::strataTransportLocal;
        // SAFETY: `comm` holds `ndev` handles (the caller's contract), the same size as
        // strata's; `cfg` is live.
        let r = unsafe { s::strataCommInitLocal(comm.cast(), ndev, std::ptr::null(), &cfg) };
        if r == ncclSuccess {
            announce(0);
        }
        strata_result(F, null_mut(), r)
    })
}

/// NCCL's `ncclCommSplit`: collective over `comm`; ranks of one `color` form a new
/// communicator ordered by `key`; `NCCL_SPLIT_NOCOLOR` gives `*newcomm = NULL`.
///
/// # Safety
/// `newcomm` writable for a handle (until `ncclGroupEnd` inside a group); `config` NULL
/// or readable for its `size`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    if !crate::real::cpu_device() {
        let r = pass!("CommSplit", (comm: ncclComm_t, color: c_int, key: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t));
        // SAFETY: `newcomm` written by the real split when it succeeded; `config` the
        // caller's.
        return unsafe { crate::join::made_from("ncclCommSplit", r, comm, newcomm, config) };
    }
    const F: &str = "ncclCommSplit";
    guard(F, comm, || {
        if newcomm.is_null() {
            return fail(F, comm, ncclInvalidArgument, "newcomm is NULL");
        }
        // SAFETY: the caller's contract on `config`.
        if let Err(m) = unsafe { read_config(config) } {
            return fail(F, comm, ncclInvalidArgument, m);
        }
        let (c, out) = (comm as usize, newcomm as usize);
        now_or_held(move || {
            let mut n = null_mut();
            // SAFETY: `n` is live; strata checks the handle and the color.
            let r = unsafe {
                s::strataCommSplit(sc(c as ncclComm_t), color, key, &mut n, std::ptr::null())
            };
            // SAFETY: the caller's `newcomm`, valid until now.
            unsafe { *(out as *mut ncclComm_t) = nc(n) };
            strata_result(F, c as ncclComm_t, r)
        })
    })
}

/// NCCL's `ncclCommShrink`: a new communicator of `comm`'s ranks but the excluded ones,
/// made by the survivors alone; `shrinkFlags` `NCCL_SHRINK_DEFAULT` or
/// `NCCL_SHRINK_ABORT` (abort `comm`'s operations first).
///
/// # Safety
/// `excludeRanksList` readable for `excludeRanksCount` ints; `newcomm` writable for a
/// handle (until `ncclGroupEnd` inside a group); `config` NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommShrink(
    comm: ncclComm_t,
    excludeRanksList: *mut c_int,
    excludeRanksCount: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    shrinkFlags: c_int,
) -> ncclResult_t {
    if !crate::real::cpu_device() {
        let r = pass!("CommShrink", (comm: ncclComm_t, excludeRanksList: *mut c_int, excludeRanksCount: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t, shrinkFlags: c_int));
        // SAFETY: as in ncclCommSplit.
        return unsafe { crate::join::made_from("ncclCommShrink", r, comm, newcomm, config) };
    }
    const F: &str = "ncclCommShrink";
    guard(F, comm, || {
        if newcomm.is_null() {
            return fail(F, comm, ncclInvalidArgument, "newcomm is NULL");
        }
        // SAFETY: the caller's contract on `config`.
        if let Err(m) = unsafe { read_config(config) } {
            return fail(F, comm, ncclInvalidArgument, m);
        }
        let (c, out, list) = (comm as usize, newcomm as usize, excludeRanksList as usize);
        now_or_held(move || {
            let mut n = null_mut();
            // SAFETY: the list as the caller gave it (strata checks NULL with a count);
            // `n` is live.
            let r = unsafe {
                s::strataCommShrink(
                    sc(c as ncclComm_t),
                    list as *const c_int,
                    excludeRanksCount,
                    &mut n,
                    std::ptr::null(),
                    shrinkFlags,
                )
            };
            // SAFETY: the caller's `newcomm`, valid until now.
            unsafe { *(out as *mut ncclComm_t) = nc(n) };
            strata_result(F, c as ncclComm_t, r)
        })
    })
}

/// NCCL's `ncclCommFinalize` (see the module doc: quiescent at once).
///
/// # Safety
/// None beyond passing a value.
#[no_mangle]
pub unsafe extern "C" fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
    if !crate::real::cpu_device() {
        crate::join::leave(comm, false);
        return pass!("CommFinalize", (comm: ncclComm_t));
    }
    const F: &str = "ncclCommFinalize";
    let mut n = 0;
    // SAFETY: a check of the handle; `n` is live.
    strata_result(F, comm, unsafe { s::strataCommCount(sc(comm), &mut n) })
}

/// Destroy (`abort` false) or abort `comm` on strata's CPU device as `func`, and drop
/// what this library kept for it.
fn end_comm(func: &str, comm: ncclComm_t, abort: bool) -> ncclResult_t {
    guard(func, comm, || {
        // SAFETY: strata never dereferences the handle.
        let r = unsafe {
            match abort {
                true => s::strataCommAbort(sc(comm)),
                false => s::strataCommDestroy(sc(comm)),
            }
        };
        if r == ncclSuccess {
            crate::redop::forget_comm(comm);
            crate::errors::forget_comm(comm);
        }
        strata_result(func, comm, r)
    })
}

/// NCCL's `ncclCommDestroy`: releases `comm` (NULL: a no-op).
///
/// # Safety
/// None beyond passing a value.
#[no_mangle]
pub unsafe extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    if !crate::real::cpu_device() {
        crate::join::leave(comm, false);
        return pass!("CommDestroy", (comm: ncclComm_t));
    }
    end_comm("ncclCommDestroy", comm, false)
}

/// NCCL's `ncclCommAbort`: wakes every waiter of `comm` here and on its peers with an
/// error, then releases it (NULL: a no-op). May be called while another thread is
/// blocked in a call on `comm`.
///
/// # Safety
/// None beyond passing a value.
#[no_mangle]
pub unsafe extern "C" fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    if !crate::real::cpu_device() {
        crate::join::leave(comm, true);
        return pass!("CommAbort", (comm: ncclComm_t));
    }
    end_comm("ncclCommAbort", comm, true)
}

/// NCCL's `ncclCommCount`: the number of ranks of `comm`.
///
/// # Safety
/// `count` NULL (`ncclInvalidArgument`) or writable for an int.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    if !crate::real::cpu_device() {
        return pass!("CommCount", (comm: ncclComm_t, count: *mut c_int));
    }
    // SAFETY: strata checks both.
    strata_result("ncclCommCount", comm, unsafe {
        s::strataCommCount(sc(comm), count)
    })
}

/// NCCL's `ncclCommUserRank`: this rank's index in `comm`.
///
/// # Safety
/// `rank` NULL (`ncclInvalidArgument`) or writable for an int.
#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    if !crate::real::cpu_device() {
        return pass!("CommUserRank", (comm: ncclComm_t, rank: *mut c_int));
    }
    // SAFETY: strata checks both.
    strata_result("ncclCommUserRank", comm, unsafe {
        s::strataCommUserRank(sc(comm), rank)
    })
}

/// NCCL's `ncclCommCuDevice`: the device of `comm`; 0 on strata's CPU device.
///
/// # Safety
/// `device` NULL (`ncclInvalidArgument`) or writable for an int.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    if !crate::real::cpu_device() {
        return pass!("CommCuDevice", (comm: ncclComm_t, device: *mut c_int));
    }
    const F: &str = "ncclCommCuDevice";
    if device.is_null() {
        return fail(F, comm, ncclInvalidArgument, "device is NULL");
    }
    let mut n = 0;
    // SAFETY: a check of the handle; `n` is live.
    let r = unsafe { s::strataCommCount(sc(comm), &mut n) };
    if r == ncclSuccess {
        // SAFETY: checked non-NULL; the caller's contract.
        unsafe { *device = 0 };
    }
    strata_result(F, comm, r)
}

/// NCCL's `ncclCommGetAsyncError`: the failure that broke `comm` after a call was made,
/// else `ncclSuccess` (never `ncclInProgress` on the CPU device: init and finalize
/// complete at once). Callable from any thread.
///
/// # Safety
/// `asyncError` NULL (`ncclInvalidArgument`) or writable for an `ncclResult_t`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    comm: ncclComm_t,
    asyncError: *mut ncclResult_t,
) -> ncclResult_t {
    if !crate::real::cpu_device() {
        let r = pass!("CommGetAsyncError", (comm: ncclComm_t, asyncError: *mut ncclResult_t));
        if r == ncclSuccess && !asyncError.is_null() {
            // SAFETY: the real library just wrote it.
            if unsafe { *asyncError } == ncclSuccess {
                // SAFETY: as above.
                unsafe { *asyncError = crate::join::async_error(comm) };
            }
        }
        return r;
    }
    // SAFETY: strata checks both.
    strata_result("ncclCommGetAsyncError", comm, unsafe {
        s::strataCommGetAsyncError(sc(comm), asyncError)
    })
}
