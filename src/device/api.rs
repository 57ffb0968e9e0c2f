//! The device interface every backend implements ([`Device`], [`DevStream`],
//! [`DevEvent`], [`DevGraph`]), the API names and the deadline-bounded waits on it.

use super::pool;
use super::waits;
use crate::error::{Error, Result};
use crate::kernels_gpu::launch::{DevAddr, Elementwise, QuantCall};
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The thread's current device before a [`Device::bind`], made current again when this
/// guard drops.
#[must_use = "dropping the guard at once restores the previous device"]
pub struct Bound(Option<Box<dyn FnOnce()>>);

impl Bound {
    /// A guard that restores with `restore` when dropped.
    pub fn restoring(restore: impl FnOnce() + 'static) -> Bound {
        Bound(Some(Box::new(restore)))
    }
    /// A guard with nothing to restore.
    pub fn none() -> Bound {
        Bound(None)
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f()
        }
    }
}

/// Which GPU runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    /// NVIDIA CUDA (driver API through cudarc).
    Cuda,
    /// AMD HIP (through hip-sys).
    Hip,
    /// The host CPU as a device ([`cpu`]): always built; the `host-local` transport.
    Cpu,
}

impl Api {
    /// `cuda` / `hip`.
    pub fn name(self) -> &'static str {
        match self {
            Api::Cuda => "cuda",
            Api::Hip => "hip",
            Api::Cpu => "cpu",
        }
    }
}

/// A GPU. Shared (`Arc<dyn Device>`) by every buffer and stream on it.
pub trait Device: Send + Sync + std::fmt::Debug {
    /// The runtime.
    fn api(&self) -> Api;
    /// Device ordinal within the process.
    fn ordinal(&self) -> usize;
    /// Make this device current on the calling thread (before vendor calls) until the
    /// returned guard drops, which makes the thread's previous device (context) current
    /// again: strata never leaves a caller's thread on another device.
    fn bind(&self) -> Result<Bound>;
    /// `bytes` zeroed bytes of device memory (a null address for 0 bytes).
    fn alloc_zeroed(&self, bytes: usize) -> Result<DevAddr>;
    /// Free memory from [`Device::alloc_zeroed`].
    ///
    /// # Safety
    /// `addr` came from `alloc_zeroed` on this device, is freed once, and no queued
    /// work uses it any more.
    unsafe fn free(&self, addr: DevAddr);
    /// Copy host bytes to device memory (synchronous).
    fn htod(&self, dst: DevAddr, src: &[u8]) -> Result<()>;
    /// Copy device memory to host bytes (synchronous).
    fn dtoh(&self, dst: &mut [u8], src: DevAddr) -> Result<()>;
    /// `Ok` when `len` bytes at `addr` are device memory of this device (checks foreign
    /// pointers at the C ABI), else a clear `InvalidArgument`.
    fn check_pointer(&self, addr: DevAddr, len: usize) -> Result<()>;
    /// A new stream on this device.
    fn new_stream(&self) -> Result<Arc<dyn DevStream>>;
    /// PCI bus id (`0000:c1:00.0`), for topology detection.
    fn pci_bus_id(&self) -> Result<String>;
    /// Device memory allocations made through this object so far: a collective repeated
    /// with the same shape must not raise it (steady state allocates nothing).
    fn allocations(&self) -> u64;
    /// Zero `bytes` at `addr` and return once done, without waiting for any stream (a
    /// private stream of the device): how a cached block is handed out again.
    fn zero(&self, addr: DevAddr, bytes: usize) -> Result<()>;
    /// `bytes` of new device memory allocated in the order of the runtime stream `raw`
    /// (`cuMemAllocAsync` on it), contents unspecified, with no host wait: usable by
    /// work enqueued on `raw` after this and on streams ordered after that work; freed by
    /// [`Device::free`], counted in [`Device::allocations`]. `Ok(None)` where the device
    /// cannot (no memory pools, `raw` being captured, HIP): the caller then allocates
    /// with [`Device::alloc_zeroed`], which waits for the device's private stream.
    ///
    /// # Safety
    /// As [`Device::record_on`].
    unsafe fn alloc_in_order(&self, raw: *mut c_void, bytes: usize) -> Result<Option<DevAddr>> {
        let _ = (raw, bytes);
        Ok(None)
    }
    /// The cache of freed blocks ([`pool`]).
    fn pool(&self) -> &pool::Pool;
    /// An event after the work enqueued so far on the runtime stream `raw` (a caller's
    /// `cudaStream_t` / `hipStream_t`, a [`DevStream::raw`] of the CPU device; null is
    /// the legacy default stream).
    ///
    /// # Safety
    /// `raw` is null or a live stream of this device.
    unsafe fn record_on(&self, raw: *mut c_void) -> Result<Arc<dyn DevEvent>>;
    /// True while the runtime stream `raw` is being captured into a graph
    /// (`cuStreamIsCapturing`): stream-ordered calls then take the capturable path
    /// ([`crate::comm::ordered`]).
    ///
    /// # Safety
    /// As [`Device::record_on`].
    unsafe fn is_capturing(&self, raw: *mut c_void) -> Result<bool>;
    /// Make the runtime stream `raw` wait (on the device) for `ev`, an event of this
    /// device (`cuStreamWaitEvent`; legal inside a capture: a join).
    ///
    /// # Safety
    /// As [`Device::record_on`].
    unsafe fn wait_event_on(&self, raw: *mut c_void, ev: &dyn DevEvent) -> Result<()>;
    /// The runtime stream `raw` (a caller's `cudaStream_t` / `hipStream_t`, a
    /// [`DevStream::raw`] of the CPU device; null: the legacy default stream) as a
    /// [`DevStream`] that borrows it: dropping it never destroys the stream. How a
    /// one-call collective enqueues on the caller's stream itself
    /// ([`crate::comm::ordered`], the fast path).
    ///
    /// # Safety
    /// `raw` is null or a live stream of this device, and stays alive while the
    /// returned value (or anything holding it) is used.
    unsafe fn borrow_stream(&self, raw: *mut c_void) -> Result<Arc<dyn DevStream>>;
}

