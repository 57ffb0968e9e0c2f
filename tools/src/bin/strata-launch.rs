//! `strata-launch`: how a stream-ordered collective launches, on an in-process device
//! world (`host-local` on the CPU device, `cuda-local` on one GPU). Per algorithm:
//!
//! - `return`: the median time one call takes to return (`Comm::enqueue`) while its
//!   stream is held by a `--delay-ms` delay queued ahead of it (a kernel that waits on the
//!   GPU's timer on CUDA, a host callback on HIP, a sleep on the CPU device), over
//!   `--calls` back-to-back calls, and whether all of them returned before the first
//!   completed (`ahead`: yes means no call waited for the device); `all`: the time all
//!   of them took to return (slowest rank), which must stay under the delay; `max`: the
//!   slowest single return;
//! - `floor`: the median round trip of one call with nothing ahead of it (enqueue, then
//!   synchronize the caller's stream) after warm-up: the latency floor of the launch
//!   path for a `-b`-byte all-gather.
//!
//! Every result is checked (`#wrong`). Only the public API is used, so the same source
//! measures older builds.
//!
//!   strata-launch --transport host-local --topology nodes:1x2 --algo ring,hier -b 8
#![forbid(unsafe_code)]

use clap::Parser;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use strata::device::{finish, DevStream};
use strata::transport::TransportKind;
use strata::{Algo, Buffer, Comm, CommConfig, DataType, Error, Op, Request, Result};
use strata_tools::cli::{parse_algo, parse_size};

/// Launch behaviour of stream-ordered all-gathers.
#[derive(Parser, Debug, Clone)]
#[command(name = "strata-launch", version, verbatim_doc_comment)]
struct Cli {
    /// In-process device transport: host-local (the CPU device) or cuda-local (one GPU).
    #[arg(long, default_value = "host-local")]
    transport: String,

    /// Topology SPEC of the world (its size is the number of ranks).
    #[arg(long, default_value = "nodes:1x2")]
    topology: String,

    /// Algorithm(s): ring, hier, ho-ring, auto.
    #[arg(long, default_value = "ring", value_delimiter = ',', value_parser = parse_algo)]
    algo: Vec<Algo>,

    /// All-gather output size in bytes (a multiple of 4 x ranks; 8 with two ranks).
    #[arg(short = 'b', long, default_value = "8", value_parser = parse_size)]
    bytes: u64,

    /// Back-to-back calls behind the delay.
    #[arg(long, default_value_t = 100)]
    calls: usize,

    /// The delay queued on the stream ahead of them, in milliseconds.
    #[arg(long, default_value_t = 500)]
    delay_ms: u64,

    /// Round trips timed for the floor (after as many warm-up calls).
    #[arg(short = 'n', long, default_value_t = 200)]
    iters: usize,
}

/// One rank's figures for one algorithm: median return (s), all ahead, floor (s), wrong,
/// the time all calls took to return (s), the slowest return (s).
type Row = (f64, bool, f64, usize, f64, f64);

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn sync(s: &dyn DevStream) -> Result<()> {
    finish(
        s,
        Duration::from_secs(120),
        "strata-launch: the stream",
        || Ok(()),
    )
}

fn gather(c: &Comm, send: &Buffer, recv: &Buffer, count: usize, algo: Algo) -> Request {
    Request::new(
        Op::AllGather {
            send: send.clone(),
            recv: recv.clone(),
            count,
        },
        DataType::F32,
    )
    .with_algo(if c.size() == 1 { Algo::Ring } else { algo })
}

