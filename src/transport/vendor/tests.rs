#![forbid(unsafe_code)]

use super::abort::within;
use super::*;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[test]
fn within_gives_up_at_the_timeout_and_keeps_fast_results() {
    let t = std::time::Instant::now();
    let r = within(
        Duration::from_millis(50),
        "test",
        || {
            std::thread::sleep(Duration::from_secs(2));
            1
        },
        |_| {},
    )
    .unwrap();
    assert_eq!(r, None);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(
        within(Duration::from_secs(5), "test", || 7, |_| {}).unwrap(),
        Some(7)
    );
}

#[test]
fn within_hands_a_late_result_to_late_and_reports_a_panic() {
    let (tx, rx) = std::sync::mpsc::channel();
    let r = within(
        Duration::from_millis(20),
        "test",
        || {
            std::thread::sleep(Duration::from_millis(200));
            5
        },
        move |v| tx.send(v).unwrap(),
    )
    .unwrap();
    assert_eq!(r, None);
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 5);
    let e = within(
        Duration::from_secs(5),
        "test",
        || -> u8 { panic!("boom") },
        |_| {},
    )
    .unwrap_err();
    assert!(matches!(e, Error::Internal(_)), "{e}");
}

/// A fake teardown recording each run, and asserting none runs while a guard lives.
#[derive(Default)]
struct Log {
    runs: Mutex<Vec<(u32, Ending)>>,
    alive: AtomicUsize,
}

fn counted(log: &Arc<Log>) -> Arc<UseCount<u32, impl Teardown<u32>>> {
    let l = log.clone();
    UseCount::new(42u32, move |v: u32, how: Ending| -> Result<()> {
        assert_eq!(
            l.alive.load(Ordering::SeqCst),
            0,
            "torn down while a guard is alive"
        );
        l.runs.lock().unwrap().push((v, how));
        Ok(())
    })
}

#[test]
fn abort_without_users_runs_at_once_and_once() {
    let log = Arc::new(Log::default());
    let c = counted(&log);
    assert!(c.end(Ending::Abort, "watchdog").unwrap().is_ok());
    assert_eq!(*log.runs.lock().unwrap(), vec![(42, Ending::Abort)]);
    assert!(c.torn_down());
    assert!(c.end(Ending::Abort, "again").is_none());
    assert!(c.end(Ending::Destroy, "drop").is_none());
    assert_eq!(c.enter().err().as_deref(), Some("watchdog"));
    assert_eq!(log.runs.lock().unwrap().len(), 1);
}

#[test]
fn abort_waits_for_the_last_user_and_refuses_new_ones() {
    let log = Arc::new(Log::default());
    let c = counted(&log);
    let a = c.enter().unwrap();
    log.alive.fetch_add(1, Ordering::SeqCst);
    let b = c.enter().unwrap();
    log.alive.fetch_add(1, Ordering::SeqCst);
    assert_eq!((a.get(), c.users()), (42, 2));
    // Deferred: the guards are alive.
    assert!(c.end(Ending::Abort, "timed out").is_none());
    assert!(log.runs.lock().unwrap().is_empty());
    assert_eq!(c.ended().as_deref(), Some("timed out"));
    assert_eq!(c.enter().err().as_deref(), Some("timed out"));
    log.alive.fetch_sub(1, Ordering::SeqCst);
    drop(a);
    assert!(log.runs.lock().unwrap().is_empty());
    log.alive.fetch_sub(1, Ordering::SeqCst);
    drop(b);
    assert_eq!(*log.runs.lock().unwrap(), vec![(42, Ending::Abort)]);
    assert!(c.torn_down());
    assert!(c.end(Ending::Abort, "again").is_none());
    assert_eq!(log.runs.lock().unwrap().len(), 1);
}

