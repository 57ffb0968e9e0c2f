//! Host waits for the device inside a launch, counted.
//!
//! The launch-only contract: between a stream-ordered call's entry and its return, no
//! thread of strata waits on the host for the device (a stream, an event, a synchronous
//! copy or memset). The launch path marks its thread for the duration of the call
//! ([`launching`]); every host wait for the device in strata goes through
//! [`host_wait`], which counts the ones made on a marked thread and, when strict
//! ([`set_strict`]: the CPU device's tests, `STRATA_STRICT_LAUNCH=1`), fails them. The
//! count is what the host-local tests assert to be 0 for every algorithm and group form.

#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

thread_local! {
    // The launch contract's audit: whether this thread is inside a launch and the host
    // waits it made there (counters, read by tests and the tools; they route nothing).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    static MINE: Cell<u64> = const { Cell::new(0) };
    /// Inside [`outside`] within a launch.
    static OUT: Cell<bool> = const { Cell::new(false) };
    static MINE_OUTSIDE: Cell<u64> = const { Cell::new(0) };
}

static COUNT: AtomicU64 = AtomicU64::new(0);
static STRICT: AtomicBool = AtomicBool::new(false);
static LAST: Mutex<Option<String>> = Mutex::new(None);

/// This thread is inside a launch until the guard drops (nests).
pub struct Launching(());

impl Drop for Launching {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Mark this thread as launching a stream-ordered call.
pub fn launching() -> Launching {
    DEPTH.with(|d| d.set(d.get() + 1));
    Launching(())
}

/// True while this thread launches a stream-ordered call.
pub fn in_launch() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

/// Run `f` outside the launch marking (what runs on behalf of nothing in the call:
/// the first allocation of an arena block, which no steady-state call makes).
/// Host waits made there are not refused; [`thread_outside_count`] counts them.
pub fn outside<T>(f: impl FnOnce() -> T) -> T {
    let d = DEPTH.with(|d| d.replace(0));
    let o = OUT.with(|o| o.replace(d > 0 || o.get()));
    struct Back(u32, bool);
    impl Drop for Back {
        fn drop(&mut self) {
            let (d, o) = (self.0, self.1);
            DEPTH.with(|x| x.set(d));
            OUT.with(|x| x.set(o));
        }
    }
    let _back = Back(d, o);
    f()
}

/// Every host wait for the device calls this first with what it waits for: inside a
/// launch it is counted (and refused when strict).
pub fn host_wait(what: &str) -> Result<()> {
    if !in_launch() {
        if OUT.with(|o| o.get()) {
            MINE_OUTSIDE.with(|m| m.set(m.get() + 1));
            if let Ok(mut l) = LAST.lock() {
                *l = Some(what.to_string());
            }
        }
        return Ok(());
    }
    COUNT.fetch_add(1, Ordering::SeqCst);
    MINE.with(|m| m.set(m.get() + 1));
    if let Ok(mut l) = LAST.lock() {
        *l = Some(what.to_string());
    }
    if strict() {
        if std::env::var("STRATA_WAIT_BACKTRACE").is_ok_and(|v| v.trim() == "1") {
            // Where the refused wait came from (a diagnosis aid of the GPU checks).
            eprintln!(
                "strata: refused host wait ({what}) at:\n{}",
                std::backtrace::Backtrace::force_capture()
            );
        }
        return Err(Error::Internal(format!(
            "a host wait for the device inside a stream-ordered call ({what}): the launch \
             path must only enqueue"
        )));
    }
    Ok(())
}

/// Host waits made inside launches in this process so far.
pub fn count() -> u64 {
    COUNT.load(Ordering::SeqCst)
}

/// Host waits made inside launches by this thread so far (a launch runs on its calling
/// thread: what a test of one rank's calls counts, whatever other tests do meanwhile).
pub fn thread_count() -> u64 {
    MINE.with(|m| m.get())
}

/// Host waits made by this thread inside launches but [`outside`] the contract (a
/// first call's set-up where it cannot avoid one) so far.
pub fn thread_outside_count() -> u64 {
    MINE_OUTSIDE.with(|m| m.get())
}

/// What the last counted host wait (inside a launch or [`outside`] it) waited for.
pub fn last() -> Option<String> {
    LAST.lock().ok().and_then(|l| l.clone())
}

/// Refuse host waits inside launches (`true`) or only count them.
pub fn set_strict(on: bool) {
    STRICT.store(on, Ordering::SeqCst)
}

/// True when host waits inside launches are refused (also `STRATA_STRICT_LAUNCH=1`;
/// `STRATA_WAIT_BACKTRACE=1` prints where each refused one came from).
pub fn strict() -> bool {
    STRICT.load(Ordering::SeqCst)
        || std::env::var("STRATA_STRICT_LAUNCH").is_ok_and(|v| v.trim() == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_waits_inside_a_launch_count() {
        let before = thread_count();
        host_wait("outside").unwrap();
        assert_eq!(thread_count(), before);
        {
            let _l = launching();
            host_wait("inside").unwrap();
            outside(|| host_wait("first allocation").unwrap());
            assert!(in_launch());
        }
        assert!(!in_launch());
        assert_eq!(thread_count(), before + 1);
    }
}
