//! The runtime: executes any [`Strategy`] on a strata communicator, unit by unit.
//!
//! Per rank and step (M micro-batches, U units; shard indices from [`crate::mesh`]):
//!
//! 1. Forward, per unit: the unit's parameters are all-gathered over the P group
//!    (`fwd_gather`; qwZ-quantized with `qwz_bits`) while the previous unit computes
//!    (prefetch one unit ahead, AMSP §V-C Fig. 9(a)), used, and released. With hpZ the
//!    rank keeps its slice of the gathered unit as the secondary shard (ZeRO++ B.2).
//! 2. Backward, per unit in reverse: gathered again (`bwd_gather`, from the hpZ group
//!    when configured; prefetched one unit ahead), the unit's forward recomputed and
//!    back-propagated ([`UnitModel::backward`]), the unit's gradient reduce-scattered
//!    over the P group (hop 1, qgZ with `qgz_bits`) and, where `s_g > s_p`, over the G/P
//!    subgroup (hop 2: reduce-scatter, or AMSP's all-reduce + select & drop on every
//!    micro-batch but the last). These run on their own communicators while the next
//!    unit's backward computes (AMSP Fig. 9(b)); hop 2 depends on hop 1 through a
//!    cross-communicator dependency, so the compute thread never waits for a chain.
//!    Finished reductions are accumulated into the rank's G shard.
//! 3. Boundary (after the last micro-batch): `rs` sync: reduce-scatter G → OS shard over
//!    the OS/G subgroup, then all-reduce over the s_dp/s_os replicas (MiCS §3.4 2-hop;
//!    PaRO §3.4 eq. 1); `ar` sync: all-reduce of the P shard over the s_dp/s_p ranks
//!    holding it, then select the OS shard (AMSP §IV-C, T_os^0).
//! 4. AdamW on the OS shard (fp32 master and moments), the result cast to the working
//!    precision into the P shard, and spread by an in-place all-gather over the OS/P
//!    subgroup (AMSP T_os^1; shards are even, so an all-gather replaces the grouped
//!    broadcasts of uneven inter-tensor shards).
//!
//! Every unit's flat parameter vector is padded with zeros to a multiple of the world
//! size so every shard of every factor is even; padding has zero gradient and stays 0.
//! Gradients are summed and divided once by `world · M` before the update, so the
//! result is the mean over every token of the global batch, whatever the strategy.

use crate::account::{Component, Held, Memory, MemoryReport, Meters, Phase, TrafficByPhase};
use crate::checkpoint::{Shard, State, UnitShard};
use crate::compute::{Batch, UnitModel};
use crate::config::{GradSync, Mesh, Strategy};
use crate::error::{Error, Result};
use crate::mesh::Groups;
use crate::optim::AdamW;
use half::bf16;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Instant;
use strata::kernels::QuantSpec;
use strata::kinds::Kind;
use strata::{Algo, Buffer, Comm, DataType, ReduceOp, Request, Work};

/// Precision of parameters and gradients on the wire and in the P and G shards
/// (compute and the optimizer are fp32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    F32,
    Bf16,
}

impl Precision {
    /// Parse `f32` / `bf16`.
    pub fn parse(s: &str) -> Result<Precision> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "fp32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            _ => Err(Error::Config(format!("precision '{s}': f32 or bf16"))),
        }
    }
    /// The strata dtype.
    pub fn dtype(self) -> DataType {
        match self {
            Precision::F32 => DataType::F32,
            Precision::Bf16 => DataType::BF16,
        }
    }
    /// Bytes per element (`w`).
    pub fn bytes(self) -> usize {
        self.dtype().size()
    }
    fn encode(self, v: &[f32]) -> Vec<u8> {
        match self {
            Precision::F32 => bytemuck_f32(v),
            Precision::Bf16 => v
                .iter()
                .flat_map(|x| bf16::from_f32(*x).to_bits().to_le_bytes())
                .collect(),
        }
    }
    fn decode(self, b: &[u8]) -> Vec<f32> {
        match self {
            Precision::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Precision::Bf16 => b
                .chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
        }
    }
}

fn bytemuck_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Everything the runtime needs besides the model and the communicator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineConfig {
    pub strategy: Strategy,
    pub precision: Precision,
    pub optimizer: AdamW,
    /// Seed of the parameter initialization.
    pub seed: u64,
}

