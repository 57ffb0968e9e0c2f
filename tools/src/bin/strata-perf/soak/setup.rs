//! The soak's communicators (slots and X/Y grids), the items a round is made of,
//! and the counters it reports.

use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;
use strata::check::Kind;
use strata::kernels::QuantSpec;
use strata::{Algo, Buffer, Comm, DataType, Error, Op, ReduceOp, Request, Result};

/// Largest per-call count.
pub(crate) const MAX_COUNT: usize = 256 * 1024;
/// Largest buffer of one call on one rank, in elements.
pub(crate) const MAX_ELEMS: usize = 1 << 20;
/// Seconds between progress lines.
pub(crate) const PROGRESS: Duration = Duration::from_secs(10);

/// One communicator of the soak: the same list, in the same order, on every rank.
pub(crate) struct Slot {
    pub(crate) name: &'static str,
    /// None where this rank is not a member.
    pub(crate) comm: Option<Comm>,
    pub(crate) size: usize,
    /// Levels of its hierarchy (0: not a regular mesh of the topology).
    pub(crate) levels: usize,
}

impl Slot {
    /// One of the world's cached sub-communicators, which the world's hierarchical and
    /// quantized algorithms also run their steps on.
    pub(crate) fn cached(&self) -> bool {
        self.name.starts_with("level") || matches!(self.name, "node" | "rail")
    }
}

/// Two orthogonal sub-communicators of a base: X = blocks of `k` consecutive base ranks,
/// Y = every k-th base rank (X-rank = base rank % k, Y-rank = base rank / k).
pub(crate) struct Grid {
    pub(crate) base: usize,
    pub(crate) x: usize,
    pub(crate) y: usize,
    pub(crate) k: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum What {
    Plain(Kind),
    Coalesced(Kind),
    Quant(Kind),
    /// Grouped send/recv: every rank sends to rank + d and receives from rank - d.
    Shift(usize),
}

#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) slot: usize,
    pub(crate) what: What,
    pub(crate) algo: Algo,
    pub(crate) dtype: DataType,
    pub(crate) redop: ReduceOp,
    pub(crate) count: usize,
    pub(crate) counts: Vec<usize>,
    pub(crate) in_place: bool,
    pub(crate) quant: Option<QuantSpec>,
    /// Earlier item of the round (outside the group) this one waits for.
    pub(crate) dep: Option<usize>,
    pub(crate) grouped: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ChainKind {
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
    pub(crate) fn name(self) -> &'static str {
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
pub(crate) struct Chain {
    pub(crate) grid: usize,
    pub(crate) kind: ChainKind,
    pub(crate) dtype: DataType,
    pub(crate) redop: ReduceOp,
    pub(crate) count: usize,
    pub(crate) in_place: bool,
    pub(crate) algos: Vec<Algo>,
}

#[derive(Debug, Clone)]
pub(crate) enum Body {
    One(Spec),
    Chain(Chain),
}

#[derive(Debug, Clone)]
pub(crate) struct Item {
    /// Op index of its first collective.
    pub(crate) index: u64,
    pub(crate) seed: u64,
    pub(crate) body: Body,
}

/// Counters of the schedule (every item, whether or not this rank is in it).
#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) ops: u64,
    pub(crate) bytes: u64,
    pub(crate) rounds: u64,
    pub(crate) by_op: BTreeMap<String, u64>,
    pub(crate) by_algo: BTreeMap<String, u64>,
    pub(crate) by_comm: BTreeMap<String, u64>,
    pub(crate) by_dtype: BTreeMap<String, u64>,
    pub(crate) chains: BTreeMap<String, u64>,
    pub(crate) groups: u64,
    pub(crate) in_place: u64,
    pub(crate) deps: u64,
    pub(crate) zero: u64,
}

impl Stats {
    pub(crate) fn count(&mut self, op: &str, algo: Algo, comm: &str, dtype: DataType, bytes: u64) {
        self.ops += 1;
        self.bytes += bytes;
        *self.by_op.entry(op.into()).or_default() += 1;
        *self.by_algo.entry(algo.name().into()).or_default() += 1;
        *self.by_comm.entry(comm.into()).or_default() += 1;
        *self.by_dtype.entry(dtype.name().into()).or_default() += 1;
    }
}

pub(crate) fn line(m: &BTreeMap<String, u64>) -> String {
    let mut s = String::new();
    for (k, v) in m {
        let _ = write!(s, " {k}={v}");
    }
    s
}

pub(crate) fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// A waited all-reduce of small integers over `comm` (ring).
pub(crate) fn agree(comm: &Comm, v: &[i32], op: ReduceOp) -> Result<Vec<i32>> {
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
pub(crate) fn setup(w: &Comm, rng: &mut ChaCha8Rng) -> Result<(Vec<Slot>, Vec<Grid>)> {
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
pub(crate) fn grid_ok(comms: &[(&'static str, Option<Comm>)], g: &Grid) -> bool {
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
