//! AMSP's own planner model: `strata-plan --mode amsp`.
//!
//! The default mode ([`super::plan`]) ranks the engine's whole configuration space with
//! strata's simulator. This mode instead follows the AMSP paper (Chen et al.) as
//! written, to check what its model selects:
//!
//! - **Search space** (§V-B, eqs 3-7, `s_g ∈ {s_p, s_os}` §IV-C3): the triples of
//!   [`search::amsp_triples`] on the cluster's `R x N` mesh.
//! - **Cost** (§IV-C, eq. 1): `T_comm = T_p + T_g + T_os⁰ + T_os¹` with, for `w` bytes per
//!   element, units `u` of `Φ_u` parameters, `M` micro-batches and a bucket of `U` bytes:
//!   - `T_p = M · Σ_u (2·t(AG, w·Φ_u, s_p⁰×s_p¹) + t(RS, w·Φ_u, s_p⁰×s_p¹))` (s_p > 1);
//!   - `T_g = (M-1) · (w·Φ/(U·s_p)) · t(AR, U, s_g⁰/s_p⁰ × s_g¹/s_p¹)`;
//!   - `T_os⁰ = (w·Φ/(U·s_p)) · t(AR, U, s_dp⁰/s_p⁰ × s_dp¹/s_p¹)`;
//!   - `T_os¹ = (s_os/s_p) · t(BC, w·Φ/s_os, s_os⁰/s_p⁰ × s_os¹/s_p¹)`;
//!
//!   where the last bucket is the remainder (`U` is at most the shard), and
//!   `t(o, v, p⁰×p¹) = v / w(o, v, p⁰×p¹)` (§IV-A) with the effective bandwidth `w` of
//!   NCCL's ring on the cluster's links ([`collective_us`]), since the paper's Fig. 3
//!   profile is given as curves without numbers.
//! - **Memory** (§IV-D, eq. 2): `D_total = D_modelstate + D_activation + D_tmp` with the
//!   planner's memory model: AMSP's model states, Korthikanti activations (AMSP cites
//!   Megatron-LM \[5\] and ZeRO \[16\] for this term), buffers, and the framework overhead of
//!   `PlanRequest::overhead` (modeled by default; `--overhead off` is the paper's
//!   literal eq. 2 with `D_tmp` = buffers only).
//! - **Recomputation** (§VI-A4): off for LLaMA-7B and 13B, on for 30B; for other shapes,
//!   on from 20 B parameters. `--recompute on|off` overrides.
//! - **One configuration for every scale** (§VI-A4: "a uniform set of configurations when
//!   scaling training from 8 GPUs to 1024 GPUs"): a configuration is evaluated at every
//!   scale `R x n`, `n = 1, 2, 4, ..., N` (the global batch fixed, so `M` grows as `n`
//!   shrinks) at which it exists, i.e. from `n` = its largest inter-node factor up (a
//!   factor `8x4` needs 4 nodes); it must fit memory at all of them. Among those, the
//!   cheapest `T_comm` at the target scale wins; an exact tie (at `M = 1`, `T_g` is 0 for
//!   every `s_g`) goes to the lower `T_comm` summed over the smaller scales, then to less
//!   memory. Why the range starts at the configuration's own smallest scale and not at
//!   8 GPUs for every row: Table IV's LLaMA-30B row (`os = 8x4`) cannot exist on one
//!   node, and on one node its realization would be `p = g = os = 8x1`, which has the
//!   same `T_p`, `T_g` and `T_os⁰`, `T_os¹ = 0` and more memory than `os = 8x4`: if it
//!   fit, the planner would prefer it at 1024 GPUs; if it did not, the row could not run
//!   on 8 GPUs. So the paper's 30B range must start at 4 nodes (it reports 30B from 32
//!   GPUs, §VI-B1, and traces it on 64).
//!
//! The testbed (§VI-A2, §III-A) is [`testbed`]: `amsp-a800:N`, nodes of 8 A800-80GB on
//! NVLink (400 GB/s bidirectional, 200 GB/s per direction), 4 HDR InfiniBand NICs per node
//! (200 Gb/s = 25 GB/s each, no SHARP): the intra/inter ratio of 2 the paper states.

