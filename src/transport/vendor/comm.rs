//! The communicator: [`VendorComm`]'s calls, each inside a use guard of the abort
//! protocol, and its creation (`ncclCommInitRank`, `ncclCommSplit`), also on a helper
//! thread with a timeout.

use super::abort::{shared, within, AbortHandle, Ending, InUse, Shared};
use super::loader::{RawComm, VendorLib, VendorUniqueId};
use crate::device::{Bound, DevStream};
use crate::error::{Error, Result};
use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::Duration;

/// Which reduce-shaped collective [`VendorComm::reduce`] calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    ReduceScatter,
    AllReduce,
}

/// `NCCL_SPLIT_NOCOLOR`.
pub const SPLIT_NOCOLOR: c_int = -1;

/// `ncclInProgress`: an operation of a nonblocking communicator still running, not an
/// error.
const IN_PROGRESS: c_int = 7;

impl VendorLib {
    /// `ncclCommInitRank`: rank `rank` of `nranks` joins the communicator of `id` on the
    /// current device (collective over the ranks; needs a GPU).
    pub fn comm_init_rank(
        &self,
        nranks: usize,
        id: &VendorUniqueId,
        rank: usize,
    ) -> Result<VendorComm<'_>> {
        let (n, r) = match (c_int::try_from(nranks), c_int::try_from(rank)) {
            (Ok(n), Ok(r)) if r < n => (n, r),
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "rank {rank} of {nranks}: out of range"
                )))
            }
        };
        let mut comm: RawComm = std::ptr::null_mut();
        // SAFETY: writes one communicator handle; `id` is passed by value as NCCL takes it.
        let rc = unsafe { (self.sys.ncclCommInitRank)(&mut comm, n, *id, r) };
        self.check(rc, "ncclCommInitRank")?;
        Ok(VendorComm::new(self, comm))
    }
    /// [`VendorLib::comm_init_rank`] that gives up after `timeout` (a rank that never
    /// joins): the helper thread that calls `ncclCommInitRank` holds `bind`'s guard (the
    /// device current) for the call. Past the timeout the result is `Remote`; a
    /// communicator the library completes later is aborted on the helper.
    pub fn comm_init_rank_within(
        &'static self,
        nranks: usize,
        id: &VendorUniqueId,
        rank: usize,
        timeout: Duration,
        bind: impl FnOnce() -> Result<Bound> + Send + 'static,
    ) -> Result<VendorComm<'static>> {
        let id = *id;
        let made = within(
            timeout,
            "nccl-init",
            move || {
                let _bound = bind()?;
                self.comm_init_rank(nranks, &id, rank)
            },
            |late: Result<VendorComm<'static>>| {
                if let Ok(c) = late {
                    let _ = c
                        .abort_handle()
                        .abort_for("ncclCommInitRank completed after its caller gave up");
                }
            },
        )?;
        made.unwrap_or_else(|| {
            Err(Error::Remote(format!(
                "{}: ncclCommInitRank of rank {rank} of {nranks} did not complete within \
                 {timeout:?} (a rank never joined)",
                self.vendor().name()
            )))
        })
    }
}

fn vp(a: u64) -> *mut c_void {
    a as usize as *mut c_void
}

/// A vendor communicator, destroyed on drop. The collective calls enqueue on `stream`
/// (a stream of the communicator's device, which must be current) and return;
/// addresses are device addresses. Calls on one communicator are serialized by the
/// caller (NCCL's rule for blocking communicators); each holds a use guard, so an abort
/// from another thread ([`AbortHandle`]) never frees the handle under it (see the
/// [module documentation](super)).
pub struct VendorComm<'a> {
    lib: &'a VendorLib,
    shared: Arc<Shared<'a>>,
}

