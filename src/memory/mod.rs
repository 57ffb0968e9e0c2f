//! Host memory owned by strata: shareable buffers with range-granular borrow tracking.
//!
//! Collectives are nonblocking, so the memory they touch must outlive the call and be
//! shared with the communicator's stream thread, exactly like device memory under NCCL.
//! A [`Buffer`] is a cheap handle (an `Arc` plus a byte range) to such memory. Work in
//! flight borrows the byte ranges it reads (shared) and writes (exclusive); two pieces
//! of work on disjoint ranges of one buffer run at the same time (HO-Ring relies on
//! this), overlapping ones wait for each other, and a borrow that cannot be had within
//! the communicator's timeout is an error (`InvalidUsage`), never a hang.
//!
//! A buffer's memory is on the host or on a GPU ([`crate::device`]): the same handle,
//! views and borrow table either way. Host bytes are reached through guards that deref
//! to slices; device bytes through [`DevGuard`]s that hand out device addresses, which
//! the device paths of the algorithms and the GPU transports use. `to_bytes` /
//! `write_bytes` work on both (device: a synchronous copy), so checks and tests read
//! device results the same way.
//!
//! [`loan`] lends a borrowed slice to another thread for one blocking call (the
//! zero-copy hand-off of the `local` transport).
//!
//! This module holds the only `unsafe` outside FFI and the C ABI: the borrow table and
//! the loans are what make the raw slices and addresses they hand out sound.

pub mod loan;

use crate::device::direct::Scope;
use crate::device::{DevAddr, DevStream, Device, DeviceMem};
use crate::dtype::{DataType, Element};
use crate::error::{Error, Result};
use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut, Range};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

enum Storage {
    Host(Box<[UnsafeCell<u8>]>),
    /// The caller's host memory (C ABI, Python): never freed by strata.
    HostForeign(*mut u8),
    Device(DeviceMem),
}

struct Mem {
    data: Storage,
    /// The one borrow held without the table's lock ([`Fast`]): 0 when none, else
    /// its encoded range.
    fast: AtomicU64,
    /// Entries in the table plus borrowers inside the table's path; the fast slot is
    /// taken only while it is 0 (see [`Mem::borrow`]).
    slow: AtomicUsize,
    /// Active borrows and the id of the next one.
    borrows: Mutex<Borrows>,
    freed: Condvar,
    /// Borrowers parked on `freed` (changed under `borrows`' lock; `release` notifies
    /// only then).
    waiting: AtomicUsize,
}

/// The fast slot's word: bit 63 set, bit 62 exclusive, the range's start in bits
/// 31..62 and its end in bits 0..31 (ranges ending below 2^31; longer ones take the
/// table).
struct Fast;

impl Fast {
    /// The id of the borrow held in the fast slot (the table's ids never reach it).
    const ID: u64 = u64::MAX;
    const LIMIT: usize = 1 << 31;

    fn encode(r: &Range<usize>, exclusive: bool) -> Option<u64> {
        (r.end < Self::LIMIT)
            .then(|| 1 << 63 | (exclusive as u64) << 62 | (r.start as u64) << 31 | r.end as u64)
    }

    /// The range and mode of a non-zero word.
    fn decode(w: u64) -> (Range<usize>, bool) {
        let m = (Self::LIMIT - 1) as u64;
        (
            ((w >> 31) & m) as usize..(w & m) as usize,
            w & (1 << 62) != 0,
        )
    }
}

// SAFETY: the bytes are only reached through `ReadGuard`/`WriteGuard`, which the borrow
// table admits only when no exclusive borrow overlaps a shared one or another exclusive
// one; `UnsafeCell<u8>` has no other interior state.
unsafe impl Sync for Mem {}
// SAFETY: as above; the memory is plain bytes owned by the `Box`, or caller memory that
// `Buffer::from_host_ptr`'s contract keeps valid and unshared while the buffer lives.
unsafe impl Send for Mem {}

/// The borrow table of one allocation (under its lock).
#[derive(Default)]
struct Borrows {
    /// (byte range, exclusive, id).
    active: Vec<(Range<usize>, bool, u64)>,
    /// The id of the next borrow (counted under the lock: no atomic of its own).
    next: u64,
}

