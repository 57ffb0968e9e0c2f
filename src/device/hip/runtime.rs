//! Calls of the HIP runtime that need no device of strata's: errors as strata's, the
//! device count, a device's names, making a device current.

use crate::device::Bound;
use crate::error::{Error, Result};
use hip_sys::hiprt as sys;
use std::ffi::CStr;

pub(super) fn error_string(e: sys::hipError_t) -> String {
    // SAFETY: FFI; hipGetErrorString returns a pointer to a static NUL-terminated string
    // (or null), for any code, without initializing the runtime.
    let p = unsafe { sys::hipGetErrorString(e) };
    if p.is_null() {
        return format!("{e:?}");
    }
    // SAFETY: non-null, NUL-terminated and static (above).
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy();
    format!("{s} ({e:?})")
}

/// `Ok` for `hipSuccess`, else [`Error::Device`] `"{what}: {hipGetErrorString} ({name})"`.
pub(super) fn check(r: sys::hipError_t, what: impl FnOnce() -> String) -> Result<()> {
    if r == sys::hipError_t::hipSuccess {
        Ok(())
    } else {
        Err(Error::Device(format!("{}: {}", what(), error_string(r))))
    }
}

/// Number of HIP devices: `Ok(0)` when the runtime finds none, [`Error::System`] when
/// the runtime fails otherwise (no driver, failed initialization).
pub fn device_count() -> Result<usize> {
    let mut n: i32 = 0;
    // SAFETY: FFI writing one int.
    let r = unsafe { sys::hipGetDeviceCount(&mut n) };
    match r {
        sys::hipError_t::hipSuccess => Ok(n.max(0) as usize),
        sys::hipError_t::hipErrorNoDevice => Ok(0),
        other => Err(Error::System(format!(
            "the HIP runtime (libamdhip64) failed to initialize: hipGetDeviceCount: {}",
            error_string(other)
        ))),
    }
}

/// NUL-terminated string in `bytes`, lossily decoded.
pub(super) fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// `(name, gcnArchName)` of device `ordinal`.
pub(super) fn device_names(ordinal: usize) -> Result<(String, String)> {
    // hipDeviceProp_t grew between HIP releases: let the runtime write into 4 KiB (more
    // than any version's struct) and read the two strings at the bindings' offsets.
    const CAP: usize = 4096;
    const _: () = assert!(std::mem::size_of::<sys::hipDeviceProp_t>() + 1024 <= CAP);
    #[repr(C, align(16))]
    struct PropBuf([u8; CAP]);
    let mut buf = PropBuf([0; CAP]);
    // SAFETY: FFI writing one hipDeviceProp_t (at most its size in the runtime's
    // version) into a zeroed, 16-byte-aligned buffer of CAP bytes.
    let r = unsafe {
        sys::hipGetDeviceProperties(
            buf.0.as_mut_ptr() as *mut sys::hipDeviceProp_t,
            ordinal as i32,
        )
    };
    check(r, || format!("hipGetDeviceProperties({ordinal})"))?;
    let name_at = std::mem::offset_of!(sys::hipDeviceProp_t, name);
    let arch_at = std::mem::offset_of!(sys::hipDeviceProp_t, gcnArchName);
    Ok((
        c_string(&buf.0[name_at..name_at + 256]),
        c_string(&buf.0[arch_at..arch_at + 256]),
    ))
}

/// Make device `ordinal` current on the calling thread until the guard drops, which
/// makes the thread's previous device current again.
pub(super) fn bound_to(ordinal: usize) -> Result<Bound> {
    let mut prev: i32 = -1;
    // SAFETY: FFI writing one int: the calling thread's current device.
    let r = unsafe { sys::hipGetDevice(&mut prev) };
    check(r, || "hipGetDevice".to_string())?;
    if prev == ordinal as i32 {
        return Ok(Bound::none());
    }
    // SAFETY: FFI; sets the calling thread's current device.
    let r = unsafe { sys::hipSetDevice(ordinal as i32) };
    check(r, || format!("hipSetDevice({ordinal})"))?;
    Ok(Bound::restoring(move || {
        // SAFETY: FFI making the thread's previous device current again (the guard is
        // not Send: this runs on the thread that bound).
        let _ = unsafe { sys::hipSetDevice(prev) };
    }))
}
