//! The one selection rule (`strata::algo::select::select`), pinned: which algorithm
//! `auto` picks for each preset topology at small and large sizes, that named
//! algorithms fall back to `ring` exactly where their constraints fail, and that the
//! submit path runs what `select` says (a fallback really happens).

use strata::algo::select::{select, Choice, Shape};
use strata::kinds::Kind;
use strata::topology::Hierarchy;
use strata::{Algo, Buffer, Comm, CommConfig, DataType, Op, ReduceOp, Request, Topology};

fn pick(spec: &str, kind: Kind, bytes: usize, wanted: Algo) -> Choice {
    let topo = Topology::parse(spec).unwrap();
    let members: Vec<usize> = (0..topo.world_size()).collect();
    let h = Hierarchy::detect(&topo, &members);
    let dtype = DataType::F32;
    let shape = Shape {
        kind: Some(kind),
        redop: (kind != Kind::AllGather).then_some(ReduceOp::Sum),
        count: bytes / dtype.size(),
        dtype,
        topo: &topo,
        members: &members,
        hierarchy: h.as_ref(),
        chunks: None,
    };
    select(wanted, &shape)
}

#[test]
fn auto_is_pinned_per_topology_and_size() {
    use Algo::*;
    use Kind::*;
    // (topology, op, bytes per rank chunk (all-reduce: whole buffer), f32, pick). Pinned
    // from the model of src/topology/presets.rs: a change of the link figures or of the
    // estimates in src/algo/select.rs shows up here, row by row.
    let table = [
        ("dgx-a100:2", AllGather, 8, LogStep),
        ("dgx-a100:2", AllGather, 65536, Hier),
        ("dgx-a100:2", AllGather, 16777216, HoRing),
        ("dgx-a100:2", AllGather, 268435456, HoRing),
        ("dgx-a100:2", ReduceScatter, 8, LogStep),
        ("dgx-a100:2", ReduceScatter, 65536, Hier),
        ("dgx-a100:2", ReduceScatter, 16777216, HoRing),
        ("dgx-a100:2", ReduceScatter, 268435456, HoRing),
        ("dgx-a100:2", AllReduce, 8, LogStep),
        ("dgx-a100:2", AllReduce, 65536, LogStep),
        ("dgx-a100:2", AllReduce, 16777216, Hier),
        ("dgx-a100:2", AllReduce, 268435456, HoRing),
        ("dgx-h100:4", AllGather, 8, LogStep),
        ("dgx-h100:4", AllGather, 65536, LogStep),
        ("dgx-h100:4", AllGather, 16777216, Ring),
        ("dgx-h100:4", AllGather, 268435456, Ring),
        ("dgx-h100:4", ReduceScatter, 8, LogStep),
        ("dgx-h100:4", ReduceScatter, 65536, LogStep),
        ("dgx-h100:4", ReduceScatter, 16777216, Ring),
        ("dgx-h100:4", ReduceScatter, 268435456, Ring),
        ("dgx-h100:4", AllReduce, 8, LogStep),
        ("dgx-h100:4", AllReduce, 65536, LogStep),
        ("dgx-h100:4", AllReduce, 16777216, Hier),
        ("dgx-h100:4", AllReduce, 268435456, Ring),
        ("frontier:2", AllGather, 8, LogStep),
        ("frontier:2", AllGather, 65536, Hier),
        ("frontier:2", AllGather, 16777216, HoRing),
        ("frontier:2", AllGather, 268435456, HoRing),
        ("frontier:2", ReduceScatter, 8, LogStep),
        ("frontier:2", ReduceScatter, 65536, Hier),
        ("frontier:2", ReduceScatter, 16777216, HoRing),
        ("frontier:2", ReduceScatter, 268435456, HoRing),
        ("frontier:2", AllReduce, 8, LogStep),
        ("frontier:2", AllReduce, 65536, LogStep),
        ("frontier:2", AllReduce, 16777216, HoRing),
        ("frontier:2", AllReduce, 268435456, HoRing),
        ("p4d:2", AllGather, 8, LogStep),
        ("p4d:2", AllGather, 65536, Hier),
        ("p4d:2", AllGather, 16777216, HoRing),
        ("p4d:2", AllGather, 268435456, HoRing),
        ("p4d:2", ReduceScatter, 8, LogStep),
        ("p4d:2", ReduceScatter, 65536, Hier),
        ("p4d:2", ReduceScatter, 16777216, HoRing),
        ("p4d:2", ReduceScatter, 268435456, HoRing),
        ("p4d:2", AllReduce, 8, LogStep),
        ("p4d:2", AllReduce, 65536, LogStep),
        ("p4d:2", AllReduce, 16777216, Hier),
        ("p4d:2", AllReduce, 268435456, HoRing),
        ("nodes:1x8", AllGather, 8, LogStep),
        ("nodes:1x8", AllGather, 65536, LogStep),
        ("nodes:1x8", AllGather, 16777216, Ring),
        ("nodes:1x8", AllGather, 268435456, Ring),
        ("nodes:1x8", ReduceScatter, 8, LogStep),
        ("nodes:1x8", ReduceScatter, 65536, LogStep),
        ("nodes:1x8", ReduceScatter, 16777216, Ring),
        ("nodes:1x8", ReduceScatter, 268435456, Ring),
        ("nodes:1x8", AllReduce, 8, LogStep),
        ("nodes:1x8", AllReduce, 65536, LogStep),
        ("nodes:1x8", AllReduce, 16777216, Ring),
        ("nodes:1x8", AllReduce, 268435456, Ring),
        ("nodes:3x2", AllGather, 8, LogStep),
        ("nodes:3x2", AllGather, 65536, Hier),
        ("nodes:3x2", AllGather, 16777216, Hier),
        ("nodes:3x2", AllGather, 268435456, HoRing),
        ("nodes:3x2", ReduceScatter, 8, LogStep),
        ("nodes:3x2", ReduceScatter, 65536, Hier),
        ("nodes:3x2", ReduceScatter, 16777216, Hier),
        ("nodes:3x2", ReduceScatter, 268435456, HoRing),
        ("nodes:3x2", AllReduce, 8, LogStep),
        ("nodes:3x2", AllReduce, 65536, Hier),
        ("nodes:3x2", AllReduce, 16777216, Hier),
        ("nodes:3x2", AllReduce, 268435456, HoRing),
    ];
    let mut wrong = Vec::new();
    for (spec, kind, bytes, want) in table {
        let c = pick(spec, kind, bytes, Auto);
        if c.algo != want {
            wrong.push(format!(
                "{spec} {} {bytes} B: auto picked {} ({}), pinned {want}",
                kind.name(),
                c.algo,
                c.reason
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn named_algorithms_fall_back_exactly_where_constraints_fail() {
    use Kind::*;
    let fell = |c: &Choice| c.algo == Algo::Ring && c.fallback.is_some();
    let runs = |topo: &str, kind: Kind, algo: Algo| {
        assert_eq!(pick(topo, kind, 4096, algo).algo, algo, "{topo} {kind:?}")
    };
    // One node: no levels to be hierarchical over.
    assert!(fell(&pick("nodes:1x8", AllGather, 4096, Algo::Hier)));
    assert!(fell(&pick("nodes:1x8", ReduceScatter, 4096, Algo::HoRing)));
    // Two nodes: they run.
    runs("nodes:2x4", AllGather, Algo::Hier);
    runs("nodes:2x4", AllReduce, Algo::HoRing);
    // Quantized algorithms: only their collective, only floats.
    assert!(fell(&pick("nodes:2x4", AllGather, 4096, Algo::Qgz)));
    assert!(fell(&pick("nodes:2x4", ReduceScatter, 4096, Algo::Qwz)));
    runs("nodes:2x4", ReduceScatter, Algo::Qgz);
    runs("nodes:1x8", ReduceScatter, Algo::Qgz1);
    // Ring is never a fallback; auto never picks a lossy algorithm.
    let r = pick("nodes:1x8", AllGather, 4096, Algo::Ring);
    assert_eq!((r.algo, r.fallback), (Algo::Ring, None));
    for kind in [AllGather, ReduceScatter, AllReduce] {
        for b in [8, 1 << 30] {
            let a = pick("dgx-a100:4", kind, b, Algo::Auto).algo;
            assert!(
                matches!(a, Algo::Ring | Algo::Hier | Algo::HoRing | Algo::LogStep),
                "{a}"
            );
        }
    }
}

/// Traffic matrix of one reduce-scatter of `count` elements of `dtype` with `algo` on a
/// local world of `spec`, and the choice the communicator made.
fn run_rs(spec: &str, dtype: DataType, algo: Algo) -> (Vec<u64>, Choice) {
    let topo = Topology::parse(spec).unwrap();
    let p = topo.world_size();
    let comms = Comm::local_world(p, Some(topo), CommConfig::default()).unwrap();
    let traffic = comms[0].traffic().unwrap();
    let count = 1000;
    let mk = move |c: &Comm| {
        let n = count * c.size() * dtype.size();
        let send = Buffer::from_bytes(&vec![1u8; n]);
        let recv = Buffer::zeroed(count * dtype.size());
        let req = Request::new(
            Op::ReduceScatter {
                send,
                recv,
                count,
                op: ReduceOp::Sum,
            },
            dtype,
        )
        .with_algo(algo);
        (c.choose(&req), req)
    };
    let before = traffic.snapshot();
    let hs: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let (choice, req) = mk(&c);
                c.submit(req).unwrap().wait().unwrap();
                choice
            })
        })
        .collect();
    let choices: Vec<Choice> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    let m = traffic.snapshot().since(&before);
    (m.bytes, choices[0].clone())
}

#[test]
fn a_fallback_really_runs_the_ring() {
    // qgz on i32 cannot quantize: it falls back, and the bytes on the wire are ring's.
    let (ring, c) = run_rs("nodes:2x2", DataType::I32, Algo::Ring);
    assert_eq!(c.algo, Algo::Ring);
    let (fallback, c) = run_rs("nodes:2x2", DataType::I32, Algo::Qgz);
    assert_eq!(c.algo, Algo::Ring);
    assert!(
        c.fallback
            .as_deref()
            .unwrap_or("")
            .contains("f32, f16 and bf16"),
        "{c:?}"
    );
    assert_eq!(
        fallback, ring,
        "the fallback moved other bytes than the ring"
    );
    // On f32 it applies, and moves other (fewer) bytes than the ring.
    let (ring, _) = run_rs("nodes:2x2", DataType::F32, Algo::Ring);
    let (q, c) = run_rs("nodes:2x2", DataType::F32, Algo::Qgz);
    assert_eq!((c.algo, c.fallback), (Algo::Qgz, None));
    assert!(q.iter().sum::<u64>() < ring.iter().sum::<u64>());
}

#[test]
fn hier_inter_node_stage_crossover_at_1024_nodes() {
    // dgx-h100:1024: the inter-node stage is 1024 ranks (one per node) on 4 us, 47 GB/s
    // links. Ring (g-1)(α + c/β) against log-step ⌈log₂g⌉α + (g-1)c/(0.75β): log-step
    // until c = 3αβ(g-1-10)/(g-1), about 545 KiB per rank (a 4.3 GiB all-gather over
    // the 8192 ranks). Quoted in docs/algorithms.md.
    use strata::algo::select::{stage_log_step, stage_times};
    use strata::topology::LinkClass::InterNode;
    let t = Topology::parse("dgx-h100:1024").unwrap();
    let l = t.links.inter_node;
    let want = 3.0 * l.latency_us * l.bandwidth_gbs * 1e3 * 1013.0 / 1023.0;
    assert!(stage_log_step(&t, InterNode, 1024, want as usize - 1));
    assert!(!stage_log_step(&t, InterNode, 1024, want as usize + 1));
    assert!((540 << 10..550 << 10).contains(&(want as usize)), "{want}");
    // 64 MiB over 8192 ranks: 8 KiB per rank, 10 latency-bound steps instead of 1023:
    // 4.27 ms against 0.28 ms.
    let (ring, log) = stage_times(&t, InterNode, 1024, 8192);
    assert!(
        (ring - 4270.3).abs() < 0.1 && (log - 277.7).abs() < 0.1,
        "{ring} {log}"
    );
    // Two or three ranks: as many steps either way, so the ring (full bandwidth) wins.
    assert!(!stage_log_step(&t, InterNode, 2, 8));
    assert!(!stage_log_step(&t, InterNode, 3, 8));
}

/// The estimates of a call on `t` (whole world, its hierarchy).
fn estimates_on(t: &Topology, kind: Kind, bytes: usize) -> strata::algo::select::Estimates {
    let members: Vec<usize> = (0..t.world_size()).collect();
    let h = Hierarchy::detect(t, &members);
    strata::algo::select::estimates(&Shape {
        kind: Some(kind),
        redop: Some(ReduceOp::Sum),
        count: bytes / 4,
        dtype: DataType::F32,
        topo: t,
        members: &members,
        hierarchy: h.as_ref(),
        chunks: None,
    })
}

/// A link of `bandwidth_gbs` and `latency_us`.
fn link(bandwidth_gbs: f64, latency_us: f64) -> strata::topology::LinkSpec {
    strata::topology::LinkSpec {
        bandwidth_gbs,
        latency_us,
    }
}

/// Two nodes of four ranks on one NIC each, the network 30x slower than the node.
fn two_by_four_on_a_slow_network() -> Topology {
    let mut t = Topology::parse("nodes:2x4").unwrap();
    let node = link(1.0, 30.0);
    (t.links.intra_package, t.links.intra_node) = (node, node);
    t.links.inter_node = link(0.03, 100.0);
    (t.links.nics_per_node, t.links.nic_bandwidth_gbs) = (1, 0.12);
    t
}

#[test]
fn measured_overlap_and_host_work_enter_the_estimates() {
    use strata::topology::HostSpec;
    // One host's figures, as the probe measures them: every class alike, nothing at once.
    let mut t = Topology::parse("nodes:2x2").unwrap();
    let l = link(2.0, 30.0);
    (
        t.links.intra_package,
        t.links.intra_node,
        t.links.inter_node,
    ) = (l, l, l);
    (t.links.nics_per_node, t.links.nic_bandwidth_gbs) = (1, 4.0);
    let preset_like = estimates_on(&t, Kind::ReduceScatter, 64 << 20);
    t.links.overlap = Some(0.0);
    let serial = estimates_on(&t, Kind::ReduceScatter, 64 << 20);
    // ho-ring's levels in turn cost more than at once; the others do not move.
    assert!(serial.ho_ring > preset_like.ho_ring);
    assert!(serial.ho_ring > serial.hier, "{serial:?}");
    assert_eq!(
        (serial.ring, serial.hier),
        (preset_like.ring, preset_like.hier)
    );
    // Host work: every reduce-scatter pays its reductions, log-step its scratch too.
    t.links.host = Some(HostSpec {
        copy_gbs: 4.0,
        reduce_gbs: 4.0,
    });
    let host = estimates_on(&t, Kind::ReduceScatter, 64 << 20);
    assert!(host.ring > serial.ring && host.hier > serial.hier);
    assert!(host.log_step - serial.log_step > host.ring - serial.ring);
    assert_eq!(host.pick(), Algo::Ring, "{host:?}");
    // ho-ring's reduce-scatter also copies the whole send buffer in (and its chunk out)
    // before and after its transfers: counted in full even where the links run apart
    // from the cores, unlike the work a transfer can hide.
    let prologue = |t: &Topology| {
        let e = estimates_on(t, Kind::ReduceScatter, 64 << 20);
        (e.ho_ring - e.hier, e)
    };
    t.links.overlap = Some(1.0);
    let (gap_apart, apart) = prologue(&t);
    let copy_us = 5.0 * (64 << 20) as f64 / 4.0e3;
    let model_gap = {
        let mut bare = t.clone();
        bare.links.host = None;
        prologue(&bare).0
    };
    assert!((gap_apart - model_gap - copy_us).abs() < 1e-6, "{apart:?}");
    // Not on all-gathers (no such copy) nor on presets (no host figures).
    let ag = |t: &Topology| {
        let e = estimates_on(t, Kind::AllGather, 64 << 20);
        e.ho_ring - e.hier
    };
    let mut bare = t.clone();
    bare.links.host = None;
    assert!((ag(&t) - ag(&bare)).abs() < 1e-6);
    // Presets have neither: their pinned picks above are untouched.
    let p = Topology::parse("dgx-h100:2").unwrap();
    assert!(p.links.host.is_none() && p.links.overlap.is_none() && p.measured.is_none());
}

#[test]
fn a_measured_handoff_counts_ho_rings_pipeline_as_it_runs() {
    // Fully apart from the node (as the 1 Gbit/s emulated cluster measures).
    let mut t = two_by_four_on_a_slow_network();
    t.links.overlap = Some(1.0);
    let big = 4 << 20;
    let preset_like = estimates_on(&t, Kind::AllGather, big);
    // A measured handoff of nothing: the network paces the pipeline and its own fill
    // is no longer counted; the other algorithms do not move.
    t.links.handoff_us = Some(0.0);
    let exact = estimates_on(&t, Kind::AllGather, big);
    assert!(
        exact.ho_ring < preset_like.ho_ring,
        "{exact:?} {preset_like:?}"
    );
    assert_eq!(
        (exact.ring, exact.log_step, exact.hier),
        (preset_like.ring, preset_like.log_step, preset_like.hier)
    );
    // The handoff is paid per piece step of the busiest level (the network: one step
    // of 6 pieces at 4 MiB per rank).
    let q = strata::algo::plan::default_chunks(big) as f64;
    assert_eq!(q, 6.0);
    t.links.handoff_us = Some(300.0);
    let slow = estimates_on(&t, Kind::AllGather, big);
    assert!(
        (slow.ho_ring - exact.ho_ring - 300.0 * q).abs() < 1e-6,
        "{slow:?}"
    );
    // So a costly handoff keeps ho-ring off small calls and leaves it the large ones.
    assert_eq!(
        estimates_on(&t, Kind::AllGather, 8 << 10).pick(),
        Algo::Hier
    );
    assert_eq!(slow.pick(), Algo::HoRing, "{slow:?}");
    // The probe calibrates all-gathers; a reduce-scatter keeps the preset form.
    let rs = estimates_on(&t, Kind::ReduceScatter, big);
    t.links.handoff_us = None;
    assert_eq!(estimates_on(&t, Kind::ReduceScatter, big), rs);
    // A figure that is not a cost is refused.
    t.links.handoff_us = Some(-1.0);
    assert!(t.validate().is_err());
    assert!(Topology::parse("dgx-h100:2")
        .unwrap()
        .links
        .handoff_us
        .is_none());
}

#[test]
fn a_lone_crossing_latency_prices_the_flat_rings_steps_only() {
    // One NIC: the flat ring is one ring, whose inter-node steps have one rank per
    // node crossing; hier, ho-ring and log-step cross all at once.
    let mut t = two_by_four_on_a_slow_network();
    let small = 8 << 10;
    let all = estimates_on(&t, Kind::AllGather, small);
    t.links.lone_latency_us = Some(40.0);
    t.validate().unwrap();
    let lone = estimates_on(&t, Kind::AllGather, small);
    // Seven steps, each 60 us sooner.
    assert!(
        (all.ring - lone.ring - 7.0 * 60.0).abs() < 1e-6,
        "{all:?} {lone:?}"
    );
    assert_eq!(
        (lone.log_step, lone.hier, lone.ho_ring),
        (all.log_step, all.hier, all.ho_ring)
    );
    // The probe times that crossing with the node's other ranks idle: where links and
    // cores are one resource (overlap 0) a ring's step pays the latency of every rank
    // at work, and half the difference at overlap 0.5.
    t.links.overlap = Some(0.0);
    assert_eq!(estimates_on(&t, Kind::AllGather, small).ring, all.ring);
    t.links.overlap = Some(0.5);
    let half = estimates_on(&t, Kind::AllGather, small).ring;
    assert!(
        (all.ring - half - 7.0 * 30.0).abs() < 1e-6,
        "{half} {all:?}"
    );
    t.links.overlap = None;
    // A topology file keeps it; a figure that is not a latency is refused.
    assert_eq!(Topology::from_json(&t.to_json()).unwrap(), t);
    t.links.lone_latency_us = Some(f64::NAN);
    assert!(t.validate().is_err());
    assert!(Topology::parse("p4d:2")
        .unwrap()
        .links
        .lone_latency_us
        .is_none());
}

/// The choice the hot path remembers per communicator (`choose_algo`) is always what
/// the rule says for the call at hand: calls of every shape interleaved and repeated
/// (sizes where `auto` picks differently, reductions, dtypes, named algorithms, one
/// that falls back), each answer compared with a fresh `choose`.
#[test]
fn the_remembered_choice_is_the_rules() {
    assert!(
        Algo::ALL.iter().enumerate().all(|(i, a)| *a as usize == i),
        "the word stores an algorithm as its index in Algo::ALL"
    );
    let topo = Topology::parse("nodes:2x4").unwrap();
    let comms = Comm::local_world(8, Some(topo), CommConfig::default()).unwrap();
    let c = &comms[0];
    let mut picked = std::collections::BTreeSet::new();
    let mut calls = Vec::new();
    // Counts innermost: neighbours in `calls` differ in the count alone.
    for algo in [None, Some(Algo::Auto), Some(Algo::Hier), Some(Algo::Qgz)] {
        for (dtype, op) in [
            (DataType::F32, ReduceOp::Sum),
            (DataType::BF16, ReduceOp::Avg),
        ] {
            for kind in 0..3 {
                for count in [1usize, 3, 1 << 10, 1 << 16, 1 << 22] {
                    let b = |n: usize| Buffer::zeroed(n * dtype.size());
                    let op = match kind {
                        0 => Op::AllGather {
                            send: b(count),
                            recv: b(count * 8),
                            count,
                        },
                        1 => Op::ReduceScatter {
                            send: b(count * 8),
                            recv: b(count),
                            count,
                            op,
                        },
                        _ => Op::AllReduce {
                            send: b(count),
                            recv: b(count),
                            count,
                            op,
                        },
                    };
                    let req = Request::new(op, dtype);
                    calls.push(match algo {
                        Some(a) => req.with_algo(a),
                        None => req,
                    });
                }
            }
        }
    }
    // In order (each call after one of another count), each twice in a row (the second
    // one remembered), then in another order (each after a call of another shape).
    let n = calls.len();
    let order: Vec<usize> = (0..n)
        .chain((0..n).flat_map(|i| [i, i]))
        .chain((0..n).map(|i| (i * 7) % n))
        .collect();
    for i in order {
        let req = &calls[i];
        let rule = c.choose(req).algo;
        assert_eq!(
            strata::algo::select::choose_algo(c.core(), req),
            rule,
            "{} of count {:?} with {:?}",
            req.op.name(),
            req.op.kind(),
            req.algo
        );
        picked.insert(rule.name());
    }
    assert!(
        picked.len() >= 3,
        "shapes where the picks differ: {picked:?}"
    );
}
