//! The flat `log-step` collectives' form for a power-of-two rank count: recursive
//! doubling (all-gather) and recursive halving (reduce-scatter) (Thakur, Rabenseifner
//! and Gropp, "Optimization of collective communication operations in MPICH", IJHPCA
//! 2005; Open MPI's tuned all-gather is recursive doubling at these sizes).
//! The same ⌈log₂ p⌉ steps and per-step bytes as Bruck's ([`super::log_step::steps`]:
//! the step of size b moves b chunks), but every step is a pairwise exchange with rank
//! x XOR b, and every run is contiguous in rank order: the all-gather sends and receives
//! in place in `recv` with no rotation and no copy but this rank's own chunk, the
//! reduce-scatter sends straight from `send` and keeps p/2 chunks of work.
//!
//! Steps (p = 2^s ranks, this rank x; `lo(r, b)` = r with its low log₂ b bits cleared):
//! - All-gather, b = 1, 2, …, p/2: x holds chunks [lo(x, b), +b); it sends them to
//!   x ^ b and receives [lo(x ^ b, b), +b) from it.
//! - Reduce-scatter, b = p/2, …, 1: x sends the partial sums of chunks [lo(x ^ b, b), +b)
//!   (from `send` at the first step, from the work buffer after) to x ^ b and reduces
//!   what it receives into its own [lo(x, b), +b); after b = 1 it holds chunk x.
//!
//! Why here: on four one-rank nodes sharing two cores (issue 48's nodes:4x1) a pairwise
//! exchange is what the two ranks of a core wait on together, and Bruck's three-rank
//! steps cost more: in C against MPI, 1.05-1.07x `MPI_Allgather` for Bruck's steps
//! against 1.00 for these (`scripts/mpi-floor.c`, pinned two ranks to a core,
//! 2026-11-30), and strata's 64 KiB log-step calls 94-99 µs against 100-107 with
//! Bruck's (docs/cluster.md, "nodes:4x1").
//!
//! Traffic on rank-major `nodes:n×k` (p a power of two, so k is one): the steps with
//! b < k stay inside a node, the others all cross, `intra_node = c·p·Σ_{b<k} b`,
//! `inter_node = c·p·Σ_{b≥k} b`, `max_node_egress = c·k·Σ_{b≥k} b` (tests/traffic.rs).
//! `hier`'s inter-node stage keeps Bruck's rotated form (its next stage reads the chunks
//! where they lie). The host transports run these steps through
//! [`super::log_step_host`]; both paths send the same messages.

#![forbid(unsafe_code)]

use super::log_step_math::{lo, sizes};
use super::reduction::Reduction;
use super::step_list::{BufId, Plan, Ring, Span, Step};
use crate::dtype::DataType;
use crate::error::Result;
use crate::memory::Buffer;
use crate::runtime::{CommCore, Op};

/// Recursive-doubling all-gather of `c` bytes per rank from `send` into `recv` (p·c,
/// rank major) on `comm` (p a power of two); in place when `send` is `recv[x·c..]`.
pub(super) fn all_gather(comm: &CommCore, send: &Buffer, recv: &Buffer, c: usize) -> Result<()> {
    let (p, x) = (comm.size(), comm.rank());
    if p > 1 && c > 0 {
        if let Ok(r) = comm.host_steps(|t| super::log_step_host::doubling(t, send, recv, c)) {
            return r;
        }
    }
    if send.offset_in(recv) != Some(x * c) {
        comm.ops()
            .copy(&recv.slice(x * c..(x + 1) * c)?, &send.slice(0..c)?)?;
    }
    if c == 0 {
        return Ok(());
    }
    for b in sizes(p) {
        let y = x ^ b;
        let ops = vec![
            Op::Send {
                buf: recv.slice(lo(x, b) * c..(lo(x, b) + b) * c)?,
                count: b * c,
                peer: y,
            },
            Op::Recv {
                buf: recv.slice(lo(y, b) * c..(lo(y, b) + b) * c)?,
                count: b * c,
                peer: y,
            },
        ];
        comm.run_batch(ops, DataType::U8)?;
    }
    Ok(())
}

