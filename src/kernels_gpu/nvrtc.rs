//! NVRTC, loaded at run time by strata itself (libloading), so any CUDA major works: the
//! library is `STRATA_NVRTC_LIB` when set, else the first of [`NVRTC_CANDIDATES`] the
//! loader finds (CUDA 13, 12, 11.2, then the unversioned name). Only the stable C entry
//! points every NVRTC since 11.2 has are used. Every failure is an `Error`, never a
//! panic; NVRTC's log comes with a failed compilation.

use super::source::{cuda_include_dirs, CUDA_SOURCE, NVRTC_OPTIONS};
use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

/// Library names tried, newest CUDA first.
pub(crate) const NVRTC_CANDIDATES: [&str; 4] = [
    "libnvrtc.so.13",
    "libnvrtc.so.12",
    "libnvrtc.so.11.2",
    "libnvrtc.so",
];

type Prog = *mut c_void;
type Res = c_int;

/// The entry points strata calls (NVRTC's C API).
struct Api {
    _lib: libloading::Library,
    /// Where it was loaded from.
    name: String,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Res,
    error_string: unsafe extern "C" fn(Res) -> *const c_char,
    create: unsafe extern "C" fn(
        *mut Prog,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Res,
    compile: unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> Res,
    log_size: unsafe extern "C" fn(Prog, *mut usize) -> Res,
    log: unsafe extern "C" fn(Prog, *mut c_char) -> Res,
    ptx_size: unsafe extern "C" fn(Prog, *mut usize) -> Res,
    ptx: unsafe extern "C" fn(Prog, *mut c_char) -> Res,
    /// `nvrtcGetCUBINSize` / `nvrtcGetCUBIN` (CUDA 11.1 and later; `None` before).
    cubin: Option<(
        unsafe extern "C" fn(Prog, *mut usize) -> Res,
        unsafe extern "C" fn(Prog, *mut c_char) -> Res,
    )>,
    destroy: unsafe extern "C" fn(*mut Prog) -> Res,
}

/// The names this process tries, in order.
pub(crate) fn nvrtc_candidates() -> Vec<String> {
    std::env::var("STRATA_NVRTC_LIB")
        .ok()
        .filter(|p| !p.is_empty())
        .into_iter()
        .chain(NVRTC_CANDIDATES.iter().map(|s| s.to_string()))
        .collect()
}

fn load() -> std::result::Result<Api, String> {
    let mut tried = Vec::new();
    for name in nvrtc_candidates() {
        // SAFETY: loading libnvrtc runs its initializers, as any use of it would.
        let lib = match unsafe { libloading::Library::new(&name) } {
            Ok(l) => l,
            Err(e) => {
                tried.push(format!("{name} ({e})"));
                continue;
            }
        };
        // SAFETY: each symbol is looked up with the signature NVRTC's header declares
        // for it (stable since CUDA 11.2); the function pointers live as long as `lib`,
        // which the returned Api owns.
        let api = unsafe {
            (|| -> std::result::Result<Api, libloading::Error> {
                Ok(Api {
                    version: *lib.get(b"nvrtcVersion\0")?,
                    error_string: *lib.get(b"nvrtcGetErrorString\0")?,
                    create: *lib.get(b"nvrtcCreateProgram\0")?,
                    compile: *lib.get(b"nvrtcCompileProgram\0")?,
                    log_size: *lib.get(b"nvrtcGetProgramLogSize\0")?,
                    log: *lib.get(b"nvrtcGetProgramLog\0")?,
                    ptx_size: *lib.get(b"nvrtcGetPTXSize\0")?,
                    ptx: *lib.get(b"nvrtcGetPTX\0")?,
                    cubin: match (lib.get(b"nvrtcGetCUBINSize\0"), lib.get(b"nvrtcGetCUBIN\0")) {
                        (Ok(a), Ok(b)) => Some((*a, *b)),
                        _ => None,
                    },
                    destroy: *lib.get(b"nvrtcDestroyProgram\0")?,
                    name: name.clone(),
                    _lib: lib,
                })
            })()
        };
        match api {
            Ok(a) => return Ok(a),
            Err(e) => tried.push(format!("{name} (missing symbol: {e})")),
        }
    }
    Err(tried.join("; "))
}

fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|tried| not_found(tried))
}

