//! Training drivers: the example language model on the corpus, with any strategy, on
//! the local transport (one thread per rank) or one MPI process per rank.
//!
//! Micro-batch `i` of step `s` on world rank `r` reads corpus window
//! `(s·world + r)·M + i`, so every strategy (and the `dp` baseline) sees the same
//! global batch at every step, and loss curves can be compared point by point.

use crate::account::Meters;
use crate::checkpoint;
use crate::config::{Mesh, Strategy};
use crate::data::Corpus;
use crate::error::{Error, Result};
use crate::model::{LmConfig, TinyLm};
use crate::optim::AdamW;
use crate::runtime::{Engine, EngineConfig, Precision, Recovery, StepReport};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use strata::{Buffer, Comm, CommConfig, DataType, Topology};

/// What to train and how.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainOptions {
    /// Strategy spec (`zero3`, `mics:4`, `amsp:p=..`, `auto`, ...).
    pub strategy: String,
    /// The cluster layout (its world size is the rank count).
    pub topology: Topology,
    pub steps: u64,
    /// Micro-batches per step; `None`: the strategy's `accum` option (default 1).
    pub accum: Option<usize>,
    pub model: LmConfig,
    /// Sequences per micro-batch.
    pub batch: usize,
    pub precision: Precision,
    pub optimizer: AdamW,
    pub seed: u64,
    /// Memory per rank the planner may use for `auto`.
    pub gpu_mem: u64,
    /// Directory of sharded checkpoints ([`crate::checkpoint`]), written every
    /// `checkpoint_every` steps (0: never).
    #[serde(default)]
    pub checkpoint: Option<PathBuf>,
    #[serde(default)]
    pub checkpoint_every: u64,
    /// Start from the latest complete checkpoint in `checkpoint` (none there: from the
    /// initialization), on whatever world and strategy these options give.
    #[serde(default)]
    pub resume: bool,
    /// Go on when ranks are lost (`local`, and `mpi` under a launcher that keeps the
    /// survivors running: `mpirun --mca orte_enable_recovery 1`), where the survivors
    /// are a majority of the world (half of it with rank 0: a cut link leaves each side
    /// a census of itself, and only one side goes on): the survivors take a census
    /// (`Comm::survivors`), shrink the world without the lost ranks (`Comm::shrink`),
    /// restore the state on the survivors laid out as [`survivors_layout`] says (the
    /// nodes left where whole nodes were lost, else one node; the strategy resolved
    /// anew for it; where it cannot fit one node, the intact nodes, the partial nodes'
    /// survivors set aside after the restore) and train on: from the replicas of the lost
    /// shards where the strategy keeps them (then every rank keeps a snapshot of its
    /// shard as of the last step all completed: `dp`, MiCS, AMSP points with replicated
    /// optimizer states), else from the latest complete checkpoint.
    #[serde(default)]
    pub survive: bool,
    /// Lost ranks, for tests and demonstrations: the world ranks `.0` stop taking part
    /// before step `.1` (on `local` their threads return, as dead or frozen processes
    /// would stop; on `mpi` their processes exit at once with status [`LOST_EXIT`],
    /// without finalizing, as a crash would).
    #[serde(default)]
    pub lose: Option<(Vec<usize>, u64)>,
}

impl TrainOptions {
    /// Defaults: the default tiny LM, 2 sequences per micro-batch, f32, AdamW defaults.
    pub fn new(strategy: &str, topology: Topology, steps: u64) -> TrainOptions {
        TrainOptions {
            strategy: strategy.to_string(),
            topology,
            steps,
            accum: None,
            model: LmConfig::default(),
            batch: 2,
            precision: Precision::F32,
            optimizer: AdamW::default(),
            seed: 1,
            gpu_mem: 80 << 30,
            checkpoint: None,
            checkpoint_every: 0,
            resume: false,
            survive: false,
            lose: None,
        }
    }

