//! The topology itself: [`Topology`], its link classes, levels, coordinates and modeled
//! links, and its JSON form (the SPEC grammar: [`super::spec`]; the folder's doc: [`super`]).

#![forbid(unsafe_code)]

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::{invalid_arg, invalid_usage};

crate::kinds::display_as_name!(LinkClass, Level);

/// Environment variable naming a topology SPEC or JSON file (read by [`Topology::from_env`]).
pub const ENV_TOPOLOGY: &str = "STRATA_TOPOLOGY";

/// The accepted SPEC forms, quoted in every parse error.
pub const ACCEPTED_FORMS: &str = "accepted forms: nodes:NxR, nodes:NxPxD, dgx-a100:N, \
dgx-h100:N, frontier:N, p3dn:N, p4d:N, p5:N (sizes >= 1, each optionally followed by \
,switch=K for K nodes per leaf switch), or a path to a topology JSON file";

/// Class of the link between two ranks (traffic accounting contract:
/// `intra_package`, `intra_node`, `inter_node`). Ordered fastest-first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkClass {
    /// Dies of one package (GCD pair of an MI250X; Infinity Fabric in-package).
    IntraPackage,
    /// Different packages of one node (NVLink / NVSwitch / GPU-GPU Infinity Fabric).
    IntraNode,
    /// Different nodes (InfiniBand, EFA, Slingshot).
    InterNode,
}

impl LinkClass {
    /// All classes, in [`LinkClass::index`] order.
    pub const ALL: [LinkClass; 3] = [
        LinkClass::IntraPackage,
        LinkClass::IntraNode,
        LinkClass::InterNode,
    ];

    /// `"intra_package"`, `"intra_node"` or `"inter_node"` (contract; the serde name too).
    pub fn name(self) -> &'static str {
        match self {
            LinkClass::IntraPackage => "intra_package",
            LinkClass::IntraNode => "intra_node",
            LinkClass::InterNode => "inter_node",
        }
    }

    /// 0, 1, 2: position in [`LinkClass::ALL`], for per-class arrays.
    pub fn index(self) -> usize {
        match self {
            LinkClass::IntraPackage => 0,
            LinkClass::IntraNode => 1,
            LinkClass::InterNode => 2,
        }
    }
}

/// One level of the hierarchy, named by what its members are spread across.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Across nodes: members differ in the node coordinate (links: `inter_node`).
    Network,
    /// Across the packages of one node (links: `intra_node`).
    Node,
    /// Across the dies of one package (links: `intra_package`).
    Package,
}

impl Level {
    /// Outermost first.
    pub const ALL: [Level; 3] = [Level::Network, Level::Node, Level::Package];

    /// `"network"`, `"node"` or `"package"`.
    pub fn name(self) -> &'static str {
        match self {
            Level::Network => "network",
            Level::Node => "node",
            Level::Package => "package",
        }
    }

    /// The link class any two distinct members of one group of this level talk over.
    pub fn link_class(self) -> LinkClass {
        match self {
            Level::Network => LinkClass::InterNode,
            Level::Node => LinkClass::IntraNode,
            Level::Package => LinkClass::IntraPackage,
        }
    }
}

/// Position of a rank in the hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Coord {
    pub node: usize,
    pub package: usize,
    pub die: usize,
}

/// Modeled link: per-direction bandwidth of ONE rank's share in GB/s (1e9 bytes/s) and
/// one-way latency in microseconds. These are modeling figures for the cost model
/// (latency + bytes / bandwidth per link class), not measurements.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkSpec {
    pub bandwidth_gbs: f64,
    pub latency_us: f64,
}

impl LinkSpec {
    /// Modeled seconds to move `bytes` over this link once: `latency + bytes / bandwidth`.
    pub fn time_s(&self, bytes: f64) -> f64 {
        self.latency_us * 1e-6 + bytes / (self.bandwidth_gbs * 1e9)
    }
}

