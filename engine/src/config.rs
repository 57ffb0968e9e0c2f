//! The configuration space: every sharding strategy of the papers as one point.
//!
//! AMSP §IV-B generalized: parameters (P), gradients (G) and optimizer states (OS) are
//! each sharded over a device mesh `s = s⁰ × s¹` ([`Factor`]: `s⁰` ranks within a node
//! × `s¹` nodes) and replicated across the other ranks. Groups are aligned blocks: the
//! P group of the rank at (node n, local index l) is the local indices
//! `⌊l/s⁰⌋·s⁰ .. +s⁰` of the nodes `⌊n/s¹⌋·s¹ .. +s¹`. On a topology with packages
//! (Frontier: 2 GCDs per MI250X) local indices are package-major, so `2x1` is exactly
//! one package: the mesh is 3-D without a third number.
//!
//! The dependency rule (AMSP eqs 3-6): `s_p⁰ ≤ s_g⁰ ≤ s_os⁰ ≤ R` and
//! `s_p¹ ≤ s_g¹ ≤ s_os¹ ≤ N`, each factor dividing the next (and R, N), so that a rank's
//! OS shard lies inside its G shard, which lies inside its P shard: no rank ever holds
//! gradients or optimizer states for parameters it does not hold (AMSP Fig. 4).
//!
//! Presets (expanded for R ranks per node and N nodes; [`Strategy::parse`]):
//!
//! | preset | p | g | os | paper |
//! |---|---|---|---|---|
//! | `dp` | 1x1 | 1x1 | 1x1 | plain data parallelism (the baseline) |
//! | `zero1` | 1x1 | 1x1 | RxN | ZeRO-1 (AMSP Table IV; PaRO Table 1) |
//! | `zero2` | 1x1 | RxN | RxN | ZeRO-2 (PaRO Table 1) |
//! | `zero3` | RxN | RxN | RxN | ZeRO-3 / FSDP (AMSP Table IV) |
//! | `mics:K` | K | K | K | MiCS §3.2 partition group of K ranks (K ≤ R: Kx1, else Rx(K/R)); 2-hop sync §3.4 |
//! | `zeropp` | RxN | RxN | RxN | ZeRO++: hpZ secondary Rx1 (B.2), qwZ int8 (B.1), qgZ int4 (B.3) |
//! | `paro-igg` | Rx1 | RxN | RxN | PaRO §3.5, group = node |
//! | `paro-iig` | Rx1 | Rx1 | RxN | PaRO §3.5 |
//! | `paro-nig` | 1x1 | Rx1 | RxN | PaRO §3.5 |
//! | `frontier-topo` | Dx1 | Rx1 | RxN | Frontier §V: weights over a GCD pair (D dies per package), gradients in a node, OS global |
//! | `amsp:p=AxB,g=CxD,os=ExF` | AxB | CxD | ExF | AMSP §IV-B, all-reduce + select & drop |
//!
//! Options follow a preset after commas: `hpz=AxB|off`, `qwz=4|8|off`, `qgz=4|8|off`,
//! `qblock=K` (elements per quantization scale, default 256),
//! `algo=A` (every phase), `fwd=A`, `bwd=A`, `grad=A`, `boundary=A`, `spread=A`
//! (A: ring, log-step, hier, hier-ring, hier-log, ho-ring, auto; fwd also qwz, grad
//! also qgz), `sync=rs|ar`,
//! `accum=K`. Example: `zeropp,qgz=8,hpz=4x1`, `zero3,algo=hier`.

use crate::error::{config_err, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use strata::{Algo, Topology};

/// The lossless algorithms every phase takes.
const EXACT: &[Algo] = &Algo::LOSSLESS;

/// A sharding factor `intra x inter`: shard over `intra` ranks of a node times `inter`
/// nodes (AMSP's `s⁰ × s¹`); 1x1 is full replication.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Factor {
    pub intra: usize,
    pub inter: usize,
}