use super::comm::{PhaseAlgoNames, PhaseTimes};
use super::memory::{self, ActivationInputs, MemoryBreakdown};
use super::models::ModelShape;
use super::search;
use super::{Candidate, PlanRequest};
use crate::config::{Factor, Mesh, Strategy};
use crate::error::{config_err, Result};
use strata::topology::{LinkSpec, Links, Topology};

/// A800 NVLink per GPU and direction: 400 GB/s bidirectional (§III-A: the testbed's
/// intra/inter bandwidth ratio is 2).
pub const A800_NVLINK_GBS: f64 = 200.0;
/// One HDR InfiniBand NIC: 200 Gb/s = 25 GB/s per direction (§VI-A2, Fig. 3).
pub const HDR_NIC_GBS: f64 = 25.0;
/// NICs per node (§VI-A2: "4 Mellanox HDR InfiniBand without SHARP").
pub const NICS_PER_NODE: usize = 4;
/// Per-step latency of an NVLink ring step, us (strata's NVLink figure).
pub const NVLINK_LATENCY_US: f64 = 1.5;
/// Per-step latency of an InfiniBand ring step, us (strata's IB figure).
pub const IB_LATENCY_US: f64 = 4.0;
/// The bucket `U` of `T_g` and `T_os⁰`: DeepSpeed's default `reduce_bucket_size` of
/// 5·10⁸ elements (AMSP builds on DeepSpeed's bucketing and gives no `U`).
pub const BUCKET_ELEMS: u64 = 500_000_000;

/// AMSP's testbed with `nodes` nodes (module doc), named `amsp-a800:<nodes>`.
pub fn testbed(nodes: usize) -> Topology {
    let nv = LinkSpec {
        bandwidth_gbs: A800_NVLINK_GBS,
        latency_us: NVLINK_LATENCY_US,
    };
    Topology {
        name: format!("amsp-a800:{nodes}"),
        nodes,
        packages_per_node: 8,
        dies_per_package: 1,
        switch_of_node: None,
        links: Links {
            intra_package: nv,
            intra_node: nv,
            inter_node: LinkSpec {
                bandwidth_gbs: HDR_NIC_GBS,
                latency_us: IB_LATENCY_US,
            },
            nics_per_node: NICS_PER_NODE,
            nic_bandwidth_gbs: HDR_NIC_GBS,
            host: None,
            overlap: None,
            handoff_us: None,
            lone_latency_us: None,
        },
        measured: None,
    }
}

/// `amsp-a800:N` as [`testbed`]`(N)`; `None` for any other spec.
pub fn parse_cluster(spec: &str) -> Option<Result<Topology>> {
    let n = spec.trim().strip_prefix("amsp-a800:")?;
    Some(match n.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(testbed(n)),
        _ => config_err!("amsp-a800:N needs N >= 1 nodes, got '{n}'"),
    })
}

/// A collective of AMSP's cost model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coll {
    AllGather,
    ReduceScatter,
    AllReduce,
    Broadcast,
}

