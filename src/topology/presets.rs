//! Named machine presets: node shape and modeled links as data.
//!
//! Conventions (see [`LinkSpec`]): bandwidth is GB/s (1e9 B/s) **per direction** of
//! **one rank's share**; vendors quote NVLink and Infinity Fabric as bidirectional
//! aggregates, which are halved here. The inter-node share is
//! `nics_per_node * nic_bandwidth_gbs / ranks_per_node`. Where a package holds one die
//! (every NVIDIA preset) there is no `intra_package` link between distinct ranks; the
//! field then repeats the `intra_node` figure and is never used by link classification.
//!
//! Sources of the bandwidth figures:
//! - DGX A100: NVIDIA DGX A100 datasheet / A100 datasheet: third-generation NVLink via
//!   NVSwitch, 600 GB/s bidirectional per GPU -> 300 GB/s per direction; 8x ConnectX-6
//!   HDR InfiniBand 200 Gb/s (25 GB/s) NICs, one per GPU. (Also 002 §III: "8 IB HDR
//!   ports, 200 GB/s", and MiCS 003 §5.1.5.)
//! - DGX H100: NVIDIA DGX H100 datasheet / H100 SXM datasheet: fourth-generation NVLink,
//!   900 GB/s bidirectional per GPU -> 450 GB/s per direction; 8x ConnectX-7 NDR
//!   InfiniBand 400 Gb/s (50 GB/s) NICs, one per GPU.
//! - Frontier (HPE Cray EX235a, OLCF user guide; 002 §III-IV, Table I): 4 AMD MI250X per
//!   node, 2 GCDs each. GCD-GCD inside one MI250X: 4 Infinity Fabric links, 200 GB/s
//!   bidirectional (4 x 50) -> 100 GB/s per direction. MI250X to MI250X: 100 GB/s
//!   (2 links, adjacent pairs) or 50 GB/s (1 link, cross pairs) bidirectional; a ring
//!   or all-to-all over the 4 packages crosses a single-link pair, so the model takes
//!   the 50 GB/s bound -> 25 GB/s per direction. Network: 4x HPE Slingshot-11 200 Gb/s
//!   (25 GB/s) NICs per node, one per MI250X, shared by its 2 GCDs -> 12.5 GB/s per rank.
//! - AWS p3dn.24xlarge (AWS EC2 P3 page): 8x V100 SXM2, NVLink2 300 GB/s bidirectional
//!   per GPU (6 links x 50, hybrid cube-mesh) -> 150 GB/s per direction; 100 Gbps
//!   network (EFA), one 12.5 GB/s interface shared by 8 GPUs. (MiCS 003 §1/§5 V100
//!   clusters with 100 Gbps.)
//! - AWS p4d.24xlarge (AWS EC2 P4 page): 8x A100 on NVSwitch, 600 GB/s bidirectional ->
//!   300 GB/s per direction; 400 Gbps EFA as 4x 100 Gbps (12.5 GB/s) interfaces. (MiCS
//!   003 §1 A100 clusters with 400 Gbps.)
//! - AWS p5.48xlarge (AWS EC2 P5 page): 8x H100 on NVSwitch, 900 GB/s bidirectional ->
//!   450 GB/s per direction; 3200 Gbps EFA as 32x 100 Gbps (12.5 GB/s) interfaces.
//!
//! **Calibration to what NCCL achieves.** The line rates above are what the wires carry;
//! NCCL's Simple protocol and the NICs' own overheads deliver less, and the presets model
//! the delivered figure (line rate x efficiency) so that modeled bus bandwidths compare
//! with nccl-tests. Each efficiency comes from one published measurement or statement
//! by NCCL's maintainers; the figures it is then checked against are different ones
//! (`docs/model-fidelity.md`, `strata-sim --fidelity`):
//! - NVLink3 (A100, NVSwitch): 232.54 GB/s all-reduce bus bandwidth on one 8x A100 SXM
//!   node (NVIDIA/nccl issue 1048, `all_reduce_perf -b 8 -e 4G -g 8`), 0.775 of 300.
//!   V100's NVLink2 (p3dn) is given the same protocol efficiency (no published figure
//!   found; an assumption).
//! - NVLink4 (H100): "with the protocol overhead (~20%) NCCL can get an effective NVLink
//!   bandwidth of 370GB/s" for rings and non-all-reduce operations (NCCL maintainer,
//!   NVIDIA/nccl-tests issue 212), 0.822 of 450. (NVLink SHARP all-reduce, ~480 GB/s
//!   bus bandwidth, is not a ring and is not modeled.)
//! - HDR InfiniBand: 24 GB/s through NCCL over a single HDR NIC (NVIDIA/nccl issue 1048,
//!   "when HCA=mlx5_0, reach the theoretical value (24GB/s)"), 0.96 of 25.
//! - NDR InfiniBand: "For NDR @ 400Gbps you should see 46-48GB/s per NIC" (NCCL
//!   maintainer, NVIDIA/nccl-tests issue 290); the model takes 47, 0.94 of 50.
//! - EFA, Slingshot-11 and Infinity Fabric: no per-link figure through NCCL / RCCL was
//!   found; modeled at line rate (uncalibrated).
//! - The generic `nodes:` links are an abstract machine at line rate.
//!
//! How many rings a flat ring runs as, and through which NICs, is
//! [`super::channels`] (NCCL's channels, one ring per rail).
//!
//! Latencies are modeling figures (one-way, small message, including library overhead),
//! not vendor figures: NVLink / NVSwitch 1.5 us (range ~1-2 us), Infinity Fabric inside
//! an MI250X 1.0 us and between MI250X 2.0 us, InfiniBand 4.0 us (~3-5 us), EFA 15 us,
//! Slingshot-11 2.5 us (~2-3 us). For scale, NCCL's own per-step ring latencies
//! (`hwLat` in NVIDIA/nccl `src/graph/tuning.cc`, e.g. at commit 01afd20a) are
//! 0.47 / 1.9 / 3.4 us over NVLink and 2.7 / 4.0 / 9.6 us over the network for its
//! LL / LL128 / Simple protocols; the NVLink and InfiniBand figures here sit between LL
//! and LL128. The EFA figure is deliberately higher (its SRD transport runs through a
//! host-side libfabric provider), and the Slingshot-11 one is a modeling choice as well:
//! the Frontier paper (002 §III) reports Slingshot bandwidth, not latency. No per-hop
//! Infinity Fabric latency is published; the in-package figure is taken below NVLink and
//! the package-to-package one above it.
//!
//! How the simulator ([`crate::sim::replay`](fn@crate::sim::replay)) uses the figures, per link class:
//! - `intra_package` / `intra_node`: `bandwidth_gbs` is one rank's port to the class
//!   (its share of the NVSwitch / its xGMI links), per direction; every transfer costs
//!   `latency_us + bytes / bandwidth`, one transfer at a time per rank and class.
//! - `inter_node`: transfers go through the sender's NIC at `nic_bandwidth_gbs`: NIC
//!   `local_rank · nics_per_node / ranks_per_node`, shared by the ranks mapped to it,
//!   where a node has fewer NICs than ranks (Frontier: the 2 GCDs of an MI250X per
//!   Slingshot NIC; p3dn: all 8 V100 on one EFA interface; p4d: 2 A100 per EFA
//!   interface), else the rank's own `nics_per_node / ranks_per_node` NICs as one port
//!   (DGX: 1 HDR/NDR NIC per GPU; p5: 4 EFA interfaces per H100, 50 GB/s).
//!   `inter_node.bandwidth_gbs` is the per-rank share and is what the `auto` estimates
//!   use; `inter_node.latency_us` is the per-transfer latency in both.
//! - Links of different classes are independent, so intra- and inter-node transfers of
//!   one rank overlap in time when the algorithm lets them (HO-Ring).

