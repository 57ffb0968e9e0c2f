//! strata-train: train the example decoder-only LM with any sharding strategy, on the
//! local transport (one thread per rank) or under mpirun (`--transport mpi`).
//!
//! Prints loss, step time, memory and traffic per phase; `--json FILE` writes one JSON
//! record per step (`step`, `loss`, `step_time_us`, `memory`, `traffic`).

#![forbid(unsafe_code)]

use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{IsTerminal, Write};
use strata::Topology;
use strata_engine::account::Phase;
use strata_engine::planner::memory::gib;
use strata_engine::planner::parse_bytes;
use strata_engine::train::{train_local, train_mpi, TrainOptions};
use strata_engine::{Precision, StepReport};

#[derive(Parser, Debug)]
#[command(
    name = "strata-train",
    about = "Train the example LM with a sharding strategy on strata"
)]
struct Args {
    /// Strategy: dp, zero1, zero2, zero3, mics:K, zeropp, paro-igg, paro-iig, paro-nig,
    /// frontier-topo, amsp:p=AxB,g=CxD,os=ExF, auto; options after commas
    /// (e.g. `zero3,algo=hier,accum=4`).
    #[arg(long, default_value = "zero3")]
    strategy: String,
    /// local (threads) or mpi (one process per rank, under mpirun).
    #[arg(long, default_value = "local")]
    transport: String,
    /// Ranks (local transport); default: the topology's size, else 8.
    #[arg(long)]
    ranks: Option<usize>,
    /// Topology SPEC (nodes:2x4, frontier:2, dgx-a100:2, ...); default: nodes:1xRANKS.
    #[arg(long)]
    topology: Option<String>,
    #[arg(long, default_value_t = 100)]
    steps: u64,
    /// Micro-batches per step (overrides the strategy's accum option).
    #[arg(long)]
    accum: Option<usize>,
    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 2)]
    batch: usize,
    /// Tokens per sequence (K suffix: powers of 1024, 4K = 4096).
    #[arg(long, value_parser = count)]
    seq: Option<usize>,
    #[arg(long)]
    d_model: Option<usize>,
    #[arg(long)]
    layers: Option<usize>,
    #[arg(long)]
    heads: Option<usize>,
    /// Precision of parameters and gradients in the shards and on the wire: f32 or bf16.
    #[arg(long, default_value = "f32")]
    precision: String,
    #[arg(long)]
    lr: Option<f32>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Memory per rank for `--strategy auto` (e.g. 80G, 80GiB, 1.5T; K/M/G/T are
    /// powers of 1024).
    #[arg(long, default_value = "80G")]
    gpu_mem: String,
    /// Write one JSON record per step to FILE (JSON lines).
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Print a line every K steps (and the last).
    #[arg(long, default_value_t = 10)]
    log_every: u64,
    /// No progress bar (the bar is drawn on stderr, only when stdout and stderr are a
    /// terminal; the lines on stdout are the same with or without it).
    #[arg(long)]
    quiet: bool,
    /// Directory of sharded checkpoints: every rank writes its own shard there every
    /// `--checkpoint-every` steps (`step-<N>/rank-<R>.shard`, then `COMPLETE`).
    #[arg(long, value_name = "DIR")]
    checkpoint: Option<std::path::PathBuf>,
    /// Steps between checkpoints (with --checkpoint; 0: none written).
    #[arg(long, default_value_t = 10)]
    checkpoint_every: u64,
    /// Start from the latest complete checkpoint in --checkpoint DIR (any world size and
    /// strategy: the shards are cut anew), training on to --steps.
    #[arg(long)]
    resume: bool,
    /// Go on when ranks are lost: census, shrink, restore the lost shards from the
    /// replicas the strategy keeps, else from the latest complete checkpoint
    /// (--checkpoint), train on. On mpi, run under a launcher that keeps the survivors
    /// (mpirun --mca orte_enable_recovery 1).
    #[arg(long)]
    survive: bool,
    /// Lose ranks, to see --survive work: world ranks R (a comma list) stop taking part
    /// before step S (R@S, e.g. 5@12 or 4,5@12); on mpi their processes exit (status 75).
    #[arg(long, value_name = "R@S", value_parser = ranks_at_step)]
    lose: Option<(Vec<usize>, u64)>,
}

/// Open MPI's launcher keeps the survivors when a process dies (it passes the MCA
/// setting to its processes' environment; MPICH's does not say).
fn recovery_enabled() -> bool {
    std::env::var("OMPI_COMM_WORLD_RANK").is_err()
        || std::env::var("OMPI_MCA_orte_enable_recovery")
            .is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes"))
}

