//! Algorithms: one file per technique. Each declares the constraints it needs on a
//! call's [`Shape`] and is written once against the communicator core
//! ([`CommCore`]), so it runs unchanged on every transport; when its constraints do not
//! hold the request falls back to the native collective. Every algorithm reaches the
//! wire the same way, [`CommCore::enqueue`] (native ops on the communicator or its level,
//! node and rail sub-communicators), and local work through [`CommCore::ops`]; on host
//! transports `log-step`'s flat steps go straight to the transport instead
//! ([`CommCore::host_steps`]).
//!
//! - [`Native`]: the flat baselines (the transport's native collectives; on host
//!   transports the rings of [`crate::transport::ring`]);
//! - [`hierarchical`]: MiCS §3.3 hierarchical all-gather / reduce-scatter, 2 and 3 levels,
//!   its inter-node stage a ring or log-step;
//! - [`log_step`]: Bruck's log-step all-gather and its reduce-scatter dual, any rank count
//!   (`recursive`: recursive doubling / halving, its form for a power of two;
//!   `log_step_host`: its steps straight on a host transport);
//! - [`ho_ring`]: PaRO §3.3 hierarchical overlapping rings, and the pipelined 2-D all-reduce;
//! - [`plan`]: algorithms as per-rank step lists, executed or turned into schedules;
//! - [`qgz`], [`qwz`]: ZeRO++ §4.2-4.3 quantized reduce-scatter (2-hop, 1-hop) and all-gather;
//! - [`coalesced`]: MiCS §4 coalesced all-gather / reduce-scatter over uneven buffers;
//! - [`select`]: the one selection rule (`auto`), shared with the simulator.
//!
//! `select` sits on top of the techniques; under them are the leaves they share:
//! `shape` (the [`Shape`] of a call, the [`Algorithm`] trait), `cost` (a stage's
//! ring / log-step cost), `log_step_math` (the log-step step arithmetic), `split`
//! (all-reduce as reduce-scatter + all-gather) and `step_list` (a plan's vocabulary,
//! re-exported by [`plan`]). tests/layers.rs keeps the files of this folder acyclic.

#![forbid(unsafe_code)]

pub mod coalesced;
mod cost;
pub mod hierarchical;
pub mod ho_ring;
pub mod log_step;
mod log_step_host;
mod log_step_math;
mod native;
pub mod plan;
pub mod qgz;
pub mod qwz;
mod recursive;
mod reduction;
pub mod select;
mod shape;
mod split;
mod step_list;

use crate::error::Result;
pub use crate::kinds::Algo;
use crate::runtime::{CommCore, Op, Request};
pub use native::Native;
pub use shape::{Algorithm, Shape};

/// Run a checked request with the algorithm `algo` chosen for it ([`select::choose`]),
/// on `core`'s stream thread: coalesced requests are packed and run as one flat request;
/// an `Avg` result is divided by the communicator size here, the one place it happens
/// (the quantized algorithms divide inside their final f32 reduction instead, before
/// rounding to the output type). `ring` on a host transport is the transport's own
/// collective, called from here ([`crate::runtime::native::run_host`]).
#[inline]
pub fn run(core: &CommCore, algo: Algo, req: &Request) -> Result<()> {
    if algo == Algo::Ring && !req.op.is_coalesced() && !core.has_device() && core.on_stream() {
        // The transport's own collective on host memory, straight from here: what
        // `Native` reaches through the stream's batch runner for one op.
        crate::runtime::native::run_host(
            core.transport().as_ref(),
            &req.op,
            req.dtype,
            core.timeout(),
        )?;
        return divide_avg(core, &req.op, req.dtype);
    }
    run_algorithm(core, algo, req)
}

/// [`run`] through the algorithm table.
fn run_algorithm(core: &CommCore, algo: Algo, req: &Request) -> Result<()> {
    let a = select::algorithm(algo);
    let flat = |flat: &Request| a.run(core, flat);
    match &req.op {
        Op::AllGatherCoalesced { .. } | Op::ReduceScatterCoalesced { .. } => {
            coalesced::run(core, req, flat)?
        }
        _ => flat(req)?,
    }
    if a.divides_avg() {
        return Ok(());
    }
    divide_avg(core, &req.op, req.dtype)
}

/// Divide an `Avg` op's summed result by the communicator's size, the one division of
/// its result (nothing for other ops): [`run`]'s last step, and the fast launch path's
/// after a library without its own mean.
#[inline]
pub fn divide_avg(core: &CommCore, op: &Op, dtype: crate::dtype::DataType) -> Result<()> {
    if op.redop() != Some(crate::dtype::ReduceOp::Avg) {
        return Ok(());
    }
    divide(core, op, dtype)
}

fn divide(core: &CommCore, op: &Op, dtype: crate::dtype::DataType) -> Result<()> {
    let (n, s, ops) = (core.size(), dtype.size(), core.ops());
    match op {
        Op::ReduceScatter { recv, count, .. } | Op::AllReduce { recv, count, .. } => {
            ops.divide(&recv.slice(0..count * s)?, dtype, n)
        }
        Op::ReduceScatterCoalesced { recvs, counts, .. } => {
            for (r, c) in recvs.iter().zip(counts) {
                ops.divide(&r.slice(0..c * s)?, dtype, n)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// True when `req` runs as one native vendor call with nothing enqueued after it (no
/// `Avg` division, no reduction of a received message, no packing), so a group of such
/// calls on a GPU transport can be one vendor group.
pub fn fusable(req: &Request, algo: Algo) -> bool {
    algo == Algo::Ring
        && req.op.device().is_some()
        && req.op.redop() != Some(crate::dtype::ReduceOp::Avg)
        && !matches!(
            req.op,
            Op::SendRecv {
                reduce: Some(_),
                ..
            } | Op::AllGatherCoalesced { .. }
                | Op::ReduceScatterCoalesced { .. }
        )
}
