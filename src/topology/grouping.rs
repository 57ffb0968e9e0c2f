//! Groups of ranks computed from a [`Topology`]: the only place sub-communicator
//! membership is decided (algorithms split on these colors, never by hand).
//!
//! All functions are pure and return world ranks in ascending order. A rank past the
//! world is not rejected: its groups are computed from its (out-of-range) coordinate.
//!
//! - [`package_group`], [`node_group`], [`rail_group`], [`level_group`] /
//!   [`level_color`]: the hierarchy levels (MiCS 003 §3.3 node and rail groups of the
//!   hierarchical all-gather; Frontier 002 §IV GCD pair / node / network).
//! - [`mics_groups`]: MiCS 003 §3.2 partition and replication groups.
//! - [`switch_aware_partition_groups`]: AMSP 000 §V-D leaf-switch-aware placement.

use std::collections::BTreeMap;

use super::{Level, Topology};
use crate::error::Result;
use crate::invalid_arg;

/// The dies of `rank`'s package (Frontier's GCD pair, 002 §IV).
pub fn package_group(t: &Topology, rank: usize) -> Vec<usize> {
    level_group(t, Level::Package, rank)
}

/// The ranks of `rank`'s node.
pub fn node_group(t: &Topology, rank: usize) -> Vec<usize> {
    let rpn = t.ranks_per_node();
    let base = t.node_of(rank).saturating_mul(rpn);
    (base..base.saturating_add(rpn)).collect()
}

/// The ranks with `rank`'s local rank on every node (its rail: the inter-node stage of
/// MiCS's hierarchical all-gather, 003 §3.3).
pub fn rail_group(t: &Topology, rank: usize) -> Vec<usize> {
    let rpn = t.ranks_per_node();
    let local = t.local_rank(rank);
    (0..t.nodes).map(|n| n * rpn + local).collect()
}

/// The ranks that differ from `rank` only in `level`'s coordinate: the node coordinate
/// for `Network` (= [`rail_group`]), the package coordinate for `Node` (same node and
/// die), the die coordinate for `Package` (= [`package_group`]). Its size is
/// [`Topology::level_size`]; its members talk over `level.link_class()`.
pub fn level_group(t: &Topology, level: Level, rank: usize) -> Vec<usize> {
    let c = t.coord(rank);
    (0..t.level_size(level))
        .map(|i| {
            let mut m = c;
            match level {
                Level::Network => m.node = i,
                Level::Node => m.package = i,
                Level::Package => m.die = i,
            }
            t.rank_of(m)
        })
        .collect()
}

/// `(color, key)` for `split(color, key)` along `level`: ranks with equal color form the
/// [`level_group`]s, key is the position within the group (the varying coordinate).
/// Colors are dense, `0..world / level_size`: `Network` -> local rank, `Node` ->
/// `node * D + die`, `Package` -> `node * P + package`.
pub fn level_color(t: &Topology, level: Level, rank: usize) -> (u32, i32) {
    let c = t.coord(rank);
    let (color, key) = match level {
        Level::Network => (t.local_rank(rank), c.node),
        Level::Node => (c.node * t.dies_per_package + c.die, c.package),
        Level::Package => (c.node * t.packages_per_node + c.package, c.die),
    };
    (
        u32::try_from(color).unwrap_or(u32::MAX),
        i32::try_from(key).unwrap_or(i32::MAX),
    )
}

/// Every group of `level`, indexed by [`level_color`].
pub fn level_groups(t: &Topology, level: Level) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); t.world_size() / t.level_size(level).max(1)];
    for r in 0..t.world_size() {
        if let Some(g) = groups.get_mut(level_color(t, level, r).0 as usize) {
            g.push(r);
        }
    }
    groups
}

/// MiCS partition and replication groups (003 §3.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MicsGroups {
    /// `world / p` groups, each holding one full replica of the model states, sharded.
    pub partition: Vec<Vec<usize>>,
    /// `p` groups; group `i` holds the `i`-th rank of every partition group (the ranks
    /// that hold the same shard and all-reduce it at the accumulation boundary, §3.4).
    pub replication: Vec<Vec<usize>>,
}

