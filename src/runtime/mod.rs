//! The communicator core: what every collective runs on once the front ([`crate::comm`])
//! has checked it and chosen its algorithm.
//!
//! - [`CommCore`]: a transport bound to the world topology, its members and their
//!   [`Hierarchy`], a [`stream`] thread that runs work in submission order, and the cache
//!   of sub-communicators (levels, node, rail) that algorithms split once and reuse.
//! - [`CommCore::enqueue`] / [`CommCore::enqueue_batch`]: the ONE way an algorithm
//!   reaches the wire. A native op (already valid by construction) runs on that
//!   communicator's stream after `deps` and after everything queued on it before; called
//!   from the communicator's own stream thread (an algorithm using its own communicator),
//!   inside a launched device call, or on a device transport, it runs at once on the
//!   calling thread, which is the same order (and keeps every vendor call of one
//!   collective on one thread, in program order, the same on every rank). A batch is one stream task, and one vendor
//!   group (ncclGroupStart/End) when it is made of device-buffer ops on a GPU transport.
//!   A native op that fails aborts its communicator ([`CommCore::fail`]): the work
//!   queued behind it and the work that depends on it fail at once, so a dead peer costs
//!   one timeout, not one per pipelined step. The one exception, [`CommCore::host_steps`]:
//!   on a host transport with the communicator's stream idle, an algorithm's steps on a
//!   communicator of its own may run straight on the transport on this thread (the same
//!   messages, no op per step; `log-step` does), with the same failure rule.
//! - [`mismatch`]: collective mismatch detection (`STRATA_DEBUG=check`), run on the
//!   stream before a checked collective or group.
//! - [`request`]: the request descriptor, its checks and NCCL's in-place rule;
//!   [`native`]: execution of one op by the transport; [`group`]: group start/end.
//!
//! Nothing here chooses an algorithm or divides an `Avg` result: that is the front's
//! and [`crate::algo::run`]'s business, one layer up.

#![forbid(unsafe_code)]

pub mod group;
pub mod launch;
pub mod mismatch;
pub mod native;
pub mod ordered;
pub mod request;
pub mod stream;
pub mod watchdog;

pub use request::{Op, Request};
pub use stream::Work;

use crate::bufops::Ops;
use crate::config;
pub use crate::config::LinkSource;
use crate::device::direct::{Launched, Scope};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::kinds::Algo;
use crate::memory::Buffer;
use crate::topology::{Hierarchy, Level, Topology};
use crate::traffic::Traffic;
use crate::transport::{Transport, TransportKind};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Options of a communicator. `Default` reads `STRATA_ALGO` and `STRATA_TIMEOUT`.
#[derive(Debug, Clone)]
pub struct CommConfig {
    /// Algorithm used when a request carries no hint (`Auto` picks by the documented rule).
    pub algo: Algo,
    /// How long to wait for a peer or a dependency before failing.
    pub timeout: Duration,
    /// Pieces per chunk for the pipelined algorithms (`ho-ring`); `None`:
    /// round(sqrt(chunk / 128 KiB)) in 1..=16 (`STRATA_HORING_CHUNKS` overrides it).
    pub ho_ring_chunks: Option<usize>,
    /// Where a new world's link figures come from (`STRATA_LINKS`): the topology's own,
    /// or measured by the link probe at creation (`crate::comm::probe`). Only world
    /// constructors read it; communicators split from a world keep its figures.
    pub links: LinkSource,
}

impl CommConfig {
    /// From the environment, or the error a malformed variable caused.
    pub fn from_env() -> Result<CommConfig> {
        let e = config::env()?;
        Ok(CommConfig {
            algo: e.algo.unwrap_or(Algo::Auto),
            timeout: e.timeout,
            ho_ring_chunks: e.ho_ring_chunks,
            links: e.links,
        })
    }
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig::from_env().unwrap_or(CommConfig {
            algo: Algo::Auto,
            timeout: config::DEFAULT_TIMEOUT,
            ho_ring_chunks: None,
            links: LinkSource::Preset,
        })
    }
}

pub(crate) type Job = Box<dyn FnOnce() -> Result<()> + Send>;

