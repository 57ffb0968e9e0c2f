//! Traffic accounting: every transfer (src world rank, dst world rank, bytes), classified
//! by link class (contract: `intra_package`, `intra_node`, `inter_node`, `max_node_egress`).
//!
//! The local transport records real transfers; the MPI transport records the sends its
//! own ring and direct algorithms issue (labelled `nominal`: the MPI library may route
//! them differently underneath).
//!
//! Schedule recording: [`Traffic::start_recording`] turns on an event log that the
//! local transport appends to on every send (before the message can be received) and
//! every completed receive; [`Traffic::take_recording`] stops it and returns the
//! events in the order they happened, which [`crate::sim::Schedule::from_recording`]
//! turns into a dependency graph of transfers. Off by default (one atomic load per
//! transfer).

#![forbid(unsafe_code)]

use crate::topology::{LinkClass, Topology};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// What a recorded [`Event`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// `src` handed `bytes` for `dst` to the transport (logged before it can be received).
    Send,
    /// `dst` completed the receive of a message from `src`.
    Recv,
}

/// One recorded point-to-point event (world ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub kind: EventKind,
    /// The communicator the message travelled on (the transport's group id; messages
    /// are FIFO per (group, src, dst)).
    pub group: u64,
    pub src: usize,
    pub dst: usize,
    pub bytes: usize,
    /// Position in the world's total order of events (0, 1, 2, ... since
    /// [`Traffic::start_recording`]); a rank's events in `seq` order are its program
    /// order, across all its communicators' streams.
    pub seq: u64,
}

/// Shared byte counters, one per ordered pair of world ranks.
pub struct Traffic {
    topo: Topology,
    n: usize,
    bytes: Vec<AtomicU64>,
    recording: AtomicBool,
    events: Mutex<Option<Vec<Event>>>,
}

impl Traffic {
    /// Counters for the ranks of `topo`.
    pub fn new(topo: Topology) -> Traffic {
        let n = topo.world_size();
        Traffic {
            topo,
            n,
            bytes: (0..n * n).map(|_| AtomicU64::new(0)).collect(),
            recording: AtomicBool::new(false),
            events: Mutex::new(None),
        }
    }

    /// Start (or restart, dropping what was logged) the event log.
    pub fn start_recording(&self) {
        let mut g = self.events.lock().unwrap_or_else(|e| e.into_inner());
        *g = Some(Vec::new());
        self.recording.store(true, Ordering::SeqCst);
    }

    /// True while the event log is on.
    pub fn is_recording(&self) -> bool {
        self.recording.load(Ordering::Relaxed)
    }

    /// Stop the event log and return its events in `seq` order (empty when it was off).
    pub fn take_recording(&self) -> Vec<Event> {
        let mut g = self.events.lock().unwrap_or_else(|e| e.into_inner());
        self.recording.store(false, Ordering::SeqCst);
        g.take().unwrap_or_default()
    }

    /// Append an event when recording (called by the local transport).
    pub fn log(&self, kind: EventKind, group: u64, src: usize, dst: usize, bytes: usize) {
        if !self.recording.load(Ordering::Relaxed) {
            return;
        }
        let mut g = self.events.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = g.as_mut() {
            let seq = v.len() as u64;
            v.push(Event {
                kind,
                group,
                src,
                dst,
                bytes,
                seq,
            });
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

    /// The sends of `senders` only: every other row zeroed.
    pub fn rows_of(&self, senders: &[usize]) -> TrafficMatrix {
        let mut out = TrafficMatrix::zero(self.n);
        for &s in senders.iter().filter(|&&s| s < self.n) {
            let r = s * self.n..(s + 1) * self.n;
            out.bytes[r.clone()].copy_from_slice(&self.bytes[r]);
        }
        out
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