/// A point in one stream's work: complete once everything enqueued on that stream before
/// it was recorded has run (a `CUevent`).
pub trait DevEvent: Send + Sync {
    /// True once complete; a device error is `Err`.
    fn query(&self) -> Result<bool>;
    /// The concrete event, for [`DevStream::wait_event`] on its device.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Wait on the host until `ev` completes: past `timeout` an [`Error::Remote`] naming
/// `what`.
pub fn wait_event(ev: &dyn DevEvent, timeout: Duration, what: &str) -> Result<()> {
    waits::host_wait(what)?;
    let start = Instant::now();
    let mut spins = 0u32;
    while !ev.query()? {
        if start.elapsed() >= timeout {
            return Err(Error::Remote(format!(
                "{what}: not complete within {timeout:?}"
            )));
        }
        spins += 1;
        if spins < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(if spins < 1024 { 20 } else { 200 }));
        }
    }
    Ok(())
}

/// An ordered queue of device work. Methods enqueue and return (except [`finish`]).
pub trait DevStream: Send + Sync {
    /// The device.
    fn device(&self) -> Arc<dyn Device>;
    /// The runtime's handle (`CUstream` / `hipStream_t`), for vendor calls.
    fn raw(&self) -> *mut c_void;
    /// Copy `bytes` device bytes (regions may be on any device of the process).
    fn copy(&self, dst: DevAddr, src: DevAddr, bytes: usize) -> Result<()>;
    /// One element-wise kernel: a reduction (`Avg` sums) or the `Avg` division.
    fn elementwise(&self, e: Elementwise) -> Result<()>;
    /// One quantization kernel.
    fn quant(&self, call: &QuantCall) -> Result<()>;
    /// True when everything enqueued so far has completed; a device error is `Err`.
    fn query(&self) -> Result<bool>;
    /// Make this stream wait (on the device) for the work enqueued so far on the
    /// runtime stream `other` (a `cudaStream_t` / `hipStream_t`; null is the legacy
    /// default stream).
    ///
    /// # Safety
    /// `other` is null or a live stream of this device's context.
    unsafe fn wait_foreign(&self, other: *mut c_void) -> Result<()>;
    /// Occupy the stream for `d`: work enqueued after it starts no earlier than `d`
    /// later. On CUDA a one-thread kernel that waits on the device's global timer (the
    /// host callbacks of a context all run on one driver thread, so eight in-process
    /// ranks' sleeping callbacks would queue behind each other); a host callback that
    /// sleeps on HIP; a sleep on the CPU device. For tests of ordering and overlap.
    fn delay(&self, d: Duration) -> Result<()>;
    /// An event after the work enqueued on this stream so far.
    fn record(&self) -> Result<Arc<dyn DevEvent>>;
    /// Make this stream wait (on the device) for `ev`, an event of the same device.
    fn wait_event(&self, ev: &dyn DevEvent) -> Result<()>;
    /// True while this stream is being captured into a graph.
    fn is_capturing(&self) -> Result<bool> {
        // SAFETY: `raw` is this live stream's handle, of `device()`.
        unsafe { self.device().is_capturing(self.raw()) }
    }
    /// Zero `bytes` at `addr` in stream order (`cuMemsetD8Async`).
    fn clear(&self, addr: DevAddr, bytes: usize) -> Result<()>;
    /// [`Device::alloc_in_order`] on this stream.
    fn alloc_in_order(&self, bytes: usize) -> Result<Option<DevAddr>> {
        // SAFETY: `raw` is this live stream's handle, of `device()`.
        unsafe { self.device().alloc_in_order(self.raw(), bytes) }
    }
    /// Start capturing this stream into a graph (`cuStreamBeginCapture`, global mode):
    /// work enqueued on it, and on every stream that joins it by waiting for an event
    /// recorded on it, is recorded instead of run; allocations, synchronous copies and
    /// stream queries anywhere on the device fail until the capture ends.
    fn begin_capture(&self) -> Result<()>;
    /// End the capture begun on this stream: the graph, instantiated (every stream that
    /// joined must have been joined back, else an error).
    fn end_capture(&self) -> Result<Arc<dyn DevGraph>>;
}

