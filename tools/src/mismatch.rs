//! Collective mismatch detection, end to end (`STRATA_DEBUG=check`,
//! [`strata::runtime::mismatch`]): one body, every rank of a world calls it, run on the
//! local transport by `tests/mismatch.rs` and under mpirun by `examples/mpi_mismatch.rs`.
//! Rank 2 calls something else than the others, once per kind of mismatch (op, count,
//! dtype, reduction, root, coalesced counts, group length, group order);
//! every rank must get the exact message, and a matched all-reduce after each must
//! give the right sum (the communicator stays usable).

use strata::{Algo, Buffer, Comm, DataType, Error, Op, ReduceOp, Request, Result, Work};

/// The rank that differs.
pub const ODD: usize = 2;

/// Run every mismatch kind on a communicator split from `comm` (its check setting, a
/// fresh sequence number) of 3 to 5 ranks; returns how many were caught.
pub fn exercise(comm: &Comm) -> Result<usize> {
    let n = comm.size();
    if !(3..=5).contains(&n) {
        return Err(Error::InvalidUsage(format!(
            "the mismatch test needs 3 to 5 ranks, not {n}"
        )));
    }
    if !comm.checks() {
        return Err(Error::InvalidUsage(
            "mismatch checking is off: run with STRATA_DEBUG=check".into(),
        ));
    }
    let c = comm
        .split(Some(0), comm.rank() as i32)?
        .ok_or_else(|| Error::Internal("split returned no communicator".into()))?;
    let odd = c.rank() == ODD;
    let rest = (0..n)
        .filter(|&r| r != ODD)
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let ring = |op: Op, dt: DataType| c.submit(Request::new(op, dt).with_algo(Algo::Ring));
    let buf = |bytes: usize| Buffer::zeroed(bytes);
    let ag = |count: usize, dt: DataType| {
        ring(
            Op::AllGather {
                send: buf(count * dt.size()),
                recv: buf(n * count * dt.size()),
                count,
            },
            dt,
        )
    };
    let ar = |count: usize, dt: DataType, op: ReduceOp| {
        ring(
            Op::AllReduce {
                send: buf(count * dt.size()),
                recv: buf(count * dt.size()),
                count,
                op,
            },
            dt,
        )
    };
    let group = |calls: &mut dyn FnMut() -> Result<Vec<Work>>| -> Result<Vec<Work>> {
        strata::group_start();
        let w = calls();
        strata::group_end()?;
        w
    };
    type Case<'a> = (
        &'a str,
        String,
        String,
        Box<dyn Fn(bool) -> Result<Vec<Work>> + 'a>,
    );
    let f32 = DataType::F32;
    let cases: Vec<Case> = vec![
        (
            "op",
            "all-reduce(count=8, f32, sum, ring)".into(),
            "all-gather(count=8, f32, ring)".into(),
            Box::new(|odd| {
                Ok(vec![if odd {
                    ag(8, f32)?
                } else {
                    ar(8, f32, ReduceOp::Sum)?
                }])
            }),
        ),
        (
            "count",
            "all-gather(count=1024, f32, ring)".into(),
            "all-gather(count=512, f32, ring)".into(),
            Box::new(|odd| Ok(vec![ag(if odd { 512 } else { 1024 }, f32)?])),
        ),
        (
            "dtype",
            "all-reduce(count=64, f32, sum, ring)".into(),
            "all-reduce(count=64, bf16, sum, ring)".into(),
            Box::new(|odd| {
                let dt = if odd { DataType::BF16 } else { f32 };
                Ok(vec![ar(64, dt, ReduceOp::Sum)?])
            }),
        ),
        (
            "reduction",
            "all-reduce(count=64, f32, sum, ring)".into(),
            "all-reduce(count=64, f32, max, ring)".into(),
            Box::new(|odd| {
                let op = if odd { ReduceOp::Max } else { ReduceOp::Sum };
                Ok(vec![ar(64, f32, op)?])
            }),
        ),
        (
            "root",
            "broadcast(count=16, f32, root=0, ring)".into(),
            "broadcast(count=16, f32, root=1, ring)".into(),
            Box::new(|odd| {
                let root = usize::from(odd);
                Ok(vec![ring(
                    Op::Broadcast {
                        send: buf(64),
                        recv: buf(64),
                        count: 16,
                        root,
                    },
                    f32,
                )?])
            }),
        ),
        (
            "coalesced counts",
            "all-gather-coalesced(counts=[3, 5], f32, ring)".into(),
            "all-gather-coalesced(counts=[3, 6], f32, ring)".into(),
            Box::new(|odd| {
                let counts = [3, if odd { 6 } else { 5 }];
                Ok(vec![ring(
                    Op::AllGatherCoalesced {
                        sends: counts.iter().map(|k| buf(4 * k)).collect(),
                        recvs: counts.iter().map(|k| buf(4 * n * k)).collect(),
                        counts: counts.to_vec(),
                    },
                    f32,
                )?])
            }),
        ),
        (
            "group length",
            "group[all-gather(count=8, f32, ring), all-reduce(count=8, f32, sum, ring)]".into(),
            "all-gather(count=8, f32, ring)".into(),
            Box::new(|odd| {
                group(&mut || {
                    let mut w = vec![ag(8, f32)?];
                    if !odd {
                        w.push(ar(8, f32, ReduceOp::Sum)?);
                    }
                    Ok(w)
                })
            }),
        ),
        (
            "group order",
            "group[all-gather(count=8, f32, ring), all-reduce(count=8, f32, sum, ring)]".into(),
            "group[all-reduce(count=8, f32, sum, ring), all-gather(count=8, f32, ring)]".into(),
            Box::new(|odd| {
                group(&mut || {
                    Ok(if odd {
                        vec![ar(8, f32, ReduceOp::Sum)?, ag(8, f32)?]
                    } else {
                        vec![ag(8, f32)?, ar(8, f32, ReduceOp::Sum)?]
                    })
                })
            }),
        ),
    ];
    // Each case is one checked call, then one checked matched all-reduce.
    let mut seq = 0;
    for (what, same, other, call) in &cases {
        let want = format!(
            "invalid usage: collective mismatch on a communicator of {n} ranks (seq {seq}): \
             ranks {rest} called {same}; rank {ODD} called {other}"
        );
        let works = call(odd)?;
        for w in works {
            match w.wait() {
                Err(e) if e.to_string() == want => {}
                r => {
                    return Err(Error::Internal(format!(
                        "{what} mismatch on rank {}: {r:?}, expected Err({want})",
                        c.rank()
                    )))
                }
            }
        }
        if c.last_error() != want {
            return Err(Error::Internal(format!(
                "{what}: last error {:?}",
                c.last_error()
            )));
        }
        seq += 2;
        matched_sum(&c)?;
    }
    c.destroy()?;
    Ok(cases.len())
}

/// A checked all-reduce every rank calls alike gives the exact sum.
fn matched_sum(c: &Comm) -> Result<()> {
    let n = c.size();
    let send = Buffer::from_slice(&[c.rank() as f32 + 1.0; 5]);
    let recv = Buffer::zeroed(20);
    c.all_reduce(&send, &recv, 5, DataType::F32, ReduceOp::Sum)?
        .wait()?;
    let want = (n * (n + 1) / 2) as f32;
    let got = recv.to_vec::<f32>()?;
    if got != [want; 5] {
        return Err(Error::Internal(format!(
            "matched all-reduce after a mismatch gave {got:?}, expected {want}"
        )));
    }
    Ok(())
}
