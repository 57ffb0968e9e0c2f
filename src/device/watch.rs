//! Observing device events without waiting for them: one thread per process queries the
//! events it was handed and runs each one's callback once the event passed, reported a
//! device error, its probe failed, or its deadline passed. It is how launched calls
//! complete their `Work` (the watchdog, [`crate::runtime::watchdog`]) and how memory
//! that queued device work still reads is kept alive until that work ran (as
//! PyTorch's `record_stream`): nothing on a launch path ever waits for the device.
//!
//! The thread starts on first use and parks while nothing is watched; while something
//! is, it polls every 20 us after a completion, backing off to 1 ms while nothing
//! completes (a long collective, a stream held by earlier work). At process exit it
//! stops for good before the driver tears down (an event queried then, or a callback
//! dropping a communicator, would touch freed driver state): what it still watched is
//! left as it is, as the process is ending.

#![forbid(unsafe_code)]

use super::DevEvent;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// What a watched event's callback is told.
pub type Done = Box<dyn FnOnce(Result<()>) + Send>;
/// Polled beside the event (a vendor communicator's asynchronous error).
pub type Probe = Box<dyn FnMut() -> Result<()> + Send>;

struct Entry {
    ev: Arc<dyn DevEvent>,
    deadline: Option<(Instant, Duration)>,
    probe: Option<Probe>,
    done: Done,
}

/// Entries of one key, oldest first: events recorded in order on one stream pass in
/// that order, so only the oldest is queried.
struct Queue {
    key: u64,
    entries: std::collections::VecDeque<Entry>,
}

/// What callers hand the watcher: new entries wait in `inbox`, which the watcher empties
/// in one swap per round; the queues it polls are its own, so no caller ever waits
/// while the watcher queries the driver.
struct Board {
    inbox: Mutex<Inbox>,
    cv: Condvar,
    /// Entries handed over and not yet done.
    live: AtomicUsize,
    /// Held by the watcher through each round of queries and callbacks.
    round: Mutex<()>,
    /// The process is exiting: no round starts any more.
    exiting: AtomicBool,
}

#[derive(Default)]
struct Inbox {
    new: Vec<(u64, Entry)>,
    /// The watcher sleeps on `cv` (nothing watched): a hand-over wakes it.
    parked: bool,
}

fn board() -> &'static Board {
    static B: OnceLock<Board> = OnceLock::new();
    static STARTED: OnceLock<()> = OnceLock::new();
    let b = B.get_or_init(|| Board {
        inbox: Mutex::new(Inbox::default()),
        cv: Condvar::new(),
        live: AtomicUsize::new(0),
        round: Mutex::new(()),
        exiting: AtomicBool::new(false),
    });
    STARTED.get_or_init(|| {
        // Registered once the driver is initialised (an event exists): it runs before
        // the driver's teardown.
        if !super::at_exit::register(stop_at_exit) {
            tracing::warn!("cannot register the event watcher's stop at exit");
        }
        if let Err(e) = std::thread::Builder::new()
            .name("strata-watch".into())
            .spawn(serve)
        {
            tracing::error!("cannot start strata's event watcher: {e}");
        }
    });
    b
}

/// Run `done` once `ev` passed (`Ok`), reported a device error, `probe` failed, or
/// `timeout` elapsed (`Err`, an [`Error::Remote`]). `order`: a key shared by events
/// recorded in order on one stream (they are queried oldest first, one at a time), or
/// `None` for an event on its own. Costs the caller one short lock, never one held
/// while the driver is queried.
pub fn after(
    ev: Arc<dyn DevEvent>,
    order: Option<u64>,
    timeout: Option<Duration>,
    probe: Option<Probe>,
    done: Done,
) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1 << 63);
    let key = order.unwrap_or_else(|| NEXT.fetch_add(1, Ordering::Relaxed));
    let entry = Entry {
        ev,
        deadline: timeout.map(|t| (Instant::now() + t, t)),
        probe,
        done,
    };
    let b = board();
    b.live.fetch_add(1, Ordering::Relaxed);
    let mut inbox = b.inbox.lock().unwrap_or_else(|e| e.into_inner());
    inbox.new.push((key, entry));
    if inbox.parked {
        inbox.parked = false;
        b.cv.notify_one();
    }
}

/// Keep `payload` alive until `ev` passed (or failed), then drop it: memory read or
/// written by work queued before `ev`.
pub fn keep_until<T: Send + 'static>(ev: Arc<dyn DevEvent>, payload: T) {
    after(ev, None, None, None, Box::new(move |_| drop(payload)));
}

/// Entries watched now.
pub fn watched() -> usize {
    board().live.load(Ordering::Relaxed)
}