impl Factor {
    /// `intra x inter`.
    pub const fn new(intra: usize, inter: usize) -> Factor {
        Factor { intra, inter }
    }
    /// No sharding.
    pub const ONE: Factor = Factor::new(1, 1);
    /// Ranks the tensor is sharded over.
    pub fn size(self) -> usize {
        self.intra * self.inter
    }
    /// Parse `"AxB"` (or a bare `"A"` meaning `Ax1`).
    pub fn parse(s: &str) -> Result<Factor> {
        let t = s.trim();
        let (a, b) = match t.split_once(['x', 'X']) {
            Some((a, b)) => (a, b),
            None => (t, "1"),
        };
        match (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
            (Ok(a), Ok(b)) if a >= 1 && b >= 1 => Ok(Factor::new(a, b)),
            _ => config_err!(
                "bad sharding factor '{s}': expected AxB with A ranks within a node and B nodes, both >= 1 (e.g. 8x1)"
            ),
        }
    }
    /// True when `self` divides `other` in both dimensions (a subgroup of it).
    pub fn divides(self, other: Factor) -> bool {
        other.intra % self.intra == 0 && other.inter % self.inter == 0
    }
    /// `other / self` per dimension (`self` must divide `other`).
    pub fn quotient(self, other: Factor) -> Factor {
        Factor::new(other.intra / self.intra, other.inter / self.inter)
    }
}

impl fmt::Display for Factor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.intra, self.inter)
    }
}

/// The cluster shape strategies are expanded for: R ranks per node (package-major), N
/// nodes, D ranks per package.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mesh {
    pub ranks_per_node: usize,
    pub nodes: usize,
    pub ranks_per_package: usize,
}

impl Mesh {
    /// `R x N` with one die per package.
    pub fn new(ranks_per_node: usize, nodes: usize) -> Mesh {
        Mesh {
            ranks_per_node,
            nodes,
            ranks_per_package: 1,
        }
    }
    /// The mesh of a strata topology.
    pub fn of(t: &Topology) -> Mesh {
        Mesh {
            ranks_per_node: t.ranks_per_node(),
            nodes: t.nodes,
            ranks_per_package: t.ranks_per_package(),
        }
    }
    /// All ranks.
    pub fn world(self) -> usize {
        self.ranks_per_node * self.nodes
    }
    /// The data-parallel factor `R x N` (`s_dp`).
    pub fn dp(self) -> Factor {
        Factor::new(self.ranks_per_node, self.nodes)
    }
}

/// How gradients sharded wider than parameters are synchronized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GradSync {
    /// Reduce-scatter hops (PaRO §3.4, MiCS §3.4): per micro-batch P group then G/P
    /// subgroup; at the boundary G→OS reduce-scatter and an all-reduce across replicas.
    ReduceScatter,
    /// AMSP §IV-C: all-reduce over the G/P subgroup in every micro-batch but the last,
    /// keeping only this rank's G shard (select & drop); at the boundary one all-reduce
    /// of the P shard over the s_dp/s_p ranks holding it, then select the OS shard.
    AllReduce,
}

impl GradSync {
    /// `rs` or `ar`.
    pub fn name(self) -> &'static str {
        match self {
            GradSync::ReduceScatter => "rs",
            GradSync::AllReduce => "ar",
        }
    }
}

/// The collective algorithm of each communication phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseAlgos {
    /// Forward parameter all-gather (qwz allowed).
    pub fwd_gather: Algo,
    /// Backward parameter all-gather (from the hpZ secondary shard where there is one).
    pub bwd_gather: Algo,
    /// Per-micro-batch gradient reduce-scatter (qgz allowed).
    pub grad_reduce: Algo,
    /// Accumulation-boundary reduce-scatter / all-reduce.
    pub boundary: Algo,
    /// Spreading updated parameters over the OS group.
    pub spread: Algo,
}

impl PhaseAlgos {
    /// The same algorithm everywhere.
    pub fn all(a: Algo) -> PhaseAlgos {
        PhaseAlgos {
            fwd_gather: a,
            bwd_gather: a,
            grad_reduce: a,
            boundary: a,
            spread: a,
        }
    }
}

