//! `ho-ring`: PaRO's hierarchical overlapping rings (PaRO §3.3, Fig. 1), for all
//! levels the communicator spans (2: node, network; 3: package, node, network).
//!
//! Every level runs its own ring on its own communicator stream, and the rings run at
//! the same time. All-gather: the outermost (inter-node) ring forwards chunks between
//! rails; each chunk that arrives enters the next level's ring at once (a step of the
//! inner ring waits only for the arrival it forwards, via a cross-communicator
//! dependency), and so on inwards; the innermost rings write straight into the output
//! in rank order. Reduce-scatter is the mirror: the innermost rings reduce first, in the
//! order the next level out consumes their results, so chunks reduced inside the node
//! move to the inter-node ring while the next ones are still being reduced. Only the
//! rank's own output chunk, which no ring sends on, is reduced outermost level first:
//! the inner rings' last step into it waits for the outer ring rather than the reverse,
//! so no inter-node transfer is left after the intra rings finish. Chunks are
//! split into `pieces` (default [`super::step_list::default_chunks`], override with
//! `CommConfig::ho_ring_chunks` / `--chunks`) so the rings pipeline.
//!
//! All-reduce is the 2-D algorithm (intra reduce-scatter, inter all-reduce, intra
//! all-gather: Horovod hierarchical / 2D-torus) made of the same rings: the HO-Ring
//! reduce-scatter then the HO-Ring all-gather, in `recv` itself when p divides the count
//! (else in a padded scratch copy), each piece of the all-gather starting as soon as the
//! same piece of the reduce-scatter is final.
//!
//! Traffic equals `hier`'s per link class (same stages, same bytes); what changes is
//! that the stages overlap in time (see `sim/` and the modeled table of docs/simulator.md).

use super::plan::RingPos;
use super::shape::{Algorithm, Shape};
use super::step_list::{self, index, pieces, BufId, Plan, Ring, Step};
use super::Algo;
use crate::error::{Error, Result};
use crate::runtime::{CommCore, Op, Request};
use crate::topology::Hierarchy;

/// The HO-Ring algorithm.
pub struct HoRing;

impl Algorithm for HoRing {
    fn algo(&self) -> Algo {
        Algo::HoRing
    }

    fn unsupported(&self, s: &Shape) -> Option<String> {
        super::hierarchical::levels_unsupported(s, "ho-ring")
    }

