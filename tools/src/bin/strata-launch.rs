//! `strata-launch`: how a stream-ordered collective launches, on an in-process device
//! world (`host-local` on the CPU device, `cuda-local` on one GPU) or on a one-rank
//! `nccl` communicator beside NCCL's own call. Per algorithm:
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
//!   path for a `-b`-byte collective;
//! - `entries` (`host-local` only; `-` elsewhere): what one call in steady state puts on
//!   the caller's stream, counted by the CPU device ([`strata::device::cpu::entries`]:
//!   operations, event records and event waits, as a CUDA stream takes launches,
//!   `cuEventRecord` and `cuStreamWaitEvent`): the difference of the count before and
//!   after a call of the floor's timed half, median over the calls, the largest of the
//!   ranks. A one-call collective is the transport's own call there plus one end event
//!   (on `host-local` the transport's call is itself several entries, its copies and
//!   reductions; on `nccl` the vendor's kernel: two in all, as `ProcessGroupNCCL`'s); a
//!   multi-stage one, the fork's event record and the join's wait (docs/gpu.md,
//!   "Per-call cost against NCCL");
//! - `direct`, `ratio` (`--transport nccl`, feature `cuda`; `-` elsewhere): the same
//!   collective called directly on NCCL (`ncclAllGather` / `ncclAllReduce`, f32 sum)
//!   through the library strata loaded, in this process, on a one-rank NCCL
//!   communicator of its own, on the same stream and buffers, timed as `return` (median
//!   return behind the same delay), and strata's `return` over it. NCCL refuses two
//!   ranks on one GPU, so `nccl` runs one rank (no mpirun).
//!
//! Every result is checked (`#wrong`; on `nccl` the direct calls' too). Only the public
//! API is used, so the same source measures older builds (`entries` needs the CPU
//! device's counter, `direct` the vendor wrappers of `strata::transport::vendor`).
//!
//!   strata-launch --transport host-local --topology nodes:1x2 --algo ring,hier -b 8
//!   strata-launch --transport nccl --op all-reduce -b 1K     # on a GPU, built with cuda
#![forbid(unsafe_code)]

use clap::Parser;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata::check::Kind;
use strata::device::{cpu, finish, DevStream};
use strata::transport::TransportKind;
use strata::{Algo, Buffer, Comm, CommConfig, DataType, Error, Op, ReduceOp, Request, Result};
use strata_tools::cli::{parse_algo, parse_kind, parse_size};
use strata_tools::outln;

/// Launch behaviour of stream-ordered collectives.
#[derive(Parser, Debug, Clone)]
#[command(name = "strata-launch", version, verbatim_doc_comment)]
struct Cli {
    /// Device transport: host-local (the CPU device), cuda-local (one GPU) or nccl (one
    /// rank, beside a direct NCCL call; needs the cuda feature and a GPU).
    #[arg(long, default_value = "host-local")]
    transport: String,

    /// Topology SPEC of the world (its size is the number of ranks; one rank on nccl).
    #[arg(long, default_value = "nodes:1x2")]
    topology: String,

    /// Algorithm(s): ring, hier, ho-ring, auto.
    #[arg(long, default_value = "ring", value_delimiter = ',', value_parser = parse_algo)]
    algo: Vec<Algo>,

    /// The collective: all-gather or all-reduce (f32, sum).
    #[arg(long, default_value = "all-gather", value_parser = parse_kind)]
    op: Kind,

