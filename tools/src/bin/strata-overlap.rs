//! `strata-overlap`: does a stream-ordered collective overlap with work on another
//! stream? Every rank of an in-process device world (`cuda-local` on one GPU,
//! `host-local` on the CPU device) keeps one stream busy for `--busy-ms` (on CUDA a
//! one-thread kernel waiting on the GPU's timer, standing in for a compute kernel; a
//! sleep on the CPU device) and runs the collective,
//! stream-ordered (`Comm::enqueue`), on a second stream. Per size: the median solo time
//! of each (measured on the caller's streams, synchronized), the median joint time, and
//! the overlap `(busy + comm - joint) / min(busy, comm)`: 1 when the shorter one hid
//! completely behind the longer, 0 when they ran one after the other. Every result is
//! checked against the blocking call on the same inputs (`#wrong`).
//!
//!   strata-overlap --transport host-local --topology nodes:2x2 --op all-gather --algo hier -b 1M -e 16M
//!   strata-overlap --transport cuda-local --topology nodes:2x4 --op all-gather,reduce-scatter --algo hier,qgz -b 1M -e 256M
#![forbid(unsafe_code)]

use clap::Parser;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata::check::Kind;
use strata::device::{finish, DevStream};
use strata::transport::TransportKind;
use strata::{Algo, Buffer, Comm, CommConfig, DataType, Error, ReduceOp, Request, Result};
use strata_tools::cli::{parse_algo, parse_kind, parse_size};
use strata_tools::outln;

/// Overlap of a stream-ordered collective with a busy stream, per size.
#[derive(Parser, Debug, Clone)]
#[command(name = "strata-overlap", version, verbatim_doc_comment)]
struct Cli {
    /// In-process device transport: host-local (the CPU device) or cuda-local (one GPU).
    #[arg(long, default_value = "host-local")]
    transport: String,

    /// Topology SPEC of the world (its size is the number of ranks).
    #[arg(long, default_value = "nodes:2x2")]
    topology: String,

    /// Collective(s): all-gather, reduce-scatter, all-reduce.
    #[arg(long, default_value = "all-gather", value_delimiter = ',', value_parser = parse_kind)]
    op: Vec<Kind>,

    /// Algorithm(s): ring, hier, ho-ring, qgz (reduce-scatter), qwz (all-gather), auto.
    #[arg(long, default_value = "hier", value_delimiter = ',', value_parser = parse_algo)]
    algo: Vec<Algo>,

    /// Smallest size in bytes (the larger buffer, as nccl-tests counts).
    #[arg(short = 'b', long, default_value = "1M", value_parser = parse_size)]
    minbytes: u64,

    /// Largest size in bytes.
    #[arg(short = 'e', long, default_value = "16M", value_parser = parse_size)]
    maxbytes: u64,

    /// Size multiplication factor.
    #[arg(short = 'f', long, default_value_t = 4)]
    stepfactor: u64,

    /// How long the other stream is kept busy, in milliseconds.
    #[arg(long, default_value_t = 20)]
    busy_ms: u64,

    /// Timed repetitions per point (the median is reported).
    #[arg(short = 'n', long, default_value_t = 5)]
    iters: usize,
}

/// One rank's measurement of one point: solo busy, solo comm, joint (seconds), wrong.
type Sample = (f64, f64, f64, usize);

fn request(kind: Kind, algo: Algo, send: &Buffer, recv: &Buffer, count: usize) -> Result<Request> {
    let redop = match kind {
        Kind::AllGather | Kind::AllReduce => ReduceOp::Sum,
        Kind::ReduceScatter => ReduceOp::Avg,
        other => {
            return Err(Error::InvalidArgument(format!(
                "strata-overlap measures all-gather, reduce-scatter and all-reduce, not {}",
                other.name()
            )))
        }
    };
    let op = kind.op(send.clone(), recv.clone(), count, redop);
    Ok(Request::new(op, DataType::F32).with_algo(algo))
}

