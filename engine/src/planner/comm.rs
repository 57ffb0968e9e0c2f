//! The communication model: every collective the runtime issues per training step,
//! timed by strata's simulator on the modeled cluster.
//!
//! Per step, with `w` bytes per element, `M` micro-batches, units `u` of `Φ_u`
//! parameters (AMSP §IV-C; PaRO §3.4-3.5; MiCS §3.4; ZeRO++ B.2-B.3):
//!
//! | phase | when | collective |
//! |---|---|---|
//! | fwd gather | M·Σ_u, if s_p > 1 | AG of `w·Φ_u` over P (qwZ: packed int8/int4 + f32 scale per 256) |
//! | bwd gather | M·Σ_u, if s_p > 1 | AG of `w·Φ_u` over hpZ if set, else over P |
//! | grad reduce | M·Σ_u | RS of `w·Φ_u` over P (s_p > 1; qgZ packed); then if s_g > s_p: `rs`: RS of `w·Φ_u/s_p` over G/P, `ar`: (M-1)·AR of `w·Φ_u/s_p` over G/P (AMSP `T_g`) |
//! | boundary | once | `rs`: RS of `w·Φ/s_g` over OS/G (s_os > s_g), then AR of `w·Φ/s_os` over the s_dp/s_os replicas (MiCS 2-hop); `ar`: AR of `w·Φ/s_p` over the s_dp/s_p ranks holding one P shard (AMSP `T_os⁰`) |
//! | spread | once | AG of `w·Φ/s_p` in total over OS/P (AMSP `T_os¹`, an all-gather since shards are even) |
//!
//! so `T_comm = T_fwd + T_bwd + T_grad + T_boundary + T_spread`, AMSP eq. 1's sum
//! `T_p + T_g + T_os⁰ + T_os¹` with `T_p = M·L·Σ_i (2·t(AG, 2Φ_i, s_p) + t(RS, 2Φ_i, s_p))`.
//! Per-micro-batch phases run per unit (AMSP: "at the granularity of a module");
//! boundary and spread run once per step on the rank's whole shard as one flat buffer
//! (AMSP's bucket U = the shard; bucketing per unit would add each collective's
//! per-step latencies once per unit, which on 1024 ranks dominates).
//!
//! Collective times `t(op, bytes, a x b)` replace AMSP's profiled effective bandwidth
//! (§IV-A, `t(o, v, p⁰ × p¹) = v / w(o, v, p⁰ × p¹)`) with strata's simulator: a group of
//! `a` ranks in each of `b` nodes (all groups of one kind run at once) is modeled as a
//! topology of `b` nodes x `a` ranks ([`group_topology`]): the cluster's link figures,
//! the members' own package structure (a group strided across packages talks over
//! `intra_node` links), and each rank's share of its node's NICs unchanged: where ranks
//! of different concurrent groups share a NIC, the group's NICs get the fraction of
//! their bandwidth its members hold (exact for one NIC per rank, as on DGX; a static
//! fair share of a FIFO-shared NIC otherwise). That topology's schedule (the
//! `strata::sim::dry_run` plans of the resolved algorithm; `auto` resolved by
//! `strata::sim::resolve`, i.e. the alpha-beta rule the runtime applies) is replayed on
//! node 0 only ([`strata::sim::symmetric`], exact by node symmetry) and cached per (op,
//! algorithm, count, element size, group topology), since the same collectives repeat
//! across units and candidates.
//!
//! Quantized collectives (qwZ, qgZ) are not modeled by the simulator's dry run; they
//! are modeled as the unquantized collective on the quantized byte count: packed
//! slices of `P(c) = 4·⌈c/256⌉ + c·bits/8` bytes per rank (strata's wire format,
//! `docs/quantization.md`) under `hier` (ring where the group spans one level), which
//! is what strata's `qwz` runs, and for `qgz` the same per-link volumes as ZeRO++'s
//! 2-hop all-to-all (intra `(k-1)·n·P(c)`, inter `(n-1)·P(c)` per rank, ZeRO++ E.3:
//! the hierarchical reduce-scatter moves exactly these); `qgz-1hop` as a flat ring of
//! `P(c)`. Their quantization kernels add their time from measured rates
//! ([`super::kernels`]: bytes over each kernel's GB/s; [`CommModel::with_kernel_rates`]).
//! Counts are rounded up to whole elements per rank (all-reduce: to a multiple of the
//! group size).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use strata::check::Kind;
use strata::kernels::QuantSpec;
use strata::topology::Topology;
use strata::{Algo, DataType};