fn overlap(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// How long a borrow waits before it reports a usage error (overridable per call).
pub const DEFAULT_BORROW_TIMEOUT: Duration = Duration::from_secs(120);

impl Mem {
    /// A borrow of `r` (shared, or `exclusive`), waiting up to `timeout` for
    /// overlapping ones; its id for [`Mem::release`].
    ///
    /// The uncontended case (no other borrow of this allocation) takes no lock: the
    /// borrow is written into the fast slot with one compare-and-swap. Everything else
    /// goes through the table, under its lock, where the fast slot's borrow is one
    /// more entry to respect. The two meet Dekker-style (sequentially consistent): a
    /// table borrower counts itself in `slow` before it reads the slot, a fast borrower
    /// fills the slot before it reads `slow`, so at least one sees the other, and a
    /// fast borrower that sees a table borrower gives the slot back and joins the table.
    #[inline]
    fn borrow(&self, r: &Range<usize>, exclusive: bool, timeout: Duration) -> Result<u64> {
        if let Some(w) = Fast::encode(r, exclusive) {
            if self.slow.load(SeqCst) == 0
                && self.fast.compare_exchange(0, w, SeqCst, Relaxed).is_ok()
            {
                if self.slow.load(SeqCst) == 0 {
                    return Ok(Fast::ID);
                }
                self.release_fast();
            }
        }
        self.borrow_slow(r, exclusive, timeout)
    }

    fn borrow_slow(&self, r: &Range<usize>, exclusive: bool, timeout: Duration) -> Result<u64> {
        let mut deadline = None;
        let mut b = self
            .borrows
            .lock()
            .map_err(|_| Error::Internal("buffer lock poisoned".into()))?;
        // Counted before the fast slot is read (see `borrow`); kept as the entry's.
        self.slow.fetch_add(1, SeqCst);
        // Parked-or-about-to-park, also before the slot is read: a fast release that
        // misses this count happened before the read, which then sees the slot empty.
        self.waiting.fetch_add(1, SeqCst);
        loop {
            let fast = match self.fast.load(SeqCst) {
                0 => None,
                w => Some(Fast::decode(w)),
            };
            let busy = !r.is_empty()
                && (b
                    .active
                    .iter()
                    .any(|(o, ex, _)| (exclusive || *ex) && overlap(o, r))
                    || fast.is_some_and(|(o, ex)| (exclusive || ex) && overlap(&o, r)));
            if !busy {
                self.waiting.fetch_sub(1, SeqCst);
                let id = b.next;
                b.next = id.wrapping_add(1) % Fast::ID;
                b.active.push((r.clone(), exclusive, id));
                return Ok(id);
            }
            let now = Instant::now();
            let deadline = *deadline.get_or_insert(now + timeout);
            if now >= deadline {
                self.waiting.fetch_sub(1, SeqCst);
                self.slow.fetch_sub(1, SeqCst);
                return Err(Error::InvalidUsage(format!(
                    "buffer bytes {}..{} stayed in use by other work for {:?}: overlapping work on two \
                     communicators needs a dependency between them",
                    r.start, r.end, timeout
                )));
            }
            b = match self.freed.wait_timeout(b, deadline - now) {
                Ok((b, _)) => b,
                Err(_) => {
                    self.waiting.fetch_sub(1, SeqCst);
                    self.slow.fetch_sub(1, SeqCst);
                    return Err(Error::Internal("buffer lock poisoned".into()));
                }
            };
        }
    }

    #[inline]
    fn release(&self, id: u64) {
        if id == Fast::ID {
            return self.release_fast();
        }
        let waiting = match self.borrows.lock() {
            Ok(mut b) => {
                if let Some(i) = b.active.iter().position(|(_, _, i)| *i == id) {
                    b.active.swap_remove(i);
                    self.slow.fetch_sub(1, SeqCst);
                }
                // Changed under the lock by waiters, so none can be missed.
                self.waiting.load(SeqCst) > 0
            }
            Err(_) => true,
        };
        if waiting {
            self.freed.notify_all();
        }
    }

    /// Empty the fast slot, waking the table's waiters when there are any (under the
    /// lock: a waiter holds it from its read of the slot until it parks).
    #[inline]
    fn release_fast(&self) {
        self.fast.store(0, SeqCst);
        if self.waiting.load(SeqCst) > 0 {
            drop(self.borrows.lock());
            self.freed.notify_all();
        }
    }

    #[inline]
    fn ptr(&self) -> Result<*mut u8> {
        match &self.data {
            Storage::Host(d) => Ok(UnsafeCell::raw_get(d.as_ptr())),
            Storage::HostForeign(p) => Ok(*p),
            Storage::Device(d) => Err(Error::InvalidUsage(format!(
                "this buffer is {} bytes of {} device memory: it has no host view (use \
                 to_bytes / write_bytes, or a GPU transport)",
                d.len(),
                d.device().api().name()
            ))),
        }
    }

    fn new(data: Storage) -> Arc<Mem> {
        Arc::new(Mem {
            data,
            fast: AtomicU64::new(0),
            slow: AtomicUsize::new(0),
            borrows: Mutex::new(Borrows::default()),
            freed: Condvar::new(),
            waiting: AtomicUsize::new(0),
        })
    }
}

/// A handle to a byte range of strata-owned host memory. Cloning shares the memory.
#[derive(Clone)]
pub struct Buffer {
    mem: Arc<Mem>,
    range: Range<usize>,
}

/// A reusable allocation for buffers over the caller's host memory (the C ABI's user
/// pointers): [`HostSlot::view`] is [`Buffer::from_host_ptr`] without the allocator when
/// the buffer it made last, and every view of it, is gone (a blocking call's, once it
/// returned); otherwise it allocates, and the slot keeps the new allocation.
#[derive(Default)]
pub(crate) struct HostSlot(Option<Arc<Mem>>);

impl HostSlot {
    /// `len` bytes at `ptr`, as [`Buffer::from_host_ptr`].
    ///
    /// # Safety
    /// As [`Buffer::from_host_ptr`].
    #[inline]
    pub(crate) unsafe fn view(&mut self, ptr: *mut u8, len: usize) -> Buffer {
        if len == 0 {
            return Buffer::zeroed(0);
        }
        let data = Storage::HostForeign(ptr);
        let mem = match self.0.take() {
            Some(mut a) => match Arc::get_mut(&mut a) {
                // Unique: no buffer or view of the old bytes is left, so no guard (guards
                // borrow a buffer) and no borrow.
                Some(m) => {
                    debug_assert!(m.fast.load(Relaxed) == 0 && m.slow.load(Relaxed) == 0);
                    m.data = data;
                    a
                }
                None => Mem::new(data),
            },
            None => Mem::new(data),
        };
        self.0 = Some(mem.clone());
        Buffer { mem, range: 0..len }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Buffer({:p}, {}..{})",
            Arc::as_ptr(&self.mem),
            self.range.start,
            self.range.end
        )
    }
}

