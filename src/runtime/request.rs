//! The request descriptor every collective becomes, and the checks it passes before
//! dispatch (NCCL's ncclEnqueueCheck is the model): counts, overflow, buffer sizes,
//! peers, and NCCL's in-place and aliasing rules (the one rule: [`Kind::in_place`],
//! applied to buffers by [`in_place`]).

#![forbid(unsafe_code)]

use super::stream::Work;
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::kinds::{Algo, Kind};
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
    /// MiCS §4 coalesced all-gather: `recvs[i]` (size·counts[i]) gathers `sends[i]`
    /// (counts[i]) for every i, in one launch.
    AllGatherCoalesced {
        sends: Vec<Buffer>,
        recvs: Vec<Buffer>,
        counts: Vec<usize>,
    },
    /// MiCS §4 coalesced reduce-scatter: `recvs[i]` (counts[i]) from `sends[i]` (size·counts[i]).
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
        match self {
            Op::AllGather { send, recv, .. }
            | Op::ReduceScatter { send, recv, .. }
            | Op::AllReduce { send, recv, .. }
            | Op::AllToAll { send, recv, .. }
            | Op::Broadcast { send, recv, .. }
            | Op::SendRecv { send, recv, .. } => {
                f(send);
                f(recv);
            }
            Op::Send { buf, .. } | Op::Recv { buf, .. } => f(buf),
            Op::AllGatherCoalesced { sends, recvs, .. }
            | Op::ReduceScatterCoalesced { sends, recvs, .. } => {
                sends.iter().chain(recvs).for_each(f)
            }
        }
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

    /// True when this collective is in NCCL's in-place layout on `rank` ([`in_place`]).
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

fn bytes(count: usize, factor: usize, dt: DataType, what: &str) -> Result<usize> {
    count
        .checked_mul(factor)
        .and_then(|n| n.checked_mul(dt.size()))
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{what}: {count} x {factor} elements of {dt} overflows"
            ))
        })
}

fn fits(b: &Buffer, need: usize, what: &str) -> Result<Buffer> {
    if b.len() < need {
        return Err(Error::InvalidArgument(format!(
            "{what} holds {} bytes, the call needs {need}",
            b.len()
        )));
    }
    b.slice(0..need)
}

fn no_alias(a: &Buffer, b: &Buffer, what: &str) -> Result<()> {
    if a.overlaps(b) {
        return Err(Error::InvalidArgument(format!(
            "{what}: send and receive buffers overlap without being NCCL's in-place layout"
        )));
    }
    Ok(())
}

