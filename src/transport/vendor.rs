//! The NCCL / RCCL library, loaded at run time (features `cuda` / `rocm`).
//!
//! One loader serves both vendors: RCCL exports NCCL's API under NCCL's names, with a
//! few differences of spelling (all-to-all is `ncclAllToAll` in RCCL, `ncclAlltoAll` in
//! NCCL 2.28+, absent before) and of availability (`ncclCommSplit` needs NCCL 2.18).
//! Layers as cudarc's: raw symbols (`sys`), one place where result codes become
//! [`Result`] ([`VendorLib::check`]), safe calls on top. The library loads once per
//! process (a `OnceLock` over a list of candidates): `STRATA_NCCL_LIB` /
//! `STRATA_RCCL_LIB` first, then the usual sonames. A library that cannot be found is
//! an [`Error::System`] naming every candidate tried and why it failed, never a panic,
//! so strata builds and runs on machines without the library.
//!
//! # Aborts never free a communicator a call is inside
//!
//! strata's vendor communicators are blocking ones (NCCL only allows `ncclCommAbort`
//! concurrently with other calls on nonblocking communicators). So every vendor call on
//! a [`VendorComm`] holds a use guard ([`VendorComm::enter`], an [`InUse`]) for as long
//! as the library may touch the handle: the call itself, or for calls enqueued inside
//! `ncclGroupStart`/`ncclGroupEnd`, until the group has ended; a helper thread inside
//! `ncclCommSplit` holds the parent's guard until the split returns. An abort
//! ([`AbortHandle::abort`], [`VendorComm::abort_in_place`], from any thread, without any
//! lock) marks the communicator aborted at once: every later call fails before reaching
//! the library, with an [`Error::Remote`] naming the abort. The `ncclCommAbort` itself
//! runs when the last guard is dropped (on that thread), or at once when no call is
//! inside; dropping the [`VendorComm`] (`ncclCommDestroy`) is deferred the same way. It
//! runs exactly once. The bookkeeping is [`UseCount`], generic and unit-tested without
//! a library.
//!
//! The price: a call that blocks inside the library (a split or init whose peers never
//! come) cannot be woken by an abort. `ncclCommInitRank` and `ncclCommSplit` therefore
//! run on a helper thread ([`VendorLib::comm_init_rank_within`],
//! [`VendorComm::split_within`]); past the timeout the caller gets `Remote` at once, the
//! parent is marked aborted, and its abort (and that of a communicator the library
//! still completes late) runs if and when the helper returns.

use crate::device::{Bound, DevStream};
use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

/// Which collective library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vendor {
    /// NVIDIA NCCL (`libnccl.so.2`).
    Nccl,
    /// AMD RCCL (`librccl.so.1`), NCCL's API under NCCL's names.
    Rccl,
}

/// `NCCL_UNIQUE_ID_BYTES` (the same in RCCL).
pub const VENDOR_UNIQUE_ID_BYTES: usize = 128;

impl Vendor {
    /// `nccl` / `rccl`.
    pub fn name(self) -> &'static str {
        match self {
            Vendor::Nccl => "nccl",
            Vendor::Rccl => "rccl",
        }
    }

    /// The environment variable that overrides the library path.
    pub fn env_var(self) -> &'static str {
        match self {
            Vendor::Nccl => "STRATA_NCCL_LIB",
            Vendor::Rccl => "STRATA_RCCL_LIB",
        }
    }

    /// Candidates in the order they are tried: the override, then sonames.
    pub fn candidates(self) -> Vec<String> {
        let mut v: Vec<String> = std::env::var(self.env_var())
            .ok()
            .filter(|s| !s.trim().is_empty())
            .into_iter()
            .collect();
        let names: &[&str] = match self {
            Vendor::Nccl => &["libnccl.so.2", "libnccl.so"],
            Vendor::Rccl => &[
                "librccl.so.1",
                "librccl.so",
                "/opt/rocm/lib/librccl.so.1",
                "/opt/rocm/lib/librccl.so",
            ],
        };
        v.extend(names.iter().map(|s| s.to_string()));
        v
    }
}

/// `ncclUniqueId`: 128 opaque bytes, made by one rank and given to all.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct VendorUniqueId {
    pub internal: [c_char; VENDOR_UNIQUE_ID_BYTES],
}

