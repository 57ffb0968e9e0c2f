//! Property tests: on random mesh shapes, counts and dtypes, every algorithm returns the
//! plain reference's result (hierarchical results have exactly the flat layout).
mod common;

use proptest::prelude::*;
use strata::check::{run_checked, run_checked_coalesced, Kind};
use strata::{Algo, DataType, ReduceOp};

/// Every element type (NCCL's, fp8 aside).
fn dtype() -> impl Strategy<Value = DataType> {
    prop::sample::select(DataType::ALL.to_vec())
}

fn redop() -> impl Strategy<Value = ReduceOp> {
    prop_oneof![
        Just(ReduceOp::Sum),
        Just(ReduceOp::Avg),
        Just(ReduceOp::Max),
        Just(ReduceOp::Min)
    ]
}

/// Elements wrong over every rank of `topo`, each rank checking `kind` with every
/// algorithm of `algos` against the reference.
#[allow(clippy::too_many_arguments)]
fn wrong_on(
    topo: &str,
    algos: &'static [Algo],
    kind: Kind,
    dt: DataType,
    op: ReduceOp,
    count: usize,
    in_place: bool,
    seed: u64,
) -> usize {
    common::all_ok(topo, move |c| {
        let mut w = 0;
        for &algo in algos {
            w += run_checked(&c, kind, dt, op, count, algo, in_place, seed)?;
        }
        Ok(w)
    })
    .into_iter()
    .sum()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_algo_matches_the_reference(
        n in 1usize..4, p in 1usize..4, d in 1usize..3, count in 0usize..40,
        dt in dtype(), op in redop(), seed in 0u64..1000,
        kind in prop_oneof![Just(Kind::AllGather), Just(Kind::ReduceScatter), Just(Kind::AllReduce)],
        in_place in any::<bool>(),
    ) {
        let topo = format!("nodes:{n}x{p}x{d}");
        let wrong = wrong_on(&topo, &Algo::LOSSLESS, kind, dt, op, count, in_place, seed);
        prop_assert_eq!(wrong, 0, "{} {:?} {} {} count {}", topo, kind, dt, op, count);
    }

    #[test]
    fn coalesced_uneven_lists_match_the_reference(
        n in 1usize..4, k in 1usize..5, counts in prop::collection::vec(0usize..23, 1..6),
        dt in dtype(), op in redop(), seed in 0u64..1000, rs in any::<bool>(),
    ) {
        let topo = format!("nodes:{n}x{k}");
        let kind = if rs { Kind::ReduceScatter } else { Kind::AllGather };
        let wrong: usize = common::all_ok(&topo, move |c| {
            let mut w = 0;
            for algo in [Algo::Ring, Algo::Hier, Algo::HoRing, Algo::LogStep] {
                w += run_checked_coalesced(&c, kind, dt, op, &counts, algo, seed)?;
            }
            Ok(w)
        }).into_iter().sum();
        prop_assert_eq!(wrong, 0);
    }

    /// The log-step algorithms at every rank count from 1 to 33 (any count, not only
    /// powers of two), flat and as hier's inter-node stage, on node meshes of every shape.
    #[test]
    fn log_step_any_rank_count(
        n in 1usize..12, k in 1usize..4, count in 0usize..30,
        dt in dtype(), op in redop(), seed in 0u64..1000,
        kind in prop_oneof![Just(Kind::AllGather), Just(Kind::ReduceScatter), Just(Kind::AllReduce)],
        in_place in any::<bool>(),
    ) {
        let topo = format!("nodes:{n}x{k}");
        let wrong = wrong_on(&topo, &[Algo::LogStep, Algo::HierLog], kind, dt, op, count, in_place, seed);
        prop_assert_eq!(wrong, 0, "{} {:?} {} {} count {}", topo, kind, dt, op, count);
    }
}

/// The log-step forms above `log_step::ROTATE_UP_TO` bytes (the all-gather's split runs,
/// the reduce-scatter's first step straight from the input) on odd and even rank
/// counts and as hier's inter-node stage, in place and not: the proptests above stay
/// below it. On `local` the flat steps run straight on the transport
/// (`CommCore::host_steps`); on `host-local` (a device transport) as ops.
#[test]
fn log_step_large_forms_match_the_reference() {
    log_step_large_forms_on(strata::transport::TransportKind::Local);
}

