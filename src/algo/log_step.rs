//! `log-step`: Bruck's all-gather (Bruck et al., "Efficient algorithms for all-to-all
//! communications in multiport message-passing systems", IEEE TPDS 1997, the
//! concatenation algorithm) and its time-reversed dual for reduce-scatter, for any rank
//! count, in ⌈log₂ p⌉ steps instead of a ring's p − 1. The same shape as NCCL's PAT
//! and MPI's Bruck / recursive-halving collectives: the right algorithm when a step's
//! latency, not its bytes, is the cost (small messages, many nodes).
//!
//! Steps (p ranks, this rank x, all indices mod p): the step sizes are d = 1, 2, 4, …
//! with `m = min(d, p − d)` chunks moved at each (`steps`), Σ m = p − 1.
//! - All-gather: before the step of size d, x holds chunks [x, x+d); it sends the first
//!   m of them to x − d and receives [x+d, x+d+m) from x + d. Rotated
//!   ([`all_gather_rotated`]: position i holds chunk x+i) every step is one contiguous
//!   message each way; `hier`'s inter-node stage runs so and the next stage reads the
//!   chunks where they lie, and the flat call runs so up to [`ROTATE_UP_TO`] bytes, then
//!   copies the result into rank order (two copies). Above it, the runs go straight to
//!   their places in `recv` (a run that wraps past chunk p − 1 is two messages, both
//!   sides split it alike; a step's sends and receives are in flight together): no copy.
//!   In place when `send` is `recv[x·c..]`.
//! - Reduce-scatter: the steps in reverse order (d = D … 1, D the largest power of two
//!   below p) over a work copy of `send` rotated so position i is chunk x+i: x sends
//!   positions [d, d+m) to x + d and receives from x − d, reducing into positions
//!   [0, m). After the last step position 0 is x's fully reduced chunk (each chunk's
//!   all-gather broadcast tree, reversed, is a reduction tree to its owner; `Avg` sums,
//!   [`super::run`] divides once). Up to [`ROTATE_UP_TO`] bytes of input the work buffer
//!   is a rotated copy of all of `send`; from it up, the first step sends straight from
//!   `send` and the positions it receives take this rank's chunks by a reduction, so
//!   only 2D − p chunks are copied (none for a power of two).
//! - All-reduce: reduce-scatter then all-gather, as `hier` does (in `recv` when p divides
//!   the count, else through a padded scratch copy).
//!
//! Traffic: every rank sends Σ m·c = (p − 1)·c bytes, a ring's. Between nodes of k ranks
//! (rank-major `nodes:n×k`) the step of size d crosses a node boundary from every rank
//! but the n·(k − d)⁺ whose peer x − d (x + d for reduce-scatter) shares their node, so
//! `inter_node = c·Σ_steps m·(p − n·(k − d)⁺)`, `intra_node = c·Σ_steps m·n·(k − d)⁺`,
//! `max_node_egress = c·Σ_steps m·min(d, k)` (Bruck's; the power-of-two form's are in
//! src/algo/recursive.rs; both asserted by `tests/traffic.rs`). With one
//! rank per node (`hier`'s inter-node stage, `nodes:n×1`) that is the ring's
//! `p·(p − 1)·c` and `(p − 1)·c`: the log-step algorithm saves steps, not bytes.
//!
//! Where p is a power of two the flat collectives run `recursive`
//! (src/algo/recursive.rs) instead: recursive doubling / halving, the same steps and
//! bytes, each a pairwise exchange, every run in place ([`all_gather_plan`] and
//! [`reduce_scatter_plan`] model it so). The functions of this module are Bruck's for
//! any p, as `hier`'s stage calls them.
//!
//! As `hier`'s inter-node stage ([`super::hierarchical`]) it runs on the level-0
//! communicator of each rail; [`super::select::stage_log_step`] picks it per call where
//! the model says the stage is latency-bound.

use super::plan::{BufId, Plan, Ring, Span, Step};
use super::select::Shape;
use super::{Algo, Algorithm};
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::kinds::Kind;
use crate::memory::Buffer;
use crate::runtime::{CommCore, Op, Request};

/// The flat log-step algorithm.
pub struct LogStep;

