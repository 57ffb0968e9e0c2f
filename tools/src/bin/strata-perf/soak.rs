//! `--soak SECS`: a time-bounded random mix of checked collectives.
//!
//! Every rank derives the same schedule from `--seed` (ChaCha8, so the schedule is the
//! same on every machine): rounds of 1..=6 items, each either ONE collective on one of
//! the soak's communicators (world, its level, node and rail communicators, odd/even
//! ranks, pairs, the world in reverse order, a random subset, a split of a split) with a
//! random op, algorithm valid for that communicator and op, dtype, reduction, count (0,
//! odd, up to 256K elements), in place or not, sometimes `after` an earlier item on
//! another communicator, the singles of a round sometimes in one group; or a CHAIN: a
//! collective on one communicator feeding the next on another while both are in flight
//! (`Request::after`), over a grid of two orthogonal sub-communicators X (blocks of k
//! consecutive ranks) and Y (every k-th rank), so the composition is a known collective
//! of the base communicator: all-reduce on X then Y, reduce-scatter on Y then X,
//! all-gather on X then Y, reduce-scatter on Y then all-reduce on X, and the 2-D
//! all-reduce (reduce-scatter Y, X, all-gather X, Y), in place on one buffer or not.
//! The round's handles are waited in a random order and every result is compared with
//! [`strata::check`]'s references (`Kind::expected`, exact to a few ulps;
//! [`strata::check::check_quant`]'s bound for `qgz`, `qgz-1hop`, `qwz`).
//!
//! Inputs are `check::fill(dtype, rank, .., seed)` with a seed per item from
//! (`--seed`, op index). After every round the ranks all-reduce (world, ring) their
//! "time is up" flags and mismatch counts, so all stop after the same round, whatever
//! their clocks say, and at the first round with a mismatch. Each mismatch is printed
//! with the seed and its op index; the run exits 1.

use crate::cli::Cli;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use strata::check::{self, Kind};
use strata::kernels::QuantSpec;
use strata::{
    group_end, group_start, Algo, Buffer, Comm, CommConfig, DataType, Error, Op, ReduceOp, Request,
    Result, Topology, Work,
};

/// Largest per-call count.
const MAX_COUNT: usize = 256 * 1024;
/// Largest buffer of one call on one rank, in elements.
const MAX_ELEMS: usize = 1 << 20;
/// Seconds between progress lines.
const PROGRESS: Duration = Duration::from_secs(10);

/// One communicator of the soak: the same list, in the same order, on every rank.
struct Slot {
    name: &'static str,
    /// None where this rank is not a member.
    comm: Option<Comm>,
    size: usize,
    /// Levels of its hierarchy (0: not a regular mesh of the topology).
    levels: usize,
}

impl Slot {
    /// One of the world's cached sub-communicators, which the world's hierarchical and
    /// quantized algorithms also run their steps on.
    fn cached(&self) -> bool {
        self.name.starts_with("level") || matches!(self.name, "node" | "rail")
    }
}

