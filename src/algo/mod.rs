//! Algorithms: one file per technique. Each declares the constraints it needs and is
//! written once against the communicator API, so it runs unchanged on every transport;
//! when its constraints do not hold the request falls back to the native collective.
//!
//! - [`ring`]: flat baselines (the native collectives of host transports);
//! - [`hierarchical`]: MiCS §3.3 hierarchical all-gather / reduce-scatter, 2 and 3 levels;
//! - [`ho_ring`]: PaRO §3.3 hierarchical overlapping rings, and the pipelined 2-D all-reduce;
//! - [`plan`]: algorithms as per-rank step lists, executed or turned into schedules;
//! - [`qgz`], [`qwz`]: ZeRO++ quantized reduce-scatter (2-hop and 1-hop) and all-gather;
//! - [`coalesced`]: MiCS §4 coalesced all-gather / reduce-scatter over uneven buffers;
//! - [`select`]: the `auto` rule.

pub mod coalesced;
pub mod hierarchical;
pub mod ho_ring;
pub mod plan;
pub mod qgz;
pub mod qwz;
pub mod ring;
pub mod select;

use crate::comm::request::{Op, Request};
use crate::comm::Comm;
use crate::error::Result;
pub use crate::kinds::Algo;

/// A registered algorithm.
pub trait Algorithm: Sync {
    /// Its name.
    fn algo(&self) -> Algo;
    /// `None` when it can run `req` on `comm`, else why not.
    fn unsupported(&self, comm: &Comm, req: &Request) -> Option<String>;
    /// Run a checked, non-coalesced request (on the communicator's stream thread).
    /// Reductions with `Avg` leave the sum: the submit path divides once.
    fn run(&self, comm: &Comm, req: &Request) -> Result<()>;
    /// True when `run` already divides `Avg` results by the communicator size.
    fn divides_avg(&self) -> bool {
        false
    }
}

/// The ring / native baseline.
pub struct Native;

impl Algorithm for Native {
    fn algo(&self) -> Algo {
        Algo::Ring
    }
    fn unsupported(&self, _: &Comm, _: &Request) -> Option<String> {
        None
    }
    fn run(&self, comm: &Comm, req: &Request) -> Result<()> {
        crate::comm::native::run(
            comm.transport().as_ref(),
            &req.op,
            req.dtype,
            comm.timeout(),
        )
    }
}

/// Run a checked request: coalesced requests are packed and run as one flat request;
/// the algorithm is the one [`select::choose`] returns.
/// Returns whether the algorithm already divided an `Avg` result (quantized algorithms
/// divide inside their final f32 reduction, before rounding to the output type).
pub fn execute(comm: &Comm, req: &Request) -> Result<bool> {
    match &req.op {
        Op::AllGatherCoalesced { .. } | Op::ReduceScatterCoalesced { .. } => {
            coalesced::run(comm, req, |flat| run_flat(comm, flat))
        }
        _ => run_flat(comm, req),
    }
}

fn run_flat(comm: &Comm, req: &Request) -> Result<bool> {
    let (a, why) = select::choose(comm, req);
    tracing::debug!(rank = comm.rank(), op = req.op.name(), algo = a.algo().name(), reason = %why, "dispatch");
    a.run(comm, req)?;
    Ok(a.divides_avg())
}
