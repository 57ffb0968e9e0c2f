//! [`super::log_step`] on a host transport ([`CommCore::host_steps`]): the same
//! messages, in the same order, as the steps the module builds as ops (so ranks on
//! either path meet: a transport's `sendrecv` sends what its `exchange` of one message
//! each way sends), sent straight through the transport on the borrowed bytes, the
//! rotated work in this thread's scratch: no op, batch, buffer or borrow per step. Where
//! steps are the cost it is what a step costs: on four nodes of one rank sharing two
//! cores a 16 KiB all-gather's per-call work in strata was most of the gap to Open MPI's
//! own (docs/cluster.md, "nodes:4x1").
//!
//! The power-of-two forms ([`super::recursive`]) are here too: [`doubling`], [`halving`].
//!
//! Callers hold p > 1 and c > 0 (the ops path takes the degenerate calls).

#![forbid(unsafe_code)]

use super::log_step_math::{last_step, lo, rotates, runs, sizes, steps, FirstStep};
use super::reduction::Reduction;
use crate::dtype::{reduce_into, DataType, ReduceOp};
use crate::error::Result;
use crate::memory::Buffer;
use crate::transport::{with_scratch, Fold, Transport};

/// Work kept in the thread's scratch between calls up to this many bytes; larger work
/// is allocated for the call (as the ops path does), so a big call leaves no memory
/// behind.
const KEEP: usize = 1 << 20;

fn with_work<R>(n: usize, f: impl FnOnce(&mut [u8]) -> Result<R>) -> Result<R> {
    if n <= KEEP {
        with_scratch(n, f)
    } else {
        f(&mut vec![0u8; n])
    }
}

/// A step's messages in flight together: the transport's `sendrecv` for one each way
/// (the same messages as its `exchange`, with no lists to walk), else `exchange`.
fn exchange(
    t: &dyn Transport,
    sends: &[(usize, &[u8])],
    recvs: &mut [(usize, &mut [u8])],
) -> Result<()> {
    match (sends, recvs) {
        ([(dst, s)], [(src, r)]) => t.sendrecv(*dst, s, *src, r),
        (sends, recvs) => t.exchange(sends, recvs),
    }
}

/// [`super::log_step::all_gather`]: `c` bytes of `send` per rank into `recv` (p·c,
/// rank major); in place when `send` is `recv[x·c..]`.
pub(super) fn all_gather(t: &dyn Transport, send: &Buffer, recv: &Buffer, c: usize) -> Result<()> {
    let (p, x, to) = (t.size(), t.rank(), t.timeout());
    let in_place = send.offset_in(recv) == Some(x * c);
    let mut out = recv.write_timeout(to)?;
    let out = &mut out[..p * c];
    if rotates(p * c) {
        // Rotated: position i holds chunk x + i; every step one message each way.
        return with_work(p * c, |rot| {
            if in_place {
                rot[..c].copy_from_slice(&out[x * c..(x + 1) * c]);
            } else {
                rot[..c].copy_from_slice(&send.read_timeout(to)?[..c]);
            }
            for (d, m) in steps(p) {
                let (have, into) = rot.split_at_mut(d * c);
                t.sendrecv(
                    (x + p - d) % p,
                    &have[..m * c],
                    (x + d) % p,
                    &mut into[..m * c],
                )?;
            }
            let head = (p - x) * c;
            out[x * c..].copy_from_slice(&rot[..head]);
            out[..x * c].copy_from_slice(&rot[head..]);
            Ok(())
        });
    }
    if !in_place {
        out[x * c..(x + 1) * c].copy_from_slice(&send.read_timeout(to)?[..c]);
    }
    for (d, m) in steps(p) {
        let (dst, src) = ((x + p - d) % p, (x + d) % p);
        // The runs sent, [x, x+m), and received, [x+d, x+d+m), are disjoint chunks of
        // `out`; cut it at them in place order, then list each side in run order.
        let mut spans: Vec<(usize, usize, bool, usize)> = runs(x, m, p)
            .enumerate()
            .map(|(i, (a, n))| (a, n, false, i))
            .chain(
                runs(src, m, p)
                    .enumerate()
                    .map(|(i, (a, n))| (a, n, true, i)),
            )
            .collect();
        spans.sort_unstable();
        let (mut sends, mut recvs) = (Vec::with_capacity(2), Vec::with_capacity(2));
        let (mut rest, mut at): (&mut [u8], usize) = (&mut *out, 0);
        for (a, n, incoming, i) in spans {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(a * c - at);
            let (piece, tail) = tail.split_at_mut(n * c);
            (rest, at) = (tail, (a + n) * c);
            if incoming {
                recvs.push((i, (src, piece)));
            } else {
                sends.push((i, (dst, &*piece)));
            }
        }
        sends.sort_unstable_by_key(|s| s.0);
        recvs.sort_unstable_by_key(|r| r.0);
        let sends: Vec<(usize, &[u8])> = sends.into_iter().map(|s| s.1).collect();
        let mut recvs: Vec<(usize, &mut [u8])> = recvs.into_iter().map(|r| r.1).collect();
        exchange(t, &sends, &mut recvs)?;
    }
    Ok(())
}