/// One step's figures (the `strata-train --json` record).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepReport {
    pub step: u64,
    /// Mean loss over every micro-batch of every rank.
    pub loss: f64,
    /// Slowest rank's wall time for the step.
    pub step_time_us: u64,
    /// This rank's bytes by component.
    pub memory: MemoryReport,
    /// Bytes sent in the step, summed over ranks, by phase and link class.
    pub traffic: TrafficByPhase,
    /// Set on the first step after the run went on without lost ranks
    /// ([`crate::train::TrainOptions::survive`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<Recovery>,
}

/// How a run went on after losing ranks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recovery {
    /// World ranks lost.
    pub lost: Vec<usize>,
    /// Ranks training on.
    pub world: usize,
    /// The step whose state was restored.
    pub from_step: u64,
    /// Where it came from: `replicas` (the survivors' snapshots) or `checkpoint`.
    pub source: String,
    /// The survivors' layout, `nodes:NxR` ([`crate::train::survivors_layout`]).
    #[serde(default)]
    pub layout: String,
    /// World ranks alive but set aside: the survivors on nodes the loss left partial,
    /// where the strategy needs whole nodes ([`crate::train::survivors_layout`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set_aside: Vec<usize>,
    /// The last step the reporting rank completed before the loss.
    #[serde(default)]
    pub after_step: u64,
    /// Seconds from that step's completion to this one's: what the recovery cost.
    #[serde(default)]
    pub seconds: f64,
}

/// A communicator of one phase, `None` where its group has one rank.
type Group = Option<Comm>;

struct Comms {
    fwd: Group,
    bwd: Group,
    grad_p: Group,
    grad_gp: Group,
    og: Group,
    os_rep: Group,
    p_rep: Group,
    spread: Group,
}

/// A gradient reduction in flight.
struct Inflight {
    unit: usize,
    work: Option<Work>,
    /// Keeps the buffers alive (and counted) until it is drained.
    _full: Held,
    out1: Option<Held>,
    out2: Option<Held>,
    /// AMSP last micro-batch: keep the P-shard gradient for the boundary.
    stash: bool,
    select: bool,
}

/// The sharded-training runtime of one rank.
pub struct Engine<M: UnitModel> {
    model: Arc<M>,
    cfg: EngineConfig,
    world: Comm,
    mesh: Mesh,
    groups: Groups,
    /// True and padded sizes per unit.
    sizes: Vec<(usize, usize)>,
    comms: Comms,
    mem: Arc<Memory>,
    params: Vec<Held>,
    secondary: Vec<Option<Held>>,
    grads: Vec<Held>,
    /// master | m | v, fp32, per unit.
    opt: Vec<Held>,
    stash: Vec<Option<Held>>,
    /// OS/P subgroup order ([`Groups::op_order`]); `None` where it is the identity.
    spread_order: Option<Vec<usize>>,
    meters: Meters,
    step: u64,
    /// This rank's shard as of the last two steps it completed, oldest first, when
    /// kept ([`Engine::keep_snapshots`]).
    snapshot: Vec<Shard>,
    snapshots: bool,
}

fn round_up(n: usize, m: usize) -> usize {
    n.div_ceil(m.max(1)) * m.max(1)
}

impl<M: UnitModel> Engine<M> {
    /// Set up rank `world.rank()`: split every phase's communicators off `world`
    /// (collective: every rank of `world` must call this with the same strategy), and
    /// allocate and initialize this rank's shards. `meters` must be shared by every rank
    /// of the process (the local transport) or be this process's own (MPI).
    pub fn new(world: Comm, model: Arc<M>, cfg: EngineConfig, meters: Meters) -> Result<Engine<M>> {
        Self::restored(world, model, cfg, meters, None)
    }

    /// [`Engine::new`] from `state` (a checkpoint's, [`crate::checkpoint::read_state`])
    /// instead of the model's initialization: every unit's master weights and AdamW
    /// moments and the step count, cut into this world's shards, so a checkpoint of any
    /// world size and strategy restores on this one. `None`: the initialization.
    pub fn restored(
        world: Comm,
        model: Arc<M>,
        cfg: EngineConfig,
        meters: Meters,
        state: Option<&State>,
    ) -> Result<Engine<M>> {
        let topo = world.topology().clone();
        let mesh = Mesh::of(&topo);
        if world.size() != mesh.world() {
            return Err(Error::Config(format!(
                "the engine needs the whole world: communicator of {} ranks on topology {} of {}",
                world.size(),
                topo.name,
                mesh.world()
            )));
        }
        Self::on_mesh(world, mesh, model, cfg, meters, state)
    }

