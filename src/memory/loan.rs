//! Loans: a thread lends a slice it holds to another thread for the length of one
//! blocking call, so bytes move once, straight from the lender's memory into the
//! borrower's (the zero-copy hand-off of the `local` transport).
//!
//! [`lend`] runs a closure with an `Arc<Loan>` that can be handed to another thread;
//! when the closure ends, normally or by unwinding, the loan is settled: revoked if no
//! one took it, waited for if a borrower is reading it. A borrower reaches the bytes only
//! inside [`Loan::take`], once per loan, so the slice is never read after `lend` returns.
//! `take`'s closure must not block (it copies or reduces; it never waits on anyone),
//! which bounds how long settling can wait.
//!
//! Waits spin briefly ([`spin_until`]) before they park: on a machine with a core per
//! rank, the peer usually answers within microseconds, and a futex round trip costs
//! more than that.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

const OFFERED: u8 = 0;
const TAKEN: u8 = 1;
const RETURNED: u8 = 2;
const REVOKED: u8 = 3;

/// How long a wait polls before it parks (first busy, then yielding the core).
pub const SPIN: Duration = Duration::from_micros(50);
/// Busy polls before a spinning wait starts yielding its core to other threads.
const BUSY_POLLS: u32 = 256;

/// Threads in the yielding phase of [`spin_until`] now.
static SPINNING: AtomicUsize = AtomicUsize::new(0);
/// Rank threads of the in-process worlds alive ([`Crowd`]).
static CROWD: AtomicUsize = AtomicUsize::new(0);

/// `n` rank threads that wait on each other (a `local` world), counted for as long as
/// this lives: while this process runs more of them than the machine has cores, waits
/// park at once instead of spinning ([`may_spin`]).
#[derive(Debug)]
pub struct Crowd(usize);

impl Crowd {
    /// Count `n` more rank threads.
    pub fn new(n: usize) -> Crowd {
        CROWD.fetch_add(n, Ordering::AcqRel);
        Crowd(n)
    }
}

impl Drop for Crowd {
    fn drop(&mut self) {
        CROWD.fetch_sub(self.0, Ordering::AcqRel);
    }
}

fn cores() -> usize {
    static C: OnceLock<usize> = OnceLock::new();
    *C.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// True when waits may spin: the ranks sharing this machine (this process's
/// [`Crowd`]s, or the MPI launcher's local size, `OMPI_COMM_WORLD_LOCAL_SIZE` /
/// `MPI_LOCALNRANKS`) are no more than its cores. A spinning rank on an oversubscribed
/// machine holds the core the rank it waits for needs.
pub fn may_spin() -> bool {
    static LAUNCHED: OnceLock<usize> = OnceLock::new();
    let launched = *LAUNCHED.get_or_init(|| {
        ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
            .iter()
            .find_map(|k| std::env::var(k).ok()?.trim().parse::<usize>().ok())
            .unwrap_or(1)
    });
    launched.max(CROWD.load(Ordering::Acquire)) <= cores()
}

/// Poll `ready` until it is true or `budget` has passed: busy at first, then yielding
/// the core each round; at most one thread per core spins at a time, and none while
/// the machine is oversubscribed ([`may_spin`]): those check once and give up, to park.
/// True when `ready` held.
pub fn spin_until(budget: Duration, mut ready: impl FnMut() -> bool) -> bool {
    if !may_spin() {
        return ready();
    }
    for _ in 0..BUSY_POLLS {
        if ready() {
            return true;
        }
        std::hint::spin_loop();
    }
    if SPINNING.fetch_add(1, Ordering::AcqRel) >= cores() {
        SPINNING.fetch_sub(1, Ordering::AcqRel);
        return ready();
    }
    let end = Instant::now() + budget;
    let held = loop {
        if ready() {
            break true;
        }
        if Instant::now() >= end {
            break false;
        }
        std::thread::yield_now();
    };
    SPINNING.fetch_sub(1, Ordering::AcqRel);
    held
}

/// Bytes lent by a thread inside [`lend`]; see the module doc.
pub struct Loan {
    ptr: *const u8,
    len: usize,
    state: AtomicU8,
    /// The lender parks here (after spinning) until the loan is returned.
    park: Mutex<bool>,
    cv: Condvar,
}

// SAFETY: `ptr` is reached only inside `take`, between a successful OFFERED -> TAKEN
// transition and the store of RETURNED, and `lend` does not return (so the lent slice's
// borrow does not end) while the state is TAKEN. The bytes are only read, through a
// shared slice, as the `&[u8]` lent allows from any thread.
unsafe impl Send for Loan {}
// SAFETY: as for `Send`; every other field is thread-safe.
unsafe impl Sync for Loan {}

impl std::fmt::Debug for Loan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Loan({} bytes)", self.len)
    }
}