/// [`super::log_step::reduce_scatter`]: `recv` (`count` elements) = the reduction over
/// ranks of `send[x·count..]`; in place when `recv` is `send[x·c..]`. `op` is already
/// partial (`Avg` sums).
pub(super) fn reduce_scatter(
    t: &dyn Transport,
    send: &Buffer,
    recv: &Buffer,
    r: Reduction,
) -> Result<()> {
    let Reduction { count, dt, op } = r;
    let (p, c) = (t.size(), count * dt.size());
    let n = if rotates(p * c) {
        p * c
    } else {
        last_step(p).0 * c
    };
    reduce_scatter_with(t, send, recv, c, n, |input, work| {
        reduce_in_work(t, input, work, count, dt, op).map(|()| 0)
    })
}

/// A reduce-scatter's frame on the host path: `n` bytes of work in the thread's
/// scratch, the input (p·c bytes of `send`, borrowed for writing where `recv` lies in
/// it) to `steps`, which leave this rank's reduced chunk in the work at the offset they
/// return; from there it goes to `recv`.
fn reduce_scatter_with(
    t: &dyn Transport,
    send: &Buffer,
    recv: &Buffer,
    c: usize,
    n: usize,
    steps: impl FnOnce(&[u8], &mut [u8]) -> Result<usize>,
) -> Result<()> {
    let (p, x, to) = (t.size(), t.rank(), t.timeout());
    with_work(n, |work| {
        if recv.offset_in(send) == Some(x * c) {
            let mut all = send.write_timeout(to)?;
            let at = steps(&all[..p * c], work)?;
            all[x * c..(x + 1) * c].copy_from_slice(&work[at..at + c]);
        } else {
            let input = send.read_timeout(to)?;
            let at = steps(&input[..p * c], work)?;
            recv.write_timeout(to)?[..c].copy_from_slice(&work[at..at + c]);
        }
        Ok(())
    })
}

/// The reduce-scatter's steps over `input` (p·c), leaving this rank's reduced chunk in
/// `work[..c]`. Up to [`super::log_step::ROTATE_UP_TO`] bytes `work` (p·c) is a rotated copy of the
/// input; above it (D·c, D the largest step) the first step sends straight from the
/// input and the positions it receives take this rank's chunks by a reduction
/// (`first_step_direct` of the ops path).
fn reduce_in_work(
    t: &dyn Transport,
    input: &[u8],
    work: &mut [u8],
    count: usize,
    dt: DataType,
    op: ReduceOp,
) -> Result<()> {
    let (p, x) = (t.size(), t.rank());
    let c = count * dt.size();
    let all = steps(p);
    let chunk = |(a, m): (usize, usize)| &input[a * c..(a + m) * c];
    let skip = if rotates(p * c) {
        let mut at = 0;
        for r in runs(x, p, p) {
            work[at..at + r.1 * c].copy_from_slice(chunk(r));
            at += r.1 * c;
        }
        0
    } else {
        let f = FirstStep::of(p, x, c);
        let sends: Vec<(usize, &[u8])> =
            f.sends.iter().map(|r| (f.dst, &input[r.clone()])).collect();
        let mut recvs = Vec::with_capacity(2);
        let mut rest = &mut work[..f.work];
        for r in &f.recvs {
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(r.len());
            recvs.push((f.src, piece));
            rest = tail;
        }
        exchange(t, &sends, &mut recvs)?;
        for (w, own, reduce) in f.fill {
            match reduce {
                true => reduce_into(&mut work[w], &input[own], dt, op),
                false => work[w].copy_from_slice(&input[own]),
            }
        }
        1
    };
    for &(d, m) in all.iter().rev().skip(skip) {
        let (acc, give) = work.split_at_mut(d * c);
        t.sendrecv_reduce(
            (x + d) % p,
            &give[..m * c],
            (x + p - d) % p,
            Fold::Into(&mut acc[..m * c]),
            dt,
            op,
        )?;
    }
    Ok(())
}

