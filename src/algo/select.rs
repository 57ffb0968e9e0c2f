//! The `auto` rule and algorithm selection: ONE pure function, [`select`], from a call's
//! [`Shape`] (what it is, how big, on which ranks of which topology) to a [`Choice`]. The
//! submit path ([`choose`], once per call) and the simulator
//! ([`crate::sim::schedule::resolve`]) both use it, so what is modeled is what runs.
//!
//! Order of precedence: the request's own hint, then `STRATA_ALGO` / the communicator's
//! configured algorithm, then `auto`. A chosen algorithm whose constraints do not hold
//! falls back to the native collective (`ring`), with the reason logged at INFO.
//! `auto` never picks a quantized (lossy) algorithm: `qgz`, `qgz-1hop` and `qwz` run only
//! when named. `auto` picks the cheapest of `ring`, `log-step`, `hier` and `ho-ring` by
//! these estimates (all-gather, reduce-scatter, all-reduce; other ops run natively):
//!
//! alpha-beta figures from the topology's link table ([`crate::topology::presets`]):
//! - ring over p ranks: `(p-1) · (α_s + c/β_s)`, where s is the slowest link class the
//!   ring crosses and c the per-rank chunk (all-gather, reduce-scatter; twice that for
//!   all-reduce);
//! - log-step: `Σ_steps (α_s + m·c/(0.75·β_s))` over its ⌈log₂ p⌉ steps of m chunks, s
//!   the slowest class the step's pairs cross ([`LOG_STEP_BW`]: NCCL's PAT factor);
//! - hier: `Σ_levels B_l·(g_l - 1)·(α_l + c/β_l)` with g_l the level's group size and
//!   B_l the batched rings of that stage (run one after another on the level stream);
//!   the inter-node stage (B_0 = 1) costs the cheaper of its ring and log-step forms
//!   ([`stage_times`]), the form `hier` then runs;
//! - ho-ring: every level busy at once: `max_l B_l(g_l-1)(q·α_l + c/β_l)` plus a
//!   pipeline fill of one piece (c/q) per level step, q the pieces per chunk; with a
//!   measured topology, levels that do not overlap (1 − overlap) add in turn, and for
//!   an all-gather where the probe measured ho-ring's `handoff_us`, the busiest
//!   level's own fill is left out (it paces the pipeline) and each of its piece steps
//!   costs the handoff.
//!
//! So `hier` wins on multi-node communicators whenever inter-node links are slower than
//! intra-node ones and messages are not latency-bound; log-step wins where every step's
//! latency outweighs its bytes (small messages over many ranks).

pub use super::cost::{stage_log_step, stage_times, LOG_STEP_BW};
use super::hierarchical::{Hier, Inter};
use super::qgz::{Qgz, Qgz1};
use super::qwz::Qwz;
pub use super::shape::Shape;
use super::{ho_ring::HoRing, log_step::LogStep, native::Native, shape::Algorithm, Algo};
use crate::dtype::DataType;
use crate::kinds::Kind;
use crate::runtime::{CommCore, Op, Request};
use crate::topology::{Hierarchy, LinkClass, Topology};

static NATIVE: Native = Native;
static HIER: Hier = Hier(Inter::Auto);
static HIER_RING: Hier = Hier(Inter::Ring);
static HIER_LOG: Hier = Hier(Inter::LogStep);
static LOG_STEP: LogStep = LogStep;
static HO_RING: HoRing = HoRing;
static QGZ: Qgz = Qgz;
static QGZ1: Qgz1 = Qgz1;
static QWZ: Qwz = Qwz;

/// What [`select`] decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The algorithm that runs.
    pub algo: Algo,
    /// What was asked for (the request's hint, else the communicator's default).
    pub requested: Algo,
    /// Why the requested algorithm could not run, when it fell back to `ring`.
    pub fallback: Option<String>,
    /// One line on why (the estimates, for `auto`): formatted only when shown, since
    /// every call makes one.
    pub reason: Reason,
}

