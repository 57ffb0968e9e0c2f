//! A plan's vocabulary: the buffers, spans, rings and steps an algorithm is written in
//! as each rank's list of ring steps ([`super::plan`] builds the plans of the techniques),
//! and their execution on a communicator's level communicators ([`execute`]).

#![forbid(unsafe_code)]

use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::memory::Buffer;
use crate::runtime::{CommCore, Op, Work};

/// Which of a plan's buffers a span lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufId {
    /// The caller's receive buffer (all-gather output).
    Recv,
    /// A work buffer the algorithm allocates (reduce-scatter / all-reduce accumulator).
    Work,
}

/// A byte range of a plan buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub buf: BufId,
    pub off: usize,
    pub len: usize,
}

/// Which communicator a step runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ring {
    /// Level `i` of the hierarchy (the level communicator, ranks = level indices).
    Level(usize),
    /// The whole communicator (flat ring; modeled only, executed natively).
    Flat,
    /// Ring `c` of NCCL's channel rings over the whole communicator
    /// ([`crate::topology::channels`]; ranks = positions in that ring). Modeled only:
    /// the native collective runs them.
    Channel(usize),
}

/// One step: send `send` to `dst` and receive into `recv` from `src` (ranks within the
/// step's ring communicator), reducing into `recv` when `reduce`.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub ring: Ring,
    pub dst: usize,
    pub src: usize,
    pub send: Span,
    pub recv: Span,
    pub reduce: bool,
    /// Earlier steps of this plan (on other rings) that must finish first. Steps on the
    /// same ring run in plan order anyway.
    pub deps: Vec<usize>,
}

/// One rank's plan.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub steps: Vec<Step>,
}

/// The element ranges (in elements) a chunk of `count` elements is pipelined in.
pub fn pieces(count: usize, chunks: usize) -> Vec<(usize, usize)> {
    let q = chunks.clamp(1, count.max(1));
    crate::transport::ring::even_ranges(count, q, 1)
        .into_iter()
        .map(|r| (r.start, r.len()))
        .filter(|p| p.1 > 0)
        .collect()
}

/// Default pieces per chunk for pipelined algorithms: `round(sqrt(chunk / 128 KiB))`,
/// 1 to 16. Every piece pays a per-step latency on each ring step while the pipeline
/// fills in 1/q of a chunk's time, so the best piece count grows with the square root
/// of the chunk size (the classic pipelining optimum). The 128 KiB constant was chosen
/// on the modeled DGX A100, p3dn and Frontier clusters (docs/simulator.md).
pub fn default_chunks(chunk_bytes: usize) -> usize {
    ((chunk_bytes as f64 / (128 << 10) as f64).sqrt().round() as usize).clamp(1, 16)
}

/// Row-major index of level coordinates.
pub fn index(sizes: &[usize], coords: &[usize]) -> usize {
    sizes.iter().zip(coords).fold(0, |acc, (g, x)| acc * g + x)
}

/// Run `plan` on `comm`'s level communicators: enqueue every step in plan order (each
/// after the steps it depends on), then wait for all. `bufs` gives the buffer for each `BufId` (`Recv`, `Work`).
pub fn execute(
    comm: &CommCore,
    plan: &Plan,
    recv: &Buffer,
    work: Option<&Buffer>,
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    let levels = comm.hierarchy().map(|h| h.levels.len()).unwrap_or(0);
    let comms: Vec<CommCore> = (0..levels).map(|i| comm.level(i)).collect::<Result<_>>()?;
    let s = dtype.size();
    let buf = |sp: &Span| -> Result<Buffer> {
        let b = match sp.buf {
            BufId::Recv => recv,
            BufId::Work => work.ok_or_else(|| {
                Error::Internal("plan uses a work buffer it was not given".into())
            })?,
        };
        b.slice(sp.off..sp.off + sp.len)
    };
    let mut works: Vec<Work> = Vec::with_capacity(plan.steps.len());
    for st in &plan.steps {
        let Ring::Level(i) = st.ring else {
            return Err(Error::Internal(
                "flat plan steps are modeled, not executed".into(),
            ));
        };
        let op = Op::SendRecv {
            send: buf(&st.send)?,
            recv: buf(&st.recv)?,
            count: st.send.len / s,
            dst: st.dst,
            src: st.src,
            reduce: st.reduce.then_some(op),
        };
        let deps = st.deps.iter().map(|&d| works[d].clone()).collect();
        works.push(comms[i].enqueue(op, dtype, deps));
    }
    let mut first: Result<()> = Ok(());
    for w in &works {
        if let Err(e) = w.wait() {
            if first.is_ok() {
                first = Err(e);
            }
        }
    }
    first
}

/// `a` then `b`: `b`'s first step also waits for `a`'s last (they may run on other
/// rings), `b`'s own dependencies shifted past `a`'s steps.
pub fn then(mut a: Plan, b: Plan) -> Plan {
    let n = a.steps.len();
    for (k, mut st) in b.steps.into_iter().enumerate() {
        st.deps = st.deps.iter().map(|d| d + n).collect();
        if k == 0 && n > 0 {
            st.deps.push(n - 1);
        }
        a.steps.push(st);
    }
    a
}
