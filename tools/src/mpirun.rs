//! The end of an example run under mpirun: MPI finalized whatever the rank's work
//! returned, and that result as the process's exit code.

use std::process::ExitCode;

/// Runs `body` (one rank's work), finalizes MPI, and exits with success, or with
/// failure after printing `{name} failed: {error}` to stderr.
pub fn run_and_finalize<T>(name: &str, body: impl FnOnce() -> strata::Result<T>) -> ExitCode {
    let r = body();
    strata::transport::mpi::finalize();
    match r {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name} failed: {e}");
            ExitCode::FAILURE
        }
    }
}
