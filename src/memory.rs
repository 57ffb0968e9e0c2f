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
//! This module holds the only `unsafe` outside FFI and the C ABI: the borrow table is
//! what makes the raw slices it hands out sound.

use crate::dtype::{DataType, Element};
use crate::error::{Error, Result};
use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut, Range};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

struct Mem {
    data: Box<[UnsafeCell<u8>]>,
    /// Active borrows: (byte range, exclusive, id).
    borrows: Mutex<Vec<(Range<usize>, bool, u64)>>,
    freed: Condvar,
    next_id: std::sync::atomic::AtomicU64,
}

// SAFETY: the bytes are only reached through `ReadGuard`/`WriteGuard`, which the borrow
// table admits only when no exclusive borrow overlaps a shared one or another exclusive
// one; `UnsafeCell<u8>` has no other interior state.
unsafe impl Sync for Mem {}
// SAFETY: as above; the memory is plain bytes owned by the `Box`.
unsafe impl Send for Mem {}

fn overlap(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// How long a borrow waits before it reports a usage error (overridable per call).
pub const DEFAULT_BORROW_TIMEOUT: Duration = Duration::from_secs(120);

impl Mem {
    fn borrow(&self, r: &Range<usize>, exclusive: bool, timeout: Duration) -> Result<u64> {
        let deadline = Instant::now() + timeout;
        let mut b = self
            .borrows
            .lock()
            .map_err(|_| Error::Internal("buffer lock poisoned".into()))?;
        loop {
            let busy = !r.is_empty()
                && b.iter()
                    .any(|(o, ex, _)| (exclusive || *ex) && overlap(o, r));
            if !busy {
                let id = self
                    .next_id
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                b.push((r.clone(), exclusive, id));
                return Ok(id);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::InvalidUsage(format!(
                    "buffer bytes {}..{} stayed in use by other work for {:?}: overlapping work on two \
                     communicators needs a dependency between them",
                    r.start, r.end, timeout
                )));
            }
            b = self
                .freed
                .wait_timeout(b, deadline - now)
                .map_err(|_| Error::Internal("buffer lock poisoned".into()))?
                .0;
        }
    }

    fn release(&self, id: u64) {
        if let Ok(mut b) = self.borrows.lock() {
            b.retain(|(_, _, i)| *i != id);
        }
        self.freed.notify_all();
    }

    fn ptr(&self) -> *mut u8 {
        UnsafeCell::raw_get(self.data.as_ptr())
    }
}

/// A handle to a byte range of strata-owned host memory. Cloning shares the memory.
#[derive(Clone)]
pub struct Buffer {
    mem: Arc<Mem>,
    range: Range<usize>,
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
        let data: Box<[UnsafeCell<u8>]> = (0..bytes).map(|_| UnsafeCell::new(0u8)).collect();
        Buffer {
            mem: Arc::new(Mem {
                data,
                borrows: Mutex::new(Vec::new()),
                freed: Condvar::new(),
                next_id: 0.into(),
            }),
            range: 0..bytes,
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
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// True when the range is empty.
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

    /// True when both views are of the same allocation.
    pub fn same_memory(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.mem, &other.mem)
    }

    /// True when both views share at least one byte.
    pub fn overlaps(&self, other: &Buffer) -> bool {
        self.same_memory(other) && overlap(&self.range, &other.range)
    }

    /// Byte offset of this view's start inside `outer`, if `outer` contains it.
    pub fn offset_in(&self, outer: &Buffer) -> Option<usize> {
        (self.same_memory(outer)
            && self.range.start >= outer.range.start
            && self.range.end <= outer.range.end)
            .then(|| self.range.start - outer.range.start)
    }

    /// Shared access for reading, waiting up to `timeout` for writers on the range.
    pub fn read_timeout(&self, timeout: Duration) -> Result<ReadGuard<'_>> {
        let id = self.mem.borrow(&self.range, false, timeout)?;
        Ok(ReadGuard { buf: self, id })
    }

    /// Exclusive access for writing, waiting up to `timeout` for other users of the range.
    pub fn write_timeout(&self, timeout: Duration) -> Result<WriteGuard<'_>> {
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

    /// Copy of the bytes (waits for writers).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        Ok(self.read()?.to_vec())
    }

    /// Copy of the contents as elements of `T` (length must be a multiple of its size).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let g = self.read()?;
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
        self.write()?.copy_from_slice(bytes);
        Ok(())
    }

    /// Overwrite the whole view with `data`.
    pub fn write_slice<T: Element>(&self, data: &[T]) -> Result<()> {
        self.write_bytes(bytemuck::cast_slice(data))
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
    fn deref(&self) -> &[u8] {
        let r = &self.buf.range;
        // SAFETY: the range lies inside the allocation (checked by `slice`) and the borrow
        // table holds a shared borrow on it, so no `WriteGuard` overlaps it while we live.
        unsafe { std::slice::from_raw_parts(self.buf.mem.ptr().add(r.start), r.len()) }
    }
}

impl Deref for WriteGuard<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let r = &self.buf.range;
        // SAFETY: in bounds, and the exclusive borrow excludes every other guard on the range.
        unsafe { std::slice::from_raw_parts(self.buf.mem.ptr().add(r.start), r.len()) }
    }
}

impl DerefMut for WriteGuard<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        let r = &self.buf.range;
        // SAFETY: in bounds; the exclusive borrow makes this the only live reference to
        // these bytes, and `&mut self` keeps it unique within this guard.
        unsafe { std::slice::from_raw_parts_mut(self.buf.mem.ptr().add(r.start), r.len()) }
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
