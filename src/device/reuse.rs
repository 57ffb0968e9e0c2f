//! What a device keeps to spare driver calls on a collective's hot path (contract
//! "launch cost"): free event handles for the next record ([`HandlePool`]: a
//! steady-state call creates and destroys no event, as NCCL and PyTorch pool theirs),
//! and the allocation ranges already checked to be its memory ([`CheckedRanges`]: a
//! pointer inside one costs no driver query; NCCL queries none by default).

#![forbid(unsafe_code)]

use super::DevAddr;
use std::any::Any;
use std::sync::{Arc, Mutex, RwLock};

/// Free handles (events) of one device, destroyed with the pool. Every handle taken
/// holds the pool, and the pool holds what the handles need alive (a CUDA context: an
/// event of a destroyed context is a dangling handle), so that outlives the device
/// while an event is still watched or waited on.
pub struct HandlePool {
    free: Mutex<Vec<usize>>,
    destroy: fn(usize),
    /// Released after the free handles are destroyed (fields drop after `drop`).
    _owner: Option<Arc<dyn Any + Send + Sync>>,
}

impl HandlePool {
    /// An empty pool; `destroy` ends a handle left in it when the pool is dropped, and
    /// `owner` (the context the handles belong to) is released after that.
    pub fn new(destroy: fn(usize), owner: Option<Arc<dyn Any + Send + Sync>>) -> HandlePool {
        HandlePool {
            free: Mutex::new(Vec::new()),
            destroy,
            _owner: owner,
        }
    }

    /// A free handle, if any.
    pub fn take(&self) -> Option<usize> {
        self.free.lock().ok().and_then(|mut f| f.pop())
    }

    /// `h` is free again (nobody holds it).
    pub fn give(&self, h: usize) {
        match self.free.lock() {
            Ok(mut f) => f.push(h),
            Err(_) => (self.destroy)(h),
        }
    }
}

impl Drop for HandlePool {
    fn drop(&mut self) {
        let free = self.free.get_mut().map(std::mem::take).unwrap_or_default();
        free.into_iter().for_each(self.destroy);
    }
}

/// Ranges kept: a call's buffers are usually a few long-lived allocations (a
/// framework's caching allocator), so a handful covers the steady state.
const KEPT: usize = 64;

/// Allocation ranges `[start, end)` found to be memory of one device. A range strata
/// frees leaves it ([`CheckedRanges::forget`]); one the caller frees and the driver
/// hands to another device is the vendor library's to refuse.
#[derive(Default)]
pub struct CheckedRanges(RwLock<Vec<(DevAddr, DevAddr)>>);

impl CheckedRanges {
    /// True when `p` lies in a range checked before.
    pub fn known(&self, p: DevAddr) -> bool {
        self.0
            .read()
            .is_ok_and(|r| r.iter().any(|&(a, b)| a <= p && p < b))
    }

    /// Keep `[start, start + len)` (the oldest range goes past `KEPT`).
    pub fn keep(&self, start: DevAddr, len: usize) {
        if len == 0 {
            return;
        }
        if let Ok(mut r) = self.0.write() {
            if r.len() >= KEPT {
                r.remove(0);
            }
            r.push((start, start + len as u64));
        }
    }

    /// `addr` is being freed: the ranges holding it are checked again next time.
    pub fn forget(&self, addr: DevAddr) {
        if let Ok(mut r) = self.0.write() {
            r.retain(|&(a, b)| !(a <= addr && addr < b));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static DESTROYED: AtomicUsize = AtomicUsize::new(0);

    #[test]
    fn handles_are_reused_and_destroyed_with_the_pool() {
        let owner: Arc<dyn Any + Send + Sync> = Arc::new(());
        let p = HandlePool::new(
            |_| {
                DESTROYED.fetch_add(1, Ordering::SeqCst);
            },
            Some(owner.clone()),
        );
        assert_eq!(Arc::strong_count(&owner), 2, "the pool holds its owner");
        assert_eq!(p.take(), None);
        p.give(7);
        p.give(9);
        assert_eq!(p.take(), Some(9));
        drop(p);
        assert_eq!(DESTROYED.load(Ordering::SeqCst), 1);
        assert_eq!(Arc::strong_count(&owner), 1, "released with the pool");
    }

    #[test]
    fn ranges_are_known_until_forgotten_and_bounded() {
        let r = CheckedRanges::default();
        r.keep(0x1000, 0x100);
        assert!(r.known(0x1000) && r.known(0x10ff) && !r.known(0x1100) && !r.known(0xfff));
        r.forget(0x1080);
        assert!(!r.known(0x1000));
        for i in 0..(KEPT as u64 + 5) {
            r.keep(0x10_0000 * (i + 1), 16);
        }
        assert!(!r.known(0x10_0000), "the oldest range left");
        assert!(r.known(0x10_0000 * (KEPT as u64 + 5)));
    }
}