use super::{LinkSpec, Links, Topology};

/// A named machine: node shape and links; `topology(n)` builds `n` nodes of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    /// SPEC name (`"dgx-a100"`), lower case.
    pub name: &'static str,
    /// Other accepted names (the AWS instance type names).
    pub aliases: &'static [&'static str],
    /// One line for `--help` and logs.
    pub description: &'static str,
    pub packages_per_node: usize,
    pub dies_per_package: usize,
    pub links: Links,
}

impl Preset {
    /// `nodes` nodes of this machine, named `"<name>:<nodes>"`, without switch info.
    pub fn topology(&self, nodes: usize) -> Topology {
        Topology {
            name: format!("{}:{nodes}", self.name),
            nodes,
            packages_per_node: self.packages_per_node,
            dies_per_package: self.dies_per_package,
            switch_of_node: None,
            links: self.links.clone(),
            measured: None,
        }
    }

    /// Ranks per node.
    pub fn ranks_per_node(&self) -> usize {
        self.packages_per_node * self.dies_per_package
    }
}

const fn spec(bandwidth_gbs: f64, latency_us: f64) -> LinkSpec {
    LinkSpec {
        bandwidth_gbs,
        latency_us,
    }
}

// Delivered fraction of the line rate through NCCL, see the module doc.
const EFF_NVLINK3: f64 = 232.54 / 300.0;
const EFF_NVLINK4: f64 = 370.0 / 450.0;
const EFF_HDR: f64 = 24.0 / 25.0;
const EFF_NDR: f64 = 47.0 / 50.0;