impl MicsGroups {
    /// Builds the replication groups from partition groups of equal size (each sorted):
    /// replication group `i` = the `i`-th member of every partition group.
    pub fn from_partition(partition: Vec<Vec<usize>>) -> MicsGroups {
        let p = partition.first().map_or(0, Vec::len);
        let replication = (0..p)
            .map(|i| partition.iter().filter_map(|g| g.get(i).copied()).collect())
            .collect();
        MicsGroups {
            partition,
            replication,
        }
    }

    /// Index of the partition group holding `rank` and `rank`'s position in it (its shard).
    pub fn position(&self, rank: usize) -> Option<(usize, usize)> {
        self.partition
            .iter()
            .enumerate()
            .find_map(|(g, m)| m.iter().position(|&r| r == rank).map(|i| (g, i)))
    }
}

fn check_partition(world: usize, partition_size: usize) -> Result<()> {
    if world == 0 {
        return invalid_arg!("partition groups need a world of at least 1 rank");
    }
    if partition_size == 0 || world % partition_size != 0 {
        return invalid_arg!(
            "partition group size {partition_size} must be >= 1 and divide the world size {world}"
        );
    }
    Ok(())
}

/// MiCS §3.2 on the DeviceMesh layout: partition group `g` = ranks
/// `g*p .. (g+1)*p` (consecutive, so a group of `p <= ranks_per_node` stays in a node),
/// replication group `i` = `{i, i+p, i+2p, ...}` (the `i`-th rank of every partition
/// group). Err(InvalidArgument) unless `partition_size >= 1` divides `world >= 1`.
pub fn mics_groups(world: usize, partition_size: usize) -> Result<MicsGroups> {
    check_partition(world, partition_size)?;
    let partition = (0..world / partition_size)
        .map(|g| (g * partition_size..(g + 1) * partition_size).collect())
        .collect();
    Ok(MicsGroups::from_partition(partition))
}

