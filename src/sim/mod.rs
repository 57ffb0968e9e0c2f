//! The simulator: schedules of collectives as dependency graphs of transfers, replayed
//! on modeled clusters.
//!
//! - [`schedule`]: a [`Schedule`] from per-rank plans ([`Schedule::from_plans`]), from a
//!   dry run of any algorithm on any topology size without data ([`dry_run`]), or from
//!   the recording of a real run on the local transport ([`start_recording`],
//!   [`finish_recording`], [`Schedule::from_recording`]);
//! - [`replay`](mod@replay): time on the topology's link model (per-class latency + bytes /
//!   bandwidth, shared NICs, link classes busy at once), with per-resource busy times
//!   and the lower bound the busiest resource sets;
//! - [`symmetric`]: the same makespan from one node's ranks on identical nodes (exact,
//!   `1/nodes` of the work: the engine's planner models 1024-rank clusters with it);
//! - [`trace`]: Chrome-trace JSON of a replay (Perfetto);
//! - [`plot`]: SVG of modeled time against message size;
//! - [`fidelity`]: the model beside published nccl-tests figures and paper ratios.
//!
//! ```
//! use strata::check::Kind;
//! use strata::sim::{dry_run, replay, Call};
//! use strata::{Algo, DataType, Topology};
//! let topo = Topology::parse("dgx-a100:2").unwrap();
//! let call = Call::new(&topo, Kind::AllGather, Algo::HoRing, 1 << 20, DataType::F32);
//! let s = dry_run(&call).unwrap();
//! let r = replay(&s, &topo).unwrap();
//! assert!(r.makespan_us >= r.lower_bound_us);
//! ```

#![forbid(unsafe_code)]

pub mod fidelity;
pub mod plot;
pub mod replay;
pub mod schedule;
pub mod symmetric;
pub mod trace;
mod waves;

pub use replay::{replay, Bottleneck, Replay, Resource, ResourceKind};
pub use schedule::{dry_run, finish_recording, resolve, start_recording, Call, Schedule, Transfer};
pub use symmetric::symmetric_makespan;

use crate::error::Result;
use crate::kinds::Kind;

/// Dry run and replay of one call: the schedule `call` resolves to on the whole world of
/// its topology, and its replay there.
pub fn model(call: &Call) -> Result<(Schedule, Replay)> {
    let s = dry_run(call)?;
    let r = replay(&s, call.topo)?;
    Ok((s, r))
}

/// nccl-tests' bus-bandwidth factor of `kind` on `p` ranks: (p-1)/p for all-gather,
/// reduce-scatter and all-to-all, 2(p-1)/p for all-reduce, 1 for broadcast.
pub fn bus_factor(kind: Kind, p: usize) -> f64 {
    let p = p.max(1) as f64;
    match kind {
        Kind::AllGather | Kind::ReduceScatter | Kind::AllToAll => (p - 1.0) / p,
        Kind::AllReduce => 2.0 * (p - 1.0) / p,
        Kind::Broadcast { .. } => 1.0,
    }
}

/// nccl-tests' `size` of one call: bytes of the larger buffer (count·p·s for all-gather
/// and reduce-scatter, count·s for all-reduce and broadcast, count·p·s for all-to-all).
pub fn call_bytes(kind: Kind, count: usize, p: usize, elem: usize) -> u64 {
    let (a, b) = kind.sizes(count, p);
    (a.max(b) * elem) as u64
}
