//! Running one round's items on one rank, and describing them.

use super::schedule::steps;
use super::setup::{Body, Chain, ChainKind, Grid, Item, Slot, Spec, What};
use strata::check::{self, Kind};
use strata::{group_end, group_start, Buffer, Comm, DataType, Error, Op, Request, Result, Work};

/// A submitted item: its handles and how to check it once they completed.
pub(crate) struct Pending {
    pub(crate) item: usize,
    pub(crate) works: Vec<Work>,
    pub(crate) verify: Box<dyn FnOnce() -> Result<usize>>,
}

pub(crate) fn describe(item: &Item, slots: &[Slot], grids: &[Grid]) -> String {
    match &item.body {
        Body::One(s) => {
            let what = match s.what {
                What::Plain(Kind::Broadcast { root }) => format!("broadcast root {root}"),
                What::Plain(k) => k.name().to_string(),
                What::Coalesced(k) => format!("{}-coalesced {:?}", k.name(), s.counts),
                What::Quant(k) => format!(
                    "{} {:?}",
                    k.name(),
                    s.quant.map(|q| (q.bits, q.block)).unwrap_or_default()
                ),
                What::Shift(d) => format!("send/recv shift {d}"),
            };
            format!(
                "{what} {} {} {} count {}{}{} on {} ({} ranks)",
                s.algo,
                s.dtype,
                s.redop.name(),
                s.count,
                if s.in_place { " in place" } else { "" },
                if s.grouped { " grouped" } else { "" },
                slots[s.slot].name,
                slots[s.slot].size
            )
        }
        Body::Chain(c) => {
            let g = &grids[c.grid];
            let st: Vec<String> = steps(c.kind, g)
                .iter()
                .zip(&c.algos)
                .map(|(&(slot, k, mul), a)| {
                    format!(
                        "{} {a} x{} on {}",
                        k.name(),
                        c.count * mul,
                        slots[slot].name
                    )
                })
                .collect();
            format!(
                "chain {} over {} (k {}) {} {} count {}{}: {}",
                c.kind.name(),
                slots[g.base].name,
                g.k,
                c.dtype,
                c.redop.name(),
                c.count,
                if c.in_place { " in place" } else { "" },
                st.join(" -> ")
            )
        }
    }
}

pub(crate) fn submit(comm: &Comm, req: Request) -> Result<Work> {
    comm.submit(req)
}

pub(crate) fn a5(comm: &Comm, elems: usize, dt: DataType) -> Result<Buffer> {
    comm.native_from(&vec![0xA5; elems * dt.size()])
}

/// Submit a single collective (this rank is a member of `comm`).
pub(crate) fn run_single(
    comm: &Comm,
    s: &Spec,
    seed: u64,
    deps: Vec<Work>,
) -> Result<(Vec<Work>, Box<dyn FnOnce() -> Result<usize>>)> {
    let (p, r) = (comm.size(), comm.rank());
    let (dt, redop, count) = (s.dtype, s.redop, s.count);
    let sz = dt.size();
    match s.what {
        What::Plain(kind) | What::Quant(kind) => {
            let nr = kind.sizes(count, p).1;
            let input = kind.input(dt, r, count, p, seed);
            let (send, recv) = match (s.in_place, kind) {
                (true, Kind::AllGather) => {
                    let recv = a5(comm, nr, dt)?;
                    let send = recv.slice(r * count * sz..(r + 1) * count * sz)?;
                    send.write_bytes(&input)?;
                    (send, recv)
                }
                (true, Kind::ReduceScatter) => {
                    let send = comm.native_from(&input)?;
                    let recv = send.slice(r * count * sz..(r + 1) * count * sz)?;
                    (send, recv)
                }
                (true, _) => {
                    let b = comm.native_from(&input)?;
                    (b.clone(), b)
                }
                _ => (comm.native_from(&input)?, a5(comm, nr, dt)?),
            };
            let mut req = Request::new(kind.op(send, recv.clone(), count, redop), dt)
                .with_algo(s.algo)
                .after(deps);
            if let Some(q) = s.quant {
                req = req.with_quant(q);
            }
            let w = submit(comm, req)?;
            let (c, algo, quant) = (comm.clone(), s.algo, s.quant);
            Ok((
                vec![w],
                Box::new(move || {
                    let got = recv.to_bytes()?;
                    match quant {
                        Some(q) => {
                            let case = check::QuantCase {
                                kind,
                                dtype: dt,
                                redop,
                                count,
                                algo,
                                q,
                                seed,
                            };
                            Ok(check::check_quant(&c, &case, &got)?.wrong)
                        }
                        None => Ok(check::count_wrong(
                            dt,
                            &got,
                            &kind.expected(dt, redop, r, count, p, seed),
                            p,
                        )),
                    }
                }),
            ))
        }
        What::Coalesced(kind) => {
            let (mut sends, mut recvs) = (Vec::new(), Vec::new());
            for (t, &c) in s.counts.iter().enumerate() {
                sends.push(comm.native_from(&kind.input(dt, r, c, p, seed + t as u64))?);
                recvs.push(a5(comm, kind.sizes(c, p).1, dt)?);
            }
            let counts = s.counts.clone();
            let op = kind.coalesced(sends, recvs.clone(), counts.clone(), redop)?;
            let w = submit(comm, Request::new(op, dt).with_algo(s.algo).after(deps))?;
            Ok((
                vec![w],
                Box::new(move || {
                    let mut wrong = 0;
                    for (t, (&c, b)) in counts.iter().zip(&recvs).enumerate() {
                        let want = kind.expected(dt, redop, r, c, p, seed + t as u64);
                        wrong += check::count_wrong(dt, &b.to_bytes()?, &want, p);
                    }
                    Ok(wrong)
                }),
            ))
        }
        What::Shift(d) => {
            let (dst, src) = ((r + d) % p, (r + p - d) % p);
            let sbuf = comm.native_from(&check::fill(dt, r, 0, count, seed))?;
            let rbuf = a5(comm, count, dt)?;
            group_start();
            let ws = submit(
                comm,
                Request::new(
                    Op::Send {
                        buf: sbuf,
                        count,
                        peer: dst,
                    },
                    dt,
                )
                .after(deps),
            );
            let wr = submit(
                comm,
                Request::new(
                    Op::Recv {
                        buf: rbuf.clone(),
                        count,
                        peer: src,
                    },
                    dt,
                ),
            );
            group_end()?;
            let works = vec![ws?, wr?];
            Ok((
                works,
                Box::new(move || {
                    let want: Vec<f64> =
                        (0..count).map(|i| check::value(dt, src, i, seed)).collect();
                    Ok(check::count_wrong(dt, &rbuf.to_bytes()?, &want, 1))
                }),
            ))
        }
    }
}

