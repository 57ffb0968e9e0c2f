//! The CPU device's stream lanes: one worker thread per stream running its operations
//! in enqueue order ([`Lane`]), with CUDA's sticky errors, events ([`CpuEvent`]) and
//! the recording side of stream capture ([`super::capture`]). What an operation does is
//! the executor's ([`super::kernels`]); a lane only orders them.

#![forbid(unsafe_code)]

use super::capture::{self, Capture};
use crate::device::{DevAddr, DevEvent, Elementwise, QuantCall};
use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A capture of this device's streams.
pub(super) type Cap = Capture<Task, Arc<Lane>>;
/// One recorded operation of a capture.
pub(super) type Node = capture::Node<Task>;

/// An event of the CPU device: the point after `seq` operations of one stream, or,
/// recorded during a capture, the capture's nodes it follows.
pub struct CpuEvent {
    pub(super) lane: Arc<Lane>,
    seq: u64,
    captured: Option<(Arc<Cap>, Vec<usize>)>,
}

pub(super) fn cpu_event(ev: &dyn DevEvent) -> Result<&CpuEvent> {
    crate::device::vendor_api::event_of(ev, "cpu")
}

impl DevEvent for CpuEvent {
    fn query(&self) -> Result<bool> {
        if let Some((cap, _)) = &self.captured {
            return Err(cap.fail(
                "an event recorded during a capture was queried (it exists only in the graph)"
                    .into(),
            ));
        }
        let q = self.lane.lock()?;
        if q.done < self.seq {
            return Ok(false);
        }
        match &q.error {
            Some(e) => Err(e.clone()),
            None => Ok(true),
        }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// One queued operation.
#[derive(Clone)]
pub(super) enum Task {
    Copy {
        dst: DevAddr,
        src: DevAddr,
        bytes: usize,
    },
    Elementwise(Elementwise),
    Quant(QuantCall),
    /// Wait until `lane` has completed `seq` operations.
    Wait {
        lane: Arc<Lane>,
        seq: u64,
    },
    /// Occupy the stream for a while (a slow kernel, for ordering and overlap tests).
    Delay(Duration),
    /// Zero `bytes` at `addr`.
    Zero {
        addr: DevAddr,
        bytes: usize,
    },
    /// One replay of a captured graph (its nodes in a topological order).
    Graph(Arc<Vec<Node>>),
}

#[derive(Default)]
pub(super) struct LaneQ {
    tasks: VecDeque<Task>,
    pub(super) enqueued: u64,
    pub(super) done: u64,
    pub(super) error: Option<Error>,
    pub(super) closed: bool,
    /// The capture this stream records into, and its frontier (the nodes the next
    /// operation depends on).
    pub(super) capture: Option<(Arc<Cap>, Vec<usize>)>,
    /// Threads waiting for completions on `cv`, and whether the worker waits for work
    /// on `work` (changed under the lock): a notification is a system call, made only
    /// when someone waits for what changed.
    parked: usize,
    idle: bool,
    /// Entries made on this stream by the host (operations, event records and event
    /// waits, as a CUDA stream counts its launches, `cuEventRecord`s and
    /// `cuStreamWaitEvent`s): what [`entries`] reports.
    pub(super) entries: u64,
}

/// The queue and worker of one stream.
pub(super) struct Lane {
    pub(super) id: u64,
    pub(super) q: Mutex<LaneQ>,
    /// Completions (`done` advanced).
    pub(super) cv: Condvar,
    /// New work for the worker (or `closed`).
    pub(super) work: Condvar,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lane({})", self.id)
    }
}

impl Lane {
    pub(super) fn lock(&self) -> Result<MutexGuard<'_, LaneQ>> {
        self.q
            .lock()
            .map_err(|_| Error::Internal("cpu stream queue poisoned".into()))
    }

    pub(super) fn push(&self, t: Task) -> Result<()> {
        let mut q = self.lock()?;
        q.entries += 1;
        if let Some((cap, front)) = q.capture.as_mut() {
            if let Task::Wait { lane, .. } = &t {
                let msg = format!(
                    "a capturing stream waited for stream {} outside the capture (isolation)",
                    lane.id
                );
                let cap = cap.clone();
                drop(q);
                return Err(cap.fail(msg));
            }
            let i = cap.add(t, std::mem::take(front))?;
            *front = vec![i];
            return Ok(());
        }
        q.tasks.push_back(t);
        q.enqueued += 1;
        if q.idle {
            self.work.notify_one();
        }
        Ok(())
    }

    /// An event after the work enqueued so far (inside a capture: after its frontier).
    pub(super) fn record(self: &Arc<Self>) -> Result<CpuEvent> {
        let mut q = self.lock()?;
        q.entries += 1;
        Ok(CpuEvent {
            lane: self.clone(),
            seq: q.enqueued,
            captured: q.capture.as_ref().map(|(c, f)| (c.clone(), f.clone())),
        })
    }

    /// Wait for `ev`: a captured event joins this stream to its capture (or adds to
    /// its frontier), a plain one is a device-side wait (refused while capturing).
    pub(super) fn wait_event(self: &Arc<Self>, ev: &CpuEvent) -> Result<()> {
        let Some((cap, f)) = &ev.captured else {
            if Arc::ptr_eq(&ev.lane, self) {
                // Still an entry on a CUDA stream (cuStreamWaitEvent on its own event).
                self.lock()?.entries += 1;
                return Ok(());
            }
            return self.push(Task::Wait {
                lane: ev.lane.clone(),
                seq: ev.seq,
            });
        };
        let mut q = self.lock()?;
        match q.capture.as_mut() {
            None => {
                q.capture = Some((cap.clone(), f.clone()));
                drop(q);
                cap.lock()?.joined.push(self.clone());
                Ok(())
            }
            Some((mine, front)) if Arc::ptr_eq(mine, cap) => {
                for i in f {
                    if !front.contains(i) {
                        front.push(*i);
                    }
                }
                Ok(())
            }
            Some((mine, _)) => {
                let mine = mine.clone();
                drop(q);
                Err(mine.fail("a stream waited for an event of another capture (isolation)".into()))
            }
        }
    }

    /// Wait until `seq` operations have completed or `deadline` passes (false then).
    pub(super) fn wait_done(&self, seq: u64, deadline: Instant) -> Result<bool> {
        let mut q = self.lock()?;
        while q.done < seq {
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            q.parked += 1;
            q = self
                .cv
                .wait_timeout(q, deadline - now)
                .map_err(|_| Error::Internal("cpu stream queue poisoned".into()))?
                .0;
            q.parked -= 1;
        }
        Ok(true)
    }

    /// The worker: run each queued operation with `exec` (skipped once one failed:
    /// the stream's error is sticky), until the stream is closed and drained.
    pub(super) fn run(self: Arc<Self>, exec: impl Fn(&Lane, Task) -> Result<()>) {
        loop {
            let task = {
                let Ok(mut q) = self.lock() else { return };
                loop {
                    if let Some(t) = q.tasks.pop_front() {
                        break t;
                    }
                    if q.closed {
                        return;
                    }
                    q.idle = true;
                    q = match self.work.wait(q) {
                        Ok(q) => q,
                        Err(_) => return,
                    };
                    q.idle = false;
                }
            };
            let failed = self.lock().map(|q| q.error.is_some()).unwrap_or(true);
            let r = if failed { Ok(()) } else { exec(&self, task) };
            let Ok(mut q) = self.lock() else { return };
            if let Err(e) = r {
                q.error.get_or_insert(e);
            }
            q.done += 1;
            if q.parked > 0 {
                self.cv.notify_all();
            }
        }
    }
}
