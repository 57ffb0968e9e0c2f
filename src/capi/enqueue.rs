//! The one body of every collective's C entry (what NCCL's `ncclEnqueueCheck` is): the
//! exports of [`super::coll`] name their collective ([`Coll`]) and pass their arguments
//! ([`Args`], [`Lists`]) to [`enqueue`] / [`enqueue_lists`], which
//!
//! 1. check the communicator, dtype, op, root or peer, quantization and sizes, and
//!    describe the user ranges ([`UserBuf`]); recognise NCCL's in-place layout from the
//!    raw pointers with the one rule, [`Kind::in_place`] ([`Pair`]), else require
//!    disjoint byte ranges ([`disjoint`], across the whole list for the coalesced calls);
//! 2. turn the ranges into strata buffers ([`CallBuffers`]) used in place, no copies:
//!    the host memory itself on host transports, checked wraps of the device pointers
//!    on GPU transports; an in-place pair is one buffer and a view of it on both;
//! 3. hand the call's one checked request to the communicator and finish
//!    ([`CallBuffers::run`]): the checks of steps 1-2 are the call's only ones (the
//!    request goes on as a [`Checked`](crate::runtime::request::Checked) request), and
//!    the in-place layout recognised in step 1 is the one the transport follows.
//!
//! A new collective is one export in `coll.rs` plus its arm in [`Coll`]'s matches.

use super::abi::*;
use super::boundary::guard;
use super::buffers::{disjoint, CallBuffers, Pair, UserBuf};
use super::registry::lookup;
use crate::comm::{Comm, Op, Request};
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::kernels::QuantSpec;
use crate::kinds::{Algo, Kind};
use crate::memory::Buffer;
use std::ffi::{c_int, c_void};

// ---- argument helpers ----

fn dtype(v: strataDataType_t) -> Result<DataType> {
    DataType::from_raw(v).map_err(|_| {
        Error::InvalidArgument(format!(
            "datatype {v} is not supported (strataInt8 0 to strataBfloat16 9: int8, uint8, int32, uint32, int64, uint64, float16, float32, float64, bfloat16)"
        ))
    })
}

fn redop(v: strataRedOp_t) -> Result<ReduceOp> {
    ReduceOp::from_raw(v).map_err(|_| {
        Error::InvalidArgument(format!(
            "reduction op {v} is not supported (strataSum 0, strataProd 1, strataMax 2, strataMin 3, strataAvg 4)"
        ))
    })
}

/// `count * mult` elements of `dt` in bytes, checked against overflow and `isize::MAX`.
fn nbytes(count: usize, mult: usize, dt: DataType, what: &str) -> Result<usize> {
    count
        .checked_mul(mult)
        .and_then(|n| n.checked_mul(dt.size()))
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{what}: {count} x {mult} elements of {dt} overflow the address space"
            ))
        })
}

fn peer_arg(v: c_int, size: usize, what: &str) -> Result<usize> {
    if v < 0 || v as usize >= size {
        return Err(Error::InvalidArgument(format!(
            "{what} {v} is out of range for a communicator of {size} ranks"
        )));
    }
    Ok(v as usize)
}

/// A validated quantization format for float data.
fn quant_spec(bits: c_int, block: usize, dt: DataType) -> Result<QuantSpec> {
    if !matches!(dt, DataType::F32 | DataType::F16 | DataType::BF16) {
        return Err(Error::InvalidArgument(format!(
            "quantized collectives take f32, f16 or bf16, not {dt}"
        )));
    }
    let bits = u32::try_from(bits)
        .map_err(|_| Error::InvalidArgument(format!("bits {bits} must be 4 or 8")))?;
    QuantSpec::new(bits, block)
}

// ---- the one body ----

/// A collective's own arguments, besides the buffers, count, datatype, communicator and
/// stream that every entry passes ([`Args`]): as C gives them (`Coll<strataRedOp_t,
/// c_int>`), then checked (`Coll<ReduceOp, usize>`, [`Coll::resolve`]).
#[derive(Clone, Copy)]
pub(super) enum Coll<O = strataRedOp_t, P = c_int> {
    AllGather,
    ReduceScatter(O),
    AllReduce(O),
    AllToAll,
    /// The root.
    Broadcast(P),
    /// The peer.
    Send(P),
    /// The peer.
    Recv(P),
}

