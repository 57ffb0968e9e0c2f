//! Measured traffic of the local transport equals the closed forms of every algorithm
//! (MiCS §3.3: hierarchical all-gather moves (p-k)/p·M out of each node, ring (p-1)/p·M).
//! Notation: p ranks, k per node, n nodes, c bytes per rank chunk, M = p·c.
mod common;

use std::sync::Arc;
use strata::check::Kind;
use strata::traffic::TrafficReport;
use strata::{Algo, Buffer, Comm, DataType, ReduceOp, Request, Topology};

/// Traffic of one call of `kind` with `count` elements (NCCL's count) under `algo`.
fn measure(topo: &str, kind: Kind, count: usize, dtype: DataType, algo: Algo) -> TrafficReport {
    common::second_call_traffic(topo, move |c: &Comm| {
        let (ns, nr) = kind.sizes(count, c.size());
        let s = Buffer::zeroed(ns * dtype.size());
        let r = Buffer::zeroed(nr * dtype.size());
        c.submit(Request::new(kind.op(s, r, count, ReduceOp::Sum), dtype).with_algo(algo))
            .unwrap()
            .wait()
            .unwrap();
    })
}

fn rep(
    intra_package: u64,
    intra_node: u64,
    inter_node: u64,
    max_node_egress: u64,
) -> TrafficReport {
    TrafficReport {
        intra_package,
        intra_node,
        inter_node,
        max_node_egress,
    }
}

/// Ring in rank order on nodes:NxR: each rank sends (p-1)·c; n of the p ring edges cross
/// nodes. inter = n(p-1)c, intra_node = (p-n)(p-1)c, node egress = (p-1)c = (p-1)/p·M.
fn ring_2level(n: u64, k: u64, c: u64) -> TrafficReport {
    let p = n * k;
    if n == 1 {
        return rep(0, p * (p - 1) * c, 0, 0);
    }
    rep(0, (p - n) * (p - 1) * c, n * (p - 1) * c, (p - 1) * c)
}

/// hier on nodes:NxR: rails send (n-1)c each, nodes (k-1)·n·c each.
/// inter = p(n-1)c, intra_node = p(k-1)nc, node egress = k(n-1)c = (p-k)/p·M.
fn hier_2level(n: u64, k: u64, c: u64) -> TrafficReport {
    let p = n * k;
    rep(0, p * (k - 1) * n * c, p * (n - 1) * c, k * (n - 1) * c)
}

/// log-step on nodes:NxR (src/algo/log_step.rs): the step of size d moves m chunks from
/// every rank to the one d before it (reduce-scatter: after it); the pair shares a node
/// for n·(k-d)⁺ ranks. inter = c·Σ m(p - n(k-d)⁺), intra_node = c·Σ m·n(k-d)⁺, node
/// egress = c·Σ m·min(d, k). One rank per node: the ring's p(p-1)c and (p-1)c.
/// p a power of two (src/algo/recursive.rs; then k is one too): the step of size d
/// moves d chunks between x and x XOR d, inside the node for d < k, out of it (all k
/// ranks) for d ≥ k.
fn log_step_2level(n: u64, k: u64, c: u64) -> TrafficReport {
    let p = (n * k) as usize;
    let (mut inter, mut intra, mut egress) = (0, 0, 0);
    for (d, m) in strata::algo::log_step::steps(p) {
        let (d, m) = (d as u64, m as u64);
        if p.is_power_of_two() {
            if d < k {
                intra += m * n * k * c;
            } else {
                inter += m * n * k * c;
                egress += m * k * c;
            }
            continue;
        }
        let same = n * k.saturating_sub(d);
        inter += m * (n * k - same) * c;
        intra += m * same * c;
        egress += m * d.min(k) * c;
    }
    if n == 1 {
        return rep(0, intra + inter, 0, 0);
    }
    rep(0, intra, inter, egress)
}

/// frontier:N (4 packages x 2 dies per node), p = 8N.
/// ring: p/2 edges inside packages, p/2 - N between packages, N between nodes.
fn ring_frontier(n: u64, c: u64) -> TrafficReport {
    let p = 8 * n;
    rep(
        p / 2 * (p - 1) * c,
        (p / 2 - n) * (p - 1) * c,
        n * (p - 1) * c,
        (p - 1) * c,
    )
}

/// hier 3 levels (N, 4, 2): network (N-1)c, node 3Nc, package 4Nc = M/2 per rank.
fn hier_frontier(n: u64, c: u64) -> TrafficReport {
    let p = 8 * n;
    rep(
        p * 4 * n * c,
        p * 3 * n * c,
        p * (n - 1) * c,
        8 * (n - 1) * c,
    )
}

