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
//! ([`Request::with_quant`]); their check ([`check::run_checked_quant`]) compares with
//! the exact f64 result of the unquantized inputs, and a sweep with a quantized algo
//! gets three more columns after `#wrong`: `max_err` and `rms_err`, the largest and the
//! root mean square error over all ranks' elements (per-rank sums of squares added up;
//! over MPI gathered with the other per-rank results), and `bound`, the per-element
//! bound of the format (`docs/quantization.md`); `#wrong` counts the elements beyond
//! it. Exact algos show `-` there (they are checked to a few ulps), unchecked rows
//! `N/A`. JSON: `bits`, `block`, `max_err`, `rms_err`, `bound` (null where they do not
//! apply). Traffic is measured as for every algo, so it shows the quantized bytes.
//! Combinations a quantized algo cannot run (another op, max / min, integer dtypes,
//! `--coalesce`, `--dry-run`) are usage errors (exit 2) rather than the library's
//! silent ring fallback; `--model` shows `-` for a quantized row's modeled columns
//! (null / absent in JSON): the simulator models ring, hier, ho-ring and auto.
#![forbid(unsafe_code)]

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use strata::check::{self, Kind, QuantCheck};
use strata::kernels::{QuantSpec, MAX_BLOCK};
use strata::sim;
use strata::traffic::{TrafficMatrix, TrafficReport};
use strata::transport::TransportKind;
use strata::{
    Algo, Buffer, Comm, CommConfig, DataType, Error, Op, ReduceOp, Request, Result, Topology,
};
use strata_tools::cli::{bare, parse_algo, parse_dtype, parse_kind, parse_size};

/// Most rows one sweep may have (guards `-f 1 -i 1 -e 1G`).
const MAX_SIZES: usize = 100_000;
/// Elements of the seeded pattern that fills timing buffers (repeated).
const PATTERN: usize = 4096;

// ---------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------

/// nccl-tests-style benchmark of strata's collectives.
///
/// Examples:
///   strata-perf --ranks 32 --topology nodes:4x8 --op all-gather --algo ring,hier -b 1K -e 16M -f 4
///   mpirun -np 16 strata-perf --transport mpi --topology nodes:2x8 --op all-reduce -b 8 -e 128M -f 2
#[derive(Parser, Debug)]
#[command(name = "strata-perf", version, verbatim_doc_comment)]
struct Cli {
    /// Transport: local (ranks are threads), mpi (one rank per process), nccl, rccl, cuda-local.
    #[arg(long, default_value = "local", value_parser = parse_transport)]
    transport: TransportKind,

    /// Ranks of a local world (default: the topology's world size, else 8).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=65536))]
    ranks: Option<u64>,

    /// Topology SPEC (nodes:NxR, nodes:NxPxD, dgx-h100:N, frontier:N, ... or a JSON file);
    /// default: STRATA_TOPOLOGY, else one node of all ranks.
    #[arg(long)]
    topology: Option<String>,

    /// Collective(s), comma-separated: all-gather, reduce-scatter, all-reduce, all-to-all, broadcast.
    #[arg(long, default_value = "all-gather", value_delimiter = ',', value_parser = parse_kind)]
    op: Vec<Kind>,

    /// Algorithm(s), comma-separated: ring, hier, ho-ring, auto, and the quantized (lossy)
    /// qgz, qgz-1hop (reduce-scatter) and qwz (all-gather) (default: STRATA_ALGO, else auto).
    #[arg(long, value_delimiter = ',', value_parser = parse_algo)]
    algo: Vec<Algo>,

    /// Bits per code of the quantized algorithms: 4 or 8 (default: qgz and qgz-1hop 4,
    /// qwz 8).
    #[arg(long, value_parser = parse_bits)]
    bits: Option<u32>,

    /// Elements per scale of the quantized algorithms (default 256; even for int4).
    #[arg(long, value_parser = parse_block)]
    block: Option<usize>,

    /// Smallest size in bytes (K/M/G suffixes are powers of 1024).
    #[arg(short = 'b', long, default_value = "32M", value_parser = parse_size)]
    minbytes: u64,

    /// Largest size in bytes.
    #[arg(short = 'e', long, default_value = "32M", value_parser = parse_size)]
    maxbytes: u64,

    /// Multiply the size by this factor each step (1: add --stepbytes instead).
    #[arg(short = 'f', long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    stepfactor: u64,

    /// Bytes added each step when --stepfactor is 1.
    #[arg(short = 'i', long, default_value = "1M", value_parser = parse_size)]
    stepbytes: u64,

    /// Datatype(s), comma-separated: f32, f16, bf16 (also i8, u8, i32).
    #[arg(short = 'd', long, default_value = "f32", value_delimiter = ',', value_parser = parse_dtype)]
    datatype: Vec<DataType>,

    /// Reduction(s) of reduce-scatter / all-reduce, comma-separated: sum, avg, max, min.
    #[arg(long, default_value = "sum", value_delimiter = ',', value_parser = parse_redop)]
    redop: Vec<ReduceOp>,

    /// Timed iterations per size.
    #[arg(short = 'n', long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,

    /// Warm-up iterations per size.
    #[arg(
        short = 'w',
        long = "warmup_iters",
        alias = "warmup-iters",
        default_value_t = 5
    )]
    warmup_iters: u64,

    /// Check results against the exact reference (1) or not (0).
    #[arg(short = 'c', long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    check: u8,

    /// Split each message into K tensors of uneven sizes, sent as one coalesced call
    /// (all-gather and reduce-scatter only).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    coalesce: Option<u64>,

    /// Pieces per chunk for pipelined algorithms (ho-ring); default by size
    /// (STRATA_HORING_CHUNKS overrides the default).
    #[arg(long, value_parser = clap::value_parser!(usize))]
    chunks: Option<usize>,

    /// Also write the results as a JSON array to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,

    /// Topology SPEC to model every row on (same world size as the run): adds the
    /// modeled time and bus bandwidth (model_us, model_busbw) beside the measured ones.
    #[arg(long, value_name = "SPEC")]
    model: Option<String>,

    /// Model only: no transport, no data; needs --model or --topology (--ranks, when
    /// given, must be its world size).
    #[arg(long)]
    dry_run: bool,

    /// Write the Chrome trace (Perfetto JSON) of the modeled schedule of the largest size;
    /// with several ops/algos, `-<op>-<algo>` is inserted before the extension.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,

    /// Write an SVG of modeled time against message size for the algos of the sweep.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,

    /// Seconds to wait for a peer before failing (default: STRATA_TIMEOUT, else 120).
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    timeout: Option<f64>,
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
fn dedup<T: PartialEq + Copy>(v: &[T]) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for &x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

/// The raw size sweep, nccl-tests' loop: `size *= f` (or `+= i` when f is 1).
fn raw_sizes(min: u64, max: u64, factor: u64, step: u64) -> std::result::Result<Vec<u64>, String> {
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

// ---------------------------------------------------------------------------------------
// The plan
// ---------------------------------------------------------------------------------------

/// One row of the sweep.
#[derive(Debug, Clone)]
struct Row {
    kind: Kind,
    algo: Algo,
    dtype: DataType,
    /// None for ops without a reduction.
    redop: Option<ReduceOp>,
    /// NCCL's per-call count (total over tensors when coalesced).
    count: usize,
    /// The `size` column: bytes of the larger buffer.
    bytes: u64,
    /// Per-tensor counts of a coalesced call.
    counts: Option<Vec<usize>>,
    /// Seed of the checked call's inputs.
    seed: u64,
    /// Wire format of a quantized algo's row (`qgz`, `qgz-1hop`, `qwz`); None when exact.
    quant: Option<QuantSpec>,
}

impl Row {
    fn redop_name(&self) -> &'static str {
        self.redop.map(|o| o.name()).unwrap_or("none")
    }
}

#[derive(Debug)]
struct Plan {
    rows: Vec<Row>,
    iters: usize,
    warmup: usize,
    check: bool,
    coalesce: Option<usize>,
}

fn reduces(k: Kind) -> bool {
    matches!(k, Kind::ReduceScatter | Kind::AllReduce)
}

/// Elements per buffer "unit": p for ops whose larger buffer holds p counts.
fn spread(k: Kind, p: usize) -> usize {
    match k {
        Kind::AllGather | Kind::ReduceScatter | Kind::AllToAll => p,
        Kind::AllReduce | Kind::Broadcast { .. } => 1,
    }
}

