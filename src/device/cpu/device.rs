//! The CPU device's state: its memory ([`super::races::Memory`]), its streams and the
//! captures in progress, the pool of freed blocks, and what every call of the device
//! goes through: allocation, device-wide synchronization, the refusal of synchronizing
//! calls during a capture, the lookup of a runtime stream handle.

#![forbid(unsafe_code)]

use super::kernels;
use super::lanes::{Cap, Lane, LaneQ};
use super::memory::{dealloc, dev_err, host_alloc};
use super::races::Memory;
use crate::device::pool::Pool;
use crate::device::{waits, DevAddr};
use crate::error::{Error, Result};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How long `htod`/`dtoh`/`free` wait for the device's streams before giving up.
const SYNC_LIMIT: Duration = Duration::from_secs(60);

/// One host CPU as a strata device. Process-wide per ordinal ([`CpuDevice::open`]).
#[derive(Debug)]
pub struct CpuDevice {
    pub(super) ordinal: usize,
    me: Weak<CpuDevice>,
    state: Mutex<State>,
    /// Memory, and the accesses the race check sees.
    pub(super) mem: Memory,
    allocations: AtomicU64,
    pub(super) pool: Pool,
    /// The legacy default stream (a null `raw`), made on first use.
    legacy: OnceLock<Arc<Lane>>,
}

/// The device's streams and captures.
#[derive(Debug, Default)]
pub(super) struct State {
    /// Every stream made on this device (for `wait_foreign` lookups and device syncs).
    lanes: Vec<Weak<Lane>>,
    /// Captures in progress (global mode: they forbid synchronizing calls device-wide).
    pub(super) captures: Vec<Arc<Cap>>,
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
            mem: Memory::default(),
            allocations: AtomicU64::new(0),
            pool: Pool::default(),
            legacy: OnceLock::new(),
        });
        all.push(d.clone());
        Ok(d)
    }

    pub(super) fn arc(&self) -> Result<Arc<CpuDevice>> {
        self.me
            .upgrade()
            .ok_or_else(|| Error::Internal("cpu device dropped".into()))
    }

    pub(super) fn state(&self) -> Result<MutexGuard<'_, State>> {
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
        self.mem
            .lock()
            .map(|s| s.table.live.values().sum())
            .unwrap_or(0)
    }

    /// A call that synchronizes with the device (allocation, free, synchronous copies):
    /// refused while a capture is in progress, which it invalidates (CUDA's global
    /// capture mode), so code that allocates or waits inside a capture fails its tests.
    pub(super) fn unsafe_call(&self, what: &str) -> Result<()> {
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
    pub(super) fn synchronize(&self, what: &str) -> Result<()> {
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
    pub(super) fn alloc_host(&self, bytes: usize) -> Result<u64> {
        self.unsafe_call("allocating device memory")?;
        let p = host_alloc(bytes)?;
        self.allocations.fetch_add(1, Ordering::Relaxed);
        Ok(p)
    }

    /// [`super::alloc_mapped`] on this device.
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
        let base = self.alloc_host(total)?;
        let mut s = self.mem.lock()?;
        let mut at = base;
        for &p in pieces {
            s.table.live.insert(at, p);
            at += p as u64;
        }
        s.table.mapped.insert(base, total);
        Ok(base)
    }

    /// [`super::free_mapped`] on this device. On an error the memory stays allocated.
    pub fn free_mapped(&self, addr: DevAddr) -> Result<()> {
        if !self.mem.lock()?.table.mapped.contains_key(&addr) {
            return Err(Error::InvalidArgument(format!(
                "{addr:#x} is not memory of several mappings on cpu device {} (from \
                 alloc_mapped)",
                self.ordinal
            )));
        }
        // As PyTorch before unmapping: the device's queued work finishes first.
        self.synchronize("freeing mapped memory")?;
        let mut s = self.mem.lock()?;
        let total = s.table.mapped.get(&addr).copied().unwrap_or(0);
        if s.in_use(addr, total) {
            // Sound from safe code: nothing running keeps slices over freed bytes, and
            // once out of the table no operation can register them again.
            return Err(Error::InvalidUsage(format!(
                "free_mapped: {total} bytes at {addr:#x} are in use by a running operation"
            )));
        }
        if let Some(total) = s.table.take_mapped(addr) {
            drop(s);
            dealloc(addr, total);
        }
        Ok(())
    }

    pub(super) fn new_lane(&self) -> Result<Arc<Lane>> {
        let id = self.mem.next_id();
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
            .spawn(move || worker.run(|l, t| kernels::exec(&dev.mem, l, t)))
            .map_err(|e| Error::System(format!("cpu device: spawning a stream thread: {e}")))?;
        Ok(lane)
    }

    /// The stream behind a runtime handle: null is the legacy default stream, anything
    /// else must be a live stream of this device (looked up, never dereferenced).
    pub(super) fn lane_of(&self, raw: *mut c_void) -> Result<Arc<Lane>> {
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
}

impl Drop for CpuDevice {
    fn drop(&mut self) {
        let cached = self.pool.drain();
        if let Ok(s) = self.mem.state.get_mut() {
            for a in std::mem::take(&mut s.leaked).into_iter().chain(cached) {
                if let Some(len) = s.table.take_any(a) {
                    dealloc(a, len);
                }
            }
        }
    }
}
