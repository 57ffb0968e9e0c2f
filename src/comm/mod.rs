//! The public Rust face: [`Comm`], a communicator bound to a topology and a transport.
//!
//! - Collectives are nonblocking: each returns a [`Work`] at once and runs on the
//!   communicator's stream thread in submission order. A `Work` can be waited on, or
//!   passed as a dependency of a request on another communicator ([`Request::after`]).
//! - Buffers are [`Buffer`]s (strata-owned memory shared with the stream); counts are
//!   in elements of the dtype; in-place rules are NCCL's (see [`request::Op`]).
//! - Every collective, from Rust or C, goes through ONE path, [`Comm::submit`]:
//!   request -> checks -> algorithm selection -> dispatch (or held by a group).
//! - Sub-communicators come from [`Comm::split`] on the transport; the per-level groups
//!   hierarchical algorithms use are split from the topology ([`Comm::level_comm`]).

pub mod bootstrap;
pub mod gpu;
pub mod group;
pub mod hierarchy;
pub mod native;
pub mod request;
pub mod stream;

pub use group::{group_end, group_start};
pub use hierarchy::Hierarchy;
pub use request::{Op, Request};
pub use stream::Work;

use crate::algo::{self, Algo};
use crate::config;
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::memory::Buffer;
use crate::topology::{Level, Topology};
use crate::traffic::Traffic;
use crate::transport::{Transport, TransportKind};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// [`crate::algo::plan::default_chunks`], round(sqrt(chunk / 128 KiB)) in 1..=16
    /// (`STRATA_HORING_CHUNKS` overrides it).
    pub ho_ring_chunks: Option<usize>,
}

impl CommConfig {
    /// From the environment, or the error a malformed variable caused.
    pub fn from_env() -> Result<CommConfig> {
        let e = config::env()?;
        Ok(CommConfig {
            algo: e.algo.unwrap_or(Algo::Auto),
            timeout: e.timeout,
            ho_ring_chunks: e.ho_ring_chunks,
        })
    }
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig::from_env().unwrap_or(CommConfig {
            algo: Algo::Auto,
            timeout: config::DEFAULT_TIMEOUT,
            ho_ring_chunks: None,
        })
    }
}

struct Inner {
    transport: Arc<dyn Transport>,
    topo: Arc<Topology>,
    members: Vec<usize>,
    hierarchy: Option<Hierarchy>,
    stream: stream::Stream,
    config: CommConfig,
    subcomms: Mutex<HashMap<String, Option<Comm>>>,
    destroyed: AtomicBool,
    last_error: Mutex<String>,
}

/// A communicator: this rank's handle on a group of ranks. Cheap to clone (clones share
/// the communicator); `Send + Sync`.
#[derive(Clone)]
pub struct Comm(Arc<Inner>);

impl std::fmt::Debug for Comm {
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

impl Comm {
    /// Bind `transport` to the world topology `topo` (whose world size must cover every
    /// world rank of the transport).
    pub fn from_transport(
        transport: Arc<dyn Transport>,
        topo: Arc<Topology>,
        config: CommConfig,
    ) -> Result<Comm> {
        config::init_logging();
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
        Ok(Comm(Arc::new(Inner {
            transport,
            topo,
            members,
            hierarchy,
            stream,
            config,
            subcomms: Mutex::new(HashMap::new()),
            destroyed: AtomicBool::new(false),
            last_error: Mutex::new(String::new()),
        })))
    }