    /// [`Engine::restored`] on `world` laid out as `mesh` (its rank `r` at `mesh`'s
    /// position `r`) rather than as its topology: how the survivors of a lost rank train
    /// on (a shrunk communicator is not a whole world of its topology; `cfg`'s strategy
    /// must fit `mesh`). `world.size()` must be `mesh.world()`.
    pub fn on_mesh(
        world: Comm,
        mesh: Mesh,
        model: Arc<M>,
        cfg: EngineConfig,
        meters: Meters,
        state: Option<&State>,
    ) -> Result<Engine<M>> {
        if world.size() != mesh.world() {
            return Err(Error::Config(format!(
                "a communicator of {} ranks laid out as a mesh of {}",
                world.size(),
                mesh.world()
            )));
        }
        let s = &cfg.strategy;
        s.validate(mesh)?;
        let groups = Groups::new(s, mesh, world.rank());
        let split = |(color, key): (u32, i32), phase: Phase| -> Result<Group> {
            let c = world
                .split_metered(Some(color), key, meters.get(phase))?
                .ok_or_else(|| Error::Config("split returned no communicator".into()))?;
            Ok(if c.size() > 1 { Some(c) } else { None })
        };
        let fwd = split(groups.p, Phase::FwdGather)?;
        let bwd = split(groups.hpz.unwrap_or(groups.p), Phase::BwdGather)?;
        let grad_p = split(groups.p, Phase::GradReduce)?;
        let grad_gp = split(groups.gp, Phase::GradReduce)?;
        let og = split(groups.og, Phase::Boundary)?;
        let os_rep = split(groups.os_replicas, Phase::Boundary)?;
        let p_rep = split(groups.p_replicas, Phase::Boundary)?;
        let spread = split(groups.op, Phase::Spread)?;
        let comms = Comms {
            fwd,
            bwd,
            grad_p,
            grad_gp,
            og,
            os_rep,
            p_rep,
            spread,
        };

        let world_n = mesh.world();
        let sizes: Vec<(usize, usize)> = model
            .unit_sizes()
            .into_iter()
            .map(|n| (n, round_up(n, world_n)))
            .collect();
        let mem = Arc::new(Memory::default());
        let w = cfg.precision.bytes();
        let (sp, sg, so) = (s.p.size(), s.g.size(), s.os.size());
        let mut params = Vec::new();
        let mut secondary = Vec::new();
        let mut grads = Vec::new();
        let mut opt = Vec::new();
        if let Some(st) = state {
            if st.units.len() != sizes.len() {
                return Err(Error::Config(format!(
                    "the checkpoint holds {} units, the model has {}",
                    st.units.len(),
                    sizes.len()
                )));
            }
        }
        for (u, &(n, np)) in sizes.iter().enumerate() {
            let (mut init, mut moments) = match state {
                Some(st) => {
                    let us = &st.units[u];
                    (us.master.clone(), Some((us.m.clone(), us.v.clone())))
                }
                None => (model.init_unit(u, cfg.seed), None),
            };
            if init.len() != n {
                return Err(Error::Model(format!(
                    "unit {u}: {} gave {} values, unit_sizes says {n}",
                    if state.is_some() {
                        "the checkpoint"
                    } else {
                        "init"
                    },
                    init.len()
                )));
            }
            init.resize(np, 0.0);
            let plen = np / sp;
            let p0 = groups.i_p * plen;
            let ph = mem.alloc(Component::Params, plen * w);
            ph.buf
                .write_bytes(&cfg.precision.encode(&init[p0..p0 + plen]))?;
            params.push(ph);
            secondary.push(
                s.hpz
                    .map(|h| mem.alloc(Component::Secondary, np / h.size() * w)),
            );
            grads.push(mem.alloc(Component::Grads, np / sg * w));
            let olen = np / so;
            let o0 = p0 + groups.j_op * olen;
            let oh = mem.alloc(Component::Optimizer, 3 * olen * 4);
            oh.buf
                .slice(0..olen * 4)?
                .write_bytes(&bytemuck_f32(&init[o0..o0 + olen]))?;
            if let Some((m, v)) = moments.as_mut() {
                for (i, x) in [m, v].into_iter().enumerate() {
                    x.resize(np, 0.0);
                    let at = (i + 1) * olen * 4;
                    oh.buf
                        .slice(at..at + olen * 4)?
                        .write_bytes(&bytemuck_f32(&x[o0..o0 + olen]))?;
                }
            }
            opt.push(oh);
        }
        let stash = (0..sizes.len()).map(|_| None).collect();
        let order = groups.op_order(s, mesh);
        let spread_order = if order.iter().enumerate().all(|(i, &j)| i == j) {
            None
        } else {
            Some(order)
        };
        Ok(Engine {
            model,
            cfg,
            world,
            mesh,
            groups,
            sizes,
            comms,
            mem,
            params,
            secondary,
            grads,
            opt,
            stash,
            spread_order,
            meters,
            step: state.map_or(0, |s| s.step),
            snapshot: Vec::new(),
            snapshots: false,
        })
    }