impl Algorithm for LogStep {
    fn algo(&self) -> Algo {
        Algo::LogStep
    }

    fn unsupported(&self, s: &Shape) -> Option<String> {
        match s.kind {
            Some(Kind::AllGather | Kind::ReduceScatter | Kind::AllReduce) => None,
            _ => Some(format!("log-step has no {}", s.name())),
        }
    }

    fn run(&self, comm: &CommCore, req: &Request) -> Result<()> {
        // Steps on a private copy: never matched with the user's own point-to-point.
        let comm = &comm.private()?;
        let dt = req.dtype;
        match &req.op {
            Op::AllGather { send, recv, count } => {
                flat_all_gather(comm, send, recv, count * dt.size())
            }
            Op::ReduceScatter {
                send,
                recv,
                count,
                op,
            } => flat_reduce_scatter(comm, send, recv, *count, dt, *op),
            Op::AllReduce {
                send,
                recv,
                count,
                op,
            } => super::hierarchical::split_all_reduce(
                comm,
                (send, recv, *count),
                dt,
                *op,
                flat_reduce_scatter,
                flat_all_gather,
            ),
            _ => Err(Error::Internal(
                "log-step dispatched an unsupported op".into(),
            )),
        }
    }
}

/// The flat all-gather: recursive doubling where `p` is a power of two
/// ([`super::recursive`]), else Bruck's ([`all_gather`]).
fn flat_all_gather(comm: &CommCore, send: &Buffer, recv: &Buffer, c: usize) -> Result<()> {
    match comm.size() {
        p if p > 1 && p.is_power_of_two() => super::recursive::all_gather(comm, send, recv, c),
        _ => all_gather(comm, send, recv, c),
    }
}

/// The flat reduce-scatter: recursive halving where `p` is a power of two
/// ([`super::recursive`]), else Bruck's dual ([`reduce_scatter`]).
fn flat_reduce_scatter(
    comm: &CommCore,
    send: &Buffer,
    recv: &Buffer,
    count: usize,
    dt: DataType,
    op: ReduceOp,
) -> Result<()> {
    let p = comm.size();
    if p > 1 && p.is_power_of_two() && count > 0 {
        super::recursive::reduce_scatter(comm, send, recv, count, dt, op.partial())
    } else {
        reduce_scatter(comm, send, recv, count, dt, op)
    }
}

/// The steps of the log-step all-gather over `p` ranks, in order: (d, m) = (step size,
/// chunks moved). Reduce-scatter runs them in reverse.
pub fn steps(p: usize) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    let mut d = 1;
    while d < p {
        v.push((d, d.min(p - d)));
        d *= 2;
    }
    v
}

/// The last (largest) of [`steps`]`(p)`, without building the list: D, the largest
/// power of two below p (p > 1), and the chunks it moves, min(D, p − D).
pub(super) fn last_step(p: usize) -> (usize, usize) {
    let d = if p > 1 {
        1 << (usize::BITS - 1 - (p - 1).leading_zeros())
    } else {
        1
    };
    (d, d.min(p.saturating_sub(d)).max(1))
}

/// The chunk run [a, a+m) of a ring of p chunks as at most two contiguous (start, len)
/// runs, split where it wraps past chunk p − 1.
pub(super) fn runs(a: usize, m: usize, p: usize) -> impl Iterator<Item = (usize, usize)> {
    let first = m.min(p - a);
    [(a, first), (0, m - first)].into_iter().filter(|r| r.1 > 0)
}

/// Up to this many bytes of result (of input, for reduce-scatter) the flat log-step
/// collectives work in a rotated buffer (one message each way per step, a copy of the
/// whole); above it, without that copy (a run that wraps costs a second message,
/// which the MPI transport receives in a second phase). 64 KiB: at 256 KiB the copy
/// already cost 15-20% on 8 ranks sharing a host's memory, at 64 KiB the two forms
/// measured alike there (2026-11-27), and on four one-rank nodes sharing two cores the
/// rotated form took 1.13x Open MPI's time where the other took 1.20x (2026-11-30).
pub const ROTATE_UP_TO: usize = 64 << 10;

