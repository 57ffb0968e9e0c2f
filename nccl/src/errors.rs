//! Results and messages: `ncclGetErrorString`, `ncclGetLastError`, and the one writer of
//! messages ([`fail`], [`strata_result`]) every served call uses on its failure path.
//!
//! A failing call stores `"<nccl function>: <why>"` twice: for the calling thread and,
//! when the call named a communicator, for that communicator. `ncclGetLastError(comm)`
//! returns the communicator's message, else the thread's (NCCL's is per thread; the
//! communicator's is what a framework polling one communicator wants). Nothing is
//! stored or locked on success, so the common path pays nothing here.
//!
//! Every export runs its body inside [`guard`]: a panic becomes `ncclInternalError` with
//! a message, never an unwind across the C ABI.

use crate::abi::*;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

thread_local! {
    /// This thread's last message.
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Each communicator's last message (keyed by its handle's value); dropped with the
/// communicator ([`forget_comm`]).
static BY_COMM: Mutex<BTreeMap<usize, CString>> = Mutex::new(BTreeMap::new());

fn lock_comms() -> std::sync::MutexGuard<'static, BTreeMap<usize, CString>> {
    BY_COMM.lock().unwrap_or_else(|p| p.into_inner())
}

fn cstring(s: String) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

/// Store `"<func>: <msg>"` for this thread and for `comm` (when not NULL); returns `code`.
pub fn fail(
    func: &str,
    comm: ncclComm_t,
    code: ncclResult_t,
    msg: impl AsRef<str>,
) -> ncclResult_t {
    let text = format!("{func}: {}", msg.as_ref());
    if !comm.is_null() {
        lock_comms().insert(comm as usize, cstring(text.clone()));
    }
    LAST.with(|l| *l.borrow_mut() = cstring(text));
    code
}

/// Store `text` as this thread's last message (a forwarded call that found no real
/// library, [`crate::forward`]).
pub fn note(text: String) {
    LAST.with(|l| *l.borrow_mut() = cstring(text));
}

/// A strata call's result as `func`'s: success (and `ncclInProgress`) as is; a failure
/// with strata's message for this thread (`strataGetLastError(NULL)`) stored as `func`'s.
#[inline]
pub fn strata_result(func: &str, comm: ncclComm_t, rc: i32) -> ncclResult_t {
    if rc == ncclSuccess || rc == ncclInProgress {
        return rc;
    }
    strata_failed(func, comm, rc)
}

#[cold]
fn strata_failed(func: &str, comm: ncclComm_t, rc: i32) -> ncclResult_t {
    // SAFETY: NULL asks for this thread's message; strata returns a NUL-terminated
    // string valid until this thread's next failing strata call (none happens before
    // it is copied here).
    let why = unsafe { CStr::from_ptr(strata::capi::strataGetLastError(std::ptr::null_mut())) }
        .to_string_lossy()
        .into_owned();
    let why = if why.is_empty() {
        format!("strata returned {rc}")
    } else {
        why
    };
    fail(func, comm, rc, why)
}

/// Drop `comm`'s message (it was destroyed).
pub fn forget_comm(comm: ncclComm_t) {
    lock_comms().remove(&(comm as usize));
}

/// Run an export's body; a panic becomes `ncclInternalError` with a message.
#[inline]
pub fn guard(func: &str, comm: ncclComm_t, body: impl FnOnce() -> ncclResult_t) -> ncclResult_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            fail(
                func,
                comm,
                ncclInternalError,
                format!("internal error (caught panic: {what})"),
            )
        }
    }
}

/// NCCL's `ncclGetErrorString`: a static, NUL-terminated description of `result`
/// (strata's descriptions, which are NCCL's codes; `ncclTimeout` and unknown codes
/// described here). With the real library: its own string.
///
/// # Safety
/// None: any value is accepted.
#[no_mangle]
pub unsafe extern "C" fn ncclGetErrorString(result: ncclResult_t) -> *const c_char {
    if !crate::real::cpu_device() {
        if let Some(f) =
            crate::passthrough::real_fn!("GetErrorString", fn(ncclResult_t) -> *const c_char)
        {
            // SAFETY: the real library's function of this signature.
            return unsafe { f(result) };
        }
    }
    // NCCL's wording for its codes; the detail is in ncclGetLastError, as NCCL says.
    match result {
        0 => c"no error".as_ptr(),
        1 => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)".as_ptr(),
        2 => c"unhandled system error (see ncclGetLastError for details)".as_ptr(),
        3 => c"internal error (see ncclGetLastError for details)".as_ptr(),
        4 => c"invalid argument (see ncclGetLastError for details)".as_ptr(),
        5 => c"invalid usage (see ncclGetLastError for details)".as_ptr(),
        6 => c"remote process exited or there was a network error (see ncclGetLastError)".as_ptr(),
        7 => c"NCCL operation in progress".as_ptr(),
        ncclTimeout => c"operation timed out".as_ptr(),
        _ => c"unknown result code".as_ptr(),
    }
}

/// NCCL's `ncclGetLastError`: the message of the last failed call on `comm`, else (or
/// for a NULL `comm`) of the calling thread, else `""`. The string stays valid until the
/// next failing call on that communicator (or this thread) or its destruction. With
/// the real library: its own message.
///
/// # Safety
/// `comm` is any value (used as a key, never dereferenced on strata's CPU device).
#[no_mangle]
pub unsafe extern "C" fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
    if !crate::real::cpu_device() {
        if let Some(f) =
            crate::passthrough::real_fn!("GetLastError", fn(ncclComm_t) -> *const c_char)
        {
            // SAFETY: the real library's function of this signature; `comm` is its own.
            return unsafe { f(comm) };
        }
    }
    if !comm.is_null() {
        if let Some(s) = lock_comms().get(&(comm as usize)) {
            // The CString's buffer lives in the map until replaced or forgotten.
            return s.as_ptr();
        }
    }
    LAST.with(|l| l.borrow().as_ptr())
}

/// This thread's last message (tests and diagnostics).
pub fn last_message() -> String {
    LAST.with(|l| l.borrow().to_string_lossy().into_owned())
}