/// `t(o, v, p⁰×p¹)` in us: `v / w(o, v, p⁰×p¹)` with NCCL ring's effective bandwidth
/// on `links` (`r` ranks per node; all groups of one kind run at once, so a group
/// spanning nodes gets the share `p⁰/r` of its node's NICs):
/// - bus bandwidth `B` = NVLink if `p¹ = 1`, else `min(NVLink, nics·nic_bw·p⁰/r)`;
/// - latency per phase as NCCL's tuning model charges a ring: `(p-1) - (p¹-1)` NVLink
///   steps and `p¹-1` inter-node steps, `L = (p-p¹)·α_nvlink + (p¹-1)·α_inter`;
/// - AG, RS: `L + (p-1)/p · v/B`; AR: twice that; BC (pipelined ring): `L + v/B`, with
///   `p = p⁰·p¹` and `v` the larger buffer (AG output, RS input).
pub fn collective_us(links: &Links, r: usize, op: Coll, v: f64, p0: usize, p1: usize) -> f64 {
    let p = (p0 * p1) as f64;
    if p0 * p1 <= 1 || v <= 0.0 {
        return 0.0;
    }
    let nv = links.intra_node;
    let bw = if p1 == 1 {
        nv.bandwidth_gbs
    } else {
        let share = links.node_egress_gbs() * p0 as f64 / r.max(1) as f64;
        nv.bandwidth_gbs.min(share)
    };
    // NCCL's ring latency model (tuning.cc): of a phase's p-1 steps, p¹-1 cross nodes.
    let inter = (p1 - 1) as f64;
    let steps = (p - 1.0 - inter) * nv.latency_us + inter * links.inter_node.latency_us;
    let beta = v / (bw * 1e3); // us for v bytes at bw GB/s
    match op {
        Coll::AllGather | Coll::ReduceScatter => steps + (p - 1.0) / p * beta,
        Coll::AllReduce => 2.0 * (steps + (p - 1.0) / p * beta),
        Coll::Broadcast => steps + beta,
    }
}

/// AMSP's four terms of one configuration at one scale, us.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AmspCost {
    /// `T_p`: all-gathers (forward and backward) of the parameter shards.
    pub t_p_gather: f64,
    /// `T_p`: gradient reduce-scatters.
    pub t_p_reduce: f64,
    pub t_g: f64,
    pub t_os0: f64,
    pub t_os1: f64,
}

impl AmspCost {
    /// `T_comm` (eq. 1).
    pub fn total(&self) -> f64 {
        self.t_p_gather + self.t_p_reduce + self.t_g + self.t_os0 + self.t_os1
    }
}

/// `(buckets of U, last bucket)` for `bytes`: AMSP's `2Φ/(U·s_p)` AR calls, the last one
/// the remainder.
fn bucketed(links: &Links, r: usize, bytes: f64, u: f64, p0: usize, p1: usize) -> f64 {
    if bytes <= 0.0 {
        return 0.0;
    }
    let full = (bytes / u).floor();
    let rest = bytes - full * u;
    full * collective_us(links, r, Coll::AllReduce, u, p0, p1)
        + collective_us(links, r, Coll::AllReduce, rest, p0, p1)
}

/// The terms of §IV-C for `(p, g, os)` with `m` micro-batches on `mesh` (module doc).
pub fn cost(
    model: &ModelShape,
    links: &Links,
    mesh: Mesh,
    (p, g, os): (Factor, Factor, Factor),
    w: u64,
    m: usize,
) -> AmspCost {
    let r = mesh.ranks_per_node;
    let dp = mesh.dp();
    let w = w as f64;
    let mf = m as f64;
    let phi = model.params() as f64;
    let u = (BUCKET_ELEMS as f64) * w;
    let sp = p.size() as f64;
    let mut c = AmspCost::default();
    if p.size() > 1 {
        for (phi_u, k) in model.unit_sizes() {
            let v = w * phi_u as f64;
            let k = k as f64;
            c.t_p_gather +=
                mf * k * 2.0 * collective_us(links, r, Coll::AllGather, v, p.intra, p.inter);
            c.t_p_reduce +=
                mf * k * collective_us(links, r, Coll::ReduceScatter, v, p.intra, p.inter);
        }
    }
    let shard = w * phi / sp;
    let (gq, dq, oq) = (p.quotient(g), p.quotient(dp), p.quotient(os));
    if m > 1 {
        c.t_g = (mf - 1.0) * bucketed(links, r, shard, u, gq.intra, gq.inter);
    }
    c.t_os0 = bucketed(links, r, shard, u, dq.intra, dq.inter);
    let n_bc = (os.size() / p.size()) as f64;
    c.t_os1 = n_bc
        * collective_us(
            links,
            r,
            Coll::Broadcast,
            w * phi / os.size() as f64,
            oq.intra,
            oq.inter,
        );
    c
}

