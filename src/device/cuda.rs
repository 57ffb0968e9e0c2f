//! The CUDA device (feature `cuda`): cudarc's driver API loaded at run time, the
//! device's primary context, raw allocations, streams, and strata's kernels compiled
//! once per device by NVRTC ([`crate::kernels_gpu`]) and launched through
//! [`crate::kernels_gpu::call`].
//!
//! Device discipline: every entry that needs the device's context current holds a
//! [`Device::bind`] guard for its driver calls (`cuCtxGetCurrent`, `cuCtxSetCurrent` of
//! the primary context, and the previous context, possibly none, made current again
//! when the guard drops), including the drops of cudarc objects that bind the context
//! themselves (streams, the module, the context). No thread, a caller's or strata's,
//! is left on another context. Host waits for the device (synchronous copies, zeroing,
//! a free that synchronizes) go through [`super::waits::host_wait`] first.

use super::pool::Pool;
use super::reuse::{CheckedRanges, HandlePool};
use super::vendor_api::{self, Fault, PointerQueries};
use super::waits::host_wait;
use super::{Bound, DevAddr, DevEvent, DevGraph, DevStream, Device, Elementwise, QuantCall};
use crate::error::{Error, Result};
use crate::kernels_gpu::call;
use crate::kernels_gpu::GpuQuant;
use cudarc::driver::{
    result, sys, CudaContext, CudaFunction, CudaModule, CudaStream, DriverError, PushKernelArg,
};
use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::sync::{Arc, OnceLock};

fn dev_err(what: &str, e: DriverError) -> Error {
    Error::Device(format!("{what}: {e:?}"))
}

fn check(what: &str, r: sys::CUresult) -> Result<()> {
    r.result().map_err(|e| dev_err(what, e))
}

/// Run `f` with the calling thread's stream-capture mode relaxed (restored after):
/// strata's own waits and queries on streams and events outside a capture (the private
/// stream, a watched call's end event) then do not invalidate a capture another thread
/// began in global mode, as PyTorch's `capture_error_mode="thread_local"` avoids for
/// its own threads. A wait on a captured stream or event is still an error.
fn relaxed<T>(f: impl FnOnce() -> T) -> T {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: FFI exchanging this thread's capture mode through a local.
    let swapped =
        unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) } == sys::CUresult::CUDA_SUCCESS;
    let r = f();
    if swapped {
        // SAFETY: as above, putting back the mode the first exchange returned.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    }
    r
}

/// One CUDA GPU: its primary context and, once compiled, strata's kernels.
pub struct CudaDevice {
    /// Dropped in `Drop` under a bind guard (cudarc binds it to release it).
    ctx: ManuallyDrop<Arc<CudaContext>>,
    kernels: OnceLock<std::result::Result<GpuQuant, String>>,
    allocations: std::sync::atomic::AtomicU64,
    pool: Pool,
    /// Private non-blocking stream for zeroing (each use waits for it alone).
    aux: OnceLock<Arc<CudaStream>>,
    /// The device has memory pools: allocations are stream-ordered on `aux`.
    pools: OnceLock<bool>,
    /// `strata_spin` ([`SPIN_PTX`]) and its module, loaded on first use.
    spin: OnceLock<std::result::Result<(Arc<CudaModule>, CudaFunction), String>>,
    /// Events no one holds any more, reused by the next record.
    events: Arc<HandlePool>,
    /// Allocation ranges already found to be memory of this device.
    ranges: CheckedRanges,
    /// This device, for the streams it hands out (no process-wide lookup per call).
    me: std::sync::Weak<CudaDevice>,
}

/// Destroys a pooled event (`CUevent` as a handle).
fn destroy_event(h: usize) {
    // SAFETY: destroying a pooled event nobody holds, once.
    let _ = unsafe { result::event::destroy(h as sys::CUevent) };
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaDevice({})", self.ctx.ordinal())
    }
}

