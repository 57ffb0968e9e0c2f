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

/// Chunk positions of one rank's levels: the chunk whose level coordinates are
/// `prefix` (row-major index over the levels before `i`), `y` at level `i`, and this
/// rank's own coordinates after `i`.
struct Grid {
    sizes: Vec<usize>,
    /// Row-major stride of each level.
    stride: Vec<usize>,
    /// Row-major index of this rank's coordinates after each level.
    suffix: Vec<usize>,
    x: Vec<usize>,
}

impl Grid {
    fn new(h: &Hierarchy, rank: usize) -> Grid {
        let sizes = h.sizes();
        let x = h.coords(rank);
        let m = sizes.len();
        let stride = (0..m).map(|i| sizes[i + 1..].iter().product()).collect();
        let suffix = (0..m)
            .map(|i| index(&sizes[i + 1..], &x[i + 1..]))
            .collect();
        Grid {
            sizes,
            stride,
            suffix,
            x,
        }
    }

    fn at(&self, prefix: usize, i: usize, y: usize) -> usize {
        (prefix * self.sizes[i] + y) * self.stride[i] + self.suffix[i]
    }

    fn chunks(&self) -> usize {
        self.sizes.iter().product()
    }
}

/// No step: the position is present from the start.
const NONE: usize = usize::MAX;

/// HO-Ring all-gather plan for `rank`: `count` elements of `s` bytes per rank, output in
/// `Recv` (this rank's chunk already in place), `chunks` pieces per chunk.
/// `have[chunk · pieces + piece]` gives the step that produced that piece ([`NONE`] when
/// initially present).
fn all_gather_on(
    h: &Hierarchy,
    rank: usize,
    count: usize,
    s: usize,
    chunks: usize,
    buf: BufId,
    plan: &mut Plan,
    have: &mut Vec<usize>,
) {
    let grid = Grid::new(h, rank);
    let x = &grid.x;
    let c = count * s;
    let pcs = pieces(count, chunks);
    let np = pcs.len();
    have.resize(grid.chunks() * np, NONE);
    // Work units (batch, piece) of each level, in the order their data arrives: piece
    // outermost, so an inner ring forwards piece q of a chunk while piece q+1 is still
    // on its way (a step-major order would stall at step 0 until every piece arrived).
    // A batch is the row-major index of the coordinates of the levels outside.
    let mut units: Vec<(usize, usize)> = (0..np).map(|q| (0, q)).collect();
    for (i, &g) in grid.sizes.iter().enumerate() {
        let (dst, src) = ((x[i] + 1) % g, (x[i] + g - 1) % g);
        for &(b, q) in &units {
            let (po, pl) = pcs[q];
            for t in 0..g - 1 {
                let out = grid.at(b, i, (x[i] + g - t) % g);
                let inc = grid.at(b, i, (x[i] + 2 * g - t - 1) % g);
                let deps = match have[out * np + q] {
                    d if t == 0 && d != NONE => vec![d],
                    _ => vec![],
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
                have[inc * np + q] = plan.steps.len() - 1;
            }
        }
        // Next level's units, in arrival order: own chunk first, then as the ring delivers.
        let xi = x[i];
        units = units
            .iter()
            .flat_map(|&(b, q)| (0..g).map(move |t| (b * g + (xi + g - t) % g, q)))
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
        &mut Vec::new(),
    );
    plan
}

/// HO-Ring reduce-scatter plan over `Work` (a copy of the input); returns, per
/// `chunk · pieces + piece`, the step that finalizes it ([`NONE`] for other chunks than
/// this rank's own).
fn reduce_scatter_on(
    h: &Hierarchy,
    rank: usize,
    count: usize,
    s: usize,
    chunks: usize,
    plan: &mut Plan,
) -> Vec<usize> {
    let grid = Grid::new(h, rank);
    let x = &grid.x;
    let m = grid.sizes.len();
    let c = count * s;
    let pcs = pieces(count, chunks);
    let np = pcs.len();
    // Work units (batch, piece) per level in the order the next level out consumes
    // them, piece outermost: the outer ring takes piece q of a chunk as soon as the inner
    // rings reduced piece q of the chunks it needs, while piece q+1 is still reducing.
    let mut order: Vec<Vec<(usize, usize)>> = vec![(0..np).map(|q| (0, q)).collect()];
    for i in 0..m - 1 {
        let g = grid.sizes[i];
        let xi = x[i];
        let next = order[i]
            .iter()
            .flat_map(|&(b, q)| (0..g).map(move |t| (b * g + (xi + 2 * g - 1 - t) % g, q)))
            .collect();
        order.push(next);
    }
    // final_of[chunk · np + piece]: the step after which that position is reduced over
    // every level inside the current one (NONE: nothing inside, the input is final).
    let mut final_of: Vec<usize> = vec![NONE; grid.chunks() * np];
    for i in (0..m).rev() {
        let g = grid.sizes[i];
        let (dst, src) = ((x[i] + 1) % g, (x[i] + g - 1) % g);
        let mut next_final = vec![NONE; grid.chunks() * np];
        for &(b, q) in &order[i] {
            let (po, pl) = pcs[q];
            for t in 0..g - 1 {
                let out = grid.at(b, i, (x[i] + 2 * g - t - 1) % g);
                let inc = grid.at(b, i, (x[i] + 2 * g - t - 2) % g);
                let mut deps: Vec<usize> = Vec::new();
                if final_of[inc * np + q] != NONE {
                    deps.push(final_of[inc * np + q]);
                }
                if t == 0 && final_of[out * np + q] != NONE {
                    deps.push(final_of[out * np + q]);
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
            let own = grid.at(b, i, x[i]);
            next_final[own * np + q] = plan.steps.len() - 1;
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
