//! The alpha-beta cost of one stage, ring against log-step: what `hier` asks per call
//! for its inter-node stage and what [`super::select`]'s estimates are built from.

#![forbid(unsafe_code)]

use crate::topology::{LinkClass, Topology};

/// The fraction of a link's bandwidth the log-step algorithm is modeled to reach: 0.75,
/// the factor NCCL's tuning model applies to PAT's bus bandwidth
/// (`src/graph/tuning.cc`, NCCL 2.23 and later). Its steps are store-and-forward
/// messages of growing size between changing peers, where a ring streams to one
/// neighbour; the factor is what makes rings win for large messages.
pub const LOG_STEP_BW: f64 = 0.75;

/// Modeled time (µs) of one stage of `g` ranks on links of `class`, `c` bytes per rank,
/// as (ring, log-step): `(g−1)(α + c/β)` against `⌈log₂g⌉·α + (g−1)·c/(0.75·β)`.
pub fn stage_times(topo: &Topology, class: LinkClass, g: usize, c: usize) -> (f64, f64) {
    let l = topo.links.get(class);
    let bw = l.bandwidth_gbs * 1e3;
    let n = g.saturating_sub(1) as f64;
    let steps = super::log_step_math::steps(g).len() as f64;
    (
        n * (l.latency_us + c as f64 / bw),
        steps * l.latency_us + n * c as f64 / (LOG_STEP_BW * bw),
    )
}

/// True when `hier`'s inter-node stage (`g` ranks, one per node, on `class` links, `c`
/// bytes per rank) is modeled faster as log-step than as a ring.
pub fn stage_log_step(topo: &Topology, class: LinkClass, g: usize, c: usize) -> bool {
    let (ring, log) = stage_times(topo, class, g, c);
    log < ring
}
