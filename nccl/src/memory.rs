//! Memory and registration: `ncclMemAlloc` / `ncclMemFree`, `ncclCommRegister` /
//! `ncclCommDeregister`, `ncclCommWindowRegister` / `ncclCommWindowDeregister`.
//!
//! On strata's CPU device: `ncclMemAlloc` is zeroed host memory aligned to 4096 bytes
//! (`NCCL_WIN_REQUIRED_ALIGNMENT`), at least one byte; `ncclMemFree` takes only what it
//! returned (anything else is `ncclInvalidArgument`). Registration has no effect on the
//! CPU device (strata reads and writes host buffers in place): a register returns a
//! fresh non-NULL handle (a window for the window calls) after checking the
//! communicator, and a deregister accepts exactly the handles its register gave on that
//! communicator (others: `ncclInvalidArgument`). The forwarded window functions
//! (`ncclWinGetUserPtr`, ...) have no real library to reach on the CPU device.
//!
//! With the real library every function is passed to it.

use crate::abi::*;
use crate::comm::sc;
use crate::errors::{fail, guard, strata_result};
use crate::passthrough::pass;
use std::alloc::Layout;
use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Alignment of `ncclMemAlloc`'s memory.
pub const ALIGN: usize = 4096;

static ALLOCS: Mutex<BTreeMap<usize, Layout>> = Mutex::new(BTreeMap::new());
/// Registration handles: handle -> (communicator, is a window).
static HANDLES: Mutex<BTreeMap<usize, (usize, bool)>> = Mutex::new(BTreeMap::new());
/// Handle values: odd numbers from a counter, never dereferenced, never reused.
static NEXT: AtomicUsize = AtomicUsize::new(1);

fn lock<T>(m: &'static Mutex<T>) -> std::sync::MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// NCCL's `ncclMemAlloc`: `size` bytes for NCCL's buffers; see the module doc.
///
/// # Safety
/// `ptr` NULL (`ncclInvalidArgument`) or writable for a pointer.
#[no_mangle]
pub unsafe extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
    if !crate::real::cpu_device() {
        return pass!("MemAlloc", (ptr: *mut *mut c_void, size: usize));
    }
    const F: &str = "ncclMemAlloc";
    guard(F, null_mut(), || {
        if ptr.is_null() {
            return fail(F, null_mut(), ncclInvalidArgument, "ptr is NULL");
        }
        let Ok(layout) = Layout::from_size_align(size.max(1), ALIGN) else {
            return fail(
                F,
                null_mut(),
                ncclInvalidArgument,
                format!("size {size} is too large"),
            );
        };
        // SAFETY: a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return fail(
                F,
                null_mut(),
                ncclSystemError,
                format!("out of host memory ({size} bytes)"),
            );
        }
        lock(&ALLOCS).insert(p as usize, layout);
        // SAFETY: checked non-NULL; the caller's contract.
        unsafe { *ptr = p.cast() };
        ncclSuccess
    })
}

/// NCCL's `ncclMemFree`: frees memory of `ncclMemAlloc` (NULL: a no-op).
///
/// # Safety
/// No call still uses the memory.
#[no_mangle]
pub unsafe extern "C" fn ncclMemFree(ptr: *mut c_void) -> ncclResult_t {
    if !crate::real::cpu_device() {
        return pass!("MemFree", (ptr: *mut c_void));
    }
    const F: &str = "ncclMemFree";
    if ptr.is_null() {
        return ncclSuccess;
    }
    guard(F, null_mut(), || {
        match lock(&ALLOCS).remove(&(ptr as usize)) {
            // SAFETY: `ptr` came from `alloc_zeroed` with this layout and was not freed.
            Some(layout) => {
                unsafe { std::alloc::dealloc(ptr.cast(), layout) };
                ncclSuccess
            }
            None => fail(
                F,
                null_mut(),
                ncclInvalidArgument,
                format!("{ptr:?} was not returned by ncclMemAlloc (or was freed)"),
            ),
        }
    })
}

