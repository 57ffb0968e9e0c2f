//! The public Rust face: [`Comm`], a communicator bound to a topology and a transport,
//! and the front of every collective: check, select, dispatch.
//!
//! - Collectives are nonblocking: each returns a [`Work`] at once and runs on the
//!   communicator's stream thread in submission order. A `Work` can be waited on, or
//!   passed as a dependency of a request on another communicator ([`Request::after`]).
//! - Buffers are [`Buffer`]s (strata-owned memory shared with the stream); counts are
//!   in elements of the dtype; in-place rules are NCCL's (see [`request::Op`] and
//!   [`crate::kinds::Kind::in_place`]).
//! - Every collective, from Rust or C, goes through ONE path, [`Comm::submit`]: the
//!   request is checked once at this front ([`request::Checked`]: from Rust here, from C
//!   at the C boundary) and travels checked as that value, its algorithm chosen once
//!   ([`crate::algo::select::choose`]), and queued on the communicator core's stream
//!   ([`crate::runtime`]) to run [`crate::algo::run`] (or held by a group).
//! - Sub-communicators come from [`Comm::split`] on the transport; the per-level groups
//!   hierarchical algorithms use are split from the topology ([`Comm::level_comm`]).
//! - Worlds (in-process, MPI, NCCL/RCCL ids) are made in [`bootstrap`] and [`gpu`].

#![forbid(unsafe_code)]

pub mod bootstrap;
pub mod gpu;
pub mod ordered;
pub mod probe;

pub use crate::runtime::group::{self, group_end, group_start, in_group};
pub use crate::runtime::request::{self, Op, Request};
pub use crate::runtime::stream::{self, Work};
pub use crate::runtime::CommConfig;
pub use crate::topology::hierarchy::{self, Hierarchy};

use crate::algo::{self, select::Choice};
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::memory::Buffer;
use crate::runtime::{mismatch, CommCore, Job};
use crate::topology::{Level, Topology};
use crate::traffic::{Traffic, TrafficReport};
use crate::transport::{Transport, TransportKind};
use std::sync::Arc;
use std::time::Duration;

/// The outcome `r` of running `req` with `algo` on `core`, named after the collective;
/// a failure aborts the communicator (like an asynchronous NCCL error, a failed
/// collective leaves it unusable; aborting wakes the peers at once).
#[inline]
fn ran(core: &CommCore, req: &Request, algo: crate::Algo, r: Result<()>) -> Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(e) => failed(core, req, algo, e),
    }
}

#[cold]
#[inline(never)]
fn failed(core: &CommCore, req: &Request, algo: crate::Algo, e: Error) -> Result<()> {
    let e = e.in_collective(|| format!("{} ({}, {})", req.op.name(), algo, req.dtype));
    tracing::warn!(
        rank = core.rank(),
        op = req.op.name(),
        "collective failed, aborting communicator: {e}"
    );
    core.fail(&e);
    Err(e)
}

/// How [`Comm::submit_as`] runs a request.
pub(crate) enum How {
    /// Queued on the communicator's stream (or held by the group).
    Queue,
    /// On the calling thread when nothing is queued or running on the stream.
    Now,
    /// A launched device call ([`ordered`]): on the calling thread, every stage
    /// enqueued on the launcher's stream (held by the group until its end, then run
    /// on the thread that ends it), within the call's launch context.
    Launch(
        Arc<crate::runtime::ordered::Launcher>,
        crate::device::direct::Scope,
    ),
}

/// What [`Comm::submit_as`] did with a request.
enum Submitted {
    /// Queued on the stream (or held by the group): its handle.
    Queued(Work),
    /// Run on the calling thread already: its outcome.
    Ran(Result<()>),
}

/// What the inline form of a blocking call did ([`Comm::call`]).
enum Inline {
    /// Ran on the calling thread: its outcome.
    Ran(Result<()>),
    /// The stream has work queued or running: to be queued after it.
    Busy,
    /// Refused before running (a bad argument, a destroyed communicator).
    Refused(Error),
}

/// A communicator: this rank's handle on a group of ranks. Cheap to clone (clones share
/// the communicator); `Send + Sync`.
#[derive(Clone)]
pub struct Comm(CommCore);