// Modeled latencies (us), see the module doc.
const LAT_NVLINK: f64 = 1.5;
const LAT_IF_PACKAGE: f64 = 1.0;
const LAT_IF_NODE: f64 = 2.0;
const LAT_IB: f64 = 4.0;
const LAT_EFA: f64 = 15.0;
const LAT_SLINGSHOT: f64 = 2.5;

/// Links at the figures given, with no host, overlap, hand-off or lone-latency figures
/// (the simulator's defaults): the inter-node link is the rank's share of the node's
/// NICs, `nics_per_node * nic_gbs / ranks_per_node`, at `nic_latency_us`.
const fn links(
    intra_package: LinkSpec,
    intra_node: LinkSpec,
    nics_per_node: usize,
    nic_gbs: f64,
    nic_latency_us: f64,
    ranks_per_node: usize,
) -> Links {
    Links {
        intra_package,
        intra_node,
        inter_node: spec(
            nics_per_node as f64 * nic_gbs / ranks_per_node as f64,
            nic_latency_us,
        ),
        nics_per_node,
        nic_bandwidth_gbs: nic_gbs,
        host: None,
        overlap: None,
        handoff_us: None,
        lone_latency_us: None,
    }
}

/// An 8-GPU NVIDIA machine: one die per package (so `intra_package` repeats the
/// `intra_node` figure), `nvlink_gbs` per direction at [`LAT_NVLINK`], and `nics` NICs
/// of `nic_gbs` each at `nic_latency_us`.
const fn nvidia8(
    name: &'static str,
    aliases: &'static [&'static str],
    description: &'static str,
    nvlink_gbs: f64,
    nics: usize,
    nic_gbs: f64,
    nic_latency_us: f64,
) -> Preset {
    let nvlink = spec(nvlink_gbs, LAT_NVLINK);
    Preset {
        name,
        aliases,
        description,
        packages_per_node: 8,
        dies_per_package: 1,
        links: links(nvlink, nvlink, nics, nic_gbs, nic_latency_us, 8),
    }
}

/// NVIDIA DGX A100: 8x A100, NVLink3/NVSwitch 300 GB/s/dir, 8x HDR 200 Gb/s.
pub const DGX_A100: Preset = nvidia8(
    "dgx-a100",
    &[],
    "NVIDIA DGX A100: 8x A100 on NVSwitch (300 GB/s/dir), 8x HDR IB 200 Gb/s \
     (modeled at NCCL's 232.5 and 24 GB/s)",
    300.0 * EFF_NVLINK3,
    8,
    25.0 * EFF_HDR,
    LAT_IB,
);

/// NVIDIA DGX H100: 8x H100, NVLink4/NVSwitch 450 GB/s/dir, 8x NDR 400 Gb/s.
pub const DGX_H100: Preset = nvidia8(
    "dgx-h100",
    &[],
    "NVIDIA DGX H100: 8x H100 on NVSwitch (450 GB/s/dir), 8x NDR IB 400 Gb/s \
     (modeled at NCCL's 370 and 47 GB/s)",
    450.0 * EFF_NVLINK4,
    8,
    50.0 * EFF_NDR,
    LAT_IB,
);

/// OLCF Frontier node: 4x MI250X x 2 GCDs, 4x Slingshot-11 200 Gb/s (002 §III-IV).
pub const FRONTIER: Preset = Preset {
    name: "frontier",
    aliases: &[],
    description:
        "OLCF Frontier: 4x MI250X x 2 GCDs (IF 100 / 25 GB/s/dir), 4x Slingshot-11 200 Gb/s",
    packages_per_node: 4,
    dies_per_package: 2,
    links: links(
        spec(100.0, LAT_IF_PACKAGE),
        spec(25.0, LAT_IF_NODE),
        4,
        25.0,
        LAT_SLINGSHOT,
        8,
    ),
};

