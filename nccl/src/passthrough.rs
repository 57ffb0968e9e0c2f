//! With the real library ([`crate::real::cpu_device`] false) every served function is
//! passed to the real library's function of the same name, arguments unchanged, unless
//! strata joined the communicator and takes the call (`join.rs`); the communicator
//! handle there is the real `ncclComm_t` itself, so the functions
//! [`crate::symbols::FORWARDED`] names receive it untouched.
//!
//! Each function's address is looked up once (`pnccl<Name>`, NCCL's strong profiling
//! alias, first, so a preloaded library's own `nccl<Name>` can never be found by
//! mistake; else `nccl<Name>`) and cached in a `OnceLock` of its own ([`real_fn!`]).
//!
//! strata joining the real communicator is `join.rs`: the handle stays the real one, and
//! the exports ask `join.rs` per call whether strata takes it (`route.rs`).

use crate::abi::*;

/// The real library's function `nccl<Name>` (given as `"Name"`) with the C signature
/// written after it, looked up once; `None` when there is no real library or it lacks
/// the function.
macro_rules! real_fn {
    ($name:literal, fn($($t:ty),*) -> $r:ty) => {{
        type F = unsafe extern "C" fn($($t),*) -> $r;
        static CELL: std::sync::OnceLock<Option<F>> = std::sync::OnceLock::new();
        *CELL.get_or_init(|| {
            let real = $crate::real::real()?;
            let addr = real
                .addr(concat!("pnccl", $name, "\0").as_bytes())
                .or_else(|| real.addr(concat!("nccl", $name, "\0").as_bytes()))?;
            // SAFETY: the real library exports this name as the function NCCL's header
            // declares, whose signature the caller wrote; `addr` is non-zero.
            Some(unsafe { std::mem::transmute::<usize, F>(addr) })
        })
    }};
}
pub(crate) use real_fn;

/// Call the real `nccl<Name>` with the named arguments (an `ncclResult_t` function), or
/// fail with `ncclInternalError` naming what is missing.
macro_rules! pass {
    ($name:literal, ($($a:ident : $t:ty),*)) => {
        match $crate::passthrough::real_fn!($name, fn($($t),*) -> $crate::abi::ncclResult_t) {
            // SAFETY: the real library's function with NCCL's signature, given the
            // caller's arguments unchanged (the caller's contract is the real one's).
            Some(f) => unsafe { f($($a),*) },
            None => $crate::passthrough::missing(concat!("nccl", $name)),
        }
    };
}
pub(crate) use pass;

/// The real library lacks `func` (an older NCCL): `ncclInternalError` with a message.
#[cold]
pub fn missing(func: &str) -> ncclResult_t {
    let path = crate::real::real().map_or("(none)", |r| r.path.as_str());
    crate::errors::fail(
        func,
        std::ptr::null_mut(),
        ncclInternalError,
        format!("the real library {path} does not export {func} (nor p{func})"),
    )
}
