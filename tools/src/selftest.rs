//! The transport-independent self test: one body, every rank of a world calls it, run on
//! the local transport by `tests/every_transport.rs`, on the GPU transports by
//! `tests/gpu_transports.rs` and under mpirun by `examples/mpi_check.rs`. It checks each
//! collective against [`strata::check`]'s exact references.

use strata::check::{fill, run_checked, run_checked_coalesced, run_checked_quant, Kind};
use strata::{Algo, Comm, DataType, Error, ReduceOp, Result};

/// The transport-independent self test: every collective, dtype, algorithm, in-place
/// variant and coalesced form on small odd counts. Returns the first failure as an error.
/// Every rank of `comm` must call it.
pub fn exercise(comm: &Comm) -> Result<()> {
    let algos = [Algo::Ring, Algo::Hier, Algo::HoRing, Algo::Auto];
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
            let r = run_checked_quant(comm, kind, dtype, op, 37, algo, q, seed)?;
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
    Ok(())
}
