//! The transport-independent self test: one body, every rank of a world calls it, run on
//! the local transport by `tests/every_transport.rs`, on the GPU transports by
//! `tests/gpu_transports.rs` and under mpirun by `examples/mpi_check.rs`. It checks each
//! collective against [`strata::check`]'s exact references.

use strata::check::{fill, run_checked, run_checked_coalesced, run_checked_quant, Kind, QuantCase};
use strata::{Algo, Comm, DataType, Error, ReduceOp, Result};

/// The transport-independent self test: every collective, dtype, algorithm, in-place
/// variant and coalesced form on small odd counts. Returns the first failure as an error.
/// Every rank of `comm` must call it.
pub fn exercise(comm: &Comm) -> Result<()> {
    let algos = Algo::LOSSLESS;
    let mut seed = 1;
    for dtype in [DataType::F32, DataType::F16, DataType::BF16] {
        for count in [1usize, 7, 33] {
            for algo in algos {
                for (kind, ops) in [
                    (Kind::AllGather, &[ReduceOp::Sum][..]),
                    (
                        Kind::ReduceScatter,
                        &[ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min][..],
                    ),
                    (Kind::AllReduce, &[ReduceOp::Sum, ReduceOp::Avg][..]),
                ] {
                    for &redop in ops {
                        for in_place in [false, true] {
                            seed += 1;
                            let w =
                                run_checked(comm, kind, dtype, redop, count, algo, in_place, seed)?;
                            if w != 0 {
                                return Err(Error::Internal(format!(
                                    "{} {dtype} {redop} count {count} algo {algo} in_place {in_place}: {w} wrong on rank {}",
                                    kind.name(), comm.rank()
                                )));
                            }
                        }
                    }
                }
                for kind in [Kind::AllGather, Kind::ReduceScatter] {
                    seed += 10;
                    let w = run_checked_coalesced(
                        comm,
                        kind,
                        dtype,
                        ReduceOp::Avg,
                        &[count, 3, 0, count + 5, 1],
                        algo,
                        seed,
                    )?;
                    if w != 0 {
                        return Err(Error::Internal(format!(
                            "coalesced {} {dtype} count {count} algo {algo}: {w} wrong",
                            kind.name()
                        )));
                    }
                }
            }
        }
        for kind in [
            Kind::AllToAll,
            Kind::Broadcast {
                root: comm.size() / 2,
            },
        ] {
            for in_place in [false, true] {
                seed += 1;
                let w = run_checked(
                    comm,
                    kind,
                    dtype,
                    ReduceOp::Sum,
                    5,
                    Algo::Auto,
                    in_place && kind != Kind::AllToAll,
                    seed,
                )?;
                if w != 0 {
                    return Err(Error::Internal(format!(
                        "{} {dtype}: {w} wrong on rank {}",
                        kind.name(),
                        comm.rank()
                    )));
                }
            }
        }
    }
    for dtype in [DataType::I8, DataType::U8, DataType::I32] {
        seed += 1;
        let w = run_checked(
            comm,
            Kind::AllReduce,
            dtype,
            ReduceOp::Sum,
            9,
            Algo::Auto,
            false,
            seed,
        )?;
        if w != 0 {
            return Err(Error::Internal(format!("all-reduce {dtype}: {w} wrong")));
        }
    }
    // Quantized collectives: within the format's bound of the exact result.
    for (algo, kind, op) in [
        (Algo::Qgz, Kind::ReduceScatter, ReduceOp::Avg),
        (Algo::Qgz1, Kind::ReduceScatter, ReduceOp::Sum),
        (Algo::Qwz, Kind::AllGather, ReduceOp::Sum),
    ] {
        for (bits, dtype) in [(4, DataType::BF16), (8, DataType::F16)] {
            seed += 1;
            let q = strata::kernels::QuantSpec::new(bits, 32)?;
            let case = QuantCase {
                kind,
                dtype,
                redop: op,
                count: 37,
                algo,
                q,
                seed,
            };
            let r = run_checked_quant(comm, &case)?;
            if r.wrong != 0 {
                return Err(Error::Internal(format!(
                    "{algo} {dtype} int{bits}: {} outside the bound {} (max error {})",
                    r.wrong, r.bound, r.max_err
                )));
            }
        }
    }
    // Point to point around the ring.
    let (p, r) = (comm.size(), comm.rank());
    let out = comm.native_from(&fill(DataType::F32, r, 0, 11, 99))?;
    let inc = comm.alloc_native(11 * 4)?;
    let ws = comm.send(&out, 11, DataType::F32, (r + 1) % p)?;
    let wr = comm.recv(&inc, 11, DataType::F32, (r + p - 1) % p)?;
    ws.wait()?;
    wr.wait()?;
    if inc.to_bytes()? != fill(DataType::F32, (r + p - 1) % p, 0, 11, 99) {
        return Err(Error::Internal("send/recv delivered wrong data".into()));
    }
    grouped_exchange(comm)?;
    user_level_after_parent(comm)?;
    census_after_an_abort(comm)?;
    shrink_without_the_last(comm)
}

/// The census (issue 51) where the transport takes one (`local`, `mpi`, the in-process
/// device transports): every rank
/// comes, on a live communicator and on one aborted first (a census is what survivors
/// take after a failure aborted theirs), and each gets every rank.
fn census_after_an_abort(comm: &Comm) -> Result<()> {
    use strata::transport::TransportKind::{CudaLocal, HostLocal, Local, Mpi};
    if !matches!(comm.transport_kind(), Local | Mpi | HostLocal | CudaLocal) {
        return Ok(());
    }
    let everyone: Vec<usize> = (0..comm.size()).collect();
    let live = comm.survivors()?;
    let copy = comm
        .split(Some(0), comm.rank() as i32)?
        .ok_or_else(|| Error::Internal("split with one color gave no communicator".into()))?;
    copy.abort();
    let after = copy.survivors()?;
    if live != everyone || after != everyone {
        return Err(Error::Internal(format!(
            "census on rank {}: {live:?} live, {after:?} after an abort; every rank came",
            comm.rank()
        )));
    }
    Ok(())
}

