//! `libstrata_nccl_audit.so`: an `LD_AUDIT` object (`man 7 rtld-audit`) that answers the
//! dynamic loader's searches for `libnccl.so.2` / `libnccl.so` with `libstrata_nccl.so`,
//! so an unmodified program (`DT_NEEDED libnccl.so.2` found through its `RPATH`, like
//! PyTorch's wheels, or a `dlopen("libnccl.so.2")`) runs on strata:
//!
//! ```sh
//! LD_AUDIT=/path/to/libstrata_nccl_audit.so python train.py
//! ```
//!
//! Unlike `LD_PRELOAD`, nothing is loaded into a process that never looks for NCCL.
//! (`LD_AUDIT` itself is inherited by child processes through the environment, as any
//! variable is; each child is then redirected only where it searches for libnccl.)
//!
//! # The route
//!
//! The front library: `STRATA_NCCL_FRONT_LIB`, else `libstrata_nccl.so` in this object's
//! own directory (found with `dladdr` on one of its functions).
//!
//! `la_objsearch(name, cookie, flag)`, for a name whose last component is `libnccl.so.2`
//! or `libnccl.so` (every other name passes unchanged):
//! - The loader's first call (`LA_SER_ORIG`) with a bare name: unchanged, so the loader
//!   searches its usual directories (the requester's `RPATH`/`RUNPATH`,
//!   `LD_LIBRARY_PATH`, `ld.so.cache`, the default directories) and asks again with each
//!   full path. The first of those that is an existing file (not the front library) is
//!   the real library: it is remembered, and the front library is answered instead. A
//!   candidate that does not exist passes unchanged (the loader moves on). With
//!   `STRATA_NCCL_DEVICE=cpu` the bare name is answered with the front library at once
//!   (no real library is needed).
//! - An explicit path (`dlopen("/x/libnccl.so.2")`): an existing file that is not the
//!   front library is remembered as the real one (when none is yet) and answered with
//!   the front library.
//! - Requests from the front library itself (its `cookie`, learned in `la_objopen`) are
//!   never redirected, and its request for [`REAL_NAME`] is answered with the remembered
//!   real library: that is how `libstrata_nccl.so` (`real.rs`) reaches the library its
//!   `libnccl.so.2` stood in for. (The environment cannot carry it: this object runs
//!   with its own copy of the C library, whose `setenv` the program never sees; and the
//!   name `libnccl.so.2` itself now names the front library in the loader's list.)
//!   With nothing remembered, that request fails and `real.rs` goes on to its other
//!   candidates (`STRATA_NCCL_REAL_LIB`, `STRATA_NCCL_LIB`, `libnccl.so.2` searched
//!   from the front library, unredirected).
//!
//! Limits: a program whose `libnccl.so.2` exists nowhere fails to start as it would
//! without this object (the loader gives no "last candidate" call to answer), unless
//! `STRATA_NCCL_DEVICE=cpu`; a candidate of the wrong ELF class is not told apart (the
//! front library loads; `real.rs` then fails to load the candidate and tries the others).
//!
//! `unsafe` here: the loader's C strings and `link_map`, `dladdr`; each with a SAFETY
//! comment.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// The name `libstrata_nccl.so` asks the loader for to reach the real library this
/// object remembered (the same string as `strata_nccl::real::AUDIT_REAL_NAME`).
pub const REAL_NAME: &str = "strata-nccl-audit-real-libnccl.so.2";

/// The audit interface version this object is written for: `la_objsearch` and
/// `la_objopen` are the same in versions 1 and 2 (glibc 2.35 raised `LAV_CURRENT` to 2
/// for `la_symbind`, which this object does not use).
const LAV_CURRENT: c_uint = 2;

const LA_SER_ORIG: c_uint = 0x01;

/// The loader's `struct link_map`, its first two fields (the public ABI of `<link.h>`).
#[repr(C)]
pub struct LinkMap {
    l_addr: usize,
    l_name: *const c_char,
}

#[repr(C)]
struct DlInfo {
    dli_fname: *const c_char,
    dli_fbase: *mut c_void,
    dli_sname: *const c_char,
    dli_saddr: *mut c_void,
}

extern "C" {
    fn dladdr(addr: *const c_void, info: *mut DlInfo) -> c_int;
}

/// The audit interface version: the loader's when it is at most ours, else ours; 0
/// (this object unused) for 0.
#[no_mangle]
pub extern "C" fn la_version(version: c_uint) -> c_uint {
    version.min(LAV_CURRENT)
}