impl Buffer {
    /// `bytes` zeroed bytes.
    pub fn zeroed(bytes: usize) -> Buffer {
        // One zeroed allocation (untouched pages stay lazy), not a store per byte.
        // SAFETY: all-zero bytes are a valid `UnsafeCell<u8>` (a transparent `u8`).
        let data: Box<[UnsafeCell<u8>]> = unsafe { Box::new_zeroed_slice(bytes).assume_init() };
        Buffer {
            mem: Mem::new(Storage::Host(data)),
            range: 0..bytes,
        }
    }

    /// A buffer over the caller's host memory (C ABI, Python), used in place (no copy)
    /// and never freed by strata. An empty range needs no memory (`ptr` may be NULL).
    ///
    /// # Safety
    /// `len` bytes at `ptr` are valid for reads and writes (a range strata only reads,
    /// for reads), stay allocated, and are touched by nobody else while the buffer (or
    /// a view of it, or work using it) lives.
    pub unsafe fn from_host_ptr(ptr: *mut u8, len: usize) -> Buffer {
        if len == 0 {
            return Buffer::zeroed(0);
        }
        Buffer {
            mem: Mem::new(Storage::HostForeign(ptr)),
            range: 0..len,
        }
    }

    /// `bytes` zeroed bytes of device memory on `dev`, freed when the last view is gone.
    pub fn on_device(dev: &Arc<dyn Device>, bytes: usize) -> Result<Buffer> {
        Ok(Buffer {
            mem: Mem::new(Storage::Device(DeviceMem::alloc(dev, bytes)?)),
            range: 0..bytes,
        })
    }