/// How many bytes one of a call's ranges spans: `count` elements, or `nranks * count`.
#[derive(Clone, Copy, PartialEq)]
enum Span {
    One,
    All,
}

impl Coll {
    /// Check the op, root or peer against a communicator of `n` ranks (after the
    /// datatype, as every entry checks).
    fn resolve(self, n: usize) -> Result<Coll<ReduceOp, usize>> {
        Ok(match self {
            Coll::AllGather => Coll::AllGather,
            Coll::ReduceScatter(op) => Coll::ReduceScatter(redop(op)?),
            Coll::AllReduce(op) => Coll::AllReduce(redop(op)?),
            Coll::AllToAll => Coll::AllToAll,
            Coll::Broadcast(root) => Coll::Broadcast(peer_arg(root, n, "root")?),
            Coll::Send(peer) => Coll::Send(peer_arg(peer, n, "peer")?),
            Coll::Recv(peer) => Coll::Recv(peer_arg(peer, n, "peer")?),
        })
    }
}

impl Coll<ReduceOp, usize> {
    /// The send range's span, the receive range's and the in-place chunk's (per rank),
    /// then the count argument's name and that of the count over all ranks (messages).
    fn sizes(self) -> ([Span; 3], &'static str, &'static str) {
        use Span::{All, One};
        match self {
            Coll::AllGather => ([One, All, One], "sendcount", "sendcount x nranks"),
            Coll::ReduceScatter(_) => ([All, One, One], "recvcount", "recvcount x nranks"),
            Coll::AllToAll => ([All; 3], "count", "count x nranks"),
            _ => ([One; 3], "count", "count x nranks"),
        }
    }

    /// The collective's kind (its in-place rule); `None` for point-to-point.
    fn kind(self) -> Option<Kind> {
        Some(match self {
            Coll::AllGather => Kind::AllGather,
            Coll::ReduceScatter(_) => Kind::ReduceScatter,
            Coll::AllReduce(_) => Kind::AllReduce,
            Coll::AllToAll => Kind::AllToAll,
            Coll::Broadcast(root) => Kind::Broadcast { root },
            Coll::Send(_) | Coll::Recv(_) => return None,
        })
    }

    /// The quantized algorithm of this collective with `bits` and `block`, checked for
    /// `dt` (all-gather: qwZ; reduce-scatter with sum or avg: qgZ).
    fn quantized(self, (bits, block): (c_int, usize), dt: DataType) -> Result<(Algo, QuantSpec)> {
        let algo = match self {
            Coll::AllGather => Algo::Qwz,
            Coll::ReduceScatter(ReduceOp::Sum | ReduceOp::Avg) => Algo::Qgz,
            Coll::ReduceScatter(op) => {
                return Err(Error::InvalidArgument(format!(
                    "quantized reduce-scatter reduces with sum or avg, not {op}"
                )));
            }
            _ => {
                return Err(Error::Internal(
                    "only all-gather and reduce-scatter quantize".into(),
                ))
            }
        };
        Ok((algo, quant_spec(bits, block, dt)?))
    }

    /// The op over the call's buffers (`send` / `recv`: the one buffer of a send / a
    /// receive).
    #[rustfmt::skip] // a table
    fn op(self, send: Buffer, recv: Buffer, count: usize) -> Op {
        match self {
            Coll::AllGather => Op::AllGather { send, recv, count },
            Coll::ReduceScatter(op) => Op::ReduceScatter { send, recv, count, op },
            Coll::AllReduce(op) => Op::AllReduce { send, recv, count, op },
            Coll::AllToAll => Op::AllToAll { send, recv, count },
            Coll::Broadcast(root) => Op::Broadcast { send, recv, count, root },
            Coll::Send(peer) => Op::Send { buf: send, count, peer },
            Coll::Recv(peer) => Op::Recv { buf: recv, count, peer },
        }
    }
}

