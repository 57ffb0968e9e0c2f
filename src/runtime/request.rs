//! The request descriptor every collective becomes, and the checks it passes before
//! dispatch (NCCL's ncclEnqueueCheck is the model): counts, overflow, buffer sizes,
//! peers, and NCCL's in-place and aliasing rules (the one rule: [`Kind::in_place`],
//! applied to buffers by [`in_place`]).
//!
//! Each request is checked once, and its in-place layout derived once, into a
//! [`Checked`] value, the only form the communicator's run and launch paths take:
//! - a request built in Rust is checked at the front ([`crate::Comm::submit`]:
//!   [`Checked::new`], [`check`]), which derives the layout from the buffer views;
//! - a request built by the C ABI was checked on the caller's raw pointers, where the
//!   layout was derived (it has to be: an in-place call becomes one buffer and a view of
//!   it); the C boundary hands it over as a [`Checked`] request (`Checked::assume`,
//!   then `Comm::submit_checked` and its kin), not checked again.
//!
//! Either way the layout is then recorded in the op's buffers (in place: the send and
//! receive buffers are views of one allocation, at NCCL's offset; otherwise they do not
//! overlap), and execution reads it back ([`Op::layout`]) instead of applying the rule
//! again.

#![forbid(unsafe_code)]

use super::stream::Work;
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::kinds::{Algo, InPlace, Kind};
use crate::memory::Buffer;

/// One collective or point-to-point operation. Counts are in elements of the request's
/// dtype; buffers may be longer than needed (the prefix is used).
#[derive(Debug, Clone)]
pub enum Op {
    /// `recv` (size·count) = everyone's `send` (count), rank-major. In place when `send`
    /// is `recv[rank·count..]`.
    AllGather {
        send: Buffer,
        recv: Buffer,
        count: usize,
    },
    /// `recv` (count) = reduction over ranks of `send[rank·count..]` (send: size·count).
    /// In place when `recv` is `send[rank·count..]`.
    ReduceScatter {
        send: Buffer,
        recv: Buffer,
        count: usize,
        op: ReduceOp,
    },
    /// `recv` (count) = reduction of everyone's `send` (count). In place when equal.
    AllReduce {
        send: Buffer,
        recv: Buffer,
        count: usize,
        op: ReduceOp,
    },
    /// Block j (count elements) of `send` goes to rank j; block i of `recv` comes from rank i.
    AllToAll {
        send: Buffer,
        recv: Buffer,
        count: usize,
    },
    /// `recv` (count) on every rank = `send` of `root` (send is read on the root only).
    Broadcast {
        send: Buffer,
        recv: Buffer,
        count: usize,
        root: usize,
    },
    /// Point-to-point send of `count` elements to `peer`.
    Send {
        buf: Buffer,
        count: usize,
        peer: usize,
    },
    /// Point-to-point receive of `count` elements from `peer`.
    Recv {
        buf: Buffer,
        count: usize,
        peer: usize,
    },
    /// One ring step (grouped ncclSend + ncclRecv): send `count` elements of `send` to
    /// `dst` while receiving `count` from `src` into `recv`, overwriting it, or, with
    /// `reduce: Some(op)`, combining the received values into `recv` (partial op: `Avg`
    /// sums). `send` and `recv` must not overlap.
    SendRecv {
        send: Buffer,
        recv: Buffer,
        count: usize,
        dst: usize,
        src: usize,
        reduce: Option<ReduceOp>,
    },
    /// MiCS §4 coalesced all-gather: `recvs[i]` (`size·counts[i]`) gathers `sends[i]`
    /// (`counts[i]`) for every i, in one launch.
    AllGatherCoalesced {
        sends: Vec<Buffer>,
        recvs: Vec<Buffer>,
        counts: Vec<usize>,
    },
    /// MiCS §4 coalesced reduce-scatter: `recvs[i]` (`counts[i]`) from `sends[i]` (`size·counts[i]`).
    ReduceScatterCoalesced {
        sends: Vec<Buffer>,
        recvs: Vec<Buffer>,
        counts: Vec<usize>,
        op: ReduceOp,
    },
}

