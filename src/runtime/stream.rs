//! The stream of a communicator: work runs in submission order, one piece at a time, as
//! a CUDA stream runs kernels. Submitting returns a [`Work`] at once; work may wait for
//! [`Work`] of other communicators first (cross-communicator dependencies). The
//! stream's own thread runs what nobody waits for; a thread waiting for the next piece
//! while nothing runs runs it itself. Both spin for a few microseconds before parking.

use crate::error::{Error, Result};
use crate::memory::loan::{spin_until, SPIN};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(Default)]
struct WorkState {
    done: Mutex<Option<Result<()>>>,
    cv: Condvar,
    /// Set (after `done`) once the outcome is in, polled without the lock.
    finished: AtomicBool,
    /// Waiters parked on `cv` (changed under `done`'s lock; `complete` notifies only then).
    parked: AtomicUsize,
    /// The stream the work is queued on, so a waiter can run it itself.
    origin: Mutex<Option<Weak<Shared>>>,
    /// A launched device call's end event (on its communicator's launch stream): what a
    /// dependent launched call's stream waits for on the device.
    event: Mutex<Option<Arc<dyn crate::device::DevEvent>>>,
    /// A piece of a launched call (a sub-communicator's batch on its side stream): the
    /// call's launch stream, which a wait for this work makes wait for `event` on the
    /// device instead of the host.
    join: Mutex<Option<Arc<dyn crate::device::DevStream>>>,
}

/// Completion handle of a submitted collective (a future on host transports, an event
/// on GPUs). Cheap to clone; every clone sees the same outcome. Waiting on work that
/// is next in its communicator's stream, with nothing running there, runs it on the
/// waiting thread (the order is the stream's either way), so a blocking call pays no
/// hand-off to the stream thread and back.
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
        self.0.finished.store(true, Ordering::Release);
        let parked = self.0.parked.load(Ordering::Relaxed) > 0;
        drop(d);
        if parked {
            self.0.cv.notify_all();
        }
    }

    /// A launched call's work: `ev` is its end on the device.
    pub(crate) fn set_event(&self, ev: Arc<dyn crate::device::DevEvent>) {
        if let Ok(mut e) = self.0.event.lock() {
            *e = Some(ev);
        }
    }

    /// A piece of a launched call: done on the host, `ev` its end on the device, and
    /// `join` (the call's launch stream) what a wait for it orders after `ev`.
    pub(crate) fn set_piece(
        &self,
        ev: Arc<dyn crate::device::DevEvent>,
        join: Arc<dyn crate::device::DevStream>,
    ) {
        self.set_event(ev);
        if let Ok(mut j) = self.0.join.lock() {
            *j = Some(join);
        }
    }

    /// The end event of a launched device call (`None` for host work): a launched call
    /// that depends on this work waits for it on the device, not on the host.
    pub fn event(&self) -> Option<Arc<dyn crate::device::DevEvent>> {
        self.0.event.lock().ok().and_then(|e| e.clone())
    }

    /// True once the work finished (successfully or not).
    pub fn is_done(&self) -> bool {
        self.0.finished.load(Ordering::Acquire)
    }

    /// Wait for the work; its error if it failed. Runs the work on this thread when it
    /// is next on its stream and nothing runs there.
    pub fn wait(&self) -> Result<()> {
        // A launched call's piece is joined on the device: the call's launch stream
        // waits for its event, the host does not.
        let piece = self.event().and_then(|ev| {
            let join = self.0.join.lock().ok().and_then(|j| j.clone());
            join.map(|here| (ev, here))
        });
        if let Some((ev, here)) = piece {
            here.wait_event(ev.as_ref())?;
            if !self.is_done() {
                return Ok(());
            }
        }
        self.wait_helping(Duration::MAX).and_then(|done| {
            if done {
                Ok(())
            } else {
                Err(Error::Internal("unbounded wait returned early".into()))
            }
        })
    }

    /// [`Work::wait_timeout`] that first runs the work on this thread when it is next
    /// on its stream and nothing runs there (which may take longer than `t`: the work
    /// has its own timeouts).
    pub(crate) fn wait_helping(&self, t: Duration) -> Result<bool> {
        if !self.is_done() {
            let origin = self.0.origin.lock().ok().and_then(|o| o.clone());
            if let Some(stream) = origin.and_then(|w| w.upgrade()) {
                stream.run_if_next(self);
            }
        }
        self.wait_timeout(t)
    }

    /// Wait up to `t`: `Ok(true)` done, `Ok(false)` still running, `Err` it failed.
    pub fn wait_timeout(&self, t: Duration) -> Result<bool> {
        // No spinning here: a waiter usually waits for a queue of work (or runs the
        // next piece itself, `wait_helping`), and a spinning waiter takes the core the
        // stream's own waits spin on.
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
            self.0.parked.fetch_add(1, Ordering::Relaxed);
            let r = self.0.cv.wait_timeout(d, left);
            self.0.parked.fetch_sub(1, Ordering::Relaxed);
            d = r
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

#[derive(Default)]
struct Queue {
    tasks: VecDeque<Task>,
}

/// What the stream thread and the waiters that run its work share.
///
/// Running a task takes `busy` (a compare-and-swap, [`Shared::claim`]): the stream
/// thread and a waiter claim it under the queue's lock, to pop the task they run; a
/// blocking call that runs inline ([`Stream::run_now`]) claims it without the lock,
/// when nothing is queued. Freeing it ([`Free`]) is a store; the stream thread, which
/// parks when it finds the stream busy, announces `parked` before it checks `busy`
/// again and the freeing thread checks `parked` after its store (both sequentially
/// consistent), so one of the two sees the other and no wake-up is lost.
struct Shared {
    q: Mutex<Queue>,
    cv: Condvar,
    /// Tasks queued (polled without the lock while the stream thread spins).
    queued: AtomicUsize,
    /// A thread (its own, a waiter, or an inline blocking call) runs a task now.
    busy: AtomicBool,
    /// Accepting work (cleared under the lock by [`Stream::shutdown`]).
    open: AtomicBool,
    /// The stream thread is parked on the condvar (changed under the lock).
    parked: AtomicBool,
    /// [`thread_tag`] of the thread running a task (`busy`), 0 when none: read without the lock
    /// by [`Stream::is_current`] (asked on every enqueue), and only meaningful to the
    /// thread it names, which stored it before running.
    runner: AtomicU64,
    dep_timeout: Duration,
}

/// A nonzero number unique to the calling thread.
fn thread_tag() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        /// The thread's identity (set once, no call's state).
        static TAG: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    TAG.try_with(|t| *t).unwrap_or(u64::MAX)
}

