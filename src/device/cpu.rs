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

use super::pool::Pool;
use super::{waits, Api, Bound, DevAddr, DevEvent, DevStream, Device, QuantCall, Region};
use crate::dtype::{finish_avg, reduce_into, DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::kernels;
use std::alloc::Layout;
use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Alignment of every allocation (as `cudaMalloc`'s 256 bytes).
const ALIGN: usize = 256;
/// How long `htod`/`dtoh`/`free` wait for the device's streams before giving up.
const SYNC_LIMIT: Duration = Duration::from_secs(60);

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

/// One host CPU as a strata device. Process-wide per ordinal ([`CpuDevice::open`]).
#[derive(Debug)]
pub struct CpuDevice {
    ordinal: usize,
    me: Weak<CpuDevice>,
    state: Mutex<State>,
    allocations: AtomicU64,
    next_id: AtomicU64,
    pool: Pool,
    /// The legacy default stream (a null `raw`), made on first use.
    legacy: OnceLock<Arc<Lane>>,
}

#[derive(Debug, Default)]
struct State {
    /// Live mappings: start -> length. An allocation of [`CpuDevice::alloc_zeroed`] is
    /// one mapping; one of [`alloc_mapped`] several adjacent ones (listed in `mapped`).
    live: BTreeMap<u64, usize>,
    /// Host allocations of several mappings: start -> total length (its layout).
    mapped: BTreeMap<u64, usize>,
    /// Accesses of the operations running now (the race check).
    running: Vec<Access>,
    /// Every stream made on this device (for `wait_foreign` lookups and device syncs).
    lanes: Vec<Weak<Lane>>,
    /// Frees whose streams did not drain in time (released when the device is dropped).
    leaked: Vec<u64>,
    /// Captures in progress (global mode: they forbid synchronizing calls device-wide).
    captures: Vec<Arc<Capture>>,
}

/// A stream capture in progress ([`DevStream::begin_capture`]): the recorded operations
/// and their dependencies, the streams that joined it.
struct Capture {
    origin: u64,
    g: Mutex<CapGraph>,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Capture(origin {})", self.origin)
    }
}

#[derive(Default)]
struct CapGraph {
    nodes: Vec<Node>,
    /// Why the capture is invalid (as a CUDA capture invalidated by an illegal call).
    failed: Option<Error>,
    joined: Vec<Arc<Lane>>,
}

/// One recorded operation and the nodes it runs after.
#[derive(Clone)]
struct Node {
    task: Task,
    deps: Vec<usize>,
}

impl Capture {
    fn lock(&self) -> Result<MutexGuard<'_, CapGraph>> {
        self.g
            .lock()
            .map_err(|_| Error::Internal("cpu capture poisoned".into()))
    }

    /// Invalidate the capture with `msg` (the first reason sticks); the error to return.
    fn fail(&self, msg: String) -> Error {
        let e = dev_err(msg);
        if let Ok(mut g) = self.lock() {
            g.failed.get_or_insert(e.clone());
        }
        e
    }

    fn add(&self, task: Task, deps: Vec<usize>) -> Result<usize> {
        let mut g = self.lock()?;
        g.nodes.push(Node { task, deps });
        Ok(g.nodes.len() - 1)
    }
}

#[derive(Debug, Clone, Copy)]
struct Access {
    lane: u64,
    region: Region,
    write: bool,
    token: u64,
}

/// Where a range lies in the live mappings.
enum Cover {
    /// Inside live mappings of one host allocation.
    Inside,
    /// It starts in live memory and runs past the end of the mapping `l` bytes at `a`
    /// (the last of the adjacent ones it covers).
    PastEnd { a: u64, l: usize },
    /// It does not start in live memory.
    Outside,
}

impl State {
    /// The multi-mapping allocation `addr` lies in: (start, total length).
    fn mapped_range(&self, addr: u64) -> Option<(u64, usize)> {
        self.mapped
            .range(..=addr)
            .next_back()
            .filter(|(&b, &t)| addr < b + t as u64)
            .map(|(&b, &t)| (b, t))
    }

    /// Whether `len > 0` bytes at `addr` lie in live mappings: the mapping holding
    /// `addr`, then each live mapping starting where the previous one ends, within one
    /// host allocation (so a region is always inside one allocated object).
    fn cover(&self, addr: u64, len: usize) -> Cover {
        let Some((mut a, mut l)) = self
            .live
            .range(..=addr)
            .next_back()
            .filter(|(&a, &l)| addr < a + l as u64)
            .map(|(&a, &l)| (a, l))
        else {
            return Cover::Outside;
        };
        let limit = match self.mapped_range(a) {
            Some((b, t)) => b + t as u64,
            None => a + l as u64,
        };
        let end = addr.saturating_add(len as u64);
        loop {
            let next = a + l as u64;
            if end <= next {
                return Cover::Inside;
            }
            match self.live.get(&next) {
                Some(&nl) if next < limit => (a, l) = (next, nl),
                _ => return Cover::PastEnd { a, l },
            }
        }
    }

    /// Take the allocation of [`CpuDevice::alloc_zeroed`] at `addr` out of the table:
    /// its length, or `None` when `addr` is no such allocation (a mapping of
    /// [`alloc_mapped`] included, which only [`free_mapped`] frees).
    fn take_plain(&mut self, addr: u64) -> Option<usize> {
        if self.mapped_range(addr).is_some() {
            return None;
        }
        self.live.remove(&addr)
    }

    /// True while a running operation touches bytes in `len` bytes at `addr`.
    fn in_use(&self, addr: u64, len: usize) -> bool {
        self.running
            .iter()
            .any(|a| overlap(a.region, Region { addr, len }))
    }

    /// Take the allocation of [`alloc_mapped`] at `addr` (all its mappings) out of the
    /// table: its total length, or `None` when `addr` is no such allocation.
    fn take_mapped(&mut self, addr: u64) -> Option<usize> {
        let total = self.mapped.remove(&addr)?;
        let keys: Vec<u64> = self
            .live
            .range(addr..addr + total as u64)
            .map(|(&k, _)| k)
            .collect();
        for k in keys {
            self.live.remove(&k);
        }
        Some(total)
    }

    /// Take any allocation starting at `addr` out of the table (the device's drop).
    fn take_any(&mut self, addr: u64) -> Option<usize> {
        self.take_mapped(addr).or_else(|| self.take_plain(addr))
    }
}

fn overlap(a: Region, b: Region) -> bool {
    a.len > 0 && b.len > 0 && a.addr < b.addr + b.len as u64 && b.addr < a.addr + a.len as u64
}

fn dev_err(m: impl std::fmt::Display) -> Error {
    Error::Device(format!("cpu device: {m}"))
}