/// One case of the two-level closed forms: topology "nodes:NxK", N, K, count, dtype,
/// bytes per rank `c`, op.
struct Case<'a> {
    topo: &'a str,
    n: u64,
    k: u64,
    count: usize,
    dt: DataType,
    c: u64,
    kind: Kind,
}

impl Case<'_> {
    /// `algo`'s measured traffic is `want`.
    fn expect(&self, algo: Algo, want: TrafficReport) {
        let got = measure(self.topo, self.kind, self.count, self.dt, algo);
        assert_eq!(got, want, "{} {algo} {:?}", self.topo, self.kind);
    }
}

/// Every topology "nodes:NxK" of `topos`, every (count, dtype) of `counts`, for
/// all-gather and reduce-scatter.
fn each_2level(topos: &[&str], counts: [(usize, DataType); 2], f: impl Fn(&Case)) {
    for &topo in topos {
        let (n, k) = topo
            .strip_prefix("nodes:")
            .and_then(|nk| nk.split_once('x'))
            .map(|(n, k)| (n.parse().unwrap(), k.parse().unwrap()))
            .expect("nodes:NxK");
        for (count, dt) in counts {
            let c = (count * dt.size()) as u64;
            for kind in [Kind::AllGather, Kind::ReduceScatter] {
                f(&Case {
                    topo,
                    n,
                    k,
                    count,
                    dt,
                    c,
                    kind,
                });
            }
        }
    }
}

#[test]
fn all_gather_and_reduce_scatter_match_closed_forms_2_levels() {
    let topos = ["nodes:4x8", "nodes:3x8", "nodes:2x4", "nodes:1x4"];
    each_2level(
        &topos,
        [(1000, DataType::F32), (333, DataType::BF16)],
        |x| {
            x.expect(Algo::Ring, ring_2level(x.n, x.k, x.c));
            if x.n > 1 {
                x.expect(Algo::Hier, hier_2level(x.n, x.k, x.c));
            }
        },
    );
}

#[test]
fn log_step_matches_its_closed_form() {
    let topos = [
        "nodes:4x8",
        "nodes:3x2",
        "nodes:5x1",
        "nodes:2x4",
        "nodes:1x7",
    ];
    each_2level(&topos, [(250, DataType::F32), (333, DataType::BF16)], |x| {
        x.expect(Algo::LogStep, log_step_2level(x.n, x.k, x.c));
        if x.n > 1 && x.k > 1 {
            // The log-step inter-node stage moves hier's bytes: it saves steps.
            for algo in [Algo::HierLog, Algo::HierRing] {
                x.expect(algo, hier_2level(x.n, x.k, x.c));
            }
        }
    });
    // One rank per node: exactly the ring's bytes.
    assert_eq!(log_step_2level(6, 1, 10), ring_2level(6, 1, 10));
}

#[test]
fn mics_node_egress_claim() {
    // M = p·c bytes gathered; hier egress (p-k)/p·M against ring (p-1)/p·M.
    let (p, k, c) = (32u64, 8u64, 4096u64);
    let m = p * c;
    let hier = measure(
        "nodes:4x8",
        Kind::AllGather,
        1024,
        DataType::F32,
        Algo::Hier,
    );
    let ring = measure(
        "nodes:4x8",
        Kind::AllGather,
        1024,
        DataType::F32,
        Algo::Ring,
    );
    assert_eq!(hier.max_node_egress, (p - k) * m / p);
    assert_eq!(ring.max_node_egress, (p - 1) * m / p);
}

#[test]
fn frontier_three_levels() {
    for n in [1u64, 2, 3] {
        let topo = format!("frontier:{n}");
        let c = 4 * 250u64;
        for kind in [Kind::AllGather, Kind::ReduceScatter] {
            let ring = measure(&topo, kind, 250, DataType::F32, Algo::Ring);
            let hier = measure(&topo, kind, 250, DataType::F32, Algo::Hier);
            if n > 1 {
                assert_eq!(ring, ring_frontier(n, c), "{topo} ring {kind:?}");
            }
            assert_eq!(hier, hier_frontier(n, c), "{topo} hier {kind:?}");
            // The largest stage (each rank's half of the result) stays inside the package.
            let p = 8 * n;
            assert_eq!(hier.intra_package, p * (p * c / 2));
            assert_eq!(hier.max_node_egress, (p - 8) * (p * c) / p);
        }
    }
}