impl VendorUniqueId {
    /// The bytes.
    pub fn bytes(&self) -> [u8; VENDOR_UNIQUE_ID_BYTES] {
        self.internal.map(|c| c as u8)
    }
    /// From bytes (as sent by the rank that made it).
    pub fn from_bytes(b: &[u8; VENDOR_UNIQUE_ID_BYTES]) -> VendorUniqueId {
        VendorUniqueId {
            internal: b.map(|c| c as c_char),
        }
    }
}

/// `ncclComm_t`.
pub type RawComm = *mut c_void;
/// `cudaStream_t` / `hipStream_t`.
pub type RawStream = *mut c_void;

/// `ncclReduceScatter` / `ncclAllReduce`: `(send, recv, count, dtype, op, comm, stream)`.
type ReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    RawStream,
) -> c_int;

/// The raw entry points (`sys` layer). Required ones are resolved at load; optional
/// ones are `None` where the library's version lacks them.
#[allow(non_snake_case)]
struct Sys {
    ncclGetVersion: unsafe extern "C" fn(*mut c_int) -> c_int,
    ncclGetUniqueId: unsafe extern "C" fn(*mut VendorUniqueId) -> c_int,
    ncclGetErrorString: unsafe extern "C" fn(c_int) -> *const c_char,
    ncclCommInitRank: unsafe extern "C" fn(*mut RawComm, c_int, VendorUniqueId, c_int) -> c_int,
    ncclCommDestroy: unsafe extern "C" fn(RawComm) -> c_int,
    ncclCommAbort: unsafe extern "C" fn(RawComm) -> c_int,
    ncclCommGetAsyncError: unsafe extern "C" fn(RawComm, *mut c_int) -> c_int,
    ncclGroupStart: unsafe extern "C" fn() -> c_int,
    ncclGroupEnd: unsafe extern "C" fn() -> c_int,
    #[allow(clippy::type_complexity)]
    ncclAllGather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, RawStream) -> c_int,
    ncclReduceScatter: ReduceFn,
    ncclAllReduce: ReduceFn,
    /// `ncclBroadcast(send, recv, count, dtype, root, comm, stream)`: the same shape.
    ncclBroadcast: ReduceFn,
    ncclSend: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, RawComm, RawStream) -> c_int,
    ncclRecv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, RawStream) -> c_int,
    /// `ncclCommSplit(comm, color, key, *newcomm, config)` (NCCL 2.18+, RCCL 2.18+).
    ncclCommSplit:
        Option<unsafe extern "C" fn(RawComm, c_int, c_int, *mut RawComm, *mut c_void) -> c_int>,
    /// `ncclAlltoAll` (NCCL 2.28+) or RCCL's `ncclAllToAll`.
    #[allow(clippy::type_complexity)]
    all_to_all: Option<
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, RawStream) -> c_int,
    >,
}

/// A loaded NCCL or RCCL.
pub struct VendorLib {
    vendor: Vendor,
    path: String,
    version: i32,
    sys: Sys,
    // Keeps the symbols above valid.
    _lib: libloading::Library,
}

// SAFETY: the library handle and plain function pointers may be shared; NCCL's API is
// thread-safe for distinct communicators, which is how strata uses it.
unsafe impl Send for VendorLib {}
// SAFETY: as above.
unsafe impl Sync for VendorLib {}

static NCCL: OnceLock<std::result::Result<VendorLib, String>> = OnceLock::new();
static RCCL: OnceLock<std::result::Result<VendorLib, String>> = OnceLock::new();