impl CpuDevice {
    /// The CPU device `ordinal` of this process (made on first use, then shared, so
    /// pointers from one open are valid on the next).
    pub fn open(ordinal: usize) -> Result<Arc<CpuDevice>> {
        static DEVICES: OnceLock<Mutex<Vec<Arc<CpuDevice>>>> = OnceLock::new();
        let mut all = DEVICES
            .get_or_init(Default::default)
            .lock()
            .map_err(|_| Error::Internal("cpu device table poisoned".into()))?;
        if let Some(d) = all.iter().find(|d| d.ordinal == ordinal) {
            return Ok(d.clone());
        }
        let d = Arc::new_cyclic(|me| CpuDevice {
            ordinal,
            me: me.clone(),
            state: Mutex::new(State::default()),
            allocations: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            pool: Pool::default(),
            legacy: OnceLock::new(),
        });
        all.push(d.clone());
        Ok(d)
    }

    fn arc(&self) -> Result<Arc<CpuDevice>> {
        self.me
            .upgrade()
            .ok_or_else(|| Error::Internal("cpu device dropped".into()))
    }

    fn state(&self) -> Result<MutexGuard<'_, State>> {
        self.state
            .lock()
            .map_err(|_| Error::Internal("cpu device state poisoned".into()))
    }

    /// Device memory allocations made so far (every `alloc_zeroed` of a non-empty
    /// range).
    pub fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::Relaxed)
    }

    /// Bytes of device memory live now.
    pub fn live_bytes(&self) -> usize {
        self.state().map(|s| s.live.values().sum()).unwrap_or(0)
    }

    /// Register the accesses of one operation of `lane`: every region inside live device
    /// memory (one allocation, or adjacent mappings of one), and no conflict with what other streams are doing now. The returned
    /// token releases them ([`CpuDevice::release`]).
    fn acquire(&self, lane: u64, reads: &[Region], writes: &[Region]) -> Result<u64> {
        let mut s = self.state()?;
        for (r, w) in reads
            .iter()
            .map(|r| (r, false))
            .chain(writes.iter().map(|r| (r, true)))
        {
            if r.len == 0 {
                continue;
            }
            if !matches!(s.cover(r.addr, r.len), Cover::Inside) {
                return Err(dev_err(format!(
                    "illegal address: {} {} bytes at {:#x} are not inside live device memory \
                     (one live allocation, or adjacent live mappings of one)",
                    if w { "writing" } else { "reading" },
                    r.len,
                    r.addr
                )));
            }
            if let Some(o) = s
                .running
                .iter()
                .find(|o| o.lane != lane && (w || o.write) && overlap(o.region, *r))
            {
                return Err(dev_err(format!(
                    "race between streams: {} {} bytes at {:#x} while {} {} {} bytes at {:#x} \
                     (two streams touch the same memory without a wait between them)",
                    if w { "writing" } else { "reading" },
                    r.len,
                    r.addr,
                    lane_name(o.lane),
                    if o.write { "writes" } else { "reads" },
                    o.region.len,
                    o.region.addr
                )));
            }
        }
        let token = self.next_id.fetch_add(1, Ordering::Relaxed);
        for (r, w) in reads
            .iter()
            .map(|r| (*r, false))
            .chain(writes.iter().map(|r| (*r, true)))
        {
            s.running.push(Access {
                lane,
                region: r,
                write: w,
                token,
            });
        }
        Ok(token)
    }

    fn release(&self, token: u64) {
        if let Ok(mut s) = self.state() {
            s.running.retain(|a| a.token != token);
        }
    }

    /// Run `f` with the accesses registered (reads, writes).
    fn with_access<T>(
        &self,
        lane: u64,
        reads: &[Region],
        writes: &[Region],
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let t = self.acquire(lane, reads, writes)?;
        let r = f();
        self.release(t);
        r
    }

    /// A call that synchronizes with the device (allocation, free, synchronous copies):
    /// refused while a capture is in progress, which it invalidates (CUDA's global
    /// capture mode), so code that allocates or waits inside a capture fails its tests.
    fn unsafe_call(&self, what: &str) -> Result<()> {
        let caps = self.state()?.captures.clone();
        match caps.first() {
            None => Ok(()),
            Some(_) => {
                let msg = format!(
                    "{what} is not permitted while a stream is being captured (global capture \
                     mode; the capture is invalidated)"
                );
                caps.iter().for_each(|c| {
                    c.fail(msg.clone());
                });
                Err(dev_err(msg))
            }
        }
    }

    /// Wait until every stream of this device has run what was enqueued on it before
    /// this call (`cuCtxSynchronize`): a host wait for the device.
    fn synchronize(&self, what: &str) -> Result<()> {
        waits::host_wait(&format!("cpu device: {what} (synchronizes the device)"))?;
        self.unsafe_call(what)?;
        let lanes: Vec<(Arc<Lane>, u64)> = self
            .state()?
            .lanes
            .iter()
            .filter_map(Weak::upgrade)
            .map(|l| {
                let e = l.lock().map(|q| q.enqueued).unwrap_or(0);
                (l, e)
            })
            .collect();
        let deadline = Instant::now() + SYNC_LIMIT;
        for (l, seq) in lanes {
            if !l.wait_done(seq, deadline)? {
                return Err(Error::Remote(format!(
                    "cpu device: {what} waited {SYNC_LIMIT:?} for stream {} (its work never \
                     completed)",
                    l.id
                )));
            }
        }
        Ok(())
    }

    /// `bytes > 0` zeroed bytes of host memory, aligned as every allocation, counted;
    /// the caller records them in the live table.
    fn host_alloc(&self, bytes: usize) -> Result<u64> {
        self.unsafe_call("allocating device memory")?;
        let layout = Layout::from_size_align(bytes, ALIGN)
            .map_err(|e| Error::InvalidArgument(format!("cpu device: {bytes} bytes: {e}")))?;
        // SAFETY: a non-zero size with a valid layout.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(dev_err(format!("out of memory allocating {bytes} bytes")));
        }
        self.allocations.fetch_add(1, Ordering::Relaxed);
        Ok(p as usize as u64)
    }

    /// [`alloc_mapped`] on this device.
    pub fn alloc_mapped(&self, pieces: &[usize]) -> Result<DevAddr> {
        if pieces.is_empty() || pieces.contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "cpu device: mapped memory needs one or more non-empty mappings (got {pieces:?})"
            )));
        }
        let total = pieces
            .iter()
            .try_fold(0usize, |t, &p| t.checked_add(p))
            .ok_or_else(|| Error::InvalidArgument("cpu device: mappings too large".into()))?;
        let base = self.host_alloc(total)?;
        let mut s = self.state()?;
        let mut at = base;
        for &p in pieces {
            s.live.insert(at, p);
            at += p as u64;
        }
        s.mapped.insert(base, total);
        Ok(base)
    }

    /// [`free_mapped`] on this device. On an error the memory stays allocated.
    pub fn free_mapped(&self, addr: DevAddr) -> Result<()> {
        if !self.state()?.mapped.contains_key(&addr) {
            return Err(Error::InvalidArgument(format!(
                "{addr:#x} is not memory of several mappings on cpu device {} (from \
                 alloc_mapped)",
                self.ordinal
            )));
        }
        // As PyTorch before unmapping: the device's queued work finishes first.
        self.synchronize("freeing mapped memory")?;
        let mut s = self.state()?;
        let total = s.mapped.get(&addr).copied().unwrap_or(0);
        if s.in_use(addr, total) {
            // Sound from safe code: nothing running keeps slices over freed bytes, and
            // once out of the table no operation can register them again.
            return Err(Error::InvalidUsage(format!(
                "free_mapped: {total} bytes at {addr:#x} are in use by a running operation"
            )));
        }
        if let Some(total) = s.take_mapped(addr) {
            drop(s);
            dealloc(addr, total);
        }
        Ok(())
    }

    fn new_lane(&self) -> Result<Arc<Lane>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let lane = Arc::new(Lane {
            id,
            q: Mutex::new(LaneQ::default()),
            cv: Condvar::new(),
            work: Condvar::new(),
        });
        let mut s = self.state()?;
        s.lanes.retain(|w| w.strong_count() > 0);
        s.lanes.push(Arc::downgrade(&lane));
        drop(s);
        let dev = self.arc()?;
        let worker = lane.clone();
        std::thread::Builder::new()
            .name(format!("strata-cpu-stream-{id}"))
            .spawn(move || worker.run(&dev))
            .map_err(|e| Error::System(format!("cpu device: spawning a stream thread: {e}")))?;
        Ok(lane)
    }

    /// The stream behind a runtime handle: null is the legacy default stream, anything
    /// else must be a live stream of this device (looked up, never dereferenced).
    fn lane_of(&self, raw: *mut c_void) -> Result<Arc<Lane>> {
        if raw.is_null() {
            if let Some(l) = self.legacy.get() {
                return Ok(l.clone());
            }
            let l = self.new_lane()?;
            return Ok(self.legacy.get_or_init(|| l).clone());
        }
        self.state()?
            .lanes
            .iter()
            .filter_map(Weak::upgrade)
            .find(|l| Arc::as_ptr(l) as *mut c_void == raw)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{raw:p} is not a live stream of cpu device {}",
                    self.ordinal
                ))
            })
    }

    /// Slices over device memory for one operation.
    ///
    /// # Safety
    /// The regions were registered by [`CpuDevice::acquire`] (each inside live memory of
    /// one host allocation, [`State::cover`]; no conflicting access by another stream)
    /// and stay registered while the slices live (nothing registered is freed); `writes` do not overlap each other or `reads` (callers copy reads that do).
    unsafe fn slices<'a>(
        reads: &[Region],
        writes: &[Region],
    ) -> (Vec<&'a [u8]>, Vec<&'a mut [u8]>) {
        let r = reads
            .iter()
            .map(|r| {
                if r.len == 0 {
                    &[][..]
                } else {
                    // SAFETY: the caller's contract: a registered live range nobody writes.
                    unsafe { std::slice::from_raw_parts(r.addr as usize as *const u8, r.len) }
                }
            })
            .collect();
        let w = writes
            .iter()
            .map(|r| {
                if r.len == 0 {
                    &mut [][..]
                } else {
                    // SAFETY: the caller's contract: a registered live range only this
                    // operation touches.
                    unsafe { std::slice::from_raw_parts_mut(r.addr as usize as *mut u8, r.len) }
                }
            })
            .collect();
        (r, w)
    }

    /// Run one memory operation: register, copy reads that alias a write, hand slices to
    /// `f`.
    fn run_op(
        &self,
        lane: u64,
        reads: &[Region],
        writes: &[Region],
        f: impl FnOnce(&[&[u8]], &mut [&mut [u8]]) -> Result<()>,
    ) -> Result<()> {
        for (i, a) in writes.iter().enumerate() {
            if writes[i + 1..].iter().any(|b| overlap(*a, *b)) {
                return Err(dev_err(format!(
                    "an operation writes {} bytes at {:#x} twice (overlapping outputs)",
                    a.len, a.addr
                )));
            }
        }
        self.with_access(lane, reads, writes, || {
            let aliased = reads.iter().any(|r| writes.iter().any(|w| overlap(*r, *w)));
            if aliased {
                // SAFETY: registered until `with_access` returns; the read views are
                // copied out and dropped before any write view exists.
                let owned: Vec<Vec<u8>> = unsafe { Self::slices(reads, &[]) }
                    .0
                    .iter()
                    .map(|s| s.to_vec())
                    .collect();
                let views: Vec<&[u8]> = owned.iter().map(|v| &v[..]).collect();
                // SAFETY: registered; writes are disjoint (checked above).
                let (_, mut ws) = unsafe { Self::slices(&[], writes) };
                f(&views, &mut ws)
            } else {
                // SAFETY: registered; writes are disjoint from each other and the reads.
                let (views, mut ws) = unsafe { Self::slices(reads, writes) };
                f(&views, &mut ws)
            }
        })
    }
}