/// AMSP's recomputation setting (§VI-A4; module doc).
pub fn recompute_for(model: &ModelShape) -> bool {
    match model.name.as_str() {
        "llama-7b" | "llama-13b" => false,
        "llama-30b" => true,
        _ => model.params() >= 20_000_000_000,
    }
}

/// One configuration at one scale.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ScalePoint {
    /// Nodes (`R x nodes` GPUs).
    pub nodes: usize,
    /// Micro-batches per step at this scale.
    pub accum: usize,
    pub comm_time_us: f64,
    pub memory_bytes: u64,
    pub feasible: bool,
}

/// One ranked AMSP configuration: the candidate at the target scale and its points at
/// every scale it exists at (smallest first).
#[derive(Debug, Clone, PartialEq)]
pub struct AmspCandidate {
    pub candidate: Candidate,
    pub cost: AmspCost,
    pub scales: Vec<ScalePoint>,
    /// The objective: `Σ T_comm` over the scales of the range (module doc).
    pub objective_us: f64,
}

/// The scales `1, 2, 4, ..., N` (node counts dividing `n`, powers of two, and `n`).
pub fn scales(n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..usize::BITS)
        .map(|k| 1usize << k)
        .take_while(|&x| x < n)
        .filter(|x| n % x == 0)
        .collect();
    v.push(n);
    v
}

fn memory_at(req: &PlanRequest, s: &Strategy, mesh: Mesh, a: &ActivationInputs) -> MemoryBreakdown {
    let mut mem = memory::memory(&req.model, s, a, mesh.world());
    memory::add_overhead(&mut mem, req.overhead, s, mesh);
    mem.reserve = mem.reserve.saturating_add(req.extra_memory);
    mem
}

/// Relative tolerance under which two objectives are a tie (then less memory wins):
/// 0.1%, below the resolution of a profiled bandwidth curve (module doc).
pub const TIE: f64 = 1e-3;

/// Options of the AMSP mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmspOptions {
    /// The smallest scale, in nodes, at which the configuration must run (§VI-A4: 8 GPUs,
    /// one node). Scales are `from_nodes · 2^k` up to the cluster.
    pub from_nodes: usize,
}

impl Default for AmspOptions {
    fn default() -> Self {
        AmspOptions { from_nodes: 1 }
    }
}

