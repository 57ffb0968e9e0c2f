//! The CPU device's memory table: host memory allocated 256-byte aligned, a device
//! address being its pointer, and the table of live mappings every operation's bounds
//! are checked against (one allocation, or adjacent mappings of one from
//! [`super::alloc_mapped`]).

use crate::device::Region;
use crate::error::{Error, Result};
use std::alloc::Layout;
use std::collections::BTreeMap;

/// Alignment of every allocation (as `cudaMalloc`'s 256 bytes).
pub(super) const ALIGN: usize = 256;

/// A device error of the CPU device (as a fault a GPU reports).
pub(super) fn dev_err(m: impl std::fmt::Display) -> Error {
    Error::Device(format!("cpu device: {m}"))
}

/// True when two non-empty regions share a byte.
pub(super) fn overlap(a: Region, b: Region) -> bool {
    a.len > 0 && b.len > 0 && a.addr < b.addr + b.len as u64 && b.addr < a.addr + a.len as u64
}

/// The live allocations of one device.
#[derive(Debug, Default)]
pub(super) struct Table {
    /// Live mappings: start -> length. An allocation of `alloc_zeroed` is one mapping;
    /// one of `alloc_mapped` several adjacent ones (listed in `mapped`).
    pub(super) live: BTreeMap<u64, usize>,
    /// Host allocations of several mappings: start -> total length (its layout).
    pub(super) mapped: BTreeMap<u64, usize>,
}

/// Where a range lies in the live mappings.
pub(super) enum Cover {
    /// Inside live mappings of one host allocation.
    Inside,
    /// It starts in live memory and runs past the end of the mapping `l` bytes at `a`
    /// (the last of the adjacent ones it covers).
    PastEnd { a: u64, l: usize },
    /// It does not start in live memory.
    Outside,
}

impl Table {
    /// The multi-mapping allocation `addr` lies in: (start, total length).
    pub(super) fn mapped_range(&self, addr: u64) -> Option<(u64, usize)> {
        self.mapped
            .range(..=addr)
            .next_back()
            .filter(|(&b, &t)| addr < b + t as u64)
            .map(|(&b, &t)| (b, t))
    }

    /// Whether `len > 0` bytes at `addr` lie in live mappings: the mapping holding
    /// `addr`, then each live mapping starting where the previous one ends, within one
    /// host allocation (so a region is always inside one allocated object).
    pub(super) fn cover(&self, addr: u64, len: usize) -> Cover {
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

    /// Take the allocation of `alloc_zeroed` at `addr` out of the table: its length, or
    /// `None` when `addr` is no such allocation (a mapping of `alloc_mapped` included,
    /// which only `free_mapped` frees).
    pub(super) fn take_plain(&mut self, addr: u64) -> Option<usize> {
        if self.mapped_range(addr).is_some() {
            return None;
        }
        self.live.remove(&addr)
    }

    /// Take the allocation of `alloc_mapped` at `addr` (all its mappings) out of the
    /// table: its total length, or `None` when `addr` is no such allocation.
    pub(super) fn take_mapped(&mut self, addr: u64) -> Option<usize> {
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
    pub(super) fn take_any(&mut self, addr: u64) -> Option<usize> {
        self.take_mapped(addr).or_else(|| self.take_plain(addr))
    }
}

/// `bytes > 0` zeroed bytes of host memory, aligned as every allocation; the caller
/// records them in the table.
pub(super) fn host_alloc(bytes: usize) -> Result<u64> {
    let layout = Layout::from_size_align(bytes, ALIGN)
        .map_err(|e| Error::InvalidArgument(format!("cpu device: {bytes} bytes: {e}")))?;
    // SAFETY: a non-zero size with a valid layout.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err(dev_err(format!("out of memory allocating {bytes} bytes")));
    }
    Ok(p as usize as u64)
}

/// Give back memory of [`host_alloc`].
pub(super) fn dealloc(addr: u64, len: usize) {
    if let Ok(l) = Layout::from_size_align(len, ALIGN) {
        // SAFETY: `addr` came from `host_alloc` with this layout (`len` is the whole
        // allocation's length, all mappings of a mapped one) and is freed once (taken
        // out of the live table by the caller).
        unsafe { std::alloc::dealloc(addr as usize as *mut u8, l) };
    }
}
