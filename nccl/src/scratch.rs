//! Host scratch buffers for the calls this library composes (PreMulSum's scaled input,
//! a non-root rank's `ncclReduce` result): per thread, reused, 8-byte aligned. A buffer
//! used by a call inside a strata group is held until that group has ended
//! ([`release_held`]), since strata reads it then; otherwise it returns to the pool at
//! once. Steady state: no allocation.

use std::cell::RefCell;

thread_local! {
    static FREE: RefCell<Vec<Vec<u64>>> = const { RefCell::new(Vec::new()) };
    static HELD: RefCell<Vec<Vec<u64>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of at least `bytes` bytes (contents unspecified).
pub fn take(bytes: usize) -> Vec<u64> {
    let words = bytes.div_ceil(8).max(1);
    let mut v = FREE.with(|f| {
        let mut f = f.borrow_mut();
        // The smallest free buffer that fits, else the largest (grown below).
        match f
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= words)
            .min_by_key(|(_, b)| b.len())
        {
            Some((i, _)) => f.swap_remove(i),
            None => f.pop().unwrap_or_default(),
        }
    });
    if v.len() < words {
        v.resize(words, 0);
    }
    v
}

/// Give a buffer back: held until the open strata group ends, else free now.
pub fn give(v: Vec<u64>) {
    if strata::runtime::group::in_group() {
        HELD.with(|h| h.borrow_mut().push(v));
    } else {
        FREE.with(|f| f.borrow_mut().push(v));
    }
}

/// The strata group this thread ran has ended: its buffers are free again.
pub fn release_held() {
    let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    FREE.with(|f| f.borrow_mut().extend(held));
}