/// Every AMSP configuration for `req`, ranked (module doc).
pub fn plan(req: &PlanRequest, opt: AmspOptions) -> Result<Vec<AmspCandidate>> {
    req.validate()?;
    let mesh = req.mesh();
    if opt.from_nodes == 0 || opt.from_nodes > mesh.nodes || mesh.nodes % opt.from_nodes != 0 {
        return config_err!(
            "the smallest scale ({} nodes) must divide the cluster's {} nodes",
            opt.from_nodes,
            mesh.nodes
        );
    }
    let links = &req.cluster.links;
    let w = req.dtype_bytes as u64;
    let recompute = req.recompute.unwrap_or_else(|| recompute_for(&req.model));
    let a = ActivationInputs {
        seq: req.seq as u64,
        micro_batch: req.micro_batch as u64,
        w,
        recompute,
        flash_attention: req.flash_attention,
    };
    let cap = req.usable_memory();
    let mut out = Vec::new();
    for (p, g, os) in search::amsp_triples(mesh) {
        let s = search::amsp_strategy(p, g, os);
        // It must exist at every scale of the range: its inter-node factors divide the
        // smallest one.
        if [p, g, os].iter().any(|f| opt.from_nodes % f.inter != 0) {
            continue;
        }
        let mut points = Vec::new();
        let mut target = None;
        for n in scales(mesh.nodes)
            .into_iter()
            .filter(|&n| n >= opt.from_nodes && n % opt.from_nodes == 0)
        {
            let msh = Mesh { nodes: n, ..mesh };
            let mut at = req.clone();
            at.cluster.nodes = n;
            let m = at.accum_steps();
            let c = cost(&req.model, links, msh, (p, g, os), w, m);
            let mem = memory_at(req, &s, msh, &a);
            points.push(ScalePoint {
                nodes: n,
                accum: m,
                comm_time_us: c.total(),
                memory_bytes: mem.total(),
                feasible: mem.total() <= cap,
            });
            if n == mesh.nodes {
                target = Some((c, mem, m));
            }
        }
        let Some((c, mem, m)) = target else {
            continue;
        };
        let worst = points
            .iter()
            .filter(|x| !x.feasible)
            .max_by_key(|x| x.memory_bytes);
        let feasible = worst.is_none();
        let why = worst.map(|x| {
            format!(
                "out of memory at {} GPUs: {} > {} ({}: params {}, grads {}, optimizer {}, activations {}, buffers {}, overhead {} at {} GPUs)",
                x.nodes * mesh.ranks_per_node,
                memory::gib(x.memory_bytes),
                memory::gib(cap),
                if recompute { "with recompute" } else { "no recompute" },
                memory::gib(mem.params),
                memory::gib(mem.grads),
                memory::gib(mem.optimizer),
                memory::gib(mem.activations),
                memory::gib(mem.buffers),
                memory::gib(mem.overhead()),
                mesh.world(),
            )
        });
        let mut strategy = s.clone();
        strategy.accum = m;
        let dash = |x: f64| if x > 0.0 { "ring" } else { "-" }.to_string();
        let candidate = Candidate {
            strategy,
            comm_time_us: c.total(),
            memory_bytes: points.iter().map(|x| x.memory_bytes).max().unwrap_or(0),
            feasible,
            why,
            recompute,
            phases: PhaseTimes {
                fwd_gather_us: c.t_p_gather / 2.0,
                bwd_gather_us: c.t_p_gather / 2.0,
                grad_reduce_us: c.t_p_reduce + c.t_g,
                boundary_us: c.t_os0,
                spread_us: c.t_os1,
            },
            algos: PhaseAlgoNames {
                fwd_gather: dash(c.t_p_gather),
                bwd_gather: dash(c.t_p_gather),
                grad_reduce: dash(c.t_p_reduce + c.t_g),
                boundary: dash(c.t_os0),
                spread: if c.t_os1 > 0.0 { "broadcast" } else { "-" }.to_string(),
            },
            memory: mem,
        };
        let objective_us = points.iter().map(|x| x.comm_time_us).sum();
        out.push(AmspCandidate {
            candidate,
            cost: c,
            scales: points,
            objective_us,
        });
    }
    Ok(rank(out))
}

/// Feasible first: repeatedly the least-memory configuration among those within
/// [`TIE`] of the cheapest remaining objective (name breaks exact ties); then the
/// infeasible ones by memory.
fn rank(mut rest: Vec<AmspCandidate>) -> Vec<AmspCandidate> {
    let mut out = Vec::with_capacity(rest.len());
    rest.sort_by(|a, b| a.candidate.strategy.name.cmp(&b.candidate.strategy.name));
    loop {
        let best = rest
            .iter()
            .filter(|c| c.candidate.feasible)
            .map(|c| c.objective_us)
            .min_by(|a, b| a.total_cmp(b));
        let Some(best) = best else { break };
        let pick = rest
            .iter()
            .enumerate()
            .filter(|(_, c)| c.candidate.feasible && c.objective_us <= best * (1.0 + TIE))
            .min_by(|(_, a), (_, b)| {
                a.candidate
                    .memory_bytes
                    .cmp(&b.candidate.memory_bytes)
                    .then(a.objective_us.total_cmp(&b.objective_us))
            })
            .map(|(i, _)| i);
        match pick {
            Some(i) => out.push(rest.remove(i)),
            None => break,
        }
    }
    rest.sort_by(|a, b| {
        a.candidate
            .memory_bytes
            .cmp(&b.candidate.memory_bytes)
            .then(a.objective_us.total_cmp(&b.objective_us))
    });
    out.extend(rest);
    out
}
