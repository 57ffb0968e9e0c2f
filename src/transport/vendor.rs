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

use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, OnceLock};
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

/// A vendor communicator, destroyed on drop. The collective calls enqueue on `stream`
/// (a `cudaStream_t` / `hipStream_t` of the communicator's device, which must be
/// current) and return; addresses are device addresses. The handle is shared with its
/// [`AbortHandle`]s, so an abort never waits for whoever is calling into the library.
pub struct VendorComm<'a> {
    lib: &'a VendorLib,
    raw: Arc<AtomicPtr<c_void>>,
}

/// Aborts a [`VendorComm`] from any thread, without its lock (`ncclCommAbort` is how a
/// call blocked in the library on that communicator is woken).
#[derive(Clone)]
pub struct AbortHandle<'a> {
    lib: &'a VendorLib,
    raw: Arc<AtomicPtr<c_void>>,
}

impl AbortHandle<'_> {
    /// `ncclCommAbort`, once (later calls and the communicator's drop do nothing).
    pub fn abort(&self) -> Result<()> {
        let raw = self.raw.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if raw.is_null() {
            return Ok(());
        }
        // SAFETY: `raw` was live and is released exactly once (everyone else now sees
        // null); a call blocked on it returns with an error, as NCCL documents.
        self.lib.check(
            unsafe { (self.lib.sys.ncclCommAbort)(raw) },
            "ncclCommAbort",
        )
    }
}

/// Run `f` on a helper thread and wait for it at most `timeout`: `None` past it (the
/// helper is left to finish on its own; what it returns then is dropped).
fn within<T: Send + 'static>(
    timeout: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<Option<T>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(format!("strata-{what}"))
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| Error::System(format!("{what}: spawning a helper thread: {e}")))?;
    match rx.recv_timeout(timeout) {
        Ok(v) => Ok(Some(v)),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Ok(None),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(Error::Internal(format!(
            "{what}: the helper thread ended without a result"
        ))),
    }
}

impl VendorLib {
    /// [`VendorLib::comm_init_rank`] that gives up after `timeout` (a rank that never
    /// joins): `bind` makes the device current on the helper thread that calls
    /// `ncclCommInitRank`. Past the timeout the result is `Remote`; a communicator the
    /// library completes later is destroyed.
    pub fn comm_init_rank_within(
        &'static self,
        nranks: usize,
        id: &VendorUniqueId,
        rank: usize,
        timeout: Duration,
        bind: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> Result<VendorComm<'static>> {
        let id = *id;
        let made = within(timeout, "nccl-init", move || {
            bind().and_then(|_| self.comm_init_rank(nranks, &id, rank))
        })?;
        made.unwrap_or_else(|| {
            Err(Error::Remote(format!(
                "{}: ncclCommInitRank of rank {rank} of {nranks} did not complete within \
                 {timeout:?} (a rank never joined)",
                self.vendor.name()
            )))
        })
    }
}

// SAFETY: an ncclComm_t may be used from any thread, one call at a time; strata calls
// it only from the owning communicator's stream thread (and abort from any thread,
// which NCCL allows).
unsafe impl Send for VendorComm<'_> {}
// SAFETY: as above.
unsafe impl Sync for VendorComm<'_> {}

fn vp(a: u64) -> *mut c_void {
    a as usize as *mut c_void
}

impl<'a> VendorComm<'a> {
    fn new(lib: &'a VendorLib, raw: RawComm) -> VendorComm<'a> {
        VendorComm {
            lib,
            raw: Arc::new(AtomicPtr::new(raw)),
        }
    }

    /// The raw handle (null once aborted).
    pub fn raw(&self) -> RawComm {
        self.raw.load(Ordering::Acquire)
    }

    /// The library.
    pub fn lib(&self) -> &'a VendorLib {
        self.lib
    }

    /// `ncclAllGather` of `bytes` per rank (as `ncclUint8`).
    pub fn all_gather(&self, send: u64, recv: u64, bytes: usize, stream: RawStream) -> Result<()> {
        // SAFETY: FFI enqueue; the caller borrows both device ranges until the stream is
        // synchronized and passes a live stream of the current device.
        let rc = unsafe {
            (self.lib.sys.ncclAllGather)(vp(send), vp(recv), bytes, 1, self.raw(), stream)
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
        stream: RawStream,
    ) -> Result<()> {
        let (f, name) = match which {
            Reduction::ReduceScatter => (self.lib.sys.ncclReduceScatter, "ncclReduceScatter"),
            Reduction::AllReduce => (self.lib.sys.ncclAllReduce, "ncclAllReduce"),
        };
        // SAFETY: as `all_gather`.
        let rc = unsafe { f(vp(send), vp(recv), count, dtype, op, self.raw(), stream) };
        self.lib.check(rc, name)
    }

    /// `ncclBroadcast` of `bytes` from `root`.
    pub fn broadcast(
        &self,
        send: u64,
        recv: u64,
        bytes: usize,
        root: c_int,
        stream: RawStream,
    ) -> Result<()> {
        // SAFETY: as `all_gather`; the root argument sits in the op slot of the shared
        // prototype (`ncclBroadcast(send, recv, count, type, root, comm, stream)`).
        let rc = unsafe {
            (self.lib.sys.ncclBroadcast)(vp(send), vp(recv), bytes, 1, root, self.raw(), stream)
        };
        self.lib.check(rc, "ncclBroadcast")
    }

    /// `ncclSend` of `bytes` to `peer`.
    pub fn send(&self, addr: u64, bytes: usize, peer: c_int, stream: RawStream) -> Result<()> {
        // SAFETY: as `all_gather`.
        let rc = unsafe { (self.lib.sys.ncclSend)(vp(addr), bytes, 1, peer, self.raw(), stream) };
        self.lib.check(rc, "ncclSend")
    }

    /// `ncclRecv` of `bytes` from `peer`.
    pub fn recv(&self, addr: u64, bytes: usize, peer: c_int, stream: RawStream) -> Result<()> {
        // SAFETY: as `all_gather`.
        let rc = unsafe { (self.lib.sys.ncclRecv)(vp(addr), bytes, 1, peer, self.raw(), stream) };
        self.lib.check(rc, "ncclRecv")
    }

    /// The library's all-to-all of `bytes` per peer, `None` when it has none (the
    /// caller then groups sends and receives).
    pub fn all_to_all(
        &self,
        send: u64,
        recv: u64,
        bytes: usize,
        stream: RawStream,
    ) -> Option<Result<()>> {
        let f = self.lib.sys.all_to_all?;
        // SAFETY: as `all_gather`.
        let rc = unsafe { f(vp(send), vp(recv), bytes, 1, self.raw(), stream) };
        Some(self.lib.check(rc, "ncclAlltoAll"))
    }

    /// `ncclCommSplit` (collective over this communicator): `Ok(None)` for ranks passing
    /// `None`; the outer `None` when the library lacks the call.
    pub fn split(&self, color: Option<u32>, key: i32) -> Option<Result<Option<VendorComm<'a>>>> {
        split_on(self.lib, self.raw(), color, key)
    }

