//! The planner: which sharding strategy to train a model with on a cluster.
//!
//! AMSP §V-B (Fig. 7 Planner: pre-filter, communication profiler, solver) over the
//! engine's whole configuration space: [`search`] lists the candidates (AMSP's
//! filtered brute force, eqs 3-7, plus every preset of [`crate::config`]), [`comm`]
//! predicts each one's communication time per step (`T_comm`, AMSP eq. 1, with
//! collective times from strata's simulator instead of profiling, exact node-symmetric
//! replay in [`strata::sim::symmetric`]), [`memory`] its bytes per rank (`D_total`, AMSP §IV-D and
//! eq. 2), and [`plan`] ranks them: feasible ones by communication time (ties: no
//! recomputation, less memory, name), then the infeasible ones by memory.
//!
//! ```no_run
//! use strata_engine::planner::{best, plan, ModelShape, PlanRequest};
//! let cluster = strata::Topology::parse("dgx-a100:128").unwrap();
//! let req = PlanRequest::new(ModelShape::preset("llama-7b").unwrap(), cluster);
//! let ranked = plan(&req).unwrap();
//! println!("{} {} us", ranked[0].strategy.name, ranked[0].comm_time_us);
//! let s = best(&req).unwrap();
//! # let _ = s;
//! ```

pub mod amsp;
pub mod comm;
pub mod kernels;
pub mod memory;
pub mod models;
pub mod search;

pub use comm::{group_topology, CommModel, GroupShape, PhaseAlgoNames, PhaseTimes};
pub use kernels::KernelRates;
pub use memory::{ActivationInputs, MemoryBreakdown, Overhead};
pub use models::{ModelShape, Norm, Unit, UnitKind, MODEL_PRESETS};

use crate::config::{Mesh, Strategy};
use crate::error::{config_err, Error, Result};
use serde::{Serialize, Serializer};
use strata::Topology;

/// What to plan for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanRequest {
    pub model: ModelShape,
    /// The cluster (a strata topology: `dgx-a100:128`, `frontier:16`, a JSON file...).
    pub cluster: Topology,
    /// Memory per GPU, bytes.
    pub gpu_mem: u64,
    /// Sequence length (tokens).
    pub seq: usize,
    /// Sequences per micro-batch per rank.
    pub micro_batch: usize,
    /// Tokens per optimizer step over the whole cluster: the accumulation steps are
    /// `M = global_batch_tokens / (seq · micro_batch · world)`, at least 1.
    pub global_batch_tokens: u64,
    /// Bytes per working element `w` (2: bf16 parameters, gradients and activations,
    /// as the papers; 4: f32).
    pub dtype_bytes: usize,
    /// Activation recomputation: `Some(on)` for every candidate, `None` to decide per
    /// candidate (recompute only when the candidate does not fit without).
    pub recompute: Option<bool>,
    /// FlashAttention (no `as²b` activation terms; AMSP trains with FlashAttention-v2).
    pub flash_attention: bool,
    /// What each GPU holds beyond the model's tensors: the modeled CUDA context, NCCL
    /// buffers and allocator fragmentation (default), a flat reserve in their place, or
    /// nothing ([`memory`] module doc). A candidate fits when its total, overhead
    /// included, is at most `gpu_mem`.
    pub overhead: Overhead,
    /// Bytes per GPU the model does not see, added on top of the overhead (default 0;
    /// `--extra-memory`: e.g. the excess of a measured activation peak over the formula).
    pub extra_memory: u64,
    /// Measured rates of the quantization kernels that qwZ/qgZ candidates are charged
    /// with (default: an H200's; [`kernels`]).
    pub kernel_rates: KernelRates,
}

impl PlanRequest {
    /// AMSP §VI-A's setting: 80 GiB per GPU, sequence 4096, micro-batch 1, global batch
    /// 4 M tokens (4,194,304), bf16, recomputation decided per candidate, FlashAttention.
    pub fn new(model: ModelShape, cluster: Topology) -> PlanRequest {
        PlanRequest {
            model,
            cluster,
            gpu_mem: 80 << 30,
            seq: 4096,
            micro_batch: 1,
            global_batch_tokens: 4 << 20,
            dtype_bytes: 2,
            recompute: None,
            flash_attention: true,
            overhead: Overhead::Modeled,
            extra_memory: 0,
            kernel_rates: KernelRates::default(),
        }
    }

    /// The cluster's mesh `R x N`.
    pub fn mesh(&self) -> Mesh {
        Mesh::of(&self.cluster)
    }

