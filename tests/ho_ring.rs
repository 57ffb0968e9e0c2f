//! HO-Ring (PaRO §3.3): same results and layout as the flat collectives for 2 and 3
//! levels, with uneven counts and any number of pipeline pieces, and the same bytes per
//! link class as `hier` (its stages overlap in time instead).
mod common;

use strata::check::{run_checked, Kind};
use strata::{Algo, CommConfig, DataType, ReduceOp};

fn cfg(chunks: usize) -> CommConfig {
    CommConfig {
        ho_ring_chunks: Some(chunks),
        ..common::config()
    }
}

#[test]
fn matches_the_reference_on_2_and_3_levels() {
    for topo in ["nodes:2x4", "nodes:3x8", "frontier:2", "nodes:3x2x2"] {
        for chunks in [1usize, 3, 8] {
            let wrong: usize = common::on_local_with(topo, cfg(chunks), move |c| {
                let mut w = 0;
                for (kind, op) in [
                    (Kind::AllGather, ReduceOp::Sum),
                    (Kind::ReduceScatter, ReduceOp::Avg),
                    (Kind::ReduceScatter, ReduceOp::Max),
                    (Kind::AllReduce, ReduceOp::Sum),
                    (Kind::AllReduce, ReduceOp::Avg),
                ] {
                    for (count, dt) in [
                        (1usize, DataType::F32),
                        (13, DataType::BF16),
                        (100, DataType::F16),
                    ] {
                        for in_place in [false, true] {
                            w += run_checked(
                                &c,
                                kind,
                                dt,
                                op,
                                count,
                                Algo::HoRing,
                                in_place,
                                count as u64 + chunks as u64,
                            )?;
                        }
                    }
                }
                Ok(w)
            })
            .into_iter()
            .map(|r| r.expect("rank failed"))
            .sum();
            assert_eq!(wrong, 0, "{topo} chunks {chunks}");
        }
    }
}

#[test]
fn one_level_falls_back_to_ring() {
    let wrong: usize = common::all_ok("nodes:1x5", |c| {
        run_checked(
            &c,
            Kind::AllReduce,
            DataType::F32,
            ReduceOp::Sum,
            17,
            Algo::HoRing,
            false,
            1,
        )
    })
    .into_iter()
    .sum();
    assert_eq!(wrong, 0);
}

/// All-reduce whose count the ranks divide runs in `recv` itself (`hier` and `ho-ring`:
/// no padded scratch); a count they do not divide takes the padded path. In place and
/// not, Sum, Avg (divided after the collective) and Max, on 2 and 3 levels.
#[test]
fn all_reduce_exact_split_runs_in_recv() {
    for topo in ["nodes:2x4", "nodes:3x2x2"] {
        let wrong: usize = common::all_ok(topo, |c| {
            let p = c.size();
            let mut w = 0;
            for algo in [Algo::Hier, Algo::HoRing] {
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                    for count in [p, 8 * p, 8 * p + 1] {
                        for in_place in [false, true] {
                            w += run_checked(
                                &c,
                                Kind::AllReduce,
                                DataType::BF16,
                                op,
                                count,
                                algo,
                                in_place,
                                count as u64,
                            )?;
                        }
                    }
                }
            }
            Ok(w)
        })
        .into_iter()
        .sum();
        assert_eq!(wrong, 0, "{topo}");
    }
}