impl Op {
    /// Short name (`all-gather`, ...), as on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Op::AllGather { .. } => "all-gather",
            Op::ReduceScatter { .. } => "reduce-scatter",
            Op::AllReduce { .. } => "all-reduce",
            Op::AllToAll { .. } => "all-to-all",
            Op::Broadcast { .. } => "broadcast",
            Op::Send { .. } => "send",
            Op::Recv { .. } => "recv",
            Op::SendRecv { .. } => "send-recv",
            Op::AllGatherCoalesced { .. } => "all-gather-coalesced",
            Op::ReduceScatterCoalesced { .. } => "reduce-scatter-coalesced",
        }
    }

    /// Every buffer the op names.
    pub fn for_each_buffer<'a>(&'a self, f: &mut dyn FnMut(&'a Buffer)) {
        self.any_buffer(|b| {
            f(b);
            false
        });
    }

    /// True when `f` holds for one of the op's buffers, visited in
    /// [`Op::for_each_buffer`]'s order up to the first that does.
    #[inline]
    fn any_buffer<'a>(&'a self, mut f: impl FnMut(&'a Buffer) -> bool) -> bool {
        match self {
            Op::AllGather { send, recv, .. }
            | Op::ReduceScatter { send, recv, .. }
            | Op::AllReduce { send, recv, .. }
            | Op::AllToAll { send, recv, .. }
            | Op::Broadcast { send, recv, .. }
            | Op::SendRecv { send, recv, .. } => f(send) || f(recv),
            Op::Send { buf, .. } | Op::Recv { buf, .. } => f(buf),
            Op::AllGatherCoalesced { sends, recvs, .. }
            | Op::ReduceScatterCoalesced { sends, recvs, .. } => sends.iter().chain(recvs).any(f),
        }
    }

    /// True for the coalesced ops (a list of buffers each side).
    #[inline]
    pub fn is_coalesced(&self) -> bool {
        matches!(
            self,
            Op::AllGatherCoalesced { .. } | Op::ReduceScatterCoalesced { .. }
        )
    }

    /// True when any of the op's buffers has a byte (a count-0 call moves nothing).
    #[inline]
    pub fn has_bytes(&self) -> bool {
        self.any_buffer(|b| !b.is_empty())
    }

    /// The device of the op's buffers (`None`: host memory). Empty buffers do not count
    /// (a non-root's broadcast input may be anything).
    pub fn device(&self) -> Option<std::sync::Arc<dyn crate::device::Device>> {
        let mut d = None;
        self.for_each_buffer(&mut |b| {
            if d.is_none() && !b.is_empty() {
                d = b.device().cloned();
            }
        });
        d
    }

    /// The collective kind of a single-buffer collective (`None`: point-to-point and
    /// coalesced ops).
    pub fn kind(&self) -> Option<Kind> {
        Some(match self {
            Op::AllGather { .. } => Kind::AllGather,
            Op::ReduceScatter { .. } => Kind::ReduceScatter,
            Op::AllReduce { .. } => Kind::AllReduce,
            Op::AllToAll { .. } => Kind::AllToAll,
            Op::Broadcast { root, .. } => Kind::Broadcast { root: *root },
            _ => return None,
        })
    }

    /// True when this collective is in NCCL's in-place layout on `rank` ([`in_place`]):
    /// the rule applied to the buffer views. Execution reads the recorded layout instead
    /// ([`Op::layout`]).
    pub fn is_in_place(&self, rank: usize, dtype: DataType) -> bool {
        match self {
            Op::AllGather { send, recv, count }
            | Op::ReduceScatter {
                send, recv, count, ..
            }
            | Op::AllReduce {
                send, recv, count, ..
            }
            | Op::Broadcast {
                send, recv, count, ..
            }
            | Op::AllToAll { send, recv, count } => self
                .kind()
                .is_some_and(|k| in_place(k, send, recv, rank, count * dtype.size())),
            _ => false,
        }
    }

    /// The in-place layout recorded in a checked op's buffers: where its send buffer lies
    /// in its receive buffer (all-gather), its receive buffer in its send buffer
    /// (reduce-scatter), or both are the same bytes (all-reduce, broadcast); `None` for
    /// separate buffers and for every other op. No rule is applied: [`check`] (or the C
    /// boundary) let through no overlap but NCCL's in-place layout on this rank, so a
    /// checked op's containment *is* that layout.
    #[inline]
    pub fn layout(&self) -> Option<InPlace> {
        match self {
            Op::AllGather { send, recv, .. } if !send.is_empty() => send
                .offset_in(recv)
                .map(|offset| InPlace::SendInRecv { offset }),
            Op::ReduceScatter { send, recv, .. } if !recv.is_empty() => recv
                .offset_in(send)
                .map(|offset| InPlace::RecvInSend { offset }),
            Op::AllReduce { send, recv, .. } | Op::Broadcast { send, recv, .. }
                if !send.is_empty() =>
            {
                (send.offset_in(recv) == Some(0) || recv.offset_in(send) == Some(0))
                    .then_some(InPlace::Same)
            }
            _ => None,
        }
    }

    /// The reduction op, where there is one.
    pub fn redop(&self) -> Option<ReduceOp> {
        match self {
            Op::ReduceScatter { op, .. }
            | Op::AllReduce { op, .. }
            | Op::ReduceScatterCoalesced { op, .. } => Some(*op),
            _ => None,
        }
    }
}

