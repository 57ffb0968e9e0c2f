//! Replay: a [`Schedule`] as time on a modeled cluster.
//!
//! The link model (figures from [`crate::topology::presets`], where every source is
//! documented):
//!
//! - Every transfer costs `α + bytes / β`, the NCCL-style cost of one step: α = the
//!   link class's per-step latency, β the bandwidth of the resource it uses (`GB/s` =
//!   1e3 bytes/us). It starts when it is ready and its resource is free, occupies the
//!   resource for its wire time `bytes / β`, and completes `α` after its last byte left
//!   (so a resource can start the next transfer while the previous one's latency runs,
//!   as a NIC with several messages in flight does).
//! - `intra_package` and `intra_node` transfers use the sender's port of that class, at
//!   the class's per-rank bandwidth (`links.intra_package`, `links.intra_node`).
//! - `inter_node` transfers use the sender's NIC: with fewer NICs than ranks per node,
//!   NIC `local_rank · nics_per_node / ranks_per_node` of its node at
//!   `nic_bandwidth_gbs`, shared by the ranks mapped to it (p3dn: 8 GPUs on one EFA
//!   interface; Frontier and p4d: 2 ranks per NIC); with at least as many, the rank's own
//!   group of `nics_per_node / ranks_per_node` NICs as one port of that many times
//!   `nic_bandwidth_gbs` (DGX: one NIC per GPU; p5: 4 EFA interfaces per H100).
//! - A resource carries one transfer at a time, in FIFO order of ready time (ties by
//!   transfer index); resources of different classes (and different ranks) run at the
//!   same time, which is what lets HO-Ring keep intra- and inter-node links busy at once.
//! - A transfer is ready when every transfer it depends on has completed.
//!
//! Receivers are not modeled as resources (a sender-side model, like NCCL's tuning
//! tables). The replay is event driven (a binary heap of ready times, the transfers
//! ready at one time taken in index order) and deterministic. With one class and no sharing it reduces to the closed-form
//! alpha-beta costs exactly (`tests/sim.rs`): a ring step waits for the previous one, so
//! `g - 1` steps cost `(g-1)(α + c/β)`.
//!
//! Lower bound of the schedule's makespan on this model ([`Replay::lower_bound_us`]):
//! the larger of (a) the busiest resource's wire time plus one latency (the bytes it
//! must carry) and (b) the longest *stream*, the sum of `α + bytes/β` over the steps a
//! rank runs on one ring (plan steps on a stream run one after another: this is the
//! per-step latency the algorithm's own traffic cannot avoid). For the usual shapes it
//! is max(intra-node time, inter-node time) of the traffic. The bandwidth-only figure
//! (a) without latency is [`Replay::bandwidth_bound_us`].

use super::schedule::Schedule;
use super::waves;
use crate::error::{Error, Result};
use crate::topology::{LinkClass, Topology};

/// What a modeled resource is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceKind {
    /// A rank's outgoing port of an intra-node class.
    Port { rank: usize, class: LinkClass },
    /// NIC `nic` of node `node` (the first of a rank's group of NICs where ranks have
    /// several), shared by the ranks mapped to it.
    Nic { node: usize, nic: usize },
}

impl ResourceKind {
    /// The link class it carries.
    pub fn class(&self) -> LinkClass {
        match self {
            ResourceKind::Port { class, .. } => *class,
            ResourceKind::Nic { .. } => LinkClass::InterNode,
        }
    }
}

impl std::fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResourceKind::Port { rank, class } => write!(f, "rank {rank} {class} port"),
            ResourceKind::Nic { node, nic } => write!(f, "node {node} NIC {nic}"),
        }
    }
}

/// How much one resource carried.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Resource {
    pub kind: ResourceKind,
    /// Time it was busy: the wire time `bytes/β` of its transfers, summed (us).
    pub busy_us: f64,
    /// Latency `α` of its transfers, summed (us; overlaps with other transfers' wire time).
    pub latency_us: f64,
    pub transfers: u64,
    pub bytes: u64,
}