/// The modeled links of a topology, one [`LinkSpec`] per [`LinkClass`], plus the NICs
/// that ranks of a node share (so `inter_node.bandwidth_gbs` is normally
/// `nics_per_node * nic_bandwidth_gbs / ranks_per_node`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Links {
    pub intra_package: LinkSpec,
    pub intra_node: LinkSpec,
    pub inter_node: LinkSpec,
    /// NICs per node (inter-node bandwidth is per NIC; ranks of a node share them).
    pub nics_per_node: usize,
    /// Per-NIC bandwidth, GB/s per direction.
    pub nic_bandwidth_gbs: f64,
    /// The host path's own copy and reduction speed (measured by the link probe on host
    /// transports; `None` in presets: the model then counts no local work).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostSpec>,
    /// How far the link classes carry traffic at the same time, measured by the link
    /// probe: 1 (or `None`, the presets) when a step on every class takes as long as the
    /// slowest alone (separate links), 0 when as long as all of them in turn (one host's
    /// cores moving every byte); `ho-ring`'s overlapped levels are costed with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<f64>,
    /// µs a pipelined hierarchical algorithm (`ho-ring`) pays per piece step beyond its
    /// links: its levels' streams handing each piece to one another, a thread waking on
    /// another's work, which costs most where cores are few and shared. Measured by the
    /// link probe (a small `ho-ring` all-gather against a small `hier` one, per step of
    /// its busiest level) and costed on all-gathers; `None` in presets: no such cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff_us: Option<f64>,
    /// One-way latency (µs) of an inter-node step that one rank per node takes while
    /// the node's other ranks wait, as a flat ring's exit rank does; `inter_node`'s
    /// latency is that of every rank crossing at once (a hierarchical stage). Measured by
    /// the link probe, where hosts and their network stack are shared by a node's ranks;
    /// the model uses it as far as the links run apart from the cores ([`Links::overlap`]:
    /// a ring's other ranks are at work, not waiting). `None` (presets): the same as
    /// `inter_node`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lone_latency_us: Option<f64>,
}

/// One rank's local work on the host path while every rank of its node does the same
/// (the link probe's measurement): GB/s of a copy (bytes copied) and of an f32 sum
/// reduction (bytes of the accumulator).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    pub copy_gbs: f64,
    pub reduce_gbs: f64,
}

/// Where a topology's link figures were measured (the link probe, `crate::comm::probe`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measured {
    /// The transport the probe ran over (`mpi`, `local`, ...).
    pub transport: String,
    /// The cache key: a hash of the transport, the layout and every rank's host.
    pub host_key: String,
    /// The link classes measured (the others keep the preset's figures).
    pub classes: Vec<LinkClass>,
    /// Wall time of the probe, seconds.
    pub seconds: f64,
    /// Seconds since the Unix epoch when it ran.
    pub unix_time: u64,
}

impl Links {
    /// The spec of one link class.
    pub fn get(&self, c: LinkClass) -> LinkSpec {
        match c {
            LinkClass::IntraPackage => self.intra_package,
            LinkClass::IntraNode => self.intra_node,
            LinkClass::InterNode => self.inter_node,
        }
    }

    /// Aggregate egress bandwidth of one node, GB/s per direction.
    pub fn node_egress_gbs(&self) -> f64 {
        self.nics_per_node as f64 * self.nic_bandwidth_gbs
    }