/// Remembers the front library's cookie when it is loaded (its own requests for
/// libnccl must reach the real one). No symbol binding is audited (returns 0).
///
/// # Safety
/// Called by the loader with a valid `link_map` and cookie.
#[no_mangle]
pub unsafe extern "C" fn la_objopen(map: *mut LinkMap, _lmid: isize, cookie: *mut usize) -> c_uint {
    if map.is_null() {
        return 0;
    }
    // SAFETY: the loader's link_map; l_name is NULL or a C string (empty for the program).
    let name = unsafe { (*map).l_name };
    if name.is_null() {
        return 0;
    }
    // SAFETY: a NUL-terminated string the loader owns for the object's lifetime.
    let name = unsafe { CStr::from_ptr(name) };
    if let (Some(front), Ok(name)) = (front(), name.to_str()) {
        let redirected = REDIRECTED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|r| r == name);
        if redirected || (!name.is_empty() && same_file(Path::new(name), &front.canonical)) {
            FRONT_COOKIE.store(cookie as usize, Ordering::Relaxed);
        }
    }
    0
}

/// The loader asks where to find `name` (module doc: what is answered).
///
/// # Safety
/// Called by the loader with a NUL-terminated `name`.
#[no_mangle]
pub unsafe extern "C" fn la_objsearch(
    name: *const c_char,
    cookie: *mut usize,
    flag: c_uint,
) -> *mut c_char {
    if name.is_null() {
        return name as *mut c_char;
    }
    // SAFETY: the loader passes a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("");
    match answer(s, cookie as usize, flag) {
        Answer::Unchanged => name as *mut c_char,
        Answer::Path(p) => p.as_ptr() as *mut c_char,
        Answer::Refuse => std::ptr::null_mut(),
    }
}

enum Answer {
    Unchanged,
    Path(&'static CStr),
    Refuse,
}

/// The front library: where it is (as answered to the loader) and its canonical path.
struct Front {
    path: CString,
    canonical: PathBuf,
}

static FRONT_COOKIE: AtomicUsize = AtomicUsize::new(0);

/// The names answered with the front library: the loader names the front library's
/// `link_map` after the candidate it asked about, not after the answer.
static REDIRECTED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The real library, remembered from the first search that found a file.
static REAL: OnceLock<CString> = OnceLock::new();

fn front() -> Option<&'static Front> {
    static FRONT: OnceLock<Option<Front>> = OnceLock::new();
    FRONT
        .get_or_init(|| {
            let path = match std::env::var_os("STRATA_NCCL_FRONT_LIB") {
                Some(p) if !p.is_empty() => PathBuf::from(p),
                _ => own_dir()?.join("libstrata_nccl.so"),
            };
            let canonical = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
            let path = CString::new(path.into_os_string().into_encoded_bytes()).ok()?;
            Some(Front { path, canonical })
        })
        .as_ref()
}

/// The directory of this object.
fn own_dir() -> Option<PathBuf> {
    let mut info = DlInfo {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the loader's tables and fills `info`.
    let ok = unsafe { dladdr(la_objsearch as *const c_void, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is the object's NUL-terminated path, owned by the loader.
    let f = unsafe { CStr::from_ptr(info.dli_fname) }.to_str().ok()?;
    let f = std::fs::canonicalize(f).unwrap_or_else(|_| PathBuf::from(f));
    f.parent().map(Path::to_path_buf)
}

fn same_file(a: &Path, canonical_b: &Path) -> bool {
    std::fs::canonicalize(a).is_ok_and(|a| a == canonical_b)
}

fn is_nccl(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    base == "libnccl.so.2" || base == "libnccl.so"
}

/// Serializes the decisions (the loader already holds its lock; this is for clarity).
static LOCK: Mutex<()> = Mutex::new(());

fn answer(name: &str, cookie: usize, flag: c_uint) -> Answer {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let from_front = cookie != 0 && cookie == FRONT_COOKIE.load(Ordering::Relaxed);
    if from_front {
        if name == REAL_NAME {
            return match REAL.get() {
                Some(real) => Answer::Path(real.as_c_str()),
                None => Answer::Refuse,
            };
        }
        return Answer::Unchanged;
    }
    if !is_nccl(name) {
        return Answer::Unchanged;
    }
    let Some(front) = front() else {
        return Answer::Unchanged;
    };
    if flag == LA_SER_ORIG && !name.contains('/') {
        if std::env::var("STRATA_NCCL_DEVICE").is_ok_and(|v| v == "cpu") {
            return Answer::Path(front.path.as_c_str());
        }
        return Answer::Unchanged;
    }
    // A full path: a candidate of the search, or an explicit path.
    let path = Path::new(name);
    if !path.is_file() || same_file(path, &front.canonical) {
        return Answer::Unchanged;
    }
    if REAL.get().is_none() {
        if let Ok(c) = CString::new(name) {
            let _ = REAL.set(c);
        }
    }
    REDIRECTED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(name.to_owned());
    Answer::Path(front.path.as_c_str())
}