impl<'a> VendorComm<'a> {
    fn new(lib: &'a VendorLib, raw: RawComm) -> VendorComm<'a> {
        VendorComm {
            lib,
            shared: shared(lib, raw),
        }
    }

    /// A use guard for a call named `what` (every method here takes one for its own
    /// call; hold one across a group). `Error::Remote` naming the abort once the
    /// communicator was aborted.
    pub fn enter(&self, what: &str) -> Result<InUse<'a>> {
        self.shared.enter().map(InUse).map_err(|why| {
            Error::Remote(format!(
                "{what}: the {} communicator was aborted ({why})",
                self.lib.vendor().name()
            ))
        })
    }

    /// True once an abort (or the drop) was requested: calls fail at once.
    pub fn is_aborted(&self) -> bool {
        self.shared.ended().is_some()
    }

    /// The library.
    pub fn lib(&self) -> &'a VendorLib {
        self.lib
    }

    /// Every enqueue's shape: a use guard for the call `name`, `f` on the guarded handle,
    /// its result code checked.
    fn enqueue(&self, name: &str, f: impl FnOnce(RawComm) -> c_int) -> Result<()> {
        let u = self.enter(name)?;
        self.lib.check(f(u.raw()), name)
    }

    /// `ncclAllGather` of `bytes` per rank (as `ncclUint8`).
    pub fn all_gather(
        &self,
        send: u64,
        recv: u64,
        bytes: usize,
        stream: &dyn DevStream,
    ) -> Result<()> {
        let f = self.lib.sys.ncclAllGather;
        // SAFETY: FFI enqueue on the live communicator (`enqueue` holds its use guard for
        // the call) and a live stream (borrowed), of the communicator's device, which the
        // caller made current; the caller holds both device ranges borrowed until the
        // stream has run the call.
        self.enqueue("ncclAllGather", |c| unsafe {
            f(vp(send), vp(recv), bytes, 1, c, stream.raw())
        })
    }

    /// `ncclReduceScatter` (`count` elements per rank) or `ncclAllReduce` (`count`
    /// elements): the two share one prototype.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce(
        &self,
        which: Reduction,
        send: u64,
        recv: u64,
        count: usize,
        dtype: c_int,
        op: c_int,
        stream: &dyn DevStream,
    ) -> Result<()> {
        let (f, name) = match which {
            Reduction::ReduceScatter => (self.lib.sys.ncclReduceScatter, "ncclReduceScatter"),
            Reduction::AllReduce => (self.lib.sys.ncclAllReduce, "ncclAllReduce"),
        };
        // SAFETY: as `all_gather`.
        self.enqueue(name, |c| unsafe {
            f(vp(send), vp(recv), count, dtype, op, c, stream.raw())
        })
    }

    /// `ncclBroadcast` of `bytes` from `root`.
    pub fn broadcast(
        &self,
        send: u64,
        recv: u64,
        bytes: usize,
        root: c_int,
        stream: &dyn DevStream,
    ) -> Result<()> {
        let f = self.lib.sys.ncclBroadcast;
        // SAFETY: as `all_gather`; the root argument sits in the op slot of the shared
        // prototype (`ncclBroadcast(send, recv, count, type, root, comm, stream)`).
        self.enqueue("ncclBroadcast", |c| unsafe {
            f(vp(send), vp(recv), bytes, 1, root, c, stream.raw())
        })
    }

    /// `ncclSend` of `bytes` to `peer`.
    pub fn send(&self, addr: u64, bytes: usize, peer: c_int, stream: &dyn DevStream) -> Result<()> {
        let f = self.lib.sys.ncclSend;
        // SAFETY: as `all_gather`.
        self.enqueue("ncclSend", |c| unsafe {
            f(vp(addr), bytes, 1, peer, c, stream.raw())
        })
    }

    /// `ncclRecv` of `bytes` from `peer`.
    pub fn recv(&self, addr: u64, bytes: usize, peer: c_int, stream: &dyn DevStream) -> Result<()> {
        let f = self.lib.sys.ncclRecv;
        // SAFETY: as `all_gather`.
        self.enqueue("ncclRecv", |c| unsafe {
            f(vp(addr), bytes, 1, peer, c, stream.raw())
        })
    }

    /// The library's all-to-all of `bytes` per peer, `None` when it has none (the
    /// caller then groups sends and receives).
    pub fn all_to_all(
        &self,
        send: u64,
        recv: u64,
        bytes: usize,
        stream: &dyn DevStream,
    ) -> Option<Result<()>> {
        let f = self.lib.sys.all_to_all?;
        // SAFETY: as `all_gather`.
        Some(self.enqueue("ncclAlltoAll", |c| unsafe {
            f(vp(send), vp(recv), bytes, 1, c, stream.raw())
        }))
    }

    /// `ncclCommSplit` (collective over this communicator): `Ok(None)` for ranks passing
    /// `None`; the outer `None` when the library lacks the call.
    pub fn split(&self, color: Option<u32>, key: i32) -> Option<Result<Option<VendorComm<'a>>>> {
        self.lib.sys.ncclCommSplit?;
        match self.enter("ncclCommSplit") {
            Ok(u) => split_on(self.lib, &u, color, key),
            Err(e) => Some(Err(e)),
        }
    }

    /// `ncclCommGetAsyncError`: an error the communicator hit while running (none while
    /// an operation is merely in progress). Never waits and takes no lock: what a
    /// watchdog polls while another thread enqueues on the communicator, as NCCL allows.
    /// `Error::Remote` naming the abort once the communicator was aborted.
    pub fn async_error(&self) -> Result<()> {
        let u = self.enter("ncclCommGetAsyncError")?;
        let mut e: c_int = 0;
        // SAFETY: the communicator is live (guarded by `u`); writes one int.
        let rc = unsafe { (self.lib.sys.ncclCommGetAsyncError)(u.raw(), &mut e) };
        self.lib.check(rc, "ncclCommGetAsyncError")?;
        if e == IN_PROGRESS {
            return Ok(());
        }
        self.lib.check(e, "asynchronous communicator error")
    }

    /// [`AbortHandle::abort_for`] through this communicator: it must not be used
    /// afterwards (calls fail at once; the drop releases nothing twice).
    pub fn abort_for(&self, why: &str) -> Result<()> {
        self.abort_handle().abort_for(why)
    }

    /// [`AbortHandle::abort`] through this communicator.
    pub fn abort_in_place(&self) -> Result<()> {
        self.abort_handle().abort()
    }

    /// `ncclCommAbort`: stop everything in flight and free the communicator (deferred
    /// while a call is inside it).
    pub fn abort(self) -> Result<()> {
        self.abort_in_place()
    }

    /// A handle that aborts this communicator from any thread, without its lock.
    pub fn abort_handle(&self) -> AbortHandle<'a> {
        AbortHandle {
            shared: self.shared.clone(),
        }
    }
}