    /// Every figure positive and finite (latency may be 0), at least one NIC.
    pub fn validate(&self) -> Result<()> {
        for c in LinkClass::ALL {
            let s = self.get(c);
            if !(s.bandwidth_gbs.is_finite() && s.bandwidth_gbs > 0.0) {
                return invalid_arg!(
                    "topology link {}: bandwidth_gbs must be > 0, got {}",
                    c,
                    s.bandwidth_gbs
                );
            }
            if !(s.latency_us.is_finite() && s.latency_us >= 0.0) {
                return invalid_arg!(
                    "topology link {}: latency_us must be >= 0, got {}",
                    c,
                    s.latency_us
                );
            }
        }
        if self.nics_per_node == 0 {
            return invalid_arg!("topology links: nics_per_node must be >= 1");
        }
        if !(self.nic_bandwidth_gbs.is_finite() && self.nic_bandwidth_gbs > 0.0) {
            return invalid_arg!(
                "topology links: nic_bandwidth_gbs must be > 0, got {}",
                self.nic_bandwidth_gbs
            );
        }
        if let Some(l) = self.lone_latency_us {
            if !(l.is_finite() && l >= 0.0) {
                return invalid_arg!("topology links: lone_latency_us must be >= 0, got {l}");
            }
        }
        if let Some(h) = self.handoff_us {
            if !(h.is_finite() && h >= 0.0) {
                return invalid_arg!("topology links: handoff_us must be >= 0, got {h}");
            }
        }
        if let Some(o) = self.overlap {
            if !(0.0..=1.0).contains(&o) {
                return invalid_arg!("topology links: overlap must be in [0, 1], got {o}");
            }
        }
        if let Some(h) = self.host {
            for (what, v) in [("copy_gbs", h.copy_gbs), ("reduce_gbs", h.reduce_gbs)] {
                if !(v.is_finite() && v > 0.0) {
                    return invalid_arg!("topology links: host {what} must be > 0, got {v}");
                }
            }
        }
        Ok(())
    }
}

/// A regular node / package / die hierarchy with modeled links (see the module doc).
///
/// Fields are public for tests and tools; topologies from [`Topology::parse`],
/// [`Topology::from_json`] and [`Topology::load`] are validated (sizes >= 1,
/// `switch_of_node.len() == nodes`, bandwidths > 0). Methods never panic, even on an
/// unvalidated value (zero sizes are treated as 1 in divisions).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// The canonical SPEC it came from (`"nodes:4x8"`, `"frontier:2,switch=4"`) or a free
    /// name for a file.
    #[serde(default)]
    pub name: String,
    pub nodes: usize,
    pub packages_per_node: usize,
    pub dies_per_package: usize,
    /// Optional leaf-switch of each node (len == nodes); None = one switch for all.
    #[serde(default)]
    pub switch_of_node: Option<Vec<usize>>,
    pub links: Links,
    /// Set when the link figures were measured (the link probe) rather than a preset's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<Measured>,
}

/// `"1 die"`, `"2 dies"`.
fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

impl Topology {
    /// Sets `switch_of_node[n] = n / k` (`k` consecutive nodes per leaf switch, the last
    /// switch possibly smaller). Err(InvalidArgument) when `k == 0`.
    pub fn with_nodes_per_switch(mut self, k: usize) -> Result<Topology> {
        if k == 0 {
            return invalid_arg!("nodes per switch must be >= 1; {ACCEPTED_FORMS}");
        }
        self.switch_of_node = Some((0..self.nodes).map(|n| n / k).collect());
        Ok(self)
    }

    /// Sets an explicit leaf switch per node. Err(InvalidArgument) unless `len == nodes`.
    pub fn with_switch_of_node(mut self, switch_of_node: Vec<usize>) -> Result<Topology> {
        self.switch_of_node = Some(switch_of_node);
        self.validate()?;
        Ok(self)
    }

