//! Schedules: the dry run of a collective describes exactly the transfers a real run
//! makes (recorded on the local transport), and from_plans rejects deadlocks.
mod common;

use std::sync::{Arc, Barrier, Mutex};
use strata::algo::plan::{self, BufId, Plan, Ring, Span, Step};
use strata::check::Kind;
use strata::comm::Hierarchy;
use strata::sim::{self, Schedule};
use strata::traffic::TrafficReport;
use strata::{Algo, Buffer, Comm, CommConfig, DataType, Error, ReduceOp, Request, Topology};

/// One real call of `kind` on every rank of a local world of `topo`, recorded (after a
/// warm-up call that creates the level communicators): the recorded schedule and the
/// measured traffic of the recorded call.
fn record(
    topo: &str,
    kind: Kind,
    algo: Algo,
    count: usize,
    dt: DataType,
    chunks: usize,
) -> (Schedule, TrafficReport) {
    let t = Topology::parse(topo).unwrap();
    let cfg = CommConfig {
        ho_ring_chunks: Some(chunks),
        ..common::config()
    };
    let comms = Comm::local_world(t.world_size(), Some(t.clone()), cfg).unwrap();
    let traffic = comms[0].traffic().unwrap();
    let bar = Arc::new(Barrier::new(comms.len()));
    let before = Arc::new(Mutex::new(None));
    let hs: Vec<_> = comms
        .into_iter()
        .map(|c| {
            let (bar, before, traffic) = (bar.clone(), before.clone(), traffic.clone());
            std::thread::spawn(move || {
                let call = |c: &Comm| {
                    let (ns, nr) = kind.sizes(count, c.size());
                    let s = Buffer::zeroed(ns * dt.size());
                    let r = Buffer::zeroed(nr * dt.size());
                    let req = Request::new(kind.op(s, r, count, ReduceOp::Sum), dt).with_algo(algo);
                    c.submit(req).unwrap().wait().unwrap();
                };
                call(&c);
                bar.wait();
                if c.rank() == 0 {
                    *before.lock().unwrap() = Some(traffic.snapshot());
                    c.start_recording().unwrap();
                }
                bar.wait();
                call(&c);
                c
            })
        })
        .collect();
    let comms: Vec<Comm> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    let measured = traffic
        .snapshot()
        .since(&before.lock().unwrap().take().unwrap())
        .report(&t);
    let s = comms[0].finish_recording().unwrap();
    (s, measured)
}

/// The dry run of `kind` over `count` f32 elements under `algo` on `topo`.
fn dry(topo: &Topology, kind: Kind, algo: Algo, count: usize) -> Schedule {
    sim::dry_run(&sim::Call::new(topo, kind, algo, count, DataType::F32)).unwrap()
}

/// Bytes per (src, dst) pair: the log-step all-gather sends a run of chunks that wraps
/// past the last one as two messages, which its plan models as one.
fn pair_bytes(s: &Schedule) -> Vec<(u32, u32, u64)> {
    let mut m = std::collections::BTreeMap::new();
    for t in &s.transfers {
        *m.entry((t.src, t.dst)).or_insert(0) += t.bytes;
    }
    m.into_iter().map(|((a, b), n)| (a, b, n)).collect()
}

fn multiset(s: &Schedule) -> Vec<(u32, u32, u64)> {
    let mut v: Vec<_> = s
        .transfers
        .iter()
        .map(|t| (t.src, t.dst, t.bytes))
        .collect();
    v.sort_unstable();
    v
}