#[test]
fn all_reduce_all_to_all_broadcast() {
    let (n, k) = (2u64, 4u64);
    let p = n * k;
    // All-reduce with count divisible by p: twice the reduce-scatter of count/p chunks.
    let count = 800usize;
    let c = (count as u64 / p) * 4;
    let twice = |r: TrafficReport| {
        rep(
            2 * r.intra_package,
            2 * r.intra_node,
            2 * r.inter_node,
            2 * r.max_node_egress,
        )
    };
    for (algo, half) in [
        (Algo::Ring, ring_2level(n, k, c)),
        (Algo::Hier, hier_2level(n, k, c)),
    ] {
        assert_eq!(
            measure("nodes:2x4", Kind::AllReduce, count, DataType::F32, algo),
            twice(half),
            "{algo:?}"
        );
    }
    // All-to-all: b bytes to every peer directly.
    let b = 40u64;
    assert_eq!(
        measure("nodes:2x4", Kind::AllToAll, 10, DataType::F32, Algo::Auto),
        rep(0, p * (k - 1) * b, p * (p - k) * b, k * (p - k) * b)
    );
    // Broadcast from 0 along the chain: p-1 forwards of M, one across the node boundary.
    let m = 4000u64;
    assert_eq!(
        measure(
            "nodes:2x4",
            Kind::Broadcast { root: 0 },
            1000,
            DataType::F32,
            Algo::Auto
        ),
        rep(0, (p - 2) * m, m, m)
    );
}

#[test]
fn coalesced_moves_the_same_bytes_as_one_flat_call() {
    let counts = [5usize, 17, 0, 3];
    let total: usize = counts.iter().sum();
    let c = (total * 4) as u64;
    let got = common::second_call_traffic("nodes:2x4", move |comm: &Comm| {
        let p = comm.size();
        let sends: Vec<_> = counts.iter().map(|&n| Buffer::zeroed(n * 4)).collect();
        let recvs: Vec<_> = counts.iter().map(|&n| Buffer::zeroed(n * p * 4)).collect();
        comm.all_gather_coalesced(&sends, &recvs, &counts, DataType::F32)
            .unwrap()
            .wait()
            .unwrap();
    });
    // auto picks log-step for 100 bytes per rank on nodes:2x4 (three latency-bound
    // steps instead of hier's four).
    assert_eq!(got, log_step_2level(2, 4, c));
}

#[test]
fn ho_ring_moves_hier_bytes_per_class() {
    for kind in [Kind::AllGather, Kind::ReduceScatter] {
        let c = 4 * 1000u64;
        assert_eq!(
            measure("nodes:4x8", kind, 1000, DataType::F32, Algo::HoRing),
            hier_2level(4, 8, c),
            "{kind:?}"
        );
        assert_eq!(
            measure("nodes:3x8", kind, 1000, DataType::F32, Algo::HoRing),
            hier_2level(3, 8, c),
            "{kind:?}"
        );
        assert_eq!(
            measure("frontier:2", kind, 1000, DataType::F32, Algo::HoRing),
            hier_frontier(2, c),
            "{kind:?}"
        );
    }
}

/// A metered communicator counts exactly what its own collectives send (hierarchical
/// all-gather on nodes:2x4: inter (n-1)·M, intra n·(k-1)·M), while unmetered work on
/// another communicator runs at the same time and is not counted.
#[test]
fn metered_split_counts_only_its_own_traffic() {
    let t = Topology::parse("nodes:2x4").unwrap();
    let comms = Comm::local_world(8, Some(t.clone()), common::config()).unwrap();
    let meter = Arc::new(strata::traffic::Traffic::new(t.clone()));
    let c = 1000usize; // bytes per rank
    let hs: Vec<_> = comms
        .into_iter()
        .map(|w| {
            let meter = meter.clone();
            std::thread::spawn(move || {
                let m = w
                    .split_metered(Some(0), w.rank() as i32, meter)
                    .unwrap()
                    .unwrap();
                let other = w.split(Some(0), w.rank() as i32).unwrap().unwrap();
                let (s, r) = (Buffer::zeroed(c), Buffer::zeroed(8 * c));
                let (s2, r2) = (Buffer::zeroed(c), Buffer::zeroed(8 * c));
                let a = m
                    .submit(
                        Request::new(Kind::AllGather.op(s, r, c, ReduceOp::Sum), DataType::U8)
                            .with_algo(Algo::Hier),
                    )
                    .unwrap();
                let b = other
                    .submit(
                        Request::new(Kind::AllGather.op(s2, r2, c, ReduceOp::Sum), DataType::U8)
                            .with_algo(Algo::Ring),
                    )
                    .unwrap();
                a.wait().unwrap();
                b.wait().unwrap();
            })
        })
        .collect();
    hs.into_iter().for_each(|h| h.join().unwrap());
    let big_m = 8 * c as u64;
    assert_eq!(
        meter.snapshot().report(&t),
        rep(0, 2 * 3 * big_m, big_m, 4 * c as u64)
    );
}
