//! Accounting: bytes the engine holds per component, and bytes sent per phase and link
//! class.
//!
//! Memory is measured from the engine's own allocations: every buffer it allocates goes
//! through [`Memory::alloc`], which counts it under a [`Component`] until the returned
//! [`Held`] is dropped, and keeps the peak. Model states (parameters, the hpZ secondary
//! copy, gradients, optimizer states) are allocated once; buffers (gathered units,
//! gradients in flight) come and go, so their peak is reported.
//!
//! Traffic is measured by metered communicators ([`strata::Comm::split_metered`]): each
//! phase's communicators share one meter, so a phase's bytes are counted exactly even
//! while phases overlap (prefetching all-gathers during reduce-scatters).

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use strata::traffic::{Traffic, TrafficMatrix, TrafficReport};
use strata::{Buffer, Topology};

/// What a byte of engine memory is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Component {
    /// The rank's parameter shard (working precision), `w·Φ/s_p`.
    Params,
    /// ZeRO++ hpZ secondary shard, `w·Φ/s_hpz`.
    Secondary,
    /// The gradient accumulator (working precision), `w·Φ/s_g`.
    Grads,
    /// fp32 master weights and Adam moments, `12·Φ/s_os`.
    Optimizer,
    /// Transient: gathered units, gradients in flight, boundary scratch.
    Buffers,
}

const N: usize = 5;

fn idx(c: Component) -> usize {
    c as usize
}

/// Live and peak bytes per component (shared by a rank's allocations).
#[derive(Debug, Default)]
pub struct Memory {
    live: [AtomicU64; N],
    peak: [AtomicU64; N],
}

/// An allocation counted under its component until dropped.
#[derive(Debug)]
pub struct Held {
    pub buf: Buffer,
    comp: Component,
    bytes: u64,
    mem: Arc<Memory>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.mem.live[idx(self.comp)].fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl Memory {
    /// A zeroed buffer of `bytes`, counted under `comp`.
    pub fn alloc(self: &Arc<Self>, comp: Component, bytes: usize) -> Held {
        let i = idx(comp);
        let now = self.live[i].fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        self.peak[i].fetch_max(now, Ordering::Relaxed);
        Held {
            buf: Buffer::zeroed(bytes),
            comp,
            bytes: bytes as u64,
            mem: self.clone(),
        }
    }

    /// Current figures.
    pub fn report(&self) -> MemoryReport {
        let l = |c: Component| self.live[idx(c)].load(Ordering::Relaxed);
        let params = l(Component::Params);
        let secondary = l(Component::Secondary);
        let grads = l(Component::Grads);
        let optimizer = l(Component::Optimizer);
        MemoryReport {
            params,
            secondary,
            grads,
            optimizer,
            model_states: params + secondary + grads + optimizer,
            buffers: l(Component::Buffers),
            buffers_peak: self.peak[idx(Component::Buffers)].load(Ordering::Relaxed),
        }
    }
}

/// Bytes held by one rank, by component.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryReport {
    pub params: u64,
    pub secondary: u64,
    pub grads: u64,
    pub optimizer: u64,
    /// params + secondary + grads + optimizer (AMSP's D_modelstate).
    pub model_states: u64,
    /// Transient buffers held now (0 between steps).
    pub buffers: u64,
    /// Most transient bytes held at once so far.
    pub buffers_peak: u64,
}

impl MemoryReport {
    /// Element-wise maximum (the worst rank).
    pub fn max(self, o: MemoryReport) -> MemoryReport {
        MemoryReport {
            params: self.params.max(o.params),
            secondary: self.secondary.max(o.secondary),
            grads: self.grads.max(o.grads),
            optimizer: self.optimizer.max(o.optimizer),
            model_states: self.model_states.max(o.model_states),
            buffers: self.buffers.max(o.buffers),
            buffers_peak: self.buffers_peak.max(o.buffers_peak),
        }
    }
}

/// The communication phases of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Parameter all-gather before each unit's forward.
    FwdGather,
    /// Parameter all-gather before each unit's backward (hpZ: from the secondary shard).
    BwdGather,
    /// Per-micro-batch gradient reduce-scatter (and AMSP's G/P all-reduce).
    GradReduce,
    /// Accumulation-boundary reduce-scatter / all-reduce.
    Boundary,
    /// Spreading updated parameters over the optimizer-state group.
    Spread,
}

impl Phase {
    /// Every phase, in step order.
    pub const ALL: [Phase; 5] = [
        Phase::FwdGather,
        Phase::BwdGather,
        Phase::GradReduce,
        Phase::Boundary,
        Phase::Spread,
    ];
    /// JSON / table name.
    pub fn name(self) -> &'static str {
        match self {
            Phase::FwdGather => "fwd_gather",
            Phase::BwdGather => "bwd_gather",
            Phase::GradReduce => "grad_reduce",
            Phase::Boundary => "boundary",
            Phase::Spread => "spread",
        }
    }
}

/// One meter per phase. On the local transport all ranks share one `Meters` (their
/// sends land in the same counters); under MPI each process has its own and the
/// figures are summed over processes.
#[derive(Clone)]
pub struct Meters {
    pub topo: Topology,
    meters: Vec<Arc<Traffic>>,
}

impl Meters {
    /// Zeroed meters for the world of `topo`.
    pub fn new(topo: &Topology) -> Meters {
        Meters {
            topo: topo.clone(),
            meters: Phase::ALL
                .iter()
                .map(|_| Arc::new(Traffic::new(topo.clone())))
                .collect(),
        }
    }
    /// The meter of `p`.
    pub fn get(&self, p: Phase) -> Arc<Traffic> {
        self.meters[p as usize].clone()
    }
    /// Counters of every phase now.
    pub fn snapshot(&self) -> Vec<TrafficMatrix> {
        self.meters.iter().map(|m| m.snapshot()).collect()
    }
}

/// Bytes sent in one step (summed over ranks) per phase and link class.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrafficByPhase {
    pub fwd_gather: TrafficReport,
    pub bwd_gather: TrafficReport,
    pub grad_reduce: TrafficReport,
    pub boundary: TrafficReport,
    pub spread: TrafficReport,
}

impl TrafficByPhase {
    /// The report of `p`.
    pub fn get(&self, p: Phase) -> &TrafficReport {
        match p {
            Phase::FwdGather => &self.fwd_gather,
            Phase::BwdGather => &self.bwd_gather,
            Phase::GradReduce => &self.grad_reduce,
            Phase::Boundary => &self.boundary,
            Phase::Spread => &self.spread,
        }
    }
    fn get_mut(&mut self, p: Phase) -> &mut TrafficReport {
        match p {
            Phase::FwdGather => &mut self.fwd_gather,
            Phase::BwdGather => &mut self.bwd_gather,
            Phase::GradReduce => &mut self.grad_reduce,
            Phase::Boundary => &mut self.boundary,
            Phase::Spread => &mut self.spread,
        }
    }
    /// From per-phase matrices (already summed over processes).
    pub fn from_matrices(m: &[TrafficMatrix], topo: &Topology) -> TrafficByPhase {
        let mut t = TrafficByPhase::default();
        for (p, m) in Phase::ALL.iter().zip(m) {
            *t.get_mut(*p) = m.report(topo);
        }
        t
    }
    /// Bytes over all classes of every phase.
    pub fn total(&self) -> u64 {
        Phase::ALL
            .iter()
            .map(|p| {
                let r = self.get(*p);
                r.intra_package + r.intra_node + r.inter_node
            })
            .sum()
    }
}
