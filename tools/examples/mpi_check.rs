//! The transport-independent self test (`strata_tools::selftest::exercise`, the same
//! body the local-transport tests run) on the MPI transport. Usage:
//! `mpirun -np N target/release/examples/mpi_check [TOPOLOGY]` (default:
//! `STRATA_TOPOLOGY`, else the layout of the hosts the ranks run on).

use std::process::ExitCode;
use strata::{Comm, CommConfig, Topology};

fn run() -> strata::Result<usize> {
    let topo = std::env::args()
        .nth(1)
        .map(|s| Topology::parse(&s))
        .transpose()?;
    let comm = Comm::mpi_world(topo, CommConfig::from_env()?)?;
    strata_tools::selftest::exercise(&comm)?;
    let rank = comm.rank();
    if rank == 0 {
        println!(
            "mpi_check OK np={} topology={}",
            comm.size(),
            comm.topology().summary()
        );
    }
    comm.destroy()?;
    Ok(rank)
}

fn main() -> ExitCode {
    strata_tools::mpirun::run_and_finalize("mpi_check", run)
}