fn bus_factor(k: Kind, p: usize) -> f64 {
    let p = p as f64;
    match k {
        Kind::AllGather | Kind::ReduceScatter | Kind::AllToAll => (p - 1.0) / p,
        Kind::AllReduce => 2.0 * (p - 1.0) / p,
        Kind::Broadcast { .. } => 1.0,
    }
}

/// Split `count` into `k` uneven parts: weights 1, 2, .., k scaled down, the remainder
/// to the last part.
fn split_counts(count: usize, k: usize) -> Vec<usize> {
    let w = (k as u128) * (k as u128 + 1) / 2;
    let mut v: Vec<usize> = (1..k)
        .map(|i| ((count as u128) * (i as u128) / w) as usize)
        .collect();
    let used: usize = v.iter().sum();
    v.push(count - used);
    v
}

/// The op a quantized (lossy) algorithm implements and its default (bits, block); None
/// for the exact algorithms.
fn quant_algo(a: Algo) -> Option<(Kind, (u32, usize))> {
    match a {
        Algo::Qgz | Algo::Qgz1 => Some((Kind::ReduceScatter, strata::algo::qgz::DEFAULT_QGZ)),
        Algo::Qwz => Some((Kind::AllGather, strata::algo::qwz::DEFAULT_QWZ)),
        _ => None,
    }
}

/// The wire format of `a`'s rows: `--bits` / `--block` over the algo's defaults; None
/// for an exact algo.
fn quant_spec(cli: &Cli, a: Algo) -> Option<Result<QuantSpec>> {
    quant_algo(a).map(|(_, (bits, block))| {
        QuantSpec::new(cli.bits.unwrap_or(bits), cli.block.unwrap_or(block))
    })
}

/// Why the quantized algos of the sweep cannot run it (a usage error), if they cannot:
/// each runs one op only (qgz, qgz-1hop: reduce-scatter with sum or avg; qwz:
/// all-gather), on f32 / f16 / bf16, uncoalesced, and is not modeled by `--dry-run`.
/// Refused rather than run as the library's ring fallback, which would report an exact
/// ring under the quantized algo's name.
fn quant_conflict(cli: &Cli, algos: &[Algo]) -> Option<(ErrorKind, String)> {
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
                    "--dry-run models ring, hier, ho-ring and auto, not the quantized {algo} (drop --dry-run to measure it; --model shows '-' for its modeled columns)"
                ),
            ));
        }
    }
    None
}

fn build_plan(cli: &Cli, algos: &[Algo], p: usize) -> Result<Plan> {
    let sizes = raw_sizes(cli.minbytes, cli.maxbytes, cli.stepfactor, cli.stepbytes)
        .map_err(Error::InvalidArgument)?;
    let coalesce = cli.coalesce.map(|k| k as usize);
    let mut rows = Vec::new();
    for kind in dedup(&cli.op) {
        for &algo in algos {
            let quant = quant_spec(cli, algo).transpose()?;
            for dtype in dedup(&cli.datatype) {
                let redops: Vec<Option<ReduceOp>> = if reduces(kind) {
                    dedup(&cli.redop).into_iter().map(Some).collect()
                } else {
                    vec![None]
                };
                for redop in redops {
                    let mut seen = HashSet::new();
                    for &size in &sizes {
                        let unit = (dtype.size() * spread(kind, p)) as u64;
                        let count = (size / unit).max(1);
                        if !seen.insert(count) {
                            continue;
                        }
                        let bytes = count.checked_mul(unit).ok_or_else(|| {
                            Error::InvalidArgument(format!("size {size} overflows"))
                        })?;
                        let count = usize::try_from(count).map_err(|_| {
                            Error::InvalidArgument(format!("size {size} is too large"))
                        })?;
                        rows.push(Row {
                            kind,
                            algo,
                            dtype,
                            redop,
                            count,
                            bytes,
                            counts: coalesce.map(|k| split_counts(count, k)),
                            seed: rows.len() as u64 + 1,
                            quant,
                        });
                    }
                }
            }
        }
    }
    Ok(Plan {
        rows,
        iters: cli.iters as usize,
        warmup: cli.warmup_iters as usize,
        check: cli.check == 1,
        coalesce,
    })
}

// ---------------------------------------------------------------------------------------
// Running one rank
// ---------------------------------------------------------------------------------------

/// What one rank measured for one row.
#[derive(Debug, Clone)]
struct RankRow {
    /// Microseconds per call on this rank.
    time_us: f64,
    /// Wrong elements on this rank (0 when unchecked).
    wrong: u64,
    /// Error statistics of a checked quantized row (None: exact algo or unchecked).
    err: Option<ErrStats>,
    /// Traffic of the timed loop, where this rank accounts for it (local: rank 0's view
    /// of the whole world; mpi: every rank, its own row).
    traffic: Option<TrafficMatrix>,
}

/// Error statistics of a checked quantized call against the exact f64 result, in a form
/// that combines over ranks: the largest error, the SUM of squared errors and the number
/// of elements (so the RMS over all ranks' elements is sqrt(Σ sumsq / Σ n), not an
/// average of per-rank RMS values), and the format's per-element bound.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct ErrStats {
    max: f64,
    sumsq: f64,
    n: u64,
    bound: f64,
}

impl ErrStats {
    fn of(q: &QuantCheck) -> ErrStats {
        ErrStats {
            max: q.max_err,
            // QuantCheck's RMS is sqrt(sumsq / count) over this rank's elements.
            sumsq: q.rms_err * q.rms_err * q.count as f64,
            n: q.count as u64,
            bound: q.bound,
        }
    }

    /// Both ranks' elements together (a NaN anywhere stays NaN).
    fn merge(self, o: ErrStats) -> ErrStats {
        let max = |a: f64, b: f64| {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        };
        ErrStats {
            max: max(self.max, o.max),
            sumsq: self.sumsq + o.sumsq,
            n: self.n + o.n,
            bound: max(self.bound, o.bound),
        }
    }

    fn rms(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            (self.sumsq / self.n as f64).sqrt()
        }
    }
}

/// How the ranks meet around the timed loop and snapshot traffic.
trait Pace {
    /// After the warm-up: meet, and snapshot the counters before the loop.
    fn before(&self, comm: &Comm) -> Result<Option<TrafficMatrix>>;
    /// After the loop's calls were waited: snapshot the counters.
    fn after(&self, comm: &Comm) -> Result<Option<TrafficMatrix>>;
}

/// A process-local barrier for the threads of a local world: moves no bytes, gives up
/// after `timeout`, and can be aborted when a rank fails (std's Barrier can do neither).
struct Fence {
    n: usize,
    timeout: Duration,
    state: Mutex<FenceState>,
    cv: Condvar,
}

#[derive(Default)]
struct FenceState {
    arrived: usize,
    generation: u64,
    aborted: Option<String>,
}

impl Fence {
    fn new(n: usize, timeout: Duration) -> Fence {
        Fence {
            n,
            timeout,
            state: Mutex::new(FenceState::default()),
            cv: Condvar::new(),
        }
    }