#[test]
fn recordings_match_dry_runs_and_measured_traffic() {
    for topo in ["nodes:2x4", "frontier:1"] {
        let t = Topology::parse(topo).unwrap();
        for algo in [
            Algo::Ring,
            Algo::Hier,
            Algo::HierRing,
            Algo::HierLog,
            Algo::LogStep,
            Algo::HoRing,
        ] {
            for (kind, count, dt) in [
                (Kind::AllGather, 37, DataType::F32),
                (Kind::ReduceScatter, 37, DataType::BF16),
                (Kind::AllReduce, 101, DataType::F32),
            ] {
                let what = format!("{topo} {algo} {}", kind.name());
                let (rec, measured) = record(topo, kind, algo, count, dt, 3);
                // The host transports run the flat ring as one ring in rank order; the
                // dry run models NCCL's channel rings, one per rail, which is that one
                // ring on nodes with a single NIC.
                let mut one_rail = t.clone();
                one_rail.links.nics_per_node = 1;
                let dt_topo = if algo == Algo::Ring { &one_rail } else { &t };
                let dry = sim::dry_run(&sim::Call {
                    chunks: Some(3),
                    ..sim::Call::new(dt_topo, kind, algo, count, dt)
                })
                .unwrap();
                assert_eq!(dry.algo, Some(algo), "{what}");
                assert!(!dry.is_empty(), "{what}");
                if matches!(algo, Algo::Ring | Algo::HierRing | Algo::HoRing) {
                    assert_eq!(multiset(&rec), multiset(&dry), "{what}: transfers differ");
                }
                assert_eq!(pair_bytes(&rec), pair_bytes(&dry), "{what}: bytes differ");
                assert_eq!(rec.traffic(&t), measured, "{what}: recording vs measured");
                assert_eq!(dry.traffic(&t), measured, "{what}: dry run vs measured");
                // Recorded schedules replay too (deps in observed program order).
                let r = sim::replay(&rec, &t).unwrap();
                assert!(
                    r.makespan_us > 0.0 && r.makespan_us >= r.bandwidth_bound_us,
                    "{what}"
                );
            }
        }
    }
}

#[test]
fn dry_run_shapes() {
    let t = Topology::parse("frontier:2").unwrap();
    let p = t.world_size();
    // ring: NCCL's channel rings, one per NIC (4 on Frontier), each p(p-1) transfers of
    // its share of the chunk (10 elements: 3, 3, 2, 2), each leaving a node through its
    // own NIC; hier: the stages' batches.
    let s = dry(&t, Kind::AllGather, Algo::Ring, 10);
    assert_eq!(s.len(), 4 * p * (p - 1));
    assert_eq!(
        s.rings,
        ["network", "node", "package", "flat", "channel0", "channel1", "channel2", "channel3"]
    );
    for (c, bytes) in [12u64, 12, 8, 8].into_iter().enumerate() {
        let ring: Vec<_> = s
            .transfers
            .iter()
            .filter(|x| x.ring == 4 + c as u32)
            .collect();
        assert_eq!(ring.len(), p * (p - 1));
        assert!(ring.iter().all(|x| x.bytes == bytes));
        let exits: std::collections::BTreeSet<u32> = ring
            .iter()
            .filter(|x| x.class == strata::topology::LinkClass::InterNode)
            .map(|x| x.src % 8)
            .collect();
        assert_eq!(
            exits.into_iter().collect::<Vec<_>>(),
            [2 * c as u32],
            "ring {c}: NIC {c}"
        );
    }
    let s1 = dry(
        &Topology::parse("frontier:1").unwrap(),
        Kind::AllGather,
        Algo::Ring,
        10,
    );
    assert_eq!(s1.len(), 8 * 7);
    assert!(s1.transfers.iter().all(|x| x.bytes == 40));
    let s = dry(&t, Kind::AllGather, Algo::Hier, 10);
    // levels (2, 4, 2): B = 1, 2, 8 rings of g-1 steps each
    assert_eq!(s.len(), p * (1 + 2 * 3 + 8));
    assert_eq!(s.rings, ["network", "node", "package", "flat"]);
    // ho-ring: same bytes per class as hier, in pieces.
    let h = sim::dry_run(&sim::Call {
        chunks: Some(4),
        ..sim::Call::new(&t, Kind::AllGather, Algo::HoRing, 10, DataType::F32)
    })
    .unwrap();
    assert_eq!(h.traffic(&t), s.traffic(&t));
    assert_eq!(h.len(), 4 * s.len());
    // hier / ho-ring fall back to ring where the world spans one level, like the selector.
    let one = Topology::parse("nodes:1x8").unwrap();
    let f = dry(&one, Kind::ReduceScatter, Algo::HoRing, 4);
    assert_eq!(f.algo, Some(Algo::Ring));
    // auto resolves to one of the four, by the selector's estimates (log-step here:
    // recursive halving and doubling keep three of their four steps inside a node).
    let a = dry(&t, Kind::AllReduce, Algo::Auto, 1 << 16);
    assert!(matches!(
        a.algo,
        Some(Algo::Ring | Algo::Hier | Algo::HoRing | Algo::LogStep)
    ));
    // one rank: nothing to move
    let s = dry(
        &Topology::parse("nodes:1x1").unwrap(),
        Kind::AllGather,
        Algo::Ring,
        8,
    );
    assert!(s.is_empty());
    assert_eq!(
        sim::replay(&s, &Topology::parse("nodes:1x1").unwrap())
            .unwrap()
            .makespan_us,
        0.0
    );
    // other ops: a clear error
    for k in [Kind::AllToAll, Kind::Broadcast { root: 0 }] {
        let e = sim::dry_run(&sim::Call::new(&t, k, Algo::Ring, 8, DataType::F32)).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument(_)) && e.to_string().contains(k.name()),
            "{e}"
        );
    }
}

