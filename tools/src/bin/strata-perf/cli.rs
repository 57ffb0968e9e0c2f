//! The command line: clap's `Cli` with its value parsers, the size sweep it describes,
//! and the flag combinations clap cannot express (usage errors, exit 2).

use clap::Parser;
use std::path::PathBuf;
use strata::check::Kind;
use strata::config::LinkSource;
use strata::kernels::{QuantSpec, MAX_BLOCK};
use strata::transport::TransportKind;
use strata::{Algo, DataType, ReduceOp};
use strata_tools::cli::{bare, parse_algo, parse_dtype, parse_kind, parse_size};

/// Most rows one sweep may have (guards `-f 1 -i 1 -e 1G`).
const MAX_SIZES: usize = 100_000;

/// nccl-tests-style benchmark of strata's collectives.
///
/// Examples:
///   strata-perf --ranks 32 --topology nodes:4x8 --op all-gather --algo ring,hier -b 1K -e 16M -f 4
///   mpirun -np 16 strata-perf --transport mpi --topology nodes:2x8 --op all-reduce -b 8 -e 128M -f 2
#[derive(Parser, Debug)]
#[command(name = "strata-perf", version, verbatim_doc_comment)]
pub(crate) struct Cli {
    /// Transport: local (ranks are threads), mpi (one rank per process), nccl, rccl,
    /// cuda-local (ranks are threads on one GPU), host-local (ranks are threads on the CPU
    /// device: the GPU code paths without a GPU).
    #[arg(long, default_value = "local", value_parser = parse_transport)]
    pub(crate) transport: TransportKind,

    /// Ranks of a local world (default: the topology's world size, else 8).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub(crate) ranks: Option<u64>,

    /// Topology SPEC (nodes:NxR, nodes:NxPxD, dgx-h100:N, frontier:N, ... or a JSON file);
    /// default: STRATA_TOPOLOGY, else one node of all ranks.
    #[arg(long)]
    pub(crate) topology: Option<String>,

    /// Collective(s), comma-separated: all-gather, reduce-scatter, all-reduce, all-to-all, broadcast.
    #[arg(long, default_value = "all-gather", value_delimiter = ',', value_parser = parse_kind)]
    pub(crate) op: Vec<Kind>,

    /// Algorithm(s), comma-separated: ring, log-step, hier (its inter-node stage by the
    /// model), hier-ring, hier-log, ho-ring, auto, and the quantized (lossy)
    /// qgz, qgz-1hop (reduce-scatter) and qwz (all-gather) (default: STRATA_ALGO, else auto);
    /// `mpi` (with --transport mpi): the MPI library's own collective, the baseline.
    #[arg(long, value_delimiter = ',', value_parser = parse_row_algo)]
    pub(crate) algo: Vec<RowAlgo>,

    /// Bits per code of the quantized algorithms: 4 or 8 (default: qgz and qgz-1hop 4,
    /// qwz 8).
    #[arg(long, value_parser = parse_bits)]
    pub(crate) bits: Option<u32>,

    /// Elements per scale of the quantized algorithms (default 256; even for int4).
    #[arg(long, value_parser = parse_block)]
    pub(crate) block: Option<usize>,

    /// Smallest size in bytes (K/M/G suffixes are powers of 1024).
    #[arg(short = 'b', long, default_value = "32M", value_parser = parse_size)]
    pub(crate) minbytes: u64,

    /// Largest size in bytes.
    #[arg(short = 'e', long, default_value = "32M", value_parser = parse_size)]
    pub(crate) maxbytes: u64,

    /// Multiply the size by this factor each step (1: add --stepbytes instead).
    #[arg(short = 'f', long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) stepfactor: u64,

    /// Bytes added each step when --stepfactor is 1.
    #[arg(short = 'i', long, default_value = "1M", value_parser = parse_size)]
    pub(crate) stepbytes: u64,

    /// Datatype(s), comma-separated: f32, f16, bf16 (also i8, u8, i32).
    #[arg(short = 'd', long, default_value = "f32", value_delimiter = ',', value_parser = parse_dtype)]
    pub(crate) datatype: Vec<DataType>,