/// Frees the stream (`busy`) on every exit, unwinding included, waking the
/// parked stream thread when work was queued meanwhile.
struct Free<'a>(&'a Shared);

impl Drop for Free<'_> {
    #[inline]
    fn drop(&mut self) {
        let s = self.0;
        s.runner.store(0, Ordering::Relaxed);
        s.busy.store(false, Ordering::SeqCst);
        if s.parked.load(Ordering::SeqCst)
            && (s.queued.load(Ordering::SeqCst) > 0 || !s.open.load(Ordering::SeqCst))
        {
            // Under the lock: the stream thread is then waiting, or has yet to check.
            let _q = s.lock();
            s.cv.notify_all();
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Take the stream to run a task (false: someone runs one).
    fn claim(&self) -> bool {
        self.busy
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
    }

    /// Run `t` on this thread (which set `busy`), then free the stream.
    fn run(&self, t: Task) {
        let _free = Free(self);
        let r = wait_deps(&t.deps, self.dep_timeout).and_then(|_| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(t.job))
                .unwrap_or_else(|_| Err(Error::Internal("panic inside a collective".into())))
        });
        t.work.complete(r);
    }

    /// A waiter of `w`: run it here if it is next and nothing runs.
    fn run_if_next(&self, w: &Work) {
        let mut q = self.lock();
        let next = q
            .tasks
            .front()
            .is_some_and(|t| Arc::ptr_eq(&t.work.0, &w.0));
        if !next || !self.claim() {
            return;
        }
        let t = q.tasks.pop_front().expect("front task");
        self.queued.fetch_sub(1, Ordering::Release);
        self.runner.store(thread_tag(), Ordering::Relaxed);
        drop(q);
        self.run(t);
    }

    /// The stream thread: run tasks in order until closed and drained.
    fn serve(&self) {
        loop {
            spin_until(SPIN, || self.queued.load(Ordering::Acquire) > 0);
            let mut q = self.lock();
            let t = loop {
                if !q.tasks.is_empty() && self.claim() {
                    let t = q.tasks.pop_front().expect("front task");
                    self.queued.fetch_sub(1, Ordering::Release);
                    self.runner.store(thread_tag(), Ordering::Relaxed);
                    break t;
                }
                if q.tasks.is_empty() && !self.open.load(Ordering::SeqCst) {
                    return;
                }
                self.parked.store(true, Ordering::SeqCst);
                // A runner that freed the stream before it saw `parked` woke nobody.
                if !q.tasks.is_empty() && !self.busy.load(Ordering::SeqCst) {
                    self.parked.store(false, Ordering::SeqCst);
                    continue;
                }
                q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                self.parked.store(false, Ordering::SeqCst);
            };
            drop(q);
            self.run(t);
        }
    }
}

