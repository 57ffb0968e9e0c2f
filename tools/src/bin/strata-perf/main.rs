//! `strata-perf`: the nccl-tests-style benchmark of strata.
//!
//! Sweeps (op, algo, dtype, redop, size) and prints one nccl-tests row per point: size,
//! count, type, redop, algo, time, algbw, busbw, #wrong, plus the traffic one call moves
//! per link class. Sizes, counts and the algbw / busbw formulas are nccl-tests' exactly:
//!
//! | op | `count` (NCCL's per-call count) | `size` (bytes of the larger buffer) | busbw factor |
//! |---|---|---|---|
//! | all-gather | per-rank sendcount | count·p·s | (p-1)/p |
//! | reduce-scatter | per-rank recvcount | count·p·s | (p-1)/p |
//! | all-to-all | count per peer | count·p·s | (p-1)/p |
//! | all-reduce | count | count·s | 2(p-1)/p |
//! | broadcast (root 0) | count | count·s | 1 |
//!
//! `algbw = size / time` (GB/s, 1e9), `busbw = algbw · factor`; time is per call, the MAX
//! over ranks of (time of `iters` back-to-back calls waited at the end) / iters.
//!
//! Per row, every rank: allocates its buffers once, runs the warm-up calls (each waited),
//! meets the others, times `iters` submissions launched back to back and waited at the
//! end, then (with `-c 1`) runs one seeded, out-of-place call checked against
//! [`strata::check`]'s exact reference.
//!
//! Traffic per call is EXACT, without subtracting anything:
//! - `local`: all ranks share one [`strata::traffic::Traffic`]. The ranks are threads of
//!   this process, so they meet at a process-local fence that moves no bytes: every rank
//!   waits its own work, fence, rank 0 snapshots, fence, timed loop, wait, fence, rank 0
//!   snapshots, fence. Between the snapshots only the timed calls ran (a sender records a
//!   transfer before its own work completes), so (after - before) / iters is one call.
//!   Labelled `measured`.
//! - `mpi`: each process records only the sends it issues itself, on its own stream. After
//!   the pre-loop barrier (a 1-element all-reduce, waited) and after the loop's calls are
//!   waited, none of this process's sends is in flight, so its row of (after - before) is
//!   exactly its share of the loop; the rows are all-gathered and assembled on rank 0.
//!   Labelled `nominal` (the MPI library may route bytes differently underneath).
//!
//! Modeling ([`strata::sim`]): `--model SPEC` replays the schedule every row's call
//! would execute (a dry run of the same algorithm, count, dtype and `--chunks` on the
//! SPEC topology, which must have the run's world size) on that topology's link model,
//! and adds `model_us` / `model_busbw` beside the measured time and bandwidth (JSON:
//! `model_time_us`, `model_busbw`, `lower_bound_us`). `--dry-run` runs no transport and
//! moves no data: only the modeled columns, with the traffic of the schedule (label
//! `modeled`); 1024 ranks take seconds. `--trace FILE` writes the Chrome trace
//! (Perfetto) of the largest size of the sweep (`-<op>-<algo>` inserted before the
//! extension when the sweep has several), `--plot FILE.svg` the modeled time against
//! the size for every algo of the sweep.
//!
//! Quantized (lossy) algorithms, run only when named (`--algo`): `qgz` and `qgz-1hop`
//! (ZeRO++ qgZ, reduce-scatter with sum or avg) and `qwz` (qwZ, all-gather), on f32,
//! f16 and bf16. `--bits 4|8` and `--block N` set their wire format (defaults: qgz and
//! qgz-1hop int4, qwz int8, blocks of 256; given without a quantized algo they are
//! ignored and the header says so). Their timed calls carry the format
//! ([`strata::Request::with_quant`]); their check ([`strata::check::run_checked_quant`])
//! compares with the exact f64 result of the unquantized inputs, and a sweep with a
//! quantized algo gets three more columns after `#wrong`: `max_err` and `rms_err`, the
//! largest and the root mean square error over all ranks' elements (per-rank sums of
//! squares added up; over MPI gathered with the other per-rank results), and `bound`,
//! the per-element bound of the format (`docs/quantization.md`); `#wrong` counts the
//! elements beyond it. Exact algos show `-` there (they are checked to a few ulps),
//! unchecked rows `N/A`. JSON: `bits`, `block`, `max_err`, `rms_err`, `bound` (null
//! where they do not apply). Traffic is measured as for every algo, so it shows the
//! quantized bytes.
//! Combinations a quantized algo cannot run (another op, max / min, integer dtypes,
//! `--coalesce`, `--dry-run`) are usage errors (exit 2) rather than the library's
//! silent ring fallback; `--model` shows `-` for a quantized row's modeled columns
//! (null / absent in JSON): the simulator models ring, hier, ho-ring and auto.
//!
//! `--soak SECS [--seed N]` runs no sweep: random mixes of checked collectives over
//! sub-communicators, groups and cross-communicator dependencies for SECS seconds
//! ([`soak`]).
//!
//! Modules: [`cli`] (flags), [`validate`] (usage errors), [`sweep`] (the rows), [`rank`] (one rank's
//! timed and checked calls), [`model`] (`--model`, `--dry-run`), [`report`] (rank 0's
//! table and JSON; [`text`]: the time format and stdout), [`launch`] (the transports),
//! [`soak`] (soak runs).
#![forbid(unsafe_code)]

