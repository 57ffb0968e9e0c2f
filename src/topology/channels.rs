//! NCCL's channel rings, as the cost model runs a flat ring.
//!
//! NCCL does not run a collective as one ring in rank order. Its topology search
//! (`ncclTopoCompute` in NVIDIA/nccl `src/graph/search.cc`) finds one ring pattern per
//! rail: inside a node the ring visits every GPU, and it leaves the node through the NIC
//! of the GPU it leaves from, so on a DGX A100 / H100 (one NIC per GPU) it finds 8
//! patterns, each crossing nodes through a different NIC; it then duplicates the
//! patterns into twice as many channels (`ncclTopoPostset`, 16 channels on DGX A100 in
//! NCCL's INIT logs), and splits every collective's buffer evenly over the channels,
//! each channel running its own ring on its own SMs (NCCL user guide, "Algorithms",
//! and the nccl-tests `PERFORMANCE.md` bus-bandwidth notes).
//!
//! The model keeps that structure and merges only what is indistinguishable in it:
//! duplicated channels follow the same path through the same NIC, so
//! [`ring_channels`] models one ring per distinct rail, `min(nics_per_node,
//! ranks_per_node)` rings on a multi-node topology (8 on DGX and p5, 4 on p4d and
//! Frontier, 1 on p3dn's single EFA interface) and one ring inside a single node (where
//! every channel crosses the same NVSwitch ports, so more rings change no resource's
//! load). Ring `c` visits each node's ranks starting after its exit rank and ends on it:
//! the exit is the first rank mapped to NIC `c` (`c · ranks_per_node / rings`), so every
//! ring's inter-node hop goes through its own NIC. Each ring carries its even share of
//! the message and pays its own per-step latency, in parallel with the others.

#![forbid(unsafe_code)]

use super::Topology;

/// Rings NCCL's channels form on `topo` with the duplicates merged (module doc): 1 on a
/// single node, else `min(nics_per_node, ranks_per_node)`, at least 1.
pub fn ring_channels(topo: &Topology) -> usize {
    if topo.nodes <= 1 {
        return 1;
    }
    topo.links.nics_per_node.min(topo.ranks_per_node()).max(1)
}

/// Local rank through which ring `c` of `rings` leaves every node: the first rank mapped
/// to NIC `c` (the replay maps local rank `l` to NIC `l · nics / ranks_per_node`).
pub fn exit_local(topo: &Topology, c: usize, rings: usize) -> usize {
    let k = topo.ranks_per_node().max(1);
    (c * k / rings.max(1)).min(k - 1)
}

/// World rank at position `pos` of ring `c` of `rings`: nodes in order, and inside each
/// node the local ranks after ring `c`'s exit rank, ending on it.
pub fn channel_rank(topo: &Topology, c: usize, rings: usize, pos: usize) -> usize {
    let k = topo.ranks_per_node().max(1);
    let (node, j) = (pos / k, pos % k);
    node * k + (exit_local(topo, c, rings) + 1 + j) % k
}

/// Position of world rank `rank` in ring `c` of `rings` (inverse of [`channel_rank`]).
pub fn channel_pos(topo: &Topology, c: usize, rings: usize, rank: usize) -> usize {
    let k = topo.ranks_per_node().max(1);
    let (node, l) = (rank / k, rank % k);
    node * k + (l + 2 * k - exit_local(topo, c, rings) - 1) % k
}