/// A captured, instantiated graph (`CUgraphExec`): replays the recorded work.
pub trait DevGraph: Send + Sync {
    /// Enqueue one replay of the graph on `stream` (a stream of the same device).
    fn launch(&self, stream: &dyn DevStream) -> Result<()>;
}

/// Wait until `stream` has run everything enqueued, polling `probe` (e.g. a vendor
/// communicator's asynchronous error) between queries. Past `timeout` the result is
/// [`Error::Remote`] naming `what`: a peer that died or never arrived.
pub fn finish(
    stream: &dyn DevStream,
    timeout: Duration,
    what: &str,
    mut probe: impl FnMut() -> Result<()>,
) -> Result<()> {
    waits::host_wait(what)?;
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        if stream.query()? {
            return Ok(());
        }
        probe()?;
        if start.elapsed() >= timeout {
            return Err(Error::Remote(format!(
                "{what}: the device work did not complete within {timeout:?} (a peer died or \
                 never joined)"
            )));
        }
        spins += 1;
        if spins < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(if spins < 1024 { 20 } else { 200 }));
        }
    }
}

/// Give `dev`'s cached blocks back to the runtime (as `torch.cuda.empty_cache()`); this
/// synchronizes the device. Blocks in use are unaffected.
pub fn release_cached(dev: &dyn Device) {
    for a in dev.pool().drain() {
        // SAFETY: cached blocks came from `alloc_zeroed` on this device, are owned by the
        // cache alone (drained just now) and their work has run.
        unsafe { dev.free(a) };
    }
}
