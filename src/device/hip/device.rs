//! One HIP device: opening it (its module of strata's kernels, its private stream),
//! releasing it, and the pointer check of one byte.

use super::code::code_object_for;
use super::runtime::{bound_to, check, device_count, device_names, error_string};
use crate::device::pool::Pool;
use crate::device::reuse::{CheckedRanges, HandlePool};
use crate::device::vendor_api::{self, Fault, PointerQueries};
use crate::device::waits::host_wait;
use crate::device::{DevAddr, Device};
use crate::error::{Error, Result};
use hip_sys::hiprt as sys;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Weak};

/// Raw kernel handle of a loaded module.
#[derive(Clone, Copy)]
pub(super) struct Func(pub(super) sys::hipFunction_t);

/// One AMD GPU (a GCD of an MI250X): its module of strata's kernels and a private stream
/// for host copies. Shared (`Arc`) by its streams and buffers.
pub struct HipDevice {
    pub(super) ordinal: usize,
    pub(super) name: String,
    pub(super) gcn_arch: String,
    pub(super) target: &'static str,
    pub(super) module: sys::hipModule_t,
    pub(super) funcs: HashMap<String, Func>,
    /// Non-blocking stream for zeroing and host copies (each call waits for it).
    pub(super) aux: sys::hipStream_t,
    /// `hipMemoryTypeDevice` as the running runtime numbers it ([`device_memory_type`]).
    pub(super) device_type: i32,
    /// Allocations made ([`Device::allocations`]).
    pub(super) allocations: std::sync::atomic::AtomicU64,
    /// Freed blocks kept for reuse ([`super::pool`]).
    pub(super) pool: Pool,
    /// Events no one holds any more, reused by the next record.
    pub(super) events: Arc<HandlePool>,
    /// Allocation ranges already found to be memory of this device.
    pub(super) ranges: CheckedRanges,
    pub(super) me: Weak<HipDevice>,
}

// SAFETY: the fields are HIP runtime handles (module, functions, a stream), which the
// HIP runtime lets any thread use (its API is thread-safe), plus immutable Rust data;
// nothing is mutated after `open`.
unsafe impl Send for HipDevice {}
// SAFETY: as above; `&HipDevice` only reads the handles and passes them to the runtime.
unsafe impl Sync for HipDevice {}

impl std::fmt::Debug for HipDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HipDevice({}, {:?}, {})",
            self.ordinal, self.name, self.gcn_arch
        )
    }
}

/// Open devices, so an ordinal's module is loaded once while it is in use.
static OPEN: vendor_api::Opened<HipDevice> = vendor_api::Opened::new();