    /// `bytes` bytes of device memory on `dev` with unspecified contents, for work on
    /// `on` (a launched call's stream; [`DeviceMem::alloc_uninit_on`]): nothing waits
    /// for the device to hand it out.
    pub fn on_device_uninit(
        dev: &Arc<dyn Device>,
        bytes: usize,
        on: Option<&Arc<dyn DevStream>>,
    ) -> Result<Buffer> {
        Ok(Buffer {
            mem: Mem::new(Storage::Device(DeviceMem::alloc_uninit_on(dev, bytes, on)?)),
            range: 0..bytes,
        })
    }

    /// A buffer over the caller's device memory (C ABI, Python), never freed by strata.
    ///
    /// # Safety
    /// `len` bytes at `addr` are device memory of `dev`, stay allocated and are touched
    /// by nobody else while the buffer (or a view or work using it) lives.
    pub unsafe fn from_device_ptr(dev: &Arc<dyn Device>, addr: DevAddr, len: usize) -> Buffer {
        Buffer {
            // SAFETY: the caller's contract, passed on.
            mem: Mem::new(Storage::Device(unsafe {
                DeviceMem::foreign(dev, addr, len)
            })),
            range: 0..len,
        }
    }

    /// Zeroed scratch of `bytes` in the same place as this buffer (host, or its device).
    pub fn alloc_like(&self, bytes: usize) -> Result<Buffer> {
        match self.device() {
            None => Ok(Buffer::zeroed(bytes)),
            Some(d) => Buffer::on_device(d, bytes),
        }
    }

    /// [`Buffer::alloc_like`] for a launched call's work on `on` (its launch stream or a
    /// side stream): on the call's device, a block of its arena ([`Scope::alloc`]),
    /// cleared on `on` and held until the call ends.
    pub fn alloc_like_in(
        &self,
        bytes: usize,
        sc: &Scope,
        on: &Arc<dyn DevStream>,
    ) -> Result<Buffer> {
        let Some(d) = self.device() else {
            return Ok(Buffer::zeroed(bytes));
        };
        match sc.alloc(d, bytes, on) {
            Some(mem) => Ok(Buffer {
                mem: Mem::new(Storage::Device(mem?)),
                range: 0..bytes,
            }),
            None => Buffer::on_device(d, bytes),
        }
    }

    /// The device holding this buffer's memory (`None`: host memory).
    pub fn device(&self) -> Option<&Arc<dyn Device>> {
        match &self.mem.data {
            Storage::Host(_) | Storage::HostForeign(_) => None,
            Storage::Device(d) => Some(d.device()),
        }
    }

    /// True for device memory.
    pub fn is_device(&self) -> bool {
        self.device().is_some()
    }