impl CudaDevice {
    /// Device `ordinal` (errors as [`open_device`]). Devices are
    /// shared per process: opening the same ordinal twice returns the same device, so
    /// its kernels are compiled once.
    pub fn open(ordinal: usize) -> Result<Arc<CudaDevice>> {
        static OPEN: vendor_api::Opened<CudaDevice> = vendor_api::Opened::new();
        OPEN.get_or_open(ordinal, || {
            let ctx = open_device(ordinal)?;
            // The pool's events keep the primary context retained: one still watched when the
            // device goes is destroyed (by the pool) before the context is released.
            let events = Arc::new(HandlePool::new(destroy_event, Some(ctx.clone())));
            let d = Arc::new_cyclic(|me| CudaDevice {
                me: me.clone(),
                ctx: ManuallyDrop::new(ctx),
                kernels: OnceLock::new(),
                allocations: std::sync::atomic::AtomicU64::new(0),
                pool: Pool::default(),
                aux: OnceLock::new(),
                pools: OnceLock::new(),
                spin: OnceLock::new(),
                events,
                ranges: CheckedRanges::default(),
            });
            Ok(d)
        })
    }

    /// Number of CUDA devices (0 when the driver is missing).
    pub fn count() -> usize {
        if !driver_ready() {
            return 0;
        }
        result::device::get_count()
            .map(|n| n.max(0) as usize)
            .unwrap_or(0)
    }

    /// The ordinal of the device whose context is current on this thread, if any (what
    /// `cudaSetDevice` or a framework made current).
    pub fn current_ordinal_of_thread() -> Option<usize> {
        if !driver_ready() {
            return None;
        }
        let ctx = result::ctx::get_current().ok()??;
        let _ = ctx;
        let mut d: sys::CUdevice = 0;
        // SAFETY: FFI query of the current context's device, writing one int.
        let r = unsafe { sys::cuCtxGetDevice(&mut d) };
        r.result().ok().map(|_| d as usize)
    }

    /// The cudarc context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The private stream (made on first use).
    fn aux(&self) -> Result<&Arc<CudaStream>> {
        if let Some(s) = self.aux.get() {
            return Ok(s);
        }
        let s = self
            .ctx
            .new_stream()
            .map_err(|e| dev_err("creating the private stream", e))?;
        Ok(self.aux.get_or_init(|| s))
    }

    /// True when the device has memory pools (`cuMemAllocAsync`).
    fn has_pools(&self) -> bool {
        *self.pools.get_or_init(|| {
            self.ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
                .is_ok_and(|v| v == 1)
        })
    }

    /// Enqueue `call` (`f`, on the private stream) and wait for that stream alone: a
    /// host wait (`what`), with the capture mode relaxed. Never the whole device (a
    /// caller's stream may be waiting for a stream-ordered collective of another rank
    /// on this device).
    fn on_aux(
        &self,
        what: &str,
        call: &str,
        f: impl FnOnce(sys::CUstream) -> sys::CUresult,
    ) -> Result<()> {
        host_wait(what)?;
        let _bound = self.bind()?;
        let aux = self.aux()?;
        relaxed(|| {
            check(call, f(aux.cu_stream()))?;
            // SAFETY: FFI wait for the device's own live stream.
            check("cuStreamSynchronize", unsafe {
                sys::cuStreamSynchronize(aux.cu_stream())
            })
        })
    }

    /// Zero `bytes` at `p` on the private stream and wait for it alone.
    fn zero_on_aux(&self, p: DevAddr, bytes: usize) -> Result<()> {
        // SAFETY: FFI memset of a range inside one allocation of this context (the
        // caller's contract), on the private stream, then that stream is waited for.
        self.on_aux(
            "zeroing device memory (cuMemsetD8Async + cuStreamSynchronize)",
            "cuMemsetD8Async",
            |s| unsafe { sys::cuMemsetD8Async(p, 0, bytes, s) },
        )
    }

    /// The delay kernel `strata_spin` (loaded from [`SPIN_PTX`] on first use).
    fn spin(&self) -> Result<&CudaFunction> {
        let r = self.spin.get_or_init(|| {
            let _bound = self.bind().map_err(|e| e.to_string())?;
            let m = self
                .ctx
                .load_module(cudarc::nvrtc::Ptx::from_src(SPIN_PTX))
                .map_err(|e| format!("loading strata_spin's PTX: {e:?}"))?;
            let f = m
                .load_function("strata_spin")
                .map_err(|e| format!("strata_spin missing from its module: {e:?}"))?;
            Ok((m, f))
        });
        r.as_ref()
            .map(|(_, f)| f)
            .map_err(|e| Error::Device(e.clone()))
    }

