//! The CPU device: the device layer implemented on the host, as candle has a CPU device,
//! so every stream-ordered path of strata (the `host-local` transport, the device paths
//! of every algorithm, the quantization kernels behind [`QuantCall`]) runs in CI with
//! the same code and test bodies as on a GPU.
//!
//! - **Memory** is host memory allocated 256-byte aligned; a device address is its
//!   pointer. The device keeps the table of live allocations: an operation that touches
//!   bytes outside live device memory fails with a device error (as an illegal address
//!   on a GPU), it never reads freed memory. [`alloc_mapped`] makes memory of several
//!   mappings, as PyTorch's `expandable_segments` allocator maps one virtual range in
//!   pieces (`cuMemCreate` / `cuMemMap`): one host allocation recorded as adjacent
//!   mappings, freed whole by [`free_mapped`]. A range is device memory when adjacent
//!   live mappings of one allocation cover it ([`Device::check_pointer`], the bounds
//!   check of every operation and the race check alike).
//! - **Streams** are worker threads, one per stream, running their operations in
//!   enqueue order. Enqueueing returns at once ([`DevStream`] semantics); a failed
//!   operation makes the stream's error sticky (later operations are skipped, queries
//!   report it), as a CUDA stream after a kernel fault.
//! - **Kernels** are the CPU reference of [`crate::kernels`] and [`crate::dtype`], after
//!   the same argument checks as the GPU launches ([`crate::kernels_gpu::call`]), so
//!   results are bitwise those the GPU kernels are tested against.
//! - **Ordering rules are CUDA's, with strata's streams non-blocking**: two streams are
//!   ordered only by explicit waits ([`DevStream::wait_foreign`], events);
//!   `htod`/`dtoh` wait for no stream (as strata's CUDA device, which copies on a
//!   private stream), `free` synchronizes the whole device first (as `cuMemFree`,
//!   which is why strata caches freed blocks, [`super::pool`]). A missing wait is
//!   caught by the **race check**: every operation registers the byte ranges it reads
//!   and writes while it runs, and an operation that would write bytes another stream is
//!   reading or writing at that moment (or read bytes it is writing) fails with a device
//!   error naming both, instead of racing. The check finds races that overlap in time
//!   and never reports ordered accesses.
//! - **Host waits are accounted**: every call that blocks the calling thread until
//!   device work has run (the synchronous `htod` / `dtoh` / `zero`, which on a GPU wait
//!   for the private stream; `free` and [`free_mapped`], which synchronize the device)
//!   first goes through [`super::waits::host_wait`], so a host wait inside a
//!   stream-ordered call is counted, and refused when strict. Enqueueing, recording and
//!   querying are not waits.
//! - **The current device is per thread**, as CUDA's: none at thread start;
//!   [`Device::bind`] makes a device current until its guard drops, which restores the
//!   previous one; [`set_current_device`] is what a user's `cudaSetDevice` is, and
//!   [`current_device`] lets a test check that a call left it as it was.
//! - [`CpuDevice::allocations`] counts allocations, so a test can prove a repeated
//!   collective allocates nothing in steady state.
//!
//! The files, leaves first: [`memory`] (the table of live mappings), [`races`] (the
//! race check and the only views of device memory), [`capture`] (the graph a capture
//! records), [`lanes`] (stream workers and events), [`kernels`] (what each operation
//! does), [`device`] (the device's state and its synchronizing calls), [`stream`] (the
//! strata stream over a lane); this file, the [`Device`] itself, on top.

mod capture;
mod device;
mod kernels;
mod lanes;
mod memory;
mod races;
mod stream;
#[cfg(test)]
mod tests;

pub use device::CpuDevice;
pub use lanes::CpuEvent;
pub use stream::{entries, CpuGraph, CpuStream};

use super::pool::Pool;
use super::{waits, Api, Bound, DevAddr, DevEvent, DevStream, Device, Region};
use crate::error::{Error, Result};
use lanes::cpu_event;
use memory::Cover;
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::Arc;

