//! Coalesced all-gather and reduce-scatter (MiCS §4): a list of buffers of uneven counts
//! moves as ONE collective. The tensors are packed into one flat buffer in the layout
//! the flat collective needs (all-gather: each rank's tensors back to back; reduce-
//! scatter: for each destination rank, its chunk of every tensor), the flat request runs
//! on whichever algorithm is selected (`ring` or `hier`), and the result is unpacked. On
//! host transports the packing copies are cheap next to the ring latency they save:
//! `Σ_i (p-1)` steps become `p-1`.

use crate::error::{Error, Result};
use crate::memory::Buffer;
use crate::runtime::{CommCore, Op, Request};

/// Run a coalesced request as one flat request through `flat`.
pub fn run(
    comm: &CommCore,
    req: &Request,
    flat: impl FnOnce(&Request) -> Result<()>,
) -> Result<()> {
    let p = comm.size();
    let s = req.dtype.size();
    let ops = comm.ops();
    match &req.op {
        Op::AllGatherCoalesced {
            sends,
            recvs,
            counts,
        } => {
            let total: usize = counts.iter().sum();
            let like = place(sends, recvs)?;
            let fsend = comm.alloc_like(&like, total * s)?;
            let mut off = 0;
            for (b, &n) in sends.iter().zip(counts) {
                ops.copy(&fsend.slice(off..off + n * s)?, &b.slice(0..n * s)?)?;
                off += n * s;
            }
            let frecv = comm.alloc_like(&like, p * total * s)?;
            flat(&Request {
                op: Op::AllGather {
                    send: fsend,
                    recv: frecv.clone(),
                    count: total,
                },
                ..req.clone()
            })?;
            let mut off = 0;
            for (b, &n) in recvs.iter().zip(counts) {
                for r in 0..p {
                    let src = (r * total + off) * s;
                    ops.copy(
                        &b.slice(r * n * s..(r + 1) * n * s)?,
                        &frecv.slice(src..src + n * s)?,
                    )?;
                }
                off += n;
            }
            Ok(())
        }
        Op::ReduceScatterCoalesced {
            sends,
            recvs,
            counts,
            op,
        } => {
            let total: usize = counts.iter().sum();
            let like = place(sends, recvs)?;
            let fsend = comm.alloc_like(&like, p * total * s)?;
            let mut off = 0;
            for (b, &n) in sends.iter().zip(counts) {
                for r in 0..p {
                    let dst = (r * total + off) * s;
                    ops.copy(
                        &fsend.slice(dst..dst + n * s)?,
                        &b.slice(r * n * s..(r + 1) * n * s)?,
                    )?;
                }
                off += n;
            }
            let frecv = comm.alloc_like(&like, total * s)?;
            flat(&Request {
                op: Op::ReduceScatter {
                    send: fsend,
                    recv: frecv.clone(),
                    count: total,
                    op: *op,
                },
                ..req.clone()
            })?;
            let mut off = 0;
            for (b, &n) in recvs.iter().zip(counts) {
                ops.copy(&b.slice(0..n * s)?, &frecv.slice(off * s..(off + n) * s)?)?;
                off += n;
            }
            Ok(())
        }
        _ => Err(Error::Internal(format!(
            "{} is not a coalesced op",
            req.op.name()
        ))),
    }
}

/// A buffer of the coalesced call whose place (host or device) the packed buffers take.
fn place<'a>(sends: &'a [Buffer], recvs: &'a [Buffer]) -> Result<&'a Buffer> {
    sends
        .iter()
        .chain(recvs)
        .find(|b| !b.is_empty())
        .or_else(|| sends.first())
        .ok_or_else(|| Error::Internal("coalesced call without buffers".into()))
}
