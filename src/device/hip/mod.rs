//! The HIP device (feature `rocm`): AMD GPUs through the HIP runtime (`libamdhip64`,
//! linked by hip-sys), with strata's kernels as code objects built at compile time.
//!
//! - Kernels: `build.rs` runs hipcc on `kernels-hip/strata_quant.hip` once per target
//!   of [`crate::kernels_gpu::HIP_ARCHS`] (`gfx90a`: MI250X, `gfx940`: MI300, `gfx942`:
//!   MI300X/MI300A when the build's hipcc knows it) and this
//!   module embeds the code objects. [`HipDevice::open`] picks the one whose target is the
//!   device's `gcnArchName` (before the first `:`; `gfx90a:sramecc+:xnack-` is `gfx90a`),
//!   loads it with `hipModuleLoadData` and resolves every kernel of
//!   [`crate::kernels_gpu::kernel_names`] and [`crate::kernels_gpu::reduce_kernel_names`]
//!   once per device. Launches are prepared by [`crate::kernels_gpu::call`], like CUDA's.
//! - Devices are shared per process: opening an ordinal that is open returns the same
//!   [`HipDevice`]. Every call makes the device current on the calling thread for its
//!   runtime calls and the thread's previous device current again on return
//!   (`hipGetDevice` / `hipSetDevice`, the guard of [`Device::bind`]); so do opening a
//!   device and releasing one. Host waits for the device (synchronous copies, zeroing,
//!   `hipFree`) go through [`super::waits::host_wait`] first.
//! - Host copies and zeroing run on a private non-blocking stream of the device and wait
//!   for it, so they are complete (even from pageable memory) when the call returns and
//!   never wait for the collectives running on other streams. Streams from
//!   [`Device::new_stream`] are non-blocking too: they do not synchronize implicitly with
//!   the legacy default stream; work there is waited for explicitly
//!   ([`DevStream::wait_foreign`] with a null stream).
//! - Errors: a failing HIP call is [`Error::Device`] naming the call and
//!   `hipGetErrorString` (plus the `hipError_t` name). [`HipDevice::open`] is
//!   [`Error::Device`] when there is no such device or no code object for its target, and
//!   [`Error::System`] when the runtime itself fails to initialize.
//! - ABI: hip-sys's bindings are those of HIP 5.x (`libamdhip64.so.5`; the layouts of
//!   `hipDeviceProp_t` and `hipPointerAttribute_t` are HIP 5's, checked by the unit tests
//!   against the bindings). `hipDeviceProp_t` is read from an oversized buffer, so a
//!   runtime whose struct grew at the end cannot write past it. Enum values that HIP 6
//!   renumbered (`hipMemoryTypeDevice`: 1 in HIP 5, 2 in HIP 6) come from the running
//!   runtime's version (`hipRuntimeGetVersion`), never from the bindings. Supported: HIP
//!   5.x, the version the library links (`libamdhip64.so.5`); ROCm 6 needs the runtime
//!   loaded by name at run time and HIP 6's `hipDeviceProp_t` layout, not done yet.
//!
//! [`gcd_links`] reports the link matrix of the visible devices for
//! [`crate::topology::gcd::pair_gcds`] (MI250X GCD pairing).

mod code;
mod device;
mod runtime;
mod stream;
#[cfg(test)]
mod tests;

pub use code::{built_arches, code_object_for};
pub use device::HipDevice;
pub use runtime::device_count;
pub use stream::{HipEvent, HipGraph, HipStream};

use super::pool::Pool;
use super::vendor_api;
use super::waits::host_wait;
use super::{Bound, DevAddr, DevEvent, DevStream, Device};
use crate::error::{Error, Result};
use hip_sys::hiprt as sys;
use runtime::{bound_to, c_string, check, error_string};
use std::ffi::c_void;
use std::sync::Arc;

impl Device for HipDevice {
    fn api(&self) -> super::Api {
        super::Api::Hip
    }

    fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn bind(&self) -> Result<Bound> {
        bound_to(self.ordinal)
    }

