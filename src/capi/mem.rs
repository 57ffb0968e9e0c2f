//! Memory for a communicator's device (as NCCL's `ncclMemAlloc` / `ncclMemFree`):
//! device memory on the GPU transports, CPU-device memory on `host-local` (real host
//! memory the caller may read and write directly while no call is using it). Blocks come
//! from the device's cache ([`crate::device::pool`]) and go back to it when freed, so
//! allocating in a training loop costs no runtime call in steady state.

use super::abi::*;
use super::boundary::{ffi_boundary, write_out};
use super::registry::lookup;
use crate::device::DeviceMem;
use crate::error::Error;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};

/// Blocks handed out, by address.
static BLOCKS: Mutex<Option<HashMap<usize, DeviceMem>>> = Mutex::new(None);

fn blocks() -> MutexGuard<'static, Option<HashMap<usize, DeviceMem>>> {
    BLOCKS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Allocates `size` zeroed bytes on `comm`'s device and writes their address to `*ptr`
/// (NULL for `size == 0`). GPU transports (nccl, rccl, cuda-local): device memory,
/// aligned to 256 bytes, usable by any call on that device. `host-local`: CPU-device
/// memory, which the caller may also read and write directly while no call uses it. Free
/// with `strataMemFree`; the memory outlives `comm` until then. Thread-safe.
///
/// Errors: `strataInvalidArgument` for a NULL/foreign comm or a NULL `ptr`;
/// `strataInvalidUsage` on host transports (local, mpi: any host memory will do) and for
/// a destroyed comm; `strataUnhandledCudaError` when the device runs out of memory.
///
/// # Safety
/// `ptr` is NULL or valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn strataMemAlloc(
    comm: strataComm_t,
    size: usize,
    ptr: *mut *mut c_void,
) -> strataResult_t {
    ffi_boundary!("strataMemAlloc", comm, {
        if ptr.is_null() {
            return Err(Error::InvalidArgument("ptr is NULL".into()));
        }
        let h = lookup(comm)?;
        h.comm.core().alive()?;
        let dev = h.comm.device().ok_or_else(|| {
            Error::InvalidUsage(format!(
                "strataMemAlloc: the {} transport moves host memory (use any host allocation)",
                h.comm.transport_kind().name()
            ))
        })?;
        let m = DeviceMem::alloc(&dev, size)?;
        let addr = m.addr() as usize;
        if addr != 0 {
            blocks().get_or_insert_with(HashMap::new).insert(addr, m);
        }
        // SAFETY: the caller's contract on `ptr` (checked non-NULL).
        unsafe { write_out(ptr, addr as *mut c_void, "ptr") }
    })
}

/// Frees memory from `strataMemAlloc` (NULL is a no-op); the block returns to the
/// device's cache. No call may still be using it (wait for the streams or works that
/// do). `comm` is only used for error reporting and may have been destroyed.
///
/// Errors: `strataInvalidArgument` for a pointer `strataMemAlloc` did not return (or
/// already freed). Thread-safe.
///
/// # Safety
/// No queued or running call uses the memory.
#[no_mangle]
pub unsafe extern "C" fn strataMemFree(comm: strataComm_t, ptr: *mut c_void) -> strataResult_t {
    let _ = comm;
    ffi_boundary!("strataMemFree", std::ptr::null_mut(), {
        if ptr.is_null() {
            return Ok(());
        }
        let m = blocks()
            .as_mut()
            .and_then(|b| b.remove(&(ptr as usize)))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "strataMemFree: {ptr:p} did not come from strataMemAlloc (or was freed)"
                ))
            })?;
        drop(m);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capi::init::{strataCommDestroy, strataCommInitLocal};

    fn config(transport: strataTransport_t) -> strataConfig_t {
        strataConfig_t {
            size: std::mem::size_of::<strataConfig_t>(),
            magic: STRATA_CONFIG_MAGIC,
            version: STRATA_VERSION_CODE as u32,
            transport,
            topology: std::ptr::null(),
            algo: std::ptr::null(),
            timeout_ms: 5000,
            links: std::ptr::null(),
        }
    }

    #[test]
    fn host_local_memory_round_trip_and_errors() {
        let mut comms = [std::ptr::null_mut(); 1];
        let cfg = config(strataTransportHostLocal);
        // SAFETY: room for one handle, a valid config.
        let rc = unsafe { strataCommInitLocal(comms.as_mut_ptr(), 1, std::ptr::null(), &cfg) };
        assert_eq!(rc, strataSuccess);
        let c = comms[0];
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid handle and out pointer.
        unsafe {
            assert_eq!(strataMemAlloc(c, 100, &mut p), strataSuccess);
            assert!(!p.is_null());
            // CPU-device memory is host memory: zeroed, writable.
            let s = std::slice::from_raw_parts_mut(p as *mut u8, 100);
            assert!(s.iter().all(|&b| b == 0));
            s[99] = 7;
            assert_eq!(strataMemAlloc(c, 0, &mut p as *mut _), strataSuccess);
            assert!(p.is_null());
            assert_eq!(strataMemFree(c, std::ptr::null_mut()), strataSuccess);
            assert_eq!(
                strataMemAlloc(c, 8, std::ptr::null_mut()),
                strataInvalidArgument
            );
            assert_eq!(strataMemFree(c, 64 as *mut c_void), strataInvalidArgument);
            assert_eq!(strataCommDestroy(c), strataSuccess);
        }
        // Host transports have no device memory.
        let mut comms = [std::ptr::null_mut(); 1];
        let cfg = config(strataTransportLocal);
        // SAFETY: as above.
        unsafe {
            assert_eq!(
                strataCommInitLocal(comms.as_mut_ptr(), 1, std::ptr::null(), &cfg),
                strataSuccess
            );
            let mut p: *mut c_void = std::ptr::null_mut();
            assert_eq!(strataMemAlloc(comms[0], 8, &mut p), strataInvalidUsage);
            assert_eq!(strataCommDestroy(comms[0]), strataSuccess);
        }
    }
}
