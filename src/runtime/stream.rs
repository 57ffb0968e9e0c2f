//! The stream of a communicator: one thread that runs its work in submission order, as a
//! CUDA stream runs kernels. Submitting returns a [`Work`] at once; work may wait for
//! [`Work`] of other communicators first (cross-communicator dependencies).

use crate::error::{Error, Result};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(Default)]
struct WorkState {
    done: Mutex<Option<Result<()>>>,
    cv: Condvar,
}

/// Completion handle of a submitted collective (a future on host transports, an event
/// on GPUs). Cheap to clone; every clone sees the same outcome.
#[derive(Clone, Default)]
pub struct Work(Arc<WorkState>);

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Work(done={})", self.is_done())
    }
}

impl Work {
    /// A handle that is not done yet.
    pub fn pending() -> Work {
        Work::default()
    }

    /// A handle that is already done with `r`.
    pub fn ready(r: Result<()>) -> Work {
        let w = Work::default();
        w.complete(r);
        w
    }

    /// Mark done (first outcome wins).
    pub(crate) fn complete(&self, r: Result<()>) {
        let mut d = self.0.done.lock().unwrap_or_else(|e| e.into_inner());
        if d.is_none() {
            *d = Some(r);
        }
        self.0.cv.notify_all();
    }

    /// True once the work finished (successfully or not).
    pub fn is_done(&self) -> bool {
        self.0.done.lock().map(|d| d.is_some()).unwrap_or(true)
    }

    /// Wait for the work; its error if it failed.
    pub fn wait(&self) -> Result<()> {
        self.wait_timeout(Duration::MAX).and_then(|done| {
            if done {
                Ok(())
            } else {
                Err(Error::Internal("unbounded wait returned early".into()))
            }
        })
    }

    /// Wait up to `t`: `Ok(true)` done, `Ok(false)` still running, `Err` it failed.
    pub fn wait_timeout(&self, t: Duration) -> Result<bool> {
        let deadline = Instant::now().checked_add(t);
        let mut d = self
            .0
            .done
            .lock()
            .map_err(|_| Error::Internal("work lock poisoned".into()))?;
        loop {
            if let Some(r) = d.as_ref() {
                return r.clone().map(|_| true);
            }
            let left = match deadline {
                Some(dl) => {
                    let now = Instant::now();
                    if now >= dl {
                        return Ok(false);
                    }
                    dl - now
                }
                None => Duration::from_secs(3600),
            };
            d = self
                .0
                .cv
                .wait_timeout(d, left)
                .map_err(|_| Error::Internal("work lock poisoned".into()))?
                .0;
        }
    }
}

type Job = Box<dyn FnOnce() -> Result<()> + Send>;

struct Task {
    deps: Vec<Work>,
    job: Job,
    work: Work,
}

/// A worker thread running tasks in order.
pub(crate) struct Stream {
    tx: Mutex<Option<Sender<Task>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    dep_timeout: Duration,
}

impl Stream {
    /// Start a stream named `name`; dependencies not done within `dep_timeout` fail the task.
    pub(crate) fn new(name: String, dep_timeout: Duration) -> Result<Stream> {
        let (tx, rx) = channel::<Task>();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                while let Ok(t) = rx.recv() {
                    let r = wait_deps(&t.deps, dep_timeout).and_then(|_| {
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(t.job))
                            .unwrap_or_else(|_| {
                                Err(Error::Internal("panic inside a collective".into()))
                            })
                    });
                    t.work.complete(r);
                }
            })
            .map_err(|e| Error::System(format!("cannot start stream thread: {e}")))?;
        Ok(Stream {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            dep_timeout,
        })
    }

    /// Queue `job` after `deps`; `work` completes with its outcome.
    /// On a stopped stream `work` fails and so does the call.
    pub(crate) fn push(&self, deps: Vec<Work>, job: Job, work: Work) -> Result<()> {
        let tx = self.tx.lock().ok().and_then(|t| t.clone());
        let err = match tx {
            Some(tx) => match tx.send(Task { deps, job, work }) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    let e2 = Error::InvalidUsage("communicator stream has stopped".into());
                    e.0.work.complete(Err(e2.clone()));
                    return Err(e2);
                }
            },
            None => Error::InvalidUsage("communicator was destroyed".into()),
        };
        work.complete(Err(err.clone()));
        Err(err)
    }

    /// Block until everything queued so far has run; the first error among them is lost
    /// to their own handles, this returns only whether the stream is alive.
    pub(crate) fn sync(&self) -> Result<()> {
        let w = Work::pending();
        self.push(Vec::new(), Box::new(|| Ok(())), w.clone())?;
        match w.wait_timeout(self.dep_timeout.saturating_mul(4))? {
            true => Ok(()),
            false => Err(Error::Remote(
                "stream did not drain within the timeout".into(),
            )),
        }
    }

    /// True when called from this stream's own thread (inside running work).
    pub(crate) fn is_current(&self) -> bool {
        self.thread
            .lock()
            .ok()
            .and_then(|t| {
                t.as_ref()
                    .map(|h| h.thread().id() == std::thread::current().id())
            })
            .unwrap_or(false)
    }

    /// Stop accepting work and join the thread after it drains.
    pub(crate) fn shutdown(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Some(h) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

pub(crate) fn wait_deps(deps: &[Work], t: Duration) -> Result<()> {
    for d in deps {
        match d.wait_timeout(t) {
            Ok(true) => {}
            Ok(false) => {
                return Err(Error::Remote(format!(
                    "a dependency did not complete within {t:?}"
                )))
            }
            Err(e) => return Err(Error::Remote(format!("a dependency failed: {e}"))),
        }
    }
    Ok(())
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.shutdown();
    }
}