/// The outcome of a replay.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// When the last transfer ends (us); 0 for an empty schedule.
    pub makespan_us: f64,
    /// (start, end) of every transfer, in schedule order (us).
    pub times: Vec<(f64, f64)>,
    /// Resource each transfer used (index into `resources`).
    pub resource_of: Vec<u32>,
    /// Every resource that carried at least one transfer.
    pub resources: Vec<Resource>,
    /// Busy (wire) time summed over the resources of each class, [`LinkClass::index`] order.
    pub class_busy_us: [f64; 3],
    /// Lower bound of the makespan of this schedule's transfers on this model (module
    /// doc): max over resources of (wire time + one latency) and over streams of their
    /// steps' `α + bytes/β`. For the usual shapes, max(intra-node time, inter-node time).
    pub lower_bound_us: f64,
    /// Bandwidth time only: the busiest resource's wire time (what the bytes alone cost).
    pub bandwidth_bound_us: f64,
    /// What sets `lower_bound_us`: a resource, or a stream (rank, ring name); None for an
    /// empty schedule.
    pub bottleneck: Option<Bottleneck>,
}

/// What sets a replay's lower bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bottleneck {
    Resource(ResourceKind),
    /// The steps of world rank `rank` on ring `ring`, one after another.
    Stream {
        rank: usize,
        ring: String,
    },
}

impl std::fmt::Display for Bottleneck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bottleneck::Resource(r) => write!(f, "{r}"),
            Bottleneck::Stream { rank, ring } => write!(f, "rank {rank} {ring} stream"),
        }
    }
}

impl Replay {
    /// `makespan / lower_bound` (1 for an empty schedule).
    pub fn ratio(&self) -> f64 {
        if self.lower_bound_us > 0.0 {
            self.makespan_us / self.lower_bound_us
        } else {
            1.0
        }
    }
}

/// The resource index of a transfer from `src` of `class` on `topo`: ports are
/// `2·rank + (0 intra_package | 1 intra_node)`, NICs follow at `2·ranks + node·nics + nic`
/// (a rank with a group of NICs uses the index of its first one).
fn resource_index(topo: &Topology, src: usize, class: LinkClass) -> usize {
    let n = topo.world_size();
    match class {
        LinkClass::IntraPackage => 2 * src,
        LinkClass::IntraNode => 2 * src + 1,
        LinkClass::InterNode => {
            let k = topo.ranks_per_node().max(1);
            let nics = topo.links.nics_per_node.max(1);
            let nic = (topo.local_rank(src) * nics / k).min(nics - 1);
            2 * n + topo.node_of(src) * nics + nic
        }
    }
}

/// NICs one inter-node port aggregates: `nics_per_node / ranks_per_node` when every rank
/// has NICs of its own, else 1 (a NIC shared by several ranks).
fn nics_per_port(topo: &Topology) -> usize {
    (topo.links.nics_per_node / topo.ranks_per_node().max(1)).max(1)
}

fn resource_kind(topo: &Topology, idx: usize) -> ResourceKind {
    let n = topo.world_size();
    if idx < 2 * n {
        ResourceKind::Port {
            rank: idx / 2,
            class: if idx % 2 == 0 {
                LinkClass::IntraPackage
            } else {
                LinkClass::IntraNode
            },
        }
    } else {
        let nics = topo.links.nics_per_node.max(1);
        ResourceKind::Nic {
            node: (idx - 2 * n) / nics,
            nic: (idx - 2 * n) % nics,
        }
    }
}