    /// Shared access to device memory: the address of this view's first byte, valid
    /// while the guard lives. `InvalidUsage` for host memory.
    pub fn dev_read_timeout(&self, timeout: Duration) -> Result<DevGuard<'_>> {
        let addr = self.dev_addr()?;
        let id = self.mem.borrow(&self.range, false, timeout)?;
        Ok(DevGuard {
            buf: self,
            id,
            addr,
        })
    }

    /// Exclusive access to device memory (as [`Buffer::dev_read_timeout`]).
    pub fn dev_write_timeout(&self, timeout: Duration) -> Result<DevGuard<'_>> {
        let addr = self.dev_addr()?;
        let id = self.mem.borrow(&self.range, true, timeout)?;
        Ok(DevGuard {
            buf: self,
            id,
            addr,
        })
    }

    fn dev_addr(&self) -> Result<DevAddr> {
        match &self.mem.data {
            Storage::Device(d) => Ok(d.addr() + self.range.start as u64),
            Storage::Host(_) | Storage::HostForeign(_) => Err(Error::InvalidUsage(
                "host buffer where device memory was expected".into(),
            )),
        }
    }

    /// Zeroed room for `count` elements of `dtype`; errors on overflow.
    pub fn alloc(dtype: DataType, count: usize) -> Result<Buffer> {
        let bytes = count
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::InvalidArgument(format!("{count} x {dtype} overflows")))?;
        Ok(Buffer::zeroed(bytes))
    }

    /// A new buffer holding a copy of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Buffer {
        let b = Buffer::zeroed(bytes.len());
        b.write_bytes(bytes).expect("fresh buffer has no borrows");
        b
    }

    /// A new buffer holding a copy of `data`.
    pub fn from_slice<T: Element>(data: &[T]) -> Buffer {
        Buffer::from_bytes(bytemuck::cast_slice(data))
    }

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// True when the range is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// A sub-range (in bytes, relative to this view) sharing the same memory.
    pub fn slice(&self, r: Range<usize>) -> Result<Buffer> {
        if r.start > r.end || r.end > self.len() {
            return Err(Error::InvalidArgument(format!(
                "slice {}..{} out of a buffer of {} bytes",
                r.start,
                r.end,
                self.len()
            )));
        }
        Ok(Buffer {
            mem: self.mem.clone(),
            range: self.range.start + r.start..self.range.start + r.end,
        })
    }

    /// Shorten this view to its first `len` bytes (no more than it has), in place: what
    /// [`Buffer::slice`]`(0..len)` gives, without a new handle (the checks trim every
    /// request's buffers so).
    #[inline]
    pub fn truncate(&mut self, len: usize) {
        self.range.end = self.range.start + len.min(self.len());
    }

    /// True when both views are of the same allocation.
    pub fn same_memory(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.mem, &other.mem)
    }

    /// This view's identity: its allocation's address and its byte range (two live
    /// views have the same identity exactly when they are the same bytes of the same
    /// allocation). Debug builds' cross-check of the C boundary's requests, and tests.
    #[cfg(any(debug_assertions, test))]
    #[inline]
    pub(crate) fn identity(&self) -> [usize; 3] {
        [
            Arc::as_ptr(&self.mem) as usize,
            self.range.start,
            self.range.end,
        ]
    }

    /// True when both views share at least one byte.
    pub fn overlaps(&self, other: &Buffer) -> bool {
        self.same_memory(other) && overlap(&self.range, &other.range)
    }

    /// Byte offset of this view's start inside `outer`, if `outer` contains it.
    #[inline]
    pub fn offset_in(&self, outer: &Buffer) -> Option<usize> {
        (self.same_memory(outer)
            && self.range.start >= outer.range.start
            && self.range.end <= outer.range.end)
            .then(|| self.range.start - outer.range.start)
    }

    /// Shared access for reading, waiting up to `timeout` for writers on the range.
    /// `InvalidUsage` for device memory (see [`Buffer::dev_read_timeout`]).
    #[inline]
    pub fn read_timeout(&self, timeout: Duration) -> Result<ReadGuard<'_>> {
        self.mem.ptr()?;
        let id = self.mem.borrow(&self.range, false, timeout)?;
        Ok(ReadGuard { buf: self, id })
    }

    /// Exclusive access for writing, waiting up to `timeout` for other users of the range.
    /// `InvalidUsage` for device memory (see [`Buffer::dev_write_timeout`]).
    #[inline]
    pub fn write_timeout(&self, timeout: Duration) -> Result<WriteGuard<'_>> {
        self.mem.ptr()?;
        let id = self.mem.borrow(&self.range, true, timeout)?;
        Ok(WriteGuard { buf: self, id })
    }

    /// [`Buffer::read_timeout`] with the default timeout.
    pub fn read(&self) -> Result<ReadGuard<'_>> {
        self.read_timeout(DEFAULT_BORROW_TIMEOUT)
    }

    /// [`Buffer::write_timeout`] with the default timeout.
    pub fn write(&self) -> Result<WriteGuard<'_>> {
        self.write_timeout(DEFAULT_BORROW_TIMEOUT)
    }

    /// Copy of the bytes (waits for writers; device memory: a synchronous copy).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        match self.device() {
            None => Ok(self.read()?.to_vec()),
            Some(d) => {
                let g = self.dev_read_timeout(DEFAULT_BORROW_TIMEOUT)?;
                let mut v = vec![0u8; self.len()];
                if !v.is_empty() {
                    d.dtoh(&mut v, g.addr())?;
                }
                Ok(v)
            }
        }
    }

    /// Copy of the contents as elements of `T` (length must be a multiple of its size).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let g = self.to_bytes()?;
        if g.len() % std::mem::size_of::<T>() != 0 {
            return Err(Error::InvalidArgument(format!(
                "{} bytes is not a whole number of {}",
                g.len(),
                T::DTYPE
            )));
        }
        Ok(bytemuck::pod_collect_to_vec(&g))
    }

    /// Overwrite the whole view with `bytes` (lengths must match).
    pub fn write_bytes(&self, bytes: &[u8]) -> Result<()> {
        if bytes.len() != self.len() {
            return Err(Error::InvalidArgument(format!(
                "writing {} bytes into a view of {}",
                bytes.len(),
                self.len()
            )));
        }
        match self.device() {
            None => self.write()?.copy_from_slice(bytes),
            Some(d) => {
                let g = self.dev_write_timeout(DEFAULT_BORROW_TIMEOUT)?;
                if !bytes.is_empty() {
                    d.htod(g.addr(), bytes)?;
                }
            }
        }
        Ok(())
    }

    /// Overwrite the whole view with `data`.
    pub fn write_slice<T: Element>(&self, data: &[T]) -> Result<()> {
        self.write_bytes(bytemuck::cast_slice(data))
    }
}