    /// strata's kernels in this device's context (compiled by NVRTC on first use).
    fn kernels(&self) -> Result<&GpuQuant> {
        self.kernels
            .get_or_init(|| GpuQuant::new(&self.ctx).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| Error::System(format!("strata's CUDA kernels: {e}")))
    }
}

impl Device for CudaDevice {
    fn api(&self) -> super::Api {
        super::Api::Cuda
    }
    fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }
    fn bind(&self) -> Result<Bound> {
        let target = self.ctx.cu_ctx();
        let prev = result::ctx::get_current().map_err(|e| dev_err("cuCtxGetCurrent", e))?;
        if prev == Some(target) {
            return Ok(Bound::none());
        }
        // SAFETY: FFI making this device's primary context (retained by `self.ctx` for
        // as long as `self` lives) current on the calling thread.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(target) })?;
        let prev = prev.unwrap_or(std::ptr::null_mut());
        Ok(Bound::restoring(move || {
            // SAFETY: FFI making current again the context that was current on this
            // thread before (the guard is not Send: this runs on the same thread), or
            // none when there was none.
            let _ = unsafe { sys::cuCtxSetCurrent(prev) };
        }))
    }
    fn alloc_zeroed(&self, bytes: usize) -> Result<DevAddr> {
        if bytes == 0 {
            return Ok(0);
        }
        let _bound = self.bind()?;
        // Stream-ordered on the private stream where the device has memory pools:
        // cuMemAllocAsync never synchronizes other streams, while a plain cuMemAlloc may
        // serialize against work already queued (a caller's stream waiting for a
        // stream-ordered collective whose first call is allocating its scratch).
        let p = if self.has_pools() {
            let aux = self.aux()?;
            // SAFETY: FFI allocation on the private stream, waited for in `zero_on_aux`
            // below before anyone sees the address.
            relaxed(|| unsafe { result::malloc_async(aux.cu_stream(), bytes) })
                .map_err(|e| dev_err(&format!("cuMemAllocAsync of {bytes} bytes"), e))?
        } else {
            // SAFETY: FFI allocation of `bytes` bytes in the bound context.
            unsafe { result::malloc_sync(bytes) }
                .map_err(|e| dev_err(&format!("cuMemAlloc of {bytes} bytes"), e))?
        };
        self.allocations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Zeroed on the private stream, finished before anyone sees the address: no
        // later work on another stream can race it, and no other stream is waited for
        // (a caller's stream may be waiting for a stream-ordered collective).
        if let Err(e) = self.zero_on_aux(p, bytes) {
            // SAFETY: freeing the allocation made above, once.
            unsafe { self.free(p) };
            return Err(e);
        }
        Ok(p)
    }
    unsafe fn free(&self, addr: DevAddr) {
        let Ok(_bound) = self.bind() else {
            return;
        };
        self.ranges.forget(addr);
        // Counted, never refused: a free cannot fail (the block would leak).
        let _ = host_wait("freeing device memory (cuMemFreeAsync + cuStreamSynchronize)");
        if self.has_pools() {
            if let Ok(aux) = self.aux() {
                // SAFETY: the caller's contract: `addr` came from `alloc_zeroed` (the
                // stream-ordered allocator on this device), is freed once, and its work
                // has run; the private stream is then waited for.
                let _ = relaxed(|| unsafe {
                    result::free_async(addr, aux.cu_stream())
                        .and_then(|_| result::stream::synchronize(aux.cu_stream()))
                });
                return;
            }
        }
        // SAFETY: the caller's contract: `addr` came from `alloc_zeroed`, freed once.
        let _ = unsafe { result::free_sync(addr) };
    }
    fn htod(&self, dst: DevAddr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        // Earlier strata work on the range is over: the caller holds a borrow of it (a
        // Buffer's DevGuard), which strata's work releases only when finished.
        // SAFETY: FFI copy of `src.len()` bytes into a range inside one allocation, and
        // `src` outlives it (the stream is synchronized before returning).
        self.on_aux(
            "a host-to-device copy (cuMemcpyHtoDAsync + cuStreamSynchronize)",
            "cuMemcpyHtoDAsync",
            |s| unsafe {
                sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr() as *const c_void, src.len(), s)
            },
        )
    }
    fn dtoh(&self, dst: &mut [u8], src: DevAddr) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let (n, p) = (dst.len(), dst.as_mut_ptr() as *mut c_void);
        // SAFETY: as `htod`, in the other direction; `dst` is exclusively borrowed for
        // the whole (waited-for) copy.
        self.on_aux(
            "a device-to-host copy (cuMemcpyDtoHAsync + cuStreamSynchronize)",
            "cuMemcpyDtoHAsync",
            |s| unsafe { sys::cuMemcpyDtoHAsync_v2(p, src, n, s) },
        )
    }
    fn check_pointer(&self, addr: DevAddr, len: usize) -> Result<()> {
        vendor_api::check_span(self, addr, len)
    }
    fn new_stream(&self) -> Result<Arc<dyn DevStream>> {
        let _bound = self.bind()?;
        let s = self
            .ctx
            .new_stream()
            .map_err(|e| dev_err("creating a CUDA stream", e))?;
        let dev = CudaDevice::open(self.ordinal())?;
        Ok(Arc::new(CudaDevStream {
            dev,
            stream: ManuallyDrop::new(s),
        }))
    }
    fn pci_bus_id(&self) -> Result<String> {
        let mut buf = [0 as std::ffi::c_char; 64];
        // SAFETY: FFI writing at most 64 bytes, NUL-terminated.
        check("cuDeviceGetPCIBusId", unsafe {
            sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), 64, self.ctx.cu_device())
        })?;
        // SAFETY: NUL-terminated by the driver within the buffer.
        Ok(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .to_lowercase())
    }
    fn allocations(&self) -> u64 {
        self.allocations.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn zero(&self, addr: DevAddr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.zero_on_aux(addr, bytes)
    }
    unsafe fn alloc_in_order(&self, raw: *mut c_void, bytes: usize) -> Result<Option<DevAddr>> {
        if bytes == 0 || !self.has_pools() {
            return Ok(None);
        }
        // In a capture the allocation would be the graph's own (freed with it).
        // SAFETY: the caller's contract: `raw` is null or a live stream of this device.
        if unsafe { self.is_capturing(raw) }? {
            return Ok(None);
        }
        let _bound = self.bind()?;
        // SAFETY: FFI stream-ordered allocation on the caller's stream (its contract),
        // freed by `free` (cuMemFreeAsync), in relaxed capture mode as strata's other
        // calls beside a caller's capture.
        let p = relaxed(|| unsafe { result::malloc_async(raw as sys::CUstream, bytes) })
            .map_err(|e| dev_err(&format!("cuMemAllocAsync of {bytes} bytes"), e))?;
        self.allocations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Some(p))
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
            CudaEvent::record(self, raw as sys::CUstream)
        }?))
    }
    unsafe fn is_capturing(&self, raw: *mut c_void) -> Result<bool> {
        let _bound = self.bind()?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: FFI query of the caller's stream (its contract), writing one enum.
        check("cuStreamIsCapturing", unsafe {
            sys::cuStreamIsCapturing(raw as sys::CUstream, &mut status)
        })?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }
    unsafe fn wait_event_on(&self, raw: *mut c_void, ev: &dyn DevEvent) -> Result<()> {
        let ev: &CudaEvent = vendor_api::event_of(ev, "CUDA")?;
        let _bound = self.bind()?;
        // SAFETY: FFI on the caller's stream (its contract: null or a live stream of this
        // device) and a live event.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(raw as sys::CUstream, ev.ev, 0)
        })
    }
    unsafe fn borrow_stream(&self, raw: *mut c_void) -> Result<Arc<dyn DevStream>> {
        let dev = self
            .me
            .upgrade()
            .ok_or_else(|| Error::Internal("CUDA device used while being dropped".into()))?;
        // SAFETY: the caller's contract: `raw` is null or a live stream of this context
        // that outlives the wrapper; cudarc's borrowed wrapper never destroys it, and
        // strata orders its work on it with events (event tracking is off).
        let s = unsafe { self.ctx.wrap_borrowed_stream(raw as sys::CUstream) };
        Ok(Arc::new(CudaDevStream {
            dev,
            stream: ManuallyDrop::new(s),
        }))
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        super::release_cached(self);
        // cudarc binds the context to unload the module, destroy the private stream and
        // release the primary context: under this guard, which then makes the thread's
        // previous context current again.
        let _bound = self.bind();
        drop(self.kernels.take());
        drop(self.aux.take());
        // SAFETY: `ctx` is dropped once, here, and not used afterwards (the guard's
        // restore holds the previous context only).
        unsafe { ManuallyDrop::drop(&mut self.ctx) };
    }
}