    /// Expand the strategy for the topology (`auto`: the planner's top feasible choice
    /// for this model and cluster).
    pub fn resolve(&self) -> Result<Strategy> {
        let mesh = Mesh::of(&self.topology);
        let mut s = if self.strategy.trim() == "auto" {
            plan_auto(self)?
        } else {
            Strategy::parse(&self.strategy, mesh)?
        };
        if let Some(a) = self.accum {
            if a == 0 {
                return Err(Error::Config("accum must be >= 1".into()));
            }
            s.accum = a;
        }
        Ok(s)
    }
}

/// The exit status of an MPI process lost on purpose ([`TrainOptions::lose`]).
pub const LOST_EXIT: i32 = 75;

/// Train on `world` (this rank's communicator of the whole world); `on_step` sees every
/// step's report as it completes, on the world's rank 0 (after a recovery, the
/// survivors' rank 0: world rank 0 unless it was set aside). Collective: every rank
/// calls it with the same options.
/// With `survive`, a failure that lost ranks is survived (see [`TrainOptions::survive`]):
/// the steps after the restored checkpoint run again and their reports replace the
/// first ones.
pub fn run_rank(
    world: Comm,
    opts: &TrainOptions,
    meters: Meters,
    on_step: &mut dyn FnMut(&StepReport),
) -> Result<Vec<StepReport>> {
    let model = Arc::new(TinyLm::new(opts.model.clone())?);
    let corpus = Corpus::builtin();
    let latest = |dir: &PathBuf| -> Result<Option<checkpoint::State>> {
        checkpoint::latest(dir)?
            .map(|step| checkpoint::read_state(dir, step))
            .transpose()
    };
    let mut state = match (&opts.checkpoint, opts.resume) {
        (None, true) => {
            return Err(Error::Config(
                "resuming needs a checkpoint directory (--checkpoint DIR)".into(),
            ))
        }
        (Some(dir), true) => latest(dir)?,
        _ => None,
    };
    let me = world.members()[world.rank()];
    let (mut world, mut plan) = (world, opts.clone());
    let mut mesh = Mesh::of(&plan.topology);
    let mut out: Vec<StepReport> = Vec::with_capacity(opts.steps as usize);
    let mut recovery: Option<Recovery> = None;
    // The last step this rank completed, and when.
    let mut last_done: Option<(u64, std::time::Instant)> = None;
    loop {
        let strategy = plan.resolve()?;
        let m = strategy.accum;
        // Snapshots restore lost shards only where another rank holds a replica of them.
        let replicas = strategy.os.size() < mesh.world();
        let cfg = EngineConfig {
            strategy,
            precision: opts.precision,
            optimizer: opts.optimizer,
            seed: opts.seed,
        };
        let mut eng = Engine::on_mesh(
            world.clone(),
            mesh,
            model.clone(),
            cfg,
            meters.clone(),
            state.as_ref(),
        )?;
        if plan.survive && replicas {
            eng.keep_snapshots()?;
        }
        out.retain(|r| r.step <= eng.steps_taken());
        let (rank, n) = (world.rank() as u64, world.size() as u64);
        let mut ran = || -> Result<bool> {
            for s in eng.steps_taken()..opts.steps {
                if opts
                    .lose
                    .as_ref()
                    .is_some_and(|(who, at)| *at == s + 1 && who.contains(&me))
                {
                    return Ok(false);
                }
                let seq = opts.model.seq;
                let b = opts.batch;
                let mut r = eng.step(m, &|i| {
                    corpus.batch(seq, b, (s * n + rank) * m as u64 + i as u64)
                })?;
                r.recovery = recovery.take().map(|mut rc| {
                    rc.seconds = last_done.map_or(0.0, |(_, t)| t.elapsed().as_secs_f64());
                    rc
                });
                last_done = Some((r.step, std::time::Instant::now()));
                // The world's rank 0 reports; after a recovery that set aside world
                // rank 0's node, the survivors' rank 0 takes over.
                if world.rank() == 0 {
                    on_step(&r);
                }
                out.push(r);
                if let Some(dir) = &opts.checkpoint {
                    let k = opts.checkpoint_every;
                    if k > 0 && eng.steps_taken() % k == 0 {
                        // Every rank's shard, then the mark: a checkpoint a rank died in
                        // the middle of is never taken for complete.
                        checkpoint::write_shard(dir, world.rank(), &eng.shard()?)?;
                        world.barrier()?;
                        if world.rank() == 0 {
                            checkpoint::mark_complete(dir, eng.steps_taken(), world.size())?;
                        }
                    }
                }
            }
            Ok(true)
        };
        let e = match ran() {
            Ok(true) => return Ok(out),
            // This rank is the one lost: it stops here. An MPI process ends as a crashed
            // one would: at once, without finalizing.
            Ok(false) => {
                if world.transport_kind() == strata::transport::TransportKind::Mpi {
                    eprintln!("strata-train: world rank {me} is lost here (--lose): exiting");
                    std::process::exit(LOST_EXIT);
                }
                return Ok(out);
            }
            Err(e) if plan.survive => e,
            Err(e) => return Err(e),
        };
        // Every peer waiting on any of this engine's communicators fails now, so the
        // survivors come to the census together.
        eng.abort();
        let snapshot = eng.take_snapshots();
        drop(eng);
        let alive = world.survivors()?;
        let lost: Vec<usize> = (0..world.size())
            .filter(|r| alive.binary_search(r).is_err())
            .collect();
        if lost.is_empty() {
            return Err(e);
        }
        let old_members = world.members().to_vec();
        let lost_world: Vec<usize> = lost.iter().map(|&r| old_members[r]).collect();
        // A cut link splits the world, and each side's census finds only itself: only
        // a majority goes on (half with the old rank 0), never two worlds at once.
        let n = world.size();
        if alive.len() * 2 < n || (alive.len() * 2 == n && alive[0] != 0) {
            let ours: Vec<usize> = alive.iter().map(|&r| world.members()[r]).collect();
            return Err(Error::Comm(strata::Error::Remote(format!(
                "after a failure ({e}) the census found world ranks {ours:?}, {} of {n}: not a \
                 majority (the others, world ranks {lost_world:?}, may go on without them), so \
                 these stop",
                alive.len()
            ))));
        }
        let old_rank = world.rank();
        world = world.shrink(&lost)?;
        let (restored, source) = match from_replicas(&world, snapshot)? {
            Some(st) => (Some(st), "replicas"),
            None => match &opts.checkpoint {
                Some(dir) => (latest(dir)?, "checkpoint"),
                None => (None, "checkpoint"),
            },
        };
        state = restored;
        let Some(from) = state.as_ref().map(|s| s.step) else {
            return Err(Error::Config(format!(
                "world ranks {lost_world:?} were lost ({e}); the strategy keeps no replica of \
                 their shards and there is no complete checkpoint to go on from \
                 (--checkpoint DIR --checkpoint-every K)"
            )));
        };
        let (topo, aside) = survivors_layout(&plan, &lost)?;
        let aside_world: Vec<usize> = aside.iter().map(|&r| old_members[r]).collect();
        if !aside.is_empty() {
            // The survivors on partial nodes took part in the restore (their snapshots
            // may hold replicas); now they leave, and the others shrink them away.
            if aside.binary_search(&old_rank).is_ok() {
                eprintln!(
                    "strata-train: world rank {me} is set aside: its node lost ranks \
                     {lost_world:?} and the strategy needs whole nodes"
                );
                if world.transport_kind() == strata::transport::TransportKind::Mpi {
                    // Finalizing would wait for (then abort) the peers training on.
                    std::process::exit(0);
                }
                return Ok(out);
            }
            let renumbered: Vec<usize> = aside
                .iter()
                .map(|&r| r - lost.iter().filter(|&&l| l < r).count())
                .collect();
            world = world.shrink(&renumbered)?;
        }
        plan.topology = topo;
        mesh = Mesh::of(&plan.topology);
        recovery = Some(Recovery {
            lost: lost_world.clone(),
            world: world.size(),
            from_step: from,
            source: source.into(),
            layout: format!("nodes:{}x{}", mesh.nodes, mesh.ranks_per_node),
            set_aside: aside_world,
            after_step: last_done.map_or(0, |(s, _)| s),
            seconds: 0.0,
        });
        tracing::warn!(
            rank = me,
            "world ranks {lost_world:?} lost ({e}); going on with {} ranks from step {from}",
            world.size()
        );
    }
}

