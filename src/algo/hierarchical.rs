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
//! Stage 0 (`B_0 = 1`: one rank per node in each group) runs as a ring or as the
//! log-step algorithm of [`super::log_step`] ([`Inter`]): `hier` asks the model per call
//! ([`super::cost::stage_log_step`]: log-step while the stage is latency-bound),
//! `hier-ring` and `hier-log` force a form. The log-step all-gather leaves stage 0's
//! chunks rotated by this rank's level-0 index, and stage 1 reads each where it lies.
//! Both forms move the same bytes.
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

use super::reduction::Reduction;
use super::shape::{Algorithm, Shape};
use super::split::run_split;
use super::Algo;
use crate::dtype::DataType;
use crate::error::Result;
use crate::kinds::Kind;
use crate::memory::Buffer;
use crate::runtime::{CommCore, Op, Request};

/// How `hier` runs its inter-node stage (level 0, one rank per node in each group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inter {
    /// Rings (`hier-ring`: MiCS as published).
    Ring,
    /// The log-step algorithm of [`super::log_step`] (`hier-log`).
    LogStep,
    /// Whichever the model says is faster for the call ([`super::cost::stage_log_step`]).
    Auto,
}

/// The hierarchical algorithm, with its inter-node stage's form.
pub struct Hier(pub Inter);

impl Algorithm for Hier {
    fn algo(&self) -> Algo {
        match self.0 {
            Inter::Ring => Algo::HierRing,
            Inter::LogStep => Algo::HierLog,
            Inter::Auto => Algo::Hier,
        }
    }

    fn unsupported(&self, s: &Shape) -> Option<String> {
        levels_unsupported(s, self.algo().name())
    }

    fn run(&self, comm: &CommCore, req: &Request) -> Result<()> {
        hier_run(comm, req, self.0)
    }
}

/// True when the level-0 stage of `g` ranks moving `c` bytes per rank runs log-step.
fn stage_log(comm: &CommCore, inter: Inter, g: usize, c: usize) -> bool {
    match inter {
        Inter::Ring => false,
        Inter::LogStep => true,
        Inter::Auto => {
            let class = comm
                .hierarchy()
                .map(|h| h.levels[0].0.link_class())
                .unwrap_or(crate::topology::LinkClass::InterNode);
            super::cost::stage_log_step(comm.topology(), class, g, c)
        }
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

fn hier_run(comm: &CommCore, req: &Request, inter: Inter) -> Result<()> {
    let ag = |comm: &CommCore, send: &Buffer, recv: &Buffer, c: usize| {
        all_gather_with(comm, send, recv, c, inter)
    };
    let rs = |comm: &CommCore, send: &Buffer, recv: &Buffer, r: Reduction| {
        reduce_scatter_with(comm, send, recv, r, inter)
    };
    run_split(comm, req, "hier", rs, ag)
}

/// Run `ops` on `sub` as one batch (one vendor group on GPUs) and wait for them.
fn batch(sub: &CommCore, ops: Vec<Op>, dt: DataType) -> Result<()> {
    sub.run_batch(ops, dt)
}

/// Hierarchical all-gather of `c` bytes per rank from `send` into `recv` (p·c bytes),
/// rings at every stage (MiCS as published).
pub fn all_gather(comm: &CommCore, send: &Buffer, recv: &Buffer, c: usize) -> Result<()> {
    all_gather_with(comm, send, recv, c, Inter::Ring)
}

/// [`all_gather`] with the inter-node stage as `inter` says.
pub fn all_gather_with(
    comm: &CommCore,
    send: &Buffer,
    recv: &Buffer,
    c: usize,
    inter: Inter,
) -> Result<()> {
    let sizes = comm.hierarchy().map(|h| h.sizes()).unwrap_or_default();
    let m = sizes.len();
    let mut cur = send.clone();
    let mut b = 1;
    // A log-step inter-node stage leaves its chunks rotated by this rank's level-0 index
    // (chunk j at position j - x0 mod g0); the next stage reads them where they lie.
    let mut rotated = 0;
    for (i, &g) in sizes.iter().enumerate() {
        let sub = comm.level(i)?;
        let out = if i + 1 == m {
            recv.clone()
        } else {
            comm.alloc_like(&recv, b * g * c)?
        };
        if i == 0 && m > 1 && stage_log(comm, inter, g, c) {
            super::log_step::all_gather_rotated(&sub, &cur.slice(0..c)?, &out, c)?;
            rotated = sub.rank();
            cur = out;
            b *= g;
            continue;
        }
        let at = |j: usize| (j + b - rotated) % b;
        let ops = (0..b)
            .map(|j| {
                Ok(Op::AllGather {
                    send: cur.slice(at(j) * c..(at(j) + 1) * c)?,
                    recv: out.slice(j * g * c..(j + 1) * g * c)?,
                    count: c,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        batch(&sub, ops, DataType::U8)?;
        cur = out;
        b *= g;
        rotated = 0;
    }
    Ok(())
}

/// Hierarchical reduce-scatter: `recv` (count elements) from `send` (p·count), the
/// inter-node stage as `inter` says; `Avg` sums.
pub fn reduce_scatter_with(
    comm: &CommCore,
    send: &Buffer,
    recv: &Buffer,
    r: Reduction,
    inter: Inter,
) -> Result<()> {
    let Reduction { count, dt, op } = r;
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
            comm.alloc_like(&recv, b * c)?
        };
        if i == 0 && stage_log(comm, inter, g, c) {
            super::log_step::reduce_scatter(
                &sub,
                &cur.slice(0..g * c)?,
                &out,
                Reduction { op, ..r },
            )?;
            break;
        }
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
