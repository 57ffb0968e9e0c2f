//! `strata-sim`: how long would this collective take on this cluster?
//!
//! Builds the schedule every rank of the modeled world would execute (a dry run: no
//! data, no threads) and replays it on the topology's link model ([`strata::sim`]).
//! Prints, per (op, size, algo): the modeled time, algbw / busbw (nccl-tests formulas:
//! `algbw = size / time`, `busbw = algbw · (p-1)/p`, `2(p-1)/p` for all-reduce), the
//! lower bound (busiest resource's busy time) and the ratio to it, the bandwidth-only
//! bound, and the bytes per link class.
//!
//!   strata-sim --topology frontier:4 --op all-gather --algo ring,hier,ho-ring --size 256M
//!   strata-sim --topology dgx-a100:2 --op reduce-scatter --size 64M,1G -d bf16 --trace rs.json
//!   strata-sim --fidelity      # the model beside published measurements
#![forbid(unsafe_code)]

use clap::Parser;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;
use strata::check::Kind;
use strata::sim::{self, trace};
use strata::traffic::TrafficReport;
use strata::{Algo, DataType, Error, Result, Topology};
use strata_tools::cli::{parse_algo, parse_dtype, parse_kind};
use strata_tools::outln;

/// Model a collective on a cluster: modeled time, bandwidths, lower bound, traffic.
///
/// Examples:
///   strata-sim --topology frontier:4 --op all-gather --algo ring,hier,ho-ring --size 256M
///   strata-sim --topology dgx-a100:128 --op reduce-scatter --size 1G -d bf16 --chunks 4
#[derive(Parser, Debug)]
#[command(name = "strata-sim", version, verbatim_doc_comment)]
struct Cli {
    /// Topology SPEC of the modeled cluster (dgx-a100:N, frontier:N, p3dn:N, nodes:NxR, ... or a JSON file).
    #[arg(long, required_unless_present = "fidelity")]
    topology: Option<String>,

    /// Print the model beside published figures instead (nccl-tests bus bandwidths on
    /// DGX A100 / H100, MiCS and PaRO ratios), as the table of docs/model-fidelity.md.
    #[arg(long)]
    fidelity: bool,

    /// Collective(s), comma-separated: all-gather, reduce-scatter, all-reduce.
    #[arg(long, default_value = "all-gather", value_delimiter = ',', value_parser = parse_kind)]
    op: Vec<Kind>,

    /// Algorithm(s), comma-separated: ring, hier, ho-ring, auto.
    #[arg(long, default_value = "ring,hier,ho-ring", value_delimiter = ',', value_parser = parse_algo)]
    algo: Vec<Algo>,

    /// Message size(s) in bytes as nccl-tests counts them (the larger buffer: the
    /// gathered output / the unreduced input); K/M/G suffixes are powers of 1024.
    #[arg(long, default_value = "256M", value_delimiter = ',', value_parser = parse_size)]
    size: Vec<u64>,

    /// Datatype: f32, f16, bf16 (also i8, u8, i32).
    #[arg(short = 'd', long, default_value = "f32", value_parser = parse_dtype)]
    datatype: DataType,

    /// Pieces per chunk for ho-ring (default: by size, as when executed).
    #[arg(long, value_parser = clap::value_parser!(usize))]
    chunks: Option<usize>,

    /// Write a Chrome trace (Perfetto) of each modeled schedule; with several
    /// (op, size, algo) points, `-<op>-<algo>` (and `-<size>`) is inserted before the extension.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,

