//! The transports: ranks as threads of this process (`local`, `cuda-local`), one rank per
//! process under mpirun (`mpi`), and NCCL / RCCL bootstrapped like nccl-tests; each runs
//! the sweep and feeds rank 0's reporter.

use crate::baseline::MpiBaseline;
use crate::cli::Cli;
use crate::membw;
use crate::rank::{all_gather_bytes, bench_row, ErrStats, Fence, LocalPace, MpiPace, RankRow};
use crate::report::Reporter;
use crate::sweep::{build_plan, median, RowAlgo};
use std::sync::{mpsc, Arc};
use strata::traffic::TrafficMatrix;
use strata::transport::TransportKind;
use strata::{Comm, CommConfig, Error, Result, Topology};

/// Messages from the rank threads of a local world to the main thread.
enum Msg {
    Row(usize, usize, RankRow),
    Failed(usize, Error),
}

pub(crate) fn run_local(
    cli: &Cli,
    config: CommConfig,
    topo: Option<Topology>,
    algos: &[RowAlgo],
) -> Result<u64> {
    run_threads(cli, config, topo, algos, TransportKind::Local)
}

/// Ranks as threads of this process: the `local` transport, `cuda-local` (every rank on
/// the GPU of `STRATA_DEVICE`, default 0) or `host-local` (every rank on the CPU device).
/// Ranks of an in-process world: `--ranks`, else the topology's, else 8.
pub(crate) fn thread_ranks(cli: &Cli, topo: Option<&Topology>) -> usize {
    match (cli.ranks, topo) {
        (Some(n), _) => n as usize,
        (None, Some(t)) => t.world_size(),
        (None, None) => 8,
    }
}