    fn run(&self, comm: &CommCore, req: &Request) -> Result<()> {
        let h = comm
            .hierarchy()
            .ok_or_else(|| Error::Internal("ho-ring without hierarchy".into()))?;
        let (dt, r, p) = (req.dtype, comm.rank(), comm.size());
        let s = dt.size();
        let ops = comm.ops();
        let chunks = |c_elems: usize| {
            comm.config()
                .ho_ring_chunks
                .unwrap_or_else(|| step_list::default_chunks(c_elems * s))
        };
        match &req.op {
            Op::AllGather { send, recv, count } => {
                let c = count * s;
                if send.offset_in(recv) != Some(r * c) {
                    ops.copy(&recv.slice(r * c..(r + 1) * c)?, &send.slice(0..c)?)?;
                }
                let pl = all_gather(h, r, *count, s, chunks(*count));
                step_list::execute(comm, &pl, recv, None, dt, crate::ReduceOp::Sum)
            }
            Op::ReduceScatter {
                send,
                recv,
                count,
                op,
            } => {
                let n = p * count * s;
                let work = comm.alloc_like(&send, n)?;
                ops.copy(&work, &send.slice(0..n)?)?;
                let pl = reduce_scatter(h, r, *count, s, chunks(*count));
                step_list::execute(comm, &pl, recv, Some(&work), dt, *op)?;
                ops.copy(
                    &recv.slice(0..count * s)?,
                    &work.slice(r * count * s..(r + 1) * count * s)?,
                )
            }
            Op::AllReduce {
                send,
                recv,
                count,
                op,
            } => {
                let q = count.div_ceil(p);
                let pl = all_reduce(h, r, q, s, chunks(q));
                if q * p == *count {
                    // An exact split: `recv` is the work buffer (no scratch, no copy out).
                    let n = count * s;
                    if send.offset_in(recv) != Some(0) {
                        ops.copy(&recv.slice(0..n)?, &send.slice(0..n)?)?;
                    }
                    return step_list::execute(comm, &pl, recv, Some(recv), dt, *op);
                }
                let work = comm.alloc_like(&send, q * p * s)?;
                ops.copy(&work.slice(0..count * s)?, &send.slice(0..count * s)?)?;
                step_list::execute(comm, &pl, recv, Some(&work), dt, *op)?;
                ops.copy(&recv.slice(0..count * s)?, &work.slice(0..count * s)?)
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
        let ring = RingPos::new(Ring::Level(i), x[i], g);
        for &(b, q) in &units {
            let (po, pl) = pcs[q];
            for t in 0..g - 1 {
                let out = grid.at(b, i, (x[i] + g - t) % g);
                let inc = grid.at(b, i, (x[i] + 2 * g - t - 1) % g);
                let deps = match have[out * np + q] {
                    d if t == 0 && d != NONE => vec![d],
                    _ => vec![],
                };
                let (so, ro) = (out * c + po * s, inc * c + po * s);
                plan.steps.push(ring.step(buf, so, ro, pl * s, false, deps));
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

/// How many pieces later than the outer level's consumption order each level's
/// own-prefix units (the ones that finish this rank's output chunk, see
/// [`reduce_scatter_on`]) run on their stream.
const LAG: usize = 1;

/// A step with its deps as (level, index on that level's stream).
type LevelStep = (Step, Vec<(usize, usize)>);

/// HO-Ring reduce-scatter plan over `Work` (a copy of the input); returns, per
/// `chunk · pieces + piece`, the step that finalizes it ([`NONE`] for other chunks than
/// this rank's own).
///
/// Every level's ring reduces a position received at step `t` before it is sent at step
/// `t + 1`, so each such position must be final at the inner levels before it is
/// received (the receive reduces into it). The one exception is this rank's own output
/// chunk `F`, which no ring ever sends: its additions commute, so the order is reversed
/// for it. The outermost ring reduces into `F` first, then each inner level's last
/// step of the own-prefix batch, outer to inner; the innermost one finalizes `F`. The
/// outer ring's last step then waits only for the chunk it sends, and the inner rings'
/// own-prefix batches (which now wait for the outer ring) run [`LAG`] pieces late on
/// their streams, overlapping the outer transfer instead of leaving it as a tail.
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
    let sz = &grid.sizes;
    let m = sz.len();
    let c = count * s;
    let pcs = pieces(count, chunks);
    let np = pcs.len();
    // The batch (row-major index of the outer levels' coordinates) of each level that
    // holds this rank's own output chunk.
    let own_b: Vec<usize> = (0..m).map(|j| index(&sz[..j], &x[..j])).collect();
    // Work units (batch, piece) per level in the order the next level out consumes
    // them, piece outermost: the outer ring takes piece q of a chunk as soon as the inner
    // rings reduced piece q of the chunks it needs, while piece q+1 is still reducing.
    // The own-prefix units move LAG pieces later (they wait for the outer ring).
    let mut order: Vec<Vec<(usize, usize)>> = vec![(0..np).map(|q| (0, q)).collect()];
    for j in 1..m {
        let g = sz[j - 1];
        let xo = x[j - 1];
        let consumed: Vec<(usize, usize)> = order[j - 1]
            .iter()
            .flat_map(|&(b, q)| (0..g).map(move |t| (b * g + (xo + 2 * g - 1 - t) % g, q)))
            .collect();
        let (chained, rest): (Vec<_>, Vec<_>) =
            consumed.into_iter().partition(|&(b, _)| b == own_b[j]);
        // After the last unit of piece q + LAG among the others (or at the end).
        let mut last_of = vec![NONE; np];
        for (k, &(_, q)) in rest.iter().enumerate() {
            last_of[q] = k;
        }
        let mut after: Vec<Vec<(usize, usize)>> = vec![Vec::new(); rest.len() + 1];
        for &(b, q) in &chained {
            let k = match last_of.get(q + LAG) {
                Some(&k) if k != NONE => k + 1,
                _ => rest.len(),
            };
            after[k].push((b, q));
        }
        let n = rest.len();
        let mut units = Vec::with_capacity(n + chained.len());
        for (k, u) in rest.into_iter().enumerate() {
            units.append(&mut after[k]);
            units.push(u);
        }
        units.append(&mut after[n]);
        order.push(units);
    }
    // pos[j][b · np + q]: index of unit (b, q) on level j's stream.
    let pos: Vec<Vec<usize>> = (0..m)
        .map(|j| {
            let mut v = vec![NONE; sz[..j].iter().product::<usize>() * np];
            for (k, &(b, q)) in order[j].iter().enumerate() {
                v[b * np + q] = k;
            }
            v
        })
        .collect();
    // Level j's step t of unit (b, q), as (level, index on that level's stream).
    let step_of =
        |j: usize, b: usize, q: usize, t: usize| (j, pos[j][b * np + q] * (sz[j] - 1) + t);
    // The step after which position `p` of level j (piece q) is reduced over every level
    // inside j: the last step of the next level in, or, for the own chunk (reversed
    // order), the innermost such step.
    let fin = |mut j: usize, p: usize, q: usize| loop {
        let b = p / grid.stride[j];
        if b == own_b[j + 1] && j + 2 < m {
            j += 1;
            continue;
        }
        break step_of(j + 1, b, q, sz[j + 1] - 2);
    };
    // Each level's steps with deps as (level, index).
    let mut levels: Vec<Vec<LevelStep>> = Vec::with_capacity(m);
    for j in 0..m {
        let g = sz[j];
        let ring = RingPos::new(Ring::Level(j), x[j], g);
        let mut steps = Vec::with_capacity(order[j].len() * (g - 1));
        for &(b, q) in &order[j] {
            let (po, pl) = pcs[q];
            let chained = b == own_b[j];
            for t in 0..g - 1 {
                let out = grid.at(b, j, (x[j] + 2 * g - t - 1) % g);
                let inc = grid.at(b, j, (x[j] + 2 * g - t - 2) % g);
                let own = chained && t == g - 2;
                let mut deps = Vec::new();
                if j + 1 < m {
                    if !own {
                        deps.push(fin(j, inc, q));
                    }
                    if t == 0 {
                        deps.push(fin(j, out, q));
                    }
                }
                if own && j > 0 {
                    deps.push(step_of(j - 1, own_b[j - 1], q, sz[j - 1] - 2));
                }
                let (so, ro) = (out * c + po * s, inc * c + po * s);
                let step = ring.step(BufId::Work, so, ro, pl * s, true, Vec::new());
                steps.push((step, deps));
            }
        }
        levels.push(steps);
    }
    // Merge the levels' streams into one plan order that puts every dep first (the same
    // order on every rank: the plans have the same shape).
    let base = plan.steps.len();
    let mut at: Vec<Vec<usize>> = levels.iter().map(|l| vec![NONE; l.len()]).collect();
    let mut next = vec![0; m];
    loop {
        let mut progress = false;
        for j in (0..m).rev() {
            while next[j] < levels[j].len()
                && levels[j][next[j]].1.iter().all(|&(l, k)| at[l][k] != NONE)
            {
                let (mut step, deps) = levels[j][next[j]].clone();
                step.deps = deps.iter().map(|&(l, k)| at[l][k]).collect();
                at[j][next[j]] = plan.steps.len();
                plan.steps.push(step);
                next[j] += 1;
                progress = true;
            }
        }
        if !progress {
            break;
        }
    }
    assert!(
        plan.steps.len() - base == levels.iter().map(Vec::len).sum::<usize>(),
        "ho-ring reduce-scatter plan has a dependency cycle"
    );
    let own = grid.at(0, 0, x[0]);
    let mut final_of = vec![NONE; grid.chunks() * np];
    for q in 0..np {
        let (l, k) = fin(0, own, q);
        final_of[own * np + q] = at[l][k];
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