/// Why [`select`] chose what it chose, kept as its inputs and written out only when
/// displayed (a log line, `strata-perf`'s column): selecting costs no formatting.
#[derive(Debug, Clone, PartialEq)]
pub enum Reason {
    /// A fixed sentence.
    Fixed(&'static str),
    /// The named algorithm was asked for and runs.
    Requested(Algo),
    /// The named algorithm cannot run this call (why): the native collective runs.
    NotApplicable(Algo, String),
    /// `auto` picked the cheapest of these estimates.
    Auto(Algo, Estimates),
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Fixed(s) => f.write_str(s),
            Reason::Requested(a) => write!(f, "{a} requested"),
            Reason::NotApplicable(a, why) => {
                write!(f, "{a} not applicable ({why}); native fallback")
            }
            Reason::Auto(pick, e) => write!(
                f,
                "auto: {pick} (ring {:.1}us, log-step {:.1}us, hier {:.1}us, ho-ring {:.1}us)",
                e.ring, e.log_step, e.hier, e.ho_ring
            ),
        }
    }
}

/// The registered algorithm of a name (`Auto` has none: it is resolved by [`select`]).
pub fn algorithm(a: Algo) -> &'static dyn Algorithm {
    match a {
        Algo::Ring | Algo::Auto => &NATIVE,
        Algo::Hier => &HIER,
        Algo::HierRing => &HIER_RING,
        Algo::HierLog => &HIER_LOG,
        Algo::LogStep => &LOG_STEP,
        Algo::HoRing => &HO_RING,
        Algo::Qgz => &QGZ,
        Algo::Qgz1 => &QGZ1,
        Algo::Qwz => &QWZ,
    }
}

/// THE selection rule: `wanted` (a name, or `Auto`) for a call of shape `s`.
pub fn select(wanted: Algo, s: &Shape) -> Choice {
    let choice = |algo, fallback, reason| Choice {
        algo,
        requested: wanted,
        fallback,
        reason,
    };
    match wanted {
        Algo::Ring => return choice(Algo::Ring, None, Reason::Fixed("ring requested")),
        Algo::Auto => {}
        named => {
            return match algorithm(named).unsupported(s) {
                None => choice(named, None, Reason::Requested(named)),
                Some(why) => choice(
                    Algo::Ring,
                    Some(why.clone()),
                    Reason::NotApplicable(named, why),
                ),
            }
        }
    }
    if !matches!(
        s.kind,
        Some(Kind::AllGather | Kind::ReduceScatter | Kind::AllReduce)
    ) {
        return choice(
            Algo::Ring,
            None,
            Reason::Fixed("auto: ring (no other form)"),
        );
    }
    let e = estimates(s);
    let pick = e.pick();
    choice(pick, None, Reason::Auto(pick, e))
}

/// [`select`] for a checked request on `core`: the request's hint, else the
/// communicator's configured algorithm (`STRATA_ALGO`), else `auto`. Fallbacks are
/// logged at INFO.
pub fn choose(core: &CommCore, req: &Request) -> Choice {
    let c = select(
        req.algo.unwrap_or(core.config().algo),
        &Shape::of(core, req),
    );
    if let Some(why) = &c.fallback {
        tracing::info!(
            rank = core.rank(),
            op = req.op.name(),
            "{} falls back to ring: {why}",
            c.requested
        );
    }
    c
}

/// [`choose`]'s algorithm, remembered per communicator for the hot path: a call shaped
/// as one before it (same requested algorithm, collective, reduction, dtype and count:
/// everything [`select`] reads that varies per call, the rest being the communicator's
/// and fixed) takes the remembered algorithm without estimating again (the estimates
/// walk the ranks: microseconds at a hundred ranks). One word per shape in a
/// direct-mapped table of 64 ([`CommCore::chosen`]), so alternating shapes (a training
/// step's layers) each keep theirs; read and written with relaxed atomics (a stale,
/// evicted or racing word only costs a fresh [`choose`]); choices that fell back are not
/// remembered, so their INFO line is still logged on every call.
pub fn choose_algo(core: &CommCore, req: &Request) -> Algo {
    let wanted = req.algo.unwrap_or(core.config().algo);
    if wanted == Algo::Ring {
        return Algo::Ring;
    }
    let key = remember_key(wanted, &req.op, req.dtype);
    if let Some(k) = key {
        let w = core.chosen(k).load(std::sync::atomic::Ordering::Relaxed);
        if w & !0xf == k {
            if let Some(&a) = Algo::ALL.get((w & 0xf) as usize) {
                return a;
            }
        }
    }
    let c = choose(core, req);
    if let (Some(k), None) = (key, &c.fallback) {
        core.chosen(k)
            .store(k | c.algo as u64, std::sync::atomic::Ordering::Relaxed);
    }
    c.algo
}