    /// This rank's shard of the training state, for [`crate::checkpoint::write_shard`]
    /// (no communication): per unit the OS shard's master weights and moments and
    /// where the shard lies in the unit's padded vector.
    pub fn shard(&self) -> Result<Shard> {
        let (sp, so) = (self.cfg.strategy.p.size(), self.cfg.strategy.os.size());
        let mut units = Vec::with_capacity(self.sizes.len());
        for (u, &(n, np)) in self.sizes.iter().enumerate() {
            let olen = np / so;
            let st = self.opt[u].buf.to_vec::<f32>()?;
            units.push(UnitShard {
                len: n,
                offset: self.groups.i_p * (np / sp) + self.groups.j_op * olen,
                master: st[..olen].to_vec(),
                m: st[olen..2 * olen].to_vec(),
                v: st[2 * olen..3 * olen].to_vec(),
            });
        }
        Ok(Shard {
            step: self.step,
            units,
        })
    }

    /// Abort the world and every phase's communicator (after a failure: every peer
    /// waiting in any of them fails at once instead of waiting out its timeout).
    pub fn abort(&self) {
        self.world.abort();
        let c = &self.comms;
        for g in [
            &c.fwd, &c.bwd, &c.grad_p, &c.grad_gp, &c.og, &c.os_rep, &c.p_rep, &c.spread,
        ]
        .into_iter()
        .flatten()
        {
            g.abort();
        }
    }

    /// Keep copies of this rank's shard as of the last two steps it completed (taken
    /// now, and at the end of every step, after the step's last barrier): what the
    /// survivors of a lost rank restore from when the strategy keeps replicas of every
    /// shard (MiCS, `dp`), with no rollback to a checkpoint. Two, because a peer lost in
    /// the middle of a step's last barrier can leave one survivor past it and another
    /// not: the newest step every survivor holds is then the one before. It costs the
    /// optimizer state's size twice more per rank, and a copy of it per step.
    pub fn keep_snapshots(&mut self) -> Result<()> {
        self.snapshots = true;
        self.snapshot = vec![self.shard()?];
        Ok(())
    }

    /// The kept snapshots ([`Engine::keep_snapshots`]), oldest first, taken out.
    pub fn take_snapshots(&mut self) -> Vec<Shard> {
        std::mem::take(&mut self.snapshot)
    }

    /// Optimizer steps taken (a restored engine counts on from its checkpoint's).
    pub fn steps_taken(&self) -> u64 {
        self.step
    }

    /// This rank's memory figures.
    pub fn memory(&self) -> MemoryReport {
        self.mem.report()
    }

    /// The strategy being run.
    pub fn strategy(&self) -> &Strategy {
        &self.cfg.strategy
    }

    /// Padded parameter count (`Ψ` of the memory formulas).
    pub fn padded_params(&self) -> usize {
        self.sizes.iter().map(|s| s.1).sum()
    }

    fn dt(&self) -> DataType {
        self.cfg.precision.dtype()
    }

    /// The request of `kind` (summing, where it reduces) of `count` elements of the run's
    /// dtype from `send` into `recv`, under `algo`.
    fn request(&self, kind: Kind, send: Buffer, recv: Buffer, count: usize, algo: Algo) -> Request {
        Request::new(kind.op(send, recv, count, ReduceOp::Sum), self.dt()).with_algo(algo)
    }

    fn quant(&self, bits: Option<u8>) -> Result<Option<QuantSpec>> {
        bits.map(|b| QuantSpec::new(b as u32, self.cfg.strategy.quant_block).map_err(Error::from))
            .transpose()
    }