    /// This rank in the communicator.
    pub fn rank(&self) -> usize {
        self.0.transport.rank()
    }
    /// Ranks in the communicator.
    pub fn size(&self) -> usize {
        self.0.transport.size()
    }
    /// World rank of communicator rank `r`.
    pub fn world_rank(&self, r: usize) -> usize {
        self.0.members[r]
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
    /// Which transport moves the bytes.
    pub fn transport_kind(&self) -> TransportKind {
        self.0.transport.kind()
    }
    /// The transport (for algorithms and transports' native calls).
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.0.transport
    }
    /// Peer / dependency timeout.
    pub fn timeout(&self) -> Duration {
        self.0.config.timeout
    }
    /// The configuration.
    pub fn config(&self) -> &CommConfig {
        &self.0.config
    }
    /// Traffic counters of the world (local: measured; mpi: nominal, this process's sends).
    pub fn traffic(&self) -> Option<Arc<Traffic>> {
        self.0.transport.traffic()
    }
    /// The message of the last failed call on this communicator (empty if none).
    pub fn last_error(&self) -> String {
        self.0
            .last_error
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }
    /// True when both handles are the same communicator.
    pub fn same(&self, other: &Comm) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    fn note<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            if let Ok(mut s) = self.0.last_error.lock() {
                *s = e.to_string();
            }
        }
        r
    }

    fn alive(&self) -> Result<()> {
        if self.0.destroyed.load(Ordering::SeqCst) {
            return Err(Error::InvalidUsage(
                "communicator used after destroy or abort".into(),
            ));
        }
        Ok(())
    }

    pub(crate) fn stream_push(&self, deps: Vec<Work>, job: group::Job, work: Work) -> Result<()> {
        self.0.stream.push(deps, job, work)
    }

    /// Collective over this communicator (after its queued work): ranks passing the same
    /// `Some(color)` form a new communicator ordered by (key, rank); `None` opts out and
    /// returns `Ok(None)`.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Comm>> {
        let r = (|| {
            self.alive()?;
            self.0.stream.sync()?;
            let t = self.0.transport.split(color, key)?;
            t.map(|t| Comm::from_transport(t, self.0.topo.clone(), self.0.config.clone()))
                .transpose()
        })();
        self.note(r)
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
        let r = (|| {
            self.alive()?;
            self.0.stream.sync()?;
            let t = self.0.transport.split(color, key)?;
            t.map(|t| {
                let m: Arc<dyn Transport> =
                    Arc::new(crate::transport::metered::Metered::new(t, meter.clone()));
                Comm::from_transport(m, self.0.topo.clone(), self.0.config.clone())
            })
            .transpose()
        })();
        self.note(r)
    }

    /// The sub-communicator of level `i` of this communicator's hierarchy (the ranks
    /// differing from this one only along that level), split on first use and cached.
    /// Collective: every rank must reach the same first use (algorithms do, since every
    /// rank runs the same requests in the same order on its stream).
    pub fn level_comm(&self, i: usize) -> Result<Comm> {
        self.split_point()?;
        let h = self
            .0
            .hierarchy
            .as_ref()
            .ok_or_else(|| Error::Internal("no hierarchy".into()))?;
        let (level, size) = *h
            .levels
            .get(i)
            .ok_or_else(|| Error::Internal(format!("no level {i}")))?;
        let key = format!("level:{i}:{level:?}");
        if let Some(Some(c)) = self
            .0
            .subcomms
            .lock()
            .map_err(|_| Error::Internal("subcomm lock".into()))?
            .get(&key)
        {
            return Ok(c.clone());
        }
        let (color, k) = h.split_color(i, self.rank());
        let t = self
            .0
            .transport
            .split(Some(color), k)?
            .ok_or_else(|| Error::Internal("level split returned no communicator".into()))?;
        let c = Comm::from_transport(t, self.0.topo.clone(), self.0.config.clone())?;
        if c.size() != size {
            return Err(Error::Internal(format!(
                "level {level:?} group has {} ranks, expected {size}",
                c.size()
            )));
        }
        tracing::debug!(rank = self.rank(), ?level, members = ?c.members(), "level communicator");
        self.0
            .subcomms
            .lock()
            .map_err(|_| Error::Internal("subcomm lock".into()))?
            .insert(key, Some(c.clone()));
        Ok(c)
    }

    /// Ranks of this rank's node (`node_comm`) or its rail (same index within the node,
    /// across nodes: `rail_comm`), split on first use and cached; collective like
    /// [`Comm::level_comm`]. Needs a regular mesh ([`Comm::hierarchy`]). On one node the
    /// node communicator has every rank and each rail one.
    pub fn node_comm(&self) -> Result<Comm> {
        self.node_or_rail(true)
    }

    /// See [`Comm::node_comm`].
    pub fn rail_comm(&self) -> Result<Comm> {
        self.node_or_rail(false)
    }

    /// Sub-communicator splits are collective on the transport: from a user thread, run
    /// them after the queued work (whose algorithms may split too), so every rank splits
    /// in the same order; on the stream thread, the work itself is that order.
    fn split_point(&self) -> Result<()> {
        if self.0.stream.is_current() {
            Ok(())
        } else {
            self.alive()?;
            self.0.stream.sync()
        }
    }

    fn node_or_rail(&self, node: bool) -> Result<Comm> {
        self.split_point()?;
        let h = self.0.hierarchy.as_ref().ok_or_else(|| {
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
        let key = if node { "node" } else { "rail" };
        if let Some(Some(c)) = self
            .0
            .subcomms
            .lock()
            .map_err(|_| Error::Internal("subcomm lock".into()))?
            .get(key)
        {
            return Ok(c.clone());
        }
        let (color, k) = if node { (idx, local) } else { (local, idx) };
        let t = self
            .0
            .transport
            .split(Some(color as u32), k as i32)?
            .ok_or_else(|| Error::Internal("node/rail split returned no communicator".into()))?;
        let c = Comm::from_transport(t, self.0.topo.clone(), self.0.config.clone())?;
        self.0
            .subcomms
            .lock()
            .map_err(|_| Error::Internal("subcomm lock".into()))?
            .insert(key.into(), Some(c.clone()));
        Ok(c)
    }

    /// The one submit path: check the request, pick the algorithm, and queue it on this
    /// communicator's stream (or hold it until the thread's group ends). Bad arguments
    /// fail here, synchronously, and nothing is queued. A collective that fails while
    /// running (a dead peer, counts that differ across ranks) aborts the communicator,
    /// so its peers fail at once instead of waiting for their timeout.
    pub fn submit(&self, req: Request) -> Result<Work> {
        let r = (|| {
            self.alive()?;
            let op = request::check(req.op, req.dtype, self.rank(), self.size())?;
            let req = Request { op, ..req };
            let comm = self.clone();
            let deps = req.deps.clone();
            let is_send = matches!(req.op, Op::Send { .. });
            let fusable = group::in_group() && self.fusable(&req);
            let job: group::Job = Box::new(move || {
                let r = algo::execute(&comm, &req).and_then(|divided| {
                    if divided {
                        Ok(())
                    } else {
                        comm.finish(&req)
                    }
                });
                if let Err(e) = &r {
                    // Like an asynchronous NCCL error, a failed collective leaves the
                    // communicator unusable; aborting wakes the peers at once.
                    tracing::warn!(
                        rank = comm.rank(),
                        op = req.op.name(),
                        "collective failed, aborting communicator: {e}"
                    );
                    comm.abort();
                }
                comm.note(r)
            });
            let work = Work::pending();
            if group::in_group() {
                group::hold(self.clone(), deps, job, work.clone(), is_send, fusable);
            } else {
                self.0.stream.push(deps, job, work.clone())?;
            }
            Ok(work)
        })();
        self.note(r)
    }

    /// True when `req` is one native vendor call on device buffers with nothing
    /// enqueued after it (no `Avg` division, no reduction of a received message), so a
    /// group of such calls can be one vendor group.
    fn fusable(&self, req: &Request) -> bool {
        self.0.transport.gpu().is_some()
            && req.op.device().is_some()
            && req.op.redop() != Some(ReduceOp::Avg)
            && !matches!(
                req.op,
                Op::SendRecv {
                    reduce: Some(_),
                    ..
                } | Op::AllGatherCoalesced { .. }
                    | Op::ReduceScatterCoalesced { .. }
            )
            && algo::select::choose(self, req).0.algo() == Algo::Ring
    }

    /// `Avg`: divide the summed result once by the communicator size.
    fn finish(&self, req: &Request) -> Result<()> {
        if req.op.redop() != Some(ReduceOp::Avg) {
            return Ok(());
        }
        let n = self.size();
        let ops = crate::bufops::Ops::of(self);
        let s = req.dtype.size();
        match &req.op {
            Op::ReduceScatter { recv, count, .. } | Op::AllReduce { recv, count, .. } => {
                ops.divide(&recv.slice(0..count * s)?, req.dtype, n)?
            }
            Op::ReduceScatterCoalesced { recvs, counts, .. } => {
                for (r, c) in recvs.iter().zip(counts) {
                    ops.divide(&r.slice(0..c * s)?, req.dtype, n)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Barrier over the communicator, after its queued work; moves no counted bytes.
    pub fn barrier(&self) -> Result<()> {
        let r = self
            .alive()
            .and_then(|_| self.sync())
            .and_then(|_| self.0.transport.barrier());
        self.note(r)
    }

    /// Collective: the sum of every rank's traffic matrix (identity on the local
    /// transport, whose ranks share counters; on MPI each process records only its own
    /// sends). Call it after waiting for the work whose traffic it should include.
    pub fn sum_traffic(
        &self,
        m: &crate::traffic::TrafficMatrix,
    ) -> Result<crate::traffic::TrafficMatrix> {
        let r = self
            .alive()
            .and_then(|_| self.sync())
            .and_then(|_| self.0.transport.sum_traffic(m));
        self.note(r)
    }

    /// Wait for everything queued on this communicator so far.
    pub fn sync(&self) -> Result<()> {
        self.0.stream.sync()
    }

    /// Abort (ncclCommAbort): wake every waiter of this communicator, here and on the
    /// peers, with an error; the communicator is unusable afterwards.
    pub fn abort(&self) {
        self.0.destroyed.store(true, Ordering::SeqCst);
        self.0.transport.abort();
        if let Ok(subs) = self.0.subcomms.lock() {
            subs.values().flatten().for_each(|c| c.abort());
        }
    }

    /// Finish queued work and release the communicator; later calls fail with
    /// `InvalidUsage`.
    pub fn destroy(&self) -> Result<()> {
        let r = self.sync();
        self.0.destroyed.store(true, Ordering::SeqCst);
        if let Ok(mut subs) = self.0.subcomms.lock() {
            for c in subs.values().flatten() {
                let _ = c.destroy();
            }
            subs.clear();
        }
        self.0.stream.shutdown();
        r
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

impl Drop for Inner {
    fn drop(&mut self) {
        self.stream.shutdown();
    }
}

/// The level kinds, re-exported for algorithm code.
pub type LevelKind = Level;