    /// Output size in bytes (all-gather: a multiple of 4 x ranks, 8 with two ranks;
    /// all-reduce: a multiple of 4).
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

/// One rank's figures for one algorithm.
#[derive(Debug, Clone, Copy)]
struct Row {
    /// Median return behind the delay (s).
    ret: f64,
    /// Every call returned before the first completed.
    ahead: bool,
    /// Median round trip with nothing ahead (s).
    floor: f64,
    /// Wrong elements (strata's calls, and the direct calls where there are some).
    wrong: usize,
    /// The time all calls took to return (s).
    all: f64,
    /// The slowest return (s).
    max: f64,
    /// Entries one call put on the caller's stream (median; CPU device only).
    entries: Option<u64>,
    /// Median return of the direct vendor call behind the same delay (s; nccl only).
    direct: Option<f64>,
}

fn median<T: Copy + PartialOrd>(mut v: Vec<T>) -> Option<T> {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v.get(v.len() / 2).copied()
}

fn sync(s: &dyn DevStream) -> Result<()> {
    finish(
        s,
        Duration::from_secs(120),
        "strata-launch: the stream",
        || Ok(()),
    )
}

/// The request of one call: `--op` from `send` into `recv` (`count` elements a rank).
fn request(c: &Comm, op: Kind, send: &Buffer, recv: &Buffer, count: usize, algo: Algo) -> Request {
    let (send, recv) = (send.clone(), recv.clone());
    let op = match op {
        Kind::AllReduce => Op::AllReduce {
            send,
            recv,
            count,
            op: ReduceOp::Sum,
        },
        _ => Op::AllGather { send, recv, count },
    };
    Request::new(op, DataType::F32).with_algo(if c.size() == 1 { Algo::Ring } else { algo })
}

/// The input of rank `j` for call `i`, element `k`: integers below 2^16, so a sum over
/// fewer than 256 ranks is exact in f32.
fn value(j: usize, i: usize, k: usize) -> f32 {
    ((j * 7919 + i + k) % 65_536) as f32
}

/// The expected output of call `i` on `p` ranks, as bytes.
fn expected(op: Kind, p: usize, i: usize, count: usize) -> Vec<u8> {
    match op {
        Kind::AllReduce => (0..count)
            .flat_map(|k| (0..p).map(|j| value(j, i, k)).sum::<f32>().to_le_bytes())
            .collect(),
        _ => (0..p)
            .flat_map(|j| (0..count).flat_map(move |k| value(j, i, k).to_le_bytes()))
            .collect(),
    }
}

/// Wrong f32 elements in `recvs` (call `i` wrote `recvs[i]`).
fn count_wrong(op: Kind, p: usize, count: usize, recvs: &[Buffer]) -> Result<usize> {
    let mut wrong = 0;
    for (i, b) in recvs.iter().enumerate() {
        let want = expected(op, p, i, count);
        let got = b.to_bytes()?;
        wrong += got
            .chunks(4)
            .zip(want.chunks(4))
            .filter(|(a, b)| a != b)
            .count();
    }
    Ok(wrong)
}

/// A direct vendor call on the same stream and buffers as strata's (`--transport nccl`).
trait Direct {
    /// Enqueue `--op` from `send` into `recv` on `s` (device addresses).
    fn call(&self, send: u64, recv: u64, s: &dyn DevStream) -> Result<()>;
}

#[cfg(feature = "cuda")]
mod direct {
    //! NCCL called directly, through strata's safe vendor wrappers over the library
    //! strata itself loaded (`STRATA_NCCL_LIB` first), on a one-rank communicator of its
    //! own (`ncclGetUniqueId` + `ncclCommInitRank` on the communicator's device).
    use super::*;
    use std::ffi::c_int;
    use strata::device::Device;
    use strata::transport::vendor::{Reduction, Vendor, VendorComm, VendorLib};

    pub struct Nccl {
        comm: VendorComm<'static>,
        dev: Arc<dyn Device>,
        op: Kind,
        count: usize,
    }

    pub fn open(dev: &Arc<dyn Device>, op: Kind, count: usize) -> Result<Nccl> {
        let lib = VendorLib::get(Vendor::Nccl)?;
        let id = lib.unique_id()?;
        let _bound = dev.bind()?;
        let comm = lib.comm_init_rank(1, &id, 0)?;
        Ok(Nccl {
            comm,
            dev: dev.clone(),
            op,
            count,
        })
    }