/// Submit a chain (every rank is in every grid).
pub(crate) fn run_chain(
    slots: &[Slot],
    g: &Grid,
    c: &Chain,
    seed: u64,
) -> Result<(Vec<Work>, Box<dyn FnOnce() -> Result<usize>>)> {
    let get = |i: usize| {
        slots[i]
            .comm
            .clone()
            .ok_or_else(|| Error::Internal(format!("not in {}", slots[i].name)))
    };
    let base = get(g.base)?;
    let (p, cr, k) = (base.size(), base.rank(), g.k);
    let (b, n, dt, op) = (cr / k, c.count, c.dtype, c.redop);
    let sz = dt.size();
    let steps = steps(c.kind, g);
    // The first input and the expected result of the composition on the base.
    let (input, expected): (Vec<u8>, Box<dyn FnOnce() -> Vec<f64>>) = match c.kind {
        ChainKind::Ar2 { .. } => (
            check::fill(dt, cr, 0, n, seed),
            Box::new(move || Kind::AllReduce.expected(dt, op, cr, n, p, seed)),
        ),
        ChainKind::Rs2 => (
            check::fill(dt, cr, 0, p * n, seed),
            Box::new(move || Kind::ReduceScatter.expected(dt, op, cr, n, p, seed)),
        ),
        ChainKind::RsAr => (
            check::fill(dt, cr, 0, p * n, seed),
            Box::new(move || Kind::ReduceScatter.expected(dt, op, b, k * n, p, seed)),
        ),
        ChainKind::Ag2 => (
            check::fill(dt, cr, 0, n, seed),
            Box::new(move || Kind::AllGather.expected(dt, op, cr, n, p, seed)),
        ),
        ChainKind::Ar4 => (
            check::fill(dt, cr, 0, p * n, seed),
            Box::new(move || Kind::AllReduce.expected(dt, op, cr, p * n, p, seed)),
        ),
    };
    // Per step (send, recv). In place: views of one buffer laid out as the hierarchical
    // algorithms do; otherwise a fresh receive buffer per step.
    let bytes = |from: usize, len: usize| from * sz..(from + len) * sz;
    let mut bufs: Vec<(Buffer, Buffer)> = Vec::new();
    if c.in_place {
        let z = match c.kind {
            ChainKind::Ag2 => {
                let z = a5(&base, p * n, dt)?;
                z.slice(bytes(cr * n, n))?.write_bytes(&input)?;
                z
            }
            _ => base.native_from(&input)?,
        };
        bufs = match c.kind {
            ChainKind::Ar2 { .. } => vec![(z.clone(), z.clone()), (z.clone(), z)],
            kind => {
                let block = z.slice(bytes(b * k * n, k * n))?;
                let mine = z.slice(bytes(cr * n, n))?;
                match kind {
                    ChainKind::Rs2 => vec![(z, block.clone()), (block, mine)],
                    ChainKind::RsAr => vec![(z, block.clone()), (block.clone(), block)],
                    ChainKind::Ag2 => vec![(mine, block.clone()), (block, z)],
                    _ => vec![
                        (z.clone(), block.clone()),
                        (block.clone(), mine.clone()),
                        (mine, block.clone()),
                        (block, z),
                    ],
                }
            }
        };
    } else {
        let mut send = base.native_from(&input)?;
        for &(slot, kind, mul) in &steps {
            let q = slots[slot].size;
            let recv = a5(&base, kind.sizes(n * mul, q).1, dt)?;
            bufs.push((send, recv.clone()));
            send = recv;
        }
    }
    let mut works: Vec<Work> = Vec::new();
    for (i, (&(slot, kind, mul), (send, recv))) in steps.iter().zip(bufs.iter()).enumerate() {
        let comm = get(slot)?;
        let req = Request::new(kind.op(send.clone(), recv.clone(), n * mul, op), dt)
            .with_algo(c.algos[i])
            .after(works.last().cloned());
        works.push(submit(&comm, req)?);
    }
    let out = bufs
        .last()
        .map(|x| x.1.clone())
        .ok_or_else(|| Error::Internal("empty chain".into()))?;
    Ok((
        works,
        Box::new(move || Ok(check::count_wrong(dt, &out.to_bytes()?, &expected(), p))),
    ))
}