/// A shrink (issue 51) of a live communicator where the transport has one (`local`,
/// `mpi`, the in-process device transports): every rank but the last makes a communicator without it and runs every
/// lossless algorithm's all-reduce there; the last rank does not call.
fn shrink_without_the_last(comm: &Comm) -> Result<()> {
    use strata::transport::TransportKind::{CudaLocal, HostLocal, Local, Mpi};
    let p = comm.size();
    if p < 2
        || comm.rank() == p - 1
        || !matches!(comm.transport_kind(), Local | Mpi | HostLocal | CudaLocal)
    {
        return Ok(());
    }
    let s = comm.shrink(&[p - 1])?;
    for (i, algo) in Algo::LOSSLESS.into_iter().enumerate() {
        let w = run_checked(
            &s,
            Kind::AllReduce,
            DataType::F32,
            ReduceOp::Sum,
            7,
            algo,
            false,
            900 + i as u64,
        )?;
        if w != 0 {
            return Err(Error::Internal(format!(
                "all-reduce ({algo}) on the communicator shrunk to {} ranks: {w} wrong on rank {}",
                p - 1,
                s.rank()
            )));
        }
    }
    s.destroy()
}

/// One group per rank: two messages each way around the ring (one far past MPI's eager
/// limit, so a send completes only once its receive is posted) and an all-reduce, which
/// odd ranks submit first and even ranks last. The sends and receives run together and
/// never cross the collective's messages.
fn grouped_exchange(comm: &Comm) -> Result<()> {
    let (p, r) = (comm.size(), comm.rank());
    let (right, left) = ((r + 1) % p, (r + p - 1) % p);
    let sizes = [40_000usize, 3];
    let f32s = DataType::F32;
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        for (dir, peer) in [(0, right), (1, left)] {
            sends.push((
                comm.native_from(&fill(f32s, r, 100 * i + dir, n, 7))?,
                n,
                peer,
            ));
            recvs.push((comm.alloc_native(n * 4)?, n, dir, i));
        }
    }
    let ar = comm.native_from(&fill(DataType::I32, r, 0, 5, 7))?;
    let all_reduce = || comm.all_reduce(&ar, &ar, 5, DataType::I32, ReduceOp::Sum);
    strata::group_start();
    let mut ws = Vec::new();
    let submitted = (|| {
        if r % 2 == 1 {
            ws.push(all_reduce()?);
        }
        for ((b, n, dir, _), (s, _, peer)) in recvs.iter().zip(&sends) {
            ws.push(comm.recv(b, *n, f32s, if *dir == 0 { left } else { right })?);
            ws.push(comm.send(s, *n, f32s, *peer)?);
        }
        if r % 2 == 0 {
            ws.push(all_reduce()?);
        }
        Ok::<_, Error>(())
    })();
    strata::group_end()?;
    submitted?;
    ws.iter().try_for_each(|w| w.wait())?;
    for (b, n, dir, i) in &recvs {
        let from = if *dir == 0 { left } else { right };
        if b.to_bytes()? != fill(f32s, from, 100 * i + dir, *n, 7) {
            return Err(Error::Internal(format!(
                "grouped exchange: message {i} from rank {from} wrong on rank {r}"
            )));
        }
    }
    let want: Vec<u8> = (0..5)
        .flat_map(|j| {
            (0..p)
                .map(|q| {
                    i32::from_le_bytes(fill(DataType::I32, q, j, 1, 7)[..4].try_into().unwrap())
                })
                .fold(0i32, |a, x| a.wrapping_add(x))
                .to_le_bytes()
        })
        .collect();
    if ar.to_bytes()? != want {
        return Err(Error::Internal(format!(
            "grouped all-reduce wrong on rank {r}"
        )));
    }
    Ok(())
}

/// Work on the user's level communicator that waits for a parent collective whose
/// algorithm (hier) runs its steps on level communicators too: the user's are its own,
/// so this neither deadlocks nor interleaves with the parent's steps.
fn user_level_after_parent(comm: &Comm) -> Result<()> {
    let levels = comm.hierarchy().map_or(0, |h| h.levels.len());
    if levels == 0 {
        return Ok(());
    }
    let r = comm.rank();
    let sub = comm.level_comm(levels - 1)?;
    let n = 4 * comm.size();
    let send = comm.native_from(&fill(DataType::F32, r, 0, 4, 9))?;
    let recv = comm.alloc_native(n * 4)?;
    let parent = comm.submit(
        strata::Request::new(
            strata::Op::AllGather {
                send: send.clone(),
                recv: recv.clone(),
                count: 4,
            },
            DataType::F32,
        )
        .with_algo(Algo::Hier),
    )?;
    let mine = comm.native_from(&fill(DataType::I32, r, 0, 3, 9))?;
    let w = sub.submit(
        strata::Request::new(
            strata::Op::AllReduce {
                send: mine.clone(),
                recv: mine.clone(),
                count: 3,
                op: ReduceOp::Max,
            },
            DataType::I32,
        )
        .after([parent.clone()]),
    )?;
    w.wait()?;
    parent.wait()?;
    let want: Vec<u8> = (0..comm.size())
        .flat_map(|q| fill(DataType::F32, q, 0, 4, 9))
        .collect();
    if recv.to_bytes()? != want {
        return Err(Error::Internal(format!(
            "hier all-gather before level work wrong on rank {r}"
        )));
    }
    Ok(())
}