fn ranks_at_step(s: &str) -> Result<(Vec<usize>, u64), String> {
    let (r, t) = s
        .split_once('@')
        .ok_or_else(|| format!("'{s}': RANKS@STEP, e.g. 5@12 or 4,5@12"))?;
    let r = r
        .split(',')
        .map(|x| x.trim().parse().map_err(|_| format!("'{x}' is not a rank")))
        .collect::<Result<Vec<usize>, String>>()?;
    let t: u64 = t
        .trim()
        .parse()
        .map_err(|_| format!("'{t}' is not a step"))?;
    if t == 0 {
        return Err("steps count from 1".into());
    }
    Ok((r, t))
}

/// A positive count with an optional K/M/G/T suffix (strata's one size parser).
fn count(s: &str) -> Result<usize, String> {
    let v = strata::units::parse_size(s)?;
    usize::try_from(v).map_err(|_| format!("'{s}' is too large"))
}

fn line(r: &StepReport) -> String {
    let t = &r.traffic;
    let phases: Vec<String> = Phase::ALL
        .iter()
        .map(|p| {
            let x = t.get(*p);
            format!(
                "{} {}/{}",
                p.name(),
                gib(x.intra_node + x.intra_package),
                gib(x.inter_node)
            )
        })
        .collect();
    format!(
        "step {:>4}  loss {:.5}  {:>8.2} ms  states {}  buffers peak {}  traffic intra/inter: {}",
        r.step,
        r.loss,
        r.step_time_us as f64 / 1e3,
        gib(r.memory.model_states),
        gib(r.memory.buffers_peak),
        phases.join(", ")
    )
}

/// Where the lines go: stdout, one line per event as it happens, the same to a terminal,
/// a file or a pipe. The progress bar (on stderr) only when stdout and stderr are both a
/// terminal (not under `| tee`, where the bar would mix with tee's copy of the lines) and
/// not `--quiet`; a line is printed with the bar cleared, then the bar redrawn.
struct Lines {
    bar: Option<ProgressBar>,
}

impl Lines {
    fn new(show_bar: bool, steps: u64) -> Lines {
        let tty = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
        let bar = (show_bar && tty).then(|| {
            let b = ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b
        });
        Lines { bar }
    }

    /// One line to stdout, now (Rust's stdout is line-buffered). A closed stdout
    /// (`| head`) does not stop the training.
    fn say(&self, line: &str) {
        let print = || {
            let _ = writeln!(std::io::stdout().lock(), "{line}");
        };
        match &self.bar {
            Some(b) => b.suspend(print),
            None => print(),
        }
    }