    /// Reduction(s) of reduce-scatter / all-reduce, comma-separated: sum, avg, max, min.
    #[arg(long, default_value = "sum", value_delimiter = ',', value_parser = parse_redop)]
    pub(crate) redop: Vec<ReduceOp>,

    /// Timed iterations per size.
    #[arg(short = 'n', long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) iters: u64,

    /// Warm-up iterations per size.
    #[arg(
        short = 'w',
        long = "warmup_iters",
        alias = "warmup-iters",
        default_value_t = 5
    )]
    pub(crate) warmup_iters: u64,

    /// Blocking calls (1): each timed call is waited before the next is submitted, and
    /// with nothing queued it runs on the calling thread ([`strata::Comm::call`]), as a
    /// blocking MPI call does (nccl-tests' `-z 1`). Default (0): the calls are launched
    /// back to back and waited at the end.
    #[arg(short = 'z', long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub(crate) blocking: u8,

    /// Time the sweep R times, its rows taken in turn in each round, and report each
    /// row's median round (a round's time of a row: its slowest rank's): rows compared
    /// within one run (`--algo ring,mpi`) then see the same drift of the machine.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub(crate) rounds: u64,

    /// Check results against the exact reference (1) or not (0).
    #[arg(short = 'c', long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub(crate) check: u8,

    /// Split each message into K tensors of uneven sizes, sent as one coalesced call
    /// (all-gather and reduce-scatter only).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(crate) coalesce: Option<u64>,

    /// Pieces per chunk for pipelined algorithms (ho-ring); default by size
    /// (STRATA_HORING_CHUNKS overrides the default).
    #[arg(long, value_parser = clap::value_parser!(usize))]
    pub(crate) chunks: Option<usize>,

    /// Also write the results as a JSON array to FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,

    /// Topology SPEC to model every row on (same world size as the run): adds the
    /// modeled time and bus bandwidth (model_us, model_busbw) beside the measured ones.
    #[arg(long, value_name = "SPEC")]
    pub(crate) model: Option<String>,

    /// Model only: no transport, no data; needs --model or --topology (--ranks, when
    /// given, must be its world size).
    #[arg(long)]
    pub(crate) dry_run: bool,

    /// Write the Chrome trace (Perfetto JSON) of the modeled schedule of the largest size;
    /// with several ops/algos, `-<op>-<algo>` is inserted before the extension.
    #[arg(long, value_name = "FILE")]
    pub(crate) trace: Option<PathBuf>,

    /// Write an SVG of modeled time against message size for the algos of the sweep.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<PathBuf>,

    /// No progress bar (drawn on stderr only when stdout and stderr are a terminal; the
    /// lines on stdout are the same with or without it).
    #[arg(long)]
    pub(crate) quiet: bool,

    /// Seconds to wait for a peer before failing (default: STRATA_TIMEOUT, else 120).
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub(crate) timeout: Option<f64>,

    /// Soak run instead of a sweep: random mixes of checked collectives (every op and
    /// algo, sub-communicators, groups, cross-communicator dependencies) for SECS
    /// seconds (docs/perf.md, "Soak runs"); local and mpi transports.
    #[arg(long, value_name = "SECS", value_parser = parse_secs, conflicts_with_all = [
        "op", "algo", "bits", "block", "minbytes", "maxbytes", "stepfactor", "stepbytes",
        "datatype", "redop", "iters", "warmup_iters", "rounds", "blocking", "check", "coalesce", "json", "model",
        "dry_run", "trace", "plot",
    ])]
    pub(crate) soak: Option<f64>,

    /// Seed of the soak's schedule (default: random, printed in the header).
    #[arg(long, requires = "soak", value_parser = clap::value_parser!(u64).range(0..1u64 << 48))]
    pub(crate) seed: Option<u64>,

    /// Where the run's link figures come from: `preset` (the topology's), `probe`
    /// (measured when the world is created, or read from the probe's cache) or
    /// `reprobe` (measured afresh); default STRATA_LINKS, else preset. `auto` and
    /// `--model` without a SPEC then use them.
    #[arg(long, value_parser = parse_links)]
    pub(crate) links: Option<LinkSource>,

    /// Measure this world's links (the link probe, afresh), write its topology with the
    /// measured figures to FILE (for STRATA_TOPOLOGY, --model, strata-sim, the planner),
    /// print them, and run no sweep.
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "soak", "dry_run", "model", "trace", "plot", "json", "coalesce", "links",
    ])]
    pub(crate) probe: Option<PathBuf>,
}

