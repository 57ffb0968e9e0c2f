//! Plans: an algorithm written as each rank's list of ring steps (one send + one
//! receive, optionally reducing) on the communicators of its hierarchy levels, with the
//! steps of other levels each must wait for. One plan drives two things:
//!
//! - execution ([`execute`]): every step becomes a nonblocking `SendRecv` request on its
//!   level's communicator, with the `Work` of the steps it waits for as dependencies,
//!   so the levels' streams run at the same time (HO-Ring's overlap);
//! - the schedule ([`crate::sim`]): the plans of all ranks, built without any data or
//!   threads, become a dependency graph of transfers that the simulator replays.
//!
//! `ring` and `hier` run through their own code (native collectives, batched
//! sub-communicator calls); their plans here describe exactly the transfers that code
//! makes (same peers, bytes and order; `tests/schedule.rs` checks the bytes against the
//! measured traffic) so that every algorithm can be modeled.

pub use super::step_list::{
    default_chunks, execute, index, pieces, then, BufId, Plan, Ring, Span, Step,
};
use crate::topology::Hierarchy;

/// Ring neighbours (next, prev) of index `x` in a ring of `g`.
fn nbrs(x: usize, g: usize) -> (usize, usize) {
    ((x + 1) % g, (x + g - 1) % g)
}

/// The flat ring all-gather (p-1 steps over the whole communicator) of `c` bytes per rank.
pub fn ring_all_gather(p: usize, rank: usize, c: usize) -> Plan {
    let (dst, src) = nbrs(rank, p);
    let steps = (0..p.saturating_sub(1))
        .map(|t| Step {
            ring: Ring::Flat,
            dst,
            src,
            send: Span {
                buf: BufId::Recv,
                off: ((rank + p - t) % p) * c,
                len: c,
            },
            recv: Span {
                buf: BufId::Recv,
                off: ((rank + 2 * p - t - 1) % p) * c,
                len: c,
            },
            reduce: false,
            deps: vec![],
        })
        .collect();
    Plan { steps }
}

/// The flat ring reduce-scatter of `c` bytes per rank (the ring of `algo::ring`).
pub fn ring_reduce_scatter(p: usize, rank: usize, c: usize) -> Plan {
    let (dst, src) = nbrs(rank, p);
    let steps = (0..p.saturating_sub(1))
        .map(|t| Step {
            ring: Ring::Flat,
            dst,
            src,
            send: Span {
                buf: BufId::Work,
                off: ((rank + 2 * p - t - 1) % p) * c,
                len: c,
            },
            recv: Span {
                buf: BufId::Work,
                off: ((rank + 2 * p - t - 2) % p) * c,
                len: c,
            },
            reduce: true,
            deps: vec![],
        })
        .collect();
    Plan { steps }
}

/// The flat ring all-reduce: reduce-scatter then all-gather over near-equal element
/// chunks of `count` elements of `s` bytes.
pub fn ring_all_reduce(p: usize, rank: usize, count: usize, s: usize) -> Plan {
    let r = crate::transport::ring::even_ranges(count, p, s);
    let (dst, src) = nbrs(rank, p);
    let sp = |k: usize| Span {
        buf: BufId::Work,
        off: r[k % p].start,
        len: r[k % p].len(),
    };
    let mut steps = Vec::new();
    for t in 0..p.saturating_sub(1) {
        steps.push(Step {
            ring: Ring::Flat,
            dst,
            src,
            send: sp(rank + 2 * p - t - 1),
            recv: sp(rank + 2 * p - t - 2),
            reduce: true,
            deps: vec![],
        });
    }
    for t in 0..p.saturating_sub(1) {
        steps.push(Step {
            ring: Ring::Flat,
            dst,
            src,
            send: sp(rank + p - t),
            recv: sp(rank + 2 * p - t - 1),
            reduce: false,
            deps: vec![],
        });
    }
    Plan { steps }
}