    /// Step `step` done: the bar moves there (no line; after a recovery the survivors
    /// repeat the steps since the state they went on from).
    fn step(&self, step: u64, msg: &str) {
        if let Some(b) = &self.bar {
            b.set_message(msg.to_string());
            b.set_position(step);
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

fn run(a: Args) -> Result<(), String> {
    let mpi = match a.transport.as_str() {
        "local" => false,
        "mpi" => true,
        t => return Err(format!("--transport {t}: local or mpi")),
    };
    let topo = match (&a.topology, a.ranks) {
        (Some(t), _) => Topology::parse(t).map_err(|e| e.to_string())?,
        (None, Some(n)) => Topology::parse(&format!("nodes:1x{n}")).map_err(|e| e.to_string())?,
        (None, None) => Topology::parse("nodes:1x8").map_err(|e| e.to_string())?,
    };
    if let Some(n) = a.ranks {
        if n != topo.world_size() && !mpi {
            return Err(format!(
                "--ranks {n} does not match topology {} ({} ranks)",
                topo.name,
                topo.world_size()
            ));
        }
    }
    let mut o = TrainOptions::new(&a.strategy, topo, a.steps);
    o.checkpoint = a.checkpoint.clone();
    o.checkpoint_every = a.checkpoint_every;
    o.resume = a.resume;
    o.survive = a.survive;
    o.lose = a.lose.clone();
    if a.survive && mpi && !recovery_enabled() {
        // Printed before MPI starts, by every rank: the launcher decides.
        eprintln!(
            "strata-train: note: --survive on mpi needs a launcher that keeps the survivors \
             running when a process dies (Open MPI: mpirun --mca orte_enable_recovery 1; \
             MPICH: mpiexec -disable-auto-cleanup); without it a lost process ends the job"
        );
    }
    o.accum = a.accum;
    o.batch = a.batch;
    if let Some(s) = a.seq {
        o.model.seq = s;
    }
    if let Some(d) = a.d_model {
        o.model.d_model = d;
        o.model.d_ff = 2 * d;
    }
    if let Some(l) = a.layers {
        o.model.n_layers = l;
    }
    if let Some(h) = a.heads {
        o.model.n_heads = h;
    }
    o.precision = Precision::parse(&a.precision).map_err(|e| e.to_string())?;
    if let Some(lr) = a.lr {
        o.optimizer.lr = lr;
    }
    o.seed = a.seed;
    o.gpu_mem = parse_bytes(&a.gpu_mem).map_err(|e| format!("--gpu-mem: {e}"))?;
    let strategy = o.resolve().map_err(|e| e.to_string())?;
    // Before MPI starts, the launcher's environment says which process is rank 0.
    let root = !mpi
        || ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"]
            .iter()
            .find_map(|v| std::env::var(v).ok())
            .is_none_or(|r| r == "0");
    let mut out = match (&a.json, root) {
        (Some(p), true) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?,
        )),
        _ => None,
    };
    let lines = Lines::new(root && !a.quiet, a.steps);
    if root {
        lines.say(&format!(
            "# strata-train: strategy {} (p={} g={} os={}{}{}{}, sync {}, accum {}), {} ranks on {}, model {} params, {:?}",
            strategy.name,
            strategy.p,
            strategy.g,
            strategy.os,
            strategy.hpz.map(|h| format!(" hpz={h}")).unwrap_or_default(),
            strategy.qwz_bits.map(|b| format!(" qwz=int{b}")).unwrap_or_default(),
            strategy.qgz_bits.map(|b| format!(" qgz=int{b}")).unwrap_or_default(),
            strategy.sync.name(),
            strategy.accum,
            o.topology.world_size(),
            o.topology.name,
            o.model.params(),
            o.precision
        ));
    }
    let mut werr: Option<String> = None;
    let every = a.log_every.max(1);
    let steps = a.steps;
    // Steps are reported by the world's rank 0: this process, or, after a recovery that
    // set world rank 0 aside (--survive), the survivors' rank 0, which then takes over
    // the JSON file (appending) and the lines.
    let mut reported = false;
    let mut cb = |r: &StepReport| {
        if !root && !reported {
            if let Some(p) = &a.json {
                match std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(p)
                {
                    Ok(f) => out = Some(std::io::BufWriter::new(f)),
                    Err(e) => {
                        werr.get_or_insert(format!("{}: {e}", p.display()));
                    }
                }
            }
        }
        reported = true;
        // A recovery (--survive): say what happened and how long it took.
        if let Some(rc) = &r.recovery {
            let l = rc.after_step;
            let aside = if rc.set_aside.is_empty() {
                String::new()
            } else {
                format!(
                    ", world ranks {:?} set aside (the strategy needs whole nodes)",
                    rc.set_aside
                )
            };
            let msg = format!(
                "# recovered: world ranks {:?} lost after step {l}; {} ranks ({}) went on from step {}'s state ({}){aside}; step {} completed {:.2} s after step {l}",
                rc.lost,
                rc.world,
                rc.layout,
                rc.from_step,
                rc.source,
                r.step,
                rc.seconds
            );
            lines.say(&msg);
        }
        if let Some(w) = out.as_mut() {
            let s = serde_json::to_string(r).unwrap_or_default();
            // Flushed every step: a process set aside after a loss (--survive) ends
            // without returning here, and the survivors' rank 0 appends after it.
            if let Err(e) = writeln!(w, "{s}").and_then(|_| w.flush()) {
                werr.get_or_insert(e.to_string());
            }
        }
        lines.step(r.step, &format!("loss {:.4}", r.loss));
        if r.step % every == 0 || r.step == steps || r.step == 1 {
            lines.say(&line(r));
        }
    };
    let res = if mpi {
        train_mpi(&o, &mut cb)
    } else {
        train_local(&o, &mut cb)
    };
    lines.finish();
    let reports = res.map_err(|e| e.to_string())?;
    if let Some(e) = werr {
        return Err(format!("writing JSON: {e}"));
    }
    if let Some(mut w) = out {
        w.flush().map_err(|e| e.to_string())?;
    }
    if root || reported {
        if let (Some(f), Some(l)) = (reports.first(), reports.last()) {
            let mean_us: f64 =
                reports.iter().map(|r| r.step_time_us as f64).sum::<f64>() / reports.len() as f64;
            lines.say(&format!(
                "# loss {:.5} -> {:.5} over {} steps, mean step {:.2} ms, model states {} per rank",
                f.loss,
                l.loss,
                reports.len(),
                mean_us / 1e3,
                gib(l.memory.model_states)
            ));
        }
    }
    #[cfg(feature = "mpi")]
    if mpi {
        strata::transport::mpi::finalize();
    }
    Ok(())
}

fn main() {
    let a = Args::parse();
    if let Err(e) = run(a) {
        eprintln!("strata-train: {e}");
        // After a peer failure this aborts the MPI job rather than waiting for the peer
        // (a no-op without MPI).
        strata::transport::mpi::finalize();
        std::process::exit(1);
    }
}