    fn wait(&self) -> Result<()> {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &g.aborted {
            return Err(Error::Remote(format!("another rank failed ({why})")));
        }
        let gen = g.generation;
        g.arrived += 1;
        if g.arrived == self.n {
            g.arrived = 0;
            g.generation += 1;
            self.cv.notify_all();
            return Ok(());
        }
        let deadline = Instant::now() + self.timeout;
        while g.generation == gen {
            if let Some(why) = &g.aborted {
                return Err(Error::Remote(format!("another rank failed ({why})")));
            }
            let now = Instant::now();
            if now >= deadline {
                let msg = format!("waited {:?} for the other ranks at a barrier", self.timeout);
                g.aborted.get_or_insert_with(|| msg.clone());
                self.cv.notify_all();
                return Err(Error::Remote(msg));
            }
            g = self
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }

    fn abort(&self, why: &str) {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        g.aborted.get_or_insert_with(|| why.to_string());
        self.cv.notify_all();
    }
}

struct LocalPace {
    fence: Arc<Fence>,
}

impl LocalPace {
    fn snapshot(&self, comm: &Comm) -> Result<Option<TrafficMatrix>> {
        self.fence.wait()?;
        let snap = if comm.rank() == 0 {
            comm.traffic().map(|t| t.snapshot())
        } else {
            None
        };
        self.fence.wait()?;
        Ok(snap)
    }
}

impl Pace for LocalPace {
    fn before(&self, comm: &Comm) -> Result<Option<TrafficMatrix>> {
        self.snapshot(comm)
    }
    fn after(&self, comm: &Comm) -> Result<Option<TrafficMatrix>> {
        self.snapshot(comm)
    }
}

struct MpiPace;

impl Pace for MpiPace {
    fn before(&self, comm: &Comm) -> Result<Option<TrafficMatrix>> {
        comm_barrier(comm)?;
        Ok(comm.traffic().map(|t| t.snapshot()))
    }
    fn after(&self, comm: &Comm) -> Result<Option<TrafficMatrix>> {
        Ok(comm.traffic().map(|t| t.snapshot()))
    }
}

/// A barrier on the communicator: a waited 1-element all-reduce.
fn comm_barrier(comm: &Comm) -> Result<()> {
    let b = Buffer::zeroed(4);
    let op = Op::AllReduce {
        send: b.clone(),
        recv: b,
        count: 1,
        op: ReduceOp::Sum,
    };
    comm.submit(Request::new(op, DataType::F32).with_algo(Algo::Ring))?
        .wait()
}

/// Every rank's `data` (same length everywhere), rank-major.
fn all_gather_bytes(comm: &Comm, data: &[u8]) -> Result<Vec<u8>> {
    let send = Buffer::from_bytes(data);
    let recv = Buffer::zeroed(data.len() * comm.size());
    let op = Op::AllGather {
        send,
        recv: recv.clone(),
        count: data.len(),
    };
    comm.submit(Request::new(op, DataType::U8).with_algo(Algo::Ring))?
        .wait()?;
    recv.to_bytes()
}

/// A buffer of `elems` elements filled with a repeated seeded pattern (realistic values
/// without computing a reference value per element).
/// On GPU transports the buffer is device memory (filled from the host once).
fn patterned(comm: &Comm, dtype: DataType, rank: usize, elems: usize) -> Result<Buffer> {
    let b = Buffer::alloc(dtype, elems)?;
    if elems > 0 {
        let pat = check::fill(dtype, rank, 0, elems.min(PATTERN), 0x5eed);
        let mut w = b.write()?;
        for chunk in w.chunks_mut(pat.len()) {
            chunk.copy_from_slice(&pat[..chunk.len()]);
        }
    }
    match comm.device() {
        None => Ok(b),
        Some(_) => comm.native_from(&b.to_bytes()?),
    }
}

/// The request of one timed call, on buffers allocated once for the row.
fn timed_request(comm: &Comm, row: &Row, p: usize, rank: usize) -> Result<Request> {
    let s = row.dtype.size();
    let redop = row.redop.unwrap_or(ReduceOp::Sum);
    let (ns, nr) = row.kind.sizes(row.count, p);
    let send = patterned(comm, row.dtype, rank, ns)?;
    let recv_bytes = nr
        .checked_mul(row.dtype.size())
        .ok_or_else(|| Error::InvalidArgument(format!("{nr} x {} overflows", row.dtype)))?;
    let recv = comm.alloc_native(recv_bytes)?;
    let op = match &row.counts {
        None => row.kind.op(send, recv, row.count, redop),
        Some(counts) => {
            let (mut sends, mut recvs) = (Vec::new(), Vec::new());
            let (mut so, mut ro) = (0, 0);
            for &c in counts {
                let (cs, cr) = row.kind.sizes(c, p);
                sends.push(send.slice(so..so + cs * s)?);
                recvs.push(recv.slice(ro..ro + cr * s)?);
                so += cs * s;
                ro += cr * s;
            }
            match row.kind {
                Kind::AllGather => Op::AllGatherCoalesced {
                    sends,
                    recvs,
                    counts: counts.clone(),
                },
                Kind::ReduceScatter => Op::ReduceScatterCoalesced {
                    sends,
                    recvs,
                    counts: counts.clone(),
                    op: redop,
                },
                k => {
                    return Err(Error::InvalidArgument(format!(
                        "{} has no coalesced form",
                        k.name()
                    )))
                }
            }
        }
    };
    let req = Request::new(op, row.dtype).with_algo(row.algo);
    Ok(match row.quant {
        Some(q) => req.with_quant(q),
        None => req,
    })
}

/// Wait for every handle; the first error, if any.
fn wait_all(works: &[strata::Work]) -> Result<()> {
    let mut first = Ok(());
    for w in works {
        let r = w.wait();
        if first.is_ok() {
            first = r;
        }
    }
    first
}

fn bench_row(comm: &Comm, plan: &Plan, row: &Row, pace: &dyn Pace) -> Result<RankRow> {
    let (p, r) = (comm.size(), comm.rank());
    let req = timed_request(comm, row, p, r)?;
    for _ in 0..plan.warmup {
        comm.submit(req.clone())?.wait()?;
    }
    let before = pace.before(comm)?;
    let t0 = Instant::now();
    let mut works = Vec::with_capacity(plan.iters);
    for _ in 0..plan.iters {
        works.push(comm.submit(req.clone())?);
    }
    wait_all(&works)?;
    let elapsed = t0.elapsed();
    let after = pace.after(comm)?;
    drop(works);
    drop(req); // free the timing buffers before the checked call allocates its own
    let traffic = match (before, after) {
        (Some(b), Some(a)) => Some(a.since(&b)),
        _ => None,
    };
    let redop = row.redop.unwrap_or(ReduceOp::Sum);
    let (wrong, err) = match (plan.check, row.quant, &row.counts) {
        (false, _, _) => (0, None),
        // Quantized: wrong = elements outside the format's bound of the exact result.
        (true, Some(q), _) => {
            let c = check::run_checked_quant(
                comm, row.kind, row.dtype, redop, row.count, row.algo, q, row.seed,
            )?;
            (c.wrong, Some(ErrStats::of(&c)))
        }
        (true, None, None) => (
            check::run_checked(
                comm, row.kind, row.dtype, redop, row.count, row.algo, false, row.seed,
            )?,
            None,
        ),
        (true, None, Some(counts)) => (
            check::run_checked_coalesced(
                comm, row.kind, row.dtype, redop, counts, row.algo, row.seed,
            )?,
            None,
        ),
    };
    Ok(RankRow {
        time_us: elapsed.as_secs_f64() * 1e6 / plan.iters as f64,
        wrong: wrong as u64,
        err,
        traffic,
    })
}

// ---------------------------------------------------------------------------------------
// Modeling (--model, --dry-run, --trace, --plot)
// ---------------------------------------------------------------------------------------

/// One row as modeled on the model topology.
#[derive(Debug, Clone)]
struct Modeled {
    /// The algorithm the schedule came from (`auto` resolved, fallbacks applied).
    used: Algo,
    time_us: f64,
    algbw: f64,
    busbw: f64,
    lower_bound_us: f64,
    bandwidth_bound_us: f64,
    traffic: TrafficReport,
}

/// One line of the plot / one trace: (op, algo).
type Series = (Kind, Algo);

/// The modeled topology and what the trace and plot collect over the sweep.
struct Modeler {
    topo: Topology,
    chunks: Option<usize>,
    trace: Option<PathBuf>,
    plot: Option<PathBuf>,
    /// Traces and plots cover the rows of the first dtype and redop.
    dtype: Option<DataType>,
    redop: Option<ReduceOp>,
    /// Per (op, algo): (row index, size) of the largest row, and the plot's points.
    largest: Vec<(Series, usize, u64)>,
    points: Vec<(Series, Vec<(f64, f64)>)>,
    several: bool,
    multi_op: bool,
}

impl Modeler {
    fn new(cli: &Cli, topo: Topology, chunks: Option<usize>, algos: &[Algo]) -> Modeler {
        let ops = dedup(&cli.op);
        Modeler {
            topo,
            chunks,
            trace: cli.trace.clone(),
            plot: cli.plot.clone(),
            dtype: cli.datatype.first().copied(),
            redop: cli.redop.first().copied(),
            largest: Vec::new(),
            points: Vec::new(),
            several: ops.len() * algos.len() > 1,
            multi_op: ops.len() > 1,
        }
    }

    fn modelable(k: Kind) -> bool {
        matches!(k, Kind::AllGather | Kind::ReduceScatter | Kind::AllReduce)
    }

