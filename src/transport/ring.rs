//! `ring`: the flat baselines, written over a transport's point-to-point calls
//! ([`P2p`]) in rank order, so their traffic is NCCL's ring traffic. These are the native
//! collectives of the `local` and `mpi` transports; on NCCL/RCCL the vendor's own ring
//! stands in.
//!
//! Traffic of one call, per rank, with `p` ranks and `M` the full (gathered / unreduced)
//! size in bytes: all-gather and reduce-scatter send `(p-1)/p·M` to the next rank;
//! all-reduce sends `2(p-1)/p·M`; all-to-all sends `(p-1)/p·M` directly to each peer's
//! block; broadcast forwards `M` along the chain from the root (every rank but the last).
//! Summed over a link class, a ring in rank order crosses each boundary of that class
//! once per lap, which gives the closed forms asserted in `tests/traffic.rs`.

#![forbid(unsafe_code)]

use super::p2p::{Fold, P2p};
use super::scratch::with_scratch;
use crate::dtype::{DataType, ReduceOp};
use crate::error::Result;
use std::ops::Range;

fn prev(r: usize, p: usize) -> usize {
    (r + p - 1) % p
}

fn next(r: usize, p: usize) -> usize {
    (r + 1) % p
}

/// `(&buf[a], &mut buf[b])` for disjoint ranges.
fn split_pair<'a>(
    buf: &'a mut [u8],
    a: &Range<usize>,
    b: &Range<usize>,
) -> (&'a [u8], &'a mut [u8]) {
    if a.end <= b.start {
        let (lo, hi) = buf.split_at_mut(b.start);
        (&lo[a.clone()], &mut hi[..b.len()])
    } else {
        let (lo, hi) = buf.split_at_mut(a.start);
        (&hi[..a.len()], &mut lo[b.clone()])
    }
}

/// Element-aligned split of `count` elements into `p` near-equal parts (the first
/// `count % p` parts one element longer), as byte ranges.
pub fn even_ranges(count: usize, p: usize, elem: usize) -> Vec<Range<usize>> {
    let (q, rem) = (count / p, count % p);
    let mut out = Vec::with_capacity(p);
    let mut start = 0;
    for i in 0..p {
        let n = q + usize::from(i < rem);
        out.push(start * elem..(start + n) * elem);
        start += n;
    }
    out
}

/// `p` consecutive ranges of `chunk` bytes.
fn equal_ranges(p: usize, chunk: usize) -> Vec<Range<usize>> {
    (0..p).map(|i| i * chunk..(i + 1) * chunk).collect()
}

/// Ring all-gather over variable chunks, in place: `buf[ranges[rank]]` holds this rank's data.
pub fn all_gather_v<T: P2p + ?Sized>(t: &T, buf: &mut [u8], ranges: &[Range<usize>]) -> Result<()> {
    all_gather_by(t, buf, |i| ranges[i].clone())
}

/// The ring all-gather over chunk `at(i)` of each rank `i`.
fn all_gather_by<T: P2p + ?Sized>(
    t: &T,
    buf: &mut [u8],
    at: impl Fn(usize) -> Range<usize>,
) -> Result<()> {
    let (r, p) = (t.rank(), t.size());
    for s in 0..p.saturating_sub(1) {
        let out = at((r + p - s) % p);
        let inc = at((r + 2 * p - s - 1) % p);
        let (snd, rcv) = split_pair(buf, &out, &inc);
        t.sendrecv(next(r, p), snd, prev(r, p), rcv)?;
    }
    Ok(())
}

/// Ring all-gather in place over equal chunks of `chunk` bytes.
pub fn all_gather<T: P2p + ?Sized>(t: &T, buf: &mut [u8], chunk: usize) -> Result<()> {
    all_gather_by(t, buf, |i| i * chunk..(i + 1) * chunk)
}

/// The first `p-2` steps of the ring reduce-scatter: step `s` sends the partial of chunk
/// `r-s-1` (step 0: this rank's own chunk `r-1` of `src`) and receives the partial of
/// chunk `r-s-2`, reduced with `src`'s into half `s % 2` of `parts` (two halves of the
/// largest chunk). Returns what the last step sends: `src[ranges[r-1]]` when `p == 2`,
/// else the last partial, as (half, length).
fn first_steps<T: P2p + ?Sized>(
    t: &T,
    src: &[u8],
    ranges: &[Range<usize>],
    parts: &mut [u8],
    dtype: DataType,
    op: ReduceOp,
) -> Result<Option<(usize, usize)>> {
    let (r, p) = (t.rank(), t.size());
    let half = parts.len() / 2;
    let mut last: Option<(usize, usize)> = None;
    for s in 0..p.saturating_sub(2) {
        let c = ranges[(r + 2 * p - s - 2) % p].clone();
        let (even, odd) = parts.split_at_mut(half);
        let (out, other) = if s % 2 == 0 { (even, odd) } else { (odd, even) };
        let send: &[u8] = match last {
            None => &src[ranges[(r + p - 1) % p].clone()],
            Some((_, len)) => &other[..len],
        };
        let fold = Fold::Pair {
            out: &mut out[..c.len()],
            local: &src[c.clone()],
        };
        t.sendrecv_reduce(next(r, p), send, prev(r, p), fold, dtype, op)?;
        last = Some((s % 2, c.len()));
    }
    Ok(last)
}