/// The key of a call for [`choose_algo`]'s word (low 4 bits free for the answer, an
/// [`Algo`]'s discriminant, its index in [`Algo::ALL`]), or
/// `None` for calls it does not remember (counts of 2^40 elements and more).
fn remember_key(wanted: Algo, op: &Op, dtype: DataType) -> Option<u64> {
    let (kind, count) = match op {
        Op::AllGather { count, .. } => (1, *count),
        Op::ReduceScatter { count, .. } => (2, *count),
        Op::AllReduce { count, .. } => (3, *count),
        Op::AllToAll { count, .. } => (4, *count),
        _ => return None,
    };
    if count >= 1 << 40 {
        return None;
    }
    let wanted = wanted as u64;
    let redop = op.redop().map_or(0, |r| r as u64 + 1);
    // count 40 bits | kind 3 | redop 3 | dtype 4 | wanted 4 | answer 4 (low).
    Some(
        (count as u64) << 24
            | kind << 21
            | redop << 18
            | (dtype as u64) << 14
            | wanted << 10
            | 1 << 9,
    )
}

/// Modeled times in microseconds of the lossless algorithms for one call
/// ([`estimates`]); `INFINITY` where one does not apply.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimates {
    pub ring: f64,
    pub log_step: f64,
    /// `hier` with its inter-node stage in the cheaper form ([`stage_log_step`]).
    pub hier: f64,
    pub ho_ring: f64,
}

impl Estimates {
    /// The `auto` pick: the cheapest; on a tie the earlier of ring, hier, ho-ring,
    /// log-step.
    pub fn pick(&self) -> Algo {
        let mut best = (self.ring, Algo::Ring);
        for (t, a) in [
            (self.hier, Algo::Hier),
            (self.ho_ring, Algo::HoRing),
            (self.log_step, Algo::LogStep),
        ] {
            if t < best.0 {
                best = (t, a);
            }
        }
        best.1
    }
}

/// The modeled times of a call of shape `s`.
pub fn estimates(s: &Shape) -> Estimates {
    let p = s.size();
    let (count, factor) = match s.kind {
        Some(Kind::AllGather) | Some(Kind::ReduceScatter) => (s.count, 1.0),
        Some(Kind::AllReduce) => (s.count.div_ceil(p.max(1)), 2.0),
        _ => (0, 1.0),
    };
    let h = s.hierarchy.filter(|h| h.levels.len() >= 2);
    // The probe calibrates ho-ring's handoff on all-gathers; a reduce-scatter's pieces
    // also wait on their reductions before moving on, which it does not measure.
    let handoff = s
        .topo
        .links
        .handoff_us
        .filter(|_| s.kind == Some(Kind::AllGather));
    let mut e = estimate(
        s.topo,
        s.members,
        h,
        count,
        factor,
        s.dtype.size(),
        s.chunks,
        handoff,
    );
    if let Some(host) = s.topo.links.host {
        let reduces = matches!(s.kind, Some(Kind::ReduceScatter | Kind::AllReduce));
        let gathers = matches!(s.kind, Some(Kind::AllGather | Kind::AllReduce));
        let levels = h.map(|h| h.sizes()).unwrap_or_default();
        let mut w = host_work(host, p, count * s.dtype.size(), reduces, gathers, &levels);
        // The host figures are a rank's share with every rank at work. Where the links
        // carry traffic apart from the cores (the probe's overlap), ranks waiting on the
        // network leave the cores to the others: host work is on the critical path only
        // as far as links and cores are one resource (one host: overlap 0).
        let shared = 1.0 - s.topo.links.overlap.unwrap_or(0.0);
        for x in [&mut w.every, &mut w.ring, &mut w.hier, &mut w.log_step] {
            *x *= shared;
        }
        e.ring += w.every + w.ring;
        e.hier += w.every + w.hier;
        e.ho_ring += w.every + w.hier;
        e.log_step += w.every + w.log_step;
        // ho-ring's reduce-scatter copies the whole send buffer into fresh scratch
        // before its first transfer and its chunk out after its last, every rank at
        // once: no link time hides that, whatever the overlap.
        if s.kind == Some(Kind::ReduceScatter) && h.is_some() {
            let c = (count * s.dtype.size()) as f64;
            e.ho_ring += (p as f64 + 1.0) * c / (host.copy_gbs * 1e3);
        }
    }
    e
}

