//! Group start/end (ncclGroupStart/End): between them, a thread's submissions are held
//! and, at the outermost end, queued as one launch per communicator. Their handles
//! complete as each member finishes. Groups nest; they are per thread. A group of
//! native device-buffer calls on a GPU transport is one vendor group. Otherwise the
//! collectives run in submission order, then the group's host sends and receives all
//! together, as one exchange ([`super::native::exchange`]): like NCCL's, a group's
//! point-to-point calls may form any pattern (rings, all-to-all, both directions) of
//! any size without deadlock, and never cross the messages of its collectives. An empty
//! call (no byte on any buffer) beside launched calls of its communicator is completed
//! by the group itself, once, so the share stays launched (the link probe's zero-byte
//! partner class on a device transport).

#![forbid(unsafe_code)]

use super::request::Op;
use super::stream::Work;
use super::{CommCore, Job};
use crate::error::{Error, Result};
use std::cell::RefCell;

/// A call held by the open group ([`hold`]) until it ends.
pub(crate) struct Pending {
    pub(crate) comm: CommCore,
    pub(crate) deps: Vec<Work>,
    pub(crate) job: Job,
    pub(crate) work: Work,
    pub(crate) is_send: bool,
    pub(crate) fusable: bool,
    /// Its description when mismatch checking was on at submit (not point-to-point).
    pub(crate) call: Option<String>,
    /// A send or receive on host memory: run with the group's other ones as one
    /// exchange ([`super::native::exchange`]) instead of its own job.
    pub(crate) p2p: Option<Op>,
    /// A launched device call ([`crate::runtime::launch`]): run on the thread that ends
    /// the group, never queued on a stream thread.
    pub(crate) launch: bool,
    /// A call with no byte on any buffer (count 0 on every rank, as its peers'): nothing
    /// to move. Beside launched calls of its communicator it is completed by the group
    /// ([`empties_done`]) and leaves the share launched.
    pub(crate) empty: bool,
}

thread_local! {
    /// This thread's group depth and its pending calls. Per thread because groups are:
    /// NCCL keeps `ncclGroupStart`'s depth and the calls it holds per thread the same way.
    static GROUP: RefCell<(usize, Vec<Pending>)> = const { RefCell::new((0, Vec::new())) };
}

/// Start (or nest) a group on this thread.
pub fn group_start() {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 == 0 {
            GENERATION.with(|n| n.set(n.get() + 1));
        }
        g.0 += 1;
    });
}