/// One point of the configuration space.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Strategy {
    /// The preset (with options) it came from, or `custom`.
    pub name: String,
    /// Parameter sharding factor `s_p`.
    pub p: Factor,
    /// Gradient sharding factor `s_g`.
    pub g: Factor,
    /// Optimizer-state sharding factor `s_os`.
    pub os: Factor,
    /// ZeRO++ hpZ: after the forward all-gather each rank keeps the slice of the unit's
    /// parameters owned by its position in this (smaller) group, and the backward
    /// gathers over this group only. Must divide `p`.
    pub hpz: Option<Factor>,
    /// ZeRO++ qwZ: bits of the quantized forward all-gather.
    pub qwz_bits: Option<u8>,
    /// ZeRO++ qgZ: bits of the quantized gradient reduce-scatter.
    pub qgz_bits: Option<u8>,
    /// Elements per quantization scale of qwZ / qgZ (strata's block format).
    pub quant_block: usize,
    /// Gradient synchronization scheme.
    pub sync: GradSync,
    /// Algorithm per phase.
    pub algos: PhaseAlgos,
    /// Micro-batches per step (gradient accumulation steps).
    pub accum: usize,
}

/// Every preset name, for messages and the planner.
pub const PRESETS: &[&str] = &[
    "dp",
    "zero1",
    "zero2",
    "zero3",
    "mics:K",
    "zeropp",
    "paro-igg",
    "paro-iig",
    "paro-nig",
    "frontier-topo",
    "amsp:p=AxB,g=CxD,os=ExF",
    "auto",
];

fn parse_algo(key: &str, v: &str) -> Result<Algo> {
    v.parse::<Algo>()
        .map_err(|e| crate::error::Error::Config(format!("option {key}={v}: {e}")))
}

fn parse_bits(key: &str, v: &str) -> Result<Option<u8>> {
    match v {
        "off" | "none" | "0" => Ok(None),
        "4" => Ok(Some(4)),
        "8" => Ok(Some(8)),
        _ => config_err!("option {key}={v}: bits must be 4, 8 or off"),
    }
}

impl Strategy {
    /// A strategy with the given factors, reduce-scatter sync, `auto` everywhere, no
    /// quantization, one micro-batch.
    pub fn custom(name: &str, p: Factor, g: Factor, os: Factor) -> Strategy {
        Strategy {
            name: name.to_string(),
            p,
            g,
            os,
            hpz: None,
            qwz_bits: None,
            qgz_bits: None,
            quant_block: 256,
            sync: GradSync::ReduceScatter,
            algos: PhaseAlgos::all(Algo::Auto),
            accum: 1,
        }
    }