/// A borrow of device memory (shared or exclusive); released on drop.
pub struct DevGuard<'a> {
    buf: &'a Buffer,
    id: u64,
    addr: DevAddr,
}

impl DevGuard<'_> {
    /// Device address of the view's first byte.
    pub fn addr(&self) -> DevAddr {
        self.addr
    }
    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    /// True for an empty view.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    /// The view as a [`crate::device::Region`].
    pub fn region(&self) -> crate::device::Region {
        crate::device::Region {
            addr: self.addr,
            len: self.buf.len(),
        }
    }
}

impl Drop for DevGuard<'_> {
    fn drop(&mut self) {
        self.buf.mem.release(self.id);
    }
}

/// Shared access to a buffer's bytes; released on drop.
pub struct ReadGuard<'a> {
    buf: &'a Buffer,
    id: u64,
}

/// Exclusive access to a buffer's bytes; released on drop.
pub struct WriteGuard<'a> {
    buf: &'a Buffer,
    id: u64,
}

impl Deref for ReadGuard<'_> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        let (p, n) = guarded(self.buf);
        // SAFETY: `guarded`'s bytes, on which the borrow table holds a shared borrow, so
        // no `WriteGuard` overlaps them while we live.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

impl Deref for WriteGuard<'_> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        let (p, n) = guarded(self.buf);
        // SAFETY: `guarded`'s bytes; the exclusive borrow excludes every other guard on
        // the range.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

impl DerefMut for WriteGuard<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        let (p, n) = guarded(self.buf);
        // SAFETY: `guarded`'s bytes; the exclusive borrow makes this the only live
        // reference to them, and `&mut self` keeps it unique within this guard.
        unsafe { std::slice::from_raw_parts_mut(p, n) }
    }
}

/// The first host byte of a guarded buffer's range and its length.
#[inline]
fn guarded(b: &Buffer) -> (*mut u8, usize) {
    let r = &b.range;
    // SAFETY: the range lies inside the host allocation (checked by `slice`; guards exist
    // only for host memory), so the offset stays within it.
    (unsafe { host_ptr(b).add(r.start) }, r.len())
}

