//! The schedule: the same on every rank, its draws depend only on shared facts.

use super::setup::{
    Body, Chain, ChainKind, Grid, Item, Slot, Spec, Stats, What, MAX_COUNT, MAX_ELEMS,
};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use strata::check::Kind;
use strata::kernels::QuantSpec;
use strata::{Algo, DataType, ReduceOp};

/// Every element type.
pub(crate) const DTYPES: [DataType; 10] = DataType::ALL;
pub(crate) const REDOPS: [ReduceOp; 4] =
    [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

/// A count: 0, small (odd half the time), medium or large, at most `max`.
pub(crate) fn draw_count(rng: &mut ChaCha8Rng, max: usize) -> usize {
    let c = match rng.random_range(0..100) {
        0..=7 => 0,
        8..=49 => rng.random_range(1..=64),
        50..=84 => rng.random_range(65..=8192),
        _ => rng.random_range(8193..=MAX_COUNT),
    };
    let c = if c > 1 && rng.random_bool(0.5) {
        c | 1
    } else {
        c
    };
    c.min(max)
}

/// The reduction and dtype drawn, made exact for the reference: integer sums and means
/// of more than 40 ranks can leave i8 / u8, so they become i32.
pub(crate) fn draw_types(rng: &mut ChaCha8Rng, p: usize) -> (DataType, ReduceOp) {
    let dt = DTYPES[rng.random_range(0..DTYPES.len())];
    let op = REDOPS[rng.random_range(0..REDOPS.len())];
    let dt = if p > 40 && matches!(dt, DataType::I8 | DataType::U8) {
        DataType::I32
    } else {
        dt
    };
    (dt, op)
}

/// The algorithms valid for `kind` on a communicator of `levels` levels (exact ones).
pub(crate) fn exact_algos(kind: Kind, levels: usize) -> Vec<Algo> {
    if levels == 0 {
        return vec![Algo::Ring];
    }
    let mut v = vec![Algo::Ring, Algo::Auto];
    if levels >= 2
        && matches!(
            kind,
            Kind::AllGather | Kind::ReduceScatter | Kind::AllReduce
        )
    {
        v.extend([Algo::Hier, Algo::HoRing]);
    }
    v
}

pub(crate) fn pick<T: Copy>(rng: &mut ChaCha8Rng, v: &[T]) -> T {
    v[rng.random_range(0..v.len())]
}

pub(crate) fn draw_single(
    rng: &mut ChaCha8Rng,
    slots: &[Slot],
    earlier: &[usize],
    grouped: bool,
    subs: bool,
) -> Spec {
    let allowed: Vec<usize> = (0..slots.len())
        .filter(|&i| subs || !slots[i].cached())
        .collect();
    // The world a quarter of the time: its hierarchical algorithms run there.
    let slot = if rng.random_bool(0.25) {
        0
    } else {
        pick(rng, &allowed)
    };
    let (p, levels) = (slots[slot].size, slots[slot].levels);
    let (mut dtype, mut redop) = draw_types(rng, p);
    let kinds = [
        Kind::AllGather,
        Kind::ReduceScatter,
        Kind::AllReduce,
        Kind::AllToAll,
        Kind::Broadcast {
            root: rng.random_range(0..p),
        },
    ];
    let what = match rng.random_range(0..100) {
        0..=59 => What::Plain(pick(rng, &kinds)),
        60..=71 => What::Coalesced(pick(rng, &[Kind::AllGather, Kind::ReduceScatter])),
        72..=87 => What::Quant(pick(rng, &[Kind::AllGather, Kind::ReduceScatter])),
        _ if p >= 2 => What::Shift(rng.random_range(1..p)),
        _ => What::Plain(Kind::AllReduce),
    };
    let (mut algo, mut quant, mut in_place, mut counts) = (Algo::Ring, None, false, Vec::new());
    let spread = |k: Kind| match k {
        Kind::AllReduce | Kind::Broadcast { .. } => 1,
        _ => p.max(1),
    };
    let count;
    match what {
        What::Plain(k) => {
            algo = pick(rng, &exact_algos(k, levels));
            in_place = k != Kind::AllToAll && rng.random_bool(0.4);
            count = draw_count(rng, MAX_ELEMS / spread(k));
        }
        What::Coalesced(k) => {
            algo = pick(rng, &exact_algos(k, levels));
            let n = rng.random_range(1..=5);
            let max = MAX_ELEMS / spread(k) / n;
            counts = (0..n).map(|_| draw_count(rng, max)).collect();
            count = counts.iter().sum();
        }
        What::Quant(k) => {
            dtype = pick(rng, &[DataType::F32, DataType::F16, DataType::BF16]);
            if k == Kind::ReduceScatter {
                redop = pick(rng, &[ReduceOp::Sum, ReduceOp::Avg]);
                algo = if levels >= 1 && rng.random_bool(0.6) {
                    Algo::Qgz
                } else {
                    Algo::Qgz1
                };
            } else {
                algo = Algo::Qwz;
            }
            let bits = pick(rng, &[4, 8]);
            let block = pick(rng, &[2, 32, 64, 256, 1024]);
            quant = QuantSpec::new(bits, block).ok();
            count = draw_count(rng, MAX_ELEMS / spread(k));
        }
        What::Shift(_) => count = draw_count(rng, MAX_ELEMS),
    }
    let dep = if !earlier.is_empty() && rng.random_bool(0.3) {
        Some(pick(rng, earlier))
    } else {
        None
    };
    Spec {
        slot,
        what,
        algo,
        dtype,
        redop,
        count,
        counts,
        in_place,
        quant,
        dep,
        grouped,
    }
}

pub(crate) fn draw_chain(
    rng: &mut ChaCha8Rng,
    slots: &[Slot],
    grids: &[Grid],
    allowed: &[usize],
) -> Chain {
    let grid = pick(rng, allowed);
    let g = &grids[grid];
    let p = slots[g.base].size;
    let kind = match rng.random_range(0..5) {
        0 => ChainKind::Ar2 {
            y_first: rng.random_bool(0.5),
        },
        1 => ChainKind::Rs2,
        2 => ChainKind::RsAr,
        3 => ChainKind::Ag2,
        _ => ChainKind::Ar4,
    };
    let (dtype, mut redop) = draw_types(rng, p);
    // Means of means round twice: exact for floats to the reference's few ulps, not for
    // integers (rounded to a whole number at each step).
    if redop == ReduceOp::Avg && !dtype.is_float() {
        redop = ReduceOp::Sum;
    }
    let max = match kind {
        ChainKind::Ar2 { .. } => MAX_ELEMS,
        _ => MAX_ELEMS / p,
    };
    let count = draw_count(rng, max);
    let in_place = rng.random_bool(0.5);
    let algos = steps(kind, g)
        .iter()
        .map(|&(slot, k, _)| pick(rng, &exact_algos(k, slots[slot].levels)))
        .collect();
    Chain {
        grid,
        kind,
        dtype,
        redop,
        count,
        in_place,
        algos,
    }
}

/// A chain's steps: (slot, kind, count multiplier of the chain's count).
pub(crate) fn steps(kind: ChainKind, g: &Grid) -> Vec<(usize, Kind, usize)> {
    let (x, y, k) = (g.x, g.y, g.k);
    match kind {
        ChainKind::Ar2 { y_first: false } => vec![(x, Kind::AllReduce, 1), (y, Kind::AllReduce, 1)],
        ChainKind::Ar2 { y_first: true } => vec![(y, Kind::AllReduce, 1), (x, Kind::AllReduce, 1)],
        ChainKind::Rs2 => vec![(y, Kind::ReduceScatter, k), (x, Kind::ReduceScatter, 1)],
        ChainKind::RsAr => vec![(y, Kind::ReduceScatter, k), (x, Kind::AllReduce, k)],
        ChainKind::Ag2 => vec![(x, Kind::AllGather, 1), (y, Kind::AllGather, k)],
        ChainKind::Ar4 => vec![
            (y, Kind::ReduceScatter, k),
            (x, Kind::ReduceScatter, 1),
            (x, Kind::AllGather, 1),
            (y, Kind::AllGather, k),
        ],
    }
}

/// The nccl-tests `size` of one call: bytes of its larger buffer on one rank.
pub(crate) fn size_of(kind: Kind, count: usize, p: usize, dt: DataType) -> u64 {
    let (s, r) = kind.sizes(count, p);
    (s.max(r) * dt.size()) as u64
}

pub(crate) fn draw_round(
    rng: &mut ChaCha8Rng,
    slots: &[Slot],
    grids: &[Grid],
    seed: u64,
    next: &mut u64,
    stats: &mut Stats,
) -> Vec<Item> {
    let n = rng.random_range(1..=6);
    let grouped = rng.random_bool(0.25);
    if grouped {
        stats.groups += 1;
    }
    // Half the rounds use the world's level, node and rail communicators (the user's
    // own: the world's hierarchical algorithms run their steps on private ones).
    let subs = rng.random_bool(0.5);
    let grid_ok: Vec<usize> = (0..grids.len())
        .filter(|&i| subs || !(slots[grids[i].x].cached() || slots[grids[i].y].cached()))
        .collect();
    let mut items: Vec<Item> = Vec::new();
    // Items a single may depend on: submitted before the group (none when grouped).
    let mut earlier: Vec<usize> = Vec::new();
    for _ in 0..n {
        let body = if !grid_ok.is_empty() && rng.random_bool(0.3) {
            Body::Chain(draw_chain(rng, slots, grids, &grid_ok))
        } else {
            Body::One(draw_single(rng, slots, &earlier, grouped, subs))
        };
        let index = *next;
        let item_seed = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        match &body {
            Body::One(s) => {
                let p = slots[s.slot].size;
                let (name, bytes) = match s.what {
                    What::Plain(k) | What::Quant(k) => {
                        (k.name().to_string(), size_of(k, s.count, p, s.dtype))
                    }
                    What::Coalesced(k) => (
                        format!("{}-coalesced", k.name()),
                        s.counts.iter().map(|&c| size_of(k, c, p, s.dtype)).sum(),
                    ),
                    What::Shift(_) => ("send-recv".into(), (s.count * s.dtype.size()) as u64),
                };
                stats.count(&name, s.algo, slots[s.slot].name, s.dtype, bytes);
                stats.in_place += u64::from(s.in_place);
                stats.deps += u64::from(s.dep.is_some());
                stats.zero += u64::from(s.count == 0);
                *next += 1;
            }
            Body::Chain(c) => {
                let g = &grids[c.grid];
                for (i, (slot, k, mul)) in steps(c.kind, g).into_iter().enumerate() {
                    let p = slots[slot].size;
                    let b = size_of(k, c.count * mul, p, c.dtype);
                    stats.count(k.name(), c.algos[i], slots[slot].name, c.dtype, b);
                    stats.in_place += u64::from(c.in_place);
                    stats.deps += u64::from(i > 0);
                    *next += 1;
                }
                stats.zero += u64::from(c.count == 0);
                *stats.chains.entry(c.kind.name().into()).or_default() += 1;
            }
        }
        if !grouped {
            earlier.push(items.len());
        }
        items.push(Item {
            index,
            seed: item_seed,
            body,
        });
    }
    items
}
