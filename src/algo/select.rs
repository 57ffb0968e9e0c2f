//! The `auto` rule and algorithm selection.
//!
//! Order of precedence: the request's own hint, then `STRATA_ALGO` / the communicator's
//! configured algorithm, then `auto`. A chosen algorithm whose constraints do not hold
//! falls back to the native collective (`ring`), with the reason logged at INFO.
//! `auto` never picks a quantized (lossy) algorithm: `qgz`, `qgz-1hop` and `qwz` run only
//! when named. `auto` picks the cheapest of `ring`, `hier` and `ho-ring` by these estimates:
//!
//! alpha-beta figures from the topology's link table ([`crate::topology::presets`]):
//! - ring over p ranks: `(p-1) · (α_s + c/β_s)`, where s is the slowest link class the
//!   ring crosses and c the per-rank chunk (all-gather, reduce-scatter; twice that for
//!   all-reduce);
//! - hier: `Σ_levels B_l·(g_l - 1)·(α_l + c/β_l)` with g_l the level's group size and
//!   B_l the batched rings of that stage (run one after another on the level stream);
//! - ho-ring: every level busy at once: `max_l B_l(g_l-1)(q·α_l + c/β_l)` plus a
//!   pipeline fill of one piece (c/q) per level step, q the pieces per chunk.
//!
//! So `hier` wins on multi-node communicators whenever inter-node links are slower than
//! intra-node ones and messages are not latency-bound; one-node or one-rank-per-node
//! communicators always get `ring`.

use super::qgz::{Qgz, Qgz1};
use super::qwz::Qwz;
use super::{hierarchical::Hier, ho_ring::HoRing, Algo, Algorithm, Native};
use crate::comm::request::{Op, Request};
use crate::comm::Comm;
use crate::comm::Hierarchy;
use crate::topology::{LinkClass, Topology};

static NATIVE: Native = Native;
static HIER: Hier = Hier;
static HO_RING: HoRing = HoRing;
static QGZ: Qgz = Qgz;
static QGZ1: Qgz1 = Qgz1;
static QWZ: Qwz = Qwz;

/// The algorithm that will run `req` on `comm`, and why.
pub fn choose(comm: &Comm, req: &Request) -> (&'static dyn Algorithm, String) {
    let wanted = req.algo.unwrap_or(comm.config().algo);
    let named: Option<&'static dyn Algorithm> = match wanted {
        Algo::Ring => return (&NATIVE, "ring requested".into()),
        Algo::Hier => Some(&HIER),
        Algo::HoRing => Some(&HO_RING),
        Algo::Qgz => Some(&QGZ),
        Algo::Qgz1 => Some(&QGZ1),
        Algo::Qwz => Some(&QWZ),
        Algo::Auto => None,
    };
    if let Some(a) = named {
        return match a.unsupported(comm, req) {
            None => (a, format!("{} requested", a.algo())),
            Some(why) => {
                tracing::info!(
                    rank = comm.rank(),
                    op = req.op.name(),
                    "{} falls back to ring: {why}",
                    a.algo()
                );
                (
                    &NATIVE,
                    format!("{} not applicable ({why}); native fallback", a.algo()),
                )
            }
        };
    }
    if HIER.unsupported(comm, req).is_some() {
        return (
            &NATIVE,
            "auto: hierarchical algorithms not applicable".into(),
        );
    }
    let (ring, hier, ho) = estimates(comm, req);
    if ho < hier && ho < ring {
        (
            &HO_RING,
            format!("auto: ho-ring {ho:.1}us < hier {hier:.1}us, ring {ring:.1}us"),
        )
    } else if hier < ring {
        (&HIER, format!("auto: hier {hier:.1}us < ring {ring:.1}us"))
    } else {
        (
            &NATIVE,
            format!("auto: ring {ring:.1}us <= hier {hier:.1}us"),
        )
    }
}

/// Modeled (ring, hier, ho-ring) times in microseconds for `req` on `comm`.
pub fn estimates(comm: &Comm, req: &Request) -> (f64, f64, f64) {
    let p = comm.size();
    let (count, factor) = match &req.op {
        Op::AllGather { count, .. } | Op::ReduceScatter { count, .. } => (*count, 1.0),
        Op::AllReduce { count, .. } => (count.div_ceil(p.max(1)), 2.0),
        _ => (0, 1.0),
    };
    estimate(
        comm.topology(),
        comm.members(),
        comm.hierarchy(),
        count,
        factor,
        req.dtype.size(),
        comm.config().ho_ring_chunks,
    )
}

/// [`estimates`] without a communicator (used by the simulator's dry run): `members`
/// are the world ranks in communicator order, `h` their hierarchy, `count` elements of
/// `elem` bytes per rank chunk, `factor` 1 (all-gather, reduce-scatter) or 2
/// (all-reduce), `chunks` the configured ho-ring pieces.
pub fn estimate(
    topo: &Topology,
    members: &[usize],
    h: Option<&Hierarchy>,
    count: usize,
    factor: f64,
    elem: usize,
    chunks: Option<usize>,
) -> (f64, f64, f64) {
    let p = members.len();
    let c = (count * elem) as f64;
    let step = |class: LinkClass, bytes: f64| {
        let l = topo.links.get(class);
        l.latency_us + bytes / (l.bandwidth_gbs * 1e3)
    };
    let slowest = (0..p)
        .map(|r| topo.link_class(members[r], members[(r + 1) % p]))
        .max()
        .unwrap_or(LinkClass::IntraPackage);
    let ring = factor * (p.saturating_sub(1)) as f64 * step(slowest, c);
    let (mut hier, mut ho) = (f64::INFINITY, f64::INFINITY);
    if let Some(h) = h {
        let q = chunks.unwrap_or_else(|| super::plan::default_chunks(c as usize)) as f64;
        let (mut batch, mut sum, mut busiest, mut fill) = (1usize, 0.0, 0.0f64, 0.0);
        for (level, g) in &h.levels {
            let l = topo.links.get(level.link_class());
            let steps = (batch * (g - 1)) as f64;
            // hier: the stage's rings one after another; ho-ring: every level busy at
            // once (in pieces of c/q), plus the pipeline's fill of one piece per level.
            sum += steps * (l.latency_us + c / (l.bandwidth_gbs * 1e3));
            busiest = busiest.max(steps * (q * l.latency_us + c / (l.bandwidth_gbs * 1e3)));
            fill += (g - 1) as f64 * (l.latency_us + c / q / (l.bandwidth_gbs * 1e3));
            batch *= g;
        }
        hier = factor * sum;
        ho = factor * (busiest + fill);
    }
    (ring, hier, ho)
}

/// The `auto` pick among (ring, hier, ho-ring) estimates: the same comparison as
/// [`choose`] (ho-ring when strictly cheapest, else hier when cheaper than ring).
pub fn auto_pick((ring, hier, ho): (f64, f64, f64)) -> Algo {
    if ho < hier && ho < ring {
        Algo::HoRing
    } else if hier < ring {
        Algo::Hier
    } else {
        Algo::Ring
    }
}