struct Inner {
    transport: Arc<dyn Transport>,
    topo: Arc<Topology>,
    members: Vec<usize>,
    hierarchy: Option<Hierarchy>,
    stream: stream::Stream,
    config: CommConfig,
    subcomms: Mutex<HashMap<String, CommCore>>,
    destroyed: AtomicBool,
    /// Set by [`CommCore::abort`] (a failure's or the user's), not by a destroy.
    aborted: AtomicBool,
    last_error: Mutex<String>,
    /// The first failure that aborted the communicator ([`CommCore::fail`]).
    failure: Mutex<Option<Error>>,
    /// Collective mismatch detection on ([`mismatch`]); the sequence number of the
    /// next checked call.
    check: AtomicBool,
    check_seq: AtomicU64,
    /// The launch stream and arena of launched device calls, made on first use.
    launcher: std::sync::OnceLock<Arc<ordered::Launcher>>,
    /// This rank and the size, the transport's (fixed for its life), read per call.
    rank: usize,
    size: usize,
    /// The transport has a device face ([`Transport::gpu`]; fixed for its life).
    device: bool,
    /// Words the front keeps its algorithm choices in, one slot per call shape's hash
    /// (`crate::algo::select::choose_algo`); 0 when none. Nothing here reads them.
    chosen: [AtomicU64; CHOSEN_SLOTS],
}

/// Slots of a communicator's remembered algorithm choices ([`CommCore::chosen`]).
const CHOSEN_SLOTS: usize = 64;

/// The core of a communicator (cheap to clone; clones share it). The public face is
/// [`crate::comm::Comm`]; algorithms get a `&CommCore`.
///
/// The second field is the launched call this handle works for, if any (a launched
/// view, [`CommCore::launched`]): the call's launch context ([`Scope`]: its stream and
/// arena lease) travels with the communicator the algorithm is given, and from there as
/// an argument to everything that enqueues device work or allocates scratch for the call.
#[derive(Clone)]
pub struct CommCore(Arc<Inner>, Option<Scope>);

impl std::fmt::Debug for CommCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Comm(rank {}/{}, {})",
            self.rank(),
            self.size(),
            self.0.transport.kind().name()
        )
    }
}

impl CommCore {
    /// Bind `transport` to the world topology `topo` (whose world size must cover every
    /// world rank of the transport) and start its stream.
    pub fn new(
        transport: Arc<dyn Transport>,
        topo: Arc<Topology>,
        config: CommConfig,
    ) -> Result<CommCore> {
        crate::log::init();
        let members: Vec<usize> = (0..transport.size())
            .map(|r| transport.world_rank(r))
            .collect();
        if let Some(bad) = members.iter().find(|&&m| m >= topo.world_size()) {
            return Err(Error::InvalidUsage(format!(
                "world rank {bad} is outside topology {}",
                topo.summary()
            )));
        }
        let hierarchy = Hierarchy::detect(&topo, &members);
        let name = format!(
            "strata-{}-r{}",
            transport.kind().name(),
            transport.world_rank(transport.rank())
        );
        let stream = stream::Stream::new(name, config.timeout)?;
        tracing::debug!(
            rank = transport.rank(),
            size = transport.size(),
            ?hierarchy,
            "communicator created"
        );
        let (rank, size) = (transport.rank(), transport.size());
        let device = transport.gpu().is_some();
        Ok(CommCore(
            Arc::new(Inner {
                transport,
                topo,
                members,
                hierarchy,
                stream,
                config,
                subcomms: Mutex::new(HashMap::new()),
                destroyed: AtomicBool::new(false),
                aborted: AtomicBool::new(false),
                last_error: Mutex::new(String::new()),
                failure: Mutex::new(None),
                check: AtomicBool::new(config::env().is_ok_and(|e| e.check)),
                check_seq: AtomicU64::new(0),
                launcher: std::sync::OnceLock::new(),
                rank,
                size,
                device,
                chosen: [const { AtomicU64::new(0) }; CHOSEN_SLOTS],
            }),
            None,
        ))
    }

    /// This communicator working for the launched call `sc` (what the launch gives the
    /// algorithm): its batches run inside the call on this thread, its sub-communicators
    /// are views of the same call, its buffer operations go on the call's launch stream
    /// and its scratch comes from the call's arena.
    pub(crate) fn launched(&self, sc: Scope) -> CommCore {
        CommCore(self.0.clone(), Some(sc))
    }