impl VendorLib {
    /// The process's `vendor` library, loaded on first use.
    pub fn get(vendor: Vendor) -> Result<&'static VendorLib> {
        let cell = match vendor {
            Vendor::Nccl => &NCCL,
            Vendor::Rccl => &RCCL,
        };
        cell.get_or_init(|| VendorLib::load(vendor))
            .as_ref()
            .map_err(|e| Error::System(e.clone()))
    }

    /// Load `vendor` from its candidates (not cached; [`VendorLib::get`] caches).
    pub fn load(vendor: Vendor) -> std::result::Result<VendorLib, String> {
        let mut tried = Vec::new();
        for c in vendor.candidates() {
            // SAFETY: loading a shared library runs its initializers; NCCL's and RCCL's
            // are the vendor's own and touch no strata state.
            match unsafe { libloading::Library::new(&c) } {
                Ok(lib) => match VendorLib::resolve(vendor, &c, lib) {
                    Ok(v) => return Ok(v),
                    Err(e) => tried.push(format!("{c}: {e}")),
                },
                Err(e) => tried.push(format!("{c}: {e}")),
            }
        }
        Err(format!(
            "the {} transport could not load its library; tried (set {} to its path): {}",
            vendor.name(),
            vendor.env_var(),
            tried.join("; ")
        ))
    }

    fn resolve(
        vendor: Vendor,
        path: &str,
        lib: libloading::Library,
    ) -> std::result::Result<VendorLib, String> {
        macro_rules! req {
            ($name:literal) => {
                // SAFETY: the symbol's type is NCCL's documented prototype (nccl.h),
                // which RCCL shares.
                *unsafe { lib.get($name) }.map_err(|e| {
                    format!(
                        "missing symbol {}: {e}",
                        String::from_utf8_lossy(&$name[..$name.len() - 1])
                    )
                })?
            };
        }
        macro_rules! opt {
            ($name:literal) => {
                // SAFETY: as for the required symbols.
                unsafe { lib.get($name) }.ok().map(|s| *s)
            };
        }
        let sys = Sys {
            ncclGetVersion: req!(b"ncclGetVersion\0"),
            ncclGetUniqueId: req!(b"ncclGetUniqueId\0"),
            ncclGetErrorString: req!(b"ncclGetErrorString\0"),
            ncclCommInitRank: req!(b"ncclCommInitRank\0"),
            ncclCommDestroy: req!(b"ncclCommDestroy\0"),
            ncclCommAbort: req!(b"ncclCommAbort\0"),
            ncclCommGetAsyncError: req!(b"ncclCommGetAsyncError\0"),
            ncclGroupStart: req!(b"ncclGroupStart\0"),
            ncclGroupEnd: req!(b"ncclGroupEnd\0"),
            ncclAllGather: req!(b"ncclAllGather\0"),
            ncclReduceScatter: req!(b"ncclReduceScatter\0"),
            ncclAllReduce: req!(b"ncclAllReduce\0"),
            ncclBroadcast: req!(b"ncclBroadcast\0"),
            ncclSend: req!(b"ncclSend\0"),
            ncclRecv: req!(b"ncclRecv\0"),
            ncclCommSplit: opt!(b"ncclCommSplit\0"),
            all_to_all: opt!(b"ncclAlltoAll\0").or(opt!(b"ncclAllToAll\0")),
        };
        let mut v: c_int = 0;
        // SAFETY: `ncclGetVersion` writes one int.
        let rc = unsafe { (sys.ncclGetVersion)(&mut v) };
        if rc != 0 {
            return Err(format!("ncclGetVersion failed with code {rc}"));
        }
        Ok(VendorLib {
            vendor,
            path: path.to_string(),
            version: v,
            sys,
            _lib: lib,
        })
    }

    /// Which vendor.
    pub fn vendor(&self) -> Vendor {
        self.vendor
    }
    /// The candidate that loaded.
    pub fn path(&self) -> &str {
        &self.path
    }
    /// `NCCL_VERSION_CODE` (e.g. 23203 for 2.32.3).
    pub fn version(&self) -> i32 {
        self.version
    }
    /// `(major, minor, patch)` of [`VendorLib::version`] (codes >= 2.9 use
    /// `major·10000 + minor·100 + patch`).
    pub fn version_triple(&self) -> (i32, i32, i32) {
        let v = self.version;
        if v >= 20900 {
            (v / 10000, (v / 100) % 100, v % 100)
        } else {
            (v / 1000, (v / 100) % 10, v % 100)
        }
    }
    /// True when the library has `ncclCommSplit`.
    pub fn has_split(&self) -> bool {
        self.sys.ncclCommSplit.is_some()
    }
    /// True when the library has a native all-to-all (else grouped send/recv).
    pub fn has_all_to_all(&self) -> bool {
        self.sys.all_to_all.is_some()
    }

    /// The library's text for a result code.
    pub fn error_string(&self, code: c_int) -> String {
        // SAFETY: returns a static NUL-terminated string for any code.
        let p = unsafe { (self.sys.ncclGetErrorString)(code) };
        if p.is_null() {
            return format!("{} error {code}", self.vendor.name());
        }
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// The one place a vendor result code becomes a `Result`: the ncclResult_t values
    /// map to strata's errors of the same number (strata's codes are NCCL's).
    pub fn check(&self, code: c_int, what: &str) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        let m = format!(
            "{what}: {} ({})",
            self.error_string(code),
            self.vendor.name()
        );
        Err(match code {
            1 => Error::Device(m),
            2 => Error::System(m),
            4 => Error::InvalidArgument(m),
            5 => Error::InvalidUsage(m),
            6 => Error::Remote(m),
            // 3 internal, 7 in progress (strata's calls are blocking), anything newer.
            _ => Error::Internal(m),
        })
    }

    /// A new unique id (`ncclGetUniqueId`): made by one rank, broadcast to the others.
    pub fn unique_id(&self) -> Result<VendorUniqueId> {
        let mut id = VendorUniqueId {
            internal: [0; VENDOR_UNIQUE_ID_BYTES],
        };
        // SAFETY: writes one ncclUniqueId.
        let rc = unsafe { (self.sys.ncclGetUniqueId)(&mut id) };
        self.check(rc, "ncclGetUniqueId")?;
        Ok(id)
    }

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

    /// `ncclGroupStart`.
    pub fn group_start(&self) -> Result<()> {
        // SAFETY: no arguments; thread-local group state in the library.
        self.check(unsafe { (self.sys.ncclGroupStart)() }, "ncclGroupStart")
    }

    /// `ncclGroupEnd`.
    pub fn group_end(&self) -> Result<()> {
        // SAFETY: as `group_start`.
        self.check(unsafe { (self.sys.ncclGroupEnd)() }, "ncclGroupEnd")
    }
}

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