    /// Accumulation steps `M = global_batch_tokens / (seq · micro_batch · world)`, at
    /// least 1 (AMSP §VI-A3: M = 128 on 8 GPUs, M = 1 on 1024).
    pub fn accum_steps(&self) -> usize {
        let per = (self.seq as u128) * (self.micro_batch as u128) * (self.mesh().world() as u128);
        if per == 0 {
            return 1;
        }
        ((self.global_batch_tokens as u128 / per).min(usize::MAX as u128) as usize).max(1)
    }

    /// Every input in range, with the rule it breaks.
    pub fn validate(&self) -> Result<()> {
        self.model.validate()?;
        self.cluster.validate()?;
        if self.gpu_mem == 0 {
            return config_err!("gpu memory must be > 0 bytes");
        }
        if let Overhead::Reserve(r) = self.overhead {
            if r >= self.gpu_mem {
                return config_err!(
                    "reserve of {} leaves nothing of {} per GPU",
                    memory::gib(r),
                    memory::gib(self.gpu_mem)
                );
            }
        }
        if self.seq == 0 || self.micro_batch == 0 {
            return config_err!(
                "sequence length and micro-batch must be >= 1 (got {} and {})",
                self.seq,
                self.micro_batch
            );
        }
        if self.global_batch_tokens == 0 {
            return config_err!("global batch must be >= 1 token");
        }
        if self.dtype_bytes != 2 && self.dtype_bytes != 4 {
            return config_err!(
                "dtype of {} bytes: the planner models bf16 (2) or f32 (4)",
                self.dtype_bytes
            );
        }
        Ok(())
    }

    /// `gpu_mem`: what a candidate's total (overhead included) may use.
    pub fn usable_memory(&self) -> u64 {
        self.gpu_mem
    }

    fn activation_inputs(&self, recompute: bool) -> ActivationInputs {
        ActivationInputs {
            seq: self.seq as u64,
            micro_batch: self.micro_batch as u64,
            w: self.dtype_bytes as u64,
            recompute,
            flash_attention: self.flash_attention,
        }
    }
}

/// One ranked strategy.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The strategy (its `name` is the preset or `amsp:p=..,g=..,os=..`).
    pub strategy: Strategy,
    /// Predicted communication time per step, microseconds (AMSP eq. 1: sum of phases).
    pub comm_time_us: f64,
    /// Predicted peak bytes per rank (`memory.total()`).
    pub memory_bytes: u64,
    /// Fits `gpu_mem`.
    pub feasible: bool,
    /// Why not, when infeasible.
    pub why: Option<String>,
    /// Whether the memory figure assumes activation recomputation.
    pub recompute: bool,
    /// Per-phase times.
    pub phases: PhaseTimes,
    /// What each phase's collectives resolved to.
    pub algos: PhaseAlgoNames,
    /// Per-kind bytes.
    pub memory: MemoryBreakdown,
}

impl Serialize for Candidate {
    fn serialize<S: Serializer>(&self, ser: S) -> std::result::Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Out<'a> {
            strategy: &'a str,
            p: String,
            g: String,
            os: String,
            hpz: Option<String>,
            qwz_bits: Option<u8>,
            qgz_bits: Option<u8>,
            sync: &'static str,
            accum: usize,
            comm_time_us: f64,
            memory_bytes: u64,
            feasible: bool,
            why: &'a Option<String>,
            recompute: bool,
            phases: &'a PhaseTimes,
            algos: &'a PhaseAlgoNames,
            memory: &'a MemoryBreakdown,
            config: &'a Strategy,
        }
        let (p, g, os) = self.strategy.factors();
        Out {
            strategy: &self.strategy.name,
            p,
            g,
            os,
            hpz: self.strategy.hpz.map(|h| h.to_string()),
            qwz_bits: self.strategy.qwz_bits,
            qgz_bits: self.strategy.qgz_bits,
            sync: self.strategy.sync.name(),
            accum: self.strategy.accum,
            comm_time_us: self.comm_time_us,
            memory_bytes: self.memory_bytes,
            feasible: self.feasible,
            why: &self.why,
            recompute: self.recompute,
            phases: &self.phases,
            algos: &self.algos,
            memory: &self.memory,
            config: &self.strategy,
        }
        .serialize(ser)
    }
}

/// Statistics of one [`plan_with_stats`] run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanStats {
    pub candidates: usize,
    pub feasible: usize,
    /// Collective schedules simulated (distinct (op, algorithm, count, group)).
    pub simulated: usize,
    /// Collective times answered from the cache.
    pub cache_hits: usize,
}

