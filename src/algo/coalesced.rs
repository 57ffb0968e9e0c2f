//! Coalesced all-gather and reduce-scatter (MiCS §4): a list of buffers of uneven counts
//! moves as ONE collective. The tensors are packed into one flat buffer in the layout
//! the flat collective needs (all-gather: each rank's tensors back to back; reduce-
//! scatter: for each destination rank, its chunk of every tensor), the flat request runs
//! on whichever algorithm is selected (`ring` or `hier`), and the result is unpacked. On
//! host transports the packing copies are cheap next to the ring latency they save:
//! `Σ_i (p-1)` steps become `p-1`.

use crate::comm::request::{Op, Request};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::memory::Buffer;

/// Run a coalesced request as one flat request through `flat`.
/// Returns what `flat` returns (whether `Avg` was already divided).
pub fn run(
    comm: &Comm,
    req: &Request,
    flat: impl FnOnce(&Request) -> Result<bool>,
) -> Result<bool> {
    let p = comm.size();
    let s = req.dtype.size();
    let t = comm.timeout();
    match &req.op {
        Op::AllGatherCoalesced {
            sends,
            recvs,
            counts,
        } => {
            let total: usize = counts.iter().sum();
            let fsend = Buffer::zeroed(total * s);
            {
                let mut w = fsend.write_timeout(t)?;
                let mut off = 0;
                for (b, &n) in sends.iter().zip(counts) {
                    w[off..off + n * s].copy_from_slice(&b.read_timeout(t)?);
                    off += n * s;
                }
            }
            let frecv = Buffer::zeroed(p * total * s);
            let divided = flat(&Request {
                op: Op::AllGather {
                    send: fsend,
                    recv: frecv.clone(),
                    count: total,
                },
                ..req.clone()
            })?;
            let all = frecv.read_timeout(t)?;
            let mut off = 0;
            for (b, &n) in recvs.iter().zip(counts) {
                let mut w = b.write_timeout(t)?;
                for r in 0..p {
                    let src = (r * total + off) * s;
                    w[r * n * s..(r + 1) * n * s].copy_from_slice(&all[src..src + n * s]);
                }
                off += n;
            }
            Ok(divided)
        }
        Op::ReduceScatterCoalesced {
            sends,
            recvs,
            counts,
            op,
        } => {
            let total: usize = counts.iter().sum();
            let fsend = Buffer::zeroed(p * total * s);
            {
                let mut w = fsend.write_timeout(t)?;
                let mut off = 0;
                for (b, &n) in sends.iter().zip(counts) {
                    let src = b.read_timeout(t)?;
                    for r in 0..p {
                        let dst = (r * total + off) * s;
                        w[dst..dst + n * s].copy_from_slice(&src[r * n * s..(r + 1) * n * s]);
                    }
                    off += n;
                }
            }
            let frecv = Buffer::zeroed(total * s);
            let divided = flat(&Request {
                op: Op::ReduceScatter {
                    send: fsend,
                    recv: frecv.clone(),
                    count: total,
                    op: *op,
                },
                ..req.clone()
            })?;
            let all = frecv.read_timeout(t)?;
            let mut off = 0;
            for (b, &n) in recvs.iter().zip(counts) {
                b.write_timeout(t)?
                    .copy_from_slice(&all[off * s..(off + n) * s]);
                off += n;
            }
            Ok(divided)
        }
        _ => Err(Error::Internal(format!(
            "{} is not a coalesced op",
            req.op.name()
        ))),
    }
}
