//! Usage errors of a whole command line: combinations the flags parse but the sweep,
//! the model or the baseline cannot run (exit 2).

use crate::cli::{dedup, raw_sizes, Cli};
use crate::model::Modeler;
use crate::sweep::{quant_algo, quant_spec, reduces, RowAlgo};
use clap::error::ErrorKind;
use clap::CommandFactory;
use strata::check::Kind;
use strata::transport::TransportKind;
use strata::{Algo, DataType, ReduceOp};
use strata_tools::cli::bare;

/// Why the quantized algos of the sweep cannot run it (a usage error), if they cannot:
/// each runs one op only (qgz, qgz-1hop: reduce-scatter with sum or avg; qwz:
/// all-gather), on f32 / f16 / bf16, uncoalesced, and is not modeled by `--dry-run`.
/// Refused rather than run as the library's ring fallback, which would report an exact
/// ring under the quantized algo's name.
pub(crate) fn quant_conflict(cli: &Cli, algos: &[Algo]) -> Option<(ErrorKind, String)> {
    for &algo in algos {
        let Some((kind, _)) = quant_algo(algo) else {
            continue;
        };
        if let Some(Err(e)) = quant_spec(cli, algo) {
            return Some((ErrorKind::ValueValidation, format!("{algo}: {}", bare(e))));
        }
        if let Some(k) = dedup(&cli.op).into_iter().find(|&k| k != kind) {
            return Some((
                ErrorKind::ArgumentConflict,
                format!(
                    "{algo} is a quantized {} only, it cannot run {} (use --op {} for {algo}, or sweep {} without it)",
                    kind.name(),
                    k.name(),
                    kind.name(),
                    k.name()
                ),
            ));
        }
        if kind == Kind::ReduceScatter {
            if let Some(o) = dedup(&cli.redop)
                .into_iter()
                .find(|o| !matches!(o, ReduceOp::Sum | ReduceOp::Avg))
            {
                return Some((
                    ErrorKind::ArgumentConflict,
                    format!("{algo} reduces with sum or avg only, not {}", o.name()),
                ));
            }
        }
        if let Some(d) = dedup(&cli.datatype).into_iter().find(|d| !d.is_float()) {
            return Some((
                ErrorKind::ArgumentConflict,
                format!("{algo} quantizes f32, f16 and bf16 only, not {}", d.name()),
            ));
        }
        if cli.coalesce.is_some() {
            return Some((
                ErrorKind::ArgumentConflict,
                format!("--coalesce does not apply to the quantized {algo}"),
            ));
        }
        if cli.dry_run {
            return Some((
                ErrorKind::ArgumentConflict,
                format!(
                    "--dry-run models the lossless algorithms, not the quantized {algo} (drop --dry-run to measure it; --model shows '-' for its modeled columns)"
                ),
            ));
        }
    }
    None
}

/// Why `--algo mpi` cannot run this command line, if it cannot: MPI's collectives need
/// the mpi transport (on nccl / rccl `ring` already is the vendor library's own), take
/// no coalesced form and are not modeled; MPI has no f16 / bf16 reduction.
fn baseline_conflict(cli: &Cli) -> Option<String> {
    if !cli.algo.contains(&RowAlgo::Mpi) {
        return None;
    }
    if cli.transport != TransportKind::Mpi {
        let vendor = if matches!(cli.transport, TransportKind::Nccl | TransportKind::Rccl) {
            format!(
                " (on {} `ring` is the vendor library's own collective)",
                cli.transport.name()
            )
        } else {
            String::new()
        };
        return Some(format!(
            "the `mpi` baseline needs --transport mpi under mpirun, not --transport {}{vendor}",
            cli.transport.name()
        ));
    }
    if cli.dry_run {
        return Some("--dry-run models strata's algorithms, not the `mpi` baseline".into());
    }
    if cli.coalesce.is_some() {
        return Some(
            "--coalesce does not apply to the `mpi` baseline (MPI has no coalesced collectives)"
                .into(),
        );
    }
    if dedup(&cli.op).into_iter().any(reduces) {
        if let Some(d) = dedup(&cli.datatype)
            .into_iter()
            .find(|d| matches!(d, DataType::F16 | DataType::BF16))
        {
            return Some(format!(
                "the `mpi` baseline cannot reduce {} (MPI has no 16-bit float type): reduce f32, i32, i8 or u8, or run --op all-gather,all-to-all,broadcast",
                d.name()
            ));
        }
    }
    None
}

/// Flag combinations clap cannot express: usage errors (exit 2).
pub(crate) fn validate(cli: &Cli) {
    let mut cmd = Cli::command();
    if let Some(msg) = baseline_conflict(cli) {
        cmd.error(ErrorKind::ArgumentConflict, msg).exit();
    }
    if cli.coalesce.is_some() {
        if let Some(k) = dedup(&cli.op)
            .into_iter()
            .find(|&k| !matches!(k, Kind::AllGather | Kind::ReduceScatter))
        {
            cmd.error(
                ErrorKind::ArgumentConflict,
                format!(
                    "--coalesce applies to all-gather and reduce-scatter only, not {}",
                    k.name()
                ),
            )
            .exit();
        }
    }
    if let Err(m) = raw_sizes(cli.minbytes, cli.maxbytes, cli.stepfactor, cli.stepbytes) {
        cmd.error(ErrorKind::ValueValidation, m).exit();
    }
    if cli.dry_run {
        if cli.model.is_none() && cli.topology.is_none() {
            cmd.error(
                ErrorKind::MissingRequiredArgument,
                "--dry-run needs --model SPEC or --topology SPEC (the cluster to model)",
            )
            .exit();
        }
        if cli.transport != TransportKind::Local {
            cmd.error(
                ErrorKind::ArgumentConflict,
                format!(
                    "--dry-run uses no transport; drop --transport {}",
                    cli.transport.name()
                ),
            )
            .exit();
        }
        if let Some(k) = dedup(&cli.op).into_iter().find(|&k| !Modeler::modelable(k)) {
            cmd.error(
                ErrorKind::ArgumentConflict,
                format!(
                    "--dry-run models all-gather, reduce-scatter and all-reduce, not {}",
                    k.name()
                ),
            )
            .exit();
        }
    }
    if (cli.trace.is_some() || cli.plot.is_some()) && cli.model.is_none() && !cli.dry_run {
        cmd.error(
            ErrorKind::MissingRequiredArgument,
            "--trace and --plot draw the modeled schedule: add --model SPEC (or --dry-run)",
        )
        .exit();
    }
    if cli.soak.is_some() && !matches!(cli.transport, TransportKind::Local | TransportKind::Mpi) {
        cmd.error(
            ErrorKind::ArgumentConflict,
            format!(
                "--soak runs on the local and mpi transports, not {}",
                cli.transport.name()
            ),
        )
        .exit();
    }
    if cli.ranks.is_some()
        && !matches!(
            cli.transport,
            TransportKind::Local
                | TransportKind::Mpi
                | TransportKind::CudaLocal
                | TransportKind::HostLocal
        )
    {
        cmd.error(
            ErrorKind::ArgumentConflict,
            format!(
                "--ranks applies to local transports, not {}",
                cli.transport.name()
            ),
        )
        .exit();
    }
}