/// The layout the survivors of `opts.topology` train on after losing its ranks `lost`
/// (sorted), and the survivors set aside for it (sorted; ranks of `opts.topology`):
/// [`survivors_topology`] with every survivor where the strategy (`opts.strategy`,
/// resolved anew) fits it; else, where the loss left nodes partial, the whole nodes
/// left with the partial nodes' survivors set aside (MiCS's partition groups of 2 cannot
/// tile one node of 7, but go on on the intact nodes), when the strategy fits
/// that (world rank 0 among them: the new world's rank 0 then reports the steps).
pub fn survivors_layout(opts: &TrainOptions, lost: &[usize]) -> Result<(Topology, Vec<usize>)> {
    let topo = &opts.topology;
    let all = survivors_topology(topo, lost)?;
    let fits = |t: &Topology| {
        let mut o = opts.clone();
        o.topology = t.clone();
        o.resolve().is_ok()
    };
    if fits(&all) {
        return Ok((all, Vec::new()));
    }
    let rpn = topo.ranks_per_node().max(1);
    let partial = |n: usize| {
        let l = lost.iter().filter(|&&r| r / rpn == n).count();
        l > 0 && l < rpn
    };
    let aside: Vec<usize> = (0..topo.world_size())
        .filter(|&r| partial(r / rpn) && lost.binary_search(&r).is_err())
        .collect();
    let mut gone: Vec<usize> = lost.iter().chain(&aside).copied().collect();
    gone.sort_unstable();
    if aside.is_empty() || gone.len() == topo.world_size() {
        return Ok((all, Vec::new()));
    }
    let whole = survivors_topology(topo, &gone)?;
    Ok(if fits(&whole) {
        (whole, aside)
    } else {
        (all, Vec::new())
    })
}

