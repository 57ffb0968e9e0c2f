//! The panic boundary of every export ([`ffi_boundary!`], over [`guard`]): a panic
//! becomes `strataInternalError` with a message, an error is recorded ([`record`]) and
//! its NCCL code returned; and [`write_out`], the checked write of an out-parameter.

use super::abi::{strataComm_t, strataResult_t, strataSuccess};
use super::registry::{lookup, store_error};
use crate::error::{Error, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Record a failure of `function`: `"<function>: <error>"` on the thread and, when
/// `comm` is live, on it.
fn record(function: &str, comm: strataComm_t, e: &Error) {
    let msg = format!("{function}: {e}");
    let h = lookup(comm).ok();
    store_error(h.as_deref(), &msg);
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".into()
    }
}

/// Run `body` (returning `Result<()>`) as the export `name`: a panic becomes
/// `Error::Internal`, an error is recorded (thread and `comm`) and its NCCL code returned.
pub(crate) fn guard(
    name: &'static str,
    comm: strataComm_t,
    body: impl FnOnce() -> Result<()>,
) -> strataResult_t {
    let r = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|p| {
        Err(Error::Internal(format!(
            "panic inside strata: {}",
            panic_message(&*p)
        )))
    });
    match r {
        Ok(()) => strataSuccess,
        Err(e) => {
            // Recording must not unwind either.
            let _ = catch_unwind(AssertUnwindSafe(|| record(name, comm, &e)));
            e.code()
        }
    }
}

/// The panic boundary of every export returning `strataResult_t`:
/// `ffi_boundary!("strataX", comm_or_null, { ...; Ok(()) })`.
macro_rules! ffi_boundary {
    ($name:literal, $comm:expr, $body:block) => {
        $crate::capi::boundary::guard($name, $comm, move || -> $crate::error::Result<()> { $body })
    };
}
pub(crate) use ffi_boundary;

/// `*out = v` after a NULL check.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
pub(crate) unsafe fn write_out<T>(out: *mut T, v: T, what: &str) -> Result<()> {
    if out.is_null() {
        return Err(Error::InvalidArgument(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, and the caller guarantees it is valid for a write of T.
    unsafe { out.write(v) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capi::abi::strataInternalError;
    use crate::capi::registry::last_error_ptr;

    #[test]
    fn panics_become_internal_errors() {
        let code = guard("strataTest", std::ptr::null_mut(), || panic!("boom"));
        assert_eq!(code, strataInternalError);
        // SAFETY: the thread error pointer is a valid C string until the next failure.
        let msg = unsafe { std::ffi::CStr::from_ptr(last_error_ptr(std::ptr::null_mut())) };
        let msg = msg.to_str().unwrap();
        assert!(msg.contains("strataTest") && msg.contains("boom"), "{msg}");
    }
}