#[test]
fn dependencies_follow_streams_and_explicit_deps() {
    // nodes:2x2 hier all-gather: rank 0 runs a network step (to 2) then a node step (to 1)
    // that waits for it.
    let t = Topology::parse("nodes:2x2").unwrap();
    let s = dry(&t, Kind::AllGather, Algo::Hier, 4);
    let find = |src: u32, dst: u32| {
        s.transfers
            .iter()
            .position(|x| x.src == src && x.dst == dst)
            .unwrap()
    };
    let (net, node) = (find(0, 2), find(0, 1));
    // the node step waits for rank 0's network step and for the network transfer 2 -> 0
    // it receives (a sendrecv completes when both halves did).
    let deps = s.deps(node);
    assert!(deps.contains(&(net as u32)), "{deps:?}");
    assert!(deps.contains(&(find(2, 0) as u32)), "{deps:?}");
    assert!(s.deps(net).is_empty());
    assert_eq!(s.ring_name(net), "network");
    assert_eq!(s.ring_name(node), "node");
}

fn step(ring: Ring, dst: usize, src: usize, len: usize, deps: Vec<usize>) -> Step {
    let sp = Span {
        buf: BufId::Recv,
        off: 0,
        len,
    };
    Step {
        ring,
        dst,
        src,
        send: sp,
        recv: sp,
        reduce: false,
        deps,
    }
}

