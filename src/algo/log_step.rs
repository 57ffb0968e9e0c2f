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
//! communicator of each rail; [`super::cost::stage_log_step`] picks it per call where
//! the model says the stage is latency-bound.

pub use super::log_step_math::{rotates, steps, ROTATE_UP_TO};
use super::log_step_math::{runs, FirstStep};
use super::reduction::Reduction;
use super::shape::{Algorithm, Shape};
use super::split::run_split;
use super::step_list::{BufId, Plan, Ring, Span, Step};
use super::Algo;
use crate::dtype::{DataType, ReduceOp};
use crate::error::Result;
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
        run_split(comm, req, "log-step", flat_reduce_scatter, flat_all_gather)
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
fn flat_reduce_scatter(comm: &CommCore, send: &Buffer, recv: &Buffer, r: Reduction) -> Result<()> {
    let p = comm.size();
    if p > 1 && p.is_power_of_two() && r.count > 0 {
        let op = r.op.partial();
        super::recursive::reduce_scatter(comm, send, recv, Reduction { op, ..r })
    } else {
        reduce_scatter(comm, send, recv, r)
    }
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
        let rot = comm.alloc_like(&recv, p * c)?;
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
pub fn reduce_scatter(comm: &CommCore, send: &Buffer, recv: &Buffer, r: Reduction) -> Result<()> {
    let Reduction { count, dt, op } = r;
    let (p, x) = (comm.size(), comm.rank());
    let c = count * dt.size();
    let ops = comm.ops();
    if p == 1 || c == 0 {
        return ops.copy(&recv.slice(0..c)?, &send.slice(x * c..(x + 1) * c)?);
    }
    let op = op.partial();
    if let Ok(r) = comm
        .host_steps(|t| super::log_step_host::reduce_scatter(t, send, recv, Reduction { op, ..r }))
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
    let work = comm.alloc_like(&send, p * c)?;
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
    let work = comm.alloc_like(&send, f.work)?;
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