/// `ncclCommSplit` of the communicator `parent` guards (see [`VendorComm::split`]).
fn split_on<'a>(
    lib: &'a VendorLib,
    parent: &InUse<'a>,
    color: Option<u32>,
    key: i32,
) -> Option<Result<Option<VendorComm<'a>>>> {
    let f = lib.sys.ncclCommSplit?;
    let c = match color.map(c_int::try_from) {
        None => SPLIT_NOCOLOR,
        Some(Ok(c)) => c,
        Some(Err(_)) => {
            return Some(Err(Error::InvalidArgument(format!(
                "color {color:?} does not fit the library's int"
            ))))
        }
    };
    let mut out: RawComm = std::ptr::null_mut();
    // SAFETY: FFI, collective over the parent, live for the whole call (its use guard
    // `parent` is held); writes one handle (NULL for NOCOLOR); a NULL config asks for
    // the parent's.
    let rc = unsafe { f(parent.raw(), c, key, &mut out, std::ptr::null_mut()) };
    Some(
        lib.check(rc, "ncclCommSplit")
            .map(|_| (!out.is_null()).then(|| VendorComm::new(lib, out))),
    )
}

impl VendorLib {
    /// `ncclCommSplit(parent, 0, key)` of a communicator strata does not own (a program's,
    /// seen by a library in front of NCCL): every rank of `parent` in one new
    /// communicator, ordered by `key`, made over the parent's own connections (no new
    /// bootstrap), owned by strata (destroyed with it); `parent` stays the caller's.
    /// Collective over `parent`'s ranks; the device of `parent` must be current.
    ///
    /// # Safety
    /// `parent` is a live communicator of this library, not destroyed during the call.
    pub unsafe fn split_foreign(
        &'static self,
        parent: RawComm,
        key: i32,
    ) -> Result<VendorComm<'static>> {
        let f = self.sys.ncclCommSplit.ok_or_else(|| {
            Error::System(format!(
                "{}: this library has no ncclCommSplit",
                self.vendor().name()
            ))
        })?;
        let mut out: RawComm = std::ptr::null_mut();
        // SAFETY: FFI, collective over the live `parent` (the caller's contract); writes
        // one handle; a NULL config asks for the parent's.
        let rc = unsafe { f(parent, 0, key, &mut out, std::ptr::null_mut()) };
        self.check(rc, "ncclCommSplit")?;
        if out.is_null() {
            return Err(Error::Internal(
                "ncclCommSplit with color 0 gave no communicator".into(),
            ));
        }
        Ok(VendorComm::new(self, out))
    }
}

