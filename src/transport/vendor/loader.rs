//! The loader: finds NCCL / RCCL, resolves its symbols (the `sys` layer) and turns its
//! result codes into [`Result`]s ([`VendorLib::check`]), the leaf of the vendor layers.

use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

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

    /// How to get the library (docs/errors.md), for the error when none loads.
    pub fn install_hint(self) -> &'static str {
        match self {
            Vendor::Nccl => {
                "install NCCL (pip install nvidia-nccl-cu12 or -cu13, as torch's CUDA wheels do, \
                 or the distribution's libnccl2) and set STRATA_NCCL_LIB to its libnccl.so.2"
            }
            Vendor::Rccl => "install ROCm's RCCL and set STRATA_RCCL_LIB to its librccl.so",
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
pub(super) struct Sys {
    pub(super) ncclGetVersion: unsafe extern "C" fn(*mut c_int) -> c_int,
    pub(super) ncclGetUniqueId: unsafe extern "C" fn(*mut VendorUniqueId) -> c_int,
    pub(super) ncclGetErrorString: unsafe extern "C" fn(c_int) -> *const c_char,
    pub(super) ncclCommInitRank:
        unsafe extern "C" fn(*mut RawComm, c_int, VendorUniqueId, c_int) -> c_int,
    pub(super) ncclCommDestroy: unsafe extern "C" fn(RawComm) -> c_int,
    pub(super) ncclCommAbort: unsafe extern "C" fn(RawComm) -> c_int,
    pub(super) ncclCommGetAsyncError: unsafe extern "C" fn(RawComm, *mut c_int) -> c_int,
    pub(super) ncclGroupStart: unsafe extern "C" fn() -> c_int,
    pub(super) ncclGroupEnd: unsafe extern "C" fn() -> c_int,
    #[allow(clippy::type_complexity)]
    pub(super) ncclAllGather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, RawStream) -> c_int,
    pub(super) ncclReduceScatter: ReduceFn,
    pub(super) ncclAllReduce: ReduceFn,
    /// `ncclBroadcast(send, recv, count, dtype, root, comm, stream)`: the same shape.
    pub(super) ncclBroadcast: ReduceFn,
    pub(super) ncclSend:
        unsafe extern "C" fn(*const c_void, usize, c_int, c_int, RawComm, RawStream) -> c_int,
    pub(super) ncclRecv:
        unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, RawStream) -> c_int,
    /// `ncclCommSplit(comm, color, key, *newcomm, config)` (NCCL 2.18+, RCCL 2.18+).
    pub(super) ncclCommSplit:
        Option<unsafe extern "C" fn(RawComm, c_int, c_int, *mut RawComm, *mut c_void) -> c_int>,
    /// `ncclAlltoAll` (NCCL 2.28+) or RCCL's `ncclAllToAll`.
    #[allow(clippy::type_complexity)]
    pub(super) all_to_all: Option<
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, RawStream) -> c_int,
    >,
}

/// A loaded NCCL or RCCL.
pub struct VendorLib {
    vendor: Vendor,
    path: String,
    version: i32,
    pub(super) sys: Sys,
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

    /// The process's `vendor` library from `path` when none is loaded yet (then
    /// [`VendorLib::get`] returns it too): a library in front of NCCL (`libstrata_nccl`)
    /// hands the real library it found, since the names `libnccl.so.2` would find may be
    /// the front itself (under its `LD_AUDIT` object). A library loaded before is kept.
    pub fn get_at(vendor: Vendor, path: &str) -> Result<&'static VendorLib> {
        let cell = match vendor {
            Vendor::Nccl => &NCCL,
            Vendor::Rccl => &RCCL,
        };
        cell.get_or_init(|| {
            // SAFETY: as in `load`: the vendor's own initializers.
            match unsafe { libloading::Library::new(path) } {
                Ok(lib) => {
                    VendorLib::resolve(vendor, path, lib).map_err(|e| format!("{path}: {e}"))
                }
                Err(e) => Err(format!("{path}: {e}")),
            }
        })
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
            "the {} transport could not load its library: {}; tried: {}",
            vendor.name(),
            vendor.install_hint(),
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