    /// Dry run and replay of `row` (None for ops and quantized algos the simulator does
    /// not model).
    fn model(&self, row: &Row) -> Result<Option<Modeled>> {
        if !Self::modelable(row.kind) || row.quant.is_some() {
            return Ok(None);
        }
        let p = self.topo.world_size();
        let (sched, r) = sim::model(
            &self.topo,
            row.kind,
            row.algo,
            row.count,
            row.dtype,
            self.chunks,
        )?;
        let algbw = if r.makespan_us > 0.0 {
            row.bytes as f64 / (r.makespan_us * 1e3)
        } else {
            0.0
        };
        Ok(Some(Modeled {
            used: sched.algo.unwrap_or(row.algo),
            time_us: r.makespan_us,
            algbw,
            busbw: algbw * bus_factor(row.kind, p),
            lower_bound_us: r.lower_bound_us,
            bandwidth_bound_us: r.bandwidth_bound_us,
            traffic: sched.traffic(&self.topo),
        }))
    }

    /// Remember row `i` for the trace and the plot.
    fn note(&mut self, i: usize, row: &Row, m: &Modeled) {
        if Some(row.dtype) != self.dtype || (row.redop.is_some() && row.redop != self.redop) {
            return;
        }
        let key = (row.kind, row.algo);
        match self.largest.iter_mut().find(|e| e.0 == key) {
            Some(e) if e.2 < row.bytes => (e.1, e.2) = (i, row.bytes),
            Some(_) => {}
            None => self.largest.push((key, i, row.bytes)),
        }
        if m.time_us > 0.0 {
            match self.points.iter_mut().find(|e| e.0 == key) {
                Some(e) => e.1.push((row.bytes as f64, m.time_us)),
                None => self.points.push((key, vec![(row.bytes as f64, m.time_us)])),
            }
        }
    }

