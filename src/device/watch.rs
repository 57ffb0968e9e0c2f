//! Observing device events without waiting for them: one thread per process queries the
//! events it was handed and runs each one's callback once the event passed, reported a
//! device error, its probe failed, or its deadline passed. It is how launched calls
//! complete their `Work` (the watchdog, [`crate::runtime::watchdog`]) and how memory
//! that queued device work still reads is kept alive until that work ran (as
//! PyTorch's `record_stream`): nothing on a launch path ever waits for the device.
//!
//! The thread starts on first use and parks while nothing is watched; while something
//! is, it polls every 20 us after a completion, backing off to 1 ms while nothing
//! completes (a long collective, a stream held by earlier work).

#![forbid(unsafe_code)]

use super::DevEvent;
use crate::error::{Error, Result};
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

struct Board {
    list: Mutex<Vec<Queue>>,
    cv: Condvar,
}

fn board() -> &'static Board {
    static B: OnceLock<Board> = OnceLock::new();
    static STARTED: OnceLock<()> = OnceLock::new();
    let b = B.get_or_init(|| Board {
        list: Mutex::new(Vec::new()),
        cv: Condvar::new(),
    });
    STARTED.get_or_init(|| {
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
/// `None` for an event on its own.
pub fn after(
    ev: Arc<dyn DevEvent>,
    order: Option<u64>,
    timeout: Option<Duration>,
    probe: Option<Probe>,
    done: Done,
) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1 << 63);
    let key = order.unwrap_or_else(|| NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let entry = Entry {
        ev,
        deadline: timeout.map(|t| (Instant::now() + t, t)),
        probe,
        done,
    };
    let b = board();
    let mut l = b.list.lock().unwrap_or_else(|e| e.into_inner());
    let was_empty = l.is_empty();
    match l.iter_mut().find(|q| q.key == key) {
        Some(q) => q.entries.push_back(entry),
        None => l.push(Queue {
            key,
            entries: [entry].into(),
        }),
    }
    if was_empty {
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
    board()
        .list
        .lock()
        .map(|l| l.iter().map(|q| q.entries.len()).sum())
        .unwrap_or(0)
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

fn serve() {
    let b = board();
    let mut pause = MIN_PAUSE;
    loop {
        let done: Vec<(Done, Result<()>)> = {
            let mut l = b.list.lock().unwrap_or_else(|e| e.into_inner());
            while l.is_empty() {
                l = b.cv.wait(l).unwrap_or_else(|e| e.into_inner());
            }
            let now = Instant::now();
            let mut out = Vec::new();
            for q in l.iter_mut() {
                while let Some(head) = q.entries.front_mut() {
                    match poll(head, now) {
                        Some(r) => {
                            if let Some(e) = q.entries.pop_front() {
                                out.push((e.done, r));
                            }
                        }
                        None => break,
                    }
                }
            }
            l.retain(|q| !q.entries.is_empty());
            out
        };
        pause = if done.is_empty() {
            (pause * 2).min(MAX_PAUSE)
        } else {
            MIN_PAUSE
        };
        // Callbacks run outside the lock (they may watch more).
        for (f, r) in done {
            f(r);
        }
        std::thread::sleep(pause);
    }
}

const MIN_PAUSE: Duration = Duration::from_micros(20);
const MAX_PAUSE: Duration = Duration::from_millis(1);