/// Modeled time in microseconds of one step of a flat ring over the whole of `topo`
/// moving `bytes` per rank: the rings of [`ring_channels`] each carry `bytes / rings`;
/// an exit rank sends its share through its NIC port and the rest over its intra-node
/// port (a rank that exits no ring sends everything there), so the step takes the longer of the two, each with its
/// latency (with one ring, the inter-node one of a lone crossing,
/// [`super::Links::lone_latency_us`], where measured, as far as the links run apart
/// from the cores: [`super::Links::overlap`]). One node (or one rank per node): the
/// classic `α + bytes / β` of the slowest link class.
pub fn ring_step_us(topo: &Topology, bytes: f64) -> f64 {
    let links = &topo.links;
    let k = topo.ranks_per_node().max(1);
    let step = |c: super::LinkClass, b: f64| {
        let l = links.get(c);
        l.latency_us + b / (l.bandwidth_gbs * 1e3)
    };
    if topo.nodes <= 1 || k == 1 {
        let slowest = if topo.nodes > 1 {
            super::LinkClass::InterNode
        } else if topo.packages_per_node > 1 {
            super::LinkClass::IntraNode
        } else {
            super::LinkClass::IntraPackage
        };
        return step(slowest, bytes);
    }
    let rings = ring_channels(topo) as f64;
    let port = (links.nics_per_node / k).max(1) as f64 * links.nic_bandwidth_gbs * 1e3;
    // One ring: one rank per node crosses at a time (the probe's lone latency, where
    // it measured one). The probe times that crossing with the node's other ranks
    // idle; in a ring they are at work too, which costs the crossing nothing only as
    // far as links run apart from the cores (the probe's overlap): where links and
    // cores are one resource (overlap 0: one host, an unshaped cluster), a step pays
    // the latency of every rank at work.
    let latency = match links.lone_latency_us {
        Some(l) if rings == 1.0 => {
            let o = links.overlap.unwrap_or(1.0);
            o * l + (1.0 - o) * links.inter_node.latency_us
        }
        _ => links.inter_node.latency_us,
    };
    let inter = latency + bytes / rings / port;
    let intra_class = if topo.packages_per_node > 1 {
        super::LinkClass::IntraNode
    } else {
        super::LinkClass::IntraPackage
    };
    // With a ring per rank every rank is one ring's exit; with fewer rings some ranks
    // send everything over their intra-node port.
    let intra_bytes = if rings as usize >= k {
        bytes * (k - 1) as f64 / k as f64
    } else {
        bytes
    };
    inter.max(step(intra_class, intra_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_are_permutations_leaving_through_their_own_nic() {
        for spec in [
            "dgx-a100:3",
            "p4d:2",
            "frontier:2",
            "p3dn:2",
            "p5:2",
            "nodes:3x5",
            "dgx-h100:1",
        ] {
            let t = Topology::parse(spec).unwrap();
            let (p, k) = (t.world_size(), t.ranks_per_node());
            let rings = ring_channels(&t);
            let nics = t.links.nics_per_node;
            let mut exit_nics = std::collections::BTreeSet::new();
            for c in 0..rings {
                let mut seen = vec![false; p];
                for pos in 0..p {
                    let r = channel_rank(&t, c, rings, pos);
                    assert!(!seen[r], "{spec} ring {c}");
                    seen[r] = true;
                    assert_eq!(channel_pos(&t, c, rings, r), pos);
                    assert_eq!(r / k, pos / k, "{spec}: nodes stay in order");
                }
                // The last rank of each node is the exit; it owns NIC c.
                let exit = channel_rank(&t, c, rings, k - 1);
                exit_nics.insert(exit * nics / k);
            }
            if t.nodes > 1 {
                assert_eq!(exit_nics.len(), rings, "{spec}: one NIC per ring");
            }
        }
        assert_eq!(ring_channels(&Topology::parse("dgx-a100:2").unwrap()), 8);
        assert_eq!(ring_channels(&Topology::parse("p3dn:2").unwrap()), 1);
        assert_eq!(ring_channels(&Topology::parse("p4d:2").unwrap()), 4);
        assert_eq!(ring_channels(&Topology::parse("dgx-a100:1").unwrap()), 1);
    }

    #[test]
    fn ring_step_uses_every_rail() {
        let t = Topology::parse("dgx-a100:2").unwrap();
        let b = 8e6;
        let l = &t.links;
        let want = (l.inter_node.latency_us + b / 8.0 / (l.nic_bandwidth_gbs * 1e3))
            .max(l.intra_node.latency_us + b * 7.0 / 8.0 / (l.intra_node.bandwidth_gbs * 1e3));
        assert!((ring_step_us(&t, b) - want).abs() < 1e-9);
        let one = Topology::parse("p3dn:2").unwrap();
        let l = &one.links;
        let want = l.inter_node.latency_us + b / (l.nic_bandwidth_gbs * 1e3);
        assert!((ring_step_us(&one, b) - want).abs() < 1e-9);
    }
}