    /// Start gathering unit `u` for the forward (`bwd == false`) or backward pass.
    /// Returns the buffer that will hold the whole padded unit and the work to wait for.
    fn gather(&self, u: usize, bwd: bool) -> Result<(Held, Option<Work>)> {
        let s = &self.cfg.strategy;
        let np = self.sizes[u].1;
        let w = self.cfg.precision.bytes();
        let full = self.mem.alloc(Component::Buffers, np * w);
        let (comm, send, algo, quant) = if bwd {
            match (&self.comms.bwd, &self.secondary[u]) {
                (Some(c), Some(sec)) => (c, sec.buf.clone(), s.algos.bwd_gather, None),
                (Some(c), None) => (c, self.params[u].buf.clone(), s.algos.bwd_gather, None),
                (None, Some(sec)) => {
                    full.buf.write_bytes(&sec.buf.to_bytes()?)?;
                    return Ok((full, None));
                }
                (None, None) => {
                    full.buf.write_bytes(&self.params[u].buf.to_bytes()?)?;
                    return Ok((full, None));
                }
            }
        } else {
            match &self.comms.fwd {
                Some(c) => (
                    c,
                    self.params[u].buf.clone(),
                    s.algos.fwd_gather,
                    self.quant(s.qwz_bits)?,
                ),
                None => {
                    full.buf.write_bytes(&self.params[u].buf.to_bytes()?)?;
                    return Ok((full, None));
                }
            }
        };
        let count = send.len() / w;
        let mut req = self.request(Kind::AllGather, send, full.buf.clone(), count, algo);
        if let Some(q) = quant {
            req = req.with_quant(q);
        }
        let work = comm.submit(req)?;
        Ok((full, Some(work)))
    }

    /// Wait for a gathered unit and return its true-length fp32 parameters.
    fn ready(&self, u: usize, g: &(Held, Option<Work>)) -> Result<Vec<f32>> {
        if let Some(w) = &g.1 {
            w.wait()?;
        }
        let mut v = self.cfg.precision.decode(&g.0.buf.to_bytes()?);
        v.truncate(self.sizes[u].0);
        Ok(v)
    }

    /// Submit the gradient reduction of unit `u` (hops 1 and 2) without waiting.
    fn reduce(&self, u: usize, grad: &[f32], last: bool) -> Result<Inflight> {
        let s = &self.cfg.strategy;
        let (n, np) = self.sizes[u];
        let w = self.cfg.precision.bytes();
        let (sp, sg) = (s.p.size(), s.g.size());
        if grad.len() != n {
            return Err(Error::Model(format!(
                "unit {u}: backward gave {} gradient values for {n} parameters",
                grad.len()
            )));
        }
        let full = self.mem.alloc(Component::Buffers, np * w);
        full.buf
            .slice(0..n * w)?
            .write_bytes(&self.cfg.precision.encode(grad))?;
        let mut work = None;
        let mut out1 = None;
        if let Some(c) = &self.comms.grad_p {
            let o = self.mem.alloc(Component::Buffers, np / sp * w);
            let mut req = self.request(
                Kind::ReduceScatter,
                full.buf.clone(),
                o.buf.clone(),
                np / sp,
                s.algos.grad_reduce,
            );
            if let Some(q) = self.quant(s.qgz_bits)? {
                req = req.with_quant(q);
            }
            work = Some(c.submit(req)?);
            out1 = Some(o);
        }
        let hop2_algo = match s.algos.grad_reduce {
            Algo::Qgz | Algo::Qgz1 => Algo::Auto,
            a => a,
        };
        let mut out2 = None;
        let (mut stash, mut select) = (false, false);
        if let Some(c) = &self.comms.grad_gp {
            let src = out1
                .as_ref()
                .map(|h| h.buf.clone())
                .unwrap_or(full.buf.clone());
            let hop2 = match s.sync {
                GradSync::ReduceScatter => {
                    let o = self.mem.alloc(Component::Buffers, np / sg * w);
                    let recv = o.buf.clone();
                    out2 = Some(o);
                    Some(self.request(Kind::ReduceScatter, src, recv, np / sg, hop2_algo))
                }
                GradSync::AllReduce if !last => {
                    select = true;
                    Some(self.request(Kind::AllReduce, src.clone(), src, np / sp, hop2_algo))
                }
                GradSync::AllReduce => {
                    stash = true;
                    None
                }
            };
            if let Some(req) = hop2 {
                work = Some(c.submit(req.after(work.take()))?);
            }
        }
        Ok(Inflight {
            unit: u,
            work,
            _full: full,
            out1,
            out2,
            stash,
            select,
        })
    }