pub(crate) fn run_threads(
    cli: &Cli,
    config: CommConfig,
    topo: Option<Topology>,
    algos: &[RowAlgo],
    kind: TransportKind,
) -> Result<u64> {
    let gpu = kind != TransportKind::Local;
    let ranks = thread_ranks(cli, topo.as_ref());
    let topo = topo.unwrap_or_else(|| Topology::flat(ranks));
    let timeout = config.timeout;
    let comms = Comm::in_process_world(kind, ranks, Some(topo), config)?;
    let plan = Arc::new(build_plan(cli, algos, ranks)?);
    // The bound column's memory bandwidth: host memory only.
    let bw = if gpu {
        None
    } else {
        Some(membw::local(ranks, timeout)?)
    };
    let mut reporter = Reporter::new(cli, &plan, comms[0].clone(), algos, bw)?;

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
                let n = plan.rows.len();
                let turns = (0..plan.rounds).flat_map(|round| (0..n).map(move |i| round * n + i));
                for k in turns {
                    match bench_row(&comm, &plan, &plan.rows[k % n], &pace) {
                        Ok(rr) => {
                            let _ = tx.send(Msg::Row(k, r, rr));
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

    // Turns (a row in a round: round * rows + row) complete in order (every row ends
    // with fences); keep them keyed anyway. A row is reported after its last round.
    let n = plan.rows.len();
    let mut pending: Vec<Vec<RankRow>> = vec![Vec::new(); n * plan.rounds];
    let mut rank0_traffic: Vec<Option<TrafficMatrix>> = vec![None; n * plan.rounds];
    let mut rounds = Rounds::new(n);
    let mut next = 0;
    let mut failure: Option<(usize, Error)> = None;
    for msg in rx {
        match msg {
            Msg::Row(k, r, rr) => {
                if r == 0 {
                    rank0_traffic[k] = rr.traffic.clone();
                }
                pending[k].push(rr);
                while next < pending.len() && pending[next].len() == ranks {
                    let rows = std::mem::take(&mut pending[next]);
                    let time = rows.iter().map(|x| x.time_us).fold(0.0, f64::max);
                    let wrong = rows.iter().map(|x| x.wrong).sum();
                    let err = rows.iter().filter_map(|x| x.err).reduce(ErrStats::merge);
                    let i = next % n;
                    let time = rounds.add(i, time, wrong);
                    if next / n + 1 == plan.rounds {
                        reporter.row(i, time, rounds.wrong[i], err, rank0_traffic[next].take());
                    }
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

/// Each row's rounds so far (`--rounds`): the slowest rank's time of each, and the most
/// wrong elements any round saw.
struct Rounds {
    times: Vec<Vec<f64>>,
    wrong: Vec<u64>,
}

impl Rounds {
    fn new(rows: usize) -> Rounds {
        Rounds {
            times: vec![Vec::new(); rows],
            wrong: vec![0; rows],
        }
    }

    /// Add a round of row `i`; the median of its rounds so far.
    fn add(&mut self, i: usize, time: f64, wrong: u64) -> f64 {
        self.times[i].push(time);
        self.wrong[i] = self.wrong[i].max(wrong);
        median(&self.times[i])
    }
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

pub(crate) fn run_mpi(
    cli: &Cli,
    config: CommConfig,
    topo: Option<Topology>,
    algos: &[RowAlgo],
) -> Result<u64> {
    let comm = Comm::mpi_world(topo, config)?;
    if comm.size() == 1 && !under_mpi() && cli.ranks.is_none() {
        crate::text::out(&format!(
            "# warning: --transport mpi without mpirun runs a world of 1 process; for N: {}",
            mpirun_line("N")
        ));
    }
    let r = run_mpi_on(cli, &comm, algos);
    if r.is_err() {
        // Peers blocked in a collective with this rank must not wait out their timeout.
        comm.abort();
    }
    r
}

fn run_mpi_on(cli: &Cli, comm: &Comm, algos: &[RowAlgo]) -> Result<u64> {
    let (p, me) = (comm.size(), comm.rank());
    if let Some(n) = cli.ranks {
        if n as usize != p {
            let hint = if p == 1 && !under_mpi() {
                format!(
                    "started without mpirun? run {}",
                    mpirun_line(&n.to_string())
                )
            } else {
                "omit --ranks with mpi: mpirun's -np sets them".to_string()
            };
            return Err(Error::InvalidUsage(format!(
                "--ranks {n} but the MPI job has {p} processes ({hint})"
            )));
        }
    }
    let plan = build_plan(cli, algos, p)?;
    let n = comm.topology().world_size();
    // The bound column's memory bandwidth: the mpi transport's processes share host
    // memory; a vendor transport's buffers are device memory (no figure).
    let bw = if comm.transport_kind() == TransportKind::Mpi {
        Some(membw::mpi(comm)?)
    } else {
        None
    };
    // MPI's own collectives (`--algo mpi`): the same on every rank, collective to create.
    let baseline = if algos.contains(&RowAlgo::Mpi) {
        Some(MpiBaseline::new(comm)?)
    } else {
        None
    };
    // Rank 0 reports; its setup errors (a bad --json path) must reach the others too.
    let reporter = if me == 0 {
        Some(Reporter::new(cli, &plan, comm.clone(), algos, bw))
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
    let mut rounds = Rounds::new(plan.rows.len());
    let turns =
        (0..plan.rounds).flat_map(|round| plan.rows.iter().enumerate().map(move |r| (round, r)));
    for (round, (i, row)) in turns {
        let rr = match (&baseline, row.algo) {
            (Some(b), RowAlgo::Mpi) => b.bench_row(&plan, row),
            _ => bench_row(comm, &plan, row, &MpiPace),
        }
        .map_err(|e| with_rank(e, me))?;
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
            let time = rounds.add(i, time, wrong);
            if round + 1 == plan.rounds {
                rep.row(i, time, rounds.wrong[i], err, traffic);
            }
        }
    }
    match reporter {
        Some(rep) => rep.finish(),
        None => Ok(0),
    }
}

/// `mpirun -np N <this program> <its arguments less --ranks>`: the line that starts the
/// MPI world this run asked for.
fn mpirun_line(n: &str) -> String {
    let mut args = std::env::args();
    let prog = args.next().unwrap_or_else(|| "strata-perf".into());
    let mut rest = Vec::new();
    while let Some(a) = args.next() {
        if a == "--ranks" {
            args.next();
        } else if !a.starts_with("--ranks=") {
            rest.push(a);
        }
    }
    format!("mpirun -np {n} {prog} {}", rest.join(" "))
}

/// True when launched by an MPI launcher (mpirun, srun with PMI). Read once, at the
/// first call, which `main` makes before MPI starts: Open MPI's singleton start sets
/// `OMPI_COMM_WORLD_SIZE` in this process too.
pub(crate) fn under_mpi() -> bool {
    static UNDER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *UNDER.get_or_init(|| {
        [
            "OMPI_COMM_WORLD_SIZE",
            "PMI_SIZE",
            "PMIX_RANK",
            "MPI_LOCALNRANKS",
        ]
        .iter()
        .any(|k| std::env::var_os(k).is_some())
    })
}

/// `--transport nccl|rccl`: bootstrapped like nccl-tests. Under mpirun the MPI world
/// carries rank 0's unique id to every rank (`Comm::vendor_world`); launched alone, a
/// one-rank world does, giving a one-rank vendor communicator.
pub(crate) fn run_vendor(
    cli: &Cli,
    config: CommConfig,
    topo: Option<Topology>,
    algos: &[RowAlgo],
) -> Result<u64> {
    let boot = vendor_boot(cli, &config, topo)?;
    let comm = Comm::vendor_world(&boot, cli.transport, config)?;
    let r = run_mpi_on(cli, &comm, algos);
    if r.is_err() {
        comm.abort();
        boot.abort();
    }
    r
}

/// The host world that carries a vendor unique id: the MPI world under mpirun, else a
/// one-rank local world. Its links are never probed (the vendor world's are).
pub(crate) fn vendor_boot(cli: &Cli, config: &CommConfig, topo: Option<Topology>) -> Result<Comm> {
    let config = CommConfig {
        links: strata::config::LinkSource::Preset,
        ..config.clone()
    };
    if under_mpi() {
        return Comm::mpi_world(topo, config);
    }
    let topo = topo.unwrap_or_else(|| Topology::flat(1));
    if topo.world_size() != 1 {
        return Err(Error::InvalidUsage(format!(
            "--transport {} runs one rank per process: launch {} processes with mpirun",
            cli.transport.name(),
            topo.world_size()
        )));
    }
    Ok(Comm::local_world(1, Some(topo), config)?.remove(0))
}