/// AMSP §V-D communication placement: partition groups that use as few leaf switches
/// as possible, so that their collectives stay under one leaf switch instead of
/// crossing the spine (AMSP Fig. 10 (a) rather than (b); e.g. `s^1 = 4` nodes per group
/// go under one leaf switch).
///
/// Greedy at rank granularity, each switch's ranks taken in ascending order:
/// 1. every switch holding at least `p` unplaced ranks gives whole groups of `p`
///    (a group that fits in one switch never straddles a switch boundary);
/// 2. the leftovers (fewer than `p` per switch) are packed: a group starts on the switch
///    with the most remaining ranks and is completed from a switch whose remainder fits
///    the need exactly, else the smallest remainder that covers it, else the largest
///    (then repeat).
///
/// When `p` divides `ranks_per_node`, or `p` is a multiple of it, no node is split
/// across groups. Groups are returned sorted, ordered by their smallest rank. Without
/// switch information this equals `mics_groups(world, p).partition`.
/// Err(InvalidArgument) unless `p >= 1` divides the world size.
pub fn switch_aware_partition_groups(
    t: &Topology,
    partition_size: usize,
) -> Result<Vec<Vec<usize>>> {
    let world = t.world_size();
    check_partition(world, partition_size)?;
    let p = partition_size;
    if t.switch_of_node.is_none() {
        return Ok(mics_groups(world, p)?.partition);
    }
    // Ranks of each switch, ascending; switches ordered by their first node (deterministic ties).
    let mut by_switch: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut first_node: BTreeMap<usize, usize> = BTreeMap::new();
    for n in 0..t.nodes {
        let s = t.switch_of(n);
        first_node.entry(s).or_insert(n);
        let rpn = t.ranks_per_node();
        by_switch
            .entry(s)
            .or_default()
            .extend(n * rpn..(n + 1) * rpn);
    }
    let mut order: Vec<usize> = by_switch.keys().copied().collect();
    order.sort_by_key(|s| first_node.get(s).copied().unwrap_or(usize::MAX));
    // Remaining ranks per switch as queues (front = smallest).
    let mut rem: Vec<std::collections::VecDeque<usize>> = order
        .iter()
        .map(|s| by_switch.remove(s).unwrap_or_default().into())
        .collect();

    let mut groups: Vec<Vec<usize>> = Vec::with_capacity(world / p);
    // 1. whole groups inside one switch
    for q in rem.iter_mut() {
        while q.len() >= p {
            groups.push(q.drain(..p).collect());
        }
    }
    // 2. pack the leftovers
    while rem.iter().any(|q| !q.is_empty()) {
        let mut g: Vec<usize> = Vec::with_capacity(p);
        // start on the switch with the most remaining ranks (first in order on ties)
        let start = argmax(&rem);
        take(&mut rem[start], p, &mut g);
        while g.len() < p {
            let need = p - g.len();
            let avail: Vec<(usize, usize)> = rem
                .iter()
                .enumerate()
                .filter(|(_, q)| !q.is_empty())
                .map(|(i, q)| (i, q.len()))
                .collect();
            if avail.is_empty() {
                break;
            }
            let pick = avail
                .iter()
                .find(|&&(_, l)| l == need)
                .or_else(|| {
                    avail
                        .iter()
                        .filter(|&&(_, l)| l >= need)
                        .min_by_key(|&&(_, l)| l)
                })
                .map_or_else(|| argmax(&rem), |&(i, _)| i);
            take(&mut rem[pick], need, &mut g);
        }
        groups.push(g);
    }
    for g in &mut groups {
        g.sort_unstable();
    }
    groups.sort_unstable_by_key(|g| g.first().copied().unwrap_or(usize::MAX));
    Ok(groups)
}

/// [`switch_aware_partition_groups`] with its MiCS replication groups.
pub fn switch_aware_mics_groups(t: &Topology, partition_size: usize) -> Result<MicsGroups> {
    switch_aware_partition_groups(t, partition_size).map(MicsGroups::from_partition)
}

/// Number of distinct leaf switches the ranks of `group` sit under.
pub fn switches_spanned(t: &Topology, group: &[usize]) -> usize {
    let mut s: Vec<usize> = group.iter().map(|&r| t.switch_of(t.node_of(r))).collect();
    s.sort_unstable();
    s.dedup();
    s.len()
}

fn argmax(rem: &[std::collections::VecDeque<usize>]) -> usize {
    let mut best = 0;
    for (i, q) in rem.iter().enumerate() {
        if q.len() > rem[best].len() {
            best = i;
        }
    }
    best
}