thread_local! {
    /// The number of this thread's outermost group: part of the per-thread group state
    /// ([`GROUP`]), as NCCL's.
    static GENERATION: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Inside a group: a number naming this thread's outermost group (each outermost
/// `group_start` makes a new one); `None` outside a group.
pub fn current_group() -> Option<u64> {
    in_group().then(|| GENERATION.with(|n| n.get()))
}

/// End a group; at the outermost end, launch what it holds. Ending a group that was not
/// started is an `InvalidUsage` error.
pub fn group_end() -> Result<()> {
    let r = group_end_jobs();
    // The outermost end: the actions deferred to it (a stream-ordered call's wait on the
    // caller's stream, enqueued only now so that a later call's event in the same group
    // never covers an earlier call's wait), whatever happened above.
    if !in_group() {
        let after = AFTER.with(|a| std::mem::take(&mut *a.borrow_mut()));
        let mut first = r;
        for f in after {
            let e = f();
            if first.is_ok() {
                first = e;
            }
        }
        return first;
    }
    r
}

thread_local! {
    /// Actions for the end of this thread's outermost group ([`after_group`]): part of
    /// the per-thread group state ([`GROUP`]), as NCCL's group keeps its launches.
    static AFTER: RefCell<Vec<Box<dyn FnOnce() -> Result<()>>>> = const { RefCell::new(Vec::new()) };
}

/// Run `f` when this thread's outermost group ends (after its calls were handed to
/// their communicators). Outside a group: now.
pub fn after_group(f: impl FnOnce() -> Result<()> + 'static) -> Result<()> {
    if !in_group() {
        return f();
    }
    AFTER.with(|a| a.borrow_mut().push(Box::new(f)));
    Ok(())
}

fn group_end_jobs() -> Result<()> {
    let batch = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 == 0 {
            return Err(Error::InvalidUsage("group end without group start".into()));
        }
        g.0 -= 1;
        Ok(if g.0 == 0 {
            std::mem::take(&mut g.1)
        } else {
            Vec::new()
        })
    })?;
    let mut per_comm: Vec<(CommCore, Vec<Pending>)> = Vec::new();
    for p in batch {
        match per_comm.iter_mut().find(|(c, _)| c.same(&p.comm)) {
            Some((_, v)) => v.push(p),
            None => per_comm.push((p.comm.clone(), vec![p])),
        }
    }
    // Launched calls: every communicator's share on this thread, inside one outer
    // vendor group, so calls of several communicators that must run together (sends on
    // one, receives on another) cannot deadlock, whatever their order. A thread driving
    // several ranks of an in-process world (one group over every rank's communicator,
    // as a single-process NCCL program drives its GPUs) hands each rank's share to that
    // communicator's stream thread instead, and waits for them to be enqueued: each
    // rank's vendor calls still come from one thread.
    let mut inline: Vec<(CommCore, Job, Vec<Work>)> = Vec::new();
    let mut outer: Option<CommCore> = None;
    for (comm, items) in per_comm {
        // Empty calls (no byte anywhere: nothing to move, nothing to stage) beside
        // launched ones, e.g. a zero-byte partner of a launched send, are completed here,
        // once for every caller, instead of making the share a host one that only a
        // stream thread would run after the group's end.
        let launched = items.iter().any(|p| p.launch);
        let (empties, items): (Vec<Pending>, Vec<Pending>) = if launched {
            items.into_iter().partition(|p| p.empty && !p.launch)
        } else {
            (Vec::new(), items)
        };
        let launch = launched && items.iter().all(|p| p.launch);
        let share = Share {
            deps: items.iter().flat_map(|p| p.deps.iter().cloned()).collect(),
            works: items.iter().map(|p| p.work.clone()).collect(),
            // Mismatch detection compares the group's collectives in submission order.
            calls: items.iter().filter_map(|p| p.call.clone()).collect(),
            timeout: comm.timeout(),
        };
        let job = if items.iter().all(|p| p.fusable) && comm.transport().gpu().is_some() {
            vendor_group(comm.clone(), items, &share, launch)
        } else {
            host_group(comm.clone(), items, &share)
        };
        let job = empties_done(&comm, job, empties);
        if launch {
            if outer.is_none() {
                outer = Some(comm.clone());
            }
            inline.push((comm.clone(), job, share.works.clone()));
        } else if let Err(e) = comm.push(Vec::new(), job, Work::pending()) {
            share.works.iter().for_each(|w| w.complete(Err(e.clone())));
        }
    }
    let Some(outer) = outer else {
        return Ok(());
    };
    let world_rank = |c: &CommCore| c.members()[c.rank()];
    if inline
        .iter()
        .any(|(c, _, _)| world_rank(c) != world_rank(&outer))
    {
        let mut pushed = Vec::new();
        for (c, job, works) in inline {
            let w = Work::pending();
            match c.push(Vec::new(), job, w.clone()) {
                Ok(()) => pushed.push(w),
                Err(e) => works.iter().for_each(|x| x.complete(Err(e.clone()))),
            }
        }
        let mut first = Ok(());
        for w in pushed {
            if let (Err(e), true) = (w.wait(), first.is_ok()) {
                first = Err(e);
            }
        }
        return first;
    }
    let mut first = Ok(());
    let mut run = || {
        for (_, job, works) in inline.drain(..) {
            let r = job();
            if let Err(e) = &r {
                works.iter().for_each(|w| w.complete(Err(e.clone())));
                if first.is_ok() {
                    first = r;
                }
            }
        }
        Ok(())
    };
    match outer.transport().gpu() {
        Some(g) => {
            // The launched calls' outer vendor group, enqueue only: on the
            // communicator's launch stream, the transport's end of group makes no host
            // wait (each call's own launch context went into its job when it was
            // submitted).
            let l = outer.launcher(g.device())?;
            g.group(Some(l.stream()), &mut run)?
        }
        None => run()?,
    }
    first
}

/// `job` (a communicator's share of a group), then the share's empty calls completed
/// with its outcome: each once its own dependencies are (at once when they are done, so
/// the share stays launch-only; otherwise on the communicator's stream, which waits for
/// them there, never on the launching thread).
fn empties_done(c: &CommCore, job: Job, empties: Vec<Pending>) -> Job {
    if empties.is_empty() {
        return job;
    }
    let c = c.clone();
    Box::new(move || {
        let r = job();
        for p in empties {
            match &r {
                Err(e) => p.work.complete(Err(e.clone())),
                Ok(()) if p.deps.iter().all(Work::is_done) => {
                    let timeout = c.timeout();
                    p.work.complete(super::stream::wait_deps(&p.deps, timeout));
                }
                Ok(()) => {
                    // A failed push completes the work with its error.
                    let _ = c.push(p.deps, Box::new(|| Ok(())), p.work);
                }
            }
        }
        r
    })
}