/// The C arguments every collective entry has: `sendbuff`, `recvbuff`, the count, the
/// datatype, the communicator and the stream (for a coalesced call: NULL, NULL, the
/// number of buffers, ...).
pub(super) struct Args(
    pub(super) *const c_void,
    pub(super) *mut c_void,
    pub(super) usize,
    pub(super) strataDataType_t,
    pub(super) strataComm_t,
    pub(super) strataStream_t,
);

/// The user ranges of one call, checked, as its collective uses them.
enum Ranges {
    /// A send and a receive range (a broadcast's: on the root).
    Pair(Pair),
    /// The receive range only (a broadcast off the root, a receive).
    Output(UserBuf),
    /// The send range only (a send).
    Input(UserBuf),
}

/// What picks a call's algorithm.
#[derive(Clone, Copy, Debug)]
pub(super) enum Hint {
    /// The communicator's configured algorithm, else strata's model (`auto`).
    Model,
    /// The quantized form with `bits` and `block` (qwZ, qgZ).
    Quant(c_int, usize),
    /// This algorithm (a library in front of strata chose it: [`collective_with`]).
    Algo(Algo),
}

/// Every collective's C entry (NCCL's `ncclEnqueueCheck`), as the export `name`, inside
/// the panic boundary: [`collective`].
///
/// # Safety
/// The export's contract on the buffers and `stream` (as `strataAllGather`'s).
pub(super) unsafe fn enqueue(
    name: &'static str,
    coll: Coll,
    hint: Hint,
    a: Args,
) -> strataResult_t {
    // SAFETY: forwarded caller contract.
    guard(name, a.4, move || unsafe {
        collective(name, coll, hint, a)
    })
}

/// Which collective [`collective_with`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum With {
    AllGather,
    ReduceScatter(strataRedOp_t),
    AllReduce(strataRedOp_t),
}

/// `strataAllGather`, `strataReduceScatter` or `strataAllReduce` (as `with` says, same
/// arguments, checks and errors) running the algorithm `algo` instead of the one the
/// communicator's config or strata's model would pick; an algorithm that cannot run the
/// call falls back to the native collective, as a configured one does. For a library in
/// front of strata that chose the algorithm itself (`libstrata_nccl`'s per-call route);
/// not part of the C header.
///
/// # Safety
/// As `strataAllGather` (buffers, stream) for the collective named.
#[allow(clippy::too_many_arguments)]
pub unsafe fn collective_with(
    with: With,
    algo: Algo,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: strataDataType_t,
    comm: strataComm_t,
    stream: strataStream_t,
) -> strataResult_t {
    let (name, coll) = match with {
        With::AllGather => ("strataAllGather", Coll::AllGather),
        With::ReduceScatter(op) => ("strataReduceScatter", Coll::ReduceScatter(op)),
        With::AllReduce(op) => ("strataAllReduce", Coll::AllReduce(op)),
    };
    let a = Args(sendbuff, recvbuff, count, datatype, comm, stream);
    // SAFETY: forwarded caller contract.
    unsafe { enqueue(name, coll, Hint::Algo(algo), a) }
}