fn rank(c: &Comm, cli: &Cli) -> Result<Vec<Row>> {
    let (p, r) = (c.size(), c.rank());
    let count = (cli.bytes as usize / 4 / p).max(1);
    let dev = c
        .device()
        .ok_or_else(|| Error::InvalidUsage("strata-launch needs a device transport".into()))?;
    let s = dev.new_stream()?;
    let value = |j: usize, i: usize| ((j * 7919 + i) % 65_536) as f32;
    let sends: Vec<Buffer> = (0..cli.calls)
        .map(|i| {
            let v: Vec<u8> = (0..count)
                .flat_map(|k| value(r, i + k).to_le_bytes())
                .collect();
            c.native_from(&v)
        })
        .collect::<Result<_>>()?;
    let recvs: Vec<Buffer> = (0..cli.calls)
        .map(|_| c.alloc_native(p * count * 4))
        .collect::<Result<_>>()?;
    let mut rows = Vec::new();
    for &algo in &cli.algo {
        // Warm-up (the first call of a shape allocates its scratch), then the floor.
        let mut floor = Vec::new();
        for i in 0..2 * cli.iters {
            let t = Instant::now();
            c.enqueue(gather(c, &sends[0], &recvs[0], count, algo), &s)?;
            sync(s.as_ref())?;
            if i >= cli.iters {
                floor.push(t.elapsed().as_secs_f64());
            }
        }
        c.barrier()?;
        s.delay(Duration::from_millis(cli.delay_ms))?;
        let mut ret = Vec::new();
        let mut works = Vec::new();
        let t_all = Instant::now();
        for i in 0..cli.calls {
            let t = Instant::now();
            works.push(c.enqueue(gather(c, &sends[i], &recvs[i], count, algo), &s)?);
            ret.push(t.elapsed().as_secs_f64());
        }
        let ahead = !works[0].is_done();
        let all_returned = t_all.elapsed().as_secs_f64();
        sync(s.as_ref())?;
        for w in &works {
            w.wait()?;
        }
        let mut wrong = 0;
        for (i, b) in recvs.iter().enumerate() {
            let want: Vec<u8> = (0..p)
                .flat_map(|j| (0..count).flat_map(move |k| value(j, i + k).to_le_bytes()))
                .collect();
            let got = b.to_bytes()?;
            wrong += got
                .chunks(4)
                .zip(want.chunks(4))
                .filter(|(a, b)| a != b)
                .count();
        }
        let slowest = ret.iter().copied().fold(0.0, f64::max);
        rows.push((
            median(ret),
            ahead,
            median(floor),
            wrong,
            all_returned,
            slowest,
        ));
        c.barrier()?;
    }
    Ok(rows)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let kind = match cli.transport.parse::<TransportKind>() {
        Ok(k @ (TransportKind::HostLocal | TransportKind::CudaLocal)) => k,
        _ => {
            eprintln!("strata-launch: --transport is host-local or cuda-local");
            return ExitCode::from(2);
        }
    };
    let run = || -> Result<Vec<Vec<Row>>> {
        let topo = strata::Topology::parse(&cli.topology)?;
        let n = topo.world_size();
        let comms = Comm::in_process_world(kind, n, Some(topo), CommConfig::default())?;
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let cli = cli.clone();
                std::thread::spawn(move || {
                    let r = rank(&c, &cli);
                    if r.is_err() {
                        c.abort();
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| Error::Internal("a rank panicked".into()))?
            })
            .collect()
    };
    let all = match run() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("strata-launch: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "# {} {} ranks, {}-byte all-gather; return: median over {} calls behind a {} ms delay (slowest rank); floor: median round trip over {} calls",
        cli.transport,
        all.len(),
        cli.bytes,
        cli.calls,
        cli.delay_ms,
        cli.iters
    );
    println!(
        "{:>8} {:>12} {:>7} {:>12} {:>7} {:>10} {:>10}",
        "algo", "return(us)", "ahead", "floor(us)", "#wrong", "all(ms)", "max(ms)"
    );
    let mut bad = false;
    for (i, algo) in cli.algo.iter().enumerate() {
        let ret = all.iter().map(|r| r[i].0).fold(0.0, f64::max);
        let ahead = all.iter().all(|r| r[i].1);
        let floor = all.iter().map(|r| r[i].2).fold(0.0, f64::max);
        let wrong: usize = all.iter().map(|r| r[i].3).sum();
        let every = all.iter().map(|r| r[i].4).fold(0.0, f64::max);
        let slowest = all.iter().map(|r| r[i].5).fold(0.0, f64::max);
        bad |= wrong > 0;
        println!(
            "{:>8} {:>12.1} {:>7} {:>12.1} {:>7} {:>10.1} {:>10.2}",
            algo.name(),
            ret * 1e6,
            if ahead { "yes" } else { "no" },
            floor * 1e6,
            wrong,
            every * 1e3,
            slowest * 1e3
        );
    }
    if bad {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
