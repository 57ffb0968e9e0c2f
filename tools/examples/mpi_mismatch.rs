//! Collective mismatch detection under mpirun (`strata_tools::mismatch::exercise`, the
//! body `tests/mismatch.rs` runs on the local transport): rank 2 calls something else
//! than the others, once per kind of mismatch, and every rank must fail with the exact
//! message. Usage: `STRATA_DEBUG=check mpirun -np N target/release/examples/mpi_mismatch`
//! (N = 3 to 5).

use std::process::ExitCode;
use strata::{Comm, CommConfig, Topology};

fn run() -> strata::Result<usize> {
    let n = std::env::var("OMPI_COMM_WORLD_SIZE")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(1);
    let topo = Topology::parse(&format!("nodes:{n}x1"))?;
    let comm = Comm::mpi_world(Some(topo), CommConfig::from_env()?)?;
    let kinds = strata_tools::mismatch::exercise(&comm)?;
    if comm.rank() == 0 {
        println!("mpi_mismatch OK np={} kinds={kinds}", comm.size());
    }
    comm.destroy()?;
    Ok(kinds)
}

fn main() -> ExitCode {
    strata_tools::mpirun::run_and_finalize("mpi_mismatch", run)
}