    /// Expand `spec` (`PRESET[:ARG][,key=value...]`, table in the module doc) for `mesh`
    /// and validate it. `auto` is the planner's and is refused here.
    pub fn parse(spec: &str, mesh: Mesh) -> Result<Strategy> {
        let spec = spec.trim();
        let (r, n) = (mesh.ranks_per_node, mesh.nodes);
        let all = mesh.dp();
        // `amsp:` takes its own comma-separated factors first.
        let mut parts: Vec<&str> = spec.split(',').map(str::trim).collect();
        let head = parts.remove(0);
        let (preset, arg) = match head.split_once(':') {
            Some((a, b)) => (a.trim().to_ascii_lowercase(), Some(b.trim())),
            None => (head.to_ascii_lowercase(), None),
        };
        let mut s = match preset.as_str() {
            "dp" | "ddp" => {
                let mut s = Strategy::custom("dp", Factor::ONE, Factor::ONE, Factor::ONE);
                s.sync = GradSync::AllReduce;
                s
            }
            "zero1" => {
                let mut s = Strategy::custom("zero1", Factor::ONE, Factor::ONE, all);
                s.sync = GradSync::AllReduce;
                s
            }
            "zero2" => Strategy::custom("zero2", Factor::ONE, all, all),
            "zero3" | "fsdp" => Strategy::custom("zero3", all, all, all),
            "mics" => {
                let k: usize = match arg.map(str::parse) {
                    Some(Ok(k)) if k >= 1 => k,
                    _ => {
                        return config_err!(
                            "mics needs a partition group size: mics:K (e.g. mics:8)"
                        )
                    }
                };
                let f = if k <= r {
                    Factor::new(k, 1)
                } else if k % r == 0 {
                    Factor::new(r, k / r)
                } else {
                    return config_err!(
                        "mics:{k}: a partition group larger than a node ({r} ranks) must be whole nodes (a multiple of {r})"
                    );
                };
                let mut s = Strategy::custom(&format!("mics:{k}"), f, f, f);
                s.algos = PhaseAlgos::all(Algo::Hier);
                s
            }
            "zeropp" | "zero++" => {
                let mut s = Strategy::custom("zeropp", all, all, all);
                s.hpz = Some(Factor::new(r, 1));
                s.qwz_bits = Some(8);
                s.qgz_bits = Some(4);
                s
            }
            "paro-igg" => paro("paro-igg", Factor::new(r, 1), all, all),
            "paro-iig" => paro("paro-iig", Factor::new(r, 1), Factor::new(r, 1), all),
            "paro-nig" => paro("paro-nig", Factor::ONE, Factor::new(r, 1), all),
            "frontier-topo" | "frontier" => {
                let d = mesh.ranks_per_package.max(1);
                Strategy::custom("frontier-topo", Factor::new(d, 1), Factor::new(r, 1), all)
            }
            "amsp" => {
                // amsp:p=AxB,g=CxD,os=ExF: the factors are the first options.
                let mut fs = [None, None, None];
                let mut items: Vec<&str> = arg.into_iter().collect();
                items.extend(parts.iter().copied());
                let mut rest = Vec::new();
                for it in items {
                    match it.split_once('=') {
                        Some(("p", v)) => fs[0] = Some(Factor::parse(v)?),
                        Some(("g", v)) => fs[1] = Some(Factor::parse(v)?),
                        Some(("os", v)) => fs[2] = Some(Factor::parse(v)?),
                        _ => rest.push(it),
                    }
                }
                parts = rest;
                let [Some(p), Some(g), Some(os)] = fs else {
                    return config_err!("amsp needs all three factors: amsp:p=AxB,g=CxD,os=ExF");
                };
                let mut s = Strategy::custom("amsp", p, g, os);
                s.sync = GradSync::AllReduce;
                s
            }
            "auto" => {
                return config_err!(
                    "`auto` is chosen by the planner (strata_engine::planner), not expanded here"
                )
            }
            other => {
                return config_err!(
                    "unknown strategy '{other}'; presets: {}",
                    PRESETS.join(", ")
                )
            }
        };
        let _ = n;
        for opt in parts.iter().filter(|o| !o.is_empty()) {
            let Some((k, v)) = opt.split_once('=') else {
                return config_err!("option '{opt}' is not key=value");
            };
            let (k, v) = (k.trim(), v.trim());
            match k {
                "hpz" => {
                    s.hpz = match v {
                        "off" | "none" => None,
                        _ => Some(Factor::parse(v)?),
                    }
                }
                "qwz" => s.qwz_bits = parse_bits(k, v)?,
                "qgz" => s.qgz_bits = parse_bits(k, v)?,
                "algo" => s.algos = PhaseAlgos::all(parse_algo(k, v)?),
                "fwd" => s.algos.fwd_gather = parse_algo(k, v)?,
                "bwd" => s.algos.bwd_gather = parse_algo(k, v)?,
                "grad" => s.algos.grad_reduce = parse_algo(k, v)?,
                "boundary" => s.algos.boundary = parse_algo(k, v)?,
                "spread" => s.algos.spread = parse_algo(k, v)?,
                "sync" => {
                    s.sync = match v {
                        "rs" => GradSync::ReduceScatter,
                        "ar" => GradSync::AllReduce,
                        _ => return config_err!("option sync={v}: rs or ar"),
                    }
                }
                "qblock" => {
                    s.quant_block = match v.parse() {
                        Ok(b) if b >= 1 => b,
                        _ => return config_err!("option qblock={v}: elements per scale, >= 1"),
                    }
                }
                "accum" => {
                    s.accum = match v.parse() {
                        Ok(a) if a >= 1 => a,
                        _ => return config_err!("option accum={v}: a count >= 1"),
                    }
                }
                _ => {
                    return config_err!(
                        "unknown option '{k}' (hpz, qwz, qgz, qblock, algo, fwd, bwd, grad, boundary, spread, sync, accum)"
                    )
                }
            }
        }
        if parts.iter().any(|o| !o.is_empty()) {
            s.name = spec.to_string();
        }
        // Quantized phases use the quantized algorithms unless named otherwise.
        if s.qwz_bits.is_some() && s.algos.fwd_gather == Algo::Auto {
            s.algos.fwd_gather = Algo::Qwz;
        }
        if s.qgz_bits.is_some() && s.algos.grad_reduce == Algo::Auto {
            s.algos.grad_reduce = Algo::Qgz;
        }
        s.validate(mesh)?;
        Ok(s)
    }