/// Evaluate one strategy: communication per phase and memory, feasibility against
/// `req.gpu_mem` (recomputation per `req.recompute`).
pub fn evaluate(req: &PlanRequest, comm: &mut CommModel, s: &Strategy) -> Result<Candidate> {
    let w = req.dtype_bytes;
    let mesh = req.mesh();
    let world = mesh.world();
    let (phases, algos) = comm.phase_times(&req.model, s, w, s.accum.max(1))?;
    let mem = |rc: bool| {
        let mut m = memory::memory(&req.model, s, &req.activation_inputs(rc), world);
        memory::add_overhead(&mut m, req.overhead, s, mesh);
        m.reserve = m.reserve.saturating_add(req.extra_memory);
        m
    };
    let cap = req.usable_memory();
    let (recompute, m) = match req.recompute {
        Some(rc) => (rc, mem(rc)),
        None => {
            let plain = mem(false);
            if plain.total() <= cap {
                (false, plain)
            } else {
                (true, mem(true))
            }
        }
    };
    let total = m.total();
    let feasible = total <= cap;
    let why = (!feasible).then(|| {
        format!(
            "out of memory: {} > {} ({}: params {}, grads {}, optimizer {}{}, activations {}, buffers {}, overhead {})",
            memory::gib(total),
            memory::gib(cap),
            if recompute { "with recompute" } else { "no recompute" },
            memory::gib(m.params),
            memory::gib(m.grads),
            memory::gib(m.optimizer),
            if m.secondary > 0 {
                format!(", secondary {}", memory::gib(m.secondary))
            } else {
                String::new()
            },
            memory::gib(m.activations),
            memory::gib(m.buffers),
            memory::gib(m.overhead()),
        )
    });
    Ok(Candidate {
        strategy: s.clone(),
        comm_time_us: phases.total(),
        memory_bytes: total,
        feasible,
        why,
        recompute,
        phases,
        algos,
        memory: m,
    })
}

/// Sort: feasible first by communication time (ties: without recomputation first, as
/// it costs compute the communication figure does not show; then less memory; then
/// name), then the infeasible ones by memory (ties: communication time, then name).
pub fn rank(cands: &mut [Candidate]) {
    cands.sort_by(|a, b| {
        b.feasible
            .cmp(&a.feasible)
            .then_with(|| {
                if a.feasible {
                    a.comm_time_us
                        .total_cmp(&b.comm_time_us)
                        .then(a.recompute.cmp(&b.recompute))
                        .then(a.memory_bytes.cmp(&b.memory_bytes))
                } else {
                    a.memory_bytes
                        .cmp(&b.memory_bytes)
                        .then(a.comm_time_us.total_cmp(&b.comm_time_us))
                }
            })
            .then_with(|| a.strategy.name.cmp(&b.strategy.name))
    });
}

/// [`plan`] with statistics.
pub fn plan_with_stats(req: &PlanRequest) -> Result<(Vec<Candidate>, PlanStats)> {
    req.validate()?;
    let mesh = req.mesh();
    let mut comm = CommModel::new(&req.cluster)?.with_kernel_rates(req.kernel_rates.clone())?;
    let cands = search::candidates(mesh, req.accum_steps());
    let mut out = Vec::with_capacity(cands.len());
    for s in &cands {
        out.push(evaluate(req, &mut comm, s)?);
    }
    rank(&mut out);
    let stats = PlanStats {
        candidates: out.len(),
        feasible: out.iter().filter(|c| c.feasible).count(),
        simulated: comm.simulated,
        cache_hits: comm.hits,
    };
    Ok((out, stats))
}

/// Every candidate, ranked (module doc).
pub fn plan(req: &PlanRequest) -> Result<Vec<Candidate>> {
    plan_with_stats(req).map(|(c, _)| c)
}

/// The top feasible strategy, or an error naming the smallest candidate and what it
/// needs.
pub fn best(req: &PlanRequest) -> Result<Strategy> {
    let c = plan(req)?;
    match c.iter().find(|c| c.feasible) {
        Some(c) => Ok(c.strategy.clone()),
        None => {
            let least = c.iter().min_by_key(|c| c.memory_bytes);
            Err(Error::Config(match least {
                Some(l) => format!(
                    "no strategy fits {} per GPU: the smallest, {}, needs {} ({}); \
                     use more GPUs, a shorter sequence, a smaller micro-batch or recomputation",
                    memory::gib(req.usable_memory()),
                    l.strategy.name,
                    memory::gib(l.memory_bytes),
                    l.why.as_deref().unwrap_or("")
                ),
                None => "no candidate strategy for this cluster".into(),
            }))
        }
    }
}

/// A positive byte count from `80G`, `80GiB`, `81920M`, `1.5G`, `85899345920`: strata's
/// one size parser, [`strata::units::parse_size`] (K, M, G, T are powers of 1024, with
/// or without `i` and `B`), its message as a configuration error.
pub fn parse_bytes(s: &str) -> Result<u64> {
    strata::units::parse_size(s).map_err(Error::Config)
}