/// Recursive-halving reduce-scatter on `comm` (p a power of two, p > 1, `count` > 0):
/// `recv` (`count` elements) = the reduction over ranks of `send[x·count..]`. `op` is
/// already partial (`Avg` sums).
pub(super) fn reduce_scatter(
    comm: &CommCore,
    send: &Buffer,
    recv: &Buffer,
    r: Reduction,
) -> Result<()> {
    let Reduction { count, dt, op } = r;
    if let Ok(r) = comm.host_steps(|t| super::log_step_host::halving(t, send, recv, r)) {
        return r;
    }
    let (p, x) = (comm.size(), comm.rank());
    let c = count * dt.size();
    // Work: this rank's half after the first step, chunks [base, base + p/2).
    let base = lo(x, p / 2);
    let work = comm.alloc_like(&send, p / 2 * c)?;
    let mut first = true;
    for b in sizes(p).rev() {
        let y = x ^ b;
        let (mine, theirs) = (lo(x, b), lo(y, b));
        let own = work.slice((mine - base) * c..(mine - base + b) * c)?;
        let give = if first {
            // The partial sums so far are the input itself.
            comm.ops()
                .copy(&own, &send.slice(mine * c..(mine + b) * c)?)?;
            send.slice(theirs * c..(theirs + b) * c)?
        } else {
            work.slice((theirs - base) * c..(theirs - base + b) * c)?
        };
        first = false;
        let step = Op::SendRecv {
            send: give,
            recv: own,
            count: b * count,
            dst: y,
            src: y,
            reduce: Some(op),
        };
        comm.run_batch(vec![step], dt)?;
    }
    comm.ops().copy(
        &recv.slice(0..c)?,
        &work.slice((x - base) * c..(x - base + 1) * c)?,
    )
}

/// The recursive-doubling all-gather's transfers as a flat plan (modeled, as every flat
/// plan): `p` ranks (a power of two), this rank `x`, `c` bytes per chunk.
pub(super) fn all_gather_plan(p: usize, x: usize, c: usize) -> Plan {
    let steps = sizes(p)
        .map(|b| {
            let y = x ^ b;
            step(
                y,
                (BufId::Recv, lo(x, b) * c),
                (BufId::Recv, lo(y, b) * c),
                b * c,
                false,
            )
        })
        .collect();
    Plan { steps }
}

/// The recursive-halving reduce-scatter's transfers as a flat plan (positions of the
/// work buffer indexed by chunk).
pub(super) fn reduce_scatter_plan(p: usize, x: usize, c: usize) -> Plan {
    let steps = sizes(p)
        .rev()
        .map(|b| {
            let y = x ^ b;
            step(
                y,
                (BufId::Work, lo(y, b) * c),
                (BufId::Work, lo(x, b) * c),
                b * c,
                true,
            )
        })
        .collect();
    Plan { steps }
}

fn step(peer: usize, send: (BufId, usize), recv: (BufId, usize), len: usize, reduce: bool) -> Step {
    Step {
        ring: Ring::Flat,
        dst: peer,
        src: peer,
        send: Span {
            buf: send.0,
            off: send.1,
            len,
        },
        recv: Span {
            buf: recv.0,
            off: recv.1,
            len,
        },
        reduce,
        deps: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_log_step_s_and_gather_every_chunk_once() {
        for p in [2usize, 4, 8, 16, 64] {
            let bs: Vec<(usize, usize)> = sizes(p).map(|b| (b, b)).collect();
            assert_eq!(bs, super::super::log_step_math::steps(p), "p={p}");
            // Every rank ends with every chunk, each received once.
            for x in 0..p {
                let mut have = vec![false; p];
                have[x] = true;
                for b in sizes(p) {
                    let y = x ^ b;
                    for (i, h) in have.iter().enumerate() {
                        // What x has before the step of size b is its run [lo(x, b), +b).
                        assert_eq!(
                            *h,
                            (lo(x, b)..lo(x, b) + b).contains(&i),
                            "p={p} x={x} b={b}"
                        );
                    }
                    for h in &mut have[lo(y, b)..lo(y, b) + b] {
                        *h = true;
                    }
                }
                assert!(have.iter().all(|h| *h), "p={p} x={x}");
            }
        }
    }
}