/// Host base pointer of a guarded buffer (guards are only made for host memory).
#[inline]
fn host_ptr(b: &Buffer) -> *mut u8 {
    match &b.mem.data {
        Storage::Host(d) => UnsafeCell::raw_get(d.as_ptr()),
        Storage::HostForeign(p) => *p,
        Storage::Device(_) => unreachable!("host guards are refused for device memory"),
    }
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.buf.mem.release(self.id);
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.buf.mem.release(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_host_memory_is_used_in_place() {
        let mut mine = vec![7u8; 32];
        // SAFETY: `mine` outlives `b` and is not touched while `b` lives.
        let b = unsafe { Buffer::from_host_ptr(mine.as_mut_ptr(), mine.len()) };
        assert!(b.device().is_none());
        b.slice(8..16).unwrap().write().unwrap().fill(1);
        assert_eq!(&b.read().unwrap()[6..10], &[7, 7, 1, 1]);
        let w = b.slice(0..16).unwrap();
        let _g = w.write().unwrap();
        assert!(
            b.read_timeout(Duration::from_millis(5)).is_err(),
            "borrows still tracked"
        );
        drop(_g);
        drop(w);
        drop(b);
        assert_eq!(&mine[6..10], &[7, 7, 1, 1], "written where it lives");
        // SAFETY: empty range: no memory is touched.
        let e = unsafe { Buffer::from_host_ptr(std::ptr::null_mut(), 0) };
        assert_eq!(e.len(), 0);
    }

    /// A slot reuses its allocation once every view of its last buffer is gone, and
    /// allocates anew while one lives; a reused buffer is the new memory, borrowed afresh.
    #[test]
    fn a_host_slot_reuses_its_allocation_only_when_free() {
        let (mut a, mut b) = (vec![1u8; 16], vec![2u8; 8]);
        let mut slot = HostSlot::default();
        // SAFETY: `a` and `b` outlive the buffers and are not touched while they live.
        let x = unsafe { slot.view(a.as_mut_ptr(), a.len()) };
        let first = x.identity()[0];
        let held = x.slice(4..8).unwrap();
        let g = held.write().unwrap();
        drop(x);
        // SAFETY: as above.
        let y = unsafe { slot.view(b.as_mut_ptr(), b.len()) };
        assert_ne!(
            y.identity()[0],
            first,
            "a view of the old buffer lives: fresh"
        );
        assert_eq!(&y.read().unwrap()[..], &[2u8; 8]);
        drop(g);
        drop((held, y));
        // SAFETY: as above.
        let z = unsafe { slot.view(a.as_mut_ptr(), 12) };
        let again = z.identity()[0];
        drop(z);
        // SAFETY: as above.
        let w = unsafe { slot.view(b.as_mut_ptr(), b.len()) };
        assert_eq!(w.identity()[0], again, "nothing else holds it: reused");
        assert_eq!(w.len(), 8);
        w.write().unwrap().fill(9);
        assert!(w.read_timeout(Duration::from_millis(5)).is_ok());
        drop(w);
        assert_eq!(b, [9u8; 8]);
        assert_eq!(a, [1u8; 16]);
    }

    #[test]
    fn disjoint_writes_coexist_overlapping_wait() {
        let b = Buffer::zeroed(16);
        let lo = b.slice(0..8).unwrap();
        let hi = b.slice(8..16).unwrap();
        let mut g1 = lo.write().unwrap();
        let mut g2 = hi.write().unwrap();
        g1.fill(1);
        g2.fill(2);
        assert!(b.read_timeout(Duration::from_millis(20)).is_err());
        drop(g1);
        drop(g2);
        assert_eq!(b.to_bytes().unwrap(), [[1u8; 8], [2u8; 8]].concat());
        let _r1 = b.read().unwrap();
        let _r2 = lo.read().unwrap();
        assert!(hi.write_timeout(Duration::from_millis(10)).is_err());
    }

    /// The lock-free slot and the table respect each other: a borrow held in the slot
    /// blocks an overlapping one taken through the table and lets a disjoint one by,
    /// and the slot is free again once its guard is gone.
    #[test]
    fn the_fast_slot_and_the_table_exclude_each_other() {
        let b = Buffer::zeroed(32);
        let (lo, hi) = (b.slice(0..16).unwrap(), b.slice(16..32).unwrap());
        let g = lo.write().unwrap();
        assert_ne!(
            b.mem.fast.load(SeqCst),
            0,
            "the first borrow takes the slot"
        );
        let short = Duration::from_millis(5);
        assert!(b.read_timeout(short).is_err(), "overlaps the slot's borrow");
        assert_eq!(
            b.mem.slow.load(SeqCst),
            0,
            "a timed-out borrower is not counted"
        );
        let h = hi.read().unwrap(); // disjoint: through the table
        assert_eq!(b.mem.slow.load(SeqCst), 1);
        assert!(
            hi.write_timeout(short).is_err(),
            "the table's shared borrow holds"
        );
        drop(g);
        assert_eq!(b.mem.fast.load(SeqCst), 0);
        // With a table entry standing, a new borrow takes the table, not the slot.
        let g = lo.read().unwrap();
        assert_eq!(b.mem.fast.load(SeqCst), 0);
        drop((g, h));
        assert_eq!(b.mem.slow.load(SeqCst), 0);
        let _g = b.write().unwrap();
        assert_ne!(
            b.mem.fast.load(SeqCst),
            0,
            "the slot again once the table is empty"
        );
    }

    /// Threads take overlapping and disjoint ranges, shared and exclusive, each through
    /// whichever of the slot and the table it gets: no byte ever has a writer beside
    /// another user (counted per byte while held), and a waiter is always woken.
    #[test]
    fn racing_borrows_never_overlap_a_writer() {
        use std::sync::atomic::AtomicIsize;
        let b = Buffer::zeroed(24);
        // Per byte: readers holding it, or -1 for a writer.
        let held: Vec<AtomicIsize> = (0..24).map(|_| AtomicIsize::new(0)).collect();
        let ranges = [0..8, 4..12, 8..16, 0..24, 16..24, 12..20];
        let rounds = if cfg!(miri) { 6 } else { 2000 };
        std::thread::scope(|s| {
            for t in 0..4usize {
                let (b, held, ranges) = (&b, &held, &ranges);
                s.spawn(move || {
                    for i in 0..rounds {
                        let r = ranges[(t * 7 + i * 5) % ranges.len()].clone();
                        let part = b.slice(r.clone()).unwrap();
                        if (t + i) % 3 == 0 {
                            let _g = part.write_timeout(Duration::from_secs(60)).unwrap();
                            for h in &held[r.clone()] {
                                assert_eq!(h.swap(-1, SeqCst), 0, "a writer beside a user");
                            }
                            for h in &held[r] {
                                h.store(0, SeqCst);
                            }
                        } else {
                            let _g = part.read_timeout(Duration::from_secs(60)).unwrap();
                            for h in &held[r.clone()] {
                                assert!(h.fetch_add(1, SeqCst) >= 0, "a reader beside a writer");
                            }
                            for h in &held[r] {
                                h.fetch_sub(1, SeqCst);
                            }
                        }
                    }
                });
            }
        });
        assert_eq!(b.mem.fast.load(SeqCst), 0);
        assert_eq!(b.mem.slow.load(SeqCst), 0);
    }

    #[test]
    fn threads_write_disjoint_ranges_and_read_back() {
        let b = Buffer::zeroed(64);
        std::thread::scope(|s| {
            for i in 0..4u8 {
                let part = b.slice(i as usize * 16..(i as usize + 1) * 16).unwrap();
                s.spawn(move || {
                    for round in 0..3u8 {
                        part.write().unwrap().fill(i * 10 + round);
                        assert!(part.read().unwrap().iter().all(|&x| x == i * 10 + round));
                    }
                });
            }
            // Readers of the whole buffer wait for the writers (or time out): never a torn
            // view of a range being written.
            s.spawn(|| {
                for _ in 0..3 {
                    if let Ok(g) = b.read_timeout(Duration::from_millis(50)) {
                        for c in g.chunks(16) {
                            assert!(c.iter().all(|&x| x == c[0]));
                        }
                    }
                }
            });
        });
        let got = b.to_bytes().unwrap();
        for i in 0..4u8 {
            assert!(got[i as usize * 16..][..16]
                .iter()
                .all(|&x| x == i * 10 + 2));
        }
    }

    #[test]
    fn views_and_offsets() {
        let b = Buffer::from_slice(&[1.0f32, 2.0, 3.0, 4.0]);
        let v = b.slice(4..12).unwrap();
        assert_eq!(v.to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
        assert_eq!(v.offset_in(&b), Some(4));
        assert!(v.overlaps(&b));
        assert!(b.slice(3..20).is_err());
        assert!(Buffer::alloc(DataType::F32, usize::MAX).is_err());
    }
}