impl PointerQueries for CudaDevice {
    fn ranges(&self) -> &CheckedRanges {
        &self.ranges
    }

    /// As the driver reports it (`cuPointerGetAttribute`: range start and size).
    fn remember(&self, p: DevAddr) {
        let mut start: DevAddr = 0;
        let mut size: usize = 0;
        // SAFETY: FFI queries writing one CUdeviceptr / one size_t; `p` is device memory
        // of this context (checked by the caller).
        let ok = unsafe {
            sys::cuPointerGetAttribute(
                &mut start as *mut DevAddr as *mut c_void,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                p,
            ) == sys::CUresult::CUDA_SUCCESS
                && sys::cuPointerGetAttribute(
                    &mut size as *mut usize as *mut c_void,
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                    p,
                ) == sys::CUresult::CUDA_SUCCESS
        };
        if !ok || size == 0 || !(start <= p && p < start + size as u64) {
            return;
        }
        self.ranges.keep(start, size);
    }

    /// `cuPointerGetAttribute`: memory type and device ordinal.
    fn check_byte(&self, p: DevAddr, addr: DevAddr, len: usize, which: &str) -> Result<()> {
        let mut kind: u32 = 0;
        let mut ordinal: i32 = -1;
        // SAFETY: FFI queries writing one u32 / i32 each; any address may be queried
        // (unknown ones are an error result).
        let (r1, r2) = unsafe {
            (
                sys::cuPointerGetAttribute(
                    &mut kind as *mut u32 as *mut c_void,
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                    p,
                ),
                sys::cuPointerGetAttribute(
                    &mut ordinal as *mut i32 as *mut c_void,
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                    p,
                ),
            )
        };
        let hint = "the nccl and cuda-local transports take device pointers of the \
                    communicator's device; host data goes through the local or mpi transport";
        // Formatted only for an error (a good pointer costs no allocation).
        let fault =
            |f| vendor_api::byte_error("CUDA", hint, self.ordinal(), (p, addr, len, which), f);
        if let Err(e) = r1.result() {
            return Err(fault(Fault::Unknown {
                by: "the driver",
                why: format!("{e:?}"),
            }));
        }
        if kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            return Err(fault(Fault::MemoryType(kind.into())));
        }
        if let Err(e) = r2.result() {
            return Err(fault(Fault::NoDevice(format!("{e:?}"))));
        }
        if ordinal < 0 || ordinal as usize != self.ordinal() {
            return Err(fault(Fault::OtherDevice(ordinal.into())));
        }
        Ok(())
    }
}

