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

use super::pool::Pool;
use super::reuse::{CheckedRanges, HandlePool};
use super::waits::host_wait;
use super::{Bound, DevAddr, DevEvent, DevGraph, DevStream, Device, QuantCall};
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::kernels_gpu::call::{self, ArgBlock};
use hip_sys::hiprt as sys;
use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex, Weak};

/// A byte string aligned for the ELF loader (include_bytes! alone gives alignment 1).
#[repr(C, align(4096))]
struct Aligned<B: ?Sized>(B);

/// The code objects built by `build.rs`, as `(target, ELF image)`, in the order of
/// [`crate::kernels_gpu::HIP_ARCHS`].
static CODE_OBJECTS: [(&str, &Aligned<[u8]>); 3] = [
    (
        "gfx90a",
        &Aligned(*include_bytes!(concat!(
            env!("OUT_DIR"),
            "/strata_gfx90a.co"
        ))),
    ),
    (
        "gfx940",
        &Aligned(*include_bytes!(concat!(
            env!("OUT_DIR"),
            "/strata_gfx940.co"
        ))),
    ),
    (
        "gfx942",
        &Aligned(*include_bytes!(concat!(
            env!("OUT_DIR"),
            "/strata_gfx942.co"
        ))),
    ),
];

/// The targets strata's HIP kernels are built for (an optional target the build's hipcc
/// did not know is left out).
pub fn built_arches() -> Vec<&'static str> {
    CODE_OBJECTS
        .iter()
        .filter(|(_, co)| !co.0.is_empty())
        .map(|(a, _)| *a)
        .collect()
}

/// The embedded code object for a device whose `gcnArchName` is `gcn_arch_name`
/// (`gfx90a:sramecc+:xnack-`: the target is the part before the first `:`), or
/// [`Error::Device`] naming the device's target and the targets built.
pub fn code_object_for(gcn_arch_name: &str) -> Result<(&'static str, &'static [u8])> {
    let target = gcn_arch_name.split(':').next().unwrap_or("").trim();
    if let Some((a, _)) = CODE_OBJECTS
        .iter()
        .find(|(a, co)| *a == target && co.0.is_empty())
    {
        return Err(Error::Device(format!(
            "the HIP device is {gcn_arch_name:?}; strata's {a} kernels were not built: the \
             hipcc used at build time ({}) does not know {a} (ROCm 5.7 or later does); \
             rebuild with HIPCC or HIP_PATH pointing at a newer ROCm",
            env!("STRATA_HIPCC")
        )));
    }
    CODE_OBJECTS
        .iter()
        .find(|(a, co)| *a == target && !co.0.is_empty())
        .map(|(a, co)| (*a, &co.0))
        .ok_or_else(|| {
            Error::Device(format!(
                "the HIP device is {gcn_arch_name:?} (target {target:?}); strata's HIP kernels \
                 are built for {} only (HIP_ARCHS in src/kernels_gpu/mod.rs, built by \
                 build.rs)",
                built_arches().join(", ")
            ))
        })
}