/// Half `h` of `parts`, its first `len` bytes.
fn part(parts: &[u8], (h, len): (usize, usize)) -> &[u8] {
    let half = parts.len() / 2;
    &parts[h * half..h * half + len]
}

/// Ring reduce-scatter over variable chunks: `out` gets the reduction of everyone's
/// `src[ranges[rank]]`. `Avg` sums (the caller divides). Each step reduces what it
/// receives with this rank's chunk straight into the next partial (one pass on the
/// `local` transport: [`P2p::sendrecv_reduce`]); the last step writes `out`.
pub fn reduce_scatter_v<T: P2p + ?Sized>(
    t: &T,
    src: &[u8],
    ranges: &[Range<usize>],
    out: &mut [u8],
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    let (r, p) = (t.rank(), t.size());
    let op = op.partial();
    if p == 1 {
        out.copy_from_slice(&src[ranges[0].clone()]);
        return Ok(());
    }
    let big = if p > 2 { max_len(ranges) } else { 0 };
    with_scratch(2 * big, |parts| {
        let last = first_steps(t, src, ranges, parts, dtype, op)?;
        let send = match last {
            None => &src[ranges[(r + p - 1) % p].clone()],
            Some(l) => part(parts, l),
        };
        let fold = Fold::After {
            out,
            local: &src[ranges[r].clone()],
        };
        t.sendrecv_reduce(next(r, p), send, prev(r, p), fold, dtype, op)
    })
}

fn max_len(ranges: &[Range<usize>]) -> usize {
    ranges.iter().map(|c| c.len()).max().unwrap_or(0)
}

/// Ring reduce-scatter over equal chunks of `recv.len()` bytes.
pub fn reduce_scatter<T: P2p + ?Sized>(
    t: &T,
    send: &[u8],
    recv: &mut [u8],
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    let c = recv.len();
    let ranges = equal_ranges(t.size(), c);
    reduce_scatter_v(t, send, &ranges, recv, dtype, op)
}

/// Ring reduce-scatter in place: chunk `ranges[rank]` of `buf` gets the reduction of
/// everyone's; the other chunks are read, never written. The last step folds into this
/// rank's own chunk (`acc = op(acc, incoming)`), so nothing is copied. `Avg` sums.
pub fn reduce_scatter_in_place_v<T: P2p + ?Sized>(
    t: &T,
    buf: &mut [u8],
    ranges: &[Range<usize>],
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    let (r, p) = (t.rank(), t.size());
    if p == 1 {
        return Ok(());
    }
    let op = op.partial();
    let big = if p > 2 { max_len(ranges) } else { 0 };
    with_scratch(2 * big, |parts| {
        let last = first_steps(t, buf, ranges, parts, dtype, op)?;
        let mine = ranges[r].clone();
        match last {
            None => {
                let (send, acc) = split_pair(buf, &ranges[(r + p - 1) % p], &mine);
                t.sendrecv_reduce(next(r, p), send, prev(r, p), Fold::Into(acc), dtype, op)
            }
            Some(l) => t.sendrecv_reduce(
                next(r, p),
                part(parts, l),
                prev(r, p),
                Fold::Into(&mut buf[mine]),
                dtype,
                op,
            ),
        }
    })
}

/// [`reduce_scatter_in_place_v`] over equal chunks of `chunk` bytes.
pub fn reduce_scatter_in_place<T: P2p + ?Sized>(
    t: &T,
    buf: &mut [u8],
    chunk: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    let ranges = equal_ranges(t.size(), chunk);
    reduce_scatter_in_place_v(t, buf, &ranges, dtype, op)
}

/// Largest all-reduce that two ranks run as one swap of the whole buffer.
pub const SWAP_MAX: usize = 16 << 10;

