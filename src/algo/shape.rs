//! What a technique sees of a call ([`Shape`]: no buffers, no communicator, so the
//! simulator asks the same questions) and what every technique implements
//! ([`Algorithm`]).

#![forbid(unsafe_code)]

use super::Algo;
use crate::dtype::{DataType, ReduceOp};
use crate::error::Result;
use crate::kinds::Kind;
use crate::runtime::{CommCore, Op, Request};
use crate::topology::{Hierarchy, Topology};

/// What selection knows about a call: no buffers, no communicator, so the simulator can
/// ask the same question about a modeled cluster.
#[derive(Debug, Clone)]
pub struct Shape<'a> {
    /// The collective (`None`: point-to-point, always native). Coalesced calls are
    /// their flat collective over the packed count.
    pub kind: Option<Kind>,
    /// The reduction, where there is one.
    pub redop: Option<ReduceOp>,
    /// NCCL's per-call count: elements per rank chunk (all-gather, reduce-scatter) or
    /// of the whole buffer (all-reduce, broadcast).
    pub count: usize,
    pub dtype: DataType,
    pub topo: &'a Topology,
    /// World ranks of the communicator, in its order.
    pub members: &'a [usize],
    pub hierarchy: Option<&'a Hierarchy>,
    /// Configured ho-ring pieces per chunk.
    pub chunks: Option<usize>,
}

impl<'a> Shape<'a> {
    /// The shape of a checked request on `core`.
    pub fn of(core: &'a CommCore, req: &Request) -> Shape<'a> {
        let (kind, count) = match &req.op {
            Op::AllGatherCoalesced { counts, .. } => (Some(Kind::AllGather), counts.iter().sum()),
            Op::ReduceScatterCoalesced { counts, .. } => {
                (Some(Kind::ReduceScatter), counts.iter().sum())
            }
            Op::AllGather { count, .. }
            | Op::ReduceScatter { count, .. }
            | Op::AllReduce { count, .. }
            | Op::AllToAll { count, .. }
            | Op::Broadcast { count, .. } => (req.op.kind(), *count),
            Op::Send { count, .. } | Op::Recv { count, .. } | Op::SendRecv { count, .. } => {
                (None, *count)
            }
        };
        Shape {
            kind,
            redop: req.op.redop(),
            count,
            dtype: req.dtype,
            topo: core.topology(),
            members: core.members(),
            hierarchy: core.hierarchy(),
            chunks: core.config().ho_ring_chunks,
        }
    }

    /// Ranks in the communicator.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The op's name, as on the command line.
    pub fn name(&self) -> &'static str {
        self.kind.map_or("point-to-point", |k| k.name())
    }
}

/// A registered algorithm.
pub trait Algorithm: Sync {
    /// Its name.
    fn algo(&self) -> Algo;
    /// `None` when it can run a call of shape `s`, else why not.
    fn unsupported(&self, s: &Shape) -> Option<String>;
    /// Run a checked, non-coalesced request (on the communicator's stream thread).
    /// Reductions with `Avg` leave the sum: [`super::run`] divides once.
    fn run(&self, core: &CommCore, req: &Request) -> Result<()>;
    /// True when `run` already divides `Avg` results by the communicator size.
    fn divides_avg(&self) -> bool {
        false
    }
}