/// A CUDA event (timing disabled), back in its device's pool on drop.
pub struct CudaEvent {
    ev: sys::CUevent,
    pool: Arc<HandlePool>,
}

// SAFETY: a CUevent handle may be used from any thread of the process.
unsafe impl Send for CudaEvent {}
// SAFETY: as above; the driver serializes calls on one event.
unsafe impl Sync for CudaEvent {}

impl CudaEvent {
    /// A new event recorded on `stream`.
    ///
    /// # Safety
    /// `stream` is null or a live stream of `dev`'s context, bound on this thread.
    unsafe fn record(dev: &CudaDevice, stream: sys::CUstream) -> Result<CudaEvent> {
        let ev = match dev.events.take() {
            Some(ev) => ev as sys::CUevent,
            None => result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(|e| dev_err("cuEventCreate", e))?,
        };
        // From here the event goes back to the pool whatever happens.
        let ev = CudaEvent {
            ev,
            pool: dev.events.clone(),
        };
        // SAFETY: FFI on an event nobody else holds and the caller's stream. A stream
        // that waited for its previous record keeps that wait (cuStreamWaitEvent uses
        // the record current at the wait).
        unsafe { result::event::record(ev.ev, stream) }.map_err(|e| dev_err("cuEventRecord", e))?;
        Ok(ev)
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        self.pool.give(self.ev as usize);
    }
}