/// True when a flat log-step collective of `bytes` (result; input for reduce-scatter)
/// runs rotated ([`ROTATE_UP_TO`]).
pub fn rotates(bytes: usize) -> bool {
    bytes <= ROTATE_UP_TO
}

/// Log-step all-gather of `c` bytes per rank from `send` into `recv` (p·c bytes, rank
/// major) on `comm`, blocking (on its stream, as every algorithm runs).
pub fn all_gather(comm: &CommCore, send: &Buffer, recv: &Buffer, c: usize) -> Result<()> {
    let (p, x) = (comm.size(), comm.rank());
    if p > 1 && c > 0 {
        if let Ok(r) = comm.host_steps(|t| super::log_step_host::all_gather(t, send, recv, c)) {
            return r;
        }
    }
    let ops = comm.ops();
    if rotates(p * c) && p > 1 && c > 0 {
        let rot = recv.alloc_like(p * c)?;
        all_gather_rotated(comm, send, &rot, c)?;
        // Position i holds chunk x + i: two copies put it in rank order.
        let head = (p - x) * c;
        ops.copy(&recv.slice(x * c..p * c)?, &rot.slice(0..head)?)?;
        return ops.copy(&recv.slice(0..x * c)?, &rot.slice(head..p * c)?);
    }
    if send.offset_in(recv) != Some(x * c) {
        ops.copy(&recv.slice(x * c..(x + 1) * c)?, &send.slice(0..c)?)?;
    }
    if c == 0 {
        return Ok(());
    }
    let chunk = |(a, m): (usize, usize)| recv.slice(a * c..(a + m) * c);
    for (d, m) in steps(p) {
        let (to, from) = ((x + p - d) % p, (x + d) % p);
        let mut ops = Vec::with_capacity(4);
        for r in runs(x, m, p) {
            ops.push(Op::Send {
                buf: chunk(r)?,
                count: r.1 * c,
                peer: to,
            });
        }
        for r in runs((x + d) % p, m, p) {
            ops.push(Op::Recv {
                buf: chunk(r)?,
                count: r.1 * c,
                peer: from,
            });
        }
        comm.run_batch(ops, DataType::U8)?;
    }
    Ok(())
}

/// Log-step all-gather into `rot` (p·c bytes) in rotated order: position i holds the
/// chunk of rank x + i (mod p). Every step is one message each way. `hier` runs its
/// inter-node stage this way and reads the chunks where they lie.
pub fn all_gather_rotated(comm: &CommCore, send: &Buffer, rot: &Buffer, c: usize) -> Result<()> {
    let (p, x) = (comm.size(), comm.rank());
    if send.offset_in(rot) != Some(0) {
        comm.ops().copy(&rot.slice(0..c)?, &send.slice(0..c)?)?;
    }
    if c == 0 {
        return Ok(());
    }
    for (d, m) in steps(p) {
        let ops = vec![
            Op::Send {
                buf: rot.slice(0..m * c)?,
                count: m * c,
                peer: (x + p - d) % p,
            },
            Op::Recv {
                buf: rot.slice(d * c..(d + m) * c)?,
                count: m * c,
                peer: (x + d) % p,
            },
        ];
        comm.run_batch(ops, DataType::U8)?;
    }
    Ok(())
}

/// Log-step reduce-scatter on `comm`: `recv` (`count` elements) = reduction over ranks of
/// `send[x·count..]` (`send`: p·count). `Avg` leaves the sum.
pub fn reduce_scatter(
    comm: &CommCore,
    send: &Buffer,
    recv: &Buffer,
    count: usize,
    dt: DataType,
    op: ReduceOp,
) -> Result<()> {
    let (p, x) = (comm.size(), comm.rank());
    let c = count * dt.size();
    let ops = comm.ops();
    if p == 1 || c == 0 {
        return ops.copy(&recv.slice(0..c)?, &send.slice(x * c..(x + 1) * c)?);
    }
    let op = op.partial();
    if let Ok(r) =
        comm.host_steps(|t| super::log_step_host::reduce_scatter(t, send, recv, count, dt, op))
    {
        return r;
    }
    let all = steps(p);
    let (work, first) = if !rotates(p * c) {
        (first_step_direct(comm, send, count, dt, op)?, 1)
    } else {
        (rotated_copy(comm, send, c)?, 0)
    };
    reduce_steps(
        comm,
        &work,
        recv,
        all.into_iter().rev().skip(first),
        count,
        dt,
        op,
    )
}