/// The host path's own work in a call (µs), where the topology has measured it
/// ([`crate::topology::HostSpec`], the link probe's), `c` bytes per rank chunk:
/// - `every` algorithm reduces `(p−1)·c` bytes per rank in a reduce-scatter;
/// - an all-gather copies this rank's chunk into place: `ring` once; `hier` once per
///   batched ring of each stage (`b·c`), and each stage's scratch but the last is fresh
///   memory the kernel zeroes as it is received into (`b·g·c`, `levels` the stage
///   sizes); `log_step` copies `p·c` (its rotation) up to
///   [`super::log_step::ROTATE_UP_TO`], else (and for a power of two p) once;
/// - `log_step`'s reduce-scatter receives each step's `m` chunks into fresh scratch,
///   `(p−1)·c` in all, inside a work buffer of `p/2` chunks; `hier`'s writes each
///   stage's result but the network's into fresh scratch (`b·c`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostWork {
    pub every: f64,
    pub ring: f64,
    pub hier: f64,
    pub log_step: f64,
}

/// [`HostWork`] of a call over `p` ranks (module doc of the fields).
pub fn host_work(
    host: crate::topology::HostSpec,
    p: usize,
    c: usize,
    reduces: bool,
    gathers: bool,
    levels: &[usize],
) -> HostWork {
    let (c, n) = (c as f64, p.saturating_sub(1) as f64);
    let copy = |b: f64| b / (host.copy_gbs * 1e3);
    // A power of two runs recursive doubling / halving: no rotation at any size.
    let rotated =
        p > 1 && !p.is_power_of_two() && (p as f64 * c) <= super::log_step::ROTATE_UP_TO as f64;
    let mut w = HostWork {
        every: if reduces {
            n * c / (host.reduce_gbs * 1e3)
        } else {
            0.0
        },
        ring: 0.0,
        hier: 0.0,
        log_step: 0.0,
    };
    if reduces {
        w.log_step += copy(n * c) + copy(p as f64 / 2.0 * c);
        if rotated {
            w.log_step += copy(p as f64 * c);
        }
        // hier's reduce-scatter: every stage but the network's writes fresh scratch.
        let mut b = 1usize;
        for (i, &g) in levels.iter().enumerate() {
            if i > 0 {
                w.hier += copy(b as f64 * c);
            }
            b *= g;
        }
    }
    if gathers {
        w.ring += copy(c);
        w.log_step += copy(if rotated { p as f64 * c } else { c });
        let mut b = 1usize;
        for (i, &g) in levels.iter().enumerate() {
            w.hier += copy(b as f64 * c);
            if i + 1 < levels.len() {
                w.hier += copy((b * g) as f64 * c);
            }
            b *= g;
        }
        if levels.is_empty() {
            w.hier = w.ring;
        }
    }
    w
}