/// Lend `data` for as long as `f` runs; see the module doc.
pub fn lend<R>(data: &[u8], f: impl FnOnce(&Arc<Loan>) -> R) -> R {
    let loan = Arc::new(Loan {
        ptr: data.as_ptr(),
        len: data.len(),
        state: AtomicU8::new(OFFERED),
        park: Mutex::new(false),
        cv: Condvar::new(),
    });
    /// Settles on every exit from `lend`, unwinding included.
    struct Settle<'a>(&'a Loan);
    impl Drop for Settle<'_> {
        fn drop(&mut self) {
            self.0.settle();
        }
    }
    let _settle = Settle(&loan);
    f(&loan)
}

impl Loan {
    /// Bytes lent.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty loan.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Run `f` on the lent bytes, once: `None` when the loan was already taken or the
    /// lender revoked it (gave up waiting). `f` must not block.
    pub fn take<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        if self
            .state
            .compare_exchange(OFFERED, TAKEN, Ordering::Acquire, Ordering::Acquire)
            .is_err()
        {
            return None;
        }
        /// Returns the loan on every exit, unwinding included.
        struct Return<'a>(&'a Loan);
        impl Drop for Return<'_> {
            fn drop(&mut self) {
                self.0.state.store(RETURNED, Ordering::Release);
                let parked = self.0.park.lock().map(|g| *g).unwrap_or(true);
                if parked {
                    self.0.cv.notify_all();
                }
            }
        }
        let _ret = Return(self);
        // SAFETY: the state is TAKEN, so the lender is inside `lend` and cannot leave it
        // before `_ret` stores RETURNED: `ptr`/`len` describe a live shared slice.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr, self.len) };
        Some(f(bytes))
    }

    /// Lender: wait until a borrower has returned the loan, up to `deadline` or until
    /// `give_up()` says to stop (checked while parked, every few milliseconds). True
    /// when it was returned; otherwise the loan is revoked (or, if a borrower holds it
    /// right now, waited for) and this is false.
    pub fn wait_returned(&self, deadline: Instant, give_up: impl Fn() -> bool) -> bool {
        let returned = || self.state.load(Ordering::Acquire) == RETURNED;
        if spin_until(SPIN, returned) {
            return true;
        }
        let mut parked = self.park.lock().unwrap_or_else(|e| e.into_inner());
        *parked = true;
        loop {
            if returned() {
                *parked = false;
                return true;
            }
            let now = Instant::now();
            if now >= deadline || give_up() {
                *parked = false;
                drop(parked);
                self.settle();
                return returned();
            }
            let step = (deadline - now).min(Duration::from_millis(20));
            parked = self
                .cv
                .wait_timeout(parked, step)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Revoke an untaken loan, or wait out a borrower that is reading it (bounded: its
    /// closure does not block).
    fn settle(&self) {
        if self
            .state
            .compare_exchange(OFFERED, REVOKED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return;
        }
        while self.state.load(Ordering::Acquire) == TAKEN {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    //! Also run under Miri (scripts/miri).
    use super::*;

    #[test]
    fn a_loan_is_read_once_then_returned() {
        let data = vec![7u8; 100];
        let got = lend(&data, |loan| {
            let l = loan.clone();
            let h =
                std::thread::spawn(move || l.take(|b| b.iter().map(|&x| x as u32).sum::<u32>()));
            assert!(loan.wait_returned(Instant::now() + Duration::from_secs(10), || false));
            let first = h.join().unwrap();
            (first, loan.take(|b| b.len()))
        });
        assert_eq!(got, (Some(700), None));
    }

    #[test]
    fn an_untaken_loan_is_revoked() {
        let data = [1u8, 2, 3];
        let kept = lend(&data, |loan| {
            assert!(!loan.wait_returned(Instant::now() + Duration::from_millis(1), || false));
            loan.clone()
        });
        // The lender left `lend`: the loan can no longer reach its bytes.
        assert_eq!(kept.take(|b| b.to_vec()), None);
        let kept = lend(&data, |loan| loan.clone());
        assert_eq!(kept.take(|b| b.len()), None);
    }
}