    /// Wait for a reduction and fold it into the G shard (or stash it, AMSP's last
    /// micro-batch).
    fn drain(&mut self, f: Inflight) -> Result<()> {
        if let Some(w) = &f.work {
            w.wait()?;
        }
        let s = &self.cfg.strategy;
        let np = self.sizes[f.unit].1;
        let w = self.cfg.precision.bytes();
        let glen = np / s.g.size();
        let pshard = f.out1.as_ref().map(|h| &h.buf).unwrap_or(&f._full.buf);
        if f.stash {
            let h = self.mem.alloc(Component::Buffers, pshard.len());
            h.buf.write_bytes(&pshard.to_bytes()?)?;
            self.stash[f.unit] = Some(h);
            return Ok(());
        }
        let src = if let Some(o) = &f.out2 {
            o.buf.clone()
        } else if f.select {
            pshard.slice(self.groups.j_gp * glen * w..(self.groups.j_gp + 1) * glen * w)?
        } else {
            pshard.clone()
        };
        let add = self.cfg.precision.decode(&src.to_bytes()?);
        let acc = &self.grads[f.unit].buf;
        let mut cur = self.cfg.precision.decode(&acc.to_bytes()?);
        cur.iter_mut().zip(&add).for_each(|(a, b)| *a += b);
        acc.write_bytes(&self.cfg.precision.encode(&cur))?;
        Ok(())
    }

    /// One micro-batch: forward and backward of every unit with the gradient reductions
    /// submitted as units finish. Returns the loss.
    fn micro(&mut self, batch: &Batch, last: bool) -> Result<f32> {
        let nu = self.sizes.len();
        let mut inputs: Vec<Option<M::Act>> = Vec::with_capacity(nu);
        let mut x: Option<M::Act> = None;
        let mut next = Some(self.gather(0, false)?);
        let mut out = None;
        for u in 0..nu {
            let cur = next
                .take()
                .ok_or_else(|| Error::Model("no gathered unit".into()))?;
            if u + 1 < nu {
                next = Some(self.gather(u + 1, false)?);
            }
            let p = self.ready(u, &cur)?;
            if let Some(sec) = &self.secondary[u] {
                let w = self.cfg.precision.bytes();
                let len = sec.buf.len();
                let off = self.groups.i_hpz * len;
                debug_assert!(off + len <= self.sizes[u].1 * w);
                sec.buf
                    .write_bytes(&cur.0.buf.slice(off..off + len)?.to_bytes()?)?;
            }
            drop(cur);
            let y = self.model.forward(u, &p, x.as_ref(), batch)?;
            inputs.push(x.take());
            if u + 1 == nu {
                out = Some(y);
            } else {
                x = Some(y);
            }
        }
        let out = out.ok_or_else(|| Error::Model("model has no units".into()))?;
        let loss = self.model.loss_value(&out)?;

        let mut grad_out: Option<M::Act> = None;
        let mut inflight: std::collections::VecDeque<Inflight> = Default::default();
        let mut next = Some(self.gather(nu - 1, true)?);
        for u in (0..nu).rev() {
            let cur = next
                .take()
                .ok_or_else(|| Error::Model("no gathered unit".into()))?;
            if u > 0 {
                next = Some(self.gather(u - 1, true)?);
            }
            let p = self.ready(u, &cur)?;
            drop(cur);
            let (gx, gp) =
                self.model
                    .backward(u, &p, inputs[u].as_ref(), grad_out.as_ref(), batch)?;
            inputs[u] = None;
            grad_out = gx;
            inflight.push_back(self.reduce(u, &gp, last)?);
            // Fold in whatever finished while this unit computed, oldest first.
            while inflight
                .front()
                .is_some_and(|f| f.work.as_ref().is_none_or(|w| w.is_done()))
            {
                if let Some(f) = inflight.pop_front() {
                    self.drain(f)?;
                }
            }
        }
        for f in inflight {
            self.drain(f)?;
        }
        Ok(loss)
    }