fn sync(s: &dyn DevStream, t: Duration) -> Result<()> {
    finish(s, t, "strata-overlap: a stream", || Ok(()))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// One rank: every point, in the same order on every rank (the communicator's barrier
/// keeps them in step; a failing rank aborts the communicator, so no peer waits on it).
fn rank(c: &Comm, cli: &Cli, points: &[(Kind, Algo, u64)]) -> Result<Vec<Sample>> {
    let r = rank_points(c, cli, points);
    if r.is_err() {
        c.abort();
    }
    r
}

fn rank_points(c: &Comm, cli: &Cli, points: &[(Kind, Algo, u64)]) -> Result<Vec<Sample>> {
    let dev = c
        .device()
        .ok_or_else(|| Error::InvalidUsage("strata-overlap needs a device transport".into()))?;
    let (busy, comm) = (dev.new_stream()?, dev.new_stream()?);
    let p = c.size();
    let t = c.timeout();
    let mut out = Vec::new();
    for &(kind, algo, size) in points {
        let big = (size as usize / 4 / p).max(1) * p; // elements of the larger buffer
        let small = big / p;
        let (ins, outs, count) = match kind {
            Kind::AllGather => (small, big, small),
            Kind::ReduceScatter => (big, small, small),
            _ => (big, big, big),
        };
        let input: Vec<u8> = (0..ins)
            .flat_map(|i| (((c.rank() * 7 + i) % 61) as f32 * 0.5).to_le_bytes())
            .collect();
        let send = c.native_from(&input)?;
        let (recv, want) = (c.alloc_native(outs * 4)?, c.alloc_native(outs * 4)?);
        c.call(request(kind, algo, &send, &want, count)?)?;
        let want = want.to_bytes()?;
        let d = Duration::from_millis(cli.busy_ms);
        let (mut b, mut m, mut j, mut wrong) = (Vec::new(), Vec::new(), Vec::new(), 0);
        for it in 0..cli.iters + 1 {
            c.barrier()?;
            let t0 = Instant::now();
            busy.delay(d)?;
            sync(busy.as_ref(), t)?;
            let solo_busy = t0.elapsed().as_secs_f64();
            c.barrier()?;
            let t0 = Instant::now();
            let w = c.enqueue(request(kind, algo, &send, &recv, count)?, &comm)?;
            sync(comm.as_ref(), t)?;
            let solo_comm = t0.elapsed().as_secs_f64();
            w.wait()?;
            wrong += usize::from(recv.to_bytes()? != want);
            c.barrier()?;
            let t0 = Instant::now();
            busy.delay(d)?;
            let w = c.enqueue(request(kind, algo, &send, &recv, count)?, &comm)?;
            sync(busy.as_ref(), t)?;
            sync(comm.as_ref(), t)?;
            let joint = t0.elapsed().as_secs_f64();
            w.wait()?;
            wrong += usize::from(recv.to_bytes()? != want);
            if it > 0 {
                // The first round warms up (sub-communicators, the memory cache).
                b.push(solo_busy);
                m.push(solo_comm);
                j.push(joint);
            }
        }
        out.push((median(b), median(m), median(j), wrong));
    }
    Ok(out)
}

fn run(cli: &Cli) -> Result<usize> {
    let kind: TransportKind = cli.transport.parse()?;
    if !matches!(kind, TransportKind::HostLocal | TransportKind::CudaLocal) {
        return Err(Error::InvalidArgument(format!(
            "strata-overlap runs on the in-process device transports (host-local, \
             cuda-local), not {}",
            kind.name()
        )));
    }
    if cli.iters == 0 || cli.stepfactor < 2 || cli.minbytes == 0 || cli.minbytes > cli.maxbytes {
        return Err(Error::InvalidArgument(
            "need -n >= 1, -f >= 2 and 0 < -b <= -e".into(),
        ));
    }
    for k in &cli.op {
        if !matches!(k, Kind::AllGather | Kind::ReduceScatter | Kind::AllReduce) {
            return Err(Error::InvalidArgument(format!(
                "strata-overlap measures all-gather, reduce-scatter and all-reduce, not {}",
                k.name()
            )));
        }
    }
    let topo = strata::Topology::parse(&cli.topology)?;
    let n = topo.world_size();
    let comms = Comm::in_process_world(kind, n, Some(topo), CommConfig::default())?;
    let mut points = Vec::new();
    for &op in &cli.op {
        for &algo in &cli.algo {
            let mut s = cli.minbytes;
            while s <= cli.maxbytes {
                points.push((op, algo, s));
                s = s.saturating_mul(cli.stepfactor);
            }
        }
    }
    let (cli2, points2) = (Arc::new(cli.clone()), Arc::new(points.clone()));
    let handles: Vec<_> = comms
        .into_iter()
        .map(|c| {
            let (cli, points) = (cli2.clone(), points2.clone());
            std::thread::spawn(move || rank(&c, &cli, &points))
        })
        .collect();
    let mut per_rank = Vec::new();
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok(v)) => per_rank.push(v),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(Error::Internal("a rank thread panicked".into()));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    outln!(
        "# strata-overlap: {} ranks on {}, a stream busy for {} ms beside each collective",
        n,
        kind.name(),
        cli.busy_ms
    );
    outln!(
        "# {:>14} {:>10} {:>8} {:>10} {:>10} {:>10} {:>8} {:>7}",
        "op",
        "algo",
        "size",
        "busy_ms",
        "comm_ms",
        "joint_ms",
        "overlap",
        "#wrong"
    );
    let mut wrong_total = 0;
    for (i, &(op, algo, size)) in points.iter().enumerate() {
        // The slowest rank's view of each quantity.
        let pick = |f: fn(&Sample) -> f64| per_rank.iter().map(|r| f(&r[i])).fold(0.0f64, f64::max);
        let (b, m, j) = (pick(|s| s.0), pick(|s| s.1), pick(|s| s.2));
        let wrong: usize = per_rank.iter().map(|r| r[i].3).sum();
        wrong_total += wrong;
        let overlap = (b + m - j) / b.min(m).max(1e-9);
        outln!(
            "  {:>14} {:>10} {:>8} {:>10.2} {:>10.2} {:>10.2} {:>8.2} {:>7}",
            op.name(),
            algo.name(),
            size,
            b * 1e3,
            m * 1e3,
            j * 1e3,
            overlap.clamp(-1.0, 1.0),
            wrong
        );
    }
    Ok(wrong_total)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(w) => {
            eprintln!("strata-overlap: {w} wrong results");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!(
                "strata-overlap: {}",
                strata_tools::cli::describe("strata-overlap", &e)
            );
            ExitCode::from(2)
        }
    }
}