/// The one body of every collective: check the communicator, datatype, op / root /
/// peer, quantization and sizes, describe the user ranges (refusing any overlap but
/// NCCL's in-place layout), then build the call's buffers and its one request and run
/// it ([`CallBuffers::run`]). A count of 0 is a no-op once the arguments are checked.
///
/// # Safety
/// As [`enqueue`].
unsafe fn collective(name: &'static str, coll: Coll, hint: Hint, a: Args) -> Result<()> {
    let Args(sendbuff, recvbuff, count, datatype, comm, stream) = a;
    let h = lookup(comm)?;
    let dt = dtype(datatype)?;
    let (n, r) = (h.comm.size(), h.comm.rank());
    let coll = coll.resolve(n)?;
    let q = match hint {
        Hint::Quant(bits, block) => Some(coll.quantized((bits, block), dt)?),
        _ => None,
    };
    let (spans, one_name, all_name) = coll.sizes();
    let one = match spans.contains(&Span::One) {
        true => nbytes(count, 1, dt, one_name)?,
        false => 0,
    };
    let all = match spans.contains(&Span::All) {
        true => nbytes(count, n, dt, all_name)?,
        false => 0,
    };
    let [send, recv, chunk] = spans.map(|s| if s == Span::One { one } else { all });
    let ranges = match (coll.kind(), coll) {
        (None, Coll::Send(_)) => Ranges::Input(UserBuf::new(sendbuff, send, false, "sendbuff")?),
        (None, _) => Ranges::Output(UserBuf::new(recvbuff, recv, true, "recvbuff")?),
        (Some(kind @ Kind::Broadcast { root }), _) => {
            let out = UserBuf::new(recvbuff, recv, true, "recvbuff")?;
            // `sendbuff` is the root's only.
            match root == r {
                true => {
                    let send = UserBuf::new(sendbuff, send, false, "sendbuff")?;
                    Ranges::Pair(Pair::new(kind, r, chunk, send, out))
                }
                false => Ranges::Output(out),
            }
        }
        (Some(kind), _) => {
            let send = UserBuf::new(sendbuff, send, false, "sendbuff")?;
            let recv = UserBuf::new(recvbuff, recv, true, "recvbuff")?;
            Ranges::Pair(Pair::new(kind, r, chunk, send, recv))
        }
    };
    if count == 0 {
        return Ok(());
    }
    let mut bufs = CallBuffers::new(&h.comm);
    // SAFETY (all three arms): the caller's contract: each range readable (sent) or
    // writable (received) for its bytes, memory of the transport's kind, untouched by
    // others until the call (or group) ends.
    let (send, recv) = match &ranges {
        Ranges::Pair(p) => unsafe { bufs.checked_pair(p, name) }?,
        Ranges::Output(u) => {
            if coll.kind().is_some() {
                // A broadcast off the root: a pair with no send range of its own.
                bufs.note_layout(None);
            }
            (Buffer::zeroed(0), unsafe { bufs.output(u) }?)
        }
        Ranges::Input(u) => (unsafe { bufs.input(u) }?, Buffer::zeroed(0)),
    };
    let req = Request::new(coll.op(send, recv, count), dt);
    let req = match (q, hint) {
        (Some((algo, q)), _) => req.with_algo(algo).with_quant(q),
        (None, Hint::Algo(algo)) => req.with_algo(algo),
        (None, _) => req,
    };
    // SAFETY: the caller's contract on `stream` and the buffers.
    unsafe { bufs.run(name, h, req, stream) }
}

/// # Safety
/// `p` is NULL or readable for `n` values of `T`.
unsafe fn array<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::InvalidArgument(format!(
            "{what} is NULL with nbuffers {n}"
        )));
    }
    if n.checked_mul(std::mem::size_of::<T>())
        .map_or(true, |b| b > isize::MAX as usize)
    {
        return Err(Error::InvalidArgument(format!("nbuffers {n} overflows")));
    }
    // SAFETY: non-NULL, size checked, readable for `n` values by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// The pairs of a coalesced call of `kind` (all-gather or reduce-scatter): sizes, NULLs,
/// overflow and NCCL's in-place layout of every pair, and no aliasing across the whole
/// list ([`disjoint`]). Returns the non-empty members' pairs and counts, in order.
fn coalesced_pairs(
    comm: &Comm,
    kind: Kind,
    sb: &[*const c_void],
    rb: &[*mut c_void],
    counts: &[usize],
    dt: DataType,
    name: &str,
) -> Result<(Vec<Pair>, Vec<usize>)> {
    let (n, r) = (comm.size(), comm.rank());
    let gather = kind == Kind::AllGather;
    let what = if gather { "sendcounts" } else { "recvcounts" };
    let (mut pairs, mut cs) = (Vec::new(), Vec::new());
    for (i, &count) in counts.iter().enumerate() {
        let c = nbytes(count, 1, dt, &format!("{what}[{i}]"))?;
        let total = nbytes(count, n, dt, &format!("{what}[{i}] x nranks"))?;
        let (send_len, recv_len) = if gather { (c, total) } else { (total, c) };
        let send = UserBuf::new(sb[i], send_len, false, format!("sendbuffs[{i}]"))?;
        let recv = UserBuf::new(rb[i], recv_len, true, format!("recvbuffs[{i}]"))?;
        if count == 0 {
            continue;
        }
        pairs.push(Pair::new(kind, r, c, send, recv));
        cs.push(count);
    }
    disjoint(&pairs, name)?;
    Ok((pairs, cs))
}