/// The error when no NVRTC loads: what was tried, and how to get one.
fn not_found(tried: &str) -> Error {
    Error::System(format!(
        "libnvrtc not found: tried {tried}; install NVRTC (pip install nvidia-cuda-nvrtc-cu12, \
         or the CUDA toolkit) and put its lib directory on LD_LIBRARY_PATH, or set \
         STRATA_NVRTC_LIB to its libnvrtc.so"
    ))
}

/// `(library, major, minor)` of the NVRTC in use.
pub(crate) fn nvrtc_version() -> Result<(String, i32, i32)> {
    let a = api()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: FFI writing two ints.
    let r = unsafe { (a.version)(&mut major, &mut minor) };
    check(a, r, "nvrtcVersion")?;
    Ok((a.name.clone(), major, minor))
}

fn check(a: &Api, r: Res, what: &str) -> Result<()> {
    if r == 0 {
        return Ok(());
    }
    // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string (or NULL).
    let msg = unsafe {
        let p = (a.error_string)(r);
        if p.is_null() {
            "unknown".to_string()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Err(Error::System(format!("{what} failed: {msg} ({r})")))
}

/// A program, destroyed on every exit.
struct Program<'a> {
    a: &'a Api,
    p: Prog,
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: `p` came from nvrtcCreateProgram and is destroyed once.
        let _ = unsafe { (self.a.destroy)(&mut self.p) };
    }
}

