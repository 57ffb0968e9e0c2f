//! Traffic accounting: every transfer (src world rank, dst world rank, bytes), classified
//! by link class (contract: `intra_package`, `intra_node`, `inter_node`, `max_node_egress`).
//!
//! The local transport records real transfers; the MPI transport records the sends its
//! own ring and direct algorithms issue (labelled `nominal`: the MPI library may route
//! them differently underneath).

use crate::topology::{LinkClass, Topology};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

/// Shared byte counters, one per ordered pair of world ranks.
pub struct Traffic {
    topo: Topology,
    n: usize,
    bytes: Vec<AtomicU64>,
}

impl Traffic {
    /// Counters for the ranks of `topo`.
    pub fn new(topo: Topology) -> Traffic {
        let n = topo.world_size();
        Traffic {
            topo,
            n,
            bytes: (0..n * n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Record `bytes` sent from world rank `src` to world rank `dst`.
    pub fn record(&self, src: usize, dst: usize, bytes: usize) {
        if src < self.n && dst < self.n {
            self.bytes[src * self.n + dst].fetch_add(bytes as u64, Ordering::Relaxed);
        }
    }

    /// The counters now, as a matrix (row = sender).
    pub fn snapshot(&self) -> TrafficMatrix {
        TrafficMatrix {
            n: self.n,
            bytes: self
                .bytes
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
        }
    }

    /// The topology used to classify links.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }
}

/// A copy of the counters; subtract two to get the traffic of what ran in between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrafficMatrix {
    pub n: usize,
    pub bytes: Vec<u64>,
}

impl TrafficMatrix {
    /// All zero.
    pub fn zero(n: usize) -> TrafficMatrix {
        TrafficMatrix {
            n,
            bytes: vec![0; n * n],
        }
    }

    /// Element-wise `self - earlier`.
    pub fn since(&self, earlier: &TrafficMatrix) -> TrafficMatrix {
        TrafficMatrix {
            n: self.n,
            bytes: self
                .bytes
                .iter()
                .zip(&earlier.bytes)
                .map(|(a, b)| a - b)
                .collect(),
        }
    }

    /// Element-wise sum (to merge per-process rows on MPI).
    pub fn add(&mut self, other: &TrafficMatrix) {
        self.bytes
            .iter_mut()
            .zip(&other.bytes)
            .for_each(|(a, b)| *a += b);
    }

    /// Row `src` only (what one process of an MPI job knows).
    pub fn row(&self, src: usize) -> &[u64] {
        &self.bytes[src * self.n..(src + 1) * self.n]
    }

    /// Per-class totals and the largest node egress.
    pub fn report(&self, topo: &Topology) -> TrafficReport {
        let mut r = TrafficReport::default();
        let mut egress = vec![0u64; topo.nodes];
        for s in 0..self.n {
            for d in 0..self.n {
                let b = self.bytes[s * self.n + d];
                if b == 0 {
                    continue;
                }
                match topo.link_class(s, d) {
                    LinkClass::IntraPackage => r.intra_package += b,
                    LinkClass::IntraNode => r.intra_node += b,
                    LinkClass::InterNode => {
                        r.inter_node += b;
                        egress[topo.node_of(s)] += b;
                    }
                }
            }
        }
        r.max_node_egress = egress.into_iter().max().unwrap_or(0);
        r
    }
}

/// Bytes per link class summed over ranks, and the most bytes leaving any one node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrafficReport {
    pub intra_package: u64,
    pub intra_node: u64,
    pub inter_node: u64,
    pub max_node_egress: u64,
}

impl TrafficReport {
    /// Divide every figure by `n` (per-call averages over `n` identical calls).
    pub fn per_call(self, n: u64) -> TrafficReport {
        let n = n.max(1);
        TrafficReport {
            intra_package: self.intra_package / n,
            intra_node: self.intra_node / n,
            inter_node: self.inter_node / n,
            max_node_egress: self.max_node_egress / n,
        }
    }
}