    /// Also write the results as a JSON array to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

fn parse_size(s: &str) -> std::result::Result<u64, String> {
    strata::units::parse_size(s)
}

/// One modeled point (JSON record).
#[derive(Debug, Serialize)]
struct Record {
    topology: String,
    ranks: usize,
    op: &'static str,
    algo: &'static str,
    algo_used: &'static str,
    dtype: &'static str,
    size: u64,
    count: usize,
    chunks: Option<usize>,
    /// Pieces per chunk the ho-ring schedule used (null for other algorithms).
    pieces: Option<usize>,
    model_time_us: f64,
    algbw: f64,
    busbw: f64,
    lower_bound_us: f64,
    ratio: f64,
    bandwidth_bound_us: f64,
    bandwidth_ratio: f64,
    bottleneck: String,
    transfers: usize,
    traffic: TrafficReport,
}

/// `path` with `-<tag>` inserted before its extension.
fn tagged(path: &Path, tag: &str) -> PathBuf {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("trace");
    let name = match path.extension().and_then(|e| e.to_str()) {
        Some(ext) => format!("{stem}-{tag}.{ext}"),
        None => format!("{stem}-{tag}"),
    };
    path.with_file_name(name)
}

fn run(cli: &Cli) -> Result<()> {
    if cli.fidelity {
        print!("{}", sim::fidelity::markdown(&sim::fidelity::rows()?));
        return Ok(());
    }
    let topo = Topology::parse(cli.topology.as_deref().unwrap_or_default())?;
    let p = topo.world_size();
    let s = cli.datatype.size();
    let ops = dedup(&cli.op);
    let algos = dedup(&cli.algo);
    let sizes = dedup(&cli.size);
    let several = ops.len() * algos.len() * sizes.len() > 1;
    outln!(
        "# strata-sim {} (modeled, no data moved)",
        env!("CARGO_PKG_VERSION")
    );
    outln!("#  topology  : {}", topo.summary());
    let l = &topo.links;
    outln!(
        "#  links     : intra_package {} GB/s {} us | intra_node {} GB/s {} us | inter_node {} NIC(s)/node x {} GB/s, {} us",
        l.intra_package.bandwidth_gbs,
        l.intra_package.latency_us,
        l.intra_node.bandwidth_gbs,
        l.intra_node.latency_us,
        l.nics_per_node,
        l.nic_bandwidth_gbs,
        l.inter_node.latency_us
    );
    outln!("#  dtype     : {}", cli.datatype.name());
    outln!(
        "#  chunks    : {}",
        cli.chunks
            .map(|c| c.to_string())
            .unwrap_or_else(|| "default (by size)".into())
    );
    outln!("#  lower bound: busiest resource's busy time (its transfers' latency + bytes/bandwidth); bw bound: bytes/bandwidth only");
    let mut records = Vec::new();
    for &kind in &ops {
        outln!("#");
        outln!("# {}", kind.name());
        outln!(
            "#{:>11}  {:>8}  {:>7}  {:>6}  {:>11}  {:>7}  {:>7}  {:>11}  {:>6}  {:>11}  {:>6}  {:>12}  {:>12}  {:>12}  {:>12}  {:>9}",
            "size", "algo", "used", "pieces", "time", "algbw", "busbw", "lower_bnd", "ratio", "bw_bound", "ratio", "intra_pkg", "intra_node", "inter_node", "node_egress", "transfers"
        );
        outln!(
            "#{:>11}  {:>8}  {:>7}  {:>6}  {:>11}  {:>7}  {:>7}  {:>11}  {:>6}  {:>11}  {:>6}  {:>12}  {:>12}  {:>12}  {:>12}  {:>9}",
            "(B)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "(us)", "", "(us)", "", "(B)", "(B)", "(B)", "(B)", ""
        );
        for &size in &sizes {
            let unit = match kind {
                Kind::AllReduce => s,
                _ => s * p,
            } as u64;
            let count = (size / unit).max(1) as usize;
            let bytes = sim::call_bytes(kind, count, p, s);
            for &algo in &algos {
                let t0 = Instant::now();
                let sched = sim::dry_run(&sim::Call {
                    chunks: cli.chunks,
                    ..sim::Call::new(&topo, kind, algo, count, cli.datatype)
                })?;
                let r = sim::replay(&sched, &topo)?;
                let secs = t0.elapsed().as_secs_f64();
                let used = sched.algo.unwrap_or(algo);
                let algbw = if r.makespan_us > 0.0 {
                    bytes as f64 / (r.makespan_us * 1e3)
                } else {
                    0.0
                };
                let busbw = algbw * sim::bus_factor(kind, p);
                let tr = sched.traffic(&topo);
                let bw_ratio = if r.bandwidth_bound_us > 0.0 {
                    r.makespan_us / r.bandwidth_bound_us
                } else {
                    1.0
                };
                outln!(
                    "{:>12}  {:>8}  {:>7}  {:>6}  {:>11.2}  {:>7.2}  {:>7.2}  {:>11.2}  {:>6.3}  {:>11.2}  {:>6.3}  {:>12}  {:>12}  {:>12}  {:>12}  {:>9}",
                    bytes,
                    algo.name(),
                    used.name(),
                    sched.pieces.map(|q| q.to_string()).unwrap_or_else(|| "-".into()),
                    r.makespan_us,
                    algbw,
                    busbw,
                    r.lower_bound_us,
                    r.ratio(),
                    r.bandwidth_bound_us,
                    bw_ratio,
                    tr.intra_package,
                    tr.intra_node,
                    tr.inter_node,
                    tr.max_node_egress,
                    sched.len()
                );
                tracing::debug!("{} {} {}: modeled in {secs:.3}s", kind.name(), algo, bytes);
                if let Some(path) = &cli.trace {
                    let path = if several {
                        let mut tag = format!("{}-{}", kind.name(), algo.name());
                        if sizes.len() > 1 {
                            tag.push('-');
                            tag.push_str(&strata::sim::plot::size_label(bytes as f64));
                        }
                        tagged(path, &tag)
                    } else {
                        path.clone()
                    };
                    trace::save_trace(&path, &sched, &r, &topo)?;
                    outln!("# trace: {}", path.display());
                }
                records.push(Record {
                    topology: topo.name.clone(),
                    ranks: p,
                    op: kind.name(),
                    algo: algo.name(),
                    algo_used: used.name(),
                    dtype: cli.datatype.name(),
                    size: bytes,
                    count,
                    chunks: cli.chunks,
                    pieces: sched.pieces,
                    model_time_us: r.makespan_us,
                    algbw,
                    busbw,
                    lower_bound_us: r.lower_bound_us,
                    ratio: r.ratio(),
                    bandwidth_bound_us: r.bandwidth_bound_us,
                    bandwidth_ratio: bw_ratio,
                    bottleneck: r.bottleneck.map(|b| b.to_string()).unwrap_or_default(),
                    transfers: sched.len(),
                    traffic: tr,
                });
            }
        }
    }
    if let Some(path) = &cli.json {
        let text = serde_json::to_string_pretty(&records)
            .map_err(|e| Error::Internal(format!("json: {e}")))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| Error::System(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(())
}

fn dedup<T: PartialEq + Copy>(v: &[T]) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for &x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