/// A collective kind as an operation.
impl Kind {
    /// The request for this collective on prepared buffers.
    pub fn op(self, send: Buffer, recv: Buffer, count: usize, redop: ReduceOp) -> Op {
        match self {
            Kind::AllGather => Op::AllGather { send, recv, count },
            Kind::ReduceScatter => Op::ReduceScatter {
                send,
                recv,
                count,
                op: redop,
            },
            Kind::AllReduce => Op::AllReduce {
                send,
                recv,
                count,
                op: redop,
            },
            Kind::AllToAll => Op::AllToAll { send, recv, count },
            Kind::Broadcast { root } => Op::Broadcast {
                send,
                recv,
                count,
                root,
            },
        }
    }

    /// The coalesced request for this collective on prepared buffers (one of `counts[i]`
    /// elements per pair `sends[i]`, `recvs[i]`): an all-gather or a reduce-scatter;
    /// another kind has no coalesced form (`InvalidArgument`).
    pub fn coalesced(
        self,
        sends: Vec<Buffer>,
        recvs: Vec<Buffer>,
        counts: Vec<usize>,
        redop: ReduceOp,
    ) -> crate::error::Result<Op> {
        match self {
            Kind::AllGather => Ok(Op::AllGatherCoalesced {
                sends,
                recvs,
                counts,
            }),
            Kind::ReduceScatter => Ok(Op::ReduceScatterCoalesced {
                sends,
                recvs,
                counts,
                op: redop,
            }),
            k => Err(crate::error::Error::InvalidArgument(format!(
                "{} has no coalesced form",
                k.name()
            ))),
        }
    }
}

/// A checked-or-to-be-checked request: the op, its dtype, an optional algorithm hint
/// (overrides the communicator's default and `STRATA_ALGO`), and work on other
/// communicators that must finish first.
#[derive(Debug, Clone)]
pub struct Request {
    pub op: Op,
    pub dtype: DataType,
    pub algo: Option<Algo>,
    pub deps: Vec<Work>,
    /// Wire format of the quantized algorithms (`qgz`, `qwz`); `None`: their defaults
    /// (qgz int4, qwz int8, blocks of 256).
    pub quant: Option<crate::kernels::QuantSpec>,
}

impl Request {
    /// A request with no hint and no dependencies.
    pub fn new(op: Op, dtype: DataType) -> Request {
        Request {
            op,
            dtype,
            algo: None,
            deps: Vec::new(),
            quant: None,
        }
    }

    /// With a quantization format for `qgz` / `qwz`.
    pub fn with_quant(mut self, q: crate::kernels::QuantSpec) -> Request {
        self.quant = Some(q);
        self
    }

    /// With an algorithm hint.
    pub fn with_algo(mut self, a: Algo) -> Request {
        self.algo = Some(a);
        self
    }

    /// With dependencies.
    pub fn after(mut self, deps: impl IntoIterator<Item = Work>) -> Request {
        self.deps.extend(deps);
        self
    }
}