    /// Check the dependency rule and every constraint the runtime relies on; the error
    /// names the rule and the numbers that break it.
    pub fn validate(&self, mesh: Mesh) -> Result<()> {
        let (r, n) = (mesh.ranks_per_node, mesh.nodes);
        for (name, f) in [("p", self.p), ("g", self.g), ("os", self.os)] {
            if f.intra == 0 || f.inter == 0 {
                return config_err!("factor {name}={f}: sizes must be >= 1");
            }
            if r % f.intra != 0 {
                return config_err!(
                    "factor {name}={f}: {} ranks within a node must divide the {r} ranks per node (AMSP eq. 5)",
                    f.intra
                );
            }
            if n % f.inter != 0 {
                return config_err!(
                    "factor {name}={f}: {} nodes must divide the {n} nodes (AMSP eq. 6)",
                    f.inter
                );
            }
        }
        if !(self.p.divides(self.g) && self.g.divides(self.os)) {
            return config_err!(
                "dependency rule broken: need p | g | os in both dimensions (AMSP eqs 3-4: s_p <= s_g <= s_os), got p={} g={} os={}; \
                 a rank would hold gradients or optimizer states of parameters it does not hold",
                self.p,
                self.g,
                self.os
            );
        }
        if let Some(h) = self.hpz {
            if !h.divides(self.p) {
                return config_err!(
                    "hpz={h}: the secondary partition group must divide the parameter group p={} (ZeRO++ B.2)",
                    self.p
                );
            }
        }
        if self.accum == 0 {
            return config_err!("accum must be >= 1");
        }
        for (phase, a, ok) in [
            (
                "fwd",
                self.algos.fwd_gather,
                &[EXACT, &[Algo::Qwz]].concat()[..],
            ),
            (
                "bwd",
                self.algos.bwd_gather,
                &[EXACT, &[Algo::Qwz]].concat()[..],
            ),
            (
                "grad",
                self.algos.grad_reduce,
                &[EXACT, &[Algo::Qgz, Algo::Qgz1]].concat()[..],
            ),
            ("boundary", self.algos.boundary, EXACT),
            ("spread", self.algos.spread, EXACT),
        ] {
            if !ok.contains(&a) {
                return config_err!(
                    "{phase}={a}: that phase takes {}",
                    ok.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")
                );
            }
        }
        Ok(())
    }

    /// The factors as `(p, g, os)` strings (`"8x1"`), as the planner's JSON writes them.
    pub fn factors(&self) -> (String, String, String) {
        (self.p.to_string(), self.g.to_string(), self.os.to_string())
    }
}

fn paro(name: &str, p: Factor, g: Factor, os: Factor) -> Strategy {
    let mut s = Strategy::custom(name, p, g, os);
    s.algos = PhaseAlgos::all(Algo::HoRing);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_expand() {
        let m = Mesh::new(8, 4);
        let z = Strategy::parse("zero3", m).unwrap();
        assert_eq!((z.p, z.g, z.os), (m.dp(), m.dp(), m.dp()));
        let a = Strategy::parse("amsp:p=4x1,g=4x1,os=8x1", m).unwrap();
        assert_eq!(a.p, Factor::new(4, 1));
        assert_eq!(a.sync, GradSync::AllReduce);
        let mi = Strategy::parse("mics:16", m).unwrap();
        assert_eq!(mi.p, Factor::new(8, 2));
        let zp = Strategy::parse("zeropp,qgz=8,hpz=4x1", m).unwrap();
        assert_eq!(zp.qgz_bits, Some(8));
        assert_eq!(zp.hpz, Some(Factor::new(4, 1)));
        assert_eq!(zp.algos.grad_reduce, Algo::Qgz);
    }

    #[test]
    fn rule_errors_explain() {
        let m = Mesh::new(8, 4);
        let e = Strategy::parse("amsp:p=8x1,g=4x1,os=8x4", m)
            .unwrap_err()
            .to_string();
        assert!(e.contains("dependency rule"), "{e}");
        let e = Strategy::parse("amsp:p=3x1,g=3x1,os=3x1", m)
            .unwrap_err()
            .to_string();
        assert!(e.contains("eq. 5"), "{e}");
        assert!(Strategy::parse("mics:12", m).is_err());
        assert!(Strategy::parse("zero4", m).is_err());
        assert!(Strategy::parse("zero3,fwd=qgz", m).is_err());
    }
}