impl Drop for CpuDevice {
    fn drop(&mut self) {
        let cached = self.pool.drain();
        if let Ok(s) = self.state.get_mut() {
            for a in std::mem::take(&mut s.leaked).into_iter().chain(cached) {
                if let Some(len) = s.take_any(a) {
                    dealloc(a, len);
                }
            }
        }
    }
}

fn lane_name(id: u64) -> String {
    if id == 0 {
        "the host".into()
    } else {
        format!("stream {id}")
    }
}

fn dealloc(addr: u64, len: usize) {
    if let Ok(l) = Layout::from_size_align(len, ALIGN) {
        // SAFETY: `addr` came from `CpuDevice::host_alloc` with this layout (`len` is the
        // whole allocation's length, all mappings of a mapped one) and is freed once
        // (taken out of the live table by the caller).
        unsafe { std::alloc::dealloc(addr as usize as *mut u8, l) };
    }
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
        let p = self.host_alloc(bytes)?;
        self.state()?.live.insert(p, bytes);
        Ok(p)
    }
    unsafe fn free(&self, addr: DevAddr) {
        if addr == 0 {
            return;
        }
        // As cuMemFree, which refuses what is not an allocation of cuMemAlloc (memory of
        // `alloc_mapped` included) before waiting for anything: nothing happens.
        match self.state() {
            Ok(s) if s.mapped_range(addr).is_none() && s.live.contains_key(&addr) => {}
            _ => return,
        }
        // As cuMemFree: the device's queued work finishes first (a host wait; refused
        // inside a strict launch, which keeps the bytes as a stream that never drained).
        let synced = self.synchronize("freeing memory").is_ok();
        let Ok(mut s) = self.state() else { return };
        let in_use = s.live.get(&addr).is_some_and(|&l| s.in_use(addr, l));
        if !synced || in_use {
            // Some stream never drained, or an operation enqueued since (or a host copy
            // on another thread) is touching the bytes: keep them.
            s.leaked.push(addr);
            return;
        }
        if let Some(len) = s.take_plain(addr) {
            drop(s);
            dealloc(addr, len);
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
        self.run_op(0, &[], &[r], |_, w| {
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
        self.run_op(0, &[r], &[], |rd, _| {
            dst.copy_from_slice(rd[0]);
            Ok(())
        })
    }
    fn check_pointer(&self, addr: DevAddr, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let s = self.state()?;
        match s.cover(addr, len) {
            Cover::Inside => Ok(()),
            Cover::PastEnd { a, l } if s.mapped_range(a).is_some() => {
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
        let p = self.host_alloc(bytes)?;
        self.state()?.live.insert(p, bytes);
        Ok(Some(p))
    }
    fn zero(&self, addr: DevAddr, bytes: usize) -> Result<()> {
        waits::host_wait("cpu device: zeroing on the private stream (a synchronous memset)")?;
        self.unsafe_call("zeroing on the private stream (a synchronous memset)")?;
        let r = Region { addr, len: bytes };
        self.run_op(0, &[], &[r], |_, w| {
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

/// Entries the host has made on `stream` (a stream of the CPU device) since it was
/// created: operations (copies, kernels, zeroing, delays, graph launches), event records
/// and event waits, each one, as a CUDA stream takes one launch, `cuEventRecord` or
/// `cuStreamWaitEvent` each. How the tests count what a call puts on its caller's
/// stream (NCCL puts its kernel there; `docs/gpu.md`, "Entries per call"). An error for
/// a stream of another device.
pub fn entries(stream: &dyn DevStream) -> Result<u64> {
    let dev = stream.device();
    if dev.api() != Api::Cpu {
        return Err(Error::InvalidArgument(format!(
            "stream entries are counted by the cpu device only, not {}",
            dev.api().name()
        )));
    }
    let cpu = CpuDevice::open(dev.ordinal())?;
    let lane = cpu.lane_of(stream.raw())?;
    let n = lane.lock()?.entries;
    Ok(n)
}

/// An event of the CPU device: the point after `seq` operations of one stream, or,
/// recorded during a capture, the capture's nodes it follows.
pub struct CpuEvent {
    lane: Arc<Lane>,
    seq: u64,
    captured: Option<(Arc<Capture>, Vec<usize>)>,
}

fn cpu_event(ev: &dyn DevEvent) -> Result<&CpuEvent> {
    ev.as_any().downcast_ref::<CpuEvent>().ok_or_else(|| {
        Error::InvalidArgument("an event of another device given to a cpu stream".into())
    })
}

impl DevEvent for CpuEvent {
    fn query(&self) -> Result<bool> {
        if let Some((cap, _)) = &self.captured {
            return Err(cap.fail(
                "an event recorded during a capture was queried (it exists only in the graph)"
                    .into(),
            ));
        }
        let q = self.lane.lock()?;
        if q.done < self.seq {
            return Ok(false);
        }
        match &q.error {
            Some(e) => Err(e.clone()),
            None => Ok(true),
        }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// One queued operation.
#[derive(Clone)]
enum Task {
    Copy {
        dst: DevAddr,
        src: DevAddr,
        bytes: usize,
    },
    Reduce {
        acc: DevAddr,
        src: DevAddr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    },
    Divide {
        buf: DevAddr,
        count: usize,
        dtype: DataType,
        n: usize,
    },
    Quant(QuantCall),
    /// Wait until `lane` has completed `seq` operations.
    Wait {
        lane: Arc<Lane>,
        seq: u64,
    },
    /// Occupy the stream for a while (a slow kernel, for ordering and overlap tests).
    Delay(Duration),
    /// Zero `bytes` at `addr`.
    Zero {
        addr: DevAddr,
        bytes: usize,
    },
    /// One replay of a captured graph (its nodes in a topological order).
    Graph(Arc<Vec<Node>>),
}

#[derive(Default)]
struct LaneQ {
    tasks: VecDeque<Task>,
    enqueued: u64,
    done: u64,
    error: Option<Error>,
    closed: bool,
    /// The capture this stream records into, and its frontier (the nodes the next
    /// operation depends on).
    capture: Option<(Arc<Capture>, Vec<usize>)>,
    /// Threads waiting for completions on `cv`, and whether the worker waits for work
    /// on `work` (changed under the lock): a notification is a system call, made only
    /// when someone waits for what changed.
    parked: usize,
    idle: bool,
    /// Entries made on this stream by the host (operations, event records and event
    /// waits, as a CUDA stream counts its launches, `cuEventRecord`s and
    /// `cuStreamWaitEvent`s): what [`entries`] reports.
    entries: u64,
}

/// The queue and worker of one stream.
struct Lane {
    id: u64,
    q: Mutex<LaneQ>,
    /// Completions (`done` advanced).
    cv: Condvar,
    /// New work for the worker (or `closed`).
    work: Condvar,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lane({})", self.id)
    }
}

impl Lane {
    fn lock(&self) -> Result<MutexGuard<'_, LaneQ>> {
        self.q
            .lock()
            .map_err(|_| Error::Internal("cpu stream queue poisoned".into()))
    }

    fn push(&self, t: Task) -> Result<()> {
        let mut q = self.lock()?;
        q.entries += 1;
        if let Some((cap, front)) = q.capture.as_mut() {
            if let Task::Wait { lane, .. } = &t {
                let msg = format!(
                    "a capturing stream waited for stream {} outside the capture (isolation)",
                    lane.id
                );
                let cap = cap.clone();
                drop(q);
                return Err(cap.fail(msg));
            }
            let i = cap.add(t, std::mem::take(front))?;
            *front = vec![i];
            return Ok(());
        }
        q.tasks.push_back(t);
        q.enqueued += 1;
        if q.idle {
            self.work.notify_one();
        }
        Ok(())
    }

    /// An event after the work enqueued so far (inside a capture: after its frontier).
    fn record(self: &Arc<Self>) -> Result<CpuEvent> {
        let mut q = self.lock()?;
        q.entries += 1;
        Ok(CpuEvent {
            lane: self.clone(),
            seq: q.enqueued,
            captured: q.capture.as_ref().map(|(c, f)| (c.clone(), f.clone())),
        })
    }

    /// Wait for `ev`: a captured event joins this stream to its capture (or adds to
    /// its frontier), a plain one is a device-side wait (refused while capturing).
    fn wait_event(self: &Arc<Self>, ev: &CpuEvent) -> Result<()> {
        let Some((cap, f)) = &ev.captured else {
            if Arc::ptr_eq(&ev.lane, self) {
                // Still an entry on a CUDA stream (cuStreamWaitEvent on its own event).
                self.lock()?.entries += 1;
                return Ok(());
            }
            return self.push(Task::Wait {
                lane: ev.lane.clone(),
                seq: ev.seq,
            });
        };
        let mut q = self.lock()?;
        match q.capture.as_mut() {
            None => {
                q.capture = Some((cap.clone(), f.clone()));
                drop(q);
                cap.lock()?.joined.push(self.clone());
                Ok(())
            }
            Some((mine, front)) if Arc::ptr_eq(mine, cap) => {
                for i in f {
                    if !front.contains(i) {
                        front.push(*i);
                    }
                }
                Ok(())
            }
            Some((mine, _)) => {
                let mine = mine.clone();
                drop(q);
                Err(mine.fail("a stream waited for an event of another capture (isolation)".into()))
            }
        }
    }

    /// Wait until `seq` operations have completed or `deadline` passes (false then).
    fn wait_done(&self, seq: u64, deadline: Instant) -> Result<bool> {
        let mut q = self.lock()?;
        while q.done < seq {
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            q.parked += 1;
            q = self
                .cv
                .wait_timeout(q, deadline - now)
                .map_err(|_| Error::Internal("cpu stream queue poisoned".into()))?
                .0;
            q.parked -= 1;
        }
        Ok(true)
    }

    fn run(self: Arc<Self>, dev: &CpuDevice) {
        loop {
            let task = {
                let Ok(mut q) = self.lock() else { return };
                loop {
                    if let Some(t) = q.tasks.pop_front() {
                        break t;
                    }
                    if q.closed {
                        return;
                    }
                    q.idle = true;
                    q = match self.work.wait(q) {
                        Ok(q) => q,
                        Err(_) => return,
                    };
                    q.idle = false;
                }
            };
            let failed = self.lock().map(|q| q.error.is_some()).unwrap_or(true);
            let r = if failed { Ok(()) } else { self.exec(dev, task) };
            let Ok(mut q) = self.lock() else { return };
            if let Err(e) = r {
                q.error.get_or_insert(e);
            }
            q.done += 1;
            if q.parked > 0 {
                self.cv.notify_all();
            }
        }
    }

    fn exec(&self, dev: &CpuDevice, task: Task) -> Result<()> {
        let reg = |addr, len| Region { addr, len };
        match task {
            Task::Copy { dst, src, bytes } => {
                dev.run_op(self.id, &[reg(src, bytes)], &[reg(dst, bytes)], |r, w| {
                    w[0].copy_from_slice(r[0]);
                    Ok(())
                })
            }
            Task::Reduce {
                acc,
                src,
                count,
                dtype,
                op,
            } => {
                let b = count * dtype.size();
                dev.run_op(self.id, &[reg(src, b)], &[reg(acc, b)], |r, w| {
                    reduce_into(w[0], r[0], dtype, op);
                    Ok(())
                })
            }
            Task::Divide {
                buf,
                count,
                dtype,
                n,
            } => {
                let b = count * dtype.size();
                dev.run_op(self.id, &[], &[reg(buf, b)], |_, w| {
                    finish_avg(w[0], dtype, n);
                    Ok(())
                })
            }
            Task::Quant(c) => quant(dev, self.id, &c),
            Task::Wait { lane, seq } => {
                // Bounded only by the other stream: a stream waiting on work that never
                // completes stalls, as on a GPU; `finish` on the host reports it.
                while !lane.wait_done(seq, Instant::now() + Duration::from_secs(3600))? {}
                Ok(())
            }
            Task::Delay(d) => {
                std::thread::sleep(d);
                Ok(())
            }
            Task::Zero { addr, bytes } => dev.run_op(self.id, &[], &[reg(addr, bytes)], |_, w| {
                w[0].fill(0);
                Ok(())
            }),
            Task::Graph(nodes) => nodes
                .iter()
                .try_for_each(|n| self.exec(dev, n.task.clone())),
        }
    }
}

/// Split `inputs` into `k` equal sender slices.
fn senders(inputs: &[u8], k: usize) -> Vec<&[u8]> {
    let per = inputs.len() / k.max(1);
    (0..k).map(|s| &inputs[s * per..(s + 1) * per]).collect()
}

/// A quantization kernel on the CPU reference, after the GPU launch's checks.
fn quant(dev: &CpuDevice, lane: u64, c: &QuantCall) -> Result<()> {
    if crate::kernels_gpu::call::prepare(c)?.is_none() {
        return Ok(());
    }
    match *c {
        QuantCall::Quantize {
            spec,
            dtype,
            src,
            dst,
        } => dev.run_op(lane, &[src], &[dst], |r, w| {
            kernels::quantize(spec, dtype, r[0], w[0])
        }),
        QuantCall::Swizzled {
            spec,
            dtype,
            src,
            c,
            nodes,
            devices,
            stages,
            dst,
        } => dev.run_op(lane, &[src], &[dst], |r, w| {
            kernels::swizzled_quantize(spec, dtype, r[0], c, nodes, devices, stages, w[0])
        }),
        QuantCall::DequantReduce {
            spec,
            inputs,
            k,
            n,
            op,
            divisor,
            dtype,
            dst,
        } => dev.run_op(lane, &[inputs], &[dst], |r, w| {
            if k == 1 && op == ReduceOp::Sum {
                kernels::dequantize(spec, r[0], n, dtype, w[0])
            } else {
                kernels::dequant_reduce(spec, &senders(r[0], k), n, op, divisor, dtype, w[0])
            }
        }),
        QuantCall::DequantReduceQuant {
            spec,
            inputs,
            k,
            n,
            slices,
            dst,
        } => dev.run_op(lane, &[inputs], &[dst], |r, w| {
            kernels::dequant_reduce_quant(spec, &senders(r[0], k), n, slices, w[0])
        }),
    }
}

/// A stream of the CPU device: a worker thread and its queue.
pub struct CpuStream {
    dev: Arc<CpuDevice>,
    lane: Arc<Lane>,
    /// False for a borrowed stream ([`Device::borrow_stream`]): its drop closes nothing.
    owned: bool,
}

impl Drop for CpuStream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // As cuStreamDestroy: returns at once; queued work still runs, then the worker
        // ends.
        if let Ok(mut q) = self.lane.lock() {
            q.closed = true;
        }
        self.lane.work.notify_all();
        self.lane.cv.notify_all();
    }
}

impl CpuStream {
    fn push(&self, t: Task) -> Result<()> {
        self.lane.push(t)
    }
}

impl DevStream for CpuStream {
    fn device(&self) -> Arc<dyn Device> {
        self.dev.clone()
    }
    fn raw(&self) -> *mut c_void {
        Arc::as_ptr(&self.lane) as *mut c_void
    }
    fn copy(&self, dst: DevAddr, src: DevAddr, bytes: usize) -> Result<()> {
        if bytes == 0 || dst == src {
            return Ok(());
        }
        self.push(Task::Copy { dst, src, bytes })
    }
    fn reduce(
        &self,
        acc: DevAddr,
        src: DevAddr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        if crate::kernels_gpu::call::elementwise("reduce", &[acc, src], count, dtype, Some(op))?
            .is_none()
        {
            return Ok(());
        }
        self.push(Task::Reduce {
            acc,
            src,
            count,
            dtype,
            op,
        })
    }
    fn divide(&self, buf: DevAddr, count: usize, dtype: DataType, n: usize) -> Result<()> {
        if crate::kernels_gpu::call::elementwise("divide", &[buf], count, dtype, None)?.is_none() {
            return Ok(());
        }
        self.push(Task::Divide {
            buf,
            count,
            dtype,
            n,
        })
    }
    fn quant(&self, call: &QuantCall) -> Result<()> {
        self.push(Task::Quant(*call))
    }
    fn query(&self) -> Result<bool> {
        let q = self.lane.lock()?;
        if let Some((cap, _)) = &q.capture {
            let cap = cap.clone();
            drop(q);
            return Err(cap.fail("a capturing stream was queried or synchronized".into()));
        }
        if let Some(e) = &q.error {
            return Err(e.clone());
        }
        Ok(q.done == q.enqueued)
    }
    unsafe fn wait_foreign(&self, other: *mut c_void) -> Result<()> {
        let lane = self.dev.lane_of(other)?;
        if Arc::ptr_eq(&lane, &self.lane) {
            return Ok(());
        }
        let ev = lane.record()?;
        self.lane.wait_event(&ev)
    }
    fn delay(&self, d: Duration) -> Result<()> {
        self.push(Task::Delay(d))
    }
    fn record(&self) -> Result<Arc<dyn DevEvent>> {
        Ok(Arc::new(self.lane.record()?))
    }
    fn wait_event(&self, ev: &dyn DevEvent) -> Result<()> {
        self.lane.wait_event(cpu_event(ev)?)
    }
    fn clear(&self, addr: DevAddr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.push(Task::Zero { addr, bytes })
    }
    fn begin_capture(&self) -> Result<()> {
        let mut q = self.lane.lock()?;
        if q.capture.is_some() {
            return Err(Error::InvalidUsage(
                "begin_capture: the stream is already capturing".into(),
            ));
        }
        let cap = Arc::new(Capture {
            origin: self.lane.id,
            g: Mutex::new(CapGraph::default()),
        });
        q.capture = Some((cap.clone(), Vec::new()));
        drop(q);
        self.dev.state()?.captures.push(cap);
        Ok(())
    }
    fn end_capture(&self) -> Result<Arc<dyn super::DevGraph>> {
        let (cap, front) = {
            let mut q = self.lane.lock()?;
            match q.capture.take() {
                Some((c, f)) if c.origin == self.lane.id => (c, f),
                other => {
                    q.capture = other;
                    return Err(Error::InvalidUsage(
                        "end_capture on a stream that did not begin a capture".into(),
                    ));
                }
            }
        };
        self.dev.state()?.captures.retain(|c| !Arc::ptr_eq(c, &cap));
        let joined = std::mem::take(&mut cap.lock()?.joined);
        let mut fronts = Vec::new();
        for l in joined {
            let mut q = l.lock()?;
            if q.capture
                .as_ref()
                .is_some_and(|(c, _)| Arc::ptr_eq(c, &cap))
            {
                if let Some((_, f)) = q.capture.take() {
                    fronts.push((l.id, f));
                }
            }
        }
        let g = cap.lock()?;
        if let Some(e) = &g.failed {
            return Err(dev_err(format!("the capture was invalidated: {e}")));
        }
        // Everything a joined stream recorded must be an ancestor of the origin's end
        // (CUDA: cudaErrorStreamCaptureUnjoined).
        let mut seen = vec![false; g.nodes.len()];
        let mut stack = front;
        while let Some(i) = stack.pop() {
            if !std::mem::replace(&mut seen[i], true) {
                stack.extend(g.nodes[i].deps.iter().copied());
            }
        }
        if let Some((id, _)) = fronts.iter().find(|(_, f)| f.iter().any(|&i| !seen[i])) {
            return Err(dev_err(format!(
                "end_capture: stream {id} joined the capture and was not joined back \
                 (unjoined work)"
            )));
        }
        Ok(Arc::new(CpuGraph {
            dev: self.dev.clone(),
            nodes: Arc::new(g.nodes.clone()),
        }))
    }
}

/// A graph captured on the CPU device: its operations, replayed in a topological order
/// on the stream it is launched on.
pub struct CpuGraph {
    dev: Arc<CpuDevice>,
    nodes: Arc<Vec<Node>>,
}

impl CpuGraph {
    /// Operations in the graph.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
    /// True for an empty graph.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

impl super::DevGraph for CpuGraph {
    fn launch(&self, stream: &dyn DevStream) -> Result<()> {
        self.dev
            .lane_of(stream.raw())?
            .push(Task::Graph(self.nodes.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> Arc<CpuDevice> {
        CpuDevice::open(7).unwrap()
    }

    fn sync(s: &dyn DevStream) {
        super::super::finish(s, Duration::from_secs(10), "test", || Ok(())).unwrap();
    }

    #[test]
    fn copies_and_reductions_run_in_stream_order() {
        let d = dev();
        let s = d.new_stream().unwrap();
        let a = d.alloc_zeroed(16).unwrap();
        let b = d.alloc_zeroed(16).unwrap();
        let one: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        d.htod(a, &one).unwrap();
        s.delay(Duration::from_millis(30)).unwrap();
        s.copy(b, a, 16).unwrap();
        s.reduce(b, a, 4, DataType::F32, ReduceOp::Sum).unwrap();
        assert!(
            !s.query().unwrap(),
            "enqueueing returned before the delay ran"
        );
        sync(s.as_ref());
        let mut out = [0u8; 16];
        d.dtoh(&mut out, b).unwrap();
        let v: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(v, [2.0, 4.0, 6.0, 8.0]);
        // SAFETY: allocated above, freed once, the stream is idle.
        unsafe {
            d.free(a);
            d.free(b);
        }
    }

    #[test]
    fn out_of_bounds_and_freed_addresses_are_device_errors() {
        let d = dev();
        let s = d.new_stream().unwrap();
        let a = d.alloc_zeroed(64).unwrap();
        s.copy(a + 32, a, 64).unwrap();
        let e =
            super::super::finish(s.as_ref(), Duration::from_secs(10), "t", || Ok(())).unwrap_err();
        assert!(e.to_string().contains("illegal address"), "{e}");
        // Sticky: later work fails too.
        assert!(s.query().is_err());
        assert!(d.check_pointer(a, 64).is_ok());
        assert!(d.check_pointer(a + 8, 64).is_err());
        // SAFETY: allocated above, freed once.
        unsafe { d.free(a) };
        assert!(d.check_pointer(a, 1).is_err());
    }

    #[test]
    #[cfg_attr(miri, ignore = "megabyte copies; a race needs real overlap in time")]
    fn a_missing_wait_between_streams_is_a_race_and_a_wait_orders_them() {
        let d = dev();
        const MB: usize = 1 << 20;
        let a = d.alloc_zeroed(MB).unwrap();
        let b = d.alloc_zeroed(MB).unwrap();
        // s1 writes `a` over and over; s2 reads it with no wait between them. The check
        // sees accesses that overlap in time, so a loaded machine may miss one round:
        // rounds with long windows (s1's copies outlast s2's delay by tens of ms) must
        // catch it; the first caught round ends the loop.
        let mut caught = None;
        for _ in 0..20 {
            let (s1, s2) = (d.new_stream().unwrap(), d.new_stream().unwrap());
            for _ in 0..512 {
                s1.copy(a, b, MB).unwrap();
            }
            s2.delay(Duration::from_millis(2)).unwrap();
            for _ in 0..128 {
                s2.copy(b + MB as u64 / 2, a, MB / 2).unwrap();
            }
            let r1 = super::super::finish(s1.as_ref(), Duration::from_secs(60), "t", || Ok(()));
            let r2 = super::super::finish(s2.as_ref(), Duration::from_secs(60), "t", || Ok(()));
            if let Err(e) = r1.and(r2) {
                caught = Some(e);
                break;
            }
        }
        let e = caught.expect("twenty rounds of unordered streams, no race caught");
        assert!(e.to_string().contains("race between streams"), "{e}");
        // Ordered by a wait: never an error.
        let (s1, s2) = (d.new_stream().unwrap(), d.new_stream().unwrap());
        for _ in 0..16 {
            s1.copy(a, b, MB).unwrap();
        }
        // SAFETY: s1 is a live stream of this device.
        unsafe { s2.wait_foreign(s1.raw()).unwrap() };
        s2.copy(b, a, MB).unwrap();
        sync(s2.as_ref());
        assert!(s1.query().unwrap());
        // SAFETY: allocated above, freed once, streams idle.
        unsafe {
            d.free(a);
            d.free(b);
        }
    }

    #[test]
    fn allocations_are_counted_and_foreign_streams_checked() {
        // A device of its own: tests running at once on device 0 allocate too.
        let d = CpuDevice::open(77).unwrap();
        let before = d.allocations();
        let a = d.alloc_zeroed(10).unwrap();
        assert_eq!(d.alloc_zeroed(0).unwrap(), 0);
        assert_eq!(d.allocations(), before + 1);
        let s = d.new_stream().unwrap();
        // SAFETY: an arbitrary non-null value is looked up, never dereferenced.
        let e = unsafe { s.wait_foreign(16 as *mut c_void) }.unwrap_err();
        assert!(e.to_string().contains("not a live stream"), "{e}");
        // SAFETY: allocated above, freed once.
        unsafe { d.free(a) };
    }
    /// A capture records instead of running; joined streams fork and join with events;
    /// the graph replays; allocating, querying, waiting outside the capture and leaving
    /// a forked stream unjoined are errors, as on CUDA.
    #[test]
    fn capture_records_and_replays_and_refuses_what_cuda_refuses() {
        // Its own device: a capture forbids allocations device-wide.
        let d = CpuDevice::open(41).unwrap();
        let (a, b, c) = (
            d.alloc_zeroed(16).unwrap(),
            d.alloc_zeroed(16).unwrap(),
            d.alloc_zeroed(16).unwrap(),
        );
        d.htod(a, &[1u8; 16]).unwrap();
        let (s, t) = (d.new_stream().unwrap(), d.new_stream().unwrap());
        s.begin_capture().unwrap();
        assert!(s.is_capturing().unwrap());
        s.copy(b, a, 16).unwrap();
        let fork = s.record().unwrap();
        t.wait_event(fork.as_ref()).unwrap();
        assert!(
            t.is_capturing().unwrap(),
            "waiting on a captured event joins"
        );
        t.copy(c, b, 16).unwrap();
        s.wait_event(t.record().unwrap().as_ref()).unwrap();
        let g = s.end_capture().unwrap();
        assert!(!t.is_capturing().unwrap());
        let mut out = [0u8; 16];
        d.dtoh(&mut out, c).unwrap();
        assert_eq!(out, [0u8; 16], "capture ran the work");
        g.launch(s.as_ref()).unwrap();
        sync(s.as_ref());
        d.dtoh(&mut out, c).unwrap();
        assert_eq!(out, [1u8; 16], "replay did not run the work");
        d.htod(a, &[7u8; 16]).unwrap();
        g.launch(t.as_ref()).unwrap();
        sync(t.as_ref());
        d.dtoh(&mut out, c).unwrap();
        assert_eq!(out, [7u8; 16], "a replay reads the inputs of its time");

        // Allocating inside a capture fails and invalidates it.
        s.begin_capture().unwrap();
        let e = d.alloc_zeroed(8).unwrap_err();
        assert!(e.to_string().contains("being captured"), "{e}");
        let e = s.end_capture().err().expect("invalidated");
        assert!(e.to_string().contains("invalidated"), "{e}");
        // Querying a capturing stream, likewise.
        s.begin_capture().unwrap();
        assert!(s.query().is_err());
        assert!(s.end_capture().is_err());
        // A forked stream not joined back.
        s.begin_capture().unwrap();
        t.wait_event(s.record().unwrap().as_ref()).unwrap();
        t.copy(c, a, 16).unwrap();
        let e = s.end_capture().err().expect("unjoined");
        assert!(e.to_string().contains("not joined back"), "{e}");
        // Waiting for work outside the capture (isolation).
        let u = d.new_stream().unwrap();
        u.copy(b, a, 16).unwrap();
        s.begin_capture().unwrap();
        assert!(s.wait_event(u.record().unwrap().as_ref()).is_err());
        assert!(s.end_capture().is_err());
        sync(u.as_ref());
        // SAFETY: allocated above, freed once, no work left on them.
        unsafe {
            d.free(a);
            d.free(b);
            d.free(c);
        }
    }

    /// Every host wait for the device is counted inside a launch; enqueueing, recording
    /// and querying are not waits.
    #[test]
    fn host_waits_inside_a_launch_are_counted() {
        use super::super::waits;
        let d = dev();
        let a = d.alloc_zeroed(64).unwrap();
        let b = d.alloc_zeroed(64).unwrap();
        // The synchronous copies use memory of their own (they wait for no stream).
        let c = d.alloc_zeroed(64).unwrap();
        let s = d.new_stream().unwrap();
        let mut out = [0u8; 64];
        {
            let _l = waits::launching();
            let before = waits::thread_count();
            s.copy(b, a, 64).unwrap();
            s.clear(a, 8).unwrap();
            let ev = s.record().unwrap();
            let _ = ev.query().unwrap();
            let _ = s.query().unwrap();
            assert_eq!(
                waits::thread_count(),
                before,
                "enqueueing and recording waited"
            );
            d.dtoh(&mut out, c).unwrap();
            assert_eq!(
                waits::thread_count(),
                before + 1,
                "a synchronous dtoh was not counted"
            );
            assert!(waits::last().is_some());
            d.htod(c, &[1u8; 8]).unwrap();
            d.zero(c, 8).unwrap();
            assert_eq!(
                waits::thread_count(),
                before + 3,
                "htod / zero were not counted"
            );
        }
        // Outside a launch nothing counts.
        let before = waits::thread_count();
        sync(s.as_ref());
        d.dtoh(&mut out, b).unwrap();
        assert_eq!(waits::thread_count(), before);
        // SAFETY: allocated above, freed once, the stream is idle.
        unsafe {
            d.free(a);
            d.free(b);
            d.free(c);
        }
    }

    /// `bind` makes the device current until its guard drops, restoring the thread's
    /// previous device (nested guards in order); other threads are untouched.
    #[test]
    fn nested_binds_restore_the_current_device_in_order() {
        set_current_device(None);
        assert_eq!(current_device(), None);
        set_current_device(Some(3));
        let (d0, d1) = (CpuDevice::open(0).unwrap(), CpuDevice::open(1).unwrap());
        {
            let _outer = d0.bind().unwrap();
            assert_eq!(current_device(), Some(0));
            {
                let _inner = d1.bind().unwrap();
                assert_eq!(current_device(), Some(1));
                std::thread::spawn(|| assert_eq!(current_device(), None))
                    .join()
                    .unwrap();
            }
            assert_eq!(current_device(), Some(0));
        }
        assert_eq!(current_device(), Some(3));
        set_current_device(None);
        {
            let _g = d1.bind().unwrap();
        }
        assert_eq!(current_device(), None);
    }

    /// Memory of several mappings (`expandable_segments`): a range over adjacent
    /// mappings is device memory for `check_pointer` and for operations; past the last
    /// mapping it is not; `free_mapped` frees every mapping; `free` and `free_mapped`
    /// refuse each other's memory.
    #[test]
    fn memory_of_several_mappings() {
        // Its own device: the test frees memory and checks it is gone.
        const ORD: usize = 43;
        let d = CpuDevice::open(ORD).unwrap();
        let before = d.live_bytes();
        let m = alloc_mapped(ORD, &[256, 512, 256]).unwrap();
        assert_eq!(m % ALIGN as u64, 0);
        assert_eq!(d.live_bytes(), before + 1024);
        d.check_pointer(m, 1024).unwrap();
        d.check_pointer(m + 100, 800).unwrap();
        d.check_pointer(m + 768, 256).unwrap();
        let e = d.check_pointer(m, 1025).unwrap_err();
        assert!(e.to_string().contains("run past the end"), "{e}");
        let e = d.check_pointer(m + 300, 1024).unwrap_err();
        assert!(e.to_string().contains("run past the end"), "{e}");
        assert!(alloc_mapped(ORD, &[]).is_err());
        assert!(alloc_mapped(ORD, &[256, 0]).is_err());

        // A copy on a stream spanning the first two mappings, into the last two.
        let pattern: Vec<u8> = (0..1024u32).map(|i| (i * 7 % 251) as u8).collect();
        d.htod(m, &pattern).unwrap();
        let s = d.new_stream().unwrap();
        let plain = d.alloc_zeroed(600).unwrap();
        s.copy(plain, m + 100, 600).unwrap();
        s.copy(m + 400, plain, 600).unwrap();
        sync(s.as_ref());
        let mut out = vec![0u8; 1024];
        d.dtoh(&mut out, m).unwrap();
        assert_eq!(out[400..1000], pattern[100..700]);
        assert_eq!(out[..400], pattern[..400]);
        assert_eq!(out[1000..], pattern[1000..]);

        // `free` refuses mapped memory (as cuMemFree), `free_mapped` plain memory.
        // SAFETY: `m + 256` is not an allocation of `alloc_zeroed`: refused, nothing freed.
        unsafe { d.free(m + 256) };
        // SAFETY: as above, `m` is mapped memory: refused.
        unsafe { d.free(m) };
        d.check_pointer(m, 1024).unwrap();
        assert!(free_mapped(ORD, plain).is_err());
        assert!(free_mapped(ORD, m + 256).is_err());

        free_mapped(ORD, m).unwrap();
        assert_eq!(d.live_bytes(), before + 600);
        assert!(d.check_pointer(m, 1).is_err());
        assert!(d.check_pointer(m + 512, 1).is_err());
        s.copy(plain, m + 256, 64).unwrap();
        let e =
            super::super::finish(s.as_ref(), Duration::from_secs(10), "t", || Ok(())).unwrap_err();
        assert!(e.to_string().contains("illegal address"), "{e}");
        assert!(free_mapped(ORD, m).is_err(), "freed twice");
        // SAFETY: allocated above, freed once; the failed stream holds no access.
        unsafe { d.free(plain) };
        assert_eq!(d.live_bytes(), before);
    }
}
