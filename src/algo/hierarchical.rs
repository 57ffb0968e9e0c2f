//! `hier`: MiCS hierarchical all-gather (§3.3, Fig. 5) and its mirror for
//! reduce-scatter, over every level the communicator spans: 2 levels (network, node) or
//! 3 (network, node, package: Frontier's GCD pairs, the Frontier ZeRO paper §IV). The result has
//! exactly the flat collective's layout.
//!
//! All-gather runs the levels outermost first. Stage i all-gathers, over the level-i
//! group (ranks differing only in their level-i index), each of the `B_i = Π_{j<i} g_j`
//! chunks this rank holds so far, as `B_i` batched all-gathers launched as one group:
//! batch `b` writes its `g_i` chunks contiguously at `b·g_i`, so after the stage the
//! chunks are ordered by (x_0..x_i) and the last stage writes the user's buffer in rank
//! order without a rearrangement copy. Stage 0 is MiCS's parallel inter-node all-gather
//! among rails, the last stage its batched intra-node all-gathers. Reduce-scatter runs
//! the same stages innermost first, each a batch of reduce-scatters over contiguous runs
//! of `g_i` chunks, so its largest stage stays on the fastest links.
//!
//! Traffic (closed forms asserted by `tests/traffic.rs`): with per-rank chunk c bytes,
//! p ranks, M = p·c, level sizes g_0..g_{m-1} (outermost first), stage i sends
//! `(g_i - 1)·B_i·c` bytes per rank, all on level i's link class, so the class total is
//! `p·(g_i - 1)·B_i·c`. For 2 levels (n nodes of k ranks): inter_node `(n-1)·M`,
//! intra_node `n·(k-1)·M`, max_node_egress `k·(n-1)·c = (p-k)/p·M` (ring: `(p-1)/p·M`).
//! For frontier:N (g = N, 4, 2): inter_node `(N-1)·M`, intra_node `3N·M`, intra_package
//! `p·M/2` (each rank's half of the result crosses only its package link), and the same
//! node egress `(p-8)/p·M`. Reduce-scatter sends the same bytes per class (mirror).
//! All-reduce is reduce-scatter then all-gather: in `recv` itself when p divides the
//! count, else over the count padded to a multiple of p (a scratch copy each way).

use super::select::Shape;
use super::{Algo, Algorithm};
use crate::dtype::{DataType, ReduceOp};
use crate::error::Result;
use crate::kinds::Kind;
use crate::memory::Buffer;
use crate::runtime::{CommCore, Op, Request};

/// The hierarchical algorithm.
pub struct Hier;

impl Algorithm for Hier {
    fn algo(&self) -> Algo {
        Algo::Hier
    }

    fn unsupported(&self, s: &Shape) -> Option<String> {
        levels_unsupported(s, "hier")
    }

    fn run(&self, comm: &CommCore, req: &Request) -> Result<()> {
        hier_run(comm, req)
    }
}

/// True when a level-structured algorithm can run a call of shape `s` (what
/// [`levels_unsupported`] says, without making the message: `auto` asks on every call).
pub(crate) fn levels_apply(s: &Shape) -> bool {
    matches!(
        s.kind,
        Some(Kind::AllGather | Kind::ReduceScatter | Kind::AllReduce)
    ) && s.hierarchy.is_some_and(|h| h.levels.len() >= 2)
}

/// Why a level-structured algorithm (`hier`, `ho-ring`) cannot run a call of shape `s`.
pub(crate) fn levels_unsupported(s: &Shape, what: &str) -> Option<String> {
    if levels_apply(s) {
        return None;
    }
    if !matches!(
        s.kind,
        Some(Kind::AllGather | Kind::ReduceScatter | Kind::AllReduce)
    ) {
        return Some(format!("{what} has no {}", s.name()));
    }
    match s.hierarchy {
        None => Some("ranks are not a regular mesh of the topology".into()),
        Some(h) if h.levels.len() < 2 => Some(format!(
            "communicator spans {} level(s), {what} needs 2 or 3",
            h.levels.len()
        )),
        Some(_) => None,
    }
}