/// The layout the survivors of `topo` train on after losing its ranks `lost` (ranks of
/// `topo`, sorted): where the loss took whole nodes, the nodes left, in order, each
/// as it was (packages, dies, links and leaf switches kept, so the strategy's node-wise
/// groups, MiCS's and hpZ's, stay inside nodes); else one node of the survivors (an
/// uneven node cannot be a row of the engine's regular mesh).
pub fn survivors_topology(topo: &Topology, lost: &[usize]) -> Result<Topology> {
    let rpn = topo.ranks_per_node().max(1);
    let mut lost_of = vec![0usize; topo.nodes];
    for &r in lost {
        if let Some(c) = lost_of.get_mut(r / rpn) {
            *c += 1;
        }
    }
    let gone: Vec<usize> = (0..topo.nodes).filter(|&n| lost_of[n] == rpn).collect();
    let left = topo.world_size().saturating_sub(lost.len());
    if lost_of.iter().any(|&c| c != 0 && c != rpn) || gone.len() == topo.nodes {
        return Ok(Topology::parse(&format!("nodes:1x{left}"))?);
    }
    let mut t = topo.clone();
    t.nodes -= gone.len();
    t.switch_of_node = topo.switch_of_node.as_ref().map(|s| {
        (0..topo.nodes)
            .filter(|n| gone.binary_search(n).is_err())
            .filter_map(|n| s.get(n).copied())
            .collect()
    });
    t.name = if topo.name == format!("nodes:{}x{rpn}", topo.nodes) {
        format!("nodes:{}x{rpn}", t.nodes)
    } else {
        format!("{} without nodes {gone:?}", topo.name)
    };
    t.validate()?;
    Ok(t)
}