fn take(q: &mut std::collections::VecDeque<usize>, n: usize, out: &mut Vec<usize>) {
    let n = n.min(q.len());
    out.extend(q.drain(..n));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo(s: &str) -> Topology {
        Topology::parse(s).unwrap()
    }

    /// Every rank appears in exactly one group; all groups sorted and of size `p`.
    fn assert_partition(world: usize, p: usize, groups: &[Vec<usize>]) {
        let mut seen = vec![false; world];
        for g in groups {
            assert_eq!(g.len(), p);
            assert!(g.windows(2).all(|w| w[0] < w[1]), "{g:?} not sorted");
            for &r in g {
                assert!(!seen[r], "rank {r} twice");
                seen[r] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn groups_nodes_2x4() {
        let t = topo("nodes:2x4");
        assert_eq!(node_group(&t, 5), vec![4, 5, 6, 7]);
        assert_eq!(rail_group(&t, 5), vec![1, 5]);
        assert_eq!(package_group(&t, 5), vec![5]);
        assert_eq!(level_group(&t, Level::Network, 2), vec![2, 6]);
        assert_eq!(level_group(&t, Level::Node, 6), vec![4, 5, 6, 7]);
        assert_eq!(level_color(&t, Level::Network, 6), (2, 1));
        assert_eq!(level_color(&t, Level::Node, 6), (1, 2));
        assert_eq!(
            level_groups(&t, Level::Network),
            vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]
        );
    }

    #[test]
    fn groups_frontier_2() {
        let t = topo("frontier:2");
        assert_eq!(package_group(&t, 13), vec![12, 13]);
        assert_eq!(node_group(&t, 13), (8..16).collect::<Vec<_>>());
        assert_eq!(rail_group(&t, 13), vec![5, 13]);
        assert_eq!(level_group(&t, Level::Network, 13), vec![5, 13]);
        // same node, same die, every package
        assert_eq!(level_group(&t, Level::Node, 13), vec![9, 11, 13, 15]);
        assert_eq!(level_group(&t, Level::Package, 13), vec![12, 13]);
        assert_eq!(level_color(&t, Level::Package, 13), (6, 1));
        assert_eq!(level_color(&t, Level::Node, 13), (3, 2));
        assert_eq!(level_color(&t, Level::Network, 13), (5, 1));
        for level in Level::ALL {
            let gs = level_groups(&t, level);
            assert_eq!(gs.len(), 16 / t.level_size(level));
            for r in 0..16 {
                let (color, key) = level_color(&t, level, r);
                let g = level_group(&t, level, r);
                assert_eq!(gs[color as usize], g, "{level} {r}");
                assert_eq!(g[key as usize], r);
                assert!(g
                    .iter()
                    .all(|&m| m == r || t.link_class(r, m) == level.link_class()));
            }
        }
    }

    #[test]
    fn groups_nodes_3x8() {
        let t = topo("nodes:3x8");
        assert_eq!(node_group(&t, 17), (16..24).collect::<Vec<_>>());
        assert_eq!(rail_group(&t, 17), vec![1, 9, 17]);
        assert_eq!(
            level_group(&t, Level::Node, 17),
            (16..24).collect::<Vec<_>>()
        );
        assert_eq!(level_group(&t, Level::Package, 17), vec![17]);
        assert_eq!(level_groups(&t, Level::Node).len(), 3);
        assert_eq!(level_groups(&t, Level::Network).len(), 8);
    }

    #[test]
    fn mics() {
        let g = mics_groups(8, 2).unwrap();
        assert_eq!(
            g.partition,
            vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
        );
        assert_eq!(g.replication, vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
        assert_eq!(g.position(5), Some((2, 1)));
        let g = mics_groups(6, 6).unwrap();
        assert_eq!((g.partition.len(), g.replication.len()), (1, 6));
        let g = mics_groups(4, 1).unwrap();
        assert_eq!(g.replication, vec![vec![0, 1, 2, 3]]);
        for (w, p) in [(8, 0), (8, 3), (0, 1), (4, 8)] {
            assert!(
                matches!(
                    mics_groups(w, p),
                    Err(crate::error::Error::InvalidArgument(_))
                ),
                "{w} {p}"
            );
        }
    }

    #[test]
    fn switch_aware_without_switches_is_consecutive() {
        let t = topo("nodes:4x8");
        for p in [1, 2, 4, 8, 16, 32] {
            assert_eq!(
                switch_aware_partition_groups(&t, p).unwrap(),
                mics_groups(32, p).unwrap().partition
            );
        }
        assert!(switch_aware_partition_groups(&t, 3).is_err());
        assert!(switch_aware_partition_groups(&t, 0).is_err());
    }

    #[test]
    fn switch_aware_interleaved_switches() {
        // Switches interleaved with node ids: consecutive groups of 2 nodes always cross
        // the spine; switch-aware groups never do.
        let t = topo("nodes:4x8")
            .with_switch_of_node(vec![0, 1, 0, 1])
            .unwrap();
        let consecutive = mics_groups(32, 16).unwrap().partition;
        assert!(consecutive.iter().all(|g| switches_spanned(&t, g) == 2));
        let aware = switch_aware_partition_groups(&t, 16).unwrap();
        assert_partition(32, 16, &aware);
        assert!(
            aware.iter().all(|g| switches_spanned(&t, g) == 1),
            "{aware:?}"
        );
        let mut expect: Vec<usize> = (0..8).chain(16..24).collect();
        assert_eq!(aware[0], expect);
        expect = (8..16).chain(24..32).collect();
        assert_eq!(aware[1], expect);
        // replication groups pair shard i of each group
        let m = switch_aware_mics_groups(&t, 16).unwrap();
        assert_eq!(m.replication[0], vec![0, 8]);
        assert_eq!(m.replication[8], vec![16, 24]);
    }

    #[test]
    fn switch_aware_uneven_switches() {
        // Switch sizes 3, 4, 1 nodes; 2 nodes (16 ranks) per group.
        let t = topo("nodes:8x8")
            .with_switch_of_node(vec![0, 0, 0, 1, 1, 1, 1, 2])
            .unwrap();
        let nodes = |g: &Vec<usize>| {
            let mut n: Vec<usize> = g.iter().map(|&r| t.node_of(r)).collect();
            n.dedup();
            n
        };
        let consecutive = mics_groups(64, 16).unwrap().partition;
        let straddle =
            |gs: &[Vec<usize>]| gs.iter().filter(|g| switches_spanned(&t, g) > 1).count();
        assert_eq!(straddle(&consecutive), 2); // nodes {2,3} and {6,7}
        let aware = switch_aware_partition_groups(&t, 16).unwrap();
        assert_partition(64, 16, &aware);
        assert_eq!(
            aware.iter().map(nodes).collect::<Vec<_>>(),
            vec![vec![0, 1], vec![2, 7], vec![3, 4], vec![5, 6]]
        );
        assert_eq!(straddle(&aware), 1); // only the unavoidable leftover pair
                                         // 4-node groups: switch 1 holds one whole group (consecutive places none there)
        let aware = switch_aware_partition_groups(&t, 32).unwrap();
        assert_eq!(
            aware.iter().map(nodes).collect::<Vec<_>>(),
            vec![vec![0, 1, 2, 7], vec![3, 4, 5, 6]]
        );
        assert_eq!(straddle(&aware), 1);
        assert_eq!(straddle(&mics_groups(64, 32).unwrap().partition), 2);
    }

    #[test]
    fn switch_aware_spec_suffix_and_odd_sizes() {
        // nodes:6x4,switch=3: 3 nodes per switch; groups of 3 nodes fit, consecutive does too.
        let t = topo("nodes:6x4,switch=3");
        assert!(switch_aware_partition_groups(&t, 12)
            .unwrap()
            .iter()
            .all(|g| switches_spanned(&t, g) == 1));
        // groups of 2 nodes: consecutive puts nodes {2,3} across the boundary; so must
        // any placement (3 is odd), but only one group does.
        let aware = switch_aware_partition_groups(&t, 8).unwrap();
        assert_partition(24, 8, &aware);
        assert_eq!(
            aware.iter().filter(|g| switches_spanned(&t, g) > 1).count(),
            1
        );
        // sub-node groups stay consecutive and inside nodes
        assert_eq!(
            switch_aware_partition_groups(&t, 2).unwrap(),
            mics_groups(24, 2).unwrap().partition
        );
        // a size that is not node aligned (6 ranks, nodes of 4): valid partition, each
        // group on one switch since a switch holds 12 ranks
        let aware = switch_aware_partition_groups(&t, 6).unwrap();
        assert_partition(24, 6, &aware);
        assert!(aware.iter().all(|g| switches_spanned(&t, g) == 1));
        // larger than a switch: spans the minimum (2)
        let aware = switch_aware_partition_groups(&t, 24).unwrap();
        assert_eq!(aware, vec![(0..24).collect::<Vec<_>>()]);
        assert!(switch_aware_partition_groups(&t, 5).is_err());
    }
}