#[test]
fn an_abort_replaces_a_pending_destroy_and_destroy_runs_without_users() {
    let log = Arc::new(Log::default());
    let c = counted(&log);
    let a = c.enter().unwrap();
    log.alive.fetch_add(1, Ordering::SeqCst);
    assert!(c.end(Ending::Destroy, "dropped").is_none());
    assert!(c.end(Ending::Abort, "split timed out").is_none());
    log.alive.fetch_sub(1, Ordering::SeqCst);
    drop(a);
    assert_eq!(*log.runs.lock().unwrap(), vec![(42, Ending::Abort)]);

    let log = Arc::new(Log::default());
    let c = counted(&log);
    drop(c.enter().unwrap());
    assert!(c.end(Ending::Destroy, "dropped").unwrap().is_ok());
    assert_eq!(*log.runs.lock().unwrap(), vec![(42, Ending::Destroy)]);
}

/// Many threads enter and leave while others abort: the teardown runs exactly once,
/// never with a guard alive, and no guard is handed out after the abort.
#[test]
fn concurrent_users_and_aborts_tear_down_exactly_once() {
    for round in 0..20 {
        let log = Arc::new(Log::default());
        let c = counted(&log);
        let aborted = Arc::new(std::sync::atomic::AtomicBool::new(false));
        std::thread::scope(|s| {
            for t in 0..6 {
                let (c, log, aborted) = (c.clone(), log.clone(), aborted.clone());
                s.spawn(move || {
                    for i in 0..300 {
                        if t == 0 && i == 50 + round * 7 {
                            let _ = c.end(Ending::Abort, "abort");
                            aborted.store(true, Ordering::SeqCst);
                        }
                        let was_aborted = aborted.load(Ordering::SeqCst);
                        match c.enter() {
                            Ok(u) => {
                                assert!(!was_aborted, "a guard after the abort");
                                log.alive.fetch_add(1, Ordering::SeqCst);
                                assert!(log.runs.lock().unwrap().is_empty());
                                std::thread::yield_now();
                                assert_eq!(u.get(), 42);
                                log.alive.fetch_sub(1, Ordering::SeqCst);
                            }
                            Err(why) => assert_eq!(why, "abort"),
                        }
                    }
                });
            }
        });
        assert_eq!(*log.runs.lock().unwrap(), vec![(42, Ending::Abort)]);
        assert_eq!(c.users(), 0);
    }
}

/// The split helper's shape: a helper holds a guard past the caller's timeout; the
/// caller aborts and returns; the abort runs when the helper leaves, on its thread.
#[test]
fn a_helper_stuck_past_the_timeout_defers_the_abort_to_its_return() {
    let log = Arc::new(Log::default());
    let c = counted(&log);
    let inside = c.enter().unwrap();
    log.alive.fetch_add(1, Ordering::SeqCst);
    let l = log.clone();
    let r = within(
        Duration::from_millis(20),
        "test",
        move || {
            let _inside = inside;
            std::thread::sleep(Duration::from_millis(150));
            l.alive.fetch_sub(1, Ordering::SeqCst);
        },
        |_| {},
    )
    .unwrap();
    assert!(r.is_none());
    assert!(c.end(Ending::Abort, "split timed out").is_none());
    assert!(
        log.runs.lock().unwrap().is_empty(),
        "aborted under the helper"
    );
    let t = std::time::Instant::now();
    while !c.torn_down() {
        assert!(t.elapsed() < Duration::from_secs(5), "never torn down");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(*log.runs.lock().unwrap(), vec![(42, Ending::Abort)]);
}

/// docs/errors.md: a vendor library that does not load says how to get it.
#[test]
fn missing_vendor_library_says_how_to_get_it() {
    assert!(Vendor::Nccl
        .install_hint()
        .contains("pip install nvidia-nccl-cu12"));
    assert!(Vendor::Nccl.install_hint().contains("STRATA_NCCL_LIB"));
    assert!(Vendor::Rccl.install_hint().contains("STRATA_RCCL_LIB"));
    for v in [Vendor::Nccl, Vendor::Rccl] {
        // Where the library is installed it loads; elsewhere the error carries the hint.
        if let Err(m) = VendorLib::load(v) {
            assert!(m.contains(v.install_hint()), "{m}");
        }
    }
}