    /// Work for the launched call on its launch stream, if this handle works for one.
    #[inline]
    fn at(&self) -> Option<Launched<'_>> {
        self.1.as_ref().map(|sc| Launched {
            scope: sc,
            stream: &sc.stream,
        })
    }

    /// Zeroed scratch of `bytes` next to `like` (host, or its device): inside a launched
    /// call, a block of its arena cleared on its launch stream ([`Scope::alloc`]).
    pub fn alloc_like(&self, like: &Buffer, bytes: usize) -> Result<Buffer> {
        match &self.1 {
            Some(sc) => like.alloc_like_in(bytes, sc, &sc.stream),
            None => like.alloc_like(bytes),
        }
    }

    /// The launch stream and scratch arena of this communicator's launched device calls
    /// ([`ordered`]) on `dev`, made on first use.
    pub fn launcher(&self, dev: &Arc<dyn crate::device::Device>) -> Result<Arc<ordered::Launcher>> {
        if let Some(s) = self.0.launcher.get() {
            return Ok(s.clone());
        }
        let s = Arc::new(crate::device::waits::outside(|| {
            ordered::Launcher::new(dev)
        })?);
        Ok(self.0.launcher.get_or_init(|| s).clone())
    }

    /// True when collectives submitted now are checked for mismatches across ranks
    /// ([`mismatch`]); starts as `STRATA_DEBUG` says (`check`), sub-communicators
    /// start as the communicator they are split from is at the split.
    pub fn checks(&self) -> bool {
        self.0.check.load(Ordering::Relaxed)
    }

    /// Turn mismatch checking of later submissions on or off. Every rank must make the
    /// same change between the same calls (a checked call exchanges a fingerprint).
    pub fn set_check(&self, on: bool) {
        self.0.check.store(on, Ordering::Relaxed)
    }

    /// The sequence number of the next checked call (from the stream thread).
    pub(crate) fn next_check_seq(&self) -> u64 {
        self.0.check_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// `c` created from this communicator: it checks as this one does now.
    fn inherit(&self, c: CommCore) -> CommCore {
        c.set_check(self.checks());
        c
    }

    /// This rank in the communicator.
    #[inline]
    pub fn rank(&self) -> usize {
        self.0.rank
    }
    /// Ranks in the communicator.
    #[inline]
    pub fn size(&self) -> usize {
        self.0.size
    }
    /// The word the front remembers its algorithm choice for a call of shape `key` in
    /// (see `crate::algo::select::choose_algo`): a direct-mapped table, so the few
    /// shapes a training step repeats (FSDP's layers) each keep theirs.
    #[inline]
    pub(crate) fn chosen(&self, key: u64) -> &AtomicU64 {
        // Fibonacci hashing of the key's shape bits (the low ten hold the answer and a
        // constant).
        let i = ((key >> 10).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize;
        &self.0.chosen[i % CHOSEN_SLOTS]
    }
    /// World ranks of all members, in communicator order.
    pub fn members(&self) -> &[usize] {
        &self.0.members
    }
    /// The world topology.
    pub fn topology(&self) -> &Arc<Topology> {
        &self.0.topo
    }
    /// The levels this communicator spans, when its ranks form a regular mesh.
    pub fn hierarchy(&self) -> Option<&Hierarchy> {
        self.0.hierarchy.as_ref()
    }
    /// The configuration.
    pub fn config(&self) -> &CommConfig {
        &self.0.config
    }
    /// Peer / dependency timeout.
    pub fn timeout(&self) -> Duration {
        self.0.config.timeout
    }
    /// Which transport moves the bytes.
    pub fn transport_kind(&self) -> TransportKind {
        self.0.transport.kind()
    }
    /// The transport.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.0.transport
    }
    /// Traffic counters (local: measured; mpi: nominal, this process's sends).
    pub fn traffic(&self) -> Option<Arc<Traffic>> {
        self.0.transport.traffic()
    }
    /// True on a transport with a device face whose stream runs device work.
    #[inline]
    pub fn has_device(&self) -> bool {
        self.0.device
    }
    /// Local buffer operations (copies, reductions, `Avg`, quantization kernels) on
    /// this communicator's device stream, or on the host.
    pub fn ops(&self) -> Ops<'_> {
        Ops::new(self.0.transport.as_ref(), self.timeout(), self.at())
    }
    /// True when both handles are the same communicator.
    pub fn same(&self, other: &CommCore) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The message of the last failed call on this communicator (empty if none).
    pub fn last_error(&self) -> String {
        self.0
            .last_error
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// Record `r`'s error as the last error, and pass `r` on.
    #[inline]
    pub fn note<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            self.record_error(e);
        }
        r
    }

    #[cold]
    #[inline(never)]
    fn record_error(&self, e: &Error) {
        if let Ok(mut s) = self.0.last_error.lock() {
            *s = e.to_string();
        }
    }

    /// `InvalidUsage` once the communicator was destroyed or aborted.
    #[inline]
    pub fn alive(&self) -> Result<()> {
        if self.0.destroyed.load(Ordering::SeqCst) {
            return Err(self.gone(false));
        }
        Ok(())
    }

    /// For work that was queued before the communicator was aborted: a `Remote` error
    /// (naming the failure that aborted it) instead of running.
    #[inline]
    pub fn still_running(&self) -> Result<()> {
        if self.0.destroyed.load(Ordering::SeqCst) {
            return Err(self.gone(true));
        }
        Ok(())
    }

    /// The error of a call on a destroyed or aborted communicator, naming the failure
    /// that aborted it, when one did (it may have reached only a Work nobody waited
    /// for): [`CommCore::still_running`]'s (`queued`: work queued before the abort) or
    /// [`CommCore::alive`]'s.
    #[cold]
    #[inline(never)]
    fn gone(&self, queued: bool) -> Error {
        let why = self.0.failure.lock().ok().and_then(|f| f.clone());
        match (queued, why) {
            (true, Some(why)) => Error::Remote(format!("communicator was aborted after: {why}")),
            (true, None) => Error::Remote("communicator was aborted".into()),
            (false, Some(why)) => Error::InvalidUsage(format!(
                "communicator used after destroy or abort (aborted by: {why})"
            )),
            (false, None) => Error::InvalidUsage("communicator used after destroy or abort".into()),
        }
    }

    /// Queue `job` on the stream after `deps`; `work` completes with its outcome.
    pub(crate) fn push(&self, deps: Vec<Work>, job: Job, work: Work) -> Result<()> {
        self.0.stream.push(deps, job, work)
    }

    /// For a caller that would wait for `job` next: with nothing queued or running on
    /// the stream, run it after `deps` on the calling thread now; else `Err(job)`.
    pub(crate) fn run_now<F>(&self, deps: &[Work], job: F) -> std::result::Result<Result<()>, F>
    where
        F: FnOnce() -> Result<()>,
    {
        self.0.stream.run_now(deps, job)
    }

    /// True when called from this communicator's stream thread (inside running work).
    pub fn on_stream(&self) -> bool {
        self.0.stream.is_current()
    }

    /// Run the native `op` (valid by construction: algorithms build it from checked
    /// requests) after `deps`, in this communicator's stream order. The one way an
    /// algorithm reaches the wire; see the module doc.
    pub fn enqueue(&self, op: Op, dtype: DataType, deps: Vec<Work>) -> Work {
        self.enqueue_batch(vec![op], dtype, deps)
    }

    /// [`CommCore::enqueue`] of several ops as one stream task (one vendor group on a
    /// GPU transport when every op is on device buffers), completing when all have run.
    pub fn enqueue_batch(&self, ops: Vec<Op>, dtype: DataType, deps: Vec<Work>) -> Work {
        // On the stream thread (an algorithm on its own communicator), inside a launched
        // device call, and on any device transport: now, on this thread, so that every
        // vendor call of one collective comes from one thread in program order (the same
        // on every rank), as NCCL requires of calls on several communicators.
        if let Some(sc) = &self.1 {
            return self.launch_batch(sc, ops, dtype, deps);
        }
        if self.on_stream() || self.has_device() {
            let r =
                stream::wait_deps(&deps, self.timeout()).and_then(|_| self.run_ops(&ops, dtype));
            return Work::ready(r);
        }
        let work = Work::pending();
        let core = self.clone();
        let job: Job = Box::new(move || core.run_ops(&ops, dtype));
        if let Err(e) = self.push(deps, job, work.clone()) {
            work.complete(Err(e));
        }
        work
    }

    /// Run an algorithm's `steps` on this thread straight on the transport's host face
    /// (its `sendrecv`, `exchange`, `sendrecv_reduce` on borrowed bytes), with no ops
    /// built and no per-step hand-off: where the transport has no device face, no
    /// launch is open and this communicator's stream is idle (it is claimed for the
    /// whole run, as [`CommCore::run_batch`] claims it per step). An error fails the
    /// communicator as a failed batch does. `Err(steps)` where that does not hold:
    /// run the steps as ops ([`CommCore::run_batch`]).
    pub fn host_steps<F>(&self, steps: F) -> std::result::Result<Result<()>, F>
    where
        F: FnOnce(&dyn Transport) -> Result<()>,
    {
        if self.1.is_some() || self.has_device() || self.on_stream() {
            return Err(steps);
        }
        let t = self.0.transport.as_ref();
        let mut job = Some(steps);
        let ran = self.run_now(&[], || {
            self.still_running()?;
            match job.take() {
                Some(f) => f(t),
                None => Err(Error::Internal("host steps ran twice".into())),
            }
        });
        match ran {
            Ok(r) => {
                if let Err(e) = &r {
                    self.fail(e);
                }
                Ok(r)
            }
            Err(_) => match job.take() {
                Some(f) => Err(f),
                None => Ok(Err(Error::Internal("host steps lost".into()))),
            },
        }
    }

    /// [`CommCore::enqueue_batch`] and wait for it: an algorithm's blocking step on a
    /// communicator of its own (a level, its private copy). When that communicator's
    /// stream is idle the ops run on the calling thread, so a step costs no hand-off to
    /// the stream thread and back (a log-step collective makes ⌈log₂ p⌉ of them);
    /// inside a launched call and on device transports, as `enqueue_batch`.
    pub fn run_batch(&self, ops: Vec<Op>, dtype: DataType) -> Result<()> {
        if self.1.is_some() || self.on_stream() || self.has_device() {
            return self.enqueue_batch(ops, dtype, Vec::new()).wait();
        }
        match self.run_now(&[], || self.run_ops(&ops, dtype)) {
            Ok(r) => r,
            Err(_) => self.enqueue_batch(ops, dtype, Vec::new()).wait(),
        }
    }

    /// [`CommCore::enqueue_batch`] inside a launched call (scope `sc`): on this thread,
    /// nothing waited for on the host. The launched communicator's own ops go on the
    /// launch stream; another communicator's (a level, the node, the rail) on its own
    /// stream (a side stream), which first waits for the launch stream's work so far and
    /// for `deps`' end events, and whose end event the returned `Work` carries (what a
    /// later wait on it joins into the launch stream on the device). Ops of different
    /// communicators enqueued without a wait between them (HO-Ring's rings, qgZ's
    /// pipelined hops) run at once on the device; the call joins every side stream back
    /// at its end.
    fn launch_batch(&self, sc: &Scope, ops: Vec<Op>, dtype: DataType, deps: Vec<Work>) -> Work {
        let side = match self.0.transport.gpu() {
            Some(g) if Arc::as_ptr(&self.0) as usize != sc.top() => Some(g.stream()),
            _ => None,
        };
        let here = side.unwrap_or(&sc.stream);
        let r = (|| {
            if let Some(s) = side {
                s.wait_event(sc.stream.record()?.as_ref())?;
            }
            for d in &deps {
                match d.event() {
                    Some(ev) => here.wait_event(ev.as_ref())?,
                    None => d.wait_timeout(self.timeout()).map(|_| ())?,
                }
            }
            let at = Launched {
                scope: sc,
                stream: here,
            };
            self.run_ops_at(&ops, dtype, Some(at))?;
            match side {
                Some(s) => {
                    let ev = s.record()?;
                    sc.note_side(s, ev.clone());
                    Ok(Some(ev))
                }
                None => Ok(None),
            }
        })();
        match r {
            Ok(ev) => {
                let w = Work::ready(Ok(()));
                if let Some(ev) = ev {
                    w.set_piece(ev, sc.stream.clone());
                }
                w
            }
            Err(e) => Work::ready(Err(e)),
        }
    }

    /// The launched call's identity for [`Scope::launch`].
    pub(crate) fn identity(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    /// The body of an enqueued batch: run it unless the communicator was aborted, and
    /// abort it when it fails (as a failed NCCL call leaves its communicator unusable),
    /// so everything queued on it, and everything that depends on that, fails at once
    /// instead of each waiting out its own timeout. Inside a launched call (this
    /// handle's), on its launch stream.
    #[inline]
    pub(crate) fn run_ops(&self, ops: &[Op], dtype: DataType) -> Result<()> {
        self.run_ops_at(ops, dtype, self.at())
    }

    /// [`CommCore::run_ops`] with the device work on `at` (a launched call's stream).
    #[inline]
    fn run_ops_at(&self, ops: &[Op], dtype: DataType, at: Option<Launched<'_>>) -> Result<()> {
        let r = self
            .still_running()
            .and_then(|_| self.run_native(ops, dtype, at));
        if let Err(e) = &r {
            self.fail(e);
        }
        r
    }

    /// Execute native ops on this thread (the stream's), their device work on `at`
    /// inside a launched call: one vendor group when they are all device ops on a GPU
    /// transport.
    pub(crate) fn run_native(
        &self,
        ops: &[Op],
        dtype: DataType,
        at: Option<Launched<'_>>,
    ) -> Result<()> {
        let t = self.0.transport.as_ref();
        let to = self.timeout();
        if let [op] = ops {
            return native::run(t, at, op, dtype, to);
        }
        match t.gpu() {
            Some(g) if ops.len() > 1 && ops.iter().all(|o| o.device().is_some()) => {
                let mut first = Ok(());
                g.group(at.map(|a| a.stream), &mut || {
                    for op in ops {
                        if let Err(e) = native::run(t, at, op, dtype, to) {
                            if first.is_ok() {
                                first = Err(e);
                            }
                        }
                    }
                    Ok(())
                })?;
                first
            }
            // Host sends and receives of one batch (an algorithm's exchange step) are
            // in flight together, so no order of them can deadlock.
            None if ops.len() > 1
                && ops.iter().all(|o| {
                    matches!(o, Op::Send { .. } | Op::Recv { .. }) && o.device().is_none()
                }) =>
            {
                native::exchange(t, ops, to)
            }
            _ => ops
                .iter()
                .try_for_each(|op| native::run(t, at, op, dtype, to)),
        }
    }

    /// Collective over this communicator (after its queued work): ranks passing the same
    /// `Some(color)` form a new communicator ordered by (key, rank); `None` opts out.
    /// With `meter`, the new communicator and its sub-communicators also count their
    /// sends there ([`crate::transport::metered`]).
    pub fn split(
        &self,
        color: Option<u32>,
        key: i32,
        meter: Option<Arc<Traffic>>,
    ) -> Result<Option<CommCore>> {
        self.alive()?;
        self.0.stream.sync()?;
        let t = self.0.transport.split(color, key)?;
        t.map(|t| {
            let t: Arc<dyn Transport> = match &meter {
                Some(m) => Arc::new(crate::transport::metered::Metered::new(t, m.clone())),
                None => t,
            };
            CommCore::new(t, self.0.topo.clone(), self.0.config.clone()).map(|c| self.inherit(c))
        })
        .transpose()
    }

    /// A communicator of `members` (ranks of this one, ascending, this rank among them)
    /// created by those ranks alone, after this communicator's queued work
    /// ([`Transport::group`]; `mpi` only). It keeps the world topology, so the
    /// hierarchical algorithms apply to it wherever its members span nodes.
    /// `algo`: the new communicator's default algorithm (else this one's).
    pub fn group(&self, members: &[usize], algo: Option<crate::Algo>) -> Result<CommCore> {
        self.alive()?;
        self.0.stream.sync()?;
        let t = self.0.transport.group(members)?;
        let mut config = self.0.config.clone();
        if let Some(a) = algo {
            config.algo = a;
        }
        CommCore::new(t, self.0.topo.clone(), config).map(|c| self.inherit(c))
    }

    /// [`crate::Comm::survivors`]: the transport's census, whatever this communicator's
    /// state.
    pub fn survivors(&self) -> Result<Vec<usize>> {
        self.0.transport.survivors()
    }

    /// The communicator of this one's ranks but `exclude`, made by the survivors alone
    /// ([`crate::Comm::shrink`]): no check that this one is alive and no wait for its
    /// queued work (it may have been aborted by the failure that lost the excluded
    /// ranks, and its queued work fails at once). Same topology and configuration.
    pub fn shrink(&self, exclude: &[usize]) -> Result<CommCore> {
        let (n, me) = (self.size(), self.rank());
        if let Some(bad) = exclude.iter().find(|&&r| r >= n) {
            return Err(Error::InvalidArgument(format!(
                "shrink: rank {bad} is not a rank of this communicator of {n}"
            )));
        }
        let mut ex = exclude.to_vec();
        ex.sort_unstable();
        ex.dedup();
        if ex.len() != exclude.len() {
            return Err(Error::InvalidArgument(format!(
                "shrink: the excluded ranks {exclude:?} repeat a rank"
            )));
        }
        if ex.binary_search(&me).is_ok() {
            return Err(Error::InvalidArgument(format!(
                "shrink: this rank ({me}) is among the excluded {exclude:?}; only survivors call"
            )));
        }
        let survivors: Vec<usize> = (0..n).filter(|r| ex.binary_search(r).is_err()).collect();
        let t = self.0.transport.group(&survivors).map_err(|e| match e {
            Error::InvalidUsage(_) => Error::InvalidUsage(format!(
                "shrink is supported on the local, mpi, host-local and cuda-local transports (the {} transport cannot \
                 make a communicator of the survivors alone yet)",
                self.0.transport.kind().name()
            )),
            other => other,
        })?;
        CommCore::new(t, self.0.topo.clone(), self.0.config.clone()).map(|c| self.inherit(c))
    }

    /// Sub-communicator splits are collective on the transport: from a user thread, run
    /// them after the queued work (whose algorithms may split too), so every rank splits
    /// in the same order; on the stream thread, the work itself is that order.
    fn split_point(&self) -> Result<()> {
        if self.on_stream() {
            Ok(())
        } else {
            self.alive()?;
            self.0.stream.sync()
        }
    }

    /// The cached sub-communicator `key`, or split it with (color, key) and cache it.
    fn cached(&self, key: &str, color: u32, k: i32) -> Result<CommCore> {
        let lock = || {
            self.0
                .subcomms
                .lock()
                .map_err(|_| Error::Internal("subcomm lock".into()))
        };
        if let Some(c) = lock()?.get(key) {
            // A view of the same launched call as this handle, if any.
            return Ok(CommCore(c.0.clone(), self.1.clone()));
        }
        // A split is set-up on first use (a host exchange, on a vendor transport the new
        // communicator's unique id staged through the parent's own stream): outside the
        // launch contract, like a first allocation; no steady-state call splits.
        let t = crate::device::waits::outside(|| self.0.transport.split(Some(color), k))?
            .ok_or_else(|| Error::Internal(format!("{key} split returned no communicator")))?;
        let c = self.inherit(CommCore::new(
            t,
            self.0.topo.clone(),
            self.0.config.clone(),
        )?);
        tracing::debug!(rank = self.rank(), key, members = ?c.members(), "sub-communicator");
        lock()?.insert(key.to_string(), c.clone());
        Ok(CommCore(c.0, self.1.clone()))
    }

    /// The sub-communicator of level `i` of this communicator's hierarchy (the ranks
    /// differing from this one only along that level), split on first use and cached.
    /// Collective: every rank must reach the same first use (algorithms do, since every
    /// rank runs the same requests in the same order on its stream).
    pub fn level(&self, i: usize) -> Result<CommCore> {
        self.level_for(i, "")
    }

    /// A private copy of this communicator (all its ranks, same order), split on first
    /// use and cached, collective like [`CommCore::level`]: the flat algorithms that
    /// step through point-to-point messages (`log-step`) send them there, so they never
    /// match the user's own sends and receives on this communicator (a group may have
    /// both in flight at once).
    pub fn private(&self) -> Result<CommCore> {
        self.split_point()?;
        self.cached("private", 0, self.rank() as i32)
    }

    /// [`CommCore::level`] for the user (`Comm::level_comm`): its own cached
    /// communicator, never the one the algorithms run their steps on, so user work on
    /// it cannot be interleaved with (or wait on) a parent collective's steps.
    pub fn user_level(&self, i: usize) -> Result<CommCore> {
        self.level_for(i, "user:")
    }

    fn level_for(&self, i: usize, prefix: &str) -> Result<CommCore> {
        self.split_point()?;
        let h = self
            .hierarchy()
            .ok_or_else(|| Error::Internal("no hierarchy".into()))?;
        let (level, size) = *h
            .levels
            .get(i)
            .ok_or_else(|| Error::Internal(format!("no level {i}")))?;
        let (color, k) = h.split_color(i, self.rank());
        let c = self.cached(&format!("{prefix}level:{i}:{level:?}"), color, k)?;
        if c.size() != size {
            return Err(Error::Internal(format!(
                "level {level:?} group has {} ranks, expected {size}",
                c.size()
            )));
        }
        Ok(c)
    }

    /// The ranks of this rank's node (`node: true`) or rail (same index within the node,
    /// across nodes), split on first use and cached; collective like
    /// [`CommCore::level`]. Needs a regular mesh. On one node the node communicator
    /// has every rank and each rail one.
    pub fn node_or_rail(&self, node: bool) -> Result<CommCore> {
        self.node_or_rail_for(node, "")
    }

    /// [`CommCore::node_or_rail`] for the user (`Comm::node_comm` / `rail_comm`): its
    /// own cached communicator, as [`CommCore::user_level`].
    pub fn user_node_or_rail(&self, node: bool) -> Result<CommCore> {
        self.node_or_rail_for(node, "user:")
    }

    fn node_or_rail_for(&self, node: bool, prefix: &str) -> Result<CommCore> {
        self.split_point()?;
        let h = self.hierarchy().ok_or_else(|| {
            Error::InvalidUsage(
                "ranks are not a regular mesh of the topology: no node groups".into(),
            )
        })?;
        let n = match h.levels.first() {
            Some((Level::Network, n)) => *n,
            _ => 1,
        };
        let per = self.size() / n;
        let (idx, local) = (self.rank() / per, self.rank() % per);
        let (key, color, k) = if node {
            ("node", idx, local)
        } else {
            ("rail", local, idx)
        };
        self.cached(&format!("{prefix}{key}"), color as u32, k as i32)
    }

    /// Wait for everything queued on this communicator so far.
    pub fn sync(&self) -> Result<()> {
        self.0.stream.sync()
    }

    /// Barrier over the communicator, after its queued work; moves no counted bytes.
    pub fn barrier(&self) -> Result<()> {
        self.alive()?;
        self.sync()?;
        self.0.transport.barrier()
    }

    /// A collective on this communicator failed with `e`: tell the transport (so its
    /// teardown does not wait for failed peers, [`Transport::failed`]) and abort.
    pub fn fail(&self, e: &Error) {
        if let Ok(mut f) = self.0.failure.lock() {
            f.get_or_insert_with(|| e.clone());
        }
        self.0.transport.failed(e);
        self.abort();
    }

    /// The failure that aborted this communicator (a collective that failed while
    /// running, maybe long after it was submitted), if any: `ncclCommGetAsyncError`.
    pub fn async_error(&self) -> Option<Error> {
        self.0.failure.lock().ok().and_then(|f| f.clone())
    }

    /// True once [`CommCore::abort`] ran (a failure's abort or the user's): launched
    /// calls not yet seen complete then fail ([`watchdog`]).
    pub fn was_aborted(&self) -> bool {
        self.0.aborted.load(Ordering::SeqCst)
    }

    /// Abort (ncclCommAbort): wake every waiter of this communicator, here and on the
    /// peers, with an error; the communicator is unusable afterwards.
    pub fn abort(&self) {
        self.0.aborted.store(true, Ordering::SeqCst);
        self.0.destroyed.store(true, Ordering::SeqCst);
        self.0.transport.abort();
        if let Ok(subs) = self.0.subcomms.lock() {
            subs.values().for_each(|c| c.abort());
        }
    }

    /// Finish queued work and release the communicator; later calls fail with
    /// `InvalidUsage`.
    pub fn destroy(&self) -> Result<()> {
        let r = self.sync();
        self.0.destroyed.store(true, Ordering::SeqCst);
        if let Ok(mut subs) = self.0.subcomms.lock() {
            for c in subs.values() {
                let _ = c.destroy();
            }
            subs.clear();
        }
        self.0.stream.shutdown();
        r
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stream.shutdown();
    }
}