impl DevEvent for CudaEvent {
    fn query(&self) -> Result<bool> {
        // SAFETY: FFI query of a live event.
        match relaxed(|| unsafe { sys::cuEventQuery(self.ev) }) {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => check("cuEventQuery", other).map(|_| false),
        }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A captured CUDA graph and its instantiation, both destroyed on drop.
pub type CudaGraph = vendor_api::Graph<CudaGraphHandles>;

/// The driver's handles of a [`CudaGraph`].
pub struct CudaGraphHandles {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: CUgraph / CUgraphExec handles may be used from any thread of the process.
unsafe impl Send for CudaGraphHandles {}
// SAFETY: as above; `&CudaGraphHandles` only launches the executable graph, which the
// driver allows concurrently (launches on one stream are serialized by the stream).
unsafe impl Sync for CudaGraphHandles {}

impl vendor_api::GraphHandles for CudaGraphHandles {
    type Dev = CudaDevice;
    const VENDOR: &'static str = "CUDA";
    fn launch(&self, stream: &dyn DevStream) -> Result<()> {
        // SAFETY: FFI launching our live executable graph on a live stream of its device
        // (checked by the caller, which binds the device).
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(self.exec, stream.raw() as sys::CUstream)
        })
    }
    fn destroy(&mut self) {
        // SAFETY: destroying our own executable graph and graph, once each (on drop).
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

/// `strata_spin(ns)`: one thread that sleeps in 1 us steps until the device's global
/// timer has advanced `ns` nanoseconds ([`DevStream::delay`]). PTX by hand, JIT-compiled
/// by the driver when first used (no NVRTC): `nanosleep` needs sm_70.
const SPIN_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry strata_spin(
    .param .u64 strata_spin_ns
)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [strata_spin_ns];
    mov.u64 %rd2, %globaltimer;
$L_spin:
    nanosleep.u32 1000;
    mov.u64 %rd3, %globaltimer;
    sub.s64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p1, %rd4, %rd1;
    @%p1 bra $L_spin;
    ret;
}
"#;

/// A CUDA stream of a [`CudaDevice`].
pub struct CudaDevStream {
    dev: Arc<CudaDevice>,
    /// Dropped in `Drop` under a bind guard (cudarc binds the context to destroy it).
    stream: ManuallyDrop<Arc<CudaStream>>,
}

impl Drop for CudaDevStream {
    fn drop(&mut self) {
        let _bound = self.dev.bind();
        // SAFETY: `stream` is dropped once, here, and not used afterwards.
        unsafe { ManuallyDrop::drop(&mut self.stream) };
    }
}

impl CudaDevStream {
    /// Launch an element-wise kernel on `(addresses..., count)` arguments.
    fn launch_elementwise(
        &self,
        name: &str,
        grid: u32,
        threads: u32,
        a: u64,
        b: u64,
        n: Scalar,
    ) -> Result<()> {
        // cudarc binds the context to compile, load and launch: bound here, restored after.
        let _bound = self.dev.bind()?;
        let k = self.dev.kernels()?;
        // SAFETY: kernel launch. `strata_reduce_*(T* acc, const T* src, u64 n)` and
        // `strata_divide_*(T* buf, u64 count, double n)` (kernels-cuda/strata_reduce.cuh)
        // get exactly these arguments; the addresses come from buffers the caller holds
        // borrowed, aligned and sized by `call::elementwise`, until the stream is waited for.
        unsafe {
            k.launch(&self.stream, name, grid, threads, |l| {
                l.arg(&a);
                l.arg(&b);
                match &n {
                    Scalar::U64(v) => l.arg(v),
                    Scalar::F64(v) => l.arg(v),
                };
            })
        }
    }
}

/// The last argument of an element-wise kernel.
enum Scalar {
    U64(u64),
    F64(f64),
}

impl DevStream for CudaDevStream {
    fn device(&self) -> Arc<dyn Device> {
        self.dev.clone()
    }
    fn raw(&self) -> *mut c_void {
        self.stream.cu_stream() as *mut c_void
    }
    fn copy(&self, dst: DevAddr, src: DevAddr, bytes: usize) -> Result<()> {
        if bytes == 0 || dst == src {
            return Ok(());
        }
        let _bound = self.dev.bind()?;
        // SAFETY: FFI async copy on this stream; both ranges are borrowed by the caller
        // until the stream is synchronized (`super::finish`).
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(|e| dev_err("cuMemcpyDtoDAsync", e))
    }
    fn elementwise(&self, e: Elementwise) -> Result<()> {
        let Some((name, grid, threads)) = e.prepare()? else {
            return Ok(());
        };
        let (a, b, n) = match e {
            Elementwise::Reduce {
                acc, src, count, ..
            } => (acc, src, Scalar::U64(count as u64)),
            Elementwise::Divide { buf, count, n, .. } => (buf, count as u64, Scalar::F64(n as f64)),
        };
        self.launch_elementwise(&name, grid, threads, a, b, n)
    }
    fn quant(&self, c: &QuantCall) -> Result<()> {
        let Some(p) = call::prepare(c)? else {
            return Ok(());
        };
        let _bound = self.dev.bind()?;
        // SAFETY: `prepare` checked the regions, which the caller (bufops) holds borrowed
        // until the stream is waited for.
        unsafe { self.dev.kernels()?.launch_prepared(&self.stream, &p) }
    }
    fn query(&self) -> Result<bool> {
        // SAFETY: FFI query of a live stream.
        let r = relaxed(|| unsafe { sys::cuStreamQuery(self.stream.cu_stream()) });
        match r {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => check("cuStreamQuery", other).map(|_| false),
        }
    }
    fn delay(&self, d: std::time::Duration) -> Result<()> {
        let _bound = self.dev.bind()?;
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        let f = self.dev.spin()?;
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&ns);
        // SAFETY: launch of `strata_spin(u64)` with one u64 by value; it touches no
        // memory.
        unsafe { b.launch(cfg) }.map_err(|e| dev_err("launching strata_spin", e))?;
        Ok(())
    }
    fn record(&self) -> Result<Arc<dyn DevEvent>> {
        let _bound = self.dev.bind()?;
        // SAFETY: this stream is live and of this device, bound above.
        Ok(Arc::new(unsafe {
            CudaEvent::record(&self.dev, self.stream.cu_stream())
        }?))
    }
    fn wait_event(&self, ev: &dyn DevEvent) -> Result<()> {
        let ev = ev.as_any().downcast_ref::<CudaEvent>().ok_or_else(|| {
            Error::InvalidArgument("an event of another device given to a CUDA stream".into())
        })?;
        let _bound = self.dev.bind()?;
        // SAFETY: FFI on this live stream and a live event.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(self.stream.cu_stream(), ev.ev, 0)
        })
    }
    fn clear(&self, addr: DevAddr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let _bound = self.dev.bind()?;
        // SAFETY: FFI memset on this live stream of a range the caller holds borrowed
        // (inside one allocation) until the stream is waited for.
        check("cuMemsetD8Async", unsafe {
            sys::cuMemsetD8Async(addr, 0, bytes, self.stream.cu_stream())
        })
    }
    fn begin_capture(&self) -> Result<()> {
        let _bound = self.dev.bind()?;
        // SAFETY: FFI on this live stream.
        check("cuStreamBeginCapture", unsafe {
            sys::cuStreamBeginCapture_v2(
                self.stream.cu_stream(),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            )
        })
    }
    fn end_capture(&self) -> Result<Arc<dyn DevGraph>> {
        let _bound = self.dev.bind()?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: FFI on this live stream, writing one graph handle.
        check("cuStreamEndCapture", unsafe {
            sys::cuStreamEndCapture(self.stream.cu_stream(), &mut graph)
        })?;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: FFI instantiating the graph captured above, writing one handle.
        let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if let Err(e) = check("cuGraphInstantiateWithFlags", r) {
            // SAFETY: destroying the graph captured above, once.
            let _ = unsafe { sys::cuGraphDestroy(graph) };
            return Err(e);
        }
        Ok(Arc::new(CudaGraph::new(
            self.dev.clone(),
            CudaGraphHandles { graph, exec },
        )))
    }
    unsafe fn wait_foreign(&self, other: *mut c_void) -> Result<()> {
        let _bound = self.dev.bind()?;
        let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(|e| dev_err("cuEventCreate", e))?;
        // SAFETY: FFI on a fresh event and the caller's live stream (its contract); the
        // event is destroyed after the wait is enqueued (the driver keeps it alive).
        let r = unsafe {
            result::event::record(ev, other as sys::CUstream).and_then(|_| {
                result::stream::wait_event(
                    self.stream.cu_stream(),
                    ev,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            })
        };
        // SAFETY: destroying the event we created.
        let _ = unsafe { result::event::destroy(ev) };
        r.map_err(|e| dev_err("waiting for the caller's stream", e))
    }
}