/// Two orthogonal sub-communicators of a base: X = blocks of `k` consecutive base ranks,
/// Y = every k-th base rank (X-rank = base rank % k, Y-rank = base rank / k).
struct Grid {
    base: usize,
    x: usize,
    y: usize,
    k: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum What {
    Plain(Kind),
    Coalesced(Kind),
    Quant(Kind),
    /// Grouped send/recv: every rank sends to rank + d and receives from rank - d.
    Shift(usize),
}

#[derive(Debug, Clone)]
struct Spec {
    slot: usize,
    what: What,
    algo: Algo,
    dtype: DataType,
    redop: ReduceOp,
    count: usize,
    counts: Vec<usize>,
    in_place: bool,
    quant: Option<QuantSpec>,
    /// Earlier item of the round (outside the group) this one waits for.
    dep: Option<usize>,
    grouped: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ChainKind {
    /// All-reduce on X then Y (or Y then X).
    Ar2 { y_first: bool },
    /// Reduce-scatter on Y (k·c) then X (c): the base's reduce-scatter.
    Rs2,
    /// Reduce-scatter on Y (k·c) then all-reduce on X (k·c).
    RsAr,
    /// All-gather on X (c) then Y (k·c): the base's all-gather.
    Ag2,
    /// Reduce-scatter Y, X, all-gather X, Y: the base's all-reduce of p·c elements.
    Ar4,
}

impl ChainKind {
    fn name(self) -> &'static str {
        match self {
            ChainKind::Ar2 { .. } => "ar-ar",
            ChainKind::Rs2 => "rs-rs",
            ChainKind::RsAr => "rs-ar",
            ChainKind::Ag2 => "ag-ag",
            ChainKind::Ar4 => "rs-rs-ag-ag",
        }
    }
}

#[derive(Debug, Clone)]
struct Chain {
    grid: usize,
    kind: ChainKind,
    dtype: DataType,
    redop: ReduceOp,
    count: usize,
    in_place: bool,
    algos: Vec<Algo>,
}

#[derive(Debug, Clone)]
enum Body {
    One(Spec),
    Chain(Chain),
}

#[derive(Debug, Clone)]
struct Item {
    /// Op index of its first collective.
    index: u64,
    seed: u64,
    body: Body,
}

/// Counters of the schedule (every item, whether or not this rank is in it).
#[derive(Default)]
struct Stats {
    ops: u64,
    bytes: u64,
    rounds: u64,
    by_op: BTreeMap<String, u64>,
    by_algo: BTreeMap<String, u64>,
    by_comm: BTreeMap<String, u64>,
    by_dtype: BTreeMap<String, u64>,
    chains: BTreeMap<String, u64>,
    groups: u64,
    in_place: u64,
    deps: u64,
    zero: u64,
}

impl Stats {
    fn count(&mut self, op: &str, algo: Algo, comm: &str, dtype: DataType, bytes: u64) {
        self.ops += 1;
        self.bytes += bytes;
        *self.by_op.entry(op.into()).or_default() += 1;
        *self.by_algo.entry(algo.name().into()).or_default() += 1;
        *self.by_comm.entry(comm.into()).or_default() += 1;
        *self.by_dtype.entry(dtype.name().into()).or_default() += 1;
    }
}

fn line(m: &BTreeMap<String, u64>) -> String {
    let mut s = String::new();
    for (k, v) in m {
        let _ = write!(s, " {k}={v}");
    }
    s
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// A waited all-reduce of small integers over `comm` (ring).
fn agree(comm: &Comm, v: &[i32], op: ReduceOp) -> Result<Vec<i32>> {
    let b = Buffer::from_slice(v);
    let req = Request::new(
        Op::AllReduce {
            send: b.clone(),
            recv: b.clone(),
            count: v.len(),
            op,
        },
        DataType::I32,
    )
    .with_algo(Algo::Ring);
    comm.submit(req)?.wait()?;
    b.to_vec()
}

/// The soak's communicators and grids (collective over the world, same order everywhere).
fn setup(w: &Comm, rng: &mut ChaCha8Rng) -> Result<(Vec<Slot>, Vec<Grid>)> {
    let (p, r) = (w.size(), w.rank());
    let mut comms: Vec<(&'static str, Option<Comm>)> = vec![("world", Some(w.clone()))];
    let levels = w.hierarchy().map_or(0, |h| h.levels.len());
    const LEVEL: [&str; 4] = ["level0", "level1", "level2", "level3"];
    for (i, name) in LEVEL.iter().enumerate().take(levels) {
        comms.push((name, Some(w.level_comm(i)?)));
    }
    let (mut node, mut rail) = (None, None);
    if w.hierarchy().is_some() {
        node = Some(comms.len());
        comms.push(("node", Some(w.node_comm()?)));
        rail = Some(comms.len());
        comms.push(("rail", Some(w.rail_comm()?)));
    }
    comms.push(("parity", w.split(Some((r % 2) as u32), r as i32)?));
    let grid2 = p >= 4 && p % 2 == 0;
    if grid2 {
        comms.push(("pairs", w.split(Some((r / 2) as u32), r as i32)?));
    }
    let rev = w
        .split(Some(0), -(r as i32))?
        .ok_or_else(|| Error::Internal("reversed world missing".into()))?;
    let rev_slot = comms.len();
    comms.push(("reversed", Some(rev.clone())));
    if grid2 {
        let rr = rev.rank();
        comms.push(("rev-pairs", rev.split(Some((rr / 2) as u32), rr as i32)?));
        comms.push(("rev-parity", rev.split(Some((rr % 2) as u32), rr as i32)?));
    }
    if p >= 3 {
        let n = rng.random_range(2..=p);
        let mut perm: Vec<usize> = (0..p).collect();
        perm.shuffle(rng);
        let pos = perm[..n].iter().position(|&x| x == r);
        comms.push(("subset", w.split(pos.map(|_| 0), pos.unwrap_or(0) as i32)?));
    }
    if let Some(n) = node {
        let nc = comms[n]
            .1
            .clone()
            .ok_or_else(|| Error::Internal("node".into()))?;
        let nr = nc.rank();
        // Only on even nodes: parity halves of an odd node differ in size, and every
        // slot needs one size on all its members.
        if nc.size() % 2 == 0 {
            comms.push(("node-parity", nc.split(Some((nr % 2) as u32), nr as i32)?));
        }
    }
    let mut grids = Vec::new();
    if let (Some(n), Some(rl)) = (node, rail) {
        grids.push(Grid {
            base: 0,
            x: n,
            y: rl,
            k: comms[n].1.as_ref().map_or(0, |c| c.size()),
        });
    }
    if grid2 {
        let at = |name: &str| comms.iter().position(|c| c.0 == name).unwrap_or(0);
        grids.push(Grid {
            base: 0,
            x: at("pairs"),
            y: at("parity"),
            k: 2,
        });
        grids.push(Grid {
            base: rev_slot,
            x: at("rev-pairs"),
            y: at("rev-parity"),
            k: 2,
        });
    }
    // Agree on every slot's size and levels (non-members know neither) and on which
    // grids really are grids on every rank.
    let mut mine = Vec::new();
    for (_, c) in &comms {
        match c {
            Some(c) => {
                mine.push(c.size() as i32);
                mine.push(c.hierarchy().map_or(0, |h| h.levels.len()) as i32);
            }
            None => mine.extend([0, 0]),
        }
    }
    for g in &grids {
        mine.push(i32::from(!grid_ok(&comms, g)));
    }
    let all = agree(w, &mine, ReduceOp::Max)?;
    let slots: Vec<Slot> = comms
        .into_iter()
        .enumerate()
        .map(|(i, (name, comm))| Slot {
            name,
            comm,
            size: all[2 * i] as usize,
            levels: all[2 * i + 1] as usize,
        })
        .collect();
    let n = slots.len();
    let grids = grids
        .into_iter()
        .enumerate()
        .filter(|(i, _)| all[2 * n + i] == 0)
        .map(|(_, g)| g)
        .collect();
    Ok((slots, grids))
}

/// True when the grid's X and Y are the blocks and strides of its base on this rank.
fn grid_ok(comms: &[(&'static str, Option<Comm>)], g: &Grid) -> bool {
    let (Some(c), Some(x), Some(y)) = (&comms[g.base].1, &comms[g.x].1, &comms[g.y].1) else {
        return false;
    };
    let (p, k) = (c.size(), g.k);
    if k < 2 || p % k != 0 || p / k < 2 {
        return false;
    }
    let (a, b) = (c.rank() % k, c.rank() / k);
    let xs: Vec<usize> = (0..k).map(|j| c.world_rank(b * k + j)).collect();
    let ys: Vec<usize> = (0..p / k).map(|j| c.world_rank(a + k * j)).collect();
    x.members() == xs.as_slice() && y.members() == ys.as_slice()
}

// ---- the schedule (the same on every rank: draws depend only on shared facts) ----

/// Every element type.
const DTYPES: [DataType; 10] = DataType::ALL;
const REDOPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

/// A count: 0, small (odd half the time), medium or large, at most `max`.
fn draw_count(rng: &mut ChaCha8Rng, max: usize) -> usize {
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
fn draw_types(rng: &mut ChaCha8Rng, p: usize) -> (DataType, ReduceOp) {
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
fn exact_algos(kind: Kind, levels: usize) -> Vec<Algo> {
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

fn pick<T: Copy>(rng: &mut ChaCha8Rng, v: &[T]) -> T {
    v[rng.random_range(0..v.len())]
}

fn draw_single(
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

fn draw_chain(rng: &mut ChaCha8Rng, slots: &[Slot], grids: &[Grid], allowed: &[usize]) -> Chain {
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
fn steps(kind: ChainKind, g: &Grid) -> Vec<(usize, Kind, usize)> {
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
fn size_of(kind: Kind, count: usize, p: usize, dt: DataType) -> u64 {
    let (s, r) = kind.sizes(count, p);
    (s.max(r) * dt.size()) as u64
}

fn draw_round(
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

// ---- running one round on one rank ----

/// A submitted item: its handles and how to check it once they completed.
struct Pending {
    item: usize,
    works: Vec<Work>,
    verify: Box<dyn FnOnce() -> Result<usize>>,
}

fn describe(item: &Item, slots: &[Slot], grids: &[Grid]) -> String {
    match &item.body {
        Body::One(s) => {
            let what = match s.what {
                What::Plain(Kind::Broadcast { root }) => format!("broadcast root {root}"),
                What::Plain(k) => k.name().to_string(),
                What::Coalesced(k) => format!("{}-coalesced {:?}", k.name(), s.counts),
                What::Quant(k) => format!(
                    "{} {:?}",
                    k.name(),
                    s.quant.map(|q| (q.bits, q.block)).unwrap_or_default()
                ),
                What::Shift(d) => format!("send/recv shift {d}"),
            };
            format!(
                "{what} {} {} {} count {}{}{} on {} ({} ranks)",
                s.algo,
                s.dtype,
                s.redop.name(),
                s.count,
                if s.in_place { " in place" } else { "" },
                if s.grouped { " grouped" } else { "" },
                slots[s.slot].name,
                slots[s.slot].size
            )
        }
        Body::Chain(c) => {
            let g = &grids[c.grid];
            let st: Vec<String> = steps(c.kind, g)
                .iter()
                .zip(&c.algos)
                .map(|(&(slot, k, mul), a)| {
                    format!(
                        "{} {a} x{} on {}",
                        k.name(),
                        c.count * mul,
                        slots[slot].name
                    )
                })
                .collect();
            format!(
                "chain {} over {} (k {}) {} {} count {}{}: {}",
                c.kind.name(),
                slots[g.base].name,
                g.k,
                c.dtype,
                c.redop.name(),
                c.count,
                if c.in_place { " in place" } else { "" },
                st.join(" -> ")
            )
        }
    }
}

fn submit(comm: &Comm, req: Request) -> Result<Work> {
    comm.submit(req)
}

fn a5(comm: &Comm, elems: usize, dt: DataType) -> Result<Buffer> {
    comm.native_from(&vec![0xA5; elems * dt.size()])
}

/// Submit a single collective (this rank is a member of `comm`).
fn run_single(
    comm: &Comm,
    s: &Spec,
    seed: u64,
    deps: Vec<Work>,
) -> Result<(Vec<Work>, Box<dyn FnOnce() -> Result<usize>>)> {
    let (p, r) = (comm.size(), comm.rank());
    let (dt, redop, count) = (s.dtype, s.redop, s.count);
    let sz = dt.size();
    match s.what {
        What::Plain(kind) | What::Quant(kind) => {
            let nr = kind.sizes(count, p).1;
            let input = kind.input(dt, r, count, p, seed);
            let (send, recv) = match (s.in_place, kind) {
                (true, Kind::AllGather) => {
                    let recv = a5(comm, nr, dt)?;
                    let send = recv.slice(r * count * sz..(r + 1) * count * sz)?;
                    send.write_bytes(&input)?;
                    (send, recv)
                }
                (true, Kind::ReduceScatter) => {
                    let send = comm.native_from(&input)?;
                    let recv = send.slice(r * count * sz..(r + 1) * count * sz)?;
                    (send, recv)
                }
                (true, _) => {
                    let b = comm.native_from(&input)?;
                    (b.clone(), b)
                }
                _ => (comm.native_from(&input)?, a5(comm, nr, dt)?),
            };
            let mut req = Request::new(kind.op(send, recv.clone(), count, redop), dt)
                .with_algo(s.algo)
                .after(deps);
            if let Some(q) = s.quant {
                req = req.with_quant(q);
            }
            let w = submit(comm, req)?;
            let (c, algo, quant) = (comm.clone(), s.algo, s.quant);
            Ok((
                vec![w],
                Box::new(move || {
                    let got = recv.to_bytes()?;
                    match quant {
                        Some(q) => Ok(check::check_quant(
                            &c, kind, dt, redop, count, algo, q, seed, &got,
                        )?
                        .wrong),
                        None => Ok(check::count_wrong(
                            dt,
                            &got,
                            &kind.expected(dt, redop, r, count, p, seed),
                            p,
                        )),
                    }
                }),
            ))
        }
        What::Coalesced(kind) => {
            let (mut sends, mut recvs) = (Vec::new(), Vec::new());
            for (t, &c) in s.counts.iter().enumerate() {
                sends.push(comm.native_from(&kind.input(dt, r, c, p, seed + t as u64))?);
                recvs.push(a5(comm, kind.sizes(c, p).1, dt)?);
            }
            let counts = s.counts.clone();
            let op = match kind {
                Kind::AllGather => Op::AllGatherCoalesced {
                    sends,
                    recvs: recvs.clone(),
                    counts: counts.clone(),
                },
                _ => Op::ReduceScatterCoalesced {
                    sends,
                    recvs: recvs.clone(),
                    counts: counts.clone(),
                    op: redop,
                },
            };
            let w = submit(comm, Request::new(op, dt).with_algo(s.algo).after(deps))?;
            Ok((
                vec![w],
                Box::new(move || {
                    let mut wrong = 0;
                    for (t, (&c, b)) in counts.iter().zip(&recvs).enumerate() {
                        let want = kind.expected(dt, redop, r, c, p, seed + t as u64);
                        wrong += check::count_wrong(dt, &b.to_bytes()?, &want, p);
                    }
                    Ok(wrong)
                }),
            ))
        }
        What::Shift(d) => {
            let (dst, src) = ((r + d) % p, (r + p - d) % p);
            let sbuf = comm.native_from(&check::fill(dt, r, 0, count, seed))?;
            let rbuf = a5(comm, count, dt)?;
            group_start();
            let ws = submit(
                comm,
                Request::new(
                    Op::Send {
                        buf: sbuf,
                        count,
                        peer: dst,
                    },
                    dt,
                )
                .after(deps),
            );
            let wr = submit(
                comm,
                Request::new(
                    Op::Recv {
                        buf: rbuf.clone(),
                        count,
                        peer: src,
                    },
                    dt,
                ),
            );
            group_end()?;
            let works = vec![ws?, wr?];
            Ok((
                works,
                Box::new(move || {
                    let want: Vec<f64> =
                        (0..count).map(|i| check::value(dt, src, i, seed)).collect();
                    Ok(check::count_wrong(dt, &rbuf.to_bytes()?, &want, 1))
                }),
            ))
        }
    }
}

/// Submit a chain (every rank is in every grid).
fn run_chain(
    slots: &[Slot],
    g: &Grid,
    c: &Chain,
    seed: u64,
) -> Result<(Vec<Work>, Box<dyn FnOnce() -> Result<usize>>)> {
    let get = |i: usize| {
        slots[i]
            .comm
            .clone()
            .ok_or_else(|| Error::Internal(format!("not in {}", slots[i].name)))
    };
    let base = get(g.base)?;
    let (p, cr, k) = (base.size(), base.rank(), g.k);
    let (b, n, dt, op) = (cr / k, c.count, c.dtype, c.redop);
    let sz = dt.size();
    let steps = steps(c.kind, g);
    // The first input and the expected result of the composition on the base.
    let (input, expected): (Vec<u8>, Box<dyn FnOnce() -> Vec<f64>>) = match c.kind {
        ChainKind::Ar2 { .. } => (
            check::fill(dt, cr, 0, n, seed),
            Box::new(move || Kind::AllReduce.expected(dt, op, cr, n, p, seed)),
        ),
        ChainKind::Rs2 => (
            check::fill(dt, cr, 0, p * n, seed),
            Box::new(move || Kind::ReduceScatter.expected(dt, op, cr, n, p, seed)),
        ),
        ChainKind::RsAr => (
            check::fill(dt, cr, 0, p * n, seed),
            Box::new(move || Kind::ReduceScatter.expected(dt, op, b, k * n, p, seed)),
        ),
        ChainKind::Ag2 => (
            check::fill(dt, cr, 0, n, seed),
            Box::new(move || Kind::AllGather.expected(dt, op, cr, n, p, seed)),
        ),
        ChainKind::Ar4 => (
            check::fill(dt, cr, 0, p * n, seed),
            Box::new(move || Kind::AllReduce.expected(dt, op, cr, p * n, p, seed)),
        ),
    };
    // Per step (send, recv). In place: views of one buffer laid out as the hierarchical
    // algorithms do; otherwise a fresh receive buffer per step.
    let bytes = |from: usize, len: usize| from * sz..(from + len) * sz;
    let mut bufs: Vec<(Buffer, Buffer)> = Vec::new();
    if c.in_place {
        let z = match c.kind {
            ChainKind::Ag2 => {
                let z = a5(&base, p * n, dt)?;
                z.slice(bytes(cr * n, n))?.write_bytes(&input)?;
                z
            }
            _ => base.native_from(&input)?,
        };
        bufs = match c.kind {
            ChainKind::Ar2 { .. } => vec![(z.clone(), z.clone()), (z.clone(), z)],
            kind => {
                let block = z.slice(bytes(b * k * n, k * n))?;
                let mine = z.slice(bytes(cr * n, n))?;
                match kind {
                    ChainKind::Rs2 => vec![(z, block.clone()), (block, mine)],
                    ChainKind::RsAr => vec![(z, block.clone()), (block.clone(), block)],
                    ChainKind::Ag2 => vec![(mine, block.clone()), (block, z)],
                    _ => vec![
                        (z.clone(), block.clone()),
                        (block.clone(), mine.clone()),
                        (mine, block.clone()),
                        (block, z),
                    ],
                }
            }
        };
    } else {
        let mut send = base.native_from(&input)?;
        for &(slot, kind, mul) in &steps {
            let q = slots[slot].size;
            let recv = a5(&base, kind.sizes(n * mul, q).1, dt)?;
            bufs.push((send, recv.clone()));
            send = recv;
        }
    }
    let mut works: Vec<Work> = Vec::new();
    for (i, (&(slot, kind, mul), (send, recv))) in steps.iter().zip(bufs.iter()).enumerate() {
        let comm = get(slot)?;
        let req = Request::new(kind.op(send.clone(), recv.clone(), n * mul, op), dt)
            .with_algo(c.algos[i])
            .after(works.last().cloned());
        works.push(submit(&comm, req)?);
    }
    let out = bufs
        .last()
        .map(|x| x.1.clone())
        .ok_or_else(|| Error::Internal("empty chain".into()))?;
    Ok((
        works,
        Box::new(move || Ok(check::count_wrong(dt, &out.to_bytes()?, &expected(), p))),
    ))
}

/// What one rank reports at the end.
pub(crate) struct RankSoak {
    /// Mismatching elements over all ranks (agreed).
    pub(crate) wrong: u64,
}

/// One rank's soak: setup, rounds until the agreed stop, the summary on rank 0.
/// On an error every communicator of the soak is aborted, so the peers fail at once.
fn soak_rank(w: &Comm, secs: f64, seed: u64, header: &str) -> Result<RankSoak> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (slots, grids) = match setup(w, &mut rng) {
        Ok(x) => x,
        Err(e) => {
            w.abort();
            return Err(e);
        }
    };
    let r = rounds(w, &slots, &grids, &mut rng, secs, seed, header);
    if r.is_err() {
        slots
            .iter()
            .filter_map(|s| s.comm.as_ref())
            .for_each(|c| c.abort());
    }
    r
}

#[allow(clippy::too_many_arguments)]
fn rounds(
    w: &Comm,
    slots: &[Slot],
    grids: &[Grid],
    rng: &mut ChaCha8Rng,
    secs: f64,
    seed: u64,
    header: &str,
) -> Result<RankSoak> {
    let me = w.rank();
    if me == 0 {
        println!("{header}");
        let list: Vec<String> = slots
            .iter()
            .map(|s| format!("{}({})", s.name, s.size))
            .collect();
        println!("#  comms     : {}", list.join(" "));
        let gl: Vec<String> = grids
            .iter()
            .map(|g| {
                format!(
                    "{} = {} x {}",
                    slots[g.base].name, slots[g.x].name, slots[g.y].name
                )
            })
            .collect();
        println!(
            "#  grids     : {}",
            if gl.is_empty() {
                "none (no chains)".into()
            } else {
                gl.join(", ")
            }
        );
    }
    let t0 = Instant::now();
    let deadline = Duration::from_secs_f64(secs);
    let mut last = t0;
    let mut stats = Stats::default();
    let mut next = 0u64;
    let mut wrong_total = 0u64;
    loop {
        let items = draw_round(rng, slots, grids, seed, &mut next, &mut stats);
        stats.rounds += 1;
        let order_seed: u64 = rng.random();
        let mut pending: Vec<Pending> = Vec::new();
        let mut works_of: Vec<Vec<Work>> = vec![Vec::new(); items.len()];
        let mut in_group = false;
        for (i, item) in items.iter().enumerate() {
            let r = match &item.body {
                Body::One(s) => {
                    let Some(comm) = &slots[s.slot].comm else {
                        continue;
                    };
                    if s.grouped && !in_group {
                        group_start();
                        in_group = true;
                    }
                    let deps = s.dep.map(|d| works_of[d].clone()).unwrap_or_default();
                    run_single(comm, s, item.seed, deps)
                }
                Body::Chain(c) => {
                    if in_group {
                        group_end()?;
                        in_group = false;
                    }
                    run_chain(slots, &grids[c.grid], c, item.seed)
                }
            };
            let (works, verify) = match r {
                Ok(x) => x,
                Err(e) => {
                    if in_group {
                        let _ = group_end();
                    }
                    return Err(at(e, seed, item, slots, grids));
                }
            };
            works_of[i] = works.clone();
            pending.push(Pending {
                item: i,
                works,
                verify,
            });
        }
        if in_group {
            group_end()?;
        }
        // Wait out of order: every handle of the round in a shuffled order.
        let mut order: Vec<(usize, usize)> = pending
            .iter()
            .enumerate()
            .flat_map(|(pi, p)| (0..p.works.len()).map(move |wi| (pi, wi)))
            .collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(order_seed));
        for (pi, wi) in order {
            let p = &pending[pi];
            if let Err(e) = p.works[wi].wait() {
                print_round(me, stats.rounds, &items, slots, grids);
                return Err(at(e, seed, &items[p.item], slots, grids));
            }
        }
        let mut wrong_here = 0u64;
        for p in pending {
            let item = &items[p.item];
            let wrong = (p.verify)().map_err(|e| at(e.clone(), seed, item, slots, grids))?;
            if wrong > 0 {
                wrong_here += wrong as u64;
                eprintln!(
                    "MISMATCH rank {me}: seed {seed} op #{}: {wrong} wrong element(s): {}",
                    item.index,
                    describe(item, slots, grids)
                );
            }
        }
        if wrong_here > 0 {
            print_round(me, stats.rounds, &items, slots, grids);
        }
        let up = i32::from(t0.elapsed() >= deadline);
        let agreed = agree(w, &[up, wrong_here.min(1 << 30) as i32], ReduceOp::Sum)?;
        wrong_total += agreed[1] as u64;
        if me == 0 && (last.elapsed() >= PROGRESS || agreed[0] > 0 || agreed[1] > 0) {
            last = Instant::now();
            println!(
                "# [{:7.1} s] {} collectives, {}, {} wrong element(s)",
                t0.elapsed().as_secs_f64(),
                stats.ops,
                gib(stats.bytes),
                wrong_total
            );
        }
        if agreed[0] > 0 || agreed[1] > 0 {
            break;
        }
    }
    if me == 0 {
        let el = t0.elapsed().as_secs_f64();
        println!(
            "# soak done: {} collectives in {} rounds, {:.1} s ({:.0}/s), {} checked, failures={}",
            stats.ops,
            stats.rounds,
            el,
            stats.ops as f64 / el.max(1e-9),
            gib(stats.bytes),
            wrong_total
        );
        println!("#  by op    :{}", line(&stats.by_op));
        println!("#  by algo  :{}", line(&stats.by_algo));
        println!("#  by comm  :{}", line(&stats.by_comm));
        println!("#  by dtype :{}", line(&stats.by_dtype));
        println!(
            "#  chains   :{}{}",
            line(&stats.chains),
            if stats.chains.is_empty() { " none" } else { "" }
        );
        println!(
            "#  groups {}, in place {}, cross-communicator waits {}, zero counts {}",
            stats.groups, stats.in_place, stats.deps, stats.zero
        );
        if wrong_total > 0 {
            println!("# reproduce: the same command with --seed {seed} (ops are numbered from 0 in schedule order)");
        }
    }
    Ok(RankSoak { wrong: wrong_total })
}

/// The items of a failed round, on stderr.
fn print_round(me: usize, round: u64, items: &[Item], slots: &[Slot], grids: &[Grid]) {
    for it in items {
        eprintln!(
            "rank {me}: round {round}: op #{}: {}",
            it.index,
            describe(it, slots, grids)
        );
    }
}

/// `e` with the seed and op of the item it happened in.
fn at(e: Error, seed: u64, item: &Item, slots: &[Slot], grids: &[Grid]) -> Error {
    let what = format!(
        "seed {seed} op #{} ({})",
        item.index,
        describe(item, slots, grids)
    );
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{what}: {m}")),
        Error::InvalidUsage(m) => Error::InvalidUsage(format!("{what}: {m}")),
        Error::Remote(m) => Error::Remote(format!("{what}: {m}")),
        Error::System(m) => Error::System(format!("{what}: {m}")),
        Error::Device(m) => Error::Device(format!("{what}: {m}")),
        Error::Internal(m) => Error::Internal(format!("{what}: {m}")),
        e => e,
    }
}

fn header(cli: &Cli, w: &Comm, secs: f64, seed: u64) -> String {
    format!(
        "# strata-perf soak: random checked collectives\n#  transport : {}\n#  topology  : {}\n#  ranks     : {}\n#  seconds   : {secs}\n#  seed      : {seed}  (reproduce with --seed {seed})\n#  timeout   : {}s",
        cli.transport.name(),
        w.topology().summary(),
        w.size(),
        w.timeout().as_secs_f64()
    )
}

fn the_seed(cli: &Cli) -> u64 {
    cli.seed
        .unwrap_or_else(|| rand::rng().random_range(0..1u64 << 48))
}

/// `--soak` on the local transport: one thread per rank.
pub(crate) fn soak_local(cli: &Cli, config: CommConfig, topo: Option<Topology>) -> Result<u64> {
    let secs = cli.soak.unwrap_or(0.0);
    let ranks = match (cli.ranks, &topo) {
        (Some(n), _) => n as usize,
        (None, Some(t)) => t.world_size(),
        (None, None) => 8,
    };
    let topo = topo.unwrap_or_else(|| Topology::flat(ranks));
    let comms = Comm::local_world(ranks, Some(topo), config)?;
    let seed = the_seed(cli);
    let head = header(cli, &comms[0], secs, seed);
    let (tx, rx) = mpsc::channel::<(usize, Result<RankSoak>)>();
    let mut handles = Vec::new();
    for comm in comms {
        let (tx, head) = (tx.clone(), head.clone());
        let r = comm.rank();
        let h = std::thread::Builder::new()
            .name(format!("strata-soak-r{r}"))
            .spawn(move || {
                let _ = tx.send((r, soak_rank(&comm, secs, seed, &head)));
            })
            .map_err(|e| Error::System(format!("cannot start a rank thread: {e}")))?;
        handles.push(h);
    }
    drop(tx);
    let mut first: Option<(usize, Error)> = None;
    let mut wrong = 0;
    for (r, res) in rx {
        match res {
            Ok(s) => wrong = wrong.max(s.wrong),
            Err(e) => {
                let consequence = |e: &Error| e.to_string().contains("aborted");
                match &first {
                    Some((_, f)) if !consequence(f) || consequence(&e) => {}
                    _ => first = Some((r, e)),
                }
            }
        }
    }
    for (r, h) in handles.into_iter().enumerate() {
        if h.join().is_err() {
            return Err(Error::Internal(format!("rank {r} thread panicked")));
        }
    }
    match first {
        Some((r, e)) => Err(Error::Remote(format!("rank {r}: {e}"))),
        None => Ok(wrong),
    }
}

/// `--soak` under mpirun: one rank per process.
pub(crate) fn soak_mpi(cli: &Cli, config: CommConfig, topo: Option<Topology>) -> Result<u64> {
    let w = Comm::mpi_world(topo, config)?;
    if let Some(n) = cli.ranks {
        if n as usize != w.size() {
            return Err(Error::InvalidUsage(format!(
                "--ranks {n} but the MPI job has {} processes (omit --ranks with mpi)",
                w.size()
            )));
        }
    }
    // Rank 0's seed for everyone.
    let seed = the_seed(cli);
    let parts = [(seed & 0xFFFF_FF) as i32, (seed >> 24) as i32];
    let mine = if w.rank() == 0 { parts } else { [0, 0] };
    let s = agree(&w, &mine, ReduceOp::Sum)?;
    let seed = (s[0] as u64 & 0xFFFF_FF) | ((s[1] as u64) << 24);
    let head = header(cli, &w, cli.soak.unwrap_or(0.0), seed);
    let r = soak_rank(&w, cli.soak.unwrap_or(0.0), seed, &head);
    match r {
        Ok(s) => Ok(s.wrong),
        Err(e) => Err(Error::Remote(format!("rank {}: {e}", w.rank()))),
    }
}
