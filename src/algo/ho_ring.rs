//! `ho-ring`: PaRO's hierarchical overlapping rings (seed 001, §3.3, Fig. 1), for all
//! levels the communicator spans (2: node, network; 3: package, node, network).
//!
//! Every level runs its own ring on its own communicator stream, and the rings run at
//! the same time. All-gather: the outermost (inter-node) ring forwards chunks between
//! rails; each chunk that arrives enters the next level's ring at once (a step of the
//! inner ring waits only for the arrival it forwards, via a cross-communicator
//! dependency), and so on inwards; the innermost rings write straight into the output
//! in rank order. Reduce-scatter is the mirror: the innermost rings reduce first, in the
//! order the next level out consumes their results, so chunks reduced inside the node
//! move to the inter-node ring while the next ones are still being reduced. Chunks are
//! split into `pieces` (default [`super::plan::default_chunks`], override with
//! `CommConfig::ho_ring_chunks` / `--chunks`) so the rings pipeline.
//!
//! All-reduce is the 2-D algorithm (intra reduce-scatter, inter all-reduce, intra
//! all-gather: Horovod hierarchical / 2D-torus) made of the same rings: the HO-Ring
//! reduce-scatter then the HO-Ring all-gather over the padded buffer, each piece of the
//! all-gather starting as soon as the same piece of the reduce-scatter is final.
//!
//! Traffic equals `hier`'s per link class (same stages, same bytes); what changes is
//! that the stages overlap in time (see `sim/` and the README's modeled table).

use super::plan::{self, index, pieces, BufId, Plan, Ring, Span, Step};
use super::{Algo, Algorithm};
use crate::comm::hierarchy::Hierarchy;
use crate::comm::request::{Op, Request};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::memory::Buffer;
use std::collections::HashMap;

/// The HO-Ring algorithm.
pub struct HoRing;

impl Algorithm for HoRing {
    fn algo(&self) -> Algo {
        Algo::HoRing
    }

    fn unsupported(&self, comm: &Comm, req: &Request) -> Option<String> {
        if !matches!(
            req.op,
            Op::AllGather { .. } | Op::ReduceScatter { .. } | Op::AllReduce { .. }
        ) {
            return Some(format!("ho-ring has no {}", req.op.name()));
        }
        match comm.hierarchy() {
            None => Some("ranks are not a regular mesh of the topology".into()),
            Some(h) if h.levels.len() < 2 => Some(format!(
                "communicator spans {} level(s), ho-ring needs 2 or 3",
                h.levels.len()
            )),
            Some(_) => None,
        }
    }

    fn run(&self, comm: &Comm, req: &Request) -> Result<()> {
        let h = comm
            .hierarchy()
            .ok_or_else(|| Error::Internal("ho-ring without hierarchy".into()))?;
        let (dt, r, p) = (req.dtype, comm.rank(), comm.size());
        let s = dt.size();
        let t = comm.timeout();
        let chunks = |c_elems: usize| {
            comm.config()
                .ho_ring_chunks
                .unwrap_or_else(|| plan::default_chunks(c_elems * s))
        };
        match &req.op {
            Op::AllGather { send, recv, count } => {
                let c = count * s;
                if send.offset_in(recv) != Some(r * c) {
                    recv.slice(r * c..(r + 1) * c)?
                        .write_bytes(&send.read_timeout(t)?)?;
                }
                let pl = all_gather(h, r, *count, s, chunks(*count));
                plan::execute(comm, &pl, recv, None, dt, crate::ReduceOp::Sum)
            }
            Op::ReduceScatter {
                send,
                recv,
                count,
                op,
            } => {
                let work = Buffer::from_bytes(&send.read_timeout(t)?);
                let pl = reduce_scatter(h, r, *count, s, chunks(*count));
                plan::execute(comm, &pl, recv, Some(&work), dt, *op)?;
                recv.write_bytes(&work.slice(r * count * s..(r + 1) * count * s)?.to_bytes()?)
            }
            Op::AllReduce {
                send,
                recv,
                count,
                op,
            } => {
                let q = count.div_ceil(p);
                let work = Buffer::zeroed(q * p * s);
                work.slice(0..count * s)?
                    .write_bytes(&send.read_timeout(t)?)?;
                let pl = all_reduce(h, r, q, s, chunks(q));
                plan::execute(comm, &pl, recv, Some(&work), dt, *op)?;
                recv.write_bytes(&work.slice(0..count * s)?.to_bytes()?)
            }
            _ => Err(Error::Internal(
                "ho-ring dispatched an unsupported op".into(),
            )),
        }
    }
}

fn with(x: &[usize], prefix: &[usize], i: usize, y: usize) -> Vec<usize> {
    let mut v = prefix.to_vec();
    v.push(y);
    v.extend_from_slice(&x[i + 1..]);
    v
}