mod autocheck;
mod baseline;
mod cli;
mod launch;
mod membw;
mod model;
mod probe;
mod rank;
mod report;
mod soak;
mod sweep;
mod text;
mod validate;

use crate::cli::{dedup, Cli};
use crate::launch::{run_local, run_mpi, run_threads, run_vendor};
use crate::model::run_dry;
use crate::sweep::{strata_algos, RowAlgo};
use crate::validate::{quant_conflict, validate};
use clap::{CommandFactory, Parser};
use std::process::ExitCode;
use std::time::Duration;
use strata::transport::TransportKind;
use strata::{CommConfig, Result, Topology};

/// Print the outcome (before MPI is finalised, so mpirun shows it) and pick the exit code:
/// 1 for an error or any wrong element.
fn conclude(r: Result<u64>) -> ExitCode {
    match r {
        Ok(0) => ExitCode::SUCCESS,
        Ok(wrong) => {
            eprintln!("error: {wrong} wrong element(s): results differ from the reference");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("error: {}", strata_tools::cli::describe("strata-perf", &e));
            ExitCode::from(1)
        }
    }
}

fn run(cli: &Cli) -> ExitCode {
    let r = (|| {
        let env = CommConfig::from_env()?;
        let topo = match &cli.topology {
            Some(spec) => Some(Topology::parse(spec)?),
            None => Topology::from_env()?,
        };
        Ok((env, topo))
    })();
    let (env, topo) = match r {
        Ok(x) => x,
        Err(e) => return conclude(Err(e)),
    };
    let config = CommConfig {
        algo: env.algo,
        timeout: cli
            .timeout
            .map(Duration::from_secs_f64)
            .unwrap_or(env.timeout),
        ho_ring_chunks: cli.chunks.or(env.ho_ring_chunks),
        links: cli.links.unwrap_or(env.links),
    };
    if let Some(path) = &cli.probe {
        let code = conclude(probe::run_probe(cli, config, topo, path));
        strata::transport::mpi::finalize();
        return code;
    }
    let algos = if cli.algo.is_empty() {
        vec![RowAlgo::Strata(config.algo)]
    } else {
        dedup(&cli.algo)
    };
    // After STRATA_ALGO is read: the quantized algos' constraints (usage errors, exit 2).
    if let Some((kind, msg)) = quant_conflict(cli, &strata_algos(&algos)) {
        Cli::command().error(kind, msg).exit();
    }
    if cli.dry_run {
        // validate() refused `--algo mpi` with --dry-run.
        return conclude(run_dry(cli, &config, &strata_algos(&algos)));
    }
    if cli.soak.is_some() {
        if cli.transport == TransportKind::Mpi {
            let code = conclude(soak::soak_mpi(cli, config, topo));
            strata::transport::mpi::finalize();
            return code;
        }
        return conclude(soak::soak_local(cli, config, topo));
    }
    let r = match cli.transport {
        TransportKind::Local => run_local(cli, config, topo, &algos),
        TransportKind::Mpi => {
            let code = conclude(run_mpi(cli, config, topo, &algos));
            strata::transport::mpi::finalize();
            return code;
        }
        TransportKind::Nccl | TransportKind::Rccl => {
            let code = conclude(run_vendor(cli, config, topo, &algos));
            strata::transport::mpi::finalize();
            return code;
        }
        k @ (TransportKind::CudaLocal | TransportKind::HostLocal) => {
            run_threads(cli, config, topo, &algos, k)
        }
    };
    conclude(r)
}

fn main() -> ExitCode {
    // Before MPI starts (see under_mpi).
    launch::under_mpi();
    let cli = Cli::parse();
    validate(&cli);
    run(&cli)
}