/// What one communicator's share of a group waits for and checks first.
struct Share {
    deps: Vec<Work>,
    works: Vec<Work>,
    calls: Vec<String>,
    timeout: std::time::Duration,
}

impl Share {
    /// The job's start: the members' dependencies, then the mismatch check.
    fn start(&self) -> impl FnOnce(&CommCore) -> Result<()> + Send + 'static {
        let (deps, calls, timeout) = (self.deps.clone(), self.calls.clone(), self.timeout);
        move |c| {
            super::stream::wait_deps(&deps, timeout).and_then(|_| super::mismatch::check(c, &calls))
        }
    }
}

/// On a GPU transport, a group of native device-buffer calls is one vendor group
/// (ncclGroupStart/End): sends and receives between peers cannot deadlock. Sends go
/// first (a stable reorder, harmless inside a vendor group): the in-process device
/// transports run the calls one by one with eager sends, so a receive then never waits
/// for a send queued behind it (a rank receiving from itself included).
fn vendor_group(c: CommCore, items: Vec<Pending>, share: &Share, launch: bool) -> Job {
    let start = share.start();
    let mut items = items;
    items.sort_by_key(|p| !p.is_send);
    let jobs: Vec<(Job, Work)> = items.into_iter().map(|p| (p.job, p.work)).collect();
    Box::new(move || {
        let mut first = start(&c);
        let mut results = Vec::new();
        let mut works = Vec::new();
        if first.is_ok() {
            let g = c
                .transport()
                .gpu()
                .ok_or_else(|| Error::Internal("GPU transport vanished".into()))?;
            // Launched calls: the group's end enqueues only (no host wait); each call's
            // own work goes on its own launch context's stream.
            let l = if launch {
                Some(c.launcher(g.device())?)
            } else {
                None
            };
            let mut jobs = Some(jobs);
            first = g.group(l.as_ref().map(|l| l.stream()), &mut || {
                for (job, w) in jobs.take().unwrap_or_default() {
                    results.push(job());
                    works.push(w);
                }
                Ok(())
            });
        } else {
            works = jobs.into_iter().map(|(_, w)| w).collect();
        }
        for (i, w) in works.iter().enumerate() {
            let r = match (&first, results.get(i)) {
                (Err(e), _) => Err(e.clone()),
                (Ok(()), Some(r)) => r.clone(),
                (Ok(()), None) => Ok(()),
            };
            w.complete(r);
        }
        if first.is_ok() {
            if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
                first = Err(e);
            }
        }
        first
    })
}

/// A group on a host path: its collectives (and device sends and receives, sends
/// first: eager on the GPU transports' staging path) in submission order, then its host
/// sends and receives as one exchange.
fn host_group(c: CommCore, items: Vec<Pending>, share: &Share) -> Job {
    let (start, timeout) = (share.start(), share.timeout);
    let mut ordered: Vec<(Job, Work, bool)> = Vec::new();
    let (mut p2p_ops, mut p2p_works) = (Vec::new(), Vec::new());
    for p in items {
        match p.p2p {
            Some(op) => {
                p2p_ops.push(op);
                p2p_works.push(p.work);
            }
            None => ordered.push((p.job, p.work, p.is_send)),
        }
    }
    ordered.sort_by_key(|(_, _, is_send)| !is_send);
    Box::new(move || {
        let mut first = start(&c);
        for (job, w, _) in ordered {
            let r = match &first {
                Ok(()) => job(),
                Err(e) => Err(e.clone()),
            };
            if let (Err(e), true) = (&r, first.is_ok()) {
                first = Err(e.clone());
            }
            w.complete(r);
        }
        if !p2p_ops.is_empty() {
            let r = match &first {
                Ok(()) => c
                    .still_running()
                    .and_then(|_| {
                        super::native::exchange(c.transport().as_ref(), &p2p_ops, timeout)
                    })
                    .map_err(|e| {
                        e.in_collective(|| format!("grouped send/recv ({} calls)", p2p_ops.len()))
                    }),
                Err(e) => Err(e.clone()),
            };
            if let (Err(e), true) = (&r, first.is_ok()) {
                // As a failed collective: the peers must not wait for this rank.
                c.fail(e);
                first = Err(e.clone());
            }
            let r = c.note(r);
            p2p_works.iter().for_each(|w| w.complete(r.clone()));
        }
        first
    })
}

/// True inside a group on this thread.
pub fn in_group() -> bool {
    GROUP.with(|g| g.borrow().0 > 0)
}

/// Hold a submission until the group ends (its [`Pending`] fields say what the group
/// does with it).
pub(crate) fn hold(p: Pending) {
    GROUP.with(|g| g.borrow_mut().1.push(p));
}
