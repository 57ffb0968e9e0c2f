//! The per-device cache of freed memory, so a collective repeated with the same shape
//! allocates nothing after its first call (as PyTorch's caching allocator): a
//! [`super::DeviceMem`] that strata allocated goes back here when dropped, by size
//! class, and the next allocation of that class takes it (zeroed again on the device's
//! private stream, without waiting for any other stream). Allocating and freeing through
//! the runtime (`cuMemAlloc`, `cuMemFree`) can synchronize the whole device, which a
//! stream-ordered collective must never do while the caller's stream waits for it.
//!
//! Blocks are returned only once their work has run (strata's device paths finish their
//! work before a buffer is dropped); the cache is released to the runtime when the
//! device object is dropped or by [`super::release_cached`].

#![forbid(unsafe_code)]

use super::DevAddr;
use std::collections::HashMap;
use std::sync::Mutex;

/// Freed blocks of one device, by size class.
#[derive(Debug, Default)]
pub struct Pool {
    free: Mutex<HashMap<usize, Vec<DevAddr>>>,
}

impl Pool {
    /// The size class of a request: 512-byte steps up to 1 MiB, then 1 MiB steps.
    pub fn class(bytes: usize) -> usize {
        const SMALL: usize = 512;
        const BIG: usize = 1 << 20;
        if bytes <= BIG {
            bytes.div_ceil(SMALL) * SMALL
        } else {
            bytes.div_ceil(BIG).saturating_mul(BIG)
        }
    }

    /// A cached block of `class` bytes, if any.
    pub fn take(&self, class: usize) -> Option<DevAddr> {
        self.free.lock().ok()?.get_mut(&class)?.pop()
    }

    /// Keep `addr` (a block of `class` bytes whose work has run) for reuse.
    pub fn put(&self, class: usize, addr: DevAddr) {
        if let Ok(mut f) = self.free.lock() {
            f.entry(class).or_default().push(addr);
        }
    }

    /// Every cached block, removed from the cache.
    pub fn drain(&self) -> Vec<DevAddr> {
        self.free
            .lock()
            .map(|mut f| f.drain().flat_map(|(_, v)| v).collect())
            .unwrap_or_default()
    }

    /// Bytes held in the cache.
    pub fn cached_bytes(&self) -> usize {
        self.free
            .lock()
            .map(|f| f.iter().map(|(c, v)| c * v.len()).sum())
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_and_blocks_are_reused_by_class() {
        assert_eq!(Pool::class(1), 512);
        assert_eq!(Pool::class(512), 512);
        assert_eq!(Pool::class(513), 1024);
        assert_eq!(Pool::class((1 << 20) + 1), 2 << 20);
        let p = Pool::default();
        assert_eq!(p.take(512), None);
        p.put(512, 4096);
        assert_eq!(p.cached_bytes(), 512);
        assert_eq!(p.take(1024), None);
        assert_eq!(p.take(512), Some(4096));
        p.put(1024, 8192);
        assert_eq!(p.drain(), vec![8192]);
        assert_eq!(p.cached_bytes(), 0);
    }
}