    /// Write the traces and the plot.
    fn finish(&self, rows: &[Row]) -> Result<()> {
        if let Some(path) = &self.trace {
            for &((kind, algo), i, _) in &self.largest {
                let row = &rows[i];
                let (sched, r) =
                    sim::model(&self.topo, kind, algo, row.count, row.dtype, self.chunks)?;
                let path = if self.several {
                    tagged(path, &format!("{}-{}", kind.name(), algo.name()))
                } else {
                    path.clone()
                };
                sim::trace::save_trace(&path, &sched, &r, &self.topo)?;
                out(&format!(
                    "# trace     : {} ({} {}, {} B, {} transfers)",
                    path.display(),
                    kind.name(),
                    algo.name(),
                    row.bytes,
                    sched.len()
                ));
            }
        }
        if let Some(path) = &self.plot {
            let series: Vec<sim::plot::Series> = self
                .points
                .iter()
                .map(|((kind, algo), pts)| sim::plot::Series {
                    name: if self.multi_op {
                        format!("{} {}", kind.name(), algo.name())
                    } else {
                        algo.name().to_string()
                    },
                    points: pts.clone(),
                })
                .collect();
            let title = format!(
                "modeled time, {} ({} ranks), {}",
                self.topo.name,
                self.topo.world_size(),
                self.dtype.map(|d| d.name()).unwrap_or("")
            );
            let svg = sim::plot::svg(
                &title,
                "message size (bytes, nccl-tests size)",
                "modeled time",
                &series,
            );
            std::fs::write(path, svg)
                .map_err(|e| Error::System(format!("cannot write {}: {e}", path.display())))?;
            out(&format!("# plot      : {}", path.display()));
        }
        Ok(())
    }
}

/// `path` with `-<tag>` inserted before its extension.
fn tagged(path: &std::path::Path, tag: &str) -> PathBuf {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("trace");
    let name = match path.extension().and_then(|e| e.to_str()) {
        Some(ext) => format!("{stem}-{tag}.{ext}"),
        None => format!("{stem}-{tag}"),
    };
    path.with_file_name(name)
}

/// The model topology of `--model SPEC` for a run of `p` ranks.
fn model_topology(spec: &str, p: usize) -> Result<Topology> {
    let t = Topology::parse(spec)?;
    if t.world_size() != p {
        return Err(Error::InvalidUsage(format!(
            "--model {spec} describes {} ranks but the run has {p}",
            t.world_size()
        )));
    }
    Ok(t)
}

/// One JSON record of a dry run (contract: field names shared with [`Record`]).
#[derive(Debug, Serialize)]
struct DryRecord {
    op: &'static str,
    algo: &'static str,
    algo_used: &'static str,
    dtype: &'static str,
    redop: &'static str,
    size: u64,
    count: usize,
    ranks: usize,
    topology: String,
    transport: &'static str,
    model_time_us: f64,
    model_algbw: f64,
    model_busbw: f64,
    lower_bound_us: f64,
    bandwidth_bound_us: f64,
    traffic: TrafficReport,
    traffic_source: &'static str,
    chunks: Option<usize>,
    coalesce: Option<usize>,
}

fn dry_columns() -> [String; 2] {
    let h1 = format!(
        "#{:>11}  {:>12}  {:>8}  {:>6}  {:>7}  {:>7}  {:>10}  {:>7}  {:>7}  {:>10}  {:>6}  {:>12}  {:>12}  {:>12}  {:>12}",
        "size", "count", "type", "redop", "algo", "used", "model_us", "algbw", "busbw", "lower_bnd", "ratio", "intra_pkg", "intra_node", "inter_node", "node_egress"
    );
    let h2 = format!(
        "#{:>11}  {:>12}  {:>8}  {:>6}  {:>7}  {:>7}  {:>10}  {:>7}  {:>7}  {:>10}  {:>6}  {:>12}  {:>12}  {:>12}  {:>12}",
        "(B)", "(elements)", "", "", "", "", "(us)", "(GB/s)", "(GB/s)", "(us)", "", "(B)", "(B)", "(B)", "(B)"
    );
    [h1, h2]
}

/// `--dry-run`: model every row (in parallel over the machine's cores), print the
/// modeled columns, write JSON, traces and plot. No transport, no data.
fn run_dry(cli: &Cli, config: &CommConfig, algos: &[Algo]) -> Result<u64> {
    let started = Instant::now();
    let spec = cli
        .model
        .as_deref()
        .or(cli.topology.as_deref())
        .ok_or_else(|| Error::InvalidUsage("--dry-run needs --model or --topology".into()))?;
    let topo = Topology::parse(spec)?;
    let p = topo.world_size();
    if let (Some(_), Some(t)) = (&cli.model, &cli.topology) {
        let run = Topology::parse(t)?;
        if run.world_size() != p {
            return Err(Error::InvalidUsage(format!(
                "--topology {t} has {} ranks but --model {spec} has {p}",
                run.world_size()
            )));
        }
    }
    if let Some(n) = cli.ranks {
        if n as usize != p {
            return Err(Error::InvalidUsage(format!(
                "--ranks {n} but the modeled topology {spec} has {p} ranks"
            )));
        }
    }
    let plan = build_plan(cli, algos, p)?;
    let mut json = match &cli.json {
        Some(path) => Some((
            path.clone(),
            std::fs::File::create(path)
                .map_err(|e| Error::System(format!("cannot create {}: {e}", path.display())))?,
        )),
        None => None,
    };
    let mut modeler = Modeler::new(cli, topo.clone(), config.ho_ring_chunks, algos);
    let list = |v: Vec<&str>| v.join(",");
    let ops = dedup(&cli.op);
    let redops = if ops.iter().any(|&k| reduces(k)) {
        list(dedup(&cli.redop).iter().map(|o| o.name()).collect())
    } else {
        "none".to_string()
    };
    for l in [
        format!("# strata-perf {} (nccl-tests style), dry run", env!("CARGO_PKG_VERSION")),
        "#  transport : none (dry run: schedules built and replayed, no data moved)".to_string(),
        format!("#  topology  : {} (modeled)", topo.summary()),
        format!("#  ranks     : {p}"),
        format!("#  op        : {}", list(ops.iter().map(|k| k.name()).collect())),
        format!("#  algo      : {}", list(algos.iter().map(|a| a.name()).collect())),
        format!(
            "#  dtype     : {}",
            list(dedup(&cli.datatype).iter().map(|d| d.name()).collect())
        ),
        format!("#  redop     : {redops}"),
        format!(
            "#  minBytes {} maxBytes {} step: {}",
            cli.minbytes,
            cli.maxbytes,
            if cli.stepfactor > 1 {
                format!("{}(factor)", cli.stepfactor)
            } else {
                format!("{}(bytes)", cli.stepbytes)
            }
        ),
        format!(
            "#  chunks    : {}",
            config
                .ho_ring_chunks
                .map(|c| c.to_string())
                .unwrap_or_else(|| "default (by size)".into())
        ),
        "#  model     : per link class latency + bytes/bandwidth, shared NICs, classes busy at once (strata::sim)".to_string(),
        "#  lower_bnd : busiest resource's wire time + one latency, or longest stream of steps; ratio = model_us / lower_bnd".to_string(),
        "#  traffic   : modeled: bytes of the schedule per call".to_string(),
    ] {
        out(&l);
    }
    // Model the rows on every core; each worker holds one schedule at a time.
    let rows = &plan.rows;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Option<Modeled>>>>> =
        Mutex::new((0..rows.len()).map(|_| None).collect());
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, rows.len().max(1));
    std::thread::scope(|sc| {
        for _ in 0..workers {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= rows.len() {
                    break;
                }
                let m = modeler.model(&rows[i]);
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(m);
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut records = Vec::new();
    let mut last_kind = None;
    let mut busbw_sum = 0.0;
    for (i, (row, m)) in rows.iter().zip(results).enumerate() {
        let m = match m {
            Some(Ok(Some(m))) => m,
            Some(Ok(None)) => {
                return Err(Error::InvalidArgument(format!(
                    "--dry-run models all-gather, reduce-scatter and all-reduce, not {}",
                    row.kind.name()
                )))
            }
            Some(Err(e)) => return Err(e),
            None => return Err(Error::Internal(format!("row {i} was not modeled"))),
        };
        if last_kind != Some(row.kind) {
            last_kind = Some(row.kind);
            out("#");
            if ops.len() > 1 {
                out(&format!("# {}", row.kind.name()));
            }
            for h in dry_columns() {
                out(&h);
            }
        }
        let ratio = if m.lower_bound_us > 0.0 {
            m.time_us / m.lower_bound_us
        } else {
            1.0
        };
        out(&format!(
            "{:>12}  {:>12}  {:>8}  {:>6}  {:>7}  {:>7}  {:>10}  {:>7.2}  {:>7.2}  {:>10}  {:>6.3}  {:>12}  {:>12}  {:>12}  {:>12}",
            row.bytes,
            row.count,
            row.dtype.name(),
            row.redop_name(),
            row.algo.name(),
            m.used.name(),
            fmt_time(m.time_us).trim(),
            m.algbw,
            m.busbw,
            fmt_time(m.lower_bound_us).trim(),
            ratio,
            m.traffic.intra_package,
            m.traffic.intra_node,
            m.traffic.inter_node,
            m.traffic.max_node_egress,
        ));
        busbw_sum += m.busbw;
        modeler.note(i, row, &m);
        records.push(DryRecord {
            op: row.kind.name(),
            algo: row.algo.name(),
            algo_used: m.used.name(),
            dtype: row.dtype.name(),
            redop: row.redop_name(),
            size: row.bytes,
            count: row.count,
            ranks: p,
            topology: topo.name.clone(),
            transport: "none",
            model_time_us: m.time_us,
            model_algbw: m.algbw,
            model_busbw: m.busbw,
            lower_bound_us: m.lower_bound_us,
            bandwidth_bound_us: m.bandwidth_bound_us,
            traffic: m.traffic,
            traffic_source: "modeled",
            chunks: config.ho_ring_chunks,
            coalesce: plan.coalesce,
        });
    }
    out(&format!(
        "# Avg modeled bus bandwidth : {:.4}",
        busbw_sum / records.len().max(1) as f64
    ));
    out(&format!(
        "# Modeled {} rows in {:.2} s ({workers} threads)",
        records.len(),
        started.elapsed().as_secs_f64()
    ));
    out("#");
    if let Some((path, f)) = json.as_mut() {
        let text = serde_json::to_string_pretty(&records)
            .map_err(|e| Error::Internal(format!("json: {e}")))?;
        f.write_all((text + "\n").as_bytes())
            .and_then(|_| f.flush())
            .map_err(|e| Error::System(format!("cannot write {}: {e}", path.display())))?;
    }
    modeler.finish(rows)?;
    Ok(0)
}

// ---------------------------------------------------------------------------------------
// Reporting (rank 0)
// ---------------------------------------------------------------------------------------

/// One JSON record (contract: field names).
#[derive(Debug, Serialize)]
struct Record {
    op: &'static str,
    algo: &'static str,
    /// The algorithm that actually ran (`auto` resolved; `hier` may fall back to `ring`).
    algo_used: &'static str,
    dtype: &'static str,
    redop: &'static str,
    size: u64,
    count: usize,
    ranks: usize,
    topology: String,
    transport: &'static str,
    time_us: f64,
    algbw: f64,
    busbw: f64,
    /// Wrong elements summed over ranks; null when unchecked (`-c 0`).
    wrong: Option<u64>,
    traffic: Option<TrafficReport>,
    traffic_source: Option<&'static str>,
    /// Tensors per coalesced call; null when not coalesced.
    coalesce: Option<usize>,
    /// Quantized algos (`qgz`, `qgz-1hop`, `qwz`): bits per code; null for exact algos.
    bits: Option<u32>,
    /// Quantized algos: elements per scale; null for exact algos.
    block: Option<usize>,
    /// Quantized algos, checked: the largest |result - exact f64 result| over all ranks'
    /// elements; null for exact algos and unchecked rows (a NaN result: null, and counted
    /// in `wrong`).
    max_err: Option<f64>,
    /// The root mean square of the same errors over all ranks' elements.
    rms_err: Option<f64>,
    /// The per-element bound the format promises for this call (docs/quantization.md,
    /// `strata::check::quant_bound`); `wrong` counts the elements beyond it.
    bound: Option<f64>,
    /// With --model: the modeled time of one call on the model topology (us).
    #[serde(skip_serializing_if = "Option::is_none")]
    model_time_us: Option<f64>,
    /// With --model: the modeled bus bandwidth (GB/s).
    #[serde(skip_serializing_if = "Option::is_none")]
    model_busbw: Option<f64>,
    /// With --model: the lower bound of the modeled schedule (us).
    #[serde(skip_serializing_if = "Option::is_none")]
    lower_bound_us: Option<f64>,
}

/// One column of the table: (name, unit, width).
type Column = (&'static str, &'static str, usize);

/// The table's columns, (name, unit, width): `model` adds `model_us` / `model_busbw` after
/// busbw (`--model`), `quant` the error columns `max_err` / `rms_err` / `bound` after
/// `#wrong` (a sweep with a quantized algo).
fn table_columns(model: bool, quant: bool) -> Vec<Column> {
    let mut c = vec![
        ("size", "(B)", 12),
        ("count", "(elements)", 12),
        ("type", "", 8),
        ("redop", "", 6),
        ("algo", "", 8),
        ("time", "(us)", 7),
        ("algbw", "(GB/s)", 6),
        ("busbw", "(GB/s)", 6),
    ];
    if model {
        c.extend([("model_us", "(us)", 9), ("model_busbw", "(GB/s)", 11)]);
    }
    c.push(("#wrong", "", 6));
    if quant {
        c.extend([("max_err", "", 9), ("rms_err", "", 9), ("bound", "", 9)]);
    }
    c.extend([
        ("intra_pkg", "(B)", 10),
        ("intra_node", "(B)", 10),
        ("inter_node", "(B)", 10),
        ("node_egress", "(B)", 11),
    ]);
    c
}

/// The two header lines of [`table_columns`].
fn header_lines(cols: &[Column]) -> [String; 2] {
    let line = |f: fn(&Column) -> &'static str| {
        cols.iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    format!("#{:>w$}", f(c), w = c.2 - 1)
                } else {
                    format!("{:>w$}", f(c), w = c.2)
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    [line(|c| c.0), line(|c| c.1)]
}

/// One data line: `cells` right-aligned to [`table_columns`]' widths.
fn table_line(cols: &[Column], cells: &[String]) -> String {
    cols.iter()
        .zip(cells)
        .map(|(c, v)| format!("{v:>w$}", w = c.2))
        .collect::<Vec<_>>()
        .join("  ")
}

/// An error figure: 3 significant digits, C's `%.2e` (`1.95e-02`); "0" for exactly 0.
fn fmt_err(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return if x == 0.0 { "0".into() } else { x.to_string() };
    }
    let s = format!("{x:.2e}");
    match s.split_once('e') {
        Some((m, e)) => {
            let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
            format!("{m}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

/// nccl-tests' time format: fewer decimals as the number grows.
fn fmt_time(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

struct Reporter<'a> {
    plan: &'a Plan,
    comm0: Comm,
    transport: TransportKind,
    topo: Arc<Topology>,
    p: usize,
    records: Vec<Record>,
    pb: Option<ProgressBar>,
    next: usize,
    total_wrong: u64,
    busbw_sum: f64,
    last_kind: Option<Kind>,
    multi_op: bool,
    /// The sweep has a quantized algo: the table has the error columns.
    quant: bool,
    /// (op, algo) pairs whose fallback to ring was already noted.
    noted: Vec<(Kind, Algo)>,
    /// Opened (created) before the sweep so a bad path fails at once, written at the end.
    json: Option<(PathBuf, std::fs::File)>,
    /// `--model`: every row is also modeled on this topology.
    modeler: Option<Modeler>,
}

/// The header line of the quantized formats: per quantized algo of the sweep its bits and
/// block, and what the error columns are; a note when --bits / --block have no algo to
/// apply to.
fn quant_header(cli: &Cli, algos: &[Algo]) -> Option<String> {
    let specs: Vec<String> = algos
        .iter()
        .filter_map(|&a| match quant_spec(cli, a) {
            Some(Ok(q)) => Some(format!("{a} int{}/{}", q.bits, q.block)),
            _ => None,
        })
        .collect();
    if !specs.is_empty() {
        Some(format!(
            "#  quant     : {} (bits/block); max_err, rms_err: largest and RMS |result - exact f64 result| over all ranks' elements; bound: the format's per-element bound; #wrong: elements beyond it",
            specs.join(", ")
        ))
    } else if cli.bits.is_some() || cli.block.is_some() {
        Some("#  quant     : --bits / --block ignored: no quantized algo (qgz, qgz-1hop, qwz) in the sweep".into())
    } else {
        None
    }
}

fn out(line: &str) {
    // A closed stdout (`| head`) must not panic the benchmark.
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

impl<'a> Reporter<'a> {
    fn new(cli: &Cli, plan: &'a Plan, comm0: Comm, algos: &[Algo]) -> Result<Reporter<'a>> {
        let json = match &cli.json {
            Some(path) => {
                let f = std::fs::File::create(path)
                    .map_err(|e| Error::System(format!("cannot create {}: {e}", path.display())))?;
                Some((path.clone(), f))
            }
            None => None,
        };
        let topo = comm0.topology().clone();
        let p = comm0.size();
        let transport = comm0.transport_kind();
        let modeler = match &cli.model {
            Some(spec) => Some(Modeler::new(
                cli,
                model_topology(spec, p)?,
                comm0.config().ho_ring_chunks,
                algos,
            )),
            None => None,
        };
        let pb = (std::io::stdout().is_terminal() && plan.rows.len() > 4).then(|| {
            let pb = ProgressBar::with_draw_target(
                Some(plan.rows.len() as u64),
                ProgressDrawTarget::stderr(),
            );
            if let Ok(style) = ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {wide_msg}",
            ) {
                pb.set_style(style);
            }
            pb.enable_steady_tick(Duration::from_millis(200));
            pb
        });
        let r = Reporter {
            plan,
            comm0,
            transport,
            topo,
            p,
            records: Vec::new(),
            pb,
            next: 0,
            total_wrong: 0,
            busbw_sum: 0.0,
            last_kind: None,
            multi_op: dedup(&cli.op).len() > 1,
            quant: algos.iter().any(|&a| quant_algo(a).is_some()),
            noted: Vec::new(),
            json,
            modeler,
        };
        r.header(cli, algos);
        r.progress_msg();
        Ok(r)
    }

    fn print(&self, line: &str) {
        match &self.pb {
            Some(pb) => pb.suspend(|| out(line)),
            None => out(line),
        }
    }

    fn traffic_source(&self) -> &'static str {
        if self.transport.traffic_measured() {
            "measured"
        } else {
            "nominal"
        }
    }

    fn header(&self, cli: &Cli, algos: &[Algo]) {
        let list = |v: Vec<&str>| v.join(",");
        let ops = list(dedup(&cli.op).iter().map(|k| k.name()).collect());
        let redops = if dedup(&cli.op).iter().any(|&k| reduces(k)) {
            list(dedup(&cli.redop).iter().map(|o| o.name()).collect())
        } else {
            "none".to_string()
        };
        let step = if cli.stepfactor > 1 {
            format!("{}(factor)", cli.stepfactor)
        } else {
            format!("{}(bytes)", cli.stepbytes)
        };
        let how = if self.transport.traffic_measured() {
            "measured: every transfer the transport made, bytes per call"
        } else {
            "nominal: the sends strata issued, bytes per call"
        };
        let lines = [
            format!(
                "# strata-perf {} (nccl-tests style)",
                env!("CARGO_PKG_VERSION")
            ),
            format!("#  transport : {}", self.transport.name()),
            format!("#  topology  : {}", self.topo.summary()),
            format!("#  ranks     : {}", self.p),
            format!("#  op        : {ops}"),
            format!(
                "#  algo      : {}",
                list(algos.iter().map(|a| a.name()).collect())
            ),
            format!(
                "#  dtype     : {}",
                list(dedup(&cli.datatype).iter().map(|d| d.name()).collect())
            ),
            format!("#  redop     : {redops}"),
            format!(
                "#  minBytes {} maxBytes {} step: {step}",
                cli.minbytes, cli.maxbytes
            ),
            format!("#  iters     : {}", self.plan.iters),
            format!("#  warmup    : {}", self.plan.warmup),
            format!("#  check     : {}", u8::from(self.plan.check)),
            format!(
                "#  coalesce  : {}",
                self.plan
                    .coalesce
                    .map(|k| format!("{k} tensors per call (uneven counts)"))
                    .unwrap_or_else(|| "off".into())
            ),
            format!("#  timeout   : {:?}", self.comm0.timeout()),
            format!("#  traffic   : {how}"),
        ];
        let model = self.modeler.as_ref().map(|m| {
            format!(
                "#  model     : {} (strata::sim dry run of each row: latency + bytes/bandwidth per link class, shared NICs){}",
                m.topo.summary(),
                if self.quant { "; quantized algos are not modeled: -" } else { "" }
            )
        });
        for l in lines
            .into_iter()
            .chain(model)
            .chain(quant_header(cli, algos))
        {
            self.print(&l);
        }
    }

    fn progress_msg(&self) {
        if let (Some(pb), Some(row)) = (&self.pb, self.plan.rows.get(self.next)) {
            pb.set_message(format!(
                "{} {} {} {} B",
                row.kind.name(),
                row.algo,
                row.dtype,
                row.bytes
            ));
        }
    }

    /// The algorithm the selector runs for `row` (the flat request of a coalesced call),
    /// and the selector's reason.
    fn chosen(&self, row: &Row) -> (Algo, String) {
        let z = Buffer::zeroed(0);
        let op = row
            .kind
            .op(z.clone(), z, row.count, row.redop.unwrap_or(ReduceOp::Sum));
        let mut req = Request::new(op, row.dtype).with_algo(row.algo);
        if let Some(q) = row.quant {
            req = req.with_quant(q);
        }
        let (a, why) = strata::algo::select::choose(&self.comm0, &req);
        (a.algo(), why)
    }

    /// Rank 0's view of row `i`: the max time, the summed wrong counts and the combined
    /// error statistics over ranks, and the whole loop's traffic.
    fn row(
        &mut self,
        i: usize,
        time_us: f64,
        wrong: u64,
        err: Option<ErrStats>,
        traffic: Option<TrafficMatrix>,
    ) {
        let row = &self.plan.rows[i];
        let cols = table_columns(self.modeler.is_some(), self.quant);
        if self.last_kind != Some(row.kind) {
            self.last_kind = Some(row.kind);
            self.print("#");
            if self.multi_op {
                self.print(&format!("# {}", row.kind.name()));
            }
            for h in header_lines(&cols) {
                self.print(&h);
            }
        }
        let (used, why) = self.chosen(row);
        if row.quant.is_some() && used != row.algo && !self.noted.contains(&(row.kind, row.algo)) {
            self.noted.push((row.kind, row.algo));
            self.print(&format!(
                "# note: {} runs {} here ({why}): its rows below measure {}",
                row.algo, used, used
            ));
        }
        let algbw = if time_us > 0.0 {
            row.bytes as f64 / (time_us * 1e3)
        } else {
            0.0
        };
        let busbw = algbw * bus_factor(row.kind, self.p);
        let report = traffic.map(|m| m.report(&self.topo).per_call(self.plan.iters as u64));
        let t = |f: fn(&TrafficReport) -> u64| {
            report
                .as_ref()
                .map(|r| f(r).to_string())
                .unwrap_or_else(|| "-".into())
        };
        let modeled = match self.modeler.as_ref().map(|m| m.model(row)) {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                self.print(&format!("# model of this row failed: {e}"));
                None
            }
            None => None,
        };
        let mut cells = vec![
            row.bytes.to_string(),
            row.count.to_string(),
            row.dtype.name().to_string(),
            row.redop_name().to_string(),
            row.algo.name().to_string(),
            fmt_time(time_us).trim().to_string(),
            format!("{algbw:.2}"),
            format!("{busbw:.2}"),
        ];
        if self.modeler.is_some() {
            match &modeled {
                Some(m) => cells.extend([
                    fmt_time(m.time_us).trim().to_string(),
                    format!("{:.2}", m.busbw),
                ]),
                None => cells.extend(["-".to_string(), "-".to_string()]),
            }
        }
        cells.push(if self.plan.check {
            wrong.to_string()
        } else {
            "N/A".into()
        });
        if self.quant {
            match (&err, row.quant.is_some()) {
                (Some(e), _) => cells.extend([fmt_err(e.max), fmt_err(e.rms()), fmt_err(e.bound)]),
                // A quantized row, unchecked.
                (None, true) => cells.extend(["N/A", "N/A", "N/A"].map(String::from)),
                // An exact algo: checked to a few ulps above, no error figures.
                (None, false) => cells.extend(["-", "-", "-"].map(String::from)),
            }
        }
        cells.extend([
            t(|r| r.intra_package),
            t(|r| r.intra_node),
            t(|r| r.inter_node),
            t(|r| r.max_node_egress),
        ]);
        let line = table_line(&cols, &cells);
        if let (Some(m), Some(md)) = (self.modeler.as_mut(), &modeled) {
            m.note(i, row, md);
        }
        self.print(&line);
        self.total_wrong += wrong;
        self.busbw_sum += busbw;
        self.records.push(Record {
            op: row.kind.name(),
            algo: row.algo.name(),
            algo_used: used.name(),
            dtype: row.dtype.name(),
            redop: row.redop_name(),
            size: row.bytes,
            count: row.count,
            ranks: self.p,
            topology: self.topo.name.clone(),
            transport: self.transport.name(),
            time_us,
            algbw,
            busbw,
            wrong: self.plan.check.then_some(wrong),
            traffic: report,
            traffic_source: report.map(|_| self.traffic_source()),
            coalesce: self.plan.coalesce,
            bits: row.quant.map(|q| q.bits),
            block: row.quant.map(|q| q.block),
            max_err: err.map(|e| e.max),
            rms_err: err.map(|e| e.rms()),
            bound: err.map(|e| e.bound),
            model_time_us: modeled.as_ref().map(|m| m.time_us),
            model_busbw: modeled.as_ref().map(|m| m.busbw),
            lower_bound_us: modeled.as_ref().map(|m| m.lower_bound_us),
        });
        self.next = i + 1;
        if let Some(pb) = &self.pb {
            pb.inc(1);
        }
        self.progress_msg();
    }

    /// Footer lines and the JSON file; the number of wrong elements over the sweep.
    fn finish(self) -> Result<u64> {
        if let Some(pb) = &self.pb {
            pb.finish_and_clear();
        }
        let n = self.records.len().max(1);
        out(&format!(
            "# Out of bounds values : {} {}",
            self.total_wrong,
            if self.total_wrong == 0 {
                "OK"
            } else {
                "FAILED"
            }
        ));
        out(&format!(
            "# Avg bus bandwidth    : {:.4}",
            self.busbw_sum / n as f64
        ));
        out("#");
        if let Some((path, mut f)) = self.json {
            let text = serde_json::to_string_pretty(&self.records)
                .map_err(|e| Error::Internal(format!("json: {e}")))?;
            f.write_all((text + "\n").as_bytes())
                .and_then(|_| f.flush())
                .map_err(|e| Error::System(format!("cannot write {}: {e}", path.display())))?;
        }
        if let Some(m) = &self.modeler {
            m.finish(&self.plan.rows)?;
        }
        Ok(self.total_wrong)
    }
}

// ---------------------------------------------------------------------------------------
// Transports
// ---------------------------------------------------------------------------------------

/// Messages from the rank threads of a local world to the main thread.
enum Msg {
    Row(usize, usize, RankRow),
    Failed(usize, Error),
}

fn run_local(cli: &Cli, config: CommConfig, topo: Option<Topology>, algos: &[Algo]) -> Result<u64> {
    run_threads(cli, config, topo, algos, false)
}

/// Ranks as threads of this process: the `local` transport, or `cuda-local` (every
/// rank on the GPU of `STRATA_DEVICE`, default 0).
fn run_threads(
    cli: &Cli,
    config: CommConfig,
    topo: Option<Topology>,
    algos: &[Algo],
    gpu: bool,
) -> Result<u64> {
    let ranks = match (cli.ranks, &topo) {
        (Some(n), _) => n as usize,
        (None, Some(t)) => t.world_size(),
        (None, None) => 8,
    };
    let topo = topo.unwrap_or_else(|| Topology::flat(ranks));
    let timeout = config.timeout;
    let comms = if gpu {
        let ordinal = match std::env::var("STRATA_DEVICE") {
            Ok(v) => v.trim().parse().map_err(|_| {
                Error::InvalidArgument(format!("STRATA_DEVICE={v:?} is not a device ordinal"))
            })?,
            Err(_) => 0,
        };
        Comm::cuda_local_world(ranks, Some(topo), config, ordinal)?
    } else {
        Comm::local_world(ranks, Some(topo), config)?
    };
    let plan = Arc::new(build_plan(cli, algos, ranks)?);
    let mut reporter = Reporter::new(cli, &plan, comms[0].clone(), algos)?;

    let fence = Arc::new(Fence::new(ranks, timeout));
    let (tx, rx) = mpsc::channel::<Msg>();
    let mut handles = Vec::new();
    for comm in comms {
        let (plan, fence, tx) = (plan.clone(), fence.clone(), tx.clone());
        let r = comm.rank();
        let h = std::thread::Builder::new()
            .name(format!("strata-perf-r{r}"))
            .spawn(move || {
                let pace = LocalPace {
                    fence: fence.clone(),
                };
                for (i, row) in plan.rows.iter().enumerate() {
                    match bench_row(&comm, &plan, row, &pace) {
                        Ok(rr) => {
                            let _ = tx.send(Msg::Row(i, r, rr));
                        }
                        Err(e) => {
                            // Report first, then wake everyone else (their errors follow).
                            let _ = tx.send(Msg::Failed(r, e.clone()));
                            fence.abort(&format!("rank {r}: {e}"));
                            comm.abort();
                            return;
                        }
                    }
                }
            })
            .map_err(|e| Error::System(format!("cannot start a rank thread: {e}")))?;
        handles.push(h);
    }
    drop(tx);

    // Rows complete in order (every row ends with fences); keep them keyed anyway.
    let mut pending: Vec<Vec<RankRow>> = vec![Vec::new(); plan.rows.len()];
    let mut rank0_traffic: Vec<Option<TrafficMatrix>> = vec![None; plan.rows.len()];
    let mut next = 0;
    let mut failure: Option<(usize, Error)> = None;
    for msg in rx {
        match msg {
            Msg::Row(i, r, rr) => {
                if r == 0 {
                    rank0_traffic[i] = rr.traffic.clone();
                }
                pending[i].push(rr);
                while next < plan.rows.len() && pending[next].len() == ranks {
                    let rows = std::mem::take(&mut pending[next]);
                    let time = rows.iter().map(|x| x.time_us).fold(0.0, f64::max);
                    let wrong = rows.iter().map(|x| x.wrong).sum();
                    let err = rows.iter().filter_map(|x| x.err).reduce(ErrStats::merge);
                    reporter.row(next, time, wrong, err, rank0_traffic[next].take());
                    next += 1;
                }
            }
            Msg::Failed(r, e) => {
                // A failed collective aborts its communicator, so peers fail with
                // consequences ("aborted"); keep the first error that is not one.
                let consequence = |e: &Error| {
                    let m = e.to_string();
                    m.contains("aborted") || m.contains("another rank failed")
                };
                match &failure {
                    Some((_, f)) if !consequence(f) || consequence(&e) => {}
                    _ => failure = Some((r, e)),
                }
            }
        }
    }
    let mut panicked = None;
    for (r, h) in handles.into_iter().enumerate() {
        if h.join().is_err() {
            panicked.get_or_insert(r);
        }
    }
    if let Some((r, e)) = failure {
        if let Some(pb) = &reporter.pb {
            pb.finish_and_clear();
        }
        return Err(with_rank(e, r));
    }
    if let Some(r) = panicked {
        return Err(Error::Internal(format!("rank {r} thread panicked")));
    }
    reporter.finish()
}

/// Prefix the message of `e` with the rank it happened on.
fn with_rank(e: Error, r: usize) -> Error {
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("rank {r}: {m}")),
        Error::InvalidUsage(m) => Error::InvalidUsage(format!("rank {r}: {m}")),
        Error::Remote(m) => Error::Remote(format!("rank {r}: {m}")),
        Error::System(m) => Error::System(format!("rank {r}: {m}")),
        Error::Device(m) => Error::Device(format!("rank {r}: {m}")),
        Error::NotCompiled(m) => Error::NotCompiled(m),
        Error::Internal(m) => Error::Internal(format!("rank {r}: {m}")),
    }
}

fn run_mpi(cli: &Cli, config: CommConfig, topo: Option<Topology>, algos: &[Algo]) -> Result<u64> {
    let comm = Comm::mpi_world(topo, config)?;
    let r = run_mpi_on(cli, &comm, algos);
    if r.is_err() {
        // Peers blocked in a collective with this rank must not wait out their timeout.
        comm.abort();
    }
    r
}

fn run_mpi_on(cli: &Cli, comm: &Comm, algos: &[Algo]) -> Result<u64> {
    let (p, me) = (comm.size(), comm.rank());
    if let Some(n) = cli.ranks {
        if n as usize != p {
            return Err(Error::InvalidUsage(format!(
                "--ranks {n} but the MPI job has {p} processes (omit --ranks with mpi)"
            )));
        }
    }
    let plan = build_plan(cli, algos, p)?;
    let n = comm.topology().world_size();
    // Rank 0 reports; its setup errors (a bad --json path) must reach the others too.
    let reporter = if me == 0 {
        Some(Reporter::new(cli, &plan, comm.clone(), algos))
    } else {
        None
    };
    let ok = u64::from(!matches!(reporter, Some(Err(_))));
    let agreed = all_gather_bytes(comm, &ok.to_le_bytes())?;
    if agreed[..8] != 1u64.to_le_bytes() {
        return match reporter {
            Some(Err(e)) => Err(e),
            _ => Err(Error::Remote("rank 0 could not start the report".into())),
        };
    }
    let mut reporter = reporter.transpose()?;
    for (i, row) in plan.rows.iter().enumerate() {
        let rr = bench_row(comm, &plan, row, &MpiPace).map_err(|e| with_rank(e, me))?;
        // Gather (time, wrong, error statistics, own traffic row) from every rank.
        const HEAD: usize = 7;
        let mut mine = Vec::with_capacity((n + HEAD) * 8);
        mine.extend_from_slice(&rr.time_us.to_le_bytes());
        mine.extend_from_slice(&rr.wrong.to_le_bytes());
        let e = rr.err.unwrap_or_default();
        for w in [
            u64::from(rr.err.is_some()),
            e.max.to_bits(),
            e.sumsq.to_bits(),
            e.n,
            e.bound.to_bits(),
        ] {
            mine.extend_from_slice(&w.to_le_bytes());
        }
        let own = comm.world_rank(me);
        match &rr.traffic {
            Some(m) => m
                .row(own)
                .iter()
                .for_each(|b| mine.extend_from_slice(&b.to_le_bytes())),
            None => mine.extend(std::iter::repeat(0u8).take(n * 8)),
        }
        let all = all_gather_bytes(comm, &mine)?;
        if let Some(rep) = reporter.as_mut() {
            let word = |j: usize, k: usize| {
                let o = (j * (n + HEAD) + k) * 8;
                u64::from_le_bytes(all[o..o + 8].try_into().unwrap_or([0; 8]))
            };
            let mut time = 0.0f64;
            let mut wrong = 0u64;
            let mut err: Option<ErrStats> = None;
            let mut m = TrafficMatrix::zero(n);
            for j in 0..p {
                time = time.max(f64::from_bits(word(j, 0)));
                wrong += word(j, 1);
                if word(j, 2) == 1 {
                    let e = ErrStats {
                        max: f64::from_bits(word(j, 3)),
                        sumsq: f64::from_bits(word(j, 4)),
                        n: word(j, 5),
                        bound: f64::from_bits(word(j, 6)),
                    };
                    err = Some(err.map_or(e, |a| a.merge(e)));
                }
                let src = comm.world_rank(j);
                for d in 0..n {
                    m.bytes[src * n + d] = word(j, HEAD + d);
                }
            }
            let traffic = rr.traffic.is_some().then_some(m);
            rep.row(i, time, wrong, err, traffic);
        }
    }
    match reporter {
        Some(rep) => rep.finish(),
        None => Ok(0),
    }
}

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
            eprintln!("error: {e}");
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
    };
    let algos = if cli.algo.is_empty() {
        vec![config.algo]
    } else {
        dedup(&cli.algo)
    };
    // After STRATA_ALGO is read: the quantized algos' constraints (usage errors, exit 2).
    if let Some((kind, msg)) = quant_conflict(cli, &algos) {
        Cli::command().error(kind, msg).exit();
    }
    if cli.dry_run {
        return conclude(run_dry(cli, &config, &algos));
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
        TransportKind::CudaLocal => run_threads(cli, config, topo, &algos, true),
    };
    conclude(r)
}

/// True when launched by an MPI launcher (mpirun, srun with PMI).
fn under_mpi() -> bool {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .any(|k| std::env::var_os(k).is_some())
}

/// `--transport nccl|rccl`: bootstrapped like nccl-tests. Under mpirun the MPI world
/// carries rank 0's unique id to every rank (`Comm::vendor_world`); launched alone, a
/// one-rank world does, giving a one-rank vendor communicator.
fn run_vendor(
    cli: &Cli,
    config: CommConfig,
    topo: Option<Topology>,
    algos: &[Algo],
) -> Result<u64> {
    let boot = if under_mpi() {
        Comm::mpi_world(topo, config.clone())?
    } else {
        let topo = topo.unwrap_or_else(|| Topology::flat(1));
        if topo.world_size() != 1 {
            return Err(Error::InvalidUsage(format!(
                "--transport {} runs one rank per process: launch {} processes with mpirun",
                cli.transport.name(),
                topo.world_size()
            )));
        }
        Comm::local_world(1, Some(topo), config.clone())?.remove(0)
    };
    let comm = Comm::vendor_world(&boot, cli.transport, config)?;
    let r = run_mpi_on(cli, &comm, algos);
    if r.is_err() {
        comm.abort();
        boot.abort();
    }
    r
}

/// Flag combinations clap cannot express: usage errors (exit 2).
fn validate(cli: &Cli) {
    let mut cmd = Cli::command();
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
    if cli.ranks.is_some()
        && !matches!(
            cli.transport,
            TransportKind::Local | TransportKind::Mpi | TransportKind::CudaLocal
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    validate(&cli);
    run(&cli)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_statistics_combine_sums_of_squares() {
        // Rank a: 1 element with error 1; rank b: 3 elements with errors 3, 3, 3.
        let a = ErrStats::of(&QuantCheck {
            wrong: 0,
            max_err: 1.0,
            rms_err: 1.0,
            bound: 4.0,
            count: 1,
        });
        let b = ErrStats::of(&QuantCheck {
            wrong: 0,
            max_err: 3.0,
            rms_err: 3.0,
            bound: 4.0,
            count: 3,
        });
        let m = a.merge(b);
        assert_eq!((m.max, m.n, m.bound), (3.0, 4, 4.0));
        // sqrt((1 + 27) / 4), not the mean of the per-rank RMS values (2).
        assert!((m.rms() - 7f64.sqrt()).abs() < 1e-12);
        assert_eq!(ErrStats::default().rms(), 0.0);
        let nan = ErrStats { max: f64::NAN, ..a };
        assert!(a.merge(nan).max.is_nan());
    }

    #[test]
    fn error_figures_format_like_c() {
        assert_eq!(fmt_err(0.0), "0");
        assert_eq!(fmt_err(0.0195), "1.95e-02");
        assert_eq!(fmt_err(14.5), "1.45e+01");
        assert_eq!(fmt_err(f64::INFINITY), "inf");
        let cols = table_columns(false, true);
        let [h1, h2] = header_lines(&cols);
        assert_eq!(h1.len(), h2.len());
        let cells: Vec<String> = cols.iter().map(|_| "x".to_string()).collect();
        assert_eq!(table_line(&cols, &cells).len(), h1.len());
    }
}