/// How a [`UseCount`]ed value ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Stop everything in flight (`ncclCommAbort`).
    Abort,
    /// Release it normally (`ncclCommDestroy`), when its owner is dropped.
    Destroy,
}

/// What ends a [`UseCount`]ed value, called exactly once, with no guard alive.
pub trait Teardown<T>: Send + Sync {
    /// End `value` the way `how` says.
    fn teardown(&self, value: T, how: Ending) -> Result<()>;
}

impl<T, F: Fn(T, Ending) -> Result<()> + Send + Sync> Teardown<T> for F {
    fn teardown(&self, value: T, how: Ending) -> Result<()> {
        self(value, how)
    }
}

/// A value (a vendor communicator handle) shared by threads that use it and threads
/// that may end it: [`UseCount::enter`] hands out guards; [`UseCount::end`] refuses new
/// guards at once and runs the teardown when the last guard is dropped (at once when
/// none is alive). The teardown runs exactly once, never while a guard is alive.
pub struct UseCount<T, C> {
    state: Mutex<UseState<T>>,
    teardown: C,
}

struct UseState<T> {
    /// `None` once torn down.
    value: Option<T>,
    /// Guards alive.
    users: usize,
    /// The requested ending and why (the first request; an abort overrides a pending
    /// destroy).
    ending: Option<(Ending, String)>,
}