    fn alloc_zeroed(&self, bytes: usize) -> Result<DevAddr> {
        if bytes == 0 {
            return Ok(0);
        }
        let _bound = self.bind()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: FFI allocating `bytes` bytes on the current device.
        let r = unsafe { sys::hipMalloc(&mut p, bytes) };
        check(r, || {
            format!("hipMalloc of {bytes} bytes on HIP device {}", self.ordinal)
        })?;
        self.allocations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: FFI zeroing the fresh allocation on the private stream (waited for
        // before anyone sees the address).
        let zeroed = self.on_aux("hipMemsetAsync", |s| unsafe {
            sys::hipMemsetAsync(p, 0, bytes, s)
        });
        if let Err(e) = zeroed {
            // SAFETY: FFI freeing the allocation made above, unused.
            let _ = unsafe { sys::hipFree(p) };
            return Err(e);
        }
        Ok(p as DevAddr)
    }

    unsafe fn free(&self, addr: DevAddr) {
        if addr == 0 {
            return;
        }
        let Ok(_bound) = self.bind() else {
            return;
        };
        self.ranges.forget(addr);
        // Counted, never refused: a free cannot fail (the block would leak).
        let _ = host_wait("freeing device memory (hipFree synchronizes the device)");
        // SAFETY: the caller's contract: `addr` came from `alloc_zeroed` on this device,
        // is freed once, and no queued work uses it.
        let r = unsafe { sys::hipFree(addr as *mut c_void) };
        if r != sys::hipError_t::hipSuccess {
            tracing::warn!(
                "hipFree({addr:#x}) on HIP device {}: {}",
                self.ordinal,
                error_string(r)
            );
        }
    }

    fn htod(&self, dst: DevAddr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let n = src.len();
        // SAFETY: FFI copy of `n` host bytes into device memory, waited for before
        // returning (so `src` outlives it); the caller holds a borrow of the device range
        // (a Buffer's DevGuard), which lies inside its allocation.
        self.on_aux("hipMemcpyAsync (host to device)", |s| unsafe {
            sys::hipMemcpyAsync(
                dst as *mut c_void,
                src.as_ptr() as *const c_void,
                n,
                sys::hipMemcpyKind::hipMemcpyHostToDevice,
                s,
            )
        })
    }

    fn dtoh(&self, dst: &mut [u8], src: DevAddr) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let n = dst.len();
        let p = dst.as_mut_ptr() as *mut c_void;
        // SAFETY: as `htod`, in the other direction; `dst` is exclusively borrowed for
        // the whole (waited-for) copy.
        self.on_aux("hipMemcpyAsync (device to host)", |s| unsafe {
            sys::hipMemcpyAsync(
                p,
                src as *const c_void,
                n,
                sys::hipMemcpyKind::hipMemcpyDeviceToHost,
                s,
            )
        })
    }

    fn check_pointer(&self, addr: DevAddr, len: usize) -> Result<()> {
        vendor_api::check_span(self, addr, len)
    }

    fn new_stream(&self) -> Result<Arc<dyn DevStream>> {
        let dev = self
            .me
            .upgrade()
            .ok_or_else(|| Error::Internal("HIP device used while being dropped".into()))?;
        let _bound = self.bind()?;
        let mut s: sys::hipStream_t = std::ptr::null_mut();
        // SAFETY: FFI creating a stream on the current device.
        let r = unsafe { sys::hipStreamCreateWithFlags(&mut s, sys::hipStreamNonBlocking) };
        check(r, || {
            format!("hipStreamCreateWithFlags on HIP device {}", self.ordinal)
        })?;
        Ok(Arc::new(HipStream {
            dev,
            stream: s,
            owned: true,
        }))
    }