fn parse_links(s: &str) -> std::result::Result<LinkSource, String> {
    match LinkSource::parse(s) {
        Ok(Some(l)) => Ok(l),
        Ok(None) => Err("empty: preset, probe or reprobe".into()),
        Err(e) => Err(bare(e)),
    }
}

fn parse_row_algo(s: &str) -> std::result::Result<RowAlgo, String> {
    if s.trim().eq_ignore_ascii_case("mpi") {
        return Ok(RowAlgo::Mpi);
    }
    parse_algo(s)
        .map(RowAlgo::Strata)
        .map_err(|e| format!("{e}; or mpi (the MPI library's own collective, --transport mpi)"))
}

fn parse_transport(s: &str) -> std::result::Result<TransportKind, String> {
    s.trim().to_ascii_lowercase().parse().map_err(bare)
}

fn parse_redop(s: &str) -> std::result::Result<ReduceOp, String> {
    match s.trim().parse().map_err(bare)? {
        ReduceOp::Prod => Err("prod is not benchmarked (sum, avg, max, min)".into()),
        op => Ok(op),
    }
}

fn parse_bits(s: &str) -> std::result::Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(b @ (4 | 8)) => Ok(b),
        _ => Err(format!("quantization bits must be 4 or 8, got '{s}'")),
    }
}

fn parse_block(s: &str) -> std::result::Result<usize, String> {
    let b = s
        .trim()
        .parse::<usize>()
        .map_err(|_| format!("'{s}' is not a block size (elements per scale, 1..={MAX_BLOCK})"))?;
    // The range does not depend on the bits (int4's evenness is checked with the algos).
    QuantSpec::new(8, b).map(|_| b).map_err(bare)
}

fn parse_secs(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() && v < 1e9 => Ok(v),
        _ => Err(format!("'{s}' is not a positive number of seconds")),
    }
}

/// Order-preserving de-duplication of a comma list.
pub(crate) fn dedup<T: PartialEq + Copy>(v: &[T]) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for &x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

/// The raw size sweep, nccl-tests' loop: `size *= f` (or `+= i` when f is 1).
pub(crate) fn raw_sizes(
    min: u64,
    max: u64,
    factor: u64,
    step: u64,
) -> std::result::Result<Vec<u64>, String> {
    if min > max {
        return Err(format!(
            "-b/--minbytes ({min}) is larger than -e/--maxbytes ({max})"
        ));
    }
    if factor <= 1 && step == 0 && min < max {
        return Err("-i/--stepbytes must be > 0 when -f/--stepfactor is 1".into());
    }
    let mut v = vec![min];
    let mut s = min;
    loop {
        let next = if factor > 1 {
            s.checked_mul(factor).map(|n| n.max(s + 1))
        } else {
            s.checked_add(step)
        };
        match next {
            Some(n) if n <= max && n > s => s = n,
            _ => break,
        }
        v.push(s);
        if v.len() > MAX_SIZES {
            return Err(format!("the size sweep has more than {MAX_SIZES} steps: raise -f/--stepfactor or -i/--stepbytes"));
        }
    }
    Ok(v)
}

/// What runs a row: one of strata's algorithms, or the MPI library's own collective
/// (`--algo mpi`, the baseline of [`crate::baseline`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowAlgo {
    Strata(Algo),
    Mpi,
}

impl RowAlgo {
    pub(crate) fn name(self) -> &'static str {
        match self {
            RowAlgo::Strata(a) => a.name(),
            RowAlgo::Mpi => "mpi",
        }
    }

    /// The strata algorithm; None for the MPI baseline.
    pub(crate) fn strata(self) -> Option<Algo> {
        match self {
            RowAlgo::Strata(a) => Some(a),
            RowAlgo::Mpi => None,
        }
    }
}

impl std::fmt::Display for RowAlgo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