    impl Direct for Nccl {
        fn call(&self, send: u64, recv: u64, s: &dyn DevStream) -> Result<()> {
            let _bound = self.dev.bind()?;
            match self.op {
                Kind::AllReduce => self.comm.reduce(
                    Reduction::AllReduce,
                    send,
                    recv,
                    self.count,
                    DataType::F32 as c_int,
                    ReduceOp::Sum as c_int,
                    s,
                ),
                _ => self.comm.all_gather(send, recv, self.count * 4, s),
            }
        }
    }
}

/// The direct call of `--transport nccl`; `None` elsewhere.
fn open_direct(c: &Comm, cli: &Cli, count: usize) -> Result<Option<Box<dyn Direct>>> {
    if c.transport_kind() != TransportKind::Nccl {
        return Ok(None);
    }
    #[cfg(feature = "cuda")]
    {
        let dev = c
            .device()
            .ok_or_else(|| Error::InvalidUsage("nccl without a device".into()))?;
        Ok(Some(Box::new(direct::open(&dev, cli.op, count)?)))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (cli, count);
        Err(Error::NotCompiled(
            "strata-launch's direct NCCL call needs the tools crate's cuda feature".into(),
        ))
    }
}

fn rank(c: &Comm, cli: &Cli) -> Result<Vec<Row>> {
    let (p, r) = (c.size(), c.rank());
    let count = match cli.op {
        Kind::AllReduce => (cli.bytes as usize / 4).max(1),
        _ => (cli.bytes as usize / 4 / p).max(1),
    };
    let out = if cli.op == Kind::AllReduce {
        count
    } else {
        p * count
    };
    let dev = c
        .device()
        .ok_or_else(|| Error::InvalidUsage("strata-launch needs a device transport".into()))?;
    let s = dev.new_stream()?;
    // Counted only where the device counts (the CPU device); decided once, so an error
    // is never made in a timed loop.
    let counts = cpu::entries(s.as_ref()).is_ok();
    let entries = |s: &Arc<dyn DevStream>| -> Option<u64> {
        if counts {
            cpu::entries(s.as_ref()).ok()
        } else {
            None
        }
    };
    let sends: Vec<Buffer> = (0..cli.calls)
        .map(|i| {
            let v: Vec<u8> = (0..count)
                .flat_map(|k| value(r, i, k).to_le_bytes())
                .collect();
            c.native_from(&v)
        })
        .collect::<Result<_>>()?;
    let recvs: Vec<Buffer> = (0..cli.calls)
        .map(|_| c.alloc_native(out * 4))
        .collect::<Result<_>>()?;
    let direct = open_direct(c, cli, count)?;
    // The buffers' device addresses for the direct calls (the guards are dropped at
    // once: the buffers live as long as this function).
    let addrs: Vec<(u64, u64)> = if direct.is_some() {
        let t = Duration::from_secs(60);
        sends
            .iter()
            .zip(&recvs)
            .map(|(a, b)| Ok((a.dev_read_timeout(t)?.addr(), b.dev_read_timeout(t)?.addr())))
            .collect::<Result<_>>()?
    } else {
        Vec::new()
    };
    let mut rows = Vec::new();
    for &algo in &cli.algo {
        let req = |i: usize| request(c, cli.op, &sends[i], &recvs[i], count, algo);
        // Warm-up (the first call of a shape allocates its scratch), then the floor and
        // the entries of each timed call.
        let mut floor = Vec::new();
        let mut added = Vec::new();
        for i in 0..2 * cli.iters {
            let e0 = entries(&s);
            let t = Instant::now();
            c.enqueue(req(0), &s)?;
            sync(s.as_ref())?;
            if i >= cli.iters {
                floor.push(t.elapsed().as_secs_f64());
                if let (Some(a), Some(b)) = (e0, entries(&s)) {
                    added.push(b - a);
                }
            }
        }
        c.barrier()?;
        s.delay(Duration::from_millis(cli.delay_ms))?;
        let mut ret = Vec::new();
        let mut works = Vec::new();
        let t_all = Instant::now();
        for i in 0..cli.calls {
            let t = Instant::now();
            works.push(c.enqueue(req(i), &s)?);
            ret.push(t.elapsed().as_secs_f64());
        }
        let ahead = !works[0].is_done();
        let all_returned = t_all.elapsed().as_secs_f64();
        sync(s.as_ref())?;
        for w in &works {
            w.wait()?;
        }
        let mut wrong = count_wrong(cli.op, p, count, &recvs)?;
        // The direct vendor calls: the same calls behind the same delay, into cleared
        // outputs (checked as strata's), after a warm-up of their own.
        let mut direct_ret = None;
        if let Some(d) = &direct {
            for _ in 0..cli.iters.min(50) {
                d.call(addrs[0].0, addrs[0].1, s.as_ref())?;
            }
            for b in &recvs {
                s.clear(b.dev_read_timeout(Duration::from_secs(60))?.addr(), out * 4)?;
            }
            sync(s.as_ref())?;
            s.delay(Duration::from_millis(cli.delay_ms))?;
            let mut times = Vec::new();
            for &(send, recv) in &addrs {
                let t = Instant::now();
                d.call(send, recv, s.as_ref())?;
                times.push(t.elapsed().as_secs_f64());
            }
            sync(s.as_ref())?;
            wrong += count_wrong(cli.op, p, count, &recvs)?;
            direct_ret = median(times);
        }
        let slowest = ret.iter().copied().fold(0.0, f64::max);
        rows.push(Row {
            ret: median(ret).unwrap_or(0.0),
            ahead,
            floor: median(floor).unwrap_or(0.0),
            wrong,
            all: all_returned,
            max: slowest,
            entries: median(added),
            direct: direct_ret,
        });
        c.barrier()?;
    }
    Ok(rows)
}

/// Every rank's rows: an in-process world, one thread a rank, or one nccl rank.
fn run(cli: &Cli, kind: TransportKind) -> Result<Vec<Vec<Row>>> {
    let topo = strata::Topology::parse(&cli.topology)?;
    let n = topo.world_size();
    if kind == TransportKind::Nccl {
        if n != 1 {
            return Err(Error::InvalidUsage(format!(
                "--transport nccl runs one rank (NCCL refuses two ranks on one GPU), not {n}: \
                 --topology nodes:1x1"
            )));
        }
        let boot = Comm::local_world(1, Some(topo), CommConfig::default())?.remove(0);
        let c = Comm::vendor_world(&boot, kind, CommConfig::default())?;
        let r = rank(&c, cli);
        if r.is_err() {
            c.abort();
        }
        return Ok(vec![r?]);
    }
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let kind = match cli.transport.parse::<TransportKind>() {
        Ok(k @ (TransportKind::HostLocal | TransportKind::CudaLocal | TransportKind::Nccl)) => k,
        _ => {
            eprintln!("strata-launch: --transport is host-local, cuda-local or nccl");
            return ExitCode::from(2);
        }
    };
    if !matches!(cli.op, Kind::AllGather | Kind::AllReduce) {
        eprintln!("strata-launch: --op is all-gather or all-reduce");
        return ExitCode::from(2);
    }
    let all = match run(&cli, kind) {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "strata-launch: {}",
                strata_tools::cli::describe("strata-launch", &e)
            );
            return ExitCode::FAILURE;
        }
    };
    outln!(
        "# {} {} ranks, {}-byte {}; return: median over {} calls behind a {} ms delay (slowest rank); floor: median round trip over {} calls; entries: on the caller's stream per call (cpu device); direct: the vendor's own call, same stream and buffers",
        cli.transport,
        all.len(),
        cli.bytes,
        cli.op.name(),
        cli.calls,
        cli.delay_ms,
        cli.iters
    );
    outln!(
        "{:>8} {:>12} {:>7} {:>12} {:>7} {:>10} {:>10} {:>8} {:>11} {:>6}",
        "algo",
        "return(us)",
        "ahead",
        "floor(us)",
        "#wrong",
        "all(ms)",
        "max(ms)",
        "entries",
        "direct(us)",
        "ratio"
    );
    let mut bad = false;
    for (i, algo) in cli.algo.iter().enumerate() {
        let rows: Vec<Row> = all.iter().map(|r| r[i]).collect();
        let ret = rows.iter().map(|r| r.ret).fold(0.0, f64::max);
        let ahead = rows.iter().all(|r| r.ahead);
        let floor = rows.iter().map(|r| r.floor).fold(0.0, f64::max);
        let wrong: usize = rows.iter().map(|r| r.wrong).sum();
        let every = rows.iter().map(|r| r.all).fold(0.0, f64::max);
        let slowest = rows.iter().map(|r| r.max).fold(0.0, f64::max);
        let entries = rows.iter().map(|r| r.entries).max().flatten();
        let direct = rows.iter().filter_map(|r| r.direct).reduce(f64::max);
        bad |= wrong > 0;
        let dash = || "-".to_string();
        outln!(
            "{:>8} {:>12.1} {:>7} {:>12.1} {:>7} {:>10.1} {:>10.2} {:>8} {:>11} {:>6}",
            algo.name(),
            ret * 1e6,
            if ahead { "yes" } else { "no" },
            floor * 1e6,
            wrong,
            every * 1e3,
            slowest * 1e3,
            entries.map_or_else(dash, |e| e.to_string()),
            direct.map_or_else(dash, |d| format!("{:.1}", d * 1e6)),
            direct.map_or_else(dash, |d| format!("{:.2}", ret / d)),
        );
    }
    if bad {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