/// Build the buffers of every pair of a coalesced call.
///
/// # Safety
/// As [`CallBuffers::pair`] for every pair.
unsafe fn coalesced_buffers(
    bufs: &mut CallBuffers,
    pairs: &[Pair],
) -> Result<(Vec<Buffer>, Vec<Buffer>)> {
    let (mut sends, mut recvs) = (Vec::new(), Vec::new());
    for p in pairs {
        // SAFETY: the caller's contract.
        let (s, r) = unsafe { bufs.pair(p) }?;
        sends.push(s);
        recvs.push(r);
    }
    Ok((sends, recvs))
}

/// The C arrays of a coalesced entry (`sendbuffs`, `recvbuffs`, the counts) and their
/// length.
pub(super) struct Lists(
    pub(super) *const *const c_void,
    pub(super) *const *mut c_void,
    pub(super) *const usize,
    pub(super) usize,
);

/// Every coalesced entry (`coll`: all-gather or reduce-scatter; `a.2`: the number of
/// buffers), as the export `name`, inside the panic boundary: [`coalesced`].
///
/// # Safety
/// As `strataAllGatherCoalesced`.
pub(super) unsafe fn enqueue_lists(
    name: &'static str,
    coll: Coll,
    l: Lists,
    a: Args,
) -> strataResult_t {
    // SAFETY: forwarded caller contract.
    guard(name, a.4, move || unsafe { coalesced(name, coll, l, a) })
}

/// The one body of the coalesced collectives: as [`collective`], for every pair of the
/// lists, with no aliasing across the whole list ([`disjoint`]); members of count 0 are
/// skipped.
///
/// # Safety
/// As [`enqueue_lists`].
unsafe fn coalesced(name: &'static str, coll: Coll, l: Lists, a: Args) -> Result<()> {
    let (Args(_, _, _, datatype, comm, stream), Lists(sends, recvs, counts, n)) = (a, l);
    let h = lookup(comm)?;
    let dt = dtype(datatype)?;
    let coll = coll.resolve(h.comm.size())?;
    let (kind, what) = match coll {
        Coll::ReduceScatter(_) => (Kind::ReduceScatter, "recvcounts"),
        _ => (Kind::AllGather, "sendcounts"),
    };
    // SAFETY: the caller's contract on the arrays.
    let (sb, rb, counts) = unsafe {
        (
            array(sends, n, "sendbuffs")?,
            array(recvs, n, "recvbuffs")?,
            array(counts, n, what)?,
        )
    };
    let (pairs, counts) = coalesced_pairs(&h.comm, kind, sb, rb, counts, dt, name)?;
    if pairs.is_empty() {
        return Ok(());
    }
    let mut bufs = CallBuffers::new(&h.comm);
    // SAFETY: the caller's contract on every buffer, as in the one-pair collectives.
    let (sends, recvs) = unsafe { coalesced_buffers(&mut bufs, &pairs) }?;
    let op = match coll {
        Coll::ReduceScatter(op) => Op::ReduceScatterCoalesced {
            sends,
            recvs,
            counts,
            op,
        },
        _ => Op::AllGatherCoalesced {
            sends,
            recvs,
            counts,
        },
    };
    // SAFETY: the caller's contract on `stream` and the buffers.
    unsafe { bufs.run(name, h, Request::new(op, dt), stream) }
}