/// HO-Ring all-gather plan for `rank`: `count` elements of `s` bytes per rank, output in
/// `Recv` (this rank's chunk already in place), `chunks` pieces per chunk.
/// `have` gives, per (chunk index, piece), the step that produced it if not initially present.
fn all_gather_on(
    h: &Hierarchy,
    rank: usize,
    count: usize,
    s: usize,
    chunks: usize,
    buf: BufId,
    plan: &mut Plan,
    have: &mut HashMap<(usize, usize), usize>,
) {
    let sizes = h.sizes();
    let x = h.coords(rank);
    let c = count * s;
    let pcs = pieces(count, chunks);
    let mut batches: Vec<Vec<usize>> = vec![vec![]];
    for (i, &g) in sizes.iter().enumerate() {
        let (dst, src) = ((x[i] + 1) % g, (x[i] + g - 1) % g);
        for b in &batches {
            for t in 0..g - 1 {
                let out = index(&sizes, &with(&x, b, i, (x[i] + g - t) % g));
                let inc = index(&sizes, &with(&x, b, i, (x[i] + 2 * g - t - 1) % g));
                for (q, &(po, pl)) in pcs.iter().enumerate() {
                    let deps = if t == 0 {
                        have.get(&(out, q)).copied().into_iter().collect()
                    } else {
                        vec![]
                    };
                    plan.steps.push(Step {
                        ring: Ring::Level(i),
                        dst,
                        src,
                        send: Span {
                            buf,
                            off: out * c + po * s,
                            len: pl * s,
                        },
                        recv: Span {
                            buf,
                            off: inc * c + po * s,
                            len: pl * s,
                        },
                        reduce: false,
                        deps,
                    });
                    have.insert((inc, q), plan.steps.len() - 1);
                }
            }
        }
        // Next level's batches, in arrival order: own first, then as the ring delivers.
        let xi = x[i];
        batches = batches
            .iter()
            .flat_map(|b| (0..g).map(move |t| [b.as_slice(), &[(xi + g - t) % g]].concat()))
            .collect();
    }
}

/// HO-Ring all-gather plan (see the module doc).
pub fn all_gather(h: &Hierarchy, rank: usize, count: usize, s: usize, chunks: usize) -> Plan {
    let mut plan = Plan::default();
    all_gather_on(
        h,
        rank,
        count,
        s,
        chunks,
        BufId::Recv,
        &mut plan,
        &mut HashMap::new(),
    );
    plan
}

/// HO-Ring reduce-scatter plan over `Work` (a copy of the input); returns the plan and,
/// per piece, the step that finalizes this rank's own chunk.
fn reduce_scatter_on(
    h: &Hierarchy,
    rank: usize,
    count: usize,
    s: usize,
    chunks: usize,
    plan: &mut Plan,
) -> HashMap<(usize, usize), usize> {
    let sizes = h.sizes();
    let m = sizes.len();
    let x = h.coords(rank);
    let c = count * s;
    let pcs = pieces(count, chunks);
    // Batches per level in the order the next level out consumes them.
    let mut order: Vec<Vec<Vec<usize>>> = vec![vec![vec![]]];
    for i in 0..m - 1 {
        let g = sizes[i];
        let xi = x[i];
        let next = order[i]
            .iter()
            .flat_map(|b| (0..g).map(move |t| [b.as_slice(), &[(xi + 2 * g - 1 - t) % g]].concat()))
            .collect();
        order.push(next);
    }
    // final_of[(chunk, piece)]: the step after which that position is reduced over every
    // level inside the current one.
    let mut final_of: HashMap<(usize, usize), usize> = HashMap::new();
    for i in (0..m).rev() {
        let g = sizes[i];
        let (dst, src) = ((x[i] + 1) % g, (x[i] + g - 1) % g);
        let mut next_final = HashMap::new();
        for b in &order[i] {
            for (q, &(po, pl)) in pcs.iter().enumerate() {
                for t in 0..g - 1 {
                    let out = index(&sizes, &with(&x, b, i, (x[i] + 2 * g - t - 1) % g));
                    let inc = index(&sizes, &with(&x, b, i, (x[i] + 2 * g - t - 2) % g));
                    let mut deps: Vec<usize> =
                        final_of.get(&(inc, q)).copied().into_iter().collect();
                    if t == 0 {
                        deps.extend(final_of.get(&(out, q)).copied());
                    }
                    plan.steps.push(Step {
                        ring: Ring::Level(i),
                        dst,
                        src,
                        send: Span {
                            buf: BufId::Work,
                            off: out * c + po * s,
                            len: pl * s,
                        },
                        recv: Span {
                            buf: BufId::Work,
                            off: inc * c + po * s,
                            len: pl * s,
                        },
                        reduce: true,
                        deps,
                    });
                }
                let own = index(&sizes, &with(&x, b, i, x[i]));
                next_final.insert((own, q), plan.steps.len() - 1);
            }
        }
        final_of = next_final;
    }
    final_of
}

/// HO-Ring reduce-scatter plan (see the module doc).
pub fn reduce_scatter(h: &Hierarchy, rank: usize, count: usize, s: usize, chunks: usize) -> Plan {
    let mut plan = Plan::default();
    reduce_scatter_on(h, rank, count, s, chunks, &mut plan);
    plan
}

/// Pipelined 2-D all-reduce plan over a `Work` buffer of `p·count` elements.
pub fn all_reduce(h: &Hierarchy, rank: usize, count: usize, s: usize, chunks: usize) -> Plan {
    let mut plan = Plan::default();
    let mut have = reduce_scatter_on(h, rank, count, s, chunks, &mut plan);
    all_gather_on(h, rank, count, s, chunks, BufId::Work, &mut plan, &mut have);
    plan
}