impl HipDevice {
    /// Device `ordinal` of the HIP runtime (after `HIP_VISIBLE_DEVICES` /
    /// `ROCR_VISIBLE_DEVICES`), with strata's kernels loaded.
    ///
    /// Errors, never panics: [`Error::Device`] when there is no HIP device or fewer than
    /// `ordinal + 1`, when no embedded code object matches the device's target, or when
    /// loading it fails; [`Error::System`] when the HIP runtime fails to initialize.
    pub fn open(ordinal: usize) -> Result<Arc<HipDevice>> {
        OPEN.get_or_open(ordinal, || {
            let count = device_count()?;
            if count == 0 {
                return Err(Error::Device(format!(
                "HIP device {ordinal}: no HIP device found (hipGetDeviceCount reports none: no \
                 AMD GPU, /dev/kfd not accessible, or HIP_VISIBLE_DEVICES / \
                 ROCR_VISIBLE_DEVICES hide them)"
            )));
            }
            if ordinal >= count {
                return Err(Error::Device(format!(
                    "HIP device {ordinal} does not exist: {count} visible (ordinals 0..{count})"
                )));
            }
            let _bound = bound_to(ordinal)?;
            let (name, gcn_arch) = device_names(ordinal)?;
            let (target, image) = code_object_for(&gcn_arch)
                .map_err(|e| Error::Device(format!("HIP device {ordinal} ({name}): {e}")))?;

            let mut module: sys::hipModule_t = std::ptr::null_mut();
            // SAFETY: FFI; `image` is a complete ELF code object for this target, static and
            // 4096-byte aligned, and the device is current.
            let r = unsafe { sys::hipModuleLoadData(&mut module, image.as_ptr() as *const c_void) };
            check(r, || {
                format!("hipModuleLoadData of strata's {target} kernels on HIP device {ordinal}")
            })?;
            // From here `Loaded` unloads the module (and destroys the stream) on error paths.
            let mut loaded = Loaded {
                ordinal,
                module,
                aux: std::ptr::null_mut(),
            };
            let mut funcs = HashMap::new();
            for kname in crate::kernels_gpu::kernel_names()
                .into_iter()
                .chain(crate::kernels_gpu::reduce_kernel_names())
            {
                let c = std::ffi::CString::new(kname.clone())
                    .map_err(|_| Error::Internal(format!("kernel name {kname:?} has a NUL")))?;
                let mut f: sys::hipFunction_t = std::ptr::null_mut();
                // SAFETY: FFI on the module loaded above with a NUL-terminated name.
                let r = unsafe { sys::hipModuleGetFunction(&mut f, module, c.as_ptr()) };
                check(r, || {
                    format!("kernel {kname} missing from strata's {target} code object")
                })?;
                funcs.insert(kname, Func(f));
            }
            let mut aux: sys::hipStream_t = std::ptr::null_mut();
            // SAFETY: FFI creating a stream on the current device.
            let r = unsafe { sys::hipStreamCreateWithFlags(&mut aux, sys::hipStreamNonBlocking) };
            check(r, || {
                format!("hipStreamCreateWithFlags on HIP device {ordinal}")
            })?;
            loaded.aux = aux;
            std::mem::forget(loaded);

            let mut version: i32 = 0;
            // SAFETY: FFI writing one int.
            let r = unsafe { sys::hipRuntimeGetVersion(&mut version) };
            check(r, || "hipRuntimeGetVersion".to_string())?;
            let d = Arc::new_cyclic(|me| HipDevice {
                ordinal,
                name,
                gcn_arch,
                target,
                module,
                funcs,
                aux,
                device_type: device_memory_type(version),
                allocations: std::sync::atomic::AtomicU64::new(0),
                pool: Pool::default(),
                events: Arc::new(HandlePool::new(destroy_event, None)),
                ranges: CheckedRanges::default(),
                me: me.clone(),
            });
            Ok(d)
        })
    }

    /// Number of HIP devices: 0 when there is none or the runtime fails to initialize
    /// ([`device_count`] tells the two apart).
    pub fn count() -> usize {
        device_count().unwrap_or(0)
    }

    /// Marketing name (`AMD Instinct MI250X`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Full `gcnArchName` (`gfx90a:sramecc+:xnack-`).
    pub fn gcn_arch_name(&self) -> &str {
        &self.gcn_arch
    }

    /// The code object target in use (`gfx90a`).
    pub fn target(&self) -> &'static str {
        self.target
    }

    pub(super) fn func(&self, name: &str) -> Result<Func> {
        self.funcs
            .get(name)
            .copied()
            .ok_or_else(|| Error::Internal(format!("HIP kernel {name} not loaded")))
    }

    /// Run `f` (which enqueues on the private stream) and wait for the stream.
    pub(super) fn on_aux(
        &self,
        what: &str,
        f: impl FnOnce(sys::hipStream_t) -> sys::hipError_t,
    ) -> Result<()> {
        host_wait(what)?;
        let _bound = self.bind()?;
        check(f(self.aux), || {
            format!("{what} on HIP device {}", self.ordinal)
        })?;
        // SAFETY: FFI; waits for the device's own live stream.
        let r = unsafe { sys::hipStreamSynchronize(self.aux) };
        check(r, || {
            format!("{what} on HIP device {} (synchronize)", self.ordinal)
        })
    }
}

/// Cleanup of a half-opened device.
struct Loaded {
    ordinal: usize,
    module: sys::hipModule_t,
    aux: sys::hipStream_t,
}

impl Drop for Loaded {
    fn drop(&mut self) {
        release(self.ordinal, self.module, self.aux);
    }
}