    /// Checks the invariants `parse`/`from_json` guarantee: sizes >= 1, a world size that
    /// fits `usize`, `switch_of_node.len() == nodes`, valid [`Links`].
    pub fn validate(&self) -> Result<()> {
        let who = if self.name.is_empty() {
            "topology".to_string()
        } else {
            format!("topology {}", self.name)
        };
        for (what, v) in [
            ("nodes", self.nodes),
            ("packages_per_node", self.packages_per_node),
            ("dies_per_package", self.dies_per_package),
        ] {
            if v == 0 {
                return invalid_arg!("{who}: {what} must be >= 1");
            }
        }
        if self
            .nodes
            .checked_mul(self.packages_per_node)
            .and_then(|x| x.checked_mul(self.dies_per_package))
            .is_none()
        {
            return invalid_arg!("{who}: world size overflows");
        }
        if let Some(s) = &self.switch_of_node {
            if s.len() != self.nodes {
                return invalid_arg!(
                    "{who}: switch_of_node has {} entries but there are {} nodes",
                    s.len(),
                    self.nodes
                );
            }
        }
        self.links.validate().map_err(|e| match e {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("{who}: {m}")),
            e => e,
        })
    }

    /// `nodes * packages_per_node * dies_per_package` (saturating).
    pub fn world_size(&self) -> usize {
        self.nodes.saturating_mul(self.ranks_per_node())
    }

    /// `packages_per_node * dies_per_package` (saturating).
    pub fn ranks_per_node(&self) -> usize {
        self.packages_per_node.saturating_mul(self.dies_per_package)
    }

    /// `dies_per_package`.
    pub fn ranks_per_package(&self) -> usize {
        self.dies_per_package
    }

    /// Row-major coordinate of `rank`. A rank past the world gives a node >= `nodes`
    /// (no panic); use [`Topology::checked_coord`] to reject it.
    pub fn coord(&self, rank: usize) -> Coord {
        let d = self.dies_per_package.max(1);
        let p = self.packages_per_node.max(1);
        Coord {
            node: rank / d / p,
            package: rank / d % p,
            die: rank % d,
        }
    }

    /// [`Topology::coord`], Err(InvalidArgument) when `rank >= world_size()`.
    pub fn checked_coord(&self, rank: usize) -> Result<Coord> {
        if rank >= self.world_size() {
            return invalid_arg!(
                "rank {rank} out of range for topology {} ({} ranks)",
                self.name,
                self.world_size()
            );
        }
        Ok(self.coord(rank))
    }

    /// Inverse of [`Topology::coord`]: `(node * P + package) * D + die` (wrapping on overflow).
    pub fn rank_of(&self, c: Coord) -> usize {
        c.node
            .wrapping_mul(self.packages_per_node)
            .wrapping_add(c.package)
            .wrapping_mul(self.dies_per_package)
            .wrapping_add(c.die)
    }

    /// Node of `rank`.
    pub fn node_of(&self, rank: usize) -> usize {
        rank / self.ranks_per_node().max(1)
    }

    /// Index of `rank` within its node (its rail).
    pub fn local_rank(&self, rank: usize) -> usize {
        rank % self.ranks_per_node().max(1)
    }

    /// Leaf switch of `node` (0 for every node without switch information or past the end).
    pub fn switch_of(&self, node: usize) -> usize {
        self.switch_of_node
            .as_ref()
            .and_then(|s| s.get(node).copied())
            .unwrap_or(0)
    }

    /// Number of distinct leaf switches (1 without switch information).
    pub fn num_switches(&self) -> usize {
        match &self.switch_of_node {
            None => 1,
            Some(s) => {
                let mut v = s.clone();
                v.sort_unstable();
                v.dedup();
                v.len().max(1)
            }
        }
    }

    /// Link class between ranks `a` and `b`: same node and package -> `IntraPackage`
    /// (also `a == b`), same node -> `IntraNode`, else `InterNode`.
    pub fn link_class(&self, a: usize, b: usize) -> LinkClass {
        let (ca, cb) = (self.coord(a), self.coord(b));
        if ca.node != cb.node {
            LinkClass::InterNode
        } else if ca.package != cb.package {
            LinkClass::IntraNode
        } else {
            LinkClass::IntraPackage
        }
    }

    /// Modeled link between `a` and `b` (`links.get(link_class(a, b))`).
    pub fn link(&self, a: usize, b: usize) -> LinkSpec {
        self.links.get(self.link_class(a, b))
    }

    /// The non-trivial levels, outermost first, with their sizes; size-1 levels are
    /// skipped: `frontier:2` -> `[(Network, 2), (Node, 4), (Package, 2)]`, `nodes:4x8` ->
    /// `[(Network, 4), (Node, 8)]`, `nodes:1x8` -> `[(Node, 8)]`, `nodes:4x1` ->
    /// `[(Network, 4)]`, `nodes:1x1` -> `[]`. This is the shape a hierarchical
    /// collective recurses over (MiCS §3.3 two levels, Frontier 002 §IV three levels).
    pub fn levels(&self) -> Vec<(Level, usize)> {
        Level::ALL
            .into_iter()
            .map(|l| (l, self.level_size(l)))
            .filter(|&(_, n)| n > 1)
            .collect()
    }

    /// Size of every group of `level`: `nodes`, `packages_per_node` or `dies_per_package`.
    pub fn level_size(&self, level: Level) -> usize {
        match level {
            Level::Network => self.nodes,
            Level::Node => self.packages_per_node,
            Level::Package => self.dies_per_package,
        }
    }

    /// Ok when the topology describes exactly `world` ranks, else Err(InvalidUsage), e.g.
    /// "topology frontier:2 describes 16 ranks (2 nodes x 4 packages x 2 dies) but the
    /// world has 12 ranks".
    pub fn check_world(&self, world: usize) -> Result<()> {
        if self.world_size() == world {
            return Ok(());
        }
        invalid_usage!(
            "topology {} describes {} ranks ({} x {} x {}) but the world has {}: give a topology \
             of {} (e.g. nodes:1x{}) or start {} ranks",
            self.name,
            self.world_size(),
            plural(self.nodes, "node", "nodes"),
            plural(self.packages_per_node, "package", "packages"),
            plural(self.dies_per_package, "die", "dies"),
            plural(world, "rank", "ranks"),
            plural(world, "rank", "ranks"),
            world,
            self.world_size()
        )
    }

    /// Pretty JSON of every field (the format [`Topology::from_json`] and `parse` read).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// Parses and validates JSON written by [`Topology::to_json`]; unknown fields are
    /// rejected (typos would otherwise be silent). Err(InvalidArgument) on any defect.
    pub fn from_json(s: &str) -> Result<Topology> {
        let mut t: Topology = serde_json::from_str(s)
            .map_err(|e| Error::InvalidArgument(format!("bad topology JSON: {e}")))?;
        if t.name.trim().is_empty() {
            t.name = format!(
                "custom:{}x{}x{}",
                t.nodes, t.packages_per_node, t.dies_per_package
            );
        }
        t.validate()?;
        Ok(t)
    }

    /// Reads a topology JSON file. Err(InvalidArgument) naming the path when it cannot
    /// be read or is invalid.
    pub fn load(path: &Path) -> Result<Topology> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::InvalidArgument(format!(
                "cannot read topology file {}: {e}; {ACCEPTED_FORMS}",
                path.display()
            ))
        })?;
        Topology::from_json(&text).map_err(|e| match e {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    /// Writes [`Topology::to_json`] to `path`. Err(System) when the write fails.
    pub fn save(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_json() + "\n").map_err(|e| {
            Error::System(format!(
                "cannot write topology file {}: {e}",
                path.display()
            ))
        })
    }

    /// One line: `"frontier:2 = 2 nodes x 4 packages x 2 dies (16 ranks)"`, plus
    /// `", N leaf switches"` when switch information is present.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} = {} x {} x {} ({} ranks)",
            self.name,
            plural(self.nodes, "node", "nodes"),
            plural(self.packages_per_node, "package", "packages"),
            plural(self.dies_per_package, "die", "dies"),
            self.world_size()
        );
        if self.switch_of_node.is_some() {
            s += &format!(
                ", {}",
                plural(self.num_switches(), "leaf switch", "leaf switches")
            );
        }
        s
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary())
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
