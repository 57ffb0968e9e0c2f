//! The real `libnccl.so.2` behind this library, found once at the first call that needs
//! it: `STRATA_NCCL_REAL_LIB` (a path), else `STRATA_NCCL_LIB` (the `nccl` transport's
//! variable), else (under `LD_AUDIT`) the real library the audit object found
//! ([`AUDIT_REAL_NAME`]), else the name `libnccl.so.2` on the loader's path. A candidate that is this
//! library itself (an `LD_AUDIT` object redirected the name here) is skipped: its
//! `ncclGetVersion` is ours. Found nothing, or `STRATA_NCCL_DEVICE=cpu`: strata's CPU
//! device serves what it can ([`cpu_device`]) and the rest fails with a clear error.

use std::sync::OnceLock;

/// The loaded real library and where it came from.
pub struct Real {
    pub lib: libloading::Library,
    pub path: String,
}

impl Real {
    /// The address of `name` (NUL-terminated) in the real library, if it exports it.
    pub fn addr(&self, name: &[u8]) -> Option<usize> {
        // SAFETY: a symbol lookup only; the address is used as the function NCCL's
        // header declares under that name, by the caller that names it.
        unsafe { self.lib.get::<*const ()>(name) }
            .ok()
            .map(|s| *s as usize)
            .filter(|&a| a != 0)
    }
}

/// The candidates tried, in order.
fn candidates() -> Vec<String> {
    let mut c = Vec::new();
    for var in ["STRATA_NCCL_REAL_LIB", "STRATA_NCCL_LIB"] {
        if let Ok(p) = std::env::var(var) {
            if !p.is_empty() {
                c.push(p);
            }
        }
    }
    // Under the LD_AUDIT object, `libnccl.so.2` names this library in the loader's list
    // (the audit answered the program's search with it); the audit answers this name,
    // asked by this library, with the real library it found (nccl/audit's crate doc).
    if std::env::var_os("LD_AUDIT").is_some_and(|v| !v.is_empty()) {
        c.push(AUDIT_REAL_NAME.into());
    }
    c.push("libnccl.so.2".into());
    c
}

/// The name this library asks the loader for to reach, through `libstrata_nccl_audit.so`,
/// the real library that the audit object found in the program's search (the same string
/// as `strata_nccl_audit::REAL_NAME`).
pub const AUDIT_REAL_NAME: &str = "strata-nccl-audit-real-libnccl.so.2";

/// What loading found: the library, or why none (every candidate and its error).
fn load() -> Result<Real, String> {
    let ours = crate::ncclGetVersion as *const () as usize;
    let mut tried = Vec::new();
    for path in candidates() {
        // SAFETY: loading libnccl runs its initializers, as linking it would.
        match unsafe { libloading::Library::new(&path) } {
            Ok(lib) => {
                let real = Real {
                    lib,
                    path: path.clone(),
                };
                match real.addr(b"ncclGetVersion\0") {
                    Some(a) if a == ours => tried.push(format!("{path} (this library)")),
                    Some(_) => return Ok(real),
                    None => tried.push(format!("{path} (no ncclGetVersion)")),
                }
            }
            Err(e) => tried.push(format!("{path} ({e})")),
        }
    }
    Err(tried.join("; "))
}

fn loaded() -> &'static Result<Real, String> {
    static REAL: OnceLock<Result<Real, String>> = OnceLock::new();
    REAL.get_or_init(load)
}

/// The real library, when one was found.
pub fn real() -> Option<&'static Real> {
    loaded().as_ref().ok()
}

/// Why there is no real library (the candidates tried), when there is none.
pub fn why_none() -> Option<&'static str> {
    loaded().as_ref().err().map(String::as_str)
}

/// True when strata's CPU device serves every call: `STRATA_NCCL_DEVICE=cpu`, or no real
/// library was found. Read once.
pub fn cpu_device() -> bool {
    static CPU: OnceLock<bool> = OnceLock::new();
    *CPU.get_or_init(|| {
        std::env::var("STRATA_NCCL_DEVICE").is_ok_and(|v| v == "cpu") || real().is_none()
    })
}