fn error_string(e: sys::hipError_t) -> String {
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
fn check(r: sys::hipError_t, what: impl FnOnce() -> String) -> Result<()> {
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

/// Raw kernel handle of a loaded module.
#[derive(Clone, Copy)]
struct Func(sys::hipFunction_t);

/// One AMD GPU (a GCD of an MI250X): its module of strata's kernels and a private stream
/// for host copies. Shared (`Arc`) by its streams and buffers.
pub struct HipDevice {
    ordinal: usize,
    name: String,
    gcn_arch: String,
    target: &'static str,
    module: sys::hipModule_t,
    funcs: HashMap<String, Func>,
    /// Non-blocking stream for zeroing and host copies (each call waits for it).
    aux: sys::hipStream_t,
    /// `hipMemoryTypeDevice` as the running runtime numbers it ([`device_memory_type`]).
    device_type: i32,
    /// Allocations made ([`Device::allocations`]).
    allocations: std::sync::atomic::AtomicU64,
    /// Freed blocks kept for reuse ([`super::pool`]).
    pool: Pool,
    /// Events no one holds any more, reused by the next record.
    events: Arc<HandlePool>,
    /// Allocation ranges already found to be memory of this device.
    ranges: CheckedRanges,
    me: Weak<HipDevice>,
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
static OPEN: Mutex<Vec<(usize, Weak<HipDevice>)>> = Mutex::new(Vec::new());

/// NUL-terminated string in `bytes`, lossily decoded.
fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// `(name, gcnArchName)` of device `ordinal`.
fn device_names(ordinal: usize) -> Result<(String, String)> {
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
fn bound_to(ordinal: usize) -> Result<Bound> {
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

impl HipDevice {
    /// Device `ordinal` of the HIP runtime (after `HIP_VISIBLE_DEVICES` /
    /// `ROCR_VISIBLE_DEVICES`), with strata's kernels loaded.
    ///
    /// Errors, never panics: [`Error::Device`] when there is no HIP device or fewer than
    /// `ordinal + 1`, when no embedded code object matches the device's target, or when
    /// loading it fails; [`Error::System`] when the HIP runtime fails to initialize.
    pub fn open(ordinal: usize) -> Result<Arc<HipDevice>> {
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = open
            .iter()
            .find(|(o, _)| *o == ordinal)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(d);
        }
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
        open.retain(|(_, w)| w.strong_count() > 0);
        open.push((ordinal, Arc::downgrade(&d)));
        Ok(d)
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

    fn func(&self, name: &str) -> Result<Func> {
        self.funcs
            .get(name)
            .copied()
            .ok_or_else(|| Error::Internal(format!("HIP kernel {name} not loaded")))
    }

    /// Run `f` (which enqueues on the private stream) and wait for the stream.
    fn on_aux(
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
        super::pool::release_cached(self);
        release(self.ordinal, self.module, self.aux);
    }
}

/// `hipMemoryTypeDevice` of a HIP runtime of version `runtime_version`
/// (`hipRuntimeGetVersion`: major * 10,000,000 + minor * 100,000 + patch): HIP 6
/// renumbered the enum (Host 1, Device 2; HIP 5: Host 0, Device 1), so the value is
/// taken from the runtime, never from the compile-time bindings.
fn device_memory_type(runtime_version: i32) -> i32 {
    if runtime_version >= 60_000_000 {
        2
    } else {
        1
    }
}

/// `hipPointerAttribute_t` of HIP 5 with the memory type as a plain int (a runtime value
/// outside the bindings' enum must not become an invalid Rust enum).
#[repr(C)]
struct PointerAttr {
    memory_type: i32,
    device: i32,
    device_pointer: *mut c_void,
    host_pointer: *mut c_void,
    is_managed: i32,
    allocation_flags: u32,
}

impl HipDevice {
    /// `Ok` when the byte at `p` (the `which` byte of `len` bytes at `addr`) is device
    /// memory of this device (`hipPointerGetAttributes`: memory type and device), else
    /// an `InvalidArgument` saying which byte and why. The device is bound.
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
        // Formatted only for an error (a good pointer costs no allocation).
        let what = || {
            if len == 1 {
                format!("the byte at {addr:#x}")
            } else {
                format!("the {which} byte ({p:#x}) of {len} bytes at {addr:#x}")
            }
        };
        let hint = "the rccl transport takes device pointers of the communicator's device; \
                    host data goes through the local or mpi transport";
        if r != sys::hipError_t::hipSuccess {
            // Clear the thread's last error, which the failed query set.
            // SAFETY: FFI without arguments.
            let _ = unsafe { sys::hipGetLastError() };
            return Err(Error::InvalidArgument(format!(
                "{what} is not HIP device memory (unknown to HIP: {}): {hint}",
                error_string(r),
                what = what()
            )));
        }
        if a.memory_type != self.device_type {
            return Err(Error::InvalidArgument(format!(
                "{what} is not HIP device memory (memory type {}): {hint}",
                a.memory_type,
                what = what()
            )));
        }
        if a.device < 0 || a.device as usize != self.ordinal {
            return Err(Error::InvalidArgument(format!(
                "{what} is memory of HIP device {}, the communicator runs on device {}",
                a.device,
                self.ordinal,
                what = what()
            )));
        }
        Ok(())
    }
}

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
        // The first and the last byte, as NCCL checks a buffer: a tensor may span several
        // mappings (an allocator that maps memory in pieces), which the runtime reports
        // one at a time; the interior is the vendor library's to check.
        let Some((first, last)) = super::span_ends(addr, len)? else {
            return Ok(());
        };
        if self.ranges.known(first) && self.ranges.known(last) {
            return Ok(());
        }
        let _bound = self.bind()?;
        self.check_byte(first, addr, len, "first")?;
        if last != first {
            self.check_byte(last, addr, len, "last")?;
        }
        for p in [first, last] {
            let mut base: sys::hipDeviceptr_t = std::ptr::null_mut();
            let mut size = 0usize;
            // SAFETY: FFI query writing one pointer and one size; `p` is device memory of
            // this device (checked just above).
            let r = unsafe {
                sys::hipMemGetAddressRange(&mut base, &mut size, p as sys::hipDeviceptr_t)
            };
            if r == sys::hipError_t::hipSuccess {
                self.ranges.keep(base as DevAddr, size);
            } else {
                // SAFETY: FFI without arguments (clears the failed query's last error).
                let _ = unsafe { sys::hipGetLastError() };
            }
        }
        Ok(())
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

/// Destroys a pooled event (`hipEvent_t` as a handle).
fn destroy_event(h: usize) {
    // SAFETY: destroying a pooled event nobody holds, once.
    let _ = unsafe { sys::hipEventDestroy(h as sys::hipEvent_t) };
}

/// A HIP event (timing disabled), back in its device's pool on drop.
pub struct HipEvent {
    ev: sys::hipEvent_t,
    pool: Arc<HandlePool>,
}

// SAFETY: a hipEvent_t handle may be used from any thread of the process.
unsafe impl Send for HipEvent {}
// SAFETY: as above; the runtime serializes calls on one event.
unsafe impl Sync for HipEvent {}

impl HipEvent {
    /// A new event recorded on `stream`.
    ///
    /// # Safety
    /// `stream` is null or a live stream of the current device.
    unsafe fn record(pool: &Arc<HandlePool>, stream: sys::hipStream_t) -> Result<HipEvent> {
        let ev = match pool.take() {
            Some(h) => h as sys::hipEvent_t,
            None => {
                let mut ev: sys::hipEvent_t = std::ptr::null_mut();
                // SAFETY: FFI creating an event on the current device.
                let r =
                    unsafe { sys::hipEventCreateWithFlags(&mut ev, sys::hipEventDisableTiming) };
                check(r, || "hipEventCreateWithFlags".to_string())?;
                ev
            }
        };
        // From here the event goes back to the pool whatever happens.
        let ev = HipEvent {
            ev,
            pool: pool.clone(),
        };
        // SAFETY: FFI on an event nobody else holds and the caller's stream (a stream
        // that waited for its previous record keeps that wait).
        let r = unsafe { sys::hipEventRecord(ev.ev, stream) };
        check(r, || "hipEventRecord".to_string())?;
        Ok(ev)
    }
}

impl Drop for HipEvent {
    fn drop(&mut self) {
        self.pool.give(self.ev as usize);
    }
}

impl DevEvent for HipEvent {
    fn query(&self) -> Result<bool> {
        // SAFETY: FFI query of a live event.
        let r = unsafe { sys::hipEventQuery(self.ev) };
        match r {
            sys::hipError_t::hipSuccess => Ok(true),
            sys::hipError_t::hipErrorNotReady => Ok(false),
            other => check(other, || "hipEventQuery".to_string()).map(|_| false),
        }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A captured HIP graph and its instantiation, both destroyed on drop.
pub struct HipGraph {
    dev: Arc<HipDevice>,
    graph: sys::hipGraph_t,
    exec: sys::hipGraphExec_t,
}

// SAFETY: hipGraph_t / hipGraphExec_t handles may be used from any thread of the process;
// the device is Send + Sync.
unsafe impl Send for HipGraph {}
// SAFETY: as above; `&HipGraph` only launches the executable graph (launches on one
// stream are serialized by the stream).
unsafe impl Sync for HipGraph {}

impl Drop for HipGraph {
    fn drop(&mut self) {
        let _bound = self.dev.bind();
        // SAFETY: FFI destroying our own executable graph and graph, once each; launches
        // already enqueued keep what they need.
        unsafe {
            let _ = sys::hipGraphExecDestroy(self.exec);
            let _ = sys::hipGraphDestroy(self.graph);
        }
    }
}

impl DevGraph for HipGraph {
    fn launch(&self, stream: &dyn DevStream) -> Result<()> {
        let d = stream.device();
        if d.api() != super::Api::Hip || d.ordinal() != self.dev.ordinal {
            return Err(Error::InvalidArgument(format!(
                "a graph of HIP device {} launched on a stream of {} device {}",
                self.dev.ordinal,
                d.api().name(),
                d.ordinal()
            )));
        }
        let _bound = self.dev.bind()?;
        // SAFETY: FFI launching our live executable graph on a live stream of its device
        // (checked above).
        let r = unsafe { sys::hipGraphLaunch(self.exec, stream.raw() as sys::hipStream_t) };
        check(r, || {
            format!("hipGraphLaunch on HIP device {}", self.dev.ordinal)
        })
    }
}

/// The stream callback of [`DevStream::delay`] (`hipStreamAddCallback`, which every HIP
/// has; `hipLaunchHostFunc` is missing from older runtimes): sleeps the microseconds
/// packed into `user` (a value, never dereferenced).
unsafe extern "C" fn sleep_callback(
    _stream: sys::hipStream_t,
    _status: sys::hipError_t,
    user: *mut c_void,
) {
    std::thread::sleep(std::time::Duration::from_micros(user as usize as u64));
}

/// A non-blocking HIP stream of a [`HipDevice`] (destroyed on drop).
pub struct HipStream {
    dev: Arc<HipDevice>,
    stream: sys::hipStream_t,
    /// False for a caller's stream ([`Device::borrow_stream`]): never destroyed here.
    owned: bool,
}

// SAFETY: a HIP stream handle may be used from any thread (the runtime serializes
// enqueues); the device is Send + Sync.
unsafe impl Send for HipStream {}
// SAFETY: as above; every method only passes the handle to the runtime.
unsafe impl Sync for HipStream {}

impl Drop for HipStream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let _bound = self.dev.bind();
        // SAFETY: FFI destroying the stream created in `new_stream`, once. Work still
        // queued completes first (hipStreamDestroy waits for it).
        let _ = unsafe { sys::hipStreamDestroy(self.stream) };
    }
}

impl HipStream {
    /// Launch `name` with `params`: one pointer to each argument, in the kernel's order.
    fn launch(
        &self,
        name: &str,
        grid: u32,
        threads: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let f = self.dev.func(name)?;
        let _bound = self.dev.bind()?;
        // SAFETY: kernel launch on this live stream. `params` points at locals of the
        // caller that match the kernel's C signature (kernels-cuda/strata_reduce.cuh;
        // StrataQuantArgs & co. by value, repr(C) twins in kernels_gpu::plan) and outlive
        // the call (the runtime copies the arguments). The device addresses come from
        // buffers whose ranges the caller holds borrowed until the stream is finished,
        // and whose sizes `call::prepare` / `call::elementwise` checked.
        let r = unsafe {
            sys::hipModuleLaunchKernel(
                f.0,
                grid,
                1,
                1,
                threads,
                1,
                1,
                0,
                self.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check(r, || {
            format!(
                "launching {name} ({grid} blocks x {threads} threads) on HIP device {}",
                self.dev.ordinal
            )
        })
    }
}

fn arg<T>(v: &mut T) -> *mut c_void {
    v as *mut T as *mut c_void
}

impl DevStream for HipStream {
    fn device(&self) -> Arc<dyn Device> {
        self.dev.clone()
    }

    fn raw(&self) -> *mut c_void {
        self.stream as *mut c_void
    }

    fn copy(&self, dst: DevAddr, src: DevAddr, bytes: usize) -> Result<()> {
        if bytes == 0 || dst == src {
            return Ok(());
        }
        let _bound = self.dev.bind()?;
        // SAFETY: FFI async copy on this stream; both ranges are borrowed by the caller
        // until the stream is finished (`super::finish`).
        let r = unsafe {
            sys::hipMemcpyAsync(
                dst as *mut c_void,
                src as *const c_void,
                bytes,
                sys::hipMemcpyKind::hipMemcpyDeviceToDevice,
                self.stream,
            )
        };
        check(r, || {
            format!(
                "hipMemcpyAsync of {bytes} bytes {src:#x} -> {dst:#x} on HIP device {}",
                self.dev.ordinal
            )
        })
    }

    fn reduce(
        &self,
        acc: DevAddr,
        src: DevAddr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let Some((name, grid, threads)) =
            call::elementwise("reduce", &[acc, src], count, dtype, Some(op))?
        else {
            return Ok(());
        };
        let (mut a, mut s, mut n) = (acc, src, count as u64);
        self.launch(
            &name,
            grid,
            threads,
            &mut [arg(&mut a), arg(&mut s), arg(&mut n)],
        )
    }

    fn divide(&self, buf: DevAddr, count: usize, dtype: DataType, n: usize) -> Result<()> {
        let Some((name, grid, threads)) = call::elementwise("divide", &[buf], count, dtype, None)?
        else {
            return Ok(());
        };
        let (mut b, mut c, mut d) = (buf, count as u64, n as f64);
        self.launch(
            &name,
            grid,
            threads,
            &mut [arg(&mut b), arg(&mut c), arg(&mut d)],
        )
    }

    fn quant(&self, c: &QuantCall) -> Result<()> {
        let Some(p) = call::prepare(c)? else {
            return Ok(());
        };
        match p.args {
            ArgBlock::Quant(mut a) => self.launch(&p.name, p.grid, p.threads, &mut [arg(&mut a)]),
            ArgBlock::Dequant(mut a) => self.launch(&p.name, p.grid, p.threads, &mut [arg(&mut a)]),
            ArgBlock::Drq(mut a) => self.launch(&p.name, p.grid, p.threads, &mut [arg(&mut a)]),
        }
    }

    fn query(&self) -> Result<bool> {
        // SAFETY: FFI query of this live stream.
        let r = unsafe { sys::hipStreamQuery(self.stream) };
        match r {
            sys::hipError_t::hipSuccess => Ok(true),
            sys::hipError_t::hipErrorNotReady => Ok(false),
            other => check(other, || {
                format!("hipStreamQuery on HIP device {}", self.dev.ordinal)
            })
            .map(|_| false),
        }
    }

    fn delay(&self, d: std::time::Duration) -> Result<()> {
        let _bound = self.dev.bind()?;
        let us = d.as_micros().min(usize::MAX as u128) as usize;
        // SAFETY: FFI on this live stream; the host function only sleeps and reads its
        // argument as an integer.
        let r = unsafe {
            sys::hipStreamAddCallback(self.stream, Some(sleep_callback), us as *mut c_void, 0)
        };
        check(r, || "hipStreamAddCallback".to_string())
    }

    fn record(&self) -> Result<Arc<dyn DevEvent>> {
        let _bound = self.dev.bind()?;
        // SAFETY: this stream is live and of the bound device.
        Ok(Arc::new(unsafe {
            HipEvent::record(&self.dev.events, self.stream)
        }?))
    }

    fn wait_event(&self, ev: &dyn DevEvent) -> Result<()> {
        let ev = ev.as_any().downcast_ref::<HipEvent>().ok_or_else(|| {
            Error::InvalidArgument("an event of another device given to a HIP stream".into())
        })?;
        let _bound = self.dev.bind()?;
        // SAFETY: FFI on this live stream and a live event.
        let r = unsafe { sys::hipStreamWaitEvent(self.stream, ev.ev, 0) };
        check(r, || "hipStreamWaitEvent".to_string())
    }

    fn clear(&self, addr: DevAddr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let _bound = self.dev.bind()?;
        // SAFETY: FFI memset on this live stream of a range the caller holds borrowed
        // (inside one allocation) until the stream is finished.
        let r = unsafe { sys::hipMemsetAsync(addr as *mut c_void, 0, bytes, self.stream) };
        check(r, || {
            format!(
                "hipMemsetAsync of {bytes} bytes at {addr:#x} on HIP device {}",
                self.dev.ordinal
            )
        })
    }

    fn begin_capture(&self) -> Result<()> {
        let _bound = self.dev.bind()?;
        // SAFETY: FFI on this live stream.
        let r = unsafe {
            sys::hipStreamBeginCapture(
                self.stream,
                sys::hipStreamCaptureMode::hipStreamCaptureModeGlobal,
            )
        };
        check(r, || "hipStreamBeginCapture".to_string())
    }

    fn end_capture(&self) -> Result<Arc<dyn DevGraph>> {
        let _bound = self.dev.bind()?;
        let mut graph: sys::hipGraph_t = std::ptr::null_mut();
        // SAFETY: FFI on this live stream, writing one graph handle.
        let r = unsafe { sys::hipStreamEndCapture(self.stream, &mut graph) };
        check(r, || "hipStreamEndCapture".to_string())?;
        let mut exec: sys::hipGraphExec_t = std::ptr::null_mut();
        // SAFETY: FFI instantiating the graph captured above, writing one handle (no
        // error node or log buffer requested).
        let r = unsafe {
            sys::hipGraphInstantiate(
                &mut exec,
                graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if let Err(e) = check(r, || "hipGraphInstantiate".to_string()) {
            // SAFETY: FFI destroying the graph captured above, once.
            let _ = unsafe { sys::hipGraphDestroy(graph) };
            return Err(e);
        }
        Ok(Arc::new(HipGraph {
            dev: self.dev.clone(),
            graph,
            exec,
        }))
    }

    unsafe fn wait_foreign(&self, other: *mut c_void) -> Result<()> {
        let _bound = self.dev.bind()?;
        let mut ev: sys::hipEvent_t = std::ptr::null_mut();
        // SAFETY: FFI creating an event on the current device.
        let r = unsafe { sys::hipEventCreateWithFlags(&mut ev, sys::hipEventDisableTiming) };
        check(r, || "hipEventCreateWithFlags".to_string())?;
        // SAFETY: FFI on the fresh event, the caller's live stream (its contract: null or
        // a stream of this device) and this stream. The event is destroyed once the wait
        // is enqueued; the runtime keeps what the wait needs alive.
        let r = unsafe {
            let r = sys::hipEventRecord(ev, other as sys::hipStream_t);
            if r == sys::hipError_t::hipSuccess {
                sys::hipStreamWaitEvent(self.stream, ev, 0)
            } else {
                r
            }
        };
        // SAFETY: FFI destroying the event created above, once.
        let _ = unsafe { sys::hipEventDestroy(ev) };
        check(r, || {
            format!(
                "waiting for the caller's stream {other:p} on HIP device {}",
                self.dev.ordinal
            )
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_memory_type_follows_the_runtime_not_the_bindings() {
        // HIP 5.2 (the bindings' own numbering) and ROCm 6.0 / 6.2.
        assert_eq!(device_memory_type(50_221_000), 1);
        assert_eq!(
            device_memory_type(50_221_000),
            sys::hipMemoryType::hipMemoryTypeDevice as i32
        );
        assert_eq!(device_memory_type(60_032_830), 2);
        assert_eq!(device_memory_type(60_241_134), 2);
    }

    #[test]
    fn opening_without_a_device_is_a_clear_error() {
        match HipDevice::open(0) {
            Err(e @ (Error::Device(_) | Error::System(_))) => {
                let m = e.to_string();
                eprintln!("HipDevice::open(0): {m}");
                assert!(m.contains("HIP"), "{m}");
                assert!(m.len() > 40, "{m}");
                // A second attempt behaves the same (nothing half-open is cached).
                let again = HipDevice::open(0).unwrap_err();
                assert_eq!(again.code(), e.code(), "{again}");
            }
            Err(other) => panic!("expected a Device or System error, got {other}"),
            Ok(dev) => smoke(&dev),
        }
        assert!(matches!(
            HipDevice::open(1 << 20),
            Err(Error::Device(_) | Error::System(_))
        ));
    }

    /// With an AMD GPU: allocation, copies and one launch of each kind agree with the CPU.
    fn smoke(dev: &Arc<HipDevice>) {
        let d: Arc<dyn Device> = dev.clone();
        let again = HipDevice::open(dev.ordinal()).unwrap();
        assert!(Arc::ptr_eq(dev, &again), "one HipDevice per ordinal");
        assert!(d.pci_bus_id().unwrap().contains(':'));
        let n = 1000usize;
        let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
        let pa = d.alloc_zeroed(n * 4).unwrap();
        let pb = d.alloc_zeroed(n * 4).unwrap();
        let mut zero = vec![1u8; n * 4];
        d.dtoh(&mut zero, pa).unwrap();
        assert!(zero.iter().all(|&x| x == 0));
        d.htod(pa, bytemuck::cast_slice(&a)).unwrap();
        d.htod(pb, bytemuck::cast_slice(&b)).unwrap();
        d.check_pointer(pa, n * 4).unwrap();
        // The last byte far outside any allocation; null.
        assert!(d.check_pointer(pa, 1 << 44).is_err());
        assert!(d.check_pointer(0, 4).is_err());
        let host = [0u8; 16];
        assert!(d.check_pointer(host.as_ptr() as u64, 16).is_err());
        let s = d.new_stream().unwrap();
        s.reduce(pa, pb, n, DataType::F32, ReduceOp::Sum).unwrap();
        s.divide(pa, n, DataType::F32, 3).unwrap();
        // SAFETY: null is the legacy default stream.
        unsafe { s.wait_foreign(std::ptr::null_mut()) }.unwrap();
        super::super::finish(&*s, std::time::Duration::from_secs(30), "smoke", || Ok(())).unwrap();
        let mut out = vec![0u8; n * 4];
        d.dtoh(&mut out, pa).unwrap();
        for (i, c) in out.chunks_exact(4).enumerate() {
            let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            assert_eq!(v, ((3 * i) as f64 / 3.0) as f32, "element {i}");
        }
        // SAFETY: allocated above, freed once, the stream is finished.
        unsafe {
            d.free(pa);
            d.free(pb);
        }
        let links = gcd_links(device_count().unwrap()).unwrap();
        assert_eq!(links.len(), device_count().unwrap());
    }

    #[test]
    fn code_objects_are_elf_with_every_kernel() {
        let names: Vec<String> = crate::kernels_gpu::kernel_names()
            .into_iter()
            .chain(crate::kernels_gpu::reduce_kernel_names())
            .collect();
        assert_eq!(names.len(), 70);
        let skipped: Vec<&str> = env!("STRATA_HIP_SKIPPED")
            .split(',')
            .filter(|s| !s.is_empty())
            .collect();
        for (arch, co) in CODE_OBJECTS.iter() {
            let b = &co.0;
            if skipped.contains(arch) {
                assert!(b.is_empty(), "{arch}: skipped but {} bytes", b.len());
                continue;
            }
            assert!(b.len() > 1024, "{arch}: {} bytes", b.len());
            assert_eq!(&b[..4], b"\x7fELF", "{arch}: not an ELF file");
            assert_eq!(b[4], 2, "{arch}: not ELF64");
            // e_machine (offset 18, little endian) is EM_AMDGPU = 0xe0.
            assert_eq!(
                u16::from_le_bytes([b[18], b[19]]),
                0xe0,
                "{arch}: not AMDGPU"
            );
            assert_eq!(b.as_ptr() as usize % 4096, 0, "{arch}: image not aligned");
            for n in &names {
                let sym = format!("{n}\0");
                assert!(
                    b.windows(sym.len()).any(|w| w == sym.as_bytes()),
                    "{arch}: kernel {n} missing"
                );
            }
        }
    }

    #[test]
    fn build_script_matches_the_kernel_constants() {
        let skipped: Vec<&str> = env!("STRATA_HIP_SKIPPED")
            .split(',')
            .filter(|s| !s.is_empty())
            .collect();
        // Only the optional gfx942 may be left out (by a hipcc that does not know it).
        assert!(skipped.iter().all(|a| *a == "gfx942"), "{skipped:?}");
        let want: Vec<&str> = crate::kernels_gpu::HIP_ARCHS
            .into_iter()
            .filter(|a| !skipped.contains(a))
            .collect();
        assert_eq!(built_arches(), want);
        assert_eq!(
            env!("STRATA_HIP_ARCHS"),
            crate::kernels_gpu::HIP_ARCHS.join(",")
        );
        let opts: Vec<&str> = env!("STRATA_HIPCC_OPTIONS").split(' ').collect();
        for o in crate::kernels_gpu::HIPCC_OPTIONS {
            assert!(opts.contains(&o), "build.rs does not pass {o}: {opts:?}");
        }
        assert!(env!("STRATA_HIPCC").ends_with("hipcc"));
    }

    #[test]
    fn code_object_is_picked_by_target() {
        assert_eq!(
            code_object_for("gfx90a:sramecc+:xnack-").unwrap().0,
            "gfx90a"
        );
        assert_eq!(code_object_for("gfx940").unwrap().0, "gfx940");
        match code_object_for("gfx942:sramecc+:xnack-") {
            Ok((a, _)) => assert_eq!(a, "gfx942"),
            Err(e) => {
                // Built by a hipcc that does not know gfx942 (Debian's 5.2).
                assert!(env!("STRATA_HIP_SKIPPED").contains("gfx942"), "{e}");
                assert!(matches!(e, Error::Device(_)), "{e}");
                assert!(e.to_string().contains("newer ROCm"), "{e}");
            }
        }
        let e = code_object_for("gfx1100").unwrap_err();
        assert!(matches!(e, Error::Device(_)), "{e}");
        let m = e.to_string();
        assert!(m.contains("gfx1100") && m.contains("gfx90a, gfx940"), "{m}");
        assert!(code_object_for("").is_err());
    }

    #[test]
    fn errors_name_the_call_and_the_runtime_message() {
        let e = check(sys::hipError_t::hipErrorOutOfMemory, || {
            "hipMalloc of 8 bytes".into()
        })
        .unwrap_err();
        assert!(matches!(e, Error::Device(_)), "{e}");
        let m = e.to_string();
        assert!(m.contains("hipMalloc of 8 bytes: "), "{m}");
        assert!(m.contains("hipErrorOutOfMemory"), "{m}");
        assert!(check(sys::hipError_t::hipSuccess, || unreachable!()).is_ok());
    }

    #[test]
    fn abi_layouts_match_the_bindings() {
        use std::mem::{align_of, size_of};
        assert_eq!(
            size_of::<PointerAttr>(),
            size_of::<sys::hipPointerAttribute_t>()
        );
        assert_eq!(
            align_of::<PointerAttr>(),
            align_of::<sys::hipPointerAttribute_t>()
        );
        assert_eq!(
            std::mem::offset_of!(PointerAttr, device),
            std::mem::offset_of!(sys::hipPointerAttribute_t, device)
        );
        assert_eq!(
            std::mem::offset_of!(PointerAttr, device_pointer),
            std::mem::offset_of!(sys::hipPointerAttribute_t, devicePointer)
        );
        // HIP 5.2's hipDeviceProp_t (Debian's /usr/include/hip): 792 bytes, gcnArchName at 396.
        assert_eq!(size_of::<sys::hipDeviceProp_t>(), 792);
        assert_eq!(std::mem::offset_of!(sys::hipDeviceProp_t, gcnArchName), 396);
    }

    #[test]
    fn link_matrix_needs_the_devices() {
        assert!(gcd_links(0).unwrap().is_empty());
        if device_count().unwrap_or(0) == 0 {
            let e = gcd_links(1).unwrap_err();
            assert!(matches!(e, Error::Device(_) | Error::System(_)), "{e}");
        }
    }
}