/// Check `op` for a communicator of `size` ranks where this is `rank`, and trim every
/// buffer to exactly the bytes the call touches.
pub fn check(op: Op, dtype: DataType, rank: usize, size: usize) -> Result<Op> {
    Ok(match op {
        Op::AllGather { send, recv, count } => {
            let c = bytes(count, 1, dtype, "all-gather")?;
            let recv = fits(
                &recv,
                bytes(count, size, dtype, "all-gather")?,
                "all-gather recvbuff",
            )?;
            let send = fits(&send, c, "all-gather sendbuff")?;
            if !in_place(Kind::AllGather, &send, &recv, rank, c) {
                no_alias(&send, &recv, "all-gather")?;
            }
            Op::AllGather { send, recv, count }
        }
        Op::ReduceScatter {
            send,
            recv,
            count,
            op,
        } => {
            let c = bytes(count, 1, dtype, "reduce-scatter")?;
            let send = fits(
                &send,
                bytes(count, size, dtype, "reduce-scatter")?,
                "reduce-scatter sendbuff",
            )?;
            let recv = fits(&recv, c, "reduce-scatter recvbuff")?;
            if !in_place(Kind::ReduceScatter, &send, &recv, rank, c) {
                no_alias(&send, &recv, "reduce-scatter")?;
            }
            Op::ReduceScatter {
                send,
                recv,
                count,
                op,
            }
        }
        Op::AllReduce {
            send,
            recv,
            count,
            op,
        } => {
            let c = bytes(count, 1, dtype, "all-reduce")?;
            let send = fits(&send, c, "all-reduce sendbuff")?;
            let recv = fits(&recv, c, "all-reduce recvbuff")?;
            if !in_place(Kind::AllReduce, &send, &recv, rank, c) {
                no_alias(&send, &recv, "all-reduce")?;
            }
            Op::AllReduce {
                send,
                recv,
                count,
                op,
            }
        }
        Op::AllToAll { send, recv, count } => {
            let n = bytes(count, size, dtype, "all-to-all")?;
            let send = fits(&send, n, "all-to-all sendbuff")?;
            let recv = fits(&recv, n, "all-to-all recvbuff")?;
            no_alias(&send, &recv, "all-to-all")?;
            Op::AllToAll { send, recv, count }
        }
        Op::Broadcast {
            send,
            recv,
            count,
            root,
        } => {
            if root >= size {
                return Err(Error::InvalidArgument(format!(
                    "broadcast root {root} out of range for {size} ranks"
                )));
            }
            let c = bytes(count, 1, dtype, "broadcast")?;
            let recv = fits(&recv, c, "broadcast recvbuff")?;
            let send = if rank == root {
                fits(&send, c, "broadcast sendbuff")?
            } else {
                send.slice(0..0)?
            };
            if rank == root && !in_place(Kind::Broadcast { root }, &send, &recv, rank, c) {
                no_alias(&send, &recv, "broadcast")?;
            }
            Op::Broadcast {
                send,
                recv,
                count,
                root,
            }
        }
        Op::Send { buf, count, peer } | Op::Recv { buf, count, peer } if peer >= size => {
            let _ = (buf, count);
            return Err(Error::InvalidArgument(format!(
                "peer {peer} out of range for {size} ranks"
            )));
        }
        Op::Send { buf, count, peer } => Op::Send {
            buf: fits(&buf, bytes(count, 1, dtype, "send")?, "send buffer")?,
            count,
            peer,
        },
        Op::Recv { buf, count, peer } => Op::Recv {
            buf: fits(&buf, bytes(count, 1, dtype, "recv")?, "recv buffer")?,
            count,
            peer,
        },
        Op::SendRecv {
            send,
            recv,
            count,
            dst,
            src,
            reduce,
        } => {
            if dst >= size || src >= size {
                return Err(Error::InvalidArgument(format!(
                    "send-recv peers {dst}/{src} out of range for {size} ranks"
                )));
            }
            let n = bytes(count, 1, dtype, "send-recv")?;
            let send = fits(&send, n, "send-recv send buffer")?;
            let recv = fits(&recv, n, "send-recv receive buffer")?;
            no_alias(&send, &recv, "send-recv")?;
            Op::SendRecv {
                send,
                recv,
                count,
                dst,
                src,
                reduce,
            }
        }
        Op::AllGatherCoalesced {
            sends,
            recvs,
            counts,
        } => {
            let (sends, recvs) = check_list(
                &sends,
                &recvs,
                &counts,
                "coalesced all-gather",
                |send, recv, count| check(Op::AllGather { send, recv, count }, dtype, rank, size),
            )?;
            Op::AllGatherCoalesced {
                sends,
                recvs,
                counts,
            }
        }
        Op::ReduceScatterCoalesced {
            sends,
            recvs,
            counts,
            op,
        } => {
            let (sends, recvs) = check_list(
                &sends,
                &recvs,
                &counts,
                "coalesced reduce-scatter",
                |send, recv, count| {
                    check(
                        Op::ReduceScatter {
                            send,
                            recv,
                            count,
                            op,
                        },
                        dtype,
                        rank,
                        size,
                    )
                },
            )?;
            Op::ReduceScatterCoalesced {
                sends,
                recvs,
                counts,
                op,
            }
        }
    })
}

/// Check every member of a coalesced list as its single-buffer op (`one`), returning the
/// trimmed buffers.
fn check_list(
    sends: &[Buffer],
    recvs: &[Buffer],
    counts: &[usize],
    what: &str,
    one: impl Fn(Buffer, Buffer, usize) -> Result<Op>,
) -> Result<(Vec<Buffer>, Vec<Buffer>)> {
    if sends.len() != counts.len() || recvs.len() != counts.len() {
        return Err(Error::InvalidArgument(format!(
            "{what}: {} send buffers, {} receive buffers, {} counts",
            sends.len(),
            recvs.len(),
            counts.len()
        )));
    }
    let mut out = (Vec::new(), Vec::new());
    for i in 0..counts.len() {
        match one(sends[i].clone(), recvs[i].clone(), counts[i])? {
            Op::AllGather { send, recv, .. } | Op::ReduceScatter { send, recv, .. } => {
                out.0.push(send);
                out.1.push(recv);
            }
            other => {
                return Err(Error::Internal(format!(
                    "coalesced check produced {}",
                    other.name()
                )))
            }
        }
    }
    Ok(out)
}
