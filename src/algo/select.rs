//! The `auto` rule and algorithm selection.
//!
//! Order of precedence: the request's own hint, then `STRATA_ALGO` / the communicator's
//! configured algorithm, then `auto`. A chosen algorithm whose constraints do not hold
//! falls back to the native collective (`ring`), with the reason logged at INFO.
//!
//! `auto` compares alpha-beta estimates built from the topology's link table (the figures
//! of [`crate::topology::presets`]) and picks the cheaper of `ring` and `hier`:
//! - ring over p ranks: `(p-1) · (α_s + c/β_s)`, where s is the slowest link class the
//!   ring crosses and c the per-rank chunk (all-gather, reduce-scatter; twice that for
//!   all-reduce);
//! - hier: `Σ_levels (g_l - 1) · (α_l + B_l·c/β_l)` with g_l the level's group size and
//!   B_l the chunks each rank moves per step at that level (the batched launches of one
//!   stage run as one group).
//!
//! So `hier` wins on multi-node communicators whenever inter-node links are slower than
//! intra-node ones and messages are not latency-bound; one-node or one-rank-per-node
//! communicators always get `ring`.

use super::{hierarchical::Hier, Algo, Algorithm, Native};
use crate::comm::request::{Op, Request};
use crate::comm::Comm;
use crate::topology::LinkClass;

static NATIVE: Native = Native;
static HIER: Hier = Hier;

/// The algorithm that will run `req` on `comm`, and why.
pub fn choose(comm: &Comm, req: &Request) -> (&'static dyn Algorithm, String) {
    let wanted = req.algo.unwrap_or(comm.config().algo);
    match wanted {
        Algo::Ring => (&NATIVE, "ring requested".into()),
        Algo::Hier => match HIER.unsupported(comm, req) {
            None => (&HIER, "hier requested".into()),
            Some(why) => {
                tracing::info!(
                    rank = comm.rank(),
                    op = req.op.name(),
                    "hier falls back to ring: {why}"
                );
                (
                    &NATIVE,
                    format!("hier not applicable ({why}); native fallback"),
                )
            }
        },
        Algo::Auto => {
            if HIER.unsupported(comm, req).is_some() {
                return (&NATIVE, "auto: hier not applicable".into());
            }
            let (ring, hier) = estimates(comm, req);
            if hier < ring {
                (&HIER, format!("auto: hier {hier:.1}us < ring {ring:.1}us"))
            } else {
                (
                    &NATIVE,
                    format!("auto: ring {ring:.1}us <= hier {hier:.1}us"),
                )
            }
        }
    }
}

/// Modeled (ring, hier) times in microseconds for `req` on `comm`.
pub fn estimates(comm: &Comm, req: &Request) -> (f64, f64) {
    let topo = comm.topology();
    let p = comm.size();
    let (count, factor) = match &req.op {
        Op::AllGather { count, .. } | Op::ReduceScatter { count, .. } => (*count, 1.0),
        Op::AllReduce { count, .. } => (count.div_ceil(p.max(1)), 2.0),
        _ => (0, 1.0),
    };
    let c = (count * req.dtype.size()) as f64;
    let step = |class: LinkClass, bytes: f64| {
        let l = topo.links.get(class);
        l.latency_us + bytes / (l.bandwidth_gbs * 1e3)
    };
    let slowest = (0..p)
        .map(|r| topo.link_class(comm.world_rank(r), comm.world_rank((r + 1) % p)))
        .max()
        .unwrap_or(LinkClass::IntraPackage);
    let ring = factor * (p.saturating_sub(1)) as f64 * step(slowest, c);
    let hier = match comm.hierarchy() {
        Some(h) => {
            let mut batch = 1usize;
            let mut t = 0.0;
            for (level, g) in &h.levels {
                t += (g - 1) as f64 * step(level.link_class(), batch as f64 * c);
                batch *= g;
            }
            factor * t
        }
        None => f64::INFINITY,
    };
    (ring, hier)
}