fn register(func: &str, comm: ncclComm_t, window: bool) -> Result<usize, ncclResult_t> {
    let mut n = 0;
    // SAFETY: a check of the handle; `n` is live.
    let r = unsafe { strata::capi::strataCommCount(sc(comm), &mut n) };
    if r != ncclSuccess {
        return Err(strata_result(func, comm, r));
    }
    let h = NEXT.fetch_add(2, Ordering::Relaxed);
    lock(&HANDLES).insert(h, (comm as usize, window));
    Ok(h)
}

fn deregister(func: &str, comm: ncclComm_t, h: usize, window: bool) -> ncclResult_t {
    let mut m = lock(&HANDLES);
    match m.get(&h) {
        Some(&(c, w)) if c == comm as usize && w == window => {
            m.remove(&h);
            ncclSuccess
        }
        _ => {
            drop(m);
            fail(
                func,
                comm,
                ncclInvalidArgument,
                format!("{h:#x} is not a live registration of this communicator"),
            )
        }
    }
}

/// NCCL's `ncclCommRegister`: a handle for `buff` (no effect on the CPU device).
///
/// # Safety
/// `handle` NULL (`ncclInvalidArgument`) or writable for a pointer.
#[no_mangle]
pub unsafe extern "C" fn ncclCommRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> ncclResult_t {
    if !crate::real::cpu_device() {
        return pass!("CommRegister", (comm: ncclComm_t, buff: *mut c_void, size: usize, handle: *mut *mut c_void));
    }
    const F: &str = "ncclCommRegister";
    let _ = (buff, size);
    guard(F, comm, || {
        if handle.is_null() {
            return fail(F, comm, ncclInvalidArgument, "handle is NULL");
        }
        match register(F, comm, false) {
            Ok(h) => {
                // SAFETY: checked non-NULL; the caller's contract.
                unsafe { *handle = h as *mut c_void };
                ncclSuccess
            }
            Err(r) => r,
        }
    })
}

/// NCCL's `ncclCommDeregister`: releases a handle of `ncclCommRegister` on `comm`.
///
/// # Safety
/// None beyond passing values.
#[no_mangle]
pub unsafe extern "C" fn ncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
    if !crate::real::cpu_device() {
        return pass!("CommDeregister", (comm: ncclComm_t, handle: *mut c_void));
    }
    guard("ncclCommDeregister", comm, || {
        deregister("ncclCommDeregister", comm, handle as usize, false)
    })
}

/// NCCL's `ncclCommWindowRegister`: a window for `buff` (no effect on the CPU device;
/// `winFlags` accepted as given).
///
/// # Safety
/// `win` NULL (`ncclInvalidArgument`) or writable for a window handle.
#[no_mangle]
pub unsafe extern "C" fn ncclCommWindowRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut ncclWindow_t,
    winFlags: c_int,
) -> ncclResult_t {
    if !crate::real::cpu_device() {
        let r = pass!("CommWindowRegister", (comm: ncclComm_t, buff: *mut c_void, size: usize, win: *mut ncclWindow_t, winFlags: c_int));
        if r == ncclSuccess && !win.is_null() {
            // SAFETY: the real library wrote the window there.
            let w = unsafe { *win } as usize;
            crate::join::window_registered(comm, buff, size, w);
        }
        return r;
    }
    const F: &str = "ncclCommWindowRegister";
    let _ = (buff, size, winFlags);
    guard(F, comm, || {
        if win.is_null() {
            return fail(F, comm, ncclInvalidArgument, "win is NULL");
        }
        match register(F, comm, true) {
            Ok(h) => {
                // SAFETY: checked non-NULL; the caller's contract.
                unsafe { *win = h as ncclWindow_t };
                ncclSuccess
            }
            Err(r) => r,
        }
    })
}

/// NCCL's `ncclCommWindowDeregister`: releases a window of `ncclCommWindowRegister`.
///
/// # Safety
/// None beyond passing values.
#[no_mangle]
pub unsafe extern "C" fn ncclCommWindowDeregister(
    comm: ncclComm_t,
    win: ncclWindow_t,
) -> ncclResult_t {
    if !crate::real::cpu_device() {
        crate::join::window_deregistered(win as usize);
        return pass!("CommWindowDeregister", (comm: ncclComm_t, win: ncclWindow_t));
    }
    guard("ncclCommWindowDeregister", comm, || {
        deregister("ncclCommWindowDeregister", comm, win as usize, true)
    })
}