/// A worker thread running tasks in order (or letting a waiter run the next one).
pub(crate) struct Stream {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    dep_timeout: Duration,
}

impl Stream {
    /// Start a stream named `name`; dependencies not done within `dep_timeout` fail the task.
    pub(crate) fn new(name: String, dep_timeout: Duration) -> Result<Stream> {
        let shared = Arc::new(Shared {
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            queued: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            open: AtomicBool::new(true),
            parked: AtomicBool::new(false),
            runner: AtomicU64::new(0),
            dep_timeout,
        });
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || s2.serve())
            .map_err(|e| Error::System(format!("cannot start stream thread: {e}")))?;
        Ok(Stream {
            shared,
            thread: Mutex::new(Some(thread)),
            dep_timeout,
        })
    }

    /// Queue `job` after `deps`; `work` completes with its outcome.
    /// On a stopped stream `work` fails and so does the call.
    pub(crate) fn push(&self, deps: Vec<Work>, job: Job, work: Work) -> Result<()> {
        let mut q = self.shared.lock();
        if !self.shared.open.load(Ordering::SeqCst) {
            drop(q);
            let e = Error::InvalidUsage("communicator was destroyed".into());
            work.complete(Err(e.clone()));
            return Err(e);
        }
        if let Ok(mut o) = work.0.origin.lock() {
            *o = Some(Arc::downgrade(&self.shared));
        }
        q.tasks.push_back(Task { deps, job, work });
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        let wake = self.shared.parked.load(Ordering::SeqCst);
        drop(q);
        if wake {
            self.shared.cv.notify_all();
        }
        Ok(())
    }

    /// Run `job` after `deps` on the calling thread, now, when nothing is queued or
    /// running on this stream (it is next, so the order is the stream's); `Err(job)`
    /// hands it back otherwise (or on a stopped stream), to be queued. For a blocking
    /// call: the stream thread never sees the job, nothing is boxed, no handle made.
    pub(crate) fn run_now<F>(&self, deps: &[Work], job: F) -> std::result::Result<Result<()>, F>
    where
        F: FnOnce() -> Result<()>,
    {
        // No lock: nothing queued (this thread's own earlier submissions included) and
        // the stream claimed; a task another thread queues meanwhile runs after this.
        let s = &self.shared;
        if !s.open.load(Ordering::Acquire) || s.queued.load(Ordering::SeqCst) > 0 || !s.claim() {
            return Err(job);
        }
        s.runner.store(thread_tag(), Ordering::Relaxed);
        let _free = Free(s);
        Ok(wait_deps(deps, self.dep_timeout).and_then(|_| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))
                .unwrap_or_else(|_| Err(Error::Internal("panic inside a collective".into())))
        }))
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

    /// True when called from the thread running this stream's current work (its own
    /// thread, or a waiter running the work it waits for).
    pub(crate) fn is_current(&self) -> bool {
        self.shared.runner.load(Ordering::Relaxed) == thread_tag()
    }

    /// Stop accepting work and join the thread after it drains.
    pub(crate) fn shutdown(&self) {
        {
            let _q = self.shared.lock();
            self.shared.open.store(false, Ordering::SeqCst);
        }
        self.shared.cv.notify_all();
        if let Some(h) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

#[inline]
pub(crate) fn wait_deps(deps: &[Work], t: Duration) -> Result<()> {
    if deps.is_empty() {
        return Ok(());
    }
    wait_each(deps, t)
}

fn wait_each(deps: &[Work], t: Duration) -> Result<()> {
    for d in deps {
        match d.wait_helping(t) {
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