impl<T: Copy, C: Teardown<T>> UseCount<T, C> {
    /// `value`, to be ended by `teardown`.
    pub fn new(value: T, teardown: C) -> Arc<UseCount<T, C>> {
        Arc::new(UseCount {
            state: Mutex::new(UseState {
                value: Some(value),
                users: 0,
                ending: None,
            }),
            teardown,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, UseState<T>> {
        // The state is updated in single statements, never across a panic: a poisoned
        // lock still holds consistent state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A guard for one use of the value, or, once an ending was requested, why not.
    pub fn enter(self: &Arc<Self>) -> std::result::Result<Use<T, C>, String> {
        let mut s = self.lock();
        if let Some((_, why)) = &s.ending {
            return Err(why.clone());
        }
        let Some(value) = s.value else {
            return Err("already released".into());
        };
        s.users += 1;
        Ok(Use {
            owner: self.clone(),
            value,
        })
    }

    /// Request the ending `how` because of `why`: later [`UseCount::enter`]s fail with
    /// `why`. `Some` with the teardown's result when it ran now (no guard alive); `None`
    /// when it is deferred to the last guard's drop, or an ending was already requested
    /// (an abort still replaces a pending destroy).
    pub fn end(&self, how: Ending, why: &str) -> Option<Result<()>> {
        let mut s = self.lock();
        match &s.ending {
            None => s.ending = Some((how, why.to_string())),
            Some((Ending::Destroy, _)) if how == Ending::Abort && s.value.is_some() => {
                s.ending = Some((how, why.to_string()))
            }
            Some(_) => return None,
        }
        if s.users > 0 {
            return None;
        }
        let value = s.value.take()?;
        drop(s);
        Some(self.teardown.teardown(value, how))
    }

    /// Guards alive now.
    pub fn users(&self) -> usize {
        self.lock().users
    }

    /// Why an ending was requested, once one was.
    pub fn ended(&self) -> Option<String> {
        self.lock().ending.as_ref().map(|(_, w)| w.clone())
    }

    /// True once the teardown has run.
    pub fn torn_down(&self) -> bool {
        self.lock().value.is_none()
    }

    fn leave(&self) {
        let mut s = self.lock();
        s.users -= 1;
        if s.users > 0 {
            return;
        }
        let Some((how, _)) = s.ending else {
            return;
        };
        let Some(value) = s.value.take() else {
            return;
        };
        drop(s);
        if let Err(e) = self.teardown.teardown(value, how) {
            tracing::warn!("deferred {how:?} after the last call left: {e}");
        }
    }
}

/// One use of a [`UseCount`]ed value: the value cannot be torn down while this lives.
pub struct Use<T: Copy, C: Teardown<T>> {
    owner: Arc<UseCount<T, C>>,
    value: T,
}

impl<T: Copy, C: Teardown<T>> Use<T, C> {
    /// The value.
    pub fn get(&self) -> T {
        self.value
    }
}

impl<T: Copy, C: Teardown<T>> Drop for Use<T, C> {
    fn drop(&mut self) {
        self.owner.leave()
    }
}

/// An `ncclComm_t` that may move between threads.
#[derive(Clone, Copy)]
struct CommPtr(RawComm);

// SAFETY: an ncclComm_t is a handle the library lets any thread use; who may use it when
// is what `UseCount` and the callers' guards decide.
unsafe impl Send for CommPtr {}
// SAFETY: as above; `&CommPtr` only copies the handle.
unsafe impl Sync for CommPtr {}

/// `ncclCommAbort` / `ncclCommDestroy` of a communicator of the library.
struct Ender<'a>(&'a VendorLib);

impl Teardown<CommPtr> for Ender<'_> {
    fn teardown(&self, c: CommPtr, how: Ending) -> Result<()> {
        let lib = self.0;
        // SAFETY: `UseCount` calls this once, with the live handle, when no guard is
        // alive: no call of strata is inside the library on it, and nothing uses it
        // afterwards (later calls fail at `enter`). NCCL makes the communicator's device
        // current itself and restores the caller's.
        match how {
            Ending::Abort => lib.check(unsafe { (lib.sys.ncclCommAbort)(c.0) }, "ncclCommAbort"),
            Ending::Destroy => {
                lib.check(unsafe { (lib.sys.ncclCommDestroy)(c.0) }, "ncclCommDestroy")
            }
        }
    }
}

type Shared<'a> = UseCount<CommPtr, Ender<'a>>;

/// A vendor communicator, destroyed on drop. The collective calls enqueue on `stream`
/// (a stream of the communicator's device, which must be current) and return; addresses are device addresses. Calls on one communicator are
/// serialized by the caller (NCCL's rule for blocking communicators); each holds a use
/// guard, so an abort from another thread ([`AbortHandle`]) never frees the handle under
/// it (see the [module documentation](self)).
pub struct VendorComm<'a> {
    lib: &'a VendorLib,
    shared: Arc<Shared<'a>>,
}

/// A use guard of a [`VendorComm`] ([`VendorComm::enter`]): while it lives, the
/// communicator is not aborted nor destroyed (an abort requested meanwhile runs when the
/// last guard drops). Hold one across `ncclGroupStart` .. `ncclGroupEnd` for every
/// communicator a group enqueues on.
pub struct InUse<'a>(Use<CommPtr, Ender<'a>>);

impl InUse<'_> {
    fn raw(&self) -> RawComm {
        self.0.get().0
    }
}

/// Aborts a [`VendorComm`] from any thread, without its lock: marks it aborted at once
/// and runs `ncclCommAbort` when no call is inside it.
#[derive(Clone)]
pub struct AbortHandle<'a> {
    shared: Arc<Shared<'a>>,
}