thread_local! {
    /// The calling thread's current CPU device (CUDA's current device): none at start.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The calling thread's current CPU device (`cudaGetDevice`; `None` until one is made
/// current).
pub fn current_device() -> Option<usize> {
    CURRENT.with(Cell::get)
}

/// Make `ordinal` the calling thread's current CPU device (`cudaSetDevice`; `None`
/// clears it): what a user's code does before calling strata, for tests that check a
/// call leaves it as it was.
pub fn set_current_device(ordinal: Option<usize>) {
    CURRENT.with(|c| c.set(ordinal))
}

/// Allocate zeroed memory of several mappings on CPU device `ordinal`, as PyTorch's
/// `expandable_segments` allocator maps one virtual range in pieces: one contiguous
/// range (aligned as every allocation), recorded as `pieces.len()` adjacent mappings
/// of `pieces[i]` bytes each. A range spanning adjacent mappings is device memory for
/// [`Device::check_pointer`] and every operation. Free it with [`free_mapped`] (not
/// [`Device::free`], which refuses it as `cuMemFree` refuses mapped memory).
pub fn alloc_mapped(ordinal: usize, pieces: &[usize]) -> Result<DevAddr> {
    CpuDevice::open(ordinal)?.alloc_mapped(pieces)
}

/// Free memory from [`alloc_mapped`] (all its mappings) on CPU device `ordinal`,
/// after synchronizing the device (as PyTorch does before unmapping): an error, the
/// memory kept, when the wait fails or an operation still touches it. The caller must
/// not use the range afterwards; the bounds check reports it if it does.
pub fn free_mapped(ordinal: usize, addr: DevAddr) -> Result<()> {
    CpuDevice::open(ordinal)?.free_mapped(addr)
}

impl Device for CpuDevice {
    fn api(&self) -> Api {
        Api::Cpu
    }
    fn ordinal(&self) -> usize {
        self.ordinal
    }
    fn bind(&self) -> Result<Bound> {
        let prev = CURRENT.with(|c| c.replace(Some(self.ordinal)));
        Ok(Bound::restoring(move || set_current_device(prev)))
    }
    fn alloc_zeroed(&self, bytes: usize) -> Result<DevAddr> {
        if bytes == 0 {
            return Ok(0);
        }
        // As the CUDA device, which zeroes a new block on its private stream and waits
        // for it: a host wait (refused inside a launch when strict).
        waits::host_wait("cpu device: a new allocation, zeroed on the private stream")?;
        let p = self.alloc_host(bytes)?;
        self.mem.lock()?.table.live.insert(p, bytes);
        Ok(p)
    }
    unsafe fn free(&self, addr: DevAddr) {
        if addr == 0 {
            return;
        }
        // As cuMemFree, which refuses what is not an allocation of cuMemAlloc (memory of
        // `alloc_mapped` included) before waiting for anything: nothing happens.
        match self.mem.lock() {
            Ok(s) if s.table.mapped_range(addr).is_none() && s.table.live.contains_key(&addr) => {}
            _ => return,
        }
        // As cuMemFree: the device's queued work finishes first (a host wait; refused
        // inside a strict launch, which keeps the bytes as a stream that never drained).
        let synced = self.synchronize("freeing memory").is_ok();
        let Ok(mut s) = self.mem.lock() else { return };
        let in_use = s.table.live.get(&addr).is_some_and(|&l| s.in_use(addr, l));
        if !synced || in_use {
            // Some stream never drained, or an operation enqueued since (or a host copy
            // on another thread) is touching the bytes: keep them.
            s.leaked.push(addr);
            return;
        }
        if let Some(len) = s.table.take_plain(addr) {
            drop(s);
            memory::dealloc(addr, len);
        }
    }
    fn htod(&self, dst: DevAddr, src: &[u8]) -> Result<()> {
        // A host wait (on a GPU, for the private stream the copy runs on).
        waits::host_wait("cpu device: a synchronous copy to the device (htod)")?;
        // Like strata's CUDA device (a private stream, waited for alone): no other
        // stream is waited for; the race check catches a stream still using the range.
        self.unsafe_call("a synchronous copy to the device")?;
        let r = Region {
            addr: dst,
            len: src.len(),
        };
        self.mem.run_op(0, &[], &[r], |_, w| {
            w[0].copy_from_slice(src);
            Ok(())
        })
    }
    fn dtoh(&self, dst: &mut [u8], src: DevAddr) -> Result<()> {
        waits::host_wait("cpu device: a synchronous copy from the device (dtoh)")?;
        self.unsafe_call("a synchronous copy from the device")?;
        let r = Region {
            addr: src,
            len: dst.len(),
        };
        self.mem.run_op(0, &[r], &[], |rd, _| {
            dst.copy_from_slice(rd[0]);
            Ok(())
        })
    }
    fn check_pointer(&self, addr: DevAddr, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let s = self.mem.lock()?;
        match s.table.cover(addr, len) {
            Cover::Inside => Ok(()),
            Cover::PastEnd { a, l } if s.table.mapped_range(a).is_some() => {
                Err(Error::InvalidArgument(format!(
                    "{len} bytes at {addr:#x} run past the end of the adjacent mappings they \
                     start in (the last, {l} bytes at {a:#x})"
                )))
            }
            Cover::PastEnd { a, l } => Err(Error::InvalidArgument(format!(
                "{len} bytes at {addr:#x} run past the end of their allocation ({l} bytes at {a:#x})"
            ))),
            Cover::Outside => Err(Error::InvalidArgument(format!(
                "{addr:#x} is not memory of cpu device {} (the host-local transport takes \
                 addresses from the communicator's device allocations)",
                self.ordinal
            ))),
        }
    }
    fn new_stream(&self) -> Result<Arc<dyn DevStream>> {
        Ok(Arc::new(CpuStream {
            dev: self.arc()?,
            lane: self.new_lane()?,
            owned: true,
        }))
    }
    fn pci_bus_id(&self) -> Result<String> {
        Ok(format!("cpu:{}", self.ordinal))
    }
    fn allocations(&self) -> u64 {
        CpuDevice::allocations(self)
    }
    unsafe fn alloc_in_order(&self, raw: *mut c_void, bytes: usize) -> Result<Option<DevAddr>> {
        // As the CUDA device's cuMemAllocAsync on `raw`: no host wait. None while a
        // stream of the device is being captured (where this device refuses
        // allocations), so the caller's fallback behaves as before.
        let _ = raw;
        if bytes == 0 || !self.state()?.captures.is_empty() {
            return Ok(None);
        }
        let p = self.alloc_host(bytes)?;
        self.mem.lock()?.table.live.insert(p, bytes);
        Ok(Some(p))
    }
    fn zero(&self, addr: DevAddr, bytes: usize) -> Result<()> {
        waits::host_wait("cpu device: zeroing on the private stream (a synchronous memset)")?;
        self.unsafe_call("zeroing on the private stream (a synchronous memset)")?;
        let r = Region { addr, len: bytes };
        self.mem.run_op(0, &[], &[r], |_, w| {
            w[0].fill(0);
            Ok(())
        })
    }
    fn pool(&self) -> &Pool {
        &self.pool
    }
    unsafe fn record_on(&self, raw: *mut c_void) -> Result<Arc<dyn DevEvent>> {
        Ok(Arc::new(self.lane_of(raw)?.record()?))
    }
    unsafe fn is_capturing(&self, raw: *mut c_void) -> Result<bool> {
        Ok(self.lane_of(raw)?.lock()?.capture.is_some())
    }
    unsafe fn wait_event_on(&self, raw: *mut c_void, ev: &dyn DevEvent) -> Result<()> {
        self.lane_of(raw)?.wait_event(cpu_event(ev)?)
    }
    unsafe fn borrow_stream(&self, raw: *mut c_void) -> Result<Arc<dyn DevStream>> {
        Ok(Arc::new(CpuStream {
            dev: self.arc()?,
            lane: self.lane_of(raw)?,
            owned: false,
        }))
    }
}
