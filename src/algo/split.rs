//! All-reduce as a reduce-scatter then an all-gather, the form of the techniques that
//! have no all-reduce of their own (`hier`, `log-step`).

#![forbid(unsafe_code)]

use super::reduction::Reduction;
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::memory::Buffer;
use crate::runtime::{CommCore, Op, Request};

/// Run `req` with a technique's reduce-scatter `rs` and all-gather `ag` (bytes per rank),
/// all-reduce as [`split_all_reduce`] of the two; any other op is an internal error
/// naming the technique (`name`).
pub(crate) fn run_split(
    comm: &CommCore,
    req: &Request,
    name: &str,
    rs: impl Fn(&CommCore, &Buffer, &Buffer, Reduction) -> Result<()>,
    ag: impl Fn(&CommCore, &Buffer, &Buffer, usize) -> Result<()>,
) -> Result<()> {
    let dt = req.dtype;
    match &req.op {
        Op::AllGather { send, recv, count } => ag(comm, send, recv, count * dt.size()),
        Op::ReduceScatter {
            send,
            recv,
            count,
            op,
        } => rs(comm, send, recv, Reduction::new(*count, dt, *op)),
        Op::AllReduce {
            send,
            recv,
            count,
            op,
        } => split_all_reduce(comm, (send, recv, *count), dt, *op, rs, ag),
        _ => Err(Error::Internal(format!(
            "{name} dispatched an unsupported op"
        ))),
    }
}

/// All-reduce of `(send, recv, count)` as `rs` (reduce-scatter, `Avg` summing) then `ag`
/// (all-gather of bytes per rank) on `comm`: in `recv` itself when the ranks divide the
/// count (the first stage reads `send` into scratch and only the last writes `recv`, so
/// in place works), else over the count padded to a multiple of p (a scratch copy each
/// way).
pub(crate) fn split_all_reduce(
    comm: &CommCore,
    (send, recv, count): (&Buffer, &Buffer, usize),
    dt: DataType,
    op: ReduceOp,
    rs: impl Fn(&CommCore, &Buffer, &Buffer, Reduction) -> Result<()>,
    ag: impl Fn(&CommCore, &Buffer, &Buffer, usize) -> Result<()>,
) -> Result<()> {
    let (p, r) = (comm.size(), comm.rank());
    let s = dt.size();
    let q = count.div_ceil(p);
    if q * p == count {
        let mine = recv.slice(r * q * s..(r + 1) * q * s)?;
        rs(comm, send, &mine, Reduction::new(q, dt, op))?;
        return ag(comm, &mine, recv, q * s);
    }
    let ops = comm.ops();
    let padded = comm.alloc_like(&send, q * p * s)?;
    ops.copy(&padded.slice(0..count * s)?, &send.slice(0..count * s)?)?;
    let chunk = comm.alloc_like(&send, q * s)?;
    rs(comm, &padded, &chunk, Reduction::new(q, dt, op))?;
    ag(comm, &chunk, &padded, q * s)?;
    ops.copy(&recv.slice(0..count * s)?, &padded.slice(0..count * s)?)
}