use super::models::ModelShape;
use crate::config::{Factor, GradSync, Mesh, Strategy};
use crate::error::{Error, Result};
use strata::sim::symmetric_makespan;

/// A group kind: `a` ranks in each of `b` nodes, the ranks of one node `stride` local
/// indices apart (1 for an aligned block; `Y.intra` for the sub-group X/Y of ranks
/// holding the same Y shard).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupShape {
    pub a: usize,
    pub b: usize,
    pub stride: usize,
}

impl GroupShape {
    /// The aligned groups of factor `f`.
    pub fn block(f: Factor) -> GroupShape {
        GroupShape {
            a: f.intra,
            b: f.inter,
            stride: 1,
        }
    }

    /// Sub-group `X/Y`: the ranks of one X group holding the same Y shard, factor
    /// `(X.intra/Y.intra) x (X.inter/Y.inter)`, `Y.intra` apart.
    pub fn sub(x: Factor, y: Factor) -> GroupShape {
        let q = y.quotient(x);
        GroupShape {
            a: q.intra,
            b: q.inter,
            stride: y.intra,
        }
    }

    /// Ranks in the group.
    pub fn size(self) -> usize {
        self.a * self.b
    }
}

/// Per-phase communication time of one step, microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseTimes {
    pub fwd_gather_us: f64,
    pub bwd_gather_us: f64,
    pub grad_reduce_us: f64,
    pub boundary_us: f64,
    pub spread_us: f64,
}

impl PhaseTimes {
    /// `T_comm`: the sum (AMSP eq. 1).
    pub fn total(&self) -> f64 {
        self.fwd_gather_us
            + self.bwd_gather_us
            + self.grad_reduce_us
            + self.boundary_us
            + self.spread_us
    }
}

/// The algorithm each phase resolved to (for its largest unit), `-` where the phase
/// moves nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseAlgoNames {
    pub fwd_gather: String,
    pub bwd_gather: String,
    pub grad_reduce: String,
    pub boundary: String,
    pub spread: String,
}

/// The topology modeling one group of `g` on `cluster` (module doc): `g.b` nodes of
/// `g.a` ranks, packages as the members' local indices `0, stride, 2·stride, ...`
/// fall into the cluster's packages, link figures of the cluster, and NICs such that
/// each member keeps its share: with `F >= R` NICs per node (`R` ranks), `a·F/R` NICs
/// of the cluster's bandwidth; with fewer, `a/m` NICs at `bw·m/k` where `m` members
/// share one cluster NIC of `k` ranks.
pub fn group_topology(cluster: &Topology, g: GroupShape) -> Result<Topology> {
    let r = cluster.ranks_per_node().max(1);
    let d = cluster.ranks_per_package().max(1);
    if g.a == 0 || g.b == 0 || g.stride == 0 || (g.a - 1) * g.stride >= r || g.b > cluster.nodes {
        return Err(Error::Config(format!(
            "group {}x{} (stride {}) does not fit {} ranks per node x {} nodes",
            g.a, g.b, g.stride, r, cluster.nodes
        )));
    }
    let locals: Vec<usize> = (0..g.a).map(|j| j * g.stride).collect();
    // Members per package: the run length of equal packages (regular by construction
    // for power-of-two shapes; otherwise every member is its own package).
    let first = locals.iter().take_while(|&&l| l / d == 0).count().max(1);
    let regular = g.a % first == 0
        && locals
            .chunks(first)
            .all(|c| c.iter().all(|&l| l / d == c[0] / d))
        && locals
            .chunks(first)
            .map(|c| c[0] / d)
            .collect::<Vec<_>>()
            .windows(2)
            .all(|w| w[0] != w[1]);
    let (pkgs, dies) = if regular {
        (g.a / first, first)
    } else {
        (g.a, 1)
    };
    let mut links = cluster.links.clone();
    let f = links.nics_per_node.max(1);
    let (nics, nic_bw) = if f >= r {
        (g.a * (f / r), links.nic_bandwidth_gbs)
    } else {
        let nic = |l: usize| (l * f / r).min(f - 1);
        let k = (0..r).filter(|&l| nic(l) == 0).count().max(1);
        let m = locals.iter().filter(|&&l| nic(l) == nic(0)).count().max(1);
        if g.a % m == 0 {
            (g.a / m, links.nic_bandwidth_gbs * m as f64 / k as f64)
        } else {
            (g.a, links.nic_bandwidth_gbs / k as f64)
        }
    };
    links.nics_per_node = nics.max(1);
    links.nic_bandwidth_gbs = nic_bw;
    links.inter_node.bandwidth_gbs = links.nics_per_node as f64 * nic_bw / g.a as f64;
    let t = Topology {
        name: format!("{}[{}x{}/{}]", cluster.name, g.a, g.b, g.stride),
        nodes: g.b,
        packages_per_node: pkgs,
        dies_per_package: dies,
        switch_of_node: None,
        links,
        measured: cluster.measured.clone(),
    };
    t.validate()?;
    Ok(t)
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    kind: u8,
    algo: Algo,
    count: usize,
    elem: usize,
    nodes: usize,
    pkgs: usize,
    dies: usize,
    nics: usize,
    nic_bw: u64,
}