    /// Boundary synchronization, AdamW on the OS shard, and the spread.
    fn update(&mut self, micro_batches: usize) -> Result<()> {
        let s = self.cfg.strategy.clone();
        let w = self.cfg.precision.bytes();
        let (sp, sg, so) = (s.p.size(), s.g.size(), s.os.size());
        let nu = self.sizes.len();
        // 1. Boundary reductions, every unit submitted before any is waited for.
        let mut pending: Vec<(Option<Work>, Buffer, Option<Held>)> = Vec::with_capacity(nu);
        for u in 0..nu {
            let np = self.sizes[u].1;
            let (olen, glen, plen) = (np / so, np / sg, np / sp);
            match s.sync {
                GradSync::ReduceScatter => {
                    let acc = self.grads[u].buf.clone();
                    let (mut work, buf, held) = match &self.comms.og {
                        Some(c) => {
                            let o = self.mem.alloc(Component::Buffers, olen * w);
                            let req = self.request(
                                Kind::ReduceScatter,
                                acc,
                                o.buf.clone(),
                                olen,
                                s.algos.boundary,
                            );
                            let wk = c.submit(req)?;
                            (Some(wk), o.buf.clone(), Some(o))
                        }
                        None => (None, acc, None),
                    };
                    if let Some(c) = &self.comms.os_rep {
                        let req = self.request(
                            Kind::AllReduce,
                            buf.clone(),
                            buf.clone(),
                            olen,
                            s.algos.boundary,
                        );
                        work = Some(c.submit(req.after(work))?);
                    }
                    pending.push((work, buf, held));
                }
                GradSync::AllReduce => {
                    let h = self.mem.alloc(Component::Buffers, plen * w);
                    if let Some(st) = self.stash[u].take() {
                        // Last micro-batch's P-shard gradient plus this rank's G shard.
                        let mut v = self.cfg.precision.decode(&st.buf.to_bytes()?);
                        let acc = self.cfg.precision.decode(&self.grads[u].buf.to_bytes()?);
                        let off = self.groups.j_gp * glen;
                        v[off..off + glen]
                            .iter_mut()
                            .zip(&acc)
                            .for_each(|(a, b)| *a += b);
                        h.buf.write_bytes(&self.cfg.precision.encode(&v))?;
                    } else {
                        h.buf.write_bytes(&self.grads[u].buf.to_bytes()?)?;
                    }
                    let work = match &self.comms.p_rep {
                        Some(c) => {
                            let (b, algo) = (h.buf.clone(), s.algos.boundary);
                            Some(c.submit(self.request(
                                Kind::AllReduce,
                                b.clone(),
                                b,
                                plen,
                                algo,
                            ))?)
                        }
                        None => None,
                    };
                    let off = self.groups.j_op * olen * w;
                    let view = h.buf.slice(off..off + olen * w)?;
                    pending.push((work, view, Some(h)));
                }
            }
        }
        // 2. AdamW per unit as its reduction lands, then the spread.
        self.step += 1;
        let scale = 1.0 / (self.world.size() * micro_batches) as f32;
        let mut spreads = Vec::with_capacity(nu);
        for (u, (work, buf, held)) in pending.into_iter().enumerate() {
            if let Some(wk) = work {
                wk.wait()?;
            }
            let np = self.sizes[u].1;
            let olen = np / so;
            let mut g = self.cfg.precision.decode(&buf.to_bytes()?);
            g.iter_mut().for_each(|x| *x *= scale);
            drop(held);
            let st = self.opt[u].buf.to_vec::<f32>()?;
            let (mut master, rest) = (st[..olen].to_vec(), &st[olen..]);
            let (mut m, mut v) = (rest[..olen].to_vec(), rest[olen..].to_vec());
            self.cfg
                .optimizer
                .update(self.step, &mut master, &mut m, &mut v, &g);
            let mut all = master.clone();
            all.extend_from_slice(&m);
            all.extend_from_slice(&v);
            self.opt[u].buf.write_slice(&all)?;
            let p = &self.params[u].buf;
            let off = self.groups.j_op * olen * w;
            let mine = p.slice(off..off + olen * w)?;
            mine.write_bytes(&self.cfg.precision.encode(&master))?;
            if let Some(c) = &self.comms.spread {
                // World-ordered ring; a non-identity order gathers into scratch and
                // places each rank's OS shard where it belongs in the P shard.
                let (recv, scratch) = match &self.spread_order {
                    None => (p.clone(), None),
                    Some(_) => {
                        let t = self.mem.alloc(Component::Buffers, p.len());
                        (t.buf.clone(), Some(t))
                    }
                };
                let wk =
                    c.submit(self.request(Kind::AllGather, mine, recv, olen, s.algos.spread))?;
                spreads.push((u, wk, scratch));
            }
            self.grads[u]
                .buf
                .write_bytes(&vec![0u8; self.grads[u].buf.len()])?;
        }
        for (u, wk, scratch) in spreads {
            wk.wait()?;
            if let (Some(t), Some(order)) = (scratch, &self.spread_order) {
                let chunk = t.buf.len() / order.len();
                let p = &self.params[u].buf;
                for (k, &j) in order.iter().enumerate() {
                    p.slice(j * chunk..(j + 1) * chunk)?
                        .write_bytes(&t.buf.slice(k * chunk..(k + 1) * chunk)?.to_bytes()?)?;
                }
            }
        }
        Ok(())
    }