/// `hier` all-gather as executed by `algo::hierarchical`: levels outermost first, at
/// level i a batch of `B_i` rings of `g_i - 1` steps run one after another on the level
/// stream; each level waits for the previous one to finish. With `log0` the inter-node
/// stage (level 0, `B_0 = 1`) is the log-step all-gather instead of a ring.
pub fn hier_all_gather(h: &Hierarchy, rank: usize, c: usize, log0: bool) -> Plan {
    hier_stages(h, rank, c, false, log0)
}

/// `hier` reduce-scatter as executed: levels innermost first, batches of rings (the
/// last, inter-node stage log-step with `log0`).
pub fn hier_reduce_scatter(h: &Hierarchy, rank: usize, c: usize, log0: bool) -> Plan {
    hier_stages(h, rank, c, true, log0)
}

/// The stages of `hier`: all-gather rings (outermost level first) or reduce-scatter
/// rings (innermost first, each step one chunk further back and reducing).
fn hier_stages(h: &Hierarchy, rank: usize, c: usize, reduce: bool, log0: bool) -> Plan {
    let sizes = h.sizes();
    let x = h.coords(rank);
    let order: Vec<usize> = if reduce {
        (0..sizes.len()).rev().collect()
    } else {
        (0..sizes.len()).collect()
    };
    let (shift, buf) = if reduce {
        (1, BufId::Work)
    } else {
        (0, BufId::Recv)
    };
    let mut plan = Plan::default();
    let mut last: Option<usize> = None;
    for i in order {
        let g = sizes[i];
        if i == 0 && log0 {
            let stage = if reduce {
                super::log_step::reduce_scatter_plan(Ring::Level(0), g, x[0], c)
            } else {
                super::log_step::all_gather_plan(Ring::Level(0), g, x[0], c)
            };
            let n = stage.steps.len();
            for (k, mut st) in stage.steps.into_iter().enumerate() {
                if k == 0 {
                    st.deps = last.into_iter().collect();
                }
                plan.steps.push(st);
            }
            if n > 0 {
                last = Some(plan.steps.len() - 1);
            }
            continue;
        }
        let b: usize = sizes[..i].iter().product();
        let (dst, src) = nbrs(x[i], g);
        let mut this_last = last;
        for j in 0..b {
            for t in 0..g - 1 {
                let deps = if j == 0 && t == 0 {
                    last.into_iter().collect()
                } else {
                    vec![]
                };
                // Positions inside the stage's buffer; only lengths matter to the model.
                let so = (j * g + (x[i] + 2 * g - t - shift) % g) * c;
                let ro = (j * g + (x[i] + 2 * g - t - 1 - shift) % g) * c;
                plan.steps.push(Step {
                    ring: Ring::Level(i),
                    dst,
                    src,
                    send: Span {
                        buf,
                        off: so,
                        len: c,
                    },
                    recv: Span {
                        buf,
                        off: ro,
                        len: c,
                    },
                    reduce,
                    deps,
                });
                this_last = Some(plan.steps.len() - 1);
            }
        }
        last = this_last;
    }
    plan
}

/// `hier` all-reduce: reduce-scatter then all-gather of `ceil(count/p)` elements each.
pub fn hier_all_reduce(h: &Hierarchy, rank: usize, count: usize, s: usize, log0: bool) -> Plan {
    let p: usize = h.sizes().iter().product();
    let c = count.div_ceil(p.max(1)) * s;
    then(
        hier_reduce_scatter(h, rank, c, log0),
        hier_all_gather(h, rank, c, log0),
    )
}

/// The flat log-step all-reduce: its reduce-scatter then its all-gather of
/// `ceil(count/p)` elements each, on [`Ring::Flat`].
pub fn log_all_reduce(p: usize, rank: usize, count: usize, s: usize) -> Plan {
    let c = count.div_ceil(p.max(1)) * s;
    then(
        super::log_step::reduce_scatter_plan(Ring::Flat, p, rank, c),
        super::log_step::all_gather_plan(Ring::Flat, p, rank, c),
    )
}