fn hier_run(comm: &CommCore, req: &Request) -> Result<()> {
    let dt = req.dtype;
    match &req.op {
        Op::AllGather { send, recv, count } => all_gather(comm, send, recv, count * dt.size()),
        Op::ReduceScatter {
            send,
            recv,
            count,
            op,
        } => reduce_scatter(comm, send, recv, *count, dt, *op),
        Op::AllReduce {
            send,
            recv,
            count,
            op,
        } => {
            let (p, r) = (comm.size(), comm.rank());
            let s = dt.size();
            let q = count.div_ceil(p);
            if q * p == *count {
                // An exact split: reduce-scatter into this rank's chunk of `recv`, then
                // all-gather in place. No padding, no copies: the first stage reads
                // `send` into scratch and only the last writes `recv`, so in place works.
                let mine = recv.slice(r * q * s..(r + 1) * q * s)?;
                reduce_scatter(comm, send, &mine, q, dt, *op)?;
                return all_gather(comm, &mine, recv, q * s);
            }
            let ops = comm.ops();
            let padded = send.alloc_like(q * p * s)?;
            ops.copy(&padded.slice(0..count * s)?, &send.slice(0..count * s)?)?;
            let chunk = send.alloc_like(q * s)?;
            reduce_scatter(comm, &padded, &chunk, q, dt, *op)?;
            all_gather(comm, &chunk, &padded, q * s)?;
            ops.copy(&recv.slice(0..count * s)?, &padded.slice(0..count * s)?)
        }
        _ => Err(crate::error::Error::Internal(
            "hier dispatched an unsupported op".into(),
        )),
    }
}

/// Run `ops` on `sub` as one batch (one vendor group on GPUs) and wait for them.
fn batch(sub: &CommCore, ops: Vec<Op>, dt: DataType) -> Result<()> {
    sub.enqueue_batch(ops, dt, Vec::new()).wait()
}

/// Hierarchical all-gather of `c` bytes per rank from `send` into `recv` (p·c bytes).
pub fn all_gather(comm: &CommCore, send: &Buffer, recv: &Buffer, c: usize) -> Result<()> {
    let sizes = comm.hierarchy().map(|h| h.sizes()).unwrap_or_default();
    let m = sizes.len();
    let mut cur = send.clone();
    let mut b = 1;
    for (i, &g) in sizes.iter().enumerate() {
        let sub = comm.level(i)?;
        let out = if i + 1 == m {
            recv.clone()
        } else {
            recv.alloc_like(b * g * c)?
        };
        let ops = (0..b)
            .map(|j| {
                Ok(Op::AllGather {
                    send: cur.slice(j * c..(j + 1) * c)?,
                    recv: out.slice(j * g * c..(j + 1) * g * c)?,
                    count: c,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        batch(&sub, ops, DataType::U8)?;
        cur = out;
        b *= g;
    }
    Ok(())
}

/// Hierarchical reduce-scatter: `recv` (count elements) from `send` (p·count); `Avg` sums.
pub fn reduce_scatter(
    comm: &CommCore,
    send: &Buffer,
    recv: &Buffer,
    count: usize,
    dt: DataType,
    op: ReduceOp,
) -> Result<()> {
    let sizes = comm.hierarchy().map(|h| h.sizes()).unwrap_or_default();
    let c = count * dt.size();
    let op = op.partial();
    let mut cur = send.clone();
    for i in (0..sizes.len()).rev() {
        let g = sizes[i];
        let b: usize = sizes[..i].iter().product();
        let sub = comm.level(i)?;
        let out = if i == 0 {
            recv.clone()
        } else {
            recv.alloc_like(b * c)?
        };
        let ops = (0..b)
            .map(|j| {
                Ok(Op::ReduceScatter {
                    send: cur.slice(j * g * c..(j + 1) * g * c)?,
                    recv: out.slice(j * c..(j + 1) * c)?,
                    count,
                    op,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        batch(&sub, ops, dt)?;
        cur = out;
    }
    Ok(())
}
