//! [`Slots`]: the table behind the C ABI's opaque handles (communicators in
//! `registry.rs`, host streams and events in `stream.rs`).

#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

/// A table of live objects behind opaque C handles, with no process-wide lock on the
/// lookup path: the k-th object ever inserted gets the key `base + k * SLOT_STEP` and
/// lives in slot k of an append-only table (chunks of 64, 128, 256, ... slots, each made
/// once and never moved or freed). Looking a key up is arithmetic, an atomic load and a
/// read of that one slot's own lock (padded to a cache line, so calls on different
/// communicators share no written memory); only insert and remove write a slot. Keys are
/// never reused and never dereferenced, so a removed key is recognised as such and a
/// foreign value as foreign.
pub(crate) struct Slots<T> {
    base: usize,
    /// How many keys were handed out (the next key's index).
    issued: AtomicUsize,
    chunks: [OnceLock<Box<[Slot<T>]>>; SLOT_CHUNKS],
}

/// One slot: its object while live. Cache-line aligned: a call's read of its slot never
/// touches the line another communicator's calls read.
#[repr(align(64))]
struct Slot<T>(RwLock<Option<Arc<T>>>);

/// What a key names in a [`Slots`] table.
pub(crate) enum Found<T> {
    Live(Arc<T>),
    /// Issued by this table and removed since.
    Gone,
    /// Never issued by this table.
    Foreign,
}

/// Distance between two keys of one table.
const SLOT_STEP: usize = 0x10;
/// Slots in the first chunk; chunk `c` has `SLOT_FIRST << c`.
const SLOT_FIRST: usize = 64;
const SLOT_CHUNKS: usize = 18;
/// Keys one table can hand out (just under 2^24).
const SLOT_CAPACITY: usize = SLOT_FIRST * ((1 << SLOT_CHUNKS) - 1);

/// (chunk, index in it) of slot `k` (`k < SLOT_CAPACITY`).
fn locate(k: usize) -> (usize, usize) {
    let j = k / SLOT_FIRST + 1;
    let c = (usize::BITS - 1 - j.leading_zeros()) as usize;
    (c, k - SLOT_FIRST * ((1 << c) - 1))
}

impl<T> Slots<T> {
    pub(crate) const fn new(base: usize) -> Slots<T> {
        Slots {
            base,
            issued: AtomicUsize::new(0),
            chunks: [const { OnceLock::new() }; SLOT_CHUNKS],
        }
    }

    fn read(s: &Slot<T>) -> std::sync::RwLockReadGuard<'_, Option<Arc<T>>> {
        s.0.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(s: &Slot<T>) -> std::sync::RwLockWriteGuard<'_, Option<Arc<T>>> {
        s.0.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Store `v` under a new key; `what` names the objects in the error when the table is
    /// full.
    pub(crate) fn insert(&self, v: T, what: &str) -> Result<usize> {
        let k = self.issued.fetch_add(1, Ordering::AcqRel);
        if k >= SLOT_CAPACITY {
            return Err(Error::Internal(format!("{what} handles exhausted")));
        }
        let (c, i) = locate(k);
        let chunk = self.chunks[c].get_or_init(|| {
            (0..SLOT_FIRST << c)
                .map(|_| Slot(RwLock::new(None)))
                .collect()
        });
        *Self::write(&chunk[i]) = Some(Arc::new(v));
        Ok(self.base + k * SLOT_STEP)
    }

    /// The slot index of `key` when this table issued it.
    fn index(&self, key: usize) -> Option<usize> {
        let off = key.checked_sub(self.base)?;
        let k = off / SLOT_STEP;
        let issued = self.issued.load(Ordering::Acquire).min(SLOT_CAPACITY);
        (off % SLOT_STEP == 0 && k < issued).then_some(k)
    }

    fn slot(&self, k: usize) -> Option<&Slot<T>> {
        let (c, i) = locate(k);
        self.chunks[c].get().map(|chunk| &chunk[i])
    }

    /// What `key` names: one slot read, no table-wide lock.
    pub(crate) fn get(&self, key: usize) -> Found<T> {
        self.found(key, |s| Self::read(s).clone())
    }

    /// Take the object out of `key`'s slot: later lookups see [`Found::Gone`]. Of two
    /// concurrent removes of one key, one gets the object.
    pub(crate) fn remove(&self, key: usize) -> Found<T> {
        self.found(key, |s| Self::write(s).take())
    }

    /// [`Found::Foreign`] for a key this table never issued, else what `at` gets from
    /// its slot ([`Found::Gone`] for nothing).
    fn found(&self, key: usize, at: impl FnOnce(&Slot<T>) -> Option<Arc<T>>) -> Found<T> {
        let Some(k) = self.index(key) else {
            return Found::Foreign;
        };
        match self.slot(k).and_then(at) {
            Some(v) => Found::Live(v),
            None => Found::Gone,
        }
    }
}
