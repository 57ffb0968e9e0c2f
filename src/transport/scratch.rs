//! Per-thread scratch buffers for the transports' defaults, the ring algorithms
//! ([`super::ring`]) and the host log-step algorithms: partial sums and received
//! operands, kept between calls so a stream thread allocates and faults in its scratch
//! once, not per call.

#![forbid(unsafe_code)]

use std::cell::RefCell;

thread_local! {
    /// This thread's free scratch buffers: a stack, so nested users each get their own.
    /// An allocation cache: no call's state survives in it (each user takes a buffer and
    /// gives it back).
    static SCRATCH: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// Run `f` on `n` bytes of this thread's scratch (contents unspecified).
pub(crate) fn with_scratch<R>(n: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    let mut v = SCRATCH
        .try_with(|s| s.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default();
    if v.len() < n {
        v.resize(n, 0);
    }
    let r = f(&mut v[..n]);
    let _ = SCRATCH.try_with(|s| {
        let mut s = s.borrow_mut();
        // Keep a few: the usual nesting is two deep.
        if s.len() < 4 {
            s.push(v);
        }
    });
    r
}