/// The rotated work copy of `send` (position i holds chunk x + i).
fn rotated_copy(comm: &CommCore, send: &Buffer, c: usize) -> Result<Buffer> {
    let (p, x) = (comm.size(), comm.rank());
    let work = send.alloc_like(p * c)?;
    let mut at = 0;
    for (a, m) in runs(x, p, p) {
        comm.ops().copy(
            &work.slice(at..at + m * c)?,
            &send.slice(a * c..(a + m) * c)?,
        )?;
        at += m * c;
    }
    Ok(work)
}

/// The reduce-scatter's steps `rev` (largest first) over the rotated partials in `work`
/// (position i: chunk x + i), then position 0, this rank's reduced chunk, into `recv`.
fn reduce_steps(
    comm: &CommCore,
    work: &Buffer,
    recv: &Buffer,
    rev: impl Iterator<Item = (usize, usize)>,
    count: usize,
    dt: DataType,
    op: ReduceOp,
) -> Result<()> {
    let (p, x) = (comm.size(), comm.rank());
    let c = count * dt.size();
    for (d, m) in rev {
        let step = Op::SendRecv {
            send: work.slice(d * c..(d + m) * c)?,
            recv: work.slice(0..m * c)?,
            count: m * count,
            dst: (x + d) % p,
            src: (x + p - d) % p,
            reduce: Some(op),
        };
        comm.run_batch(vec![step], dt)?;
    }
    comm.ops().copy(&recv.slice(0..c)?, &work.slice(0..c)?)
}

/// [`reduce_scatter`]'s largest step above [`ROTATE_UP_TO`] bytes of input, with no
/// full work copy: it sends chunks [x+D, x+p) straight from `send` (runs split where
/// they wrap, as the receiver splits them) and receives into work positions [0, p−D),
/// which then take this rank's own chunks by a reduction instead of a copy; only
/// positions [p−D, D) are copied in (none when p is a power of two). Returns the work
/// buffer of D chunks (position i: chunk x + i); the later steps stay inside it.
fn first_step_direct(
    comm: &CommCore,
    send: &Buffer,
    count: usize,
    dt: DataType,
    op: ReduceOp,
) -> Result<Buffer> {
    let f = FirstStep::of(comm.size(), comm.rank(), count * dt.size());
    let ops = comm.ops();
    let work = send.alloc_like(f.work)?;
    let mut batch = Vec::with_capacity(4);
    for r in &f.sends {
        batch.push(Op::Send {
            buf: send.slice(r.clone())?,
            count: r.len(),
            peer: f.dst,
        });
    }
    for r in &f.recvs {
        batch.push(Op::Recv {
            buf: work.slice(r.clone())?,
            count: r.len(),
            peer: f.src,
        });
    }
    comm.run_batch(batch, DataType::U8)?;
    for (w, own, reduce) in f.fill {
        let (w, own) = (work.slice(w)?, send.slice(own)?);
        match reduce {
            true => ops.reduce(&w, &own, dt, op)?,
            false => ops.copy(&w, &own)?,
        }
    }
    Ok(work)
}

/// The reduce-scatter's largest step above [`ROTATE_UP_TO`] bytes of input, as byte
/// ranges ([`first_step_direct`], and the host path's): the runs of `send` it sends to
/// `dst` and of the work buffer (`work` bytes, D chunks) it receives from `src`, both
/// split where they wrap as the peer splits them; then how this rank's own chunks fill
/// the work buffer (work range, `send` range, reduced into what came or copied in).
pub(super) struct FirstStep {
    pub dst: usize,
    pub sends: Vec<std::ops::Range<usize>>,
    pub src: usize,
    pub recvs: Vec<std::ops::Range<usize>>,
    pub fill: Vec<(std::ops::Range<usize>, std::ops::Range<usize>, bool)>,
    pub work: usize,
}