impl AbortHandle<'_> {
    /// [`AbortHandle::abort_for`] with a generic reason.
    pub fn abort(&self) -> Result<()> {
        self.abort_for("ncclCommAbort was requested")
    }

    /// Mark the communicator aborted because of `why` (later calls fail with an
    /// `Error::Remote` naming it) and `ncclCommAbort` it: now when no call is inside
    /// (its result is returned), else when the last call leaves (`Ok` now). Once: later
    /// aborts, and the communicator's drop, do nothing.
    pub fn abort_for(&self, why: &str) -> Result<()> {
        self.shared.end(Ending::Abort, why).unwrap_or(Ok(()))
    }

    /// True once an abort (or the drop) was requested.
    pub fn is_aborted(&self) -> bool {
        self.shared.ended().is_some()
    }
}

/// A helper's result slot for [`within`].
struct Slot<T> {
    value: Option<T>,
    /// The helper returned (`value` set) or panicked (`value` left empty).
    done: bool,
    /// The caller stopped waiting: the helper hands its late result to `late`.
    gone: bool,
}

/// Run `f` on a helper thread and wait for it at most `timeout`: `None` past it. The
/// helper is then left to finish on its own and hands what it returns to `late` (a
/// communicator the library completes after its caller gave up is aborted there).
fn within<T: Send + 'static>(
    timeout: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
    late: impl FnOnce(T) + Send + 'static,
) -> Result<Option<T>> {
    let slot = Arc::new((
        Mutex::new(Slot {
            value: None,
            done: false,
            gone: false,
        }),
        Condvar::new(),
    ));
    let theirs = slot.clone();
    std::thread::Builder::new()
        .name(format!("strata-{what}"))
        .spawn(move || {
            let v = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok();
            let (m, cv) = &*theirs;
            let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
            if s.gone {
                drop(s);
                if let Some(v) = v {
                    late(v);
                }
                return;
            }
            s.value = v;
            s.done = true;
            cv.notify_all();
        })
        .map_err(|e| Error::System(format!("{what}: spawning a helper thread: {e}")))?;
    let (m, cv) = &*slot;
    let s = m.lock().unwrap_or_else(|e| e.into_inner());
    let (mut s, _) = cv
        .wait_timeout_while(s, timeout, |s| !s.done)
        .unwrap_or_else(|e| e.into_inner());
    if !s.done {
        s.gone = true;
        return Ok(None);
    }
    match s.value.take() {
        Some(v) => Ok(Some(v)),
        None => Err(Error::Internal(format!(
            "{what}: the helper thread panicked without a result"
        ))),
    }
}

impl VendorLib {
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
                self.vendor.name()
            )))
        })
    }
}

fn vp(a: u64) -> *mut c_void {
    a as usize as *mut c_void
}