/// The survivors' snapshots (each rank's shards as of the last two steps it completed),
/// exchanged over `world` (the survivors' communicator) and assembled for the newest
/// step whose snapshots cover every unit: `Some` where there is one (the strategy keeps
/// replicas of the lost ranks' shards), `None` where not (the same answer on every
/// survivor: they all decide on the same gathered bytes).
fn from_replicas(
    world: &Comm,
    snapshots: Vec<checkpoint::Shard>,
) -> Result<Option<checkpoint::State>> {
    // This rank's bytes: per snapshot, its length (u64 LE) and its encoding.
    let mut mine = Vec::new();
    for s in &snapshots {
        let e = checkpoint::encode(s);
        mine.extend_from_slice(&(e.len() as u64).to_le_bytes());
        mine.extend_from_slice(&e);
    }
    let p = world.size();
    let len = Buffer::from_slice(&[mine.len() as u64]);
    let lens = Buffer::zeroed(8 * p);
    world.all_gather(&len, &lens, 1, DataType::U64)?.wait()?;
    let lens = lens.to_vec::<u64>()?;
    let most = lens.iter().copied().max().unwrap_or(0) as usize;
    if most == 0 {
        return Ok(None);
    }
    let mut padded = mine;
    padded.resize(most, 0);
    let all = Buffer::zeroed(most * p);
    world
        .all_gather(&Buffer::from_slice(&padded), &all, most, DataType::U8)?
        .wait()?;
    let all = all.to_vec::<u8>()?;
    let mut shards = Vec::new();
    for (r, &n) in lens.iter().enumerate() {
        let mut b = &all[r * most..r * most + n as usize];
        let mut k = 0;
        while b.len() >= 8 {
            let l = u64::from_le_bytes(b[..8].try_into().expect("8 bytes")) as usize;
            let name = format!("rank {r}'s snapshot {k}");
            let body = b.get(8..8 + l).ok_or_else(|| {
                Error::Config(format!("{name}: {l} bytes announced, {} sent", b.len() - 8))
            })?;
            shards.push((name.clone(), checkpoint::decode(body, &name)?));
            b = &b[8 + l..];
            k += 1;
        }
    }
    let mut steps: Vec<u64> = shards.iter().map(|(_, s)| s.step).collect();
    steps.sort_unstable();
    steps.dedup();
    for &step in steps.iter().rev() {
        let at: Vec<(String, checkpoint::Shard)> = shards
            .iter()
            .filter(|(_, s)| s.step == step)
            .cloned()
            .collect();
        if let Ok(st) = checkpoint::assemble(&at, step, "the survivors' snapshots") {
            return Ok(Some(st));
        }
    }
    Ok(None)
}