/// See [`CudaDevice::current_ordinal_of_thread`].
pub fn current_ordinal() -> Option<usize> {
    CudaDevice::current_ordinal_of_thread()
}

/// True when libcuda loads and initializes (no context is created or made current).
fn driver_ready() -> bool {
    // SAFETY: `is_culib_present` only dlopens cudarc's candidate names.
    let present = std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
    present
        && std::panic::catch_unwind(result::init)
            .map(|r| r.is_ok())
            .unwrap_or(false)
}

/// The shared-library names cudarc tries for the CUDA driver.
pub fn driver_candidates() -> Vec<String> {
    ["cuda", "nvcuda"]
        .iter()
        .flat_map(|l| cudarc::get_lib_name_candidates(l))
        .collect()
}

/// Open device `ordinal` (a primary context). `System` naming the libcuda candidates
/// tried when the driver library is missing; `Device` when the driver fails. Never panics.
pub fn open_device(ordinal: usize) -> Result<Arc<CudaContext>> {
    // SAFETY: `is_culib_present` only dlopens cudarc's candidate names and drops them.
    let present = std::panic::catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() })
        .unwrap_or(false);
    if !present {
        return Err(Error::System(format!(
            "libcuda (the NVIDIA driver) not found: tried {:?}; install the NVIDIA driver on a \
             machine with a GPU (without one, use a host transport: local, host-local or mpi)",
            driver_candidates()
        )));
    }
    // CudaContext::new makes the context current: the thread's previous one is made
    // current again (strata binds per call, never leaves a thread on its device).
    let open = || -> std::result::Result<Arc<CudaContext>, DriverError> {
        result::init()?;
        let prev = result::ctx::get_current()?;
        let made = CudaContext::new(ordinal);
        if let Ok(c) = &made {
            // SAFETY: strata makes no CudaSlice (it orders every use of device memory
            // across streams with its own events); without this, cudarc synchronizes the
            // whole context when it makes the context's first stream, so a first
            // collective would wait for all work already queued on the device.
            unsafe { c.disable_event_tracking() };
        }
        // SAFETY: FFI making current again the context current before (or none).
        let back = unsafe { result::ctx::set_current(prev.unwrap_or(std::ptr::null_mut())) };
        let made = made?;
        back?;
        Ok(made)
    };
    match std::panic::catch_unwind(open) {
        Ok(r) => r.map_err(|e| {
            Error::Device(format!(
                "opening CUDA device {ordinal}: {e:?} ({} CUDA devices visible here: \
                 CUDA_VISIBLE_DEVICES and STRATA_DEVICE pick one)",
                CudaDevice::count()
            ))
        }),
        Err(p) => Err(Error::System(format!(
            "the CUDA driver panicked: {}",
            crate::kernels_gpu::nvrtc::panic_text(&p)
        ))),
    }
}