impl<'a> VendorComm<'a> {
    fn new(lib: &'a VendorLib, raw: RawComm) -> VendorComm<'a> {
        VendorComm {
            lib,
            shared: UseCount::new(CommPtr(raw), Ender(lib)),
        }
    }

    /// A use guard for a call named `what` (every method here takes one for its own
    /// call; hold one across a group). `Error::Remote` naming the abort once the
    /// communicator was aborted.
    pub fn enter(&self, what: &str) -> Result<InUse<'a>> {
        self.shared.enter().map(InUse).map_err(|why| {
            Error::Remote(format!(
                "{what}: the {} communicator was aborted ({why})",
                self.lib.vendor.name()
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

    /// `ncclAllGather` of `bytes` per rank (as `ncclUint8`).
    pub fn all_gather(
        &self,
        send: u64,
        recv: u64,
        bytes: usize,
        stream: &dyn DevStream,
    ) -> Result<()> {
        let u = self.enter("ncclAllGather")?;
        // SAFETY: FFI enqueue on the live communicator (guarded by `u`) and a live stream
        // (borrowed), of the communicator's device, which the caller made current; the
        // caller holds both device ranges borrowed until the stream has run the call.
        let rc = unsafe {
            (self.lib.sys.ncclAllGather)(vp(send), vp(recv), bytes, 1, u.raw(), stream.raw())
        };
        self.lib.check(rc, "ncclAllGather")
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
        let u = self.enter(name)?;
        // SAFETY: as `all_gather`.
        let rc = unsafe { f(vp(send), vp(recv), count, dtype, op, u.raw(), stream.raw()) };
        self.lib.check(rc, name)
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
        let u = self.enter("ncclBroadcast")?;
        // SAFETY: as `all_gather`; the root argument sits in the op slot of the shared
        // prototype (`ncclBroadcast(send, recv, count, type, root, comm, stream)`).
        let rc = unsafe {
            (self.lib.sys.ncclBroadcast)(vp(send), vp(recv), bytes, 1, root, u.raw(), stream.raw())
        };
        self.lib.check(rc, "ncclBroadcast")
    }

    /// `ncclSend` of `bytes` to `peer`.
    pub fn send(&self, addr: u64, bytes: usize, peer: c_int, stream: &dyn DevStream) -> Result<()> {
        let u = self.enter("ncclSend")?;
        // SAFETY: as `all_gather`.
        let rc =
            unsafe { (self.lib.sys.ncclSend)(vp(addr), bytes, 1, peer, u.raw(), stream.raw()) };
        self.lib.check(rc, "ncclSend")
    }

    /// `ncclRecv` of `bytes` from `peer`.
    pub fn recv(&self, addr: u64, bytes: usize, peer: c_int, stream: &dyn DevStream) -> Result<()> {
        let u = self.enter("ncclRecv")?;
        // SAFETY: as `all_gather`.
        let rc =
            unsafe { (self.lib.sys.ncclRecv)(vp(addr), bytes, 1, peer, u.raw(), stream.raw()) };
        self.lib.check(rc, "ncclRecv")
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
        let u = match self.enter("ncclAlltoAll") {
            Ok(u) => u,
            Err(e) => return Some(Err(e)),
        };
        // SAFETY: as `all_gather`.
        let rc = unsafe { f(vp(send), vp(recv), bytes, 1, u.raw(), stream.raw()) };
        Some(self.lib.check(rc, "ncclAlltoAll"))
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
                    lib.vendor.name()
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn within_gives_up_at_the_timeout_and_keeps_fast_results() {
        let t = std::time::Instant::now();
        let r = within(
            Duration::from_millis(50),
            "test",
            || {
                std::thread::sleep(Duration::from_secs(2));
                1
            },
            |_| {},
        )
        .unwrap();
        assert_eq!(r, None);
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert_eq!(
            within(Duration::from_secs(5), "test", || 7, |_| {}).unwrap(),
            Some(7)
        );
    }

    #[test]
    fn within_hands_a_late_result_to_late_and_reports_a_panic() {
        let (tx, rx) = std::sync::mpsc::channel();
        let r = within(
            Duration::from_millis(20),
            "test",
            || {
                std::thread::sleep(Duration::from_millis(200));
                5
            },
            move |v| tx.send(v).unwrap(),
        )
        .unwrap();
        assert_eq!(r, None);
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 5);
        let e = within(
            Duration::from_secs(5),
            "test",
            || -> u8 { panic!("boom") },
            |_| {},
        )
        .unwrap_err();
        assert!(matches!(e, Error::Internal(_)), "{e}");
    }

    /// A fake teardown recording each run, and asserting none runs while a guard lives.
    #[derive(Default)]
    struct Log {
        runs: Mutex<Vec<(u32, Ending)>>,
        alive: AtomicUsize,
    }

    fn counted(log: &Arc<Log>) -> Arc<UseCount<u32, impl Teardown<u32>>> {
        let l = log.clone();
        UseCount::new(42u32, move |v: u32, how: Ending| -> Result<()> {
            assert_eq!(
                l.alive.load(Ordering::SeqCst),
                0,
                "torn down while a guard is alive"
            );
            l.runs.lock().unwrap().push((v, how));
            Ok(())
        })
    }

    #[test]
    fn abort_without_users_runs_at_once_and_once() {
        let log = Arc::new(Log::default());
        let c = counted(&log);
        assert!(c.end(Ending::Abort, "watchdog").unwrap().is_ok());
        assert_eq!(*log.runs.lock().unwrap(), vec![(42, Ending::Abort)]);
        assert!(c.torn_down());
        assert!(c.end(Ending::Abort, "again").is_none());
        assert!(c.end(Ending::Destroy, "drop").is_none());
        assert_eq!(c.enter().err().as_deref(), Some("watchdog"));
        assert_eq!(log.runs.lock().unwrap().len(), 1);
    }

    #[test]
    fn abort_waits_for_the_last_user_and_refuses_new_ones() {
        let log = Arc::new(Log::default());
        let c = counted(&log);
        let a = c.enter().unwrap();
        log.alive.fetch_add(1, Ordering::SeqCst);
        let b = c.enter().unwrap();
        log.alive.fetch_add(1, Ordering::SeqCst);
        assert_eq!((a.get(), c.users()), (42, 2));
        // Deferred: the guards are alive.
        assert!(c.end(Ending::Abort, "timed out").is_none());
        assert!(log.runs.lock().unwrap().is_empty());
        assert_eq!(c.ended().as_deref(), Some("timed out"));
        assert_eq!(c.enter().err().as_deref(), Some("timed out"));
        log.alive.fetch_sub(1, Ordering::SeqCst);
        drop(a);
        assert!(log.runs.lock().unwrap().is_empty());
        log.alive.fetch_sub(1, Ordering::SeqCst);
        drop(b);
        assert_eq!(*log.runs.lock().unwrap(), vec![(42, Ending::Abort)]);
        assert!(c.torn_down());
        assert!(c.end(Ending::Abort, "again").is_none());
        assert_eq!(log.runs.lock().unwrap().len(), 1);
    }

    #[test]
    fn an_abort_replaces_a_pending_destroy_and_destroy_runs_without_users() {
        let log = Arc::new(Log::default());
        let c = counted(&log);
        let a = c.enter().unwrap();
        log.alive.fetch_add(1, Ordering::SeqCst);
        assert!(c.end(Ending::Destroy, "dropped").is_none());
        assert!(c.end(Ending::Abort, "split timed out").is_none());
        log.alive.fetch_sub(1, Ordering::SeqCst);
        drop(a);
        assert_eq!(*log.runs.lock().unwrap(), vec![(42, Ending::Abort)]);

        let log = Arc::new(Log::default());
        let c = counted(&log);
        drop(c.enter().unwrap());
        assert!(c.end(Ending::Destroy, "dropped").unwrap().is_ok());
        assert_eq!(*log.runs.lock().unwrap(), vec![(42, Ending::Destroy)]);
    }

    /// Many threads enter and leave while others abort: the teardown runs exactly once,
    /// never with a guard alive, and no guard is handed out after the abort.
    #[test]
    fn concurrent_users_and_aborts_tear_down_exactly_once() {
        for round in 0..20 {
            let log = Arc::new(Log::default());
            let c = counted(&log);
            let aborted = Arc::new(std::sync::atomic::AtomicBool::new(false));
            std::thread::scope(|s| {
                for t in 0..6 {
                    let (c, log, aborted) = (c.clone(), log.clone(), aborted.clone());
                    s.spawn(move || {
                        for i in 0..300 {
                            if t == 0 && i == 50 + round * 7 {
                                let _ = c.end(Ending::Abort, "abort");
                                aborted.store(true, Ordering::SeqCst);
                            }
                            let was_aborted = aborted.load(Ordering::SeqCst);
                            match c.enter() {
                                Ok(u) => {
                                    assert!(!was_aborted, "a guard after the abort");
                                    log.alive.fetch_add(1, Ordering::SeqCst);
                                    assert!(log.runs.lock().unwrap().is_empty());
                                    std::thread::yield_now();
                                    assert_eq!(u.get(), 42);
                                    log.alive.fetch_sub(1, Ordering::SeqCst);
                                }
                                Err(why) => assert_eq!(why, "abort"),
                            }
                        }
                    });
                }
            });
            assert_eq!(*log.runs.lock().unwrap(), vec![(42, Ending::Abort)]);
            assert_eq!(c.users(), 0);
        }
    }

    /// The split helper's shape: a helper holds a guard past the caller's timeout; the
    /// caller aborts and returns; the abort runs when the helper leaves, on its thread.
    #[test]
    fn a_helper_stuck_past_the_timeout_defers_the_abort_to_its_return() {
        let log = Arc::new(Log::default());
        let c = counted(&log);
        let inside = c.enter().unwrap();
        log.alive.fetch_add(1, Ordering::SeqCst);
        let l = log.clone();
        let r = within(
            Duration::from_millis(20),
            "test",
            move || {
                let _inside = inside;
                std::thread::sleep(Duration::from_millis(150));
                l.alive.fetch_sub(1, Ordering::SeqCst);
            },
            |_| {},
        )
        .unwrap();
        assert!(r.is_none());
        assert!(c.end(Ending::Abort, "split timed out").is_none());
        assert!(
            log.runs.lock().unwrap().is_empty(),
            "aborted under the helper"
        );
        let t = std::time::Instant::now();
        while !c.torn_down() {
            assert!(t.elapsed() < Duration::from_secs(5), "never torn down");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(*log.runs.lock().unwrap(), vec![(42, Ending::Abort)]);
    }
}