/// NCCL's in-place rule ([`Kind::in_place`]) applied to buffer views: true when
/// `send` and `recv` are views of one allocation laid out as `kind` requires for
/// `rank` with `chunk` bytes per rank.
pub fn in_place(kind: Kind, send: &Buffer, recv: &Buffer, rank: usize, chunk: usize) -> bool {
    let diff = match (send.offset_in(recv), recv.offset_in(send)) {
        (Some(o), _) => o as i128,
        (None, Some(o)) => -(o as i128),
        (None, None) => return false,
    };
    kind.in_place(rank, chunk).is_some_and(|l| l.matches(diff))
}

#[inline]
fn bytes(count: usize, factor: usize, dt: DataType, what: &str) -> Result<usize> {
    match count
        .checked_mul(factor)
        .and_then(|n| n.checked_mul(dt.size()))
    {
        Some(n) => Ok(n),
        None => Err(overflows(count, factor, dt, what)),
    }
}

// The checks' errors, out of the common path.
#[cold]
#[inline(never)]
fn overflows(count: usize, factor: usize, dt: DataType, what: &str) -> Error {
    Error::InvalidArgument(format!(
        "{what}: {count} x {factor} elements of {dt} overflows"
    ))
}

#[cold]
#[inline(never)]
fn short(what: &str, len: usize, need: usize) -> Error {
    Error::InvalidArgument(format!("{what} holds {len} bytes, the call needs {need}"))
}

#[cold]
#[inline(never)]
fn aliased(what: &str) -> Error {
    Error::InvalidArgument(format!(
        "{what}: send and receive buffers overlap without being NCCL's in-place layout"
    ))
}

/// Trim `b` to its first `need` bytes in place (no new handle), or say what it lacks.
#[inline]
fn fits(b: &mut Buffer, need: usize, what: &str) -> Result<()> {
    if b.len() < need {
        return Err(short(what, b.len(), need));
    }
    b.truncate(need);
    Ok(())
}

/// Two buffers of `n` bytes each that share no byte (`what`: the call's, the send
/// buffer's and the receive buffer's names, for messages).
#[inline]
fn apart(send: &mut Buffer, recv: &mut Buffer, n: usize, what: [&str; 3]) -> Result<()> {
    fits(send, n, what[1])?;
    fits(recv, n, what[2])?;
    no_alias(send, recv, what[0])
}

#[inline]
fn no_alias(a: &Buffer, b: &Buffer, what: &str) -> Result<()> {
    if a.overlaps(b) {
        return Err(aliased(what));
    }
    Ok(())
}

/// Check `op` for a communicator of `size` ranks where this is `rank`, and trim every
/// buffer to exactly the bytes the call touches: the full check, every time (a request
/// checked once travels as a [`Checked`] value instead).
pub fn check(mut op: Op, dtype: DataType, rank: usize, size: usize) -> Result<Op> {
    check_in_place(&mut op, dtype, rank, size)?;
    Ok(op)
}

/// [`check`] of an op where it lies: its buffers trimmed in place.
pub fn check_in_place(op: &mut Op, dtype: DataType, rank: usize, size: usize) -> Result<()> {
    #[cfg(test)]
    FULL_CHECKS.with(|n| n.set(n.get() + 1));
    check_mut(op, dtype, rank, size)
}