/// [`super::recursive::all_gather`] (p a power of two): in place in `recv`, one
/// exchange with x ^ b per step.
pub(super) fn doubling(t: &dyn Transport, send: &Buffer, recv: &Buffer, c: usize) -> Result<()> {
    let (p, x, to) = (t.size(), t.rank(), t.timeout());
    let in_place = send.offset_in(recv) == Some(x * c);
    let mut out = recv.write_timeout(to)?;
    let out = &mut out[..p * c];
    if !in_place {
        out[x * c..(x + 1) * c].copy_from_slice(&send.read_timeout(to)?[..c]);
    }
    for b in sizes(p) {
        let y = x ^ b;
        let (give, take) = apart(out, lo(x, b) * c, lo(y, b) * c, b * c);
        t.sendrecv(y, give, y, take)?;
    }
    Ok(())
}

/// [`super::recursive::reduce_scatter`] (p a power of two): the first step sends
/// straight from `send` and folds what comes with this rank's half of it into the work
/// (p/2 chunks, in the thread's scratch); in place when `recv` is `send[x·c..]`.
pub(super) fn halving(t: &dyn Transport, send: &Buffer, recv: &Buffer, r: Reduction) -> Result<()> {
    let Reduction { count, dt, op } = r;
    let (p, c) = (t.size(), count * dt.size());
    reduce_scatter_with(t, send, recv, c, p / 2 * c, |input, work| {
        halving_steps(t, input, work, c, dt, op)
    })
}

/// Two disjoint runs of `n` bytes of `buf`, at `give` (read) and `take` (written).
fn apart(buf: &mut [u8], give: usize, take: usize, n: usize) -> (&[u8], &mut [u8]) {
    if give < take {
        let (a, z) = buf.split_at_mut(take);
        (&a[give..give + n], &mut z[..n])
    } else {
        let (a, z) = buf.split_at_mut(give);
        (&z[..n], &mut a[take..take + n])
    }
}

/// The halving steps over `input` (p·c); returns where this rank's reduced chunk lies
/// in `work` (p/2 chunks: this rank's half, from chunk lo(x, p/2)).
fn halving_steps(
    t: &dyn Transport,
    input: &[u8],
    work: &mut [u8],
    c: usize,
    dt: DataType,
    op: ReduceOp,
) -> Result<usize> {
    let (p, x) = (t.size(), t.rank());
    let base = lo(x, p / 2);
    for b in sizes(p).rev() {
        let y = x ^ b;
        let (mine, theirs, n) = (lo(x, b), lo(y, b), b * c);
        if b == p / 2 {
            // The partial sums so far are the input itself (the ops path's copy, then
            // its fold: the same operands in the same order).
            let local = &input[mine * c..mine * c + n];
            let fold = Fold::After {
                out: &mut work[..n],
                local,
            };
            t.sendrecv_reduce(y, &input[theirs * c..theirs * c + n], y, fold, dt, op)?;
            continue;
        }
        let (give, acc) = apart(work, (theirs - base) * c, (mine - base) * c, n);
        t.sendrecv_reduce(y, give, y, Fold::Into(acc), dt, op)?;
    }
    Ok((x - base) * c)
}