#[test]
fn log_step_large_forms_match_the_reference_as_ops() {
    log_step_large_forms_on(strata::transport::TransportKind::HostLocal);
}

/// An in-process world of `topo` on `transport` (`local`, or a device transport).
fn world_on(transport: strata::transport::TransportKind, topo: &str) -> Vec<strata::Comm> {
    let t = strata::Topology::parse(topo).expect("topology");
    let n = t.world_size();
    match transport {
        strata::transport::TransportKind::Local => {
            strata::Comm::local_world(n, Some(t), common::config())
        }
        kind => strata::Comm::in_process_world(kind, n, Some(t), common::config()),
    }
    .expect("world")
}

fn log_step_large_forms_on(transport: strata::transport::TransportKind) {
    use Kind::*;
    let big = strata::algo::log_step::ROTATE_UP_TO;
    for (topo, g, cases) in [
        (
            "nodes:5x1",
            5,
            vec![
                (AllGather, DataType::F32, ReduceOp::Sum, Algo::LogStep),
                (ReduceScatter, DataType::BF16, ReduceOp::Avg, Algo::LogStep),
                (AllReduce, DataType::I64, ReduceOp::Max, Algo::LogStep),
            ],
        ),
        (
            "nodes:8x1",
            8,
            vec![
                (AllGather, DataType::BF16, ReduceOp::Sum, Algo::LogStep),
                (ReduceScatter, DataType::F32, ReduceOp::Sum, Algo::LogStep),
            ],
        ),
        (
            "nodes:3x2",
            3,
            vec![(ReduceScatter, DataType::F32, ReduceOp::Min, Algo::HierLog)],
        ),
    ] {
        let wrong: usize = common::on_comms(world_on(transport, topo), move |c| {
            let p = c.size();
            let mut w = 0;
            for &(kind, dt, op, algo) in &cases {
                // Past the threshold where the log-step runs: the whole communicator
                // (flat), the g ranks of the inter-node stage (hier-log).
                let per_rank = big / (dt.size() * g) + 3;
                let count = if kind == AllReduce {
                    per_rank * p + 1
                } else {
                    per_rank
                };
                for in_place in [false, true] {
                    w += run_checked(&c, kind, dt, op, count, algo, in_place, 5)?;
                }
            }
            Ok(w)
        })
        .into_iter()
        .map(|r| r.expect("rank"))
        .sum();
        assert_eq!(wrong, 0, "{topo} on {}", transport.name());
    }
}

/// The power-of-two forms (recursive doubling and halving, src/algo/recursive.rs) on
/// both paths: on `local` straight on the transport, on `host-local` as ops; every op,
/// in place and not, `Avg` among the reductions, counts that do not divide.
#[test]
fn log_step_power_of_two_forms_match_the_reference() {
    use Kind::*;
    for transport in [
        strata::transport::TransportKind::Local,
        strata::transport::TransportKind::HostLocal,
    ] {
        for topo in ["nodes:1x2", "nodes:4x1", "nodes:2x4"] {
            let wrong: usize = common::on_comms(world_on(transport, topo), move |c| {
                let mut w = 0;
                for (kind, dt, op) in [
                    (AllGather, DataType::BF16, ReduceOp::Sum),
                    (ReduceScatter, DataType::F32, ReduceOp::Avg),
                    (ReduceScatter, DataType::I32, ReduceOp::Max),
                    (AllReduce, DataType::F64, ReduceOp::Sum),
                    (AllReduce, DataType::U8, ReduceOp::Min),
                ] {
                    for count in [0usize, 1, 7, 129] {
                        for in_place in [false, true] {
                            w += run_checked(&c, kind, dt, op, count, Algo::LogStep, in_place, 9)?;
                        }
                    }
                }
                Ok(w)
            })
            .into_iter()
            .map(|r| r.expect("rank"))
            .sum();
            assert_eq!(wrong, 0, "{topo} on {}", transport.name());
        }
    }
}