/// One collective call to time: `bytes` of the larger buffer (all-gather output,
/// reduce-scatter input, all-reduce buffer) in elements of `elem` bytes, or a
/// quantized one.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Call {
    Plain {
        kind: Kind,
        algo: Algo,
        elems: u64,
        elem: usize,
    },
    /// qwZ all-gather (`kind` AllGather) or qgZ reduce-scatter of `elems` elements of
    /// `elem` bytes in total, `bits` per code, `flat` for the 1-hop variant.
    Quant {
        kind: Kind,
        elems: u64,
        elem: usize,
        bits: u8,
        flat: bool,
    },
}

/// Times collectives on one cluster, with a cache (module doc).
pub struct CommModel {
    cluster: Topology,
    mesh: Mesh,
    groups: HashMap<GroupShape, Topology>,
    cache: HashMap<Key, (Algo, f64)>,
    kernels: super::kernels::KernelRates,
    /// Schedules actually simulated (cache misses).
    pub simulated: usize,
    /// Collective times answered from the cache.
    pub hits: usize,
}

fn kind_id(k: Kind) -> u8 {
    match k {
        Kind::AllGather => 0,
        Kind::ReduceScatter => 1,
        Kind::AllReduce => 2,
        Kind::AllToAll => 3,
        Kind::Broadcast { .. } => 4,
    }
}

fn dtype_of(elem: usize) -> Result<DataType> {
    match elem {
        1 => Ok(DataType::U8),
        2 => Ok(DataType::BF16),
        4 => Ok(DataType::F32),
        _ => Err(Error::Config(format!(
            "element size {elem} bytes: the planner models 2 (bf16) or 4 (f32)"
        ))),
    }
}

impl CommModel {
    /// A model of `cluster` (validated).
    pub fn new(cluster: &Topology) -> Result<CommModel> {
        cluster.validate()?;
        Ok(CommModel {
            cluster: cluster.clone(),
            mesh: Mesh::of(cluster),
            groups: HashMap::new(),
            cache: HashMap::new(),
            kernels: super::kernels::KernelRates::default(),
            simulated: 0,
            hits: 0,
        })
    }

    /// The quantization kernels' rates quantized collectives are charged with (default
    /// [`super::kernels::KernelRates::h200`]).
    pub fn with_kernel_rates(mut self, rates: super::kernels::KernelRates) -> Result<CommModel> {
        rates.validate().map_err(Error::Config)?;
        self.kernels = rates;
        Ok(self)
    }

    /// The cluster's mesh.
    pub fn mesh(&self) -> Mesh {
        self.mesh
    }

    fn topo(&mut self, g: GroupShape) -> Result<&Topology> {
        if !self.groups.contains_key(&g) {
            let t = group_topology(&self.cluster, g)?;
            self.groups.insert(g, t);
        }
        self.groups
            .get(&g)
            .ok_or_else(|| Error::Config("group topology cache".into()))
    }

