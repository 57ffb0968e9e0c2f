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

/// This rank's place on one ring of its plan: the ring and its neighbours there.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingPos {
    ring: Ring,
    x: usize,
    g: usize,
    dst: usize,
    src: usize,
}

impl RingPos {
    /// Index `x` of ring `ring` of `g` ranks: it sends to `x + 1` and receives from
    /// `x - 1` (mod `g`).
    pub(crate) fn new(ring: Ring, x: usize, g: usize) -> Self {
        RingPos {
            ring,
            x,
            g,
            dst: (x + 1) % g,
            src: (x + g - 1) % g,
        }
    }

    /// The step that sends `len` bytes of `buf` at `send` to the next rank and receives
    /// `len` bytes from the previous one at `recv` of `buf` (reducing into it when
    /// `reduce`), after the plan's steps `deps`.
    pub(crate) fn step(
        &self,
        buf: BufId,
        send: usize,
        recv: usize,
        len: usize,
        reduce: bool,
        deps: Vec<usize>,
    ) -> Step {
        let span = |off: usize| Span { buf, off, len };
        self.spans_step(span(send), span(recv), reduce, deps)
    }

    /// The step that sends `send` to the next rank and receives `recv` from the previous
    /// one (reducing into it when `reduce`), after the plan's steps `deps`.
    fn spans_step(&self, send: Span, recv: Span, reduce: bool, deps: Vec<usize>) -> Step {
        Step {
            ring: self.ring,
            dst: self.dst,
            src: self.src,
            send,
            recv,
            reduce,
            deps,
        }
    }

    /// The `g - 1` steps of one pass of the ring over its `g` chunks of `c` bytes, from
    /// chunk `first` on: all-gather into `Recv` (step t sends chunk x - t and receives
    /// x - t - 1), or with `reduce` reduce-scatter in `Work` (each step one chunk further
    /// back).
    fn pass(&self, first: usize, c: usize, reduce: bool) -> Vec<Step> {
        let (x, g) = (self.x, self.g);
        let (shift, buf) = if reduce {
            (1, BufId::Work)
        } else {
            (0, BufId::Recv)
        };
        let chunk = |back: usize| (first + (x + 2 * g - back) % g) * c;
        (0..g.saturating_sub(1))
            .map(|t| {
                self.step(
                    buf,
                    chunk(t + shift),
                    chunk(t + 1 + shift),
                    c,
                    reduce,
                    vec![],
                )
            })
            .collect()
    }
}

/// The flat ring all-gather (p-1 steps over the whole communicator) of `c` bytes per rank.
pub fn ring_all_gather(p: usize, rank: usize, c: usize) -> Plan {
    let steps = RingPos::new(Ring::Flat, rank, p).pass(0, c, false);
    Plan { steps }
}

/// The flat ring reduce-scatter of `c` bytes per rank (the ring of `algo::ring`).
pub fn ring_reduce_scatter(p: usize, rank: usize, c: usize) -> Plan {
    let steps = RingPos::new(Ring::Flat, rank, p).pass(0, c, true);
    Plan { steps }
}

/// The flat ring all-reduce: reduce-scatter then all-gather over near-equal element
/// chunks of `count` elements of `s` bytes.
pub fn ring_all_reduce(p: usize, rank: usize, count: usize, s: usize) -> Plan {
    let r = crate::transport::ring::even_ranges(count, p, s);
    let pos = RingPos::new(Ring::Flat, rank, p);
    let sp = |k: usize| Span {
        buf: BufId::Work,
        off: r[k % p].start,
        len: r[k % p].len(),
    };
    let step =
        |send: usize, recv: usize, reduce: bool| pos.spans_step(sp(send), sp(recv), reduce, vec![]);
    let rounds = 0..p.saturating_sub(1);
    let mut steps: Vec<Step> = rounds
        .clone()
        .map(|t| step(rank + 2 * p - t - 1, rank + 2 * p - t - 2, true))
        .collect();
    steps.extend(rounds.map(|t| step(rank + p - t, rank + 2 * p - t - 1, false)));
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
    let mut plan = Plan::default();
    let mut last: Option<usize> = None;
    for i in order {
        let g = sizes[i];
        let first = plan.steps.len();
        if i == 0 && log0 {
            let stage = if reduce {
                super::log_step::reduce_scatter_plan(Ring::Level(0), g, x[0], c)
            } else {
                super::log_step::all_gather_plan(Ring::Level(0), g, x[0], c)
            };
            plan.steps.extend(stage.steps);
        } else {
            // Positions inside the stage's buffer; only lengths matter to the model.
            let pos = RingPos::new(Ring::Level(i), x[i], g);
            for j in 0..sizes[..i].iter().product() {
                plan.steps.extend(pos.pass(j * g, c, reduce));
            }
        }
        // The stage starts once the previous one has finished.
        if let Some(st) = plan.steps.get_mut(first) {
            st.deps = last.into_iter().collect();
        }
        if plan.steps.len() > first {
            last = Some(plan.steps.len() - 1);
        }
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