fn poll(e: &mut Entry, now: Instant) -> Option<Result<()>> {
    match e.ev.query() {
        Ok(true) => return Some(Ok(())),
        Err(err) => return Some(Err(err)),
        Ok(false) => {}
    }
    if let Some(p) = e.probe.as_mut() {
        if let Err(err) = p() {
            return Some(Err(err));
        }
    }
    match e.deadline {
        Some((d, t)) if now >= d => Some(Err(Error::Remote(format!(
            "not complete on the device within {t:?}"
        )))),
        _ => None,
    }
}

/// At exit: no round starts any more, and the one under way (if any) is waited for, at
/// most [`EXIT_WAIT`] (a callback stuck on something the exiting thread holds must not
/// hang the exit).
extern "C" fn stop_at_exit() {
    let b = board();
    b.exiting.store(true, Ordering::SeqCst);
    let until = Instant::now() + EXIT_WAIT;
    while Instant::now() < until {
        match b.round.try_lock() {
            Err(std::sync::TryLockError::WouldBlock) => {
                std::thread::sleep(Duration::from_micros(100))
            }
            _ => return,
        }
    }
}

const EXIT_WAIT: Duration = Duration::from_millis(500);

fn serve() {
    let b = board();
    let mut queues: Vec<Queue> = Vec::new();
    let mut pause = MIN_PAUSE;
    loop {
        {
            let mut inbox = b.inbox.lock().unwrap_or_else(|e| e.into_inner());
            while inbox.new.is_empty() && queues.is_empty() {
                inbox.parked = true;
                inbox = b.cv.wait(inbox).unwrap_or_else(|e| e.into_inner());
            }
            inbox.parked = false;
            for (key, entry) in inbox.new.drain(..) {
                match queues.iter_mut().find(|q| q.key == key) {
                    Some(q) => q.entries.push_back(entry),
                    None => queues.push(Queue {
                        key,
                        entries: [entry].into(),
                    }),
                }
            }
        }
        let round = b.round.lock().unwrap_or_else(|e| e.into_inner());
        if b.exiting.load(Ordering::SeqCst) {
            drop(round);
            // Never again: the process is ending.
            loop {
                std::thread::park();
            }
        }
        // Queried with the inbox unlocked: callers handing over work never wait for this
        // (the round's lock is only the exit's).
        let now = Instant::now();
        let mut done: Vec<(Done, Result<()>)> = Vec::new();
        for q in queues.iter_mut() {
            while let Some(head) = q.entries.front_mut() {
                match poll(head, now) {
                    Some(r) => {
                        if let Some(e) = q.entries.pop_front() {
                            done.push((e.done, r));
                        }
                    }
                    None => break,
                }
            }
        }
        queues.retain(|q| !q.entries.is_empty());
        pause = if done.is_empty() {
            (pause * 2).min(MAX_PAUSE)
        } else {
            MIN_PAUSE
        };
        // Callbacks may watch more (they hand it over like any caller).
        for (f, r) in done {
            f(r);
            b.live.fetch_sub(1, Ordering::Relaxed);
        }
        drop(round);
        if !queues.is_empty() {
            std::thread::sleep(pause);
        }
    }
}

const MIN_PAUSE: Duration = Duration::from_micros(20);
const MAX_PAUSE: Duration = Duration::from_millis(1);

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// An event that never passes.
    struct Never;
    impl DevEvent for Never {
        fn query(&self) -> Result<bool> {
            Ok(false)
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    static STOPPED: AtomicBool = AtomicBool::new(false);

    extern "C" fn after_stop() {
        // Runs after the watcher's stop (registered before it): the watcher has
        // no more rounds, so the probe below is not called while this sleeps.
        STOPPED.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(30));
    }

    /// The child of `exit_stops_the_watcher`: watches an event that never passes and
    /// exits while it is watched.
    #[test]
    #[ignore = "run by exit_stops_the_watcher in a process of its own"]
    fn exiting_child() {
        assert!(crate::device::at_exit::register(after_stop));
        let probe: Probe = Box::new(|| {
            if STOPPED.load(Ordering::SeqCst) {
                eprintln!("PROBED AFTER THE STOP");
            }
            Ok(())
        });
        after(Arc::new(Never), None, None, Some(probe), Box::new(|_| {}));
        std::thread::sleep(Duration::from_millis(20));
        std::process::exit(0);
    }

    #[test]
    fn exit_stops_the_watcher() {
        let t0 = Instant::now();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "device::watch::tests::exiting_child",
                "--ignored",
                "--nocapture",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "child: {:?}\n{err}", out.status);
        assert!(
            !err.contains("PROBED AFTER THE STOP"),
            "the watcher ran after its stop:\n{err}"
        );
        assert!(t0.elapsed() < Duration::from_secs(20));
    }
}
