//! The CPU device's race check: every operation registers the byte ranges it reads and
//! writes while it runs; one that would write bytes another stream is reading or writing
//! at that moment (or read bytes it is writing) fails with a device error naming both,
//! and one outside live device memory fails as an illegal address. Only registered
//! ranges are ever viewed as slices ([`Memory::run_op`]).

use super::memory::{dev_err, overlap, Cover, Table};
use crate::device::Region;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

#[derive(Debug, Clone, Copy)]
struct Access {
    lane: u64,
    region: Region,
    write: bool,
    token: u64,
}

/// What one lock guards: the memory table, the accesses running now, and the leaks.
#[derive(Debug, Default)]
pub(super) struct MemState {
    pub(super) table: Table,
    /// Accesses of the operations running now (the race check).
    running: Vec<Access>,
    /// Frees whose streams did not drain in time (released when the device is dropped).
    pub(super) leaked: Vec<u64>,
}

impl MemState {
    /// True while a running operation touches bytes in `len` bytes at `addr`.
    pub(super) fn in_use(&self, addr: u64, len: usize) -> bool {
        self.running
            .iter()
            .any(|a| overlap(a.region, Region { addr, len }))
    }
}

/// The device's memory and the accesses to it, with the device's id counter (streams
/// and access tokens draw from it).
#[derive(Debug)]
pub(super) struct Memory {
    pub(super) state: Mutex<MemState>,
    next_id: AtomicU64,
}

impl Default for Memory {
    fn default() -> Self {
        Memory {
            state: Mutex::default(),
            next_id: AtomicU64::new(1),
        }
    }
}

/// How an error names the issuer of an access (0: a synchronous call of the host).
pub(super) fn lane_name(id: u64) -> String {
    if id == 0 {
        "the host".into()
    } else {
        format!("stream {id}")
    }
}

impl Memory {
    pub(super) fn lock(&self) -> Result<MutexGuard<'_, MemState>> {
        self.state
            .lock()
            .map_err(|_| Error::Internal("cpu device state poisoned".into()))
    }

    /// A new id (of a stream or an access token).
    pub(super) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Register the accesses of one operation of `lane`: every region inside live device
    /// memory (one allocation, or adjacent mappings of one), and no conflict with what
    /// other streams are doing now. The returned token releases them
    /// ([`Memory::release`]).
    fn acquire(&self, lane: u64, reads: &[Region], writes: &[Region]) -> Result<u64> {
        let mut s = self.lock()?;
        for (r, w) in reads
            .iter()
            .map(|r| (r, false))
            .chain(writes.iter().map(|r| (r, true)))
        {
            if r.len == 0 {
                continue;
            }
            if !matches!(s.table.cover(r.addr, r.len), Cover::Inside) {
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
        let token = self.next_id();
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
        if let Ok(mut s) = self.lock() {
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

    /// Slices over device memory for one operation.
    ///
    /// # Safety
    /// The regions were registered by [`Memory::acquire`] (each inside live memory of
    /// one host allocation, [`Table::cover`]; no conflicting access by another stream)
    /// and stay registered while the slices live (nothing registered is freed); `writes`
    /// do not overlap each other or `reads` (callers copy reads that do).
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

    /// Run one memory operation of `lane` (0: the host): register, copy reads that alias
    /// a write, hand slices to `f`.
    pub(super) fn run_op(
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