    fn pci_bus_id(&self) -> Result<String> {
        let mut buf = [0 as std::ffi::c_char; 64];
        // SAFETY: FFI writing at most 64 bytes, NUL-terminated.
        let r = unsafe { sys::hipDeviceGetPCIBusId(buf.as_mut_ptr(), 64, self.ordinal as i32) };
        check(r, || format!("hipDeviceGetPCIBusId({})", self.ordinal))?;
        let bytes: Vec<u8> = buf.iter().map(|&c| c as u8).collect();
        Ok(c_string(&bytes).to_lowercase())
    }
    fn allocations(&self) -> u64 {
        self.allocations.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn zero(&self, addr: DevAddr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: FFI zeroing a range of one allocation of this device (the caller's
        // contract) on the private stream, waited for alone.
        self.on_aux("hipMemsetAsync", |s| unsafe {
            sys::hipMemsetAsync(addr as *mut c_void, 0, bytes, s)
        })
    }
    fn pool(&self) -> &Pool {
        &self.pool
    }
    unsafe fn record_on(&self, raw: *mut c_void) -> Result<Arc<dyn DevEvent>> {
        let _bound = self.bind()?;
        // Also on a stream being captured: the event then marks a point of the capture,
        // and a stream that waits for it joins the capture (how strata forks its work
        // into a caller's graph).
        // SAFETY: the caller's contract: `raw` is null or a live stream of this device.
        Ok(Arc::new(unsafe {
            HipEvent::record(&self.events, raw as sys::hipStream_t)
        }?))
    }
    unsafe fn is_capturing(&self, raw: *mut c_void) -> Result<bool> {
        let _bound = self.bind()?;
        let mut status = sys::hipStreamCaptureStatus::hipStreamCaptureStatusNone;
        // SAFETY: FFI query of the caller's stream (its contract), writing one enum.
        let r = unsafe { sys::hipStreamIsCapturing(raw as sys::hipStream_t, &mut status) };
        check(r, || "hipStreamIsCapturing".to_string())?;
        Ok(status != sys::hipStreamCaptureStatus::hipStreamCaptureStatusNone)
    }
    unsafe fn wait_event_on(&self, raw: *mut c_void, ev: &dyn DevEvent) -> Result<()> {
        let ev = ev.as_any().downcast_ref::<HipEvent>().ok_or_else(|| {
            Error::InvalidArgument("an event of another device given to a HIP stream".into())
        })?;
        let _bound = self.bind()?;
        // SAFETY: FFI on the caller's stream (its contract: null or a live stream of this
        // device) and a live event.
        let r = unsafe { sys::hipStreamWaitEvent(raw as sys::hipStream_t, ev.ev, 0) };
        check(r, || "hipStreamWaitEvent".to_string())
    }
    unsafe fn borrow_stream(&self, raw: *mut c_void) -> Result<Arc<dyn DevStream>> {
        let dev = self
            .me
            .upgrade()
            .ok_or_else(|| Error::Internal("HIP device used while being dropped".into()))?;
        Ok(Arc::new(HipStream {
            dev,
            stream: raw as sys::hipStream_t,
            owned: false,
        }))
    }
}

/// The link matrix of HIP devices `0..devices`: `m[i][j]` is
/// `hipExtGetLinkTypeAndHopCount(i, j)` as `(link type, hop count)` (link type as
/// `hsa_amd_link_info_type_t`: 2 PCIe, 4 XGMI), `None` on the diagonal and for a pair
/// the runtime reports no link for. Input of [`crate::topology::gcd::pair_gcds`].
///
/// `Ok(vec![])` for 0 devices; [`Error::Device`] when fewer than `devices` exist;
/// [`Error::System`] when the runtime fails to initialize.
pub fn gcd_links(devices: usize) -> Result<crate::topology::gcd::LinkMatrix> {
    if devices == 0 {
        return Ok(Vec::new());
    }
    let count = device_count()?;
    if devices > count {
        return Err(Error::Device(format!(
            "link matrix of {devices} HIP devices: {count} visible"
        )));
    }
    let mut m = vec![vec![None; devices]; devices];
    for (i, row) in m.iter_mut().enumerate() {
        for (j, cell) in row.iter_mut().enumerate() {
            if i == j {
                continue;
            }
            let (mut t, mut h) = (0u32, 0u32);
            // SAFETY: FFI writing two u32s; both ordinals are below the device count.
            let r =
                unsafe { sys::hipExtGetLinkTypeAndHopCount(i as i32, j as i32, &mut t, &mut h) };
            if r == sys::hipError_t::hipSuccess {
                *cell = Some((t, h));
            } else {
                // SAFETY: FFI without arguments (clears the error the query set).
                let _ = unsafe { sys::hipGetLastError() };
            }
        }
    }
    Ok(m)
}