/// Ring all-reduce in place: reduce-scatter in place, then all-gather, over near-equal
/// element chunks, with no copy of the input. Two ranks with at most [`SWAP_MAX`] bytes
/// swap their whole buffers in one step instead of two and both compute
/// `op(rank 0's, rank 1's)` (the same bytes on the wire per rank, `M`, half the steps).
pub fn all_reduce<T: P2p + ?Sized>(
    t: &T,
    buf: &mut [u8],
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    if t.size() == 1 {
        return Ok(());
    }
    if t.size() == 2 && buf.len() <= SWAP_MAX {
        // What is sent must stay while `buf` is overwritten: a copy in this thread's
        // scratch (no allocation in steady state).
        return with_scratch(buf.len(), |mine| {
            mine.copy_from_slice(buf);
            swap_reduce(t, mine, buf, dtype, op)
        });
    }
    let ranges = even_ranges(buf.len() / dtype.size(), t.size(), dtype.size());
    reduce_scatter_in_place_v(t, buf, &ranges, dtype, op)?;
    all_gather_v(t, buf, &ranges)
}

/// Two ranks: send `mine` whole to the other rank and write `op(rank 0's, rank 1's)`
/// into `out` (`mine` and `out` distinct), so both ranks get the same bytes.
fn swap_reduce<T: P2p + ?Sized>(
    t: &T,
    mine: &[u8],
    out: &mut [u8],
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    let (op, other) = (op.partial(), 1 - t.rank());
    let fold = if t.rank() == 0 {
        Fold::After { out, local: mine }
    } else {
        Fold::Pair { out, local: mine }
    };
    t.sendrecv_reduce(other, mine, other, fold, dtype, op)
}

/// Ring all-reduce out of place: the reduce-scatter reads `send` where it is and writes
/// this rank's reduced chunk into `recv`, then the all-gather fills the rest of `recv`;
/// the same bytes as [`all_reduce`] on a copy, without the copy.
pub fn all_reduce_from<T: P2p + ?Sized>(
    t: &T,
    send: &[u8],
    recv: &mut [u8],
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    let p = t.size();
    if p == 1 {
        recv.copy_from_slice(send);
        return Ok(());
    }
    if p == 2 && send.len() <= SWAP_MAX {
        return swap_reduce(t, send, recv, dtype, op);
    }
    let ranges = even_ranges(send.len() / dtype.size(), p, dtype.size());
    let mine = ranges[t.rank()].clone();
    reduce_scatter_v(t, send, &ranges, &mut recv[mine], dtype, op)?;
    all_gather_v(t, recv, &ranges)
}

/// Pairwise all-to-all: at step s, send block r+s and receive block r-s.
pub fn all_to_all<T: P2p + ?Sized>(t: &T, send: &[u8], recv: &mut [u8]) -> Result<()> {
    let (r, p) = (t.rank(), t.size());
    let b = send.len() / p;
    recv[r * b..(r + 1) * b].copy_from_slice(&send[r * b..(r + 1) * b]);
    for s in 1..p {
        let (dst, src) = ((r + s) % p, (r + p - s) % p);
        t.sendrecv(
            dst,
            &send[dst * b..(dst + 1) * b],
            src,
            &mut recv[src * b..(src + 1) * b],
        )?;
    }
    Ok(())
}

/// Pieces a broadcast is pipelined in along the chain.
const BCAST_PIECE: usize = 1 << 20;

/// Chain broadcast from `root` in rank order, pipelined in 1 MiB pieces: a middle rank
/// forwards piece `k` while it receives piece `k+1` (one [`P2p::exchange`]), so on
/// `local` each piece is copied once per hop.
pub fn broadcast<T: P2p + ?Sized>(t: &T, buf: &mut [u8], root: usize) -> Result<()> {
    let (r, p) = (t.rank(), t.size());
    let pos = (r + p - root) % p;
    let (first, last) = (pos == 0, pos + 1 == p);
    let pieces: Vec<Range<usize>> = (0..buf.len().div_ceil(BCAST_PIECE).max(1))
        .map(|k| k * BCAST_PIECE..((k + 1) * BCAST_PIECE).min(buf.len()))
        .collect();
    if p == 1 {
        return Ok(());
    }
    if !first {
        t.recv(prev(r, p), &mut buf[pieces[0].clone()])?;
    }
    for k in 0..pieces.len() {
        let more = k + 1 < pieces.len();
        match (first || !more, last) {
            // The root sends, the last rank receives; nothing to overlap.
            (_, true) if more => t.recv(prev(r, p), &mut buf[pieces[k + 1].clone()])?,
            (_, true) => {}
            (true, false) => t.exchange(&[(next(r, p), &buf[pieces[k].clone()])], &mut [])?,
            (false, false) => {
                let (out, inc) = split_pair(buf, &pieces[k], &pieces[k + 1]);
                t.exchange(&[(next(r, p), out)], &mut [(prev(r, p), inc)])?;
            }
        }
    }
    Ok(())
}