    /// Resolved algorithm and time (us) of one `kind` collective with NCCL's per-call
    /// `count` of `elem`-byte elements under `algo` on one group of shape `g`.
    pub fn collective(
        &mut self,
        kind: Kind,
        algo: Algo,
        count: usize,
        elem: usize,
        g: GroupShape,
    ) -> Result<(Algo, f64)> {
        if g.size() <= 1 || count == 0 {
            return Ok((Algo::Ring, 0.0));
        }
        let dtype = dtype_of(elem)?;
        self.topo(g)?;
        let Some(topo) = self.groups.get(&g) else {
            return Err(Error::Config("group topology cache".into()));
        };
        let mut key = Key {
            kind: kind_id(kind),
            algo,
            count,
            elem,
            nodes: topo.nodes,
            pkgs: topo.packages_per_node,
            dies: topo.dies_per_package,
            nics: topo.links.nics_per_node,
            nic_bw: topo.links.nic_bandwidth_gbs.to_bits(),
        };
        // As requested (skips resolving again), then as resolved (shared by `auto` and
        // the algorithm it picks).
        if let Some(&v) = self.cache.get(&key) {
            self.hits += 1;
            return Ok(v);
        }
        let call = strata::sim::Call::new(topo, kind, algo, count, dtype);
        let resolved = strata::sim::resolve(&call)?;
        let requested = key.clone();
        key.algo = resolved;
        let v = match self.cache.get(&key) {
            Some(&v) => {
                self.hits += 1;
                v
            }
            None => {
                let v = symmetric_makespan(&strata::sim::Call {
                    algo: resolved,
                    ..call
                })?;
                self.simulated += 1;
                self.cache.insert(key, v);
                v
            }
        };
        self.cache.insert(requested, v);
        Ok(v)
    }

    fn call(&mut self, c: Call, g: GroupShape) -> Result<(Algo, f64)> {
        let p = g.size().max(1) as u64;
        match c {
            Call::Plain {
                kind,
                algo,
                elems,
                elem,
            } => {
                let count = match kind {
                    Kind::AllReduce => elems.div_ceil(p) * p,
                    _ => elems.div_ceil(p),
                };
                self.collective(kind, algo, count as usize, elem, g)
            }
            Call::Quant {
                kind,
                elems,
                elem,
                bits,
                flat,
            } => {
                let q = QuantSpec::new(bits as u32, 256)?;
                let c = elems.div_ceil(p);
                let packed = q.packed_len(c as usize);
                let algo = if flat { Algo::Ring } else { Algo::Hier };
                let (_, wire) = self.collective(kind, algo, packed, 1, g)?;
                let gather = kind == Kind::AllGather;
                let t = wire
                    + self.kernels.collective_us(
                        gather,
                        flat,
                        c,
                        packed as u64,
                        elem,
                        bits,
                        g.a as u64,
                        g.b as u64,
                    );
                let name = if kind == Kind::AllGather {
                    Algo::Qwz
                } else if flat {
                    Algo::Qgz1
                } else {
                    Algo::Qgz
                };
                Ok((name, t))
            }
        }
    }

    /// Time `c` on groups of shape `g`, `times` times: add it to `us`, and note the
    /// algorithm it resolved to in `name` where it takes any time.
    fn add(
        &mut self,
        c: Call,
        g: GroupShape,
        times: f64,
        us: &mut f64,
        name: &mut String,
    ) -> Result<()> {
        let (a, x) = self.call(c, g)?;
        *us += times * x;
        if x > 0.0 {
            note(name, a);
        }
        Ok(())
    }