impl VendorComm<'static> {
    /// [`VendorComm::split`] that gives up after `timeout` (a rank that never calls it):
    /// the split runs on a helper thread that holds `bind`'s guard (the device current)
    /// and a use guard of this communicator for the call. Past the timeout the result is
    /// `Remote` at once and this communicator is marked aborted (later calls fail at
    /// once); its `ncclCommAbort` runs when the helper returns, never while it is inside
    /// the split, and a sub-communicator the library completes late is aborted there.
    /// The caller keeps whatever lock serializes calls on this communicator; an abort
    /// does not need it.
    pub fn split_within(
        &self,
        color: Option<u32>,
        key: i32,
        timeout: Duration,
        bind: impl FnOnce() -> Result<Bound> + Send + 'static,
    ) -> Option<Result<Option<VendorComm<'static>>>> {
        self.lib.sys.ncclCommSplit?;
        let inside = match self.enter("ncclCommSplit") {
            Ok(u) => u,
            Err(e) => return Some(Err(e)),
        };
        let aborter = self.abort_handle();
        let lib = self.lib;
        let r = within(
            timeout,
            "nccl-split",
            move || {
                // Held until the split returns: the parent is never freed under it.
                let parent = inside;
                let _bound = bind()?;
                split_on(lib, &parent, color, key).unwrap_or(Ok(None))
            },
            |late: Result<Option<VendorComm<'static>>>| {
                if let Ok(Some(c)) = late {
                    let _ = c
                        .abort_handle()
                        .abort_for("ncclCommSplit completed after its caller gave up");
                }
            },
        );
        Some(match r {
            Err(e) => Err(e),
            Ok(Some(r)) => r,
            Ok(None) => {
                let why = format!(
                    "ncclCommSplit did not complete within {timeout:?}: a rank never called it"
                );
                let _ = aborter.abort_for(&why);
                Err(Error::Remote(format!(
                    "{}: {why}; the parent communicator is aborted (once the split returns)",
                    lib.vendor().name()
                )))
            }
        })
    }
}

impl Drop for VendorComm<'_> {
    fn drop(&mut self) {
        // `ncclCommDestroy` now, or when the last call inside leaves; nothing if aborted.
        if let Some(Err(e)) = self.shared.end(Ending::Destroy, "it was destroyed") {
            tracing::warn!("{e}");
        }
    }
}