/// AWS p3dn.24xlarge: 8x V100, NVLink2 150 GB/s/dir, 100 Gbps EFA.
pub const P3DN: Preset = nvidia8(
    "p3dn",
    &["p3dn.24xlarge"],
    "AWS p3dn.24xlarge: 8x V100 NVLink2 (150 GB/s/dir), 100 Gbps EFA",
    150.0 * EFF_NVLINK3,
    1,
    12.5,
    LAT_EFA,
);

/// AWS p4d.24xlarge: 8x A100 on NVSwitch 300 GB/s/dir, 4x 100 Gbps EFA.
pub const P4D: Preset = nvidia8(
    "p4d",
    &["p4d.24xlarge"],
    "AWS p4d.24xlarge: 8x A100 on NVSwitch (300 GB/s/dir), 400 Gbps EFA (4x 100)",
    300.0 * EFF_NVLINK3,
    4,
    12.5,
    LAT_EFA,
);

/// AWS p5.48xlarge: 8x H100 on NVSwitch 450 GB/s/dir, 32x 100 Gbps EFA.
pub const P5: Preset = nvidia8(
    "p5",
    &["p5.48xlarge"],
    "AWS p5.48xlarge: 8x H100 on NVSwitch (450 GB/s/dir), 3200 Gbps EFA (32x 100)",
    450.0 * EFF_NVLINK4,
    32,
    12.5,
    LAT_EFA,
);

/// Every preset, in the order `--help` lists them.
pub const PRESETS: [Preset; 6] = [DGX_A100, DGX_H100, FRONTIER, P3DN, P4D, P5];

/// The preset called `name` (case-insensitive; aliases accepted).
pub fn find(name: &str) -> Option<&'static Preset> {
    let name = name.trim().to_ascii_lowercase();
    PRESETS
        .iter()
        .find(|p| p.name == name || p.aliases.contains(&name.as_str()))
}

/// Links of the generic `nodes:` forms: DGX-A100-class figures (NVSwitch 300 GB/s/dir,
/// one 25 GB/s HDR NIC per rank, so the per-rank inter-node share is 25 GB/s at any
/// `ranks_per_node`). The package level, which only `nodes:NxPxD` with D > 1 uses, is
/// modeled at 600 GB/s / 1.0 us: no vendor figure, only a level strictly faster than
/// `intra_node` so that the 3-level shape is visible to cost models.
pub fn generic_links(ranks_per_node: usize) -> Links {
    Links {
        intra_package: spec(600.0, LAT_IF_PACKAGE),
        intra_node: spec(300.0, LAT_NVLINK),
        inter_node: spec(25.0, LAT_IB),
        nics_per_node: ranks_per_node.max(1),
        nic_bandwidth_gbs: 25.0,
        host: None,
        overlap: None,
        handoff_us: None,
        lone_latency_us: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_consistent() {
        for p in &PRESETS {
            p.links.validate().unwrap();
            let share = p.links.node_egress_gbs() / p.ranks_per_node() as f64;
            assert!(
                (p.links.inter_node.bandwidth_gbs - share).abs() < 1e-12,
                "{}",
                p.name
            );
            assert_eq!(find(p.name), Some(p));
            assert_eq!(find(&p.name.to_ascii_uppercase()), Some(p));
            for a in p.aliases {
                assert_eq!(find(a), Some(p));
            }
            let t = p.topology(3);
            assert_eq!(t.name, format!("{}:3", p.name));
            t.validate().unwrap();
        }
        assert_eq!(find("tpu"), None);
    }

    #[test]
    fn headline_figures() {
        assert!((DGX_A100.links.intra_node.bandwidth_gbs - 232.54).abs() < 1e-9);
        assert!((DGX_A100.links.nic_bandwidth_gbs - 24.0).abs() < 1e-9);
        assert!((DGX_H100.links.intra_node.bandwidth_gbs - 370.0).abs() < 1e-9);
        assert!((DGX_H100.links.nic_bandwidth_gbs - 47.0).abs() < 1e-9);
        assert_eq!(FRONTIER.links.intra_package.bandwidth_gbs, 100.0);
        assert_eq!(FRONTIER.links.inter_node.bandwidth_gbs, 12.5);
        assert_eq!(P3DN.links.inter_node.bandwidth_gbs, 1.5625);
        assert_eq!(P4D.links.inter_node.bandwidth_gbs, 6.25);
        assert_eq!(P5.links.inter_node.bandwidth_gbs, 50.0);
        let g = generic_links(4);
        g.validate().unwrap();
        assert_eq!(g.node_egress_gbs() / 4.0, g.inter_node.bandwidth_gbs);
        assert!(generic_links(0).validate().is_ok());
    }
}