impl Program<'_> {
    /// NVRTC's log of the last compilation.
    fn log(&self) -> String {
        let mut n = 0usize;
        // SAFETY: FFI writing one size_t for a live program.
        if unsafe { (self.a.log_size)(self.p, &mut n) } != 0 || n == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` holds the `n` bytes (NUL included) the log needs.
        if unsafe { (self.a.log)(self.p, buf.as_mut_ptr() as *mut c_char) } != 0 {
            return String::new();
        }
        String::from_utf8_lossy(&buf[..n.saturating_sub(1)]).into_owned()
    }
}

/// What a compilation returns.
pub(crate) enum Output {
    /// PTX text for a virtual architecture (`compute_XY`), JIT-compiled by the driver.
    Ptx(String),
    /// A CUBIN for a real architecture (`sm_XY`): no JIT, and no driver too old for the
    /// NVRTC's PTX version.
    Cubin(Vec<u8>),
}

/// Compile [`CUDA_SOURCE`] for `arch`, or load the output of an identical compilation
/// from `cache_dir` ([`super::cache`]); a fresh output is stored there (a failure to
/// store is logged, never an error).
pub(crate) fn compile(arch: &str, cache_dir: Option<&std::path::Path>) -> Result<Output> {
    // compute_XY: PTX; sm_XY: CUBIN.
    let (cubin, digits) = match (arch.strip_prefix("compute_"), arch.strip_prefix("sm_")) {
        (Some(d), _) => (false, d),
        (_, Some(d)) => (true, d),
        _ => (false, ""),
    };
    if digits.len() < 2 || !digits.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(Error::InvalidArgument(format!(
            "NVRTC arch must be a virtual architecture such as compute_80 (PTX) or a real \
             one such as sm_90 (CUBIN), got {arch:?}"
        )));
    }
    let a = api()?;
    if cubin && a.cubin.is_none() {
        return Err(Error::System(format!(
            "{} has no nvrtcGetCUBIN (CUDA 11.1 or later has it); compile to PTX",
            a.name
        )));
    }
    let (found, tried) = cuda_include_dirs();
    if found.is_empty() {
        return Err(Error::System(format!(
            "cuda_fp16.h not found: tried {tried:?}; set STRATA_CUDA_INCLUDE to the \
             include directory of nvidia-cuda-runtime (scripts/gpu-toolchains prints it)"
        )));
    }
    let cstr = |s: String| {
        CString::new(s).map_err(|_| Error::InvalidArgument("a NUL byte in an NVRTC option".into()))
    };
    let mut options: Vec<CString> = NVRTC_OPTIONS
        .iter()
        .map(|s| cstr(s.to_string()))
        .collect::<Result<_>>()?;
    options.push(cstr(format!("--gpu-architecture={arch}"))?);
    // The register geometry the host plans launches with (plan::Geometry).
    options.push(cstr(format!(
        "-DSTRATA_LANE_ELEMS={}",
        super::plan::Geometry::current().lane_elems
    ))?);
    for d in &found {
        options.push(cstr(format!("--include-path={}", d.display()))?);
    }
    let ident = cache_dir.map(|_| {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: FFI writing two ints.
        let _ = unsafe { (a.version)(&mut major, &mut minor) };
        let opts: Vec<String> = options
            .iter()
            .map(|o| o.to_string_lossy().into_owned())
            .collect();
        super::cache::identity(
            &format!("{} {major}.{minor}", a.name),
            arch,
            &opts,
            CUDA_SOURCE,
        )
    });
    if let (Some(dir), Some(id)) = (cache_dir, &ident) {
        if let Some(bytes) = super::cache::load(dir, arch, id) {
            if cubin {
                return Ok(Output::Cubin(bytes));
            }
            if let Ok(p) = String::from_utf8(bytes) {
                return Ok(Output::Ptx(p));
            }
        }
    }
    let out = compile_now(a, arch, cubin, &options)?;
    if let (Some(dir), Some(id)) = (cache_dir, &ident) {
        let bytes = match &out {
            Output::Cubin(c) => c.as_slice(),
            Output::Ptx(p) => p.as_bytes(),
        };
        if let Err(e) = super::cache::store(dir, arch, id, bytes) {
            tracing::debug!("strata kernels not cached in {}: {e}", dir.display());
        }
    }
    Ok(out)
}

/// One NVRTC compilation of [`CUDA_SOURCE`] with `options`.
fn compile_now(a: &Api, arch: &str, cubin: bool, options: &[CString]) -> Result<Output> {
    let cstr = |s: String| {
        CString::new(s).map_err(|_| Error::InvalidArgument("a NUL byte in an NVRTC option".into()))
    };
    let src = cstr(CUDA_SOURCE.to_string())?;
    let name = cstr("strata_quant.cu".into())?;
    let mut p: Prog = std::ptr::null_mut();
    // SAFETY: FFI with NUL-terminated strings that outlive the call and no headers.
    let r = unsafe {
        (a.create)(
            &mut p,
            src.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    check(a, r, "nvrtcCreateProgram")?;
    let prog = Program { a, p };
    let ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: `ptrs` holds `ptrs.len()` NUL-terminated option strings alive for the call.
    let r = unsafe { (a.compile)(prog.p, ptrs.len() as c_int, ptrs.as_ptr()) };
    if r != 0 {
        return Err(Error::System(format!(
            "NVRTC ({}) failed to compile the strata kernels for {arch}:\n{}",
            a.name,
            prog.log()
        )));
    }
    let (size_fn, get_fn, what) = match (cubin, a.cubin) {
        (true, Some((size, get))) => (size, get, "nvrtcGetCUBIN"),
        _ => (a.ptx_size, a.ptx, "nvrtcGetPTX"),
    };
    let mut n = 0usize;
    // SAFETY: FFI writing one size_t for a compiled program.
    check(a, unsafe { size_fn(prog.p, &mut n) }, what)?;
    let mut buf = vec![0u8; n.max(1)];
    // SAFETY: `buf` holds the `n` bytes the output needs (PTX: NUL included).
    check(
        a,
        unsafe { get_fn(prog.p, buf.as_mut_ptr() as *mut c_char) },
        what,
    )?;
    if cubin {
        buf.truncate(n);
        return Ok(Output::Cubin(buf));
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    buf.truncate(end);
    String::from_utf8(buf)
        .map(Output::Ptx)
        .map_err(|_| Error::System("NVRTC returned PTX that is not UTF-8".into()))
}

pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first error a GPU user without NVRTC meets names the install and the variable.
    #[test]
    fn missing_nvrtc_says_how_to_get_it() {
        let msg = not_found("libnvrtc.so.13 (cannot open shared object file)").to_string();
        assert!(msg.contains("libnvrtc.so.13 (cannot open"), "{msg}");
        assert!(msg.contains("pip install nvidia-cuda-nvrtc-cu12"), "{msg}");
        assert!(msg.contains("STRATA_NVRTC_LIB"), "{msg}");
    }
}