fn release(ordinal: usize, module: sys::hipModule_t, aux: sys::hipStream_t) {
    let _bound = bound_to(ordinal);
    if !aux.is_null() {
        // SAFETY: FFI destroying a stream this module created, once.
        let _ = unsafe { sys::hipStreamDestroy(aux) };
    }
    if !module.is_null() {
        // SAFETY: FFI unloading a module this module loaded, once, with no stream
        // left that could run its kernels (they hold the device).
        let _ = unsafe { sys::hipModuleUnload(module) };
    }
}

impl Drop for HipDevice {
    fn drop(&mut self) {
        crate::device::release_cached(self);
        release(self.ordinal, self.module, self.aux);
    }
}

/// `hipMemoryTypeDevice` of a HIP runtime of version `runtime_version`
/// (`hipRuntimeGetVersion`: major * 10,000,000 + minor * 100,000 + patch): HIP 6
/// renumbered the enum (Host 1, Device 2; HIP 5: Host 0, Device 1), so the value is
/// taken from the runtime, never from the compile-time bindings.
pub(super) fn device_memory_type(runtime_version: i32) -> i32 {
    if runtime_version >= 60_000_000 {
        2
    } else {
        1
    }
}

/// `hipPointerAttribute_t` of HIP 5 with the memory type as a plain int (a runtime value
/// outside the bindings' enum must not become an invalid Rust enum).
#[repr(C)]
pub(super) struct PointerAttr {
    pub(super) memory_type: i32,
    pub(super) device: i32,
    pub(super) device_pointer: *mut c_void,
    pub(super) host_pointer: *mut c_void,
    pub(super) is_managed: i32,
    pub(super) allocation_flags: u32,
}

impl PointerQueries for HipDevice {
    fn ranges(&self) -> &CheckedRanges {
        &self.ranges
    }

    /// `hipMemGetAddressRange`.
    fn remember(&self, p: DevAddr) {
        let mut base: sys::hipDeviceptr_t = std::ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: FFI query writing one pointer and one size; `p` is device memory of
        // this device (checked before).
        let r =
            unsafe { sys::hipMemGetAddressRange(&mut base, &mut size, p as sys::hipDeviceptr_t) };
        if r == sys::hipError_t::hipSuccess {
            self.ranges.keep(base as DevAddr, size);
        } else {
            // SAFETY: FFI without arguments (clears the failed query's last error).
            let _ = unsafe { sys::hipGetLastError() };
        }
    }

    /// `hipPointerGetAttributes`: memory type and device.
    fn check_byte(&self, p: DevAddr, addr: DevAddr, len: usize, which: &str) -> Result<()> {
        let mut a = PointerAttr {
            memory_type: -1,
            device: -1,
            device_pointer: std::ptr::null_mut(),
            host_pointer: std::ptr::null_mut(),
            is_managed: 0,
            allocation_flags: 0,
        };
        // SAFETY: FFI writing one hipPointerAttribute_t, whose HIP 5 layout PointerAttr
        // repeats (size checked by a unit test); any address may be queried.
        let r = unsafe {
            sys::hipPointerGetAttributes(
                &mut a as *mut PointerAttr as *mut sys::hipPointerAttribute_t,
                p as *const c_void,
            )
        };
        let hint = "the rccl transport takes device pointers of the communicator's device; \
                    host data goes through the local or mpi transport";
        // Formatted only for an error (a good pointer costs no allocation).
        let fault = |f| vendor_api::byte_error("HIP", hint, self.ordinal, (p, addr, len, which), f);
        if r != sys::hipError_t::hipSuccess {
            // Clear the thread's last error, which the failed query set.
            // SAFETY: FFI without arguments.
            let _ = unsafe { sys::hipGetLastError() };
            return Err(fault(Fault::Unknown {
                by: "HIP",
                why: error_string(r),
            }));
        }
        if a.memory_type != self.device_type {
            return Err(fault(Fault::MemoryType(a.memory_type.into())));
        }
        if a.device < 0 || a.device as usize != self.ordinal {
            return Err(fault(Fault::OtherDevice(a.device.into())));
        }
        Ok(())
    }
}

/// Destroys a pooled event (`hipEvent_t` as a handle).
pub(super) fn destroy_event(h: usize) {
    // SAFETY: destroying a pooled event nobody holds, once.
    let _ = unsafe { sys::hipEventDestroy(h as sys::hipEvent_t) };
}
