//! The communicators behind `strataComm_t` handles (a [`Slots`] table: no process-wide
//! lock on the per-call lookup) and the last-error store, one writer and one reader:
//! each failure's message is the calling thread's and, when it names one, its
//! communicator's.

#![forbid(unsafe_code)]

use super::abi::strataComm_t;
use super::slots::{Found, Slots};
use crate::comm::Comm;
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::sync::{Arc, Mutex};

#[derive(Debug)]
pub(crate) struct Handle {
    pub(crate) comm: Comm,
    /// This communicator's half of the last-error store ([`store_error`]).
    last_error: Mutex<CString>,
}

/// Communicator handles: `HANDLE_BASE + k * SLOT_STEP` for the k-th communicator ever
/// made.
static REGISTRY: Slots<Handle> = Slots::new(HANDLE_BASE);
const HANDLE_BASE: usize = 0x5354_0000;

fn found(c: strataComm_t, f: Found<Handle>) -> Result<Arc<Handle>> {
    let key = c as usize;
    match f {
        Found::Live(h) => Ok(h),
        _ if c.is_null() => Err(Error::InvalidArgument("comm is NULL".into())),
        Found::Gone => Err(Error::InvalidUsage(format!(
            "communicator {key:#x} was destroyed or aborted"
        ))),
        Found::Foreign => Err(Error::InvalidArgument(format!(
            "{key:#x} is not a strata communicator"
        ))),
    }
}

/// Register a new communicator and return its handle.
pub(crate) fn register(comm: Comm) -> Result<strataComm_t> {
    let h = Handle {
        comm,
        last_error: Mutex::new(CString::default()),
    };
    REGISTRY
        .insert(h, "communicator")
        .map(|key| key as strataComm_t)
}

/// Register a communicator made in Rust (a library in front of strata, such as
/// `libstrata_nccl`, joining a program's communicator) and return its C handle; every
/// `strata*` call then takes it, `strataCommDestroy` / `strataCommAbort` end it.
pub fn register_comm(comm: Comm) -> Result<strataComm_t> {
    register(comm)
}

/// The communicator behind the C handle `c` (a library in front of strata reading its
/// topology for its own per-call choice); errors as every call's lookup.
pub fn comm_of(c: strataComm_t) -> Result<Comm> {
    lookup(c).map(|h| h.comm.clone())
}

/// The live communicator behind `c`: NULL and foreign values are `InvalidArgument`,
/// destroyed ones `InvalidUsage`. The per-call path: no process-wide lock (one read of
/// the communicator's own slot, [`Slots::get`]).
pub(crate) fn lookup(c: strataComm_t) -> Result<Arc<Handle>> {
    found(c, REGISTRY.get(c as usize))
}

/// Remove `c` from the registry (later calls with it fail) and return it.
pub(crate) fn unregister(c: strataComm_t) -> Result<Arc<Handle>> {
    found(c, REGISTRY.remove(c as usize))
}

thread_local! {
    /// The calling thread's half of the last-error store ([`store_error`]): per thread
    /// as NCCL's `ncclGetLastError(NULL)`.
    static THREAD_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn c_message(msg: &str) -> CString {
    CString::new(msg.replace('\0', " ")).unwrap_or_default()
}

/// The one writer of failure messages: `msg` becomes the calling thread's message
/// (`strataGetLastError(NULL)`) and, when the failure belongs to a communicator, that
/// communicator's (`strataGetLastError(comm)`).
pub(crate) fn store_error(handle: Option<&Handle>, msg: &str) {
    let _ = THREAD_ERROR.try_with(|t| *t.borrow_mut() = c_message(msg));
    if let Some(h) = handle {
        *h.last_error.lock().unwrap_or_else(|e| e.into_inner()) = c_message(msg);
    }
}

/// The one reader: the message of `comm` when it is a live communicator, else the
/// calling thread's ("" when none). The pointer stays valid until the next store into
/// the same half, or the communicator's destruction.
pub(crate) fn last_error_ptr(comm: strataComm_t) -> *const c_char {
    match lookup(comm) {
        // The registry keeps the handle (and so the string) alive after `h` drops.
        Ok(h) => h
            .last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ptr(),
        Err(_) => THREAD_ERROR
            .try_with(|t| t.borrow().as_ptr())
            .unwrap_or(c"".as_ptr()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_and_null_handles() {
        assert_eq!(lookup(std::ptr::null_mut()).unwrap_err().code(), 4);
        assert_eq!(lookup(0x1234 as strataComm_t).unwrap_err().code(), 4);
    }
}