impl FirstStep {
    /// Of rank `x` of `p` (p > 1), `c` bytes per chunk.
    pub(super) fn of(p: usize, x: usize, c: usize) -> FirstStep {
        let (big, first) = last_step(p);
        let bytes = |(a, m): (usize, usize)| a * c..(a + m) * c;
        let dst = (x + big) % p;
        // Consecutive work ranges of the given chunk counts.
        let packed = |ms: &mut dyn Iterator<Item = usize>| {
            let mut at = 0;
            ms.map(|m| {
                at += m * c;
                at - m * c..at
            })
            .collect::<Vec<_>>()
        };
        let recvs = packed(&mut runs(x, first, p).map(|r| r.1));
        let own: Vec<_> = runs(x, first, p)
            .map(|r| (r, true))
            .chain(runs((x + first) % p, big - first, p).map(|r| (r, false)))
            .collect();
        let fill = packed(&mut own.iter().map(|(r, _)| r.1))
            .into_iter()
            .zip(&own)
            .map(|(w, &(r, reduce))| (w, bytes(r), reduce))
            .collect();
        FirstStep {
            dst,
            sends: runs(dst, first, p).map(bytes).collect(),
            src: (x + p - big) % p,
            recvs,
            fill,
            work: big * c,
        }
    }
}

/// The log-step all-gather's transfers as a plan on `ring` (`Ring::Flat`, or a level):
/// `p` ranks, this rank `x`, `c` bytes per chunk; a wrapping run is one step here (the
/// model costs a step by its peer and bytes). Flat with `p` a power of two: recursive
/// doubling's (`recursive`), as the flat call runs.
pub fn all_gather_plan(ring: Ring, p: usize, x: usize, c: usize) -> Plan {
    if ring == Ring::Flat && p.is_power_of_two() {
        return super::recursive::all_gather_plan(p, x, c);
    }
    let steps = steps(p)
        .into_iter()
        .map(|(d, m)| Step {
            ring,
            dst: (x + p - d) % p,
            src: (x + d) % p,
            send: Span {
                buf: BufId::Recv,
                off: x * c,
                len: m * c,
            },
            recv: Span {
                buf: BufId::Recv,
                off: ((x + d) % p) * c,
                len: m * c,
            },
            reduce: false,
            deps: vec![],
        })
        .collect();
    Plan { steps }
}

/// The log-step reduce-scatter's transfers as a plan on `ring` (positions in the rotated
/// work buffer). Flat with `p` a power of two: recursive halving's.
pub fn reduce_scatter_plan(ring: Ring, p: usize, x: usize, c: usize) -> Plan {
    if ring == Ring::Flat && p.is_power_of_two() {
        return super::recursive::reduce_scatter_plan(p, x, c);
    }
    let steps = steps(p)
        .into_iter()
        .rev()
        .map(|(d, m)| Step {
            ring,
            dst: (x + d) % p,
            src: (x + p - d) % p,
            send: Span {
                buf: BufId::Work,
                off: d * c,
                len: m * c,
            },
            recv: Span {
                buf: BufId::Work,
                off: 0,
                len: m * c,
            },
            reduce: true,
            deps: vec![],
        })
        .collect();
    Plan { steps }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_step_is_the_list_s_last() {
        for p in 2..70 {
            assert_eq!(Some(last_step(p)), steps(p).last().copied(), "p={p}");
        }
    }

    #[test]
    fn steps_move_every_chunk_once() {
        for p in 1..=70 {
            let s = steps(p);
            assert_eq!(s.iter().map(|&(_, m)| m).sum::<usize>(), p - 1, "p={p}");
            assert_eq!(s.len(), (p as f64).log2().ceil() as usize, "p={p}");
        }
        assert_eq!(steps(6), vec![(1, 1), (2, 2), (4, 2)]);
    }

    #[test]
    fn runs_split_at_the_wrap() {
        assert_eq!(runs(2, 3, 5).collect::<Vec<_>>(), vec![(2, 3)]);
        assert_eq!(runs(4, 3, 5).collect::<Vec<_>>(), vec![(4, 1), (0, 2)]);
        assert_eq!(runs(0, 5, 5).collect::<Vec<_>>(), vec![(0, 5)]);
    }
}