/// Replay `s` on `topo`'s link model (see the module doc). `topo` must describe at
/// least the schedule's ranks (normally the topology the schedule was built for; the
/// transfers' link classes are taken from the schedule).
pub fn replay(s: &Schedule, topo: &Topology) -> Result<Replay> {
    topo.links.validate()?;
    let world = topo.world_size();
    if let Some(t) = s
        .transfers
        .iter()
        .find(|t| t.src as usize >= world || t.dst as usize >= world)
    {
        return Err(Error::InvalidArgument(format!(
            "transfer {} -> {} outside topology {} ({world} ranks)",
            t.src, t.dst, topo.name
        )));
    }
    let n = s.len();
    let nres = 2 * world + topo.nodes * topo.links.nics_per_node.max(1);
    let lat: [f64; 3] = LinkClass::ALL.map(|c| topo.links.get(c).latency_us);
    let bw_port: [f64; 2] = [
        topo.links.intra_package.bandwidth_gbs * 1e3,
        topo.links.intra_node.bandwidth_gbs * 1e3,
    ];
    let bw_nic = nics_per_port(topo) as f64 * topo.links.nic_bandwidth_gbs * 1e3;

    let (start, list) = s.dependents();
    let mut indeg: Vec<u32> = (0..n).map(|i| s.deps(i).len() as u32).collect();
    let mut times = vec![(0.0f64, 0.0f64); n];
    let mut resource_of = vec![0u32; n];
    let mut free = vec![0.0f64; nres];
    let mut busy = vec![0.0f64; nres];
    let mut lats = vec![0.0f64; nres];
    let mut count = vec![0u64; nres];
    let mut bytes = vec![0u64; nres];
    let mut class_busy = [0.0f64; 3];
    let nrings = s.rings.len().max(1);
    let mut stream = vec![0.0f64; world * nrings];
    let (done, makespan) = waves::run(&mut indeg, &start, &list, |i, rt| {
        let t = &s.transfers[i as usize];
        let ci = t.class.index();
        let res = resource_index(topo, t.src as usize, t.class);
        let bw = match t.class {
            LinkClass::InterNode => bw_nic,
            c => bw_port[c.index()],
        };
        let wire = t.bytes as f64 / bw;
        let st = if free[res] > rt { free[res] } else { rt };
        free[res] = st + wire;
        let end = st + wire + lat[ci];
        busy[res] += wire;
        lats[res] += lat[ci];
        count[res] += 1;
        bytes[res] += t.bytes;
        class_busy[ci] += wire;
        if let Some(x) = stream.get_mut(t.src as usize * nrings + t.ring as usize) {
            *x += lat[ci] + wire;
        }
        times[i as usize] = (st, end);
        resource_of[i as usize] = res as u32;
        end
    });
    if done != n {
        // Reports the cycle with a transfer on it.
        s.check_acyclic()?;
        return Err(Error::Internal(format!(
            "replay finished {done} of {n} transfers"
        )));
    }
    // Compact the resources to the used ones.
    let mut remap = vec![u32::MAX; nres];
    let mut resources = Vec::new();
    for r in 0..nres {
        if count[r] > 0 {
            remap[r] = resources.len() as u32;
            resources.push(Resource {
                kind: resource_kind(topo, r),
                busy_us: busy[r],
                latency_us: lats[r],
                transfers: count[r],
                bytes: bytes[r],
            });
        }
    }
    for r in resource_of.iter_mut() {
        *r = remap[*r as usize];
    }
    let mut lb = 0.0f64;
    let mut bottleneck = None;
    for r in &resources {
        let b = r.busy_us + lat[r.kind.class().index()];
        if b > lb {
            lb = b;
            bottleneck = Some(Bottleneck::Resource(r.kind));
        }
    }
    for (k, &b) in stream.iter().enumerate() {
        if b > lb {
            lb = b;
            bottleneck = Some(Bottleneck::Stream {
                rank: k / nrings,
                ring: s.rings.get(k % nrings).cloned().unwrap_or_default(),
            });
        }
    }
    Ok(Replay {
        makespan_us: makespan,
        times,
        resource_of,
        class_busy_us: class_busy,
        lower_bound_us: lb,
        bandwidth_bound_us: resources.iter().map(|r| r.busy_us).fold(0.0, f64::max),
        bottleneck,
        resources,
    })
}