/// Train with one thread per rank on the local transport. Returns the reports of rank 0
/// (of the survivors, where world rank 0 was set aside after a loss) with `memory` the
/// element-wise maximum over ranks; `on_step` runs on the reporting rank's thread.
pub fn train_local(
    opts: &TrainOptions,
    on_step: &mut (dyn FnMut(&StepReport) + Send),
) -> Result<Vec<StepReport>> {
    let topo = opts.topology.clone();
    let n = topo.world_size();
    let comms = Comm::local_world(n, Some(topo.clone()), CommConfig::from_env()?)?;
    let meters = Meters::new(&topo);
    // Every rank's thread may come to report (the world's rank 0 does; after a recovery
    // that set world rank 0 aside, the survivors' rank 0).
    let report = std::sync::Mutex::new(on_step);
    let results: Vec<Result<Vec<StepReport>>> = std::thread::scope(|sc| {
        let mut hs = Vec::with_capacity(n);
        for c in comms {
            let meters = meters.clone();
            let report = &report;
            hs.push(sc.spawn(move || {
                let mut cb = |r: &StepReport| {
                    if let Ok(mut f) = report.lock() {
                        f(r)
                    }
                };
                let r = run_rank(c.clone(), opts, meters, &mut cb);
                if r.is_err() {
                    // A failing rank must not leave the others waiting for it.
                    c.abort();
                }
                r
            }));
        }
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Model("a rank's thread panicked".into())))
            })
            .collect()
    });
    let mut ranks = Vec::with_capacity(n);
    let mut errs = Vec::new();
    for r in results {
        match r {
            Ok(v) => ranks.push(v),
            Err(e) => errs.push(e),
        }
    }
    if !errs.is_empty() {
        // The root cause, not the "aborted" errors it caused on the other ranks.
        let i = errs
            .iter()
            .position(|e| !e.to_string().contains("abort"))
            .unwrap_or(0);
        return Err(errs.swap_remove(i));
    }
    // The reports of the lowest rank that trained to the end (world rank 0, unless it
    // was set aside after a loss).
    let end = |v: &Vec<StepReport>| v.last().map_or(0, |r| r.step);
    let last = ranks.iter().map(end).max().unwrap_or(0);
    let first = ranks.iter().position(|v| end(v) == last).unwrap_or(0);
    let mut out = ranks.remove(first);
    for other in &ranks {
        for (a, b) in out.iter_mut().zip(other) {
            a.memory = a.memory.max(b.memory);
        }
    }
    Ok(out)
}

/// Train as one rank of an MPI job (feature `mpi`; launch under mpirun). Every process
/// returns the same reports except `memory`, which is its own; `on_step` runs on world
/// rank 0 only (after a recovery that set it aside, on the survivors' rank 0).
#[cfg(feature = "mpi")]
pub fn train_mpi(
    opts: &TrainOptions,
    on_step: &mut dyn FnMut(&StepReport),
) -> Result<Vec<StepReport>> {
    let world = Comm::mpi_world(Some(opts.topology.clone()), CommConfig::from_env()?)?;
    let meters = Meters::new(&opts.topology);
    run_rank(world, opts, meters, on_step)
}

/// Without the `mpi` feature: `NotCompiled`.
#[cfg(not(feature = "mpi"))]
pub fn train_mpi(_: &TrainOptions, _: &mut dyn FnMut(&StepReport)) -> Result<Vec<StepReport>> {
    Err(Error::Comm(strata::Error::NotCompiled(
        "strata-train --transport mpi needs the `mpi` feature (cargo build -p strata-engine --features mpi)".into(),
    )))
}

/// `auto`: the planner's top feasible strategy for this model on this cluster (the
/// example LM described to the planner as a shape: LayerNorm with biases, plain GELU
/// MLP, learned positions, untied head), with the run's micro-batch, sequence,
/// precision and global batch (`world · accum · batch · seq` tokens).
fn plan_auto(o: &TrainOptions) -> Result<Strategy> {
    use crate::planner::{best, ModelShape, Norm, PlanRequest};
    let c = &o.model;
    let mut m = ModelShape::custom(c.n_layers, c.d_model, c.n_heads, c.d_ff, c.vocab, false)?;
    m.name = "example-lm".into();
    m.norm = Norm::LayerNorm;
    m.biases = true;
    m.positions = c.seq;
    let mut req = PlanRequest::new(m, o.topology.clone());
    req.gpu_mem = o.gpu_mem;
    req.seq = c.seq;
    req.micro_batch = o.batch;
    req.dtype_bytes = o.precision.bytes();
    let accum = o.accum.unwrap_or(1);
    req.global_batch_tokens = (o.topology.world_size() * accum * o.batch * c.seq) as u64;
    let mut s = best(&req)?;
    s.accum = accum;
    Ok(s)
}