    /// One training step over `micro_batches` batches (`batch(i)` gives micro-batch i of
    /// this rank). Collective over the world.
    pub fn step(
        &mut self,
        micro_batches: usize,
        batch: &dyn Fn(usize) -> Batch,
    ) -> Result<StepReport> {
        if micro_batches == 0 {
            return Err(Error::Config(
                "a step needs at least one micro-batch".into(),
            ));
        }
        // Counters are read between two barriers so no rank's sends of this step can
        // land before another rank's reading of the previous step's figures.
        self.world.barrier()?;
        let before = self.meters.snapshot();
        self.world.barrier()?;
        let t0 = Instant::now();
        let mut loss = 0.0f64;
        for i in 0..micro_batches {
            loss += self.micro(&batch(i), i + 1 == micro_batches)? as f64;
        }
        self.update(micro_batches)?;
        let us = t0.elapsed().as_micros() as f32;
        // Mean loss and slowest time over ranks.
        let stats = Buffer::from_slice(&[(loss / micro_batches as f64) as f32]);
        self.world
            .all_reduce(&stats, &stats, 1, DataType::F32, ReduceOp::Avg)?
            .wait()?;
        let t = Buffer::from_slice(&[us]);
        self.world
            .all_reduce(&t, &t, 1, DataType::F32, ReduceOp::Max)?
            .wait()?;
        self.world.barrier()?;
        // Every rank has completed this step's update: a consistent snapshot.
        if self.snapshots {
            if self.snapshot.len() == 2 {
                self.snapshot.remove(0);
            }
            self.snapshot.push(self.shard()?);
        }
        let after = self.meters.snapshot();
        let mut mats = Vec::with_capacity(after.len());
        for (a, b) in after.iter().zip(&before) {
            mats.push(self.world.sum_traffic(&a.since(b))?);
        }
        Ok(StepReport {
            step: self.step,
            loss: stats.to_vec::<f32>()?[0] as f64,
            step_time_us: t.to_vec::<f32>()?[0] as u64,
            memory: self.memory(),
            traffic: TrafficByPhase::from_matrices(&mats, &self.meters.topo),
            recovery: None,
        })
    }

    /// The full, unsharded fp32 master weights of every unit (true lengths), gathered
    /// for checks: collective over the world (an all-reduce of each unit where every
    /// OS shard is contributed by the lowest world rank holding it, so the sum is exact).
    pub fn full_master(&self) -> Result<Vec<Vec<f32>>> {
        let so = self.cfg.strategy.os.size();
        let mesh = self.mesh;
        let me = self.world.rank();
        let mine = |g: &Groups| (g.i_p, g.j_op);
        let primary =
            (0..me).all(|r| mine(&Groups::new(&self.cfg.strategy, mesh, r)) != mine(&self.groups));
        let mut out = Vec::with_capacity(self.sizes.len());
        for (u, &(n, np)) in self.sizes.iter().enumerate() {
            let olen = np / so;
            let st = self.opt[u].buf.to_vec::<f32>()?;
            let mut v = vec![0f32; np];
            let o0 = self.groups.i_p * (np / self.cfg.strategy.p.size()) + self.groups.j_op * olen;
            if primary {
                v[o0..o0 + olen].copy_from_slice(&st[..olen]);
            }
            let b = Buffer::from_slice(&v);
            self.world
                .all_reduce(&b, &b, np, DataType::F32, ReduceOp::Sum)?
                .wait()?;
            let mut r = b.to_vec::<f32>()?;
            r.truncate(n);
            out.push(r);
        }
        Ok(out)
    }
}