/// A thread that panics while holding a communicator never takes part in it again: the
/// drop aborts it, so the peers fail now with a remote error instead of waiting out the
/// timeout (the C ABI, which catches panics as `strataInternalError`, aborts the same way).
impl Drop for Comm {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.abort();
        }
    }
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl Comm {
    /// Bind `transport` to the world topology `topo` (whose world size must cover every
    /// world rank of the transport).
    pub fn from_transport(
        transport: Arc<dyn Transport>,
        topo: Arc<Topology>,
        config: CommConfig,
    ) -> Result<Comm> {
        CommCore::new(transport, topo, config).map(Comm)
    }

    /// The communicator core algorithms run on.
    pub fn core(&self) -> &CommCore {
        &self.0
    }

    /// This rank in the communicator.
    pub fn rank(&self) -> usize {
        self.0.rank()
    }
    /// Ranks in the communicator.
    pub fn size(&self) -> usize {
        self.0.size()
    }
    /// World rank of communicator rank `r`.
    pub fn world_rank(&self, r: usize) -> usize {
        self.0.members()[r]
    }
    /// World ranks of all members, in communicator order.
    pub fn members(&self) -> &[usize] {
        self.0.members()
    }
    /// The world topology.
    pub fn topology(&self) -> &Arc<Topology> {
        self.0.topology()
    }
    /// The levels this communicator spans, when its ranks form a regular mesh.
    pub fn hierarchy(&self) -> Option<&Hierarchy> {
        self.0.hierarchy()
    }
    /// Which transport moves the bytes.
    pub fn transport_kind(&self) -> TransportKind {
        self.0.transport_kind()
    }
    /// The transport.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        self.0.transport()
    }
    /// Peer / dependency timeout.
    pub fn timeout(&self) -> Duration {
        self.0.timeout()
    }
    /// The configuration.
    pub fn config(&self) -> &CommConfig {
        self.0.config()
    }
    /// Traffic counters of the world (local: measured; mpi: nominal, this process's sends).
    pub fn traffic(&self) -> Option<Arc<Traffic>> {
        self.0.traffic()
    }
    /// The message of the last failed call on this communicator (empty if none).
    pub fn last_error(&self) -> String {
        self.0.last_error()
    }
    /// Record a failed call's message as this communicator's last error.
    pub fn note<T>(&self, r: Result<T>) -> Result<T> {
        self.0.note(r)
    }
    /// True when both handles are the same communicator.
    pub fn same(&self, other: &Comm) -> bool {
        self.0.same(&other.0)
    }

    /// True when collectives submitted now are first checked for mismatches across
    /// ranks (`STRATA_DEBUG=check` sets it on every communicator;
    /// [`crate::runtime::mismatch`]).
    pub fn checks(&self) -> bool {
        self.0.checks()
    }

    /// Turn mismatch checking on or off for this communicator's later submissions
    /// (and the communicators split from it afterwards). Every rank must make the same
    /// change between the same calls.
    pub fn set_check(&self, on: bool) {
        self.0.set_check(on)
    }

    /// Collective over this communicator (after its queued work): ranks passing the same
    /// `Some(color)` form a new communicator ordered by (key, rank); `None` opts out and
    /// returns `Ok(None)`.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Comm>> {
        let r = self.0.split(color, key, None);
        self.0.note(r).map(|c| c.map(Comm))
    }

    /// A communicator of the listed ranks of this one, created by those ranks alone
    /// (non-members do not call; `MPI_Comm_create_group`), as a framework's `new_group`
    /// needs. Every member passes the same list (any order; it is sorted, and the new
    /// ranks follow it). Members that do not all arrive within the timeout are
    /// [`Error::Remote`]. Supported on the `mpi`, `local`, `host-local` and `cuda-local`
    /// transports; elsewhere
    /// [`Error::InvalidUsage`] (use [`Comm::split`]).
    pub fn create_group(&self, ranks: &[usize]) -> Result<Comm> {
        self.create_group_with(ranks, None)
    }

    /// A new communicator of this one's ranks without `exclude` (ranks of this one), made
    /// by the survivors alone, as `ncclCommShrink`: the way on after ranks were lost.
    /// Every survivor calls it with the same list (any order); the excluded ranks do not
    /// call (they may be dead or frozen). It works on an aborted communicator, the usual
    /// case: a failure (a peer gone, a timeout) aborted this one, its calls fail, and the
    /// survivors shrink it. The new ranks follow the old order (a survivor's new rank is
    /// its old rank minus the excluded ranks below it); the world topology and this
    /// communicator's configuration carry over, so a node that lost ranks is a smaller
    /// node of the new communicator: `hier` and the other topology-aware algorithms
    /// take the irregular shape as they take any uneven member set (running, or falling
    /// back to `ring` with the reason), `auto` chooses for it, and the sub-communicators
    /// (node, rail, levels) are split from the new one on first use. Survivors that do
    /// not all arrive within the timeout fail with [`Error::Remote`] (try again with the
    /// late ones excluded). This communicator is left as it was (destroy it when done).
    ///
    /// Errors: [`Error::InvalidArgument`] for a rank out of range, repeated, or this
    /// rank excluded; [`Error::InvalidUsage`] on transports that cannot make a
    /// communicator of the survivors alone (today `nccl` and `rccl`). On `mpi` it is `MPI_Comm_create_group` of the survivors on a control
    /// communicator of their own, so it works after a failure; after a process died
    /// the job must run under a launcher that keeps the survivors (Open MPI:
    /// `mpirun --mca orte_enable_recovery 1`; docs/engine.md).
    pub fn shrink(&self, exclude: &[usize]) -> Result<Comm> {
        let r = self.0.shrink(exclude).map(Comm);
        self.0.note(r)
    }

    /// A census of this communicator's live ranks, the agreement a shrink needs after a
    /// failure: every live rank calls it; it returns, the same on each, the ranks that
    /// called before it closed (when every rank did, or one timeout after the first
    /// call), so `(0..size)` without them is the list to [`Comm::shrink`] away. Works on
    /// an aborted communicator. A rank calling after it closed gets [`Error::Remote`] (it
    /// was left out). Supported on the `local`, `mpi`, `host-local` and `cuda-local`
    /// transports; elsewhere
    /// [`Error::InvalidUsage`] (agree on the list another way: a launcher, a store).
    /// On `mpi` each rank listens one timeout from its own call, and the lowest rank
    /// heard decides: a rank it did not hear, or that hears no decision, gets the
    /// error, never a different list.
    pub fn survivors(&self) -> Result<Vec<usize>> {
        let r = self.0.survivors();
        self.0.note(r)
    }

    /// [`Comm::create_group`] whose default algorithm is `algo` (else this one's).
    pub fn create_group_with(&self, ranks: &[usize], algo: Option<crate::Algo>) -> Result<Comm> {
        let mut members = ranks.to_vec();
        members.sort_unstable();
        members.dedup();
        let r = (|| {
            if members.len() != ranks.len() {
                return Err(Error::InvalidArgument(format!(
                    "create_group: ranks {ranks:?} repeat a rank"
                )));
            }
            if let Some(bad) = members.iter().find(|&&m| m >= self.size()) {
                return Err(Error::InvalidArgument(format!(
                    "create_group: rank {bad} is not a rank of this communicator of {}",
                    self.size()
                )));
            }
            if !members.contains(&self.rank()) {
                return Err(Error::InvalidArgument(format!(
                    "create_group: this rank ({}) is not among {ranks:?}; only members call",
                    self.rank()
                )));
            }
            self.0.group(&members, algo).map(Comm)
        })();
        self.0.note(r)
    }

    /// [`Comm::split`] whose communicator, and every sub-communicator split off it, also
    /// counts the bytes it sends in `meter` (a [`crate::traffic::Traffic`] sized for the
    /// world topology), so the traffic of one purpose can be measured while other work
    /// runs at the same time ([`crate::transport::metered`]). Several communicators may
    /// share one meter.
    pub fn split_metered(
        &self,
        color: Option<u32>,
        key: i32,
        meter: Arc<crate::traffic::Traffic>,
    ) -> Result<Option<Comm>> {
        let r = self.0.split(color, key, Some(meter));
        self.0.note(r).map(|c| c.map(Comm))
    }

    /// The sub-communicator of level `i` of this communicator's hierarchy (the ranks
    /// differing from this one only along that level), split on first use and cached.
    /// Collective: every rank must reach the same first use. It is this handle's own
    /// communicator: the algorithms of this communicator (hier, ho-ring, qgz, qwz) run
    /// their steps on private ones, so work on it never waits on, or interleaves with,
    /// their steps.
    pub fn level_comm(&self, i: usize) -> Result<Comm> {
        self.0.user_level(i).map(Comm)
    }

    /// Ranks of this rank's node (`node_comm`) or its rail (same index within the node,
    /// across nodes: `rail_comm`), split on first use and cached; collective like
    /// [`Comm::level_comm`]. Needs a regular mesh ([`Comm::hierarchy`]). On one node the
    /// node communicator has every rank and each rail one.
    pub fn node_comm(&self) -> Result<Comm> {
        self.0.user_node_or_rail(true).map(Comm)
    }

    /// See [`Comm::node_comm`].
    pub fn rail_comm(&self) -> Result<Comm> {
        self.0.user_node_or_rail(false).map(Comm)
    }

    /// The algorithm `req` would run with on this communicator, and why (the same
    /// decision [`Comm::submit`] makes; `req` as submitted, before its checks).
    pub fn choose(&self, req: &Request) -> Choice {
        algo::select::choose(&self.0, req)
    }

    /// The one submit path: check the request, pick the algorithm, and queue it on this
    /// communicator's stream (or hold it until the thread's group ends). Bad arguments
    /// fail here, synchronously, and nothing is queued. A collective that fails while
    /// running (a dead peer, counts that differ across ranks) aborts the communicator,
    /// so its peers fail at once instead of waiting for their timeout.
    pub fn submit(&self, req: Request) -> Result<Work> {
        let req = self.front(req)?;
        self.submit_checked(req)
    }

    /// The front of every call from Rust: `req` checked once, for this rank, as the
    /// [`request::Checked`] value the run and launch paths take.
    #[inline]
    fn front(&self, req: Request) -> Result<request::Checked> {
        let core = &self.0;
        let r = core
            .alive()
            .and_then(|_| request::Checked::new(req, core.rank(), core.size()));
        core.note(r)
    }

    /// [`Comm::submit`] of a request checked already (the C boundary's): not checked
    /// again when it was checked for this rank and size ([`request::Checked::on`]).
    pub fn submit_checked(&self, req: request::Checked) -> Result<Work> {
        let req = self.0.note(req.on(self.rank(), self.size()))?;
        if let Some(dev) = self.launchable(req.request()) {
            return self.launch(req, &dev, None);
        }
        match self.submit_as(req, How::Queue)? {
            Submitted::Queued(w) => Ok(w),
            Submitted::Ran(r) => Ok(Work::ready(r)),
        }
    }

    /// Submit `req` and wait for it: a blocking collective, as a blocking MPI call or
    /// nccl-tests' `-z 1`. With nothing queued or running on the stream it runs on the
    /// calling thread (no hand-off to the stream thread and back); otherwise it runs
    /// after the queued work, in order. Its error if it failed. Inside a group
    /// ([`crate::runtime::group`]) it is [`Error::InvalidUsage`]: a grouped call only
    /// runs when the group ends, so waiting for it here could never finish.
    pub fn call(&self, req: Request) -> Result<()> {
        self.outside_group()?;
        let req = self.front(req)?;
        self.call_now(req)
    }

    /// [`Comm::call`] of a request checked already ([`Comm::submit_checked`]).
    pub fn call_checked(&self, req: request::Checked) -> Result<()> {
        self.outside_group()?;
        let req = self.0.note(req.on(self.rank(), self.size()))?;
        self.call_now(req)
    }

    /// A blocking call is refused inside a group ([`Comm::call`]).
    #[inline]
    fn outside_group(&self) -> Result<()> {
        if group::in_group() {
            return self.0.note(Err(Error::InvalidUsage(
                "a blocking call inside a group: submit it and wait after group end".into(),
            )));
        }
        Ok(())
    }

    /// The blocking call itself, outside a group.
    fn call_now(&self, req: request::Checked) -> Result<()> {
        if let Some(dev) = self.launchable(req.request()) {
            let r = self
                .launch(req, &dev, None)
                .and_then(|w| self.wait_launched(&w));
            return self.0.note(r);
        }
        // Unchecked (no mismatch detection), on an idle stream: chosen and run here, the
        // request where it lies (no job built, nothing moved, cloned, boxed or queued).
        // With work ahead on the stream it is queued behind it below.
        if !self.0.checks() {
            match self.run_inline(&req) {
                Inline::Ran(r) => return self.0.note(r),
                Inline::Busy => {}
                Inline::Refused(e) => return self.0.note(Err(e)),
            }
        }
        let r = match self.submit_as(req, How::Now)? {
            Submitted::Queued(w) => w.wait(),
            Submitted::Ran(r) => r,
        };
        self.0.note(r)
    }

    /// The device a request is launched on ([`ordered`]): `Some` when this communicator
    /// is on a device transport and the request's buffers are device memory (outside an
    /// algorithm's own steps).
    #[inline(always)]
    fn launchable(&self, req: &Request) -> Option<Arc<dyn crate::device::Device>> {
        if !self.0.has_device() {
            return None; // host transports: nothing more to look at
        }
        self.launchable_on_device(req)
    }

    fn launchable_on_device(&self, req: &Request) -> Option<Arc<dyn crate::device::Device>> {
        let dev = self.device()?;
        if self.0.on_stream() {
            return None;
        }
        req.op.device().and(Some(dev))
    }

    /// Check, choose, and queue `req` (or hold it in the group), or run it on this
    /// thread, as `how` says.
    fn submit_as(&self, req: request::Checked, how: How) -> Result<Submitted> {
        let core = &self.0;
        let r = (|| {
            core.alive()?;
            let req = req.into_request();
            let choice = algo::select::choose(core, &req);
            tracing::debug!(rank = core.rank(), op = req.op.name(), algo = choice.algo.name(), reason = %choice.reason, "dispatch");
            let deps = req.deps.clone();
            let is_send = matches!(req.op, Op::Send { .. });
            let empty = !req.op.has_bytes();
            // A grouped send/recv on host memory joins the group's one exchange.
            let p2p = (matches!(req.op, Op::Send { .. } | Op::Recv { .. })
                && req.op.device().is_none())
            .then(|| req.op.clone());
            let grouped = group::in_group();
            let fusable = grouped && core.has_device() && algo::fusable(&req, choice.algo);
            // Mismatch detection: what this rank calls, compared across ranks on the
            // stream before the collective runs (by the group when grouped).
            // Not for a launched device call: the check's exchange is staged through
            // device memory with synchronous copies (host waits, which a capture forbids).
            let launch_call = matches!(how, How::Launch(..));
            let now = matches!(how, How::Now);
            let (launch, scope) = match how {
                How::Launch(l, sc) => (Some(l), Some(sc)),
                _ => (None, None),
            };
            let call = core
                .checks()
                .then(|| mismatch::describe(&req, choice.algo))
                .flatten()
                .filter(|_| launch.is_none());
            let own_call = call.clone().filter(|_| !grouped);
            // A launch's algorithm runs on the launched view of this communicator.
            let c = match scope.clone() {
                Some(sc) => core.launched(sc),
                None => core.clone(),
            };
            let dev = launch.as_ref().and_then(|_| self.device());
            let job = move || {
                // A launch run at a group's end: the device current, the thread marked,
                // one launch at a time on the communicator.
                let _bound = dev.as_ref().map(|d| d.bind()).transpose()?;
                let _mark = launch.as_ref().map(|_| crate::device::waits::launching());
                let _held = launch.as_ref().map(|l| l.hold());
                if let Some(call) = &own_call {
                    if let Err(e) = c
                        .still_running()
                        .and_then(|_| mismatch::check(&c, std::slice::from_ref(call)))
                    {
                        return Err(e);
                    }
                }
                let r = c
                    .still_running()
                    .and_then(|_| algo::run(&c, choice.algo, &req));
                // A launch: its side streams back into the launch stream now, before its
                // scratch is free for the next call (even after a failure: a capture
                // must have every stream joined back).
                let r = match &scope {
                    Some(sc) => r.and(sc.join_sides()),
                    None => r,
                };
                c.note(ran(&c, &req, choice.algo, r))
            };
            let is_launch = launch_call;
            if is_launch && !grouped {
                // Inline, after any host work still queued on the stream (dependencies
                // were joined by the launch).
                return Ok(Submitted::Ran(match core.run_now(&deps, job) {
                    Ok(r) => r,
                    Err(job) => core.sync().and_then(|_| job()),
                }));
            }
            let job = if now && !grouped {
                match core.run_now(&deps, job) {
                    Ok(r) => return Ok(Submitted::Ran(r)),
                    Err(job) => job,
                }
            } else {
                job
            };
            // Grouped jobs run at the group's end, a launch's with its view of the call.
            let job: Job = Box::new(job);
            let work = Work::pending();
            if grouped {
                group::hold(group::Pending {
                    comm: core.clone(),
                    deps,
                    job,
                    work: work.clone(),
                    is_send,
                    fusable,
                    call,
                    p2p,
                    launch: is_launch,
                    empty,
                });
            } else {
                core.push(deps, job, work.clone())?;
            }
            Ok(Submitted::Queued(work))
        })();
        core.note(r)
    }

    /// The inline form of a blocking call ([`Comm::call`]): choose the algorithm of the
    /// checked `req`, then, when nothing is queued or running on the stream, run it on
    /// this thread. [`Inline::Busy`]: to be queued.
    fn run_inline(&self, req: &request::Checked) -> Inline {
        let core = &self.0;
        if let Err(e) = core.alive() {
            return Inline::Refused(e);
        }
        let req = req.request();
        let algo = if tracing::enabled!(tracing::Level::DEBUG) {
            let choice = algo::select::choose(core, req);
            tracing::debug!(rank = core.rank(), op = req.op.name(), algo = choice.algo.name(), reason = %choice.reason, "dispatch");
            choice.algo
        } else {
            algo::select::choose_algo(core, req)
        };
        let run = || ran(core, req, algo, algo::run(core, algo, req));
        match core.run_now(&req.deps, run) {
            Ok(r) => Inline::Ran(r),
            Err(_) => Inline::Busy,
        }
    }

    /// Barrier over the communicator, after its queued work; moves no counted bytes.
    pub fn barrier(&self) -> Result<()> {
        let r = self.0.barrier();
        self.0.note(r)
    }

    /// Collective: the sum of every rank's traffic matrix (identity on the local
    /// transport, whose ranks share counters; on MPI each process records only its own
    /// sends). Call it after waiting for the work whose traffic it should include.
    pub fn sum_traffic(
        &self,
        m: &crate::traffic::TrafficMatrix,
    ) -> Result<crate::traffic::TrafficMatrix> {
        let r = self
            .0
            .alive()
            .and_then(|_| self.0.sync())
            .and_then(|_| self.0.transport().sum_traffic(m));
        self.0.note(r)
    }

    /// The traffic strata counted for the sends of this rank (`all_members == false`:
    /// not collective, this rank's row) or of every member of this communicator
    /// (`all_members == true`: collective, after the queued work, summed over the
    /// members' processes), since the world was created, classified by the world
    /// topology; `max_node_egress` is the most bytes those senders sent out of any one
    /// node. Measured on the in-process transports, nominal on mpi (the sends strata's
    /// own algorithms issue; `--algo mpi` calls are not counted); the second value says
    /// which (`true`: measured). Transports that count nothing (nccl, rccl) fail with
    /// `InvalidUsage`. Subtract two reports to get what ran in between.
    pub fn traffic_report(&self, all_members: bool) -> Result<(TrafficReport, bool)> {
        let r = self.traffic_report_inner(all_members);
        self.0.note(r)
    }

    fn traffic_report_inner(&self, all_members: bool) -> Result<(TrafficReport, bool)> {
        self.0.alive()?;
        let Some(t) = self.traffic() else {
            return crate::invalid_usage!(
                "the {} transport counts no traffic (NCCL/RCCL move the bytes)",
                self.transport_kind().name()
            );
        };
        let m = if all_members {
            // Every member's earlier sends done, and none of its later ones started
            // before every member has read (in-process worlds share one counter).
            self.0.barrier()?;
            let snap = t.snapshot();
            self.0.barrier()?;
            self.0
                .transport()
                .sum_traffic(&snap)?
                .rows_of(self.members())
        } else {
            t.snapshot().rows_of(&[self.world_rank(self.rank())])
        };
        Ok((
            m.report(t.topology()),
            self.transport_kind().traffic_measured(),
        ))
    }

    /// Start recording every transfer of this world (measured transports only) for
    /// [`Comm::finish_recording`] ([`crate::sim::schedule::start_recording`]).
    pub fn start_recording(&self) -> Result<()> {
        crate::sim::schedule::start_recording(self.traffic().as_deref(), self.transport_kind())
    }

    /// The schedule recorded since [`Comm::start_recording`], replayable by the
    /// simulator.
    pub fn finish_recording(&self) -> Result<crate::sim::schedule::Schedule> {
        crate::sim::schedule::finish_recording(self.traffic().as_deref(), self.topology())
    }

    /// Wait for everything queued on this communicator so far.
    pub fn sync(&self) -> Result<()> {
        self.0.sync()
    }

    /// Abort (ncclCommAbort): wake every waiter of this communicator, here and on the
    /// peers, with an error; the communicator is unusable afterwards.
    pub fn abort(&self) {
        self.0.abort()
    }

    /// Finish queued work and release the communicator; later calls fail with
    /// `InvalidUsage`.
    pub fn destroy(&self) -> Result<()> {
        self.0.destroy()
    }

    // ---- convenience constructors of requests (all go through `submit`) ----

    /// ncclAllGather: `recv` (size·count) gathers `send` (count) from every rank.
    pub fn all_gather(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: usize,
        dtype: DataType,
    ) -> Result<Work> {
        self.submit(Request::new(
            Op::AllGather {
                send: send.clone(),
                recv: recv.clone(),
                count,
            },
            dtype,
        ))
    }
    /// ncclReduceScatter: `recv` (count) = `op` over ranks of `send[rank·count..]`.
    pub fn reduce_scatter(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<Work> {
        self.submit(Request::new(
            Op::ReduceScatter {
                send: send.clone(),
                recv: recv.clone(),
                count,
                op,
            },
            dtype,
        ))
    }
    /// ncclAllReduce.
    pub fn all_reduce(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<Work> {
        self.submit(Request::new(
            Op::AllReduce {
                send: send.clone(),
                recv: recv.clone(),
                count,
                op,
            },
            dtype,
        ))
    }
    /// ncclAlltoAll: `count` elements per peer.
    pub fn all_to_all(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: usize,
        dtype: DataType,
    ) -> Result<Work> {
        self.submit(Request::new(
            Op::AllToAll {
                send: send.clone(),
                recv: recv.clone(),
                count,
            },
            dtype,
        ))
    }
    /// ncclBroadcast from `root`.
    pub fn broadcast(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<Work> {
        self.submit(Request::new(
            Op::Broadcast {
                send: send.clone(),
                recv: recv.clone(),
                count,
                root,
            },
            dtype,
        ))
    }
    /// ncclSend.
    pub fn send(&self, buf: &Buffer, count: usize, dtype: DataType, peer: usize) -> Result<Work> {
        self.submit(Request::new(
            Op::Send {
                buf: buf.clone(),
                count,
                peer,
            },
            dtype,
        ))
    }
    /// ncclRecv.
    pub fn recv(&self, buf: &Buffer, count: usize, dtype: DataType, peer: usize) -> Result<Work> {
        self.submit(Request::new(
            Op::Recv {
                buf: buf.clone(),
                count,
                peer,
            },
            dtype,
        ))
    }
    /// MiCS coalesced all-gather over buffers of uneven counts, one launch.
    pub fn all_gather_coalesced(
        &self,
        sends: &[Buffer],
        recvs: &[Buffer],
        counts: &[usize],
        dtype: DataType,
    ) -> Result<Work> {
        self.submit(Request::new(
            Op::AllGatherCoalesced {
                sends: sends.to_vec(),
                recvs: recvs.to_vec(),
                counts: counts.to_vec(),
            },
            dtype,
        ))
    }
    /// MiCS coalesced reduce-scatter over buffers of uneven counts, one launch.
    pub fn reduce_scatter_coalesced(
        &self,
        sends: &[Buffer],
        recvs: &[Buffer],
        counts: &[usize],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<Work> {
        self.submit(Request::new(
            Op::ReduceScatterCoalesced {
                sends: sends.to_vec(),
                recvs: recvs.to_vec(),
                counts: counts.to_vec(),
                op,
            },
            dtype,
        ))
    }
}

/// The level kinds, re-exported for algorithm code.
pub type LevelKind = Level;