    /// `ncclCommGetAsyncError`: an error the communicator hit while running.
    pub fn async_error(&self) -> Result<()> {
        let mut e: c_int = 0;
        // SAFETY: `raw` is a live communicator; writes one int.
        let rc = unsafe { (self.lib.sys.ncclCommGetAsyncError)(self.raw(), &mut e) };
        self.lib.check(rc, "ncclCommGetAsyncError")?;
        self.lib.check(e, "asynchronous communicator error")
    }

    /// `ncclCommAbort` through a shared handle: stop everything in flight; the
    /// communicator must not be used afterwards (drop still releases nothing twice).
    pub fn abort_in_place(&self) -> Result<()> {
        self.abort_handle().abort()
    }

    /// `ncclCommAbort`: stop everything in flight and free the communicator.
    pub fn abort(self) -> Result<()> {
        self.abort_in_place()
    }

    /// A handle that aborts this communicator from any thread, without its lock.
    pub fn abort_handle(&self) -> AbortHandle<'a> {
        AbortHandle {
            lib: self.lib,
            raw: self.raw.clone(),
        }
    }
}

/// `ncclCommSplit` of the communicator `raw` (see [`VendorComm::split`]).
fn split_on(
    lib: &VendorLib,
    raw: RawComm,
    color: Option<u32>,
    key: i32,
) -> Option<Result<Option<VendorComm<'_>>>> {
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
    if raw.is_null() {
        return Some(Err(Error::Remote(format!(
            "ncclCommSplit: the {} communicator was aborted",
            lib.vendor.name()
        ))));
    }
    let mut out: RawComm = std::ptr::null_mut();
    // SAFETY: FFI, collective over the parent `raw` (live unless aborted meanwhile, which
    // makes the library return an error); writes one handle (NULL for NOCOLOR); a NULL
    // config asks for the parent's.
    let rc = unsafe { f(raw, c, key, &mut out, std::ptr::null_mut()) };
    Some(
        lib.check(rc, "ncclCommSplit")
            .map(|_| (!out.is_null()).then(|| VendorComm::new(lib, out))),
    )
}

impl VendorComm<'static> {
    /// [`VendorComm::split`] that gives up after `timeout` (a rank that never calls it):
    /// the split runs on a helper thread (`bind` makes the device current there); past
    /// the timeout this communicator is aborted, which wakes the helper, and the result
    /// is `Remote`. The caller keeps whatever lock serializes calls on this
    /// communicator; an abort does not need it.
    pub fn split_within(
        &self,
        color: Option<u32>,
        key: i32,
        timeout: Duration,
        bind: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> Option<Result<Option<VendorComm<'static>>>> {
        self.lib.sys.ncclCommSplit?;
        let handle = self.raw.clone();
        let aborter = self.abort_handle();
        let lib = self.lib;
        let r = within(timeout, "nccl-split", move || {
            bind().and_then(|_| {
                split_on(lib, handle.load(Ordering::Acquire), color, key).unwrap_or(Ok(None))
            })
        });
        Some(match r {
            Err(e) => Err(e),
            Ok(Some(r)) => r,
            Ok(None) => {
                let _ = aborter.abort();
                Err(Error::Remote(format!(
                    "{}: ncclCommSplit did not complete within {timeout:?} (a rank never \
                     called it); the parent communicator was aborted",
                    lib.vendor.name()
                )))
            }
        })
    }
}

impl Drop for VendorComm<'_> {
    fn drop(&mut self) {
        let raw = self.raw.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !raw.is_null() {
            // SAFETY: `raw` is live and released exactly once (an abort handle now sees
            // null).
            let _ = unsafe { (self.lib.sys.ncclCommDestroy)(raw) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_gives_up_at_the_timeout_and_keeps_fast_results() {
        let t = std::time::Instant::now();
        let r = within(Duration::from_millis(50), "test", || {
            std::thread::sleep(Duration::from_secs(2));
            1
        })
        .unwrap();
        assert_eq!(r, None);
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert_eq!(
            within(Duration::from_secs(5), "test", || 7).unwrap(),
            Some(7)
        );
    }
}