#[test]
fn from_plans_rejects_deadlocks_and_mismatches() {
    let t = Topology::parse("nodes:1x2").unwrap();
    let m = [0usize, 1];
    let ok = |plans: &[Plan]| Schedule::from_plans(&t, None, &m, plans);
    // a matched exchange
    let pair = vec![
        Plan {
            steps: vec![step(Ring::Flat, 1, 1, 8, vec![])],
        },
        Plan {
            steps: vec![step(Ring::Flat, 0, 0, 8, vec![])],
        },
    ];
    let s = ok(&pair).unwrap();
    assert_eq!(s.len(), 2);
    // rank 1 waits for a second message rank 0 never sends: unmatched receive
    let mut bad = pair.clone();
    bad[1].steps.push(step(Ring::Flat, 0, 0, 8, vec![]));
    let e = ok(&bad).unwrap_err().to_string();
    assert!(e.contains("unmatched"), "{e}");
    // sizes differ
    let mut bad = pair.clone();
    bad[1].steps[0].recv.len = 4;
    let e = ok(&bad).unwrap_err().to_string();
    assert!(e.contains("receives 4 bytes"), "{e}");
    // two exchanges in a row are fine; a dependency on a later step is refused
    let two = vec![
        Plan {
            steps: vec![
                step(Ring::Flat, 1, 1, 8, vec![]),
                step(Ring::Flat, 1, 1, 8, vec![]),
            ],
        },
        Plan {
            steps: vec![
                step(Ring::Flat, 0, 0, 8, vec![]),
                step(Ring::Flat, 0, 0, 8, vec![]),
            ],
        },
    ];
    assert_eq!(ok(&two).unwrap().len(), 4);
    let mut fwd = two.clone();
    fwd[1].steps[0].deps = vec![1];
    assert!(ok(&fwd).unwrap_err().to_string().contains("later step"));
    // Level rings need a hierarchy; world ranks are mapped through members.
    let t4 = Topology::parse("dgx-a100:4").unwrap();
    let rail: Vec<usize> = (0..4).map(|n| n * 8 + 3).collect();
    let plans: Vec<Plan> = (0..4).map(|r| plan::ring_all_gather(4, r, 100)).collect();
    let s = Schedule::from_plans(&t4, None, &rail, &plans).unwrap();
    assert!(s
        .transfers
        .iter()
        .all(|x| x.src % 8 == 3 && x.dst % 8 == 3 && x.src != x.dst));
    let h = Hierarchy::detect(&t4, &rail).unwrap();
    assert_eq!(h.sizes(), [4]);
}

#[test]
fn cycles_are_deadlocks() {
    // nodes:2x2, levels network (0: ranks 0-2, 1-3) and node (1: ranks 0-1, 2-3). Every
    // rank runs one exchange per level, the second waiting for the first (an explicit
    // dependency, as HO-Ring's cross-level steps do):
    //   rank 0: node(1), then net(2)     rank 1: net(3), then node(0)
    //   rank 3: node(2), then net(1)     rank 2: net(0), then node(3)
    // rank 0's net send waits for its node step, which completes with rank 1's node send,
    // which waits for rank 1's net step, completed by rank 3's net send, which waits for
    // rank 3's node step, completed by rank 2's node send, which waits for rank 2's net
    // step, completed by rank 0's net send: a cycle, reported as a deadlock.
    let t = Topology::parse("nodes:2x2").unwrap();
    let members: Vec<usize> = (0..4).collect();
    let h = Hierarchy::detect(&t, &members).unwrap();
    let (net, node) = (Ring::Level(0), Ring::Level(1));
    let plans = vec![
        Plan {
            steps: vec![step(node, 1, 1, 8, vec![]), step(net, 1, 1, 8, vec![0])],
        },
        Plan {
            steps: vec![step(net, 1, 1, 8, vec![]), step(node, 0, 0, 8, vec![0])],
        },
        Plan {
            steps: vec![step(net, 0, 0, 8, vec![]), step(node, 1, 1, 8, vec![0])],
        },
        Plan {
            steps: vec![step(node, 0, 0, 8, vec![]), step(net, 0, 0, 8, vec![0])],
        },
    ];
    let e = Schedule::from_plans(&t, Some(&h), &members, &plans).unwrap_err();
    assert!(e.to_string().contains("deadlock"), "{e}");
    // The same steps with rank 2 and 3 in rank 0 and 1's order have no cycle.
    let mut fine = plans.clone();
    fine[2].steps = vec![step(node, 1, 1, 8, vec![]), step(net, 0, 0, 8, vec![0])];
    fine[3].steps = vec![step(net, 0, 0, 8, vec![]), step(node, 0, 0, 8, vec![0])];
    let s = Schedule::from_plans(&t, Some(&h), &members, &fine).unwrap();
    assert_eq!(s.len(), 8);
    sim::replay(&s, &t).unwrap();
}