    /// Per-phase times of one step of `s` (module doc table) for `model` with `w`
    /// bytes per element and `m` micro-batches, and the algorithm each phase resolved to.
    pub fn phase_times(
        &mut self,
        model: &ModelShape,
        s: &Strategy,
        w: usize,
        m: usize,
    ) -> Result<(PhaseTimes, PhaseAlgoNames)> {
        s.validate(self.mesh)?;
        let mesh = self.mesh;
        let dp = mesh.dp();
        let (sp, sg, sos) = (s.p.size() as u64, s.g.size() as u64, s.os.size() as u64);
        let mf = m as f64;
        let mut t = PhaseTimes::default();
        let mut names = PhaseAlgoNames::default();
        let dash = || "-".to_string();
        names.fwd_gather = dash();
        names.bwd_gather = dash();
        names.grad_reduce = dash();
        names.boundary = dash();
        names.spread = dash();
        let plain = |kind: Kind, algo: Algo, elems: u64| -> Call {
            // Quantized names on phases that cannot quantize fall back to `auto`.
            let algo = match algo {
                Algo::Qwz | Algo::Qgz | Algo::Qgz1 => Algo::Auto,
                a => a,
            };
            Call::Plain {
                kind,
                algo,
                elems,
                elem: w,
            }
        };
        for (phi_u, mult) in model.unit_sizes() {
            let k = mult as f64;
            if sp > 1 {
                // A parameter all-gather (qwZ when the phase's algorithm is qwz).
                let gather = |algo: Algo| {
                    if algo == Algo::Qwz {
                        Call::Quant {
                            kind: Kind::AllGather,
                            elems: phi_u,
                            elem: w,
                            bits: s.qwz_bits.unwrap_or(8),
                            flat: false,
                        }
                    } else {
                        plain(Kind::AllGather, algo, phi_u)
                    }
                };
                // fwd gather over P.
                let pg = GroupShape::block(s.p);
                self.add(
                    gather(s.algos.fwd_gather),
                    pg,
                    mf * k,
                    &mut t.fwd_gather_us,
                    &mut names.fwd_gather,
                )?;
                // bwd gather over hpZ (ZeRO++ B.2) or P.
                let bg = GroupShape::block(s.hpz.unwrap_or(s.p));
                self.add(
                    gather(s.algos.bwd_gather),
                    bg,
                    mf * k,
                    &mut t.bwd_gather_us,
                    &mut names.bwd_gather,
                )?;
                // grad reduce hop 1 over P (qgZ when the phase's algorithm is qgz).
                let c = match s.algos.grad_reduce {
                    Algo::Qgz | Algo::Qgz1 => Call::Quant {
                        kind: Kind::ReduceScatter,
                        elems: phi_u,
                        elem: w,
                        bits: s.qgz_bits.unwrap_or(4),
                        flat: s.algos.grad_reduce == Algo::Qgz1,
                    },
                    a => plain(Kind::ReduceScatter, a, phi_u),
                };
                self.add(c, pg, mf * k, &mut t.grad_reduce_us, &mut names.grad_reduce)?;
            }
            if sg > sp {
                // hop 2 over G/P: reduce-scatter every micro-batch (PaRO §3.4, MiCS §3.4)
                // or AMSP's all-reduce on all but the last (T_g, §IV-C3).
                let gp = GroupShape::sub(s.g, s.p);
                let elems = phi_u.div_ceil(sp);
                let (kind, reps) = match s.sync {
                    GradSync::ReduceScatter => (Kind::ReduceScatter, mf),
                    GradSync::AllReduce => (Kind::AllReduce, mf - 1.0),
                };
                if reps > 0.0 {
                    self.add(
                        plain(kind, s.algos.grad_reduce, elems),
                        gp,
                        reps * k,
                        &mut t.grad_reduce_us,
                        &mut names.grad_reduce,
                    )?;
                }
            }
        }
        // Once per step, on the whole shard as one flat buffer.
        let phi = model.params();
        match s.sync {
            GradSync::ReduceScatter => {
                if sos > sg {
                    let og = GroupShape::sub(s.os, s.g);
                    let c = plain(Kind::ReduceScatter, s.algos.boundary, phi.div_ceil(sg));
                    self.add(c, og, 1.0, &mut t.boundary_us, &mut names.boundary)?;
                }
                if s.os != dp {
                    let rg = GroupShape::sub(dp, s.os);
                    let c = plain(Kind::AllReduce, s.algos.boundary, phi.div_ceil(sos));
                    self.add(c, rg, 1.0, &mut t.boundary_us, &mut names.boundary)?;
                }
            }
            GradSync::AllReduce => {
                if s.p != dp {
                    let rg = GroupShape::sub(dp, s.p);
                    let c = plain(Kind::AllReduce, s.algos.boundary, phi.div_ceil(sp));
                    self.add(c, rg, 1.0, &mut t.boundary_us, &mut names.boundary)?;
                }
            }
        }
        if sos > sp {
            let op = GroupShape::sub(s.os, s.p);
            let c = plain(Kind::AllGather, s.algos.spread, phi.div_ceil(sp));
            self.add(c, op, 1.0, &mut t.spread_us, &mut names.spread)?;
        }
        Ok((t, names))
    }
}

/// Add `a` to the `+`-joined algorithm names of a phase (`-`: none yet).
fn note(slot: &mut String, a: Algo) {
    if slot == "-" {
        *slot = a.name().to_string();
    } else if !slot.split('+').any(|x| x == a.name()) {
        slot.push('+');
        slot.push_str(a.name());
    }
}