/// The alpha-beta figures behind [`estimates`]: `members` are the world ranks in
/// communicator order, `h` their hierarchy (2 or 3 levels, else `None`), `count`
/// elements of `elem` bytes per rank chunk, `factor` 1 (all-gather, reduce-scatter) or
/// 2 (all-reduce), `chunks` the configured ho-ring pieces, `handoff` ho-ring's measured
/// cost per piece step where it applies (`None`: the preset form of its pipeline).
#[allow(clippy::too_many_arguments)]
pub fn estimate(
    topo: &Topology,
    members: &[usize],
    h: Option<&Hierarchy>,
    count: usize,
    factor: f64,
    elem: usize,
    chunks: Option<usize>,
    handoff: Option<f64>,
) -> Estimates {
    let p = members.len();
    let c = (count * elem) as f64;
    let step = |class: LinkClass, bytes: f64| {
        let l = topo.links.get(class);
        l.latency_us + bytes / (l.bandwidth_gbs * 1e3)
    };
    // The slowest class between each rank and its peer `peer(r)` (every call asks: stop
    // at the slowest class there is).
    let slowest = |peer: &dyn Fn(usize) -> usize| {
        let mut worst = LinkClass::IntraPackage;
        for r in 0..p {
            worst = worst.max(topo.link_class(members[r], members[peer(r)]));
            if worst == LinkClass::InterNode {
                break;
            }
        }
        worst
    };
    // A ring over the whole topology in rank order runs as NCCL's channel rings
    // (topology::channels); a sub-communicator keeps one ring over its slowest link.
    let whole = p == topo.world_size() && members.iter().enumerate().all(|(i, &m)| i == m);
    let ring_step = if whole {
        crate::topology::channels::ring_step_us(topo, c)
    } else {
        step(slowest(&|r| (r + 1) % p), c)
    };
    let ring = factor * (p.saturating_sub(1)) as f64 * ring_step;
    // Log-step: each step over the slowest link its pairs cross; where they leave their
    // node, the node's ranks that do share its NICs. The step of size d sends to x − d
    // (Bruck's), or to x XOR d where p is a power of two (recursive doubling,
    // [`super::recursive`]); the pairs cross the same classes either way round.
    let pairs = p.is_power_of_two();
    let log_peer = |r: usize, d: usize| if pairs { r ^ d } else { (r + p - d) % p };
    let log_step = factor
        * super::log_step::steps(p)
            .into_iter()
            .map(|(d, m)| {
                let class = slowest(&|r| log_peer(r, d));
                let l = topo.links.get(class);
                let bytes = m as f64 * c;
                let mut t = bytes / (l.bandwidth_gbs * 1e3);
                if class == LinkClass::InterNode {
                    let leaves = |r: usize| {
                        topo.node_of(members[r]) != topo.node_of(members[log_peer(r, d)])
                    };
                    // The whole topology in rank order is the same seen from every node
                    // (one node further is d places further): count node 0's ranks.
                    let busiest = if whole {
                        (0..topo.ranks_per_node().min(p))
                            .filter(|&r| leaves(r))
                            .count()
                    } else {
                        let mut out = vec![0usize; topo.nodes.max(1)];
                        for r in (0..p).filter(|&r| leaves(r)) {
                            out[topo.node_of(members[r])] += 1;
                        }
                        out.into_iter().max().unwrap_or(0)
                    } as f64;
                    t = t.max(busiest * bytes / (topo.links.node_egress_gbs() * 1e3));
                }
                l.latency_us + t / LOG_STEP_BW
            })
            .sum::<f64>();
    let (mut hier, mut ho) = (f64::INFINITY, f64::INFINITY);
    if let Some(h) = h {
        let q = chunks.unwrap_or_else(|| super::step_list::default_chunks(c as usize)) as f64;
        let (mut batch, mut sum, mut fill) = (1usize, 0.0, 0.0);
        // The busiest level: its time, its pipeline fill and its steps.
        let (mut busiest, mut busiest_fill, mut busiest_steps) = (0.0f64, 0.0, 0.0);
        let mut in_turn = 0.0;
        for (i, (level, g)) in h.levels.iter().enumerate() {
            let l = topo.links.get(level.link_class());
            let steps = (batch * (g - 1)) as f64;
            // hier: the stage's rings one after another (the inter-node stage in its
            // cheaper form); ho-ring: every level busy at once (in pieces of c/q), plus
            // the pipeline's fill of one piece per level step.
            sum += if i == 0 {
                let (r, lg) = stage_times(topo, level.link_class(), *g, c as usize);
                r.min(lg)
            } else {
                steps * (l.latency_us + c / (l.bandwidth_gbs * 1e3))
            };
            let level = steps * (q * l.latency_us + c / (l.bandwidth_gbs * 1e3));
            let level_fill = (g - 1) as f64 * (l.latency_us + c / q / (l.bandwidth_gbs * 1e3));
            if level > busiest {
                (busiest, busiest_fill, busiest_steps) = (level, level_fill, steps);
            }
            in_turn += level;
            fill += level_fill;
            batch *= g;
        }
        hier = factor * sum;
        // Levels that cannot carry traffic at once (the probe's `overlap` < 1) serialise.
        // With a measured handoff cost, the pipeline is counted as it runs: the busiest
        // level paces it, only the other levels' fill adds, and every piece step of the
        // busiest level pays the handoff. Without (presets; reduce-scatters), the
        // busiest level's fill stays, standing in for it.
        let o = topo.links.overlap.unwrap_or(1.0);
        let paced = match handoff {
            Some(k) => k * q * busiest_steps - o * busiest_fill,
            None => 0.0,
        };
        ho = factor * (o * busiest + (1.0 - o) * in_turn + fill + paced);
    }
    Estimates {
        ring,
        log_step,
        hier,
        ho_ring: ho,
    }
}