#[cfg(test)]
thread_local! {
    /// Full checks made by [`check`] on this thread (the tests' count).
    pub(crate) static FULL_CHECKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// An all-gather's or a reduce-scatter's pair (one member of a coalesced list too): a
/// whole buffer of `size` chunks of `count` elements and one chunk (the all-gather's
/// output and input, the reduce-scatter's input and output), each trimmed
/// in place to its size, the whole one checked first; disjoint unless in place.
#[inline(always)]
fn check_chunked(
    kind: Kind,
    send: &mut Buffer,
    recv: &mut Buffer,
    count: usize,
    dtype: DataType,
    rank: usize,
    size: usize,
) -> Result<()> {
    let name = kind.name();
    let c = bytes(count, 1, dtype, name)?;
    let all = bytes(count, size, dtype, name)?;
    {
        let gather = kind == Kind::AllGather;
        let (whole, chunk, w, p) = if gather {
            (
                &mut *recv,
                &mut *send,
                "all-gather recvbuff",
                "all-gather sendbuff",
            )
        } else {
            (
                &mut *send,
                &mut *recv,
                "reduce-scatter sendbuff",
                "reduce-scatter recvbuff",
            )
        };
        fits(whole, all, w)?;
        fits(chunk, c, p)?;
    }
    if !in_place(kind, send, recv, rank, c) {
        no_alias(send, recv, name)?;
    }
    Ok(())
}

/// The checks, trimming the op's buffers where they lie.
#[inline(always)]
fn check_mut(op: &mut Op, dtype: DataType, rank: usize, size: usize) -> Result<()> {
    match op {
        Op::AllGather { send, recv, count } => {
            check_chunked(Kind::AllGather, send, recv, *count, dtype, rank, size)?
        }
        Op::ReduceScatter {
            send, recv, count, ..
        } => check_chunked(Kind::ReduceScatter, send, recv, *count, dtype, rank, size)?,
        Op::AllReduce {
            send, recv, count, ..
        } => {
            let c = bytes(*count, 1, dtype, "all-reduce")?;
            fits(send, c, "all-reduce sendbuff")?;
            fits(recv, c, "all-reduce recvbuff")?;
            if !in_place(Kind::AllReduce, send, recv, rank, c) {
                no_alias(send, recv, "all-reduce")?;
            }
        }
        Op::AllToAll { send, recv, count } => {
            let n = bytes(*count, size, dtype, "all-to-all")?;
            apart(
                send,
                recv,
                n,
                ["all-to-all", "all-to-all sendbuff", "all-to-all recvbuff"],
            )?;
        }
        Op::Broadcast {
            send,
            recv,
            count,
            root,
        } => {
            let root = *root;
            if root >= size {
                return Err(Error::InvalidArgument(format!(
                    "broadcast root {root} out of range for {size} ranks"
                )));
            }
            let c = bytes(*count, 1, dtype, "broadcast")?;
            fits(recv, c, "broadcast recvbuff")?;
            if rank == root {
                fits(send, c, "broadcast sendbuff")?;
                if !in_place(Kind::Broadcast { root }, send, recv, rank, c) {
                    no_alias(send, recv, "broadcast")?;
                }
            } else {
                send.truncate(0);
            }
        }
        Op::Send { peer, .. } | Op::Recv { peer, .. } if *peer >= size => {
            return Err(Error::InvalidArgument(format!(
                "peer {peer} out of range for {size} ranks"
            )));
        }
        Op::Send { buf, count, .. } => fits(buf, bytes(*count, 1, dtype, "send")?, "send buffer")?,
        Op::Recv { buf, count, .. } => fits(buf, bytes(*count, 1, dtype, "recv")?, "recv buffer")?,
        Op::SendRecv {
            send,
            recv,
            count,
            dst,
            src,
            ..
        } => {
            if *dst >= size || *src >= size {
                return Err(Error::InvalidArgument(format!(
                    "send-recv peers {dst}/{src} out of range for {size} ranks"
                )));
            }
            let n = bytes(*count, 1, dtype, "send-recv")?;
            let what = [
                "send-recv",
                "send-recv send buffer",
                "send-recv receive buffer",
            ];
            apart(send, recv, n, what)?;
        }
        Op::AllGatherCoalesced {
            sends,
            recvs,
            counts,
        } => check_list(sends, recvs, counts, "coalesced all-gather", |s, r, c| {
            check_chunked(Kind::AllGather, s, r, c, dtype, rank, size)
        })?,
        Op::ReduceScatterCoalesced {
            sends,
            recvs,
            counts,
            ..
        } => check_list(
            sends,
            recvs,
            counts,
            "coalesced reduce-scatter",
            |s, r, c| check_chunked(Kind::ReduceScatter, s, r, c, dtype, rank, size),
        )?,
    }
    Ok(())
}

/// Check every member of a coalesced list as its single-buffer op (`one`), trimming
/// the buffers in place.
fn check_list(
    sends: &mut [Buffer],
    recvs: &mut [Buffer],
    counts: &[usize],
    what: &str,
    one: impl Fn(&mut Buffer, &mut Buffer, usize) -> Result<()>,
) -> Result<()> {
    if sends.len() != counts.len() || recvs.len() != counts.len() {
        return Err(Error::InvalidArgument(format!(
            "{what}: {} send buffers, {} receive buffers, {} counts",
            sends.len(),
            recvs.len(),
            counts.len()
        )));
    }
    for ((s, r), c) in sends.iter_mut().zip(recvs.iter_mut()).zip(counts) {
        one(s, r, *c)?;
    }
    Ok(())
}

/// A request whose checks are done, for a communicator of `size` ranks where this is
/// `rank`: its buffers are trimmed to the bytes the call touches, and overlap only in
/// NCCL's in-place layout, which they record ([`Op::layout`]). The only thing the
/// communicator's run and launch paths take (`Comm::submit_checked`, `call_checked`,
/// `enqueue_checked`): a request is checked at the front, once, and travels checked as
/// this value; one made for another rank or size is checked again in full
/// ([`Checked::on`]).
#[derive(Debug)]
pub struct Checked {
    req: Request,
    rank: usize,
    size: usize,
}

/// The words identifying a one-pair op (debug builds' cross-check, [`same_op`]): the
/// op's variant, count, peer, root or reduction and each buffer view's identity
/// ([`Buffer::identity`]); `None` for the lists and an algorithm's own send-receive step.
#[cfg(debug_assertions)]
fn op_words(op: &Op) -> Option<[usize; 8]> {
    fn pair(tag: usize, count: usize, extra: usize, a: &Buffer, b: &Buffer) -> [usize; 8] {
        let ([a0, a1, a2], [b0, b1, b2]) = (a.identity(), b.identity());
        [tag | extra << 8, count, a0, a1, a2, b0, b1, b2]
    }
    Some(match op {
        Op::AllGather { send, recv, count } => pair(1, *count, 0, send, recv),
        Op::ReduceScatter {
            send,
            recv,
            count,
            op,
        } => pair(2, *count, *op as usize, send, recv),
        Op::AllReduce {
            send,
            recv,
            count,
            op,
        } => pair(3, *count, *op as usize, send, recv),
        Op::AllToAll { send, recv, count } => pair(4, *count, 0, send, recv),
        Op::Broadcast {
            send,
            recv,
            count,
            root,
        } => pair(5, *count, *root, send, recv),
        Op::Send { buf, count, peer } => pair(6, *count, *peer, buf, buf),
        Op::Recv { buf, count, peer } => pair(7, *count, *peer, buf, buf),
        _ => return None,
    })
}

impl Checked {
    /// Check `req` in full ([`check`]) for `rank` of `size`.
    pub fn new(mut req: Request, rank: usize, size: usize) -> Result<Checked> {
        check_in_place(&mut req.op, req.dtype, rank, size)?;
        Ok(Checked { req, rank, size })
    }

    /// A request the caller checked itself, on what only it sees (the C boundary: raw
    /// pointers), as [`check`] would: buffers exactly the bytes the call touches, counts
    /// that do not overflow, peers and roots in range, and no overlap but NCCL's
    /// in-place layout on `rank`, built as one buffer and a view of it. Debug builds run
    /// [`check`]'s checks as well and panic where the two disagree, or where the layout
    /// the buffers record is not the one the caller derived (`layouts`, one per send /
    /// receive pair in op order; not read in release builds).
    pub(crate) fn assume(
        req: Request,
        rank: usize,
        size: usize,
        layouts: &[Option<InPlace>],
    ) -> Checked {
        #[cfg(debug_assertions)]
        debug_agree(&req, rank, size, layouts);
        let _ = layouts;
        Checked { req, rank, size }
    }

    /// This request for `rank` of `size`: as it is when it was checked for them, else
    /// checked again in full for them.
    #[inline]
    pub fn on(self, rank: usize, size: usize) -> Result<Checked> {
        if self.rank == rank && self.size == size {
            return Ok(self);
        }
        Checked::new(self.req, rank, size)
    }

    /// The request.
    pub fn request(&self) -> &Request {
        &self.req
    }

    /// The request, to run (its checks done).
    pub fn into_request(self) -> Request {
        self.req
    }

    /// With dependencies (they are not part of the checks).
    pub fn after(mut self, deps: impl IntoIterator<Item = Work>) -> Checked {
        self.req.deps.extend(deps);
        self
    }

    /// Its dependencies, taken out (a launch orders them itself).
    pub(crate) fn take_deps(&mut self) -> Vec<Work> {
        std::mem::take(&mut self.req.deps)
    }
}

/// The pairs of an op in order: (kind, send, recv, count).
#[cfg(debug_assertions)]
fn pairs(op: &Op) -> Vec<(Kind, &Buffer, &Buffer, usize)> {
    match op {
        Op::AllGather { send, recv, count } => vec![(Kind::AllGather, send, recv, *count)],
        Op::ReduceScatter {
            send, recv, count, ..
        } => vec![(Kind::ReduceScatter, send, recv, *count)],
        Op::AllReduce {
            send, recv, count, ..
        } => vec![(Kind::AllReduce, send, recv, *count)],
        Op::AllToAll { send, recv, count } => vec![(Kind::AllToAll, send, recv, *count)],
        Op::Broadcast {
            send,
            recv,
            count,
            root,
        } => vec![(Kind::Broadcast { root: *root }, send, recv, *count)],
        Op::AllGatherCoalesced {
            sends,
            recvs,
            counts,
        }
        | Op::ReduceScatterCoalesced {
            sends,
            recvs,
            counts,
            ..
        } => {
            let kind = match op {
                Op::AllGatherCoalesced { .. } => Kind::AllGather,
                _ => Kind::ReduceScatter,
            };
            sends
                .iter()
                .zip(recvs)
                .zip(counts)
                .map(|((s, r), c)| (kind, s, r, *c))
                .collect()
        }
        _ => Vec::new(),
    }
}

/// Identity of two ops (debug builds' cross-check): [`op_words`], and for coalesced
/// lists (whose copies are other lists) the same counts over the same buffer views.
#[cfg(debug_assertions)]
fn same_op(a: &Op, b: &Op) -> bool {
    let ids = |v: &[Buffer]| v.iter().map(Buffer::identity).collect::<Vec<_>>();
    let lists = |(s, r, c): (&[Buffer], &[Buffer], &[usize]),
                 (t, q, d): (&[Buffer], &[Buffer], &[usize])| {
        c == d && ids(s) == ids(t) && ids(r) == ids(q)
    };
    match (a, b) {
        (
            Op::AllGatherCoalesced {
                sends,
                recvs,
                counts,
            },
            Op::AllGatherCoalesced {
                sends: s,
                recvs: r,
                counts: c,
            },
        ) => lists((sends, recvs, counts), (s, r, c)),
        (
            Op::ReduceScatterCoalesced {
                sends,
                recvs,
                counts,
                op,
            },
            Op::ReduceScatterCoalesced {
                sends: s,
                recvs: r,
                counts: c,
                op: o,
            },
        ) => op == o && lists((sends, recvs, counts), (s, r, c)),
        _ => op_words(a).is_some() && op_words(a) == op_words(b),
    }
}

/// [`check_mut`] of an op by value, uncounted (the debug cross-check is no call's check).
#[cfg(debug_assertions)]
fn check_mut_owned(mut op: Op, dtype: DataType, rank: usize, size: usize) -> Result<Op> {
    check_mut(&mut op, dtype, rank, size)?;
    Ok(op)
}

/// Debug builds: a request the C boundary checked passes [`check`] unchanged, and the
/// layout its buffers record is the caller's and NCCL's rule's.
#[cfg(debug_assertions)]
fn debug_agree(req: &Request, rank: usize, size: usize, layouts: &[Option<InPlace>]) {
    let op = req.op.clone();
    let name = op.name();
    match check_mut_owned(op, req.dtype, rank, size) {
        Ok(c) => assert!(
            same_op(&c, &req.op),
            "{name}: the boundary's buffers are not what check trims them to"
        ),
        Err(e) => panic!("{name}: the boundary let through what check refuses: {e}"),
    }
    let ps = pairs(&req.op);
    if ps.is_empty() {
        return;
    }
    assert_eq!(ps.len(), layouts.len(), "{name}: one layout per pair");
    for ((kind, s, r, count), want) in ps.into_iter().zip(layouts) {
        let one = kind.op(s.clone(), r.clone(), count, ReduceOp::Sum);
        assert_eq!(one.layout(), *want, "{name}: recorded layout");
        let rule = kind
            .in_place(rank, count * req.dtype.size())
            .filter(|_| in_place(kind, s, r, rank, count * req.dtype.size()));
        assert_eq!(rule, *want, "{name}: NCCL's rule on rank {rank}");
    }
}
