//! The hierarchy a communicator's ranks form inside the world topology: which levels
//! (network, node, package) it spans, how many ranks per level, and this rank's index
//! in each. Computed from the members' coordinates, never by hand in an algorithm.

use super::{Level, Topology};

/// Levels outermost first with their sizes (levels of size 1 are left out). The
/// communicator's rank is the row-major index over these sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub levels: Vec<(Level, usize)>,
}

impl Hierarchy {
    /// The hierarchy of `members` (world ranks, in communicator order), or `None` when
    /// the members are not a regular mesh of the topology (uneven ranks per node or per
    /// package, or nodes interleaved), in which case hierarchical algorithms fall back.
    pub fn detect(topo: &Topology, members: &[usize]) -> Option<Hierarchy> {
        let coords: Vec<_> = members.iter().map(|&r| topo.coord(r)).collect();
        let dims = [
            mesh_dim(&coords.iter().map(|c| c.node).collect::<Vec<_>>())?,
            mesh_dim(
                &coords
                    .iter()
                    .map(|c| (c.node, c.package))
                    .collect::<Vec<_>>(),
            )?,
        ];
        let n_nodes = dims[0];
        let n_pkg_total = dims[1];
        if n_pkg_total % n_nodes != 0 {
            return None;
        }
        let per_node_pkgs = n_pkg_total / n_nodes;
        let per_pkg = members.len() / n_pkg_total;
        if per_pkg * n_pkg_total != members.len() {
            return None;
        }
        let levels = [
            (Level::Network, n_nodes),
            (Level::Node, per_node_pkgs),
            (Level::Package, per_pkg),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .collect();
        Some(Hierarchy { levels })
    }

    /// Size of each level, outermost first.
    pub fn sizes(&self) -> Vec<usize> {
        self.levels.iter().map(|l| l.1).collect()
    }

    /// This rank's index along each level (row-major decomposition of `rank`).
    pub fn coords(&self, rank: usize) -> Vec<usize> {
        let mut rem = rank;
        let mut out = vec![0; self.levels.len()];
        for i in (0..self.levels.len()).rev() {
            out[i] = rem % self.levels[i].1;
            rem /= self.levels[i].1;
        }
        out
    }

    /// (color, key) that split a communicator into the groups of level `i`: ranks
    /// differing only in that level's index share a color; the key is that index.
    pub fn split_color(&self, i: usize, rank: usize) -> (u32, i32) {
        let c = self.coords(rank);
        let stride: usize = self.levels[i + 1..].iter().map(|l| l.1).product();
        ((rank - c[i] * stride) as u32, c[i] as i32)
    }
}

/// Number of contiguous runs in `keys`, provided every run has the same length and no
/// key comes back after its run ended; `None` otherwise.
fn mesh_dim<K: PartialEq + Copy>(keys: &[K]) -> Option<usize> {
    let mut runs: Vec<(K, usize)> = Vec::new();
    for k in keys {
        match runs.last_mut() {
            Some((last, n)) if last == k => *n += 1,
            _ => {
                if runs.iter().any(|(r, _)| r == k) {
                    return None;
                }
                runs.push((*k, 1));
            }
        }
    }
    let first = runs.first()?.1;
    runs.iter().all(|r| r.1 == first).then_some(runs.len())
}
