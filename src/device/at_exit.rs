//! Running a function when the process exits (`exit`, or returning from `main`): the C
//! library's `atexit`. A handler registered after the GPU driver initialised runs
//! before the driver's own teardown (handlers run in reverse order of registration),
//! which is where a background thread must stop touching the driver.

use std::ffi::c_int;

extern "C" {
    fn atexit(f: extern "C" fn()) -> c_int;
}

/// Run `f` at process exit. False when the C library refused (no room left).
pub fn register(f: extern "C" fn()) -> bool {
    // SAFETY: FFI registering a plain function with no captured state; `f` is `extern
    // "C"`, takes nothing and must not unwind (the caller's functions catch nothing and
    // panic nowhere).
    unsafe { atexit(f) == 0 }
}
