//! Per call, on a communicator strata has joined (a GPU machine with the real NCCL,
//! `join.rs`): strata's algorithm or the real library's own call. ONE pure function,
//! [`route`], from `STRATA_NCCL` ([`Serve`]) and the call's shape (collective, reduction,
//! count, data type, the communicator's topology and hierarchy) to a [`Route`]:
//!
//! - `off`: the real library, always.
//! - `exact` (default): on a communicator within one node, the real call (NCCL's
//!   NVLink kernels and protocols, NVLS and LL/LL128, are outside strata's model, and its
//!   GPU link figures are not yet calibrated: issue 68 measured it picking log-step on
//!   one node where NCCL's ring was 2.5-4.8x faster). Across nodes, strata's model
//!   ([`strata::algo::select::select`] with `auto`, the rule strata's own calls and
//!   simulator use): where it picks `ring` (messages whose cost no other form lowers)
//!   the real call runs; where it picks `hier`, `hier-ring`, `hier-log`, `log-step` or
//!   `ho-ring`, strata runs that algorithm. `auto` never picks a quantized one.
//! - a list of names: the first that can run the call (its constraints hold on this
//!   communicator and shape: `hier` needs two levels, the quantized ones a float type
//!   and sum or average, ...) runs; `ring` in the list means the real call; none fits:
//!   the real call.
//!
//! Only all-gather, reduce-scatter and all-reduce with one of strata's data types and
//! NCCL's five built-in ops reach [`route`] (`join.rs` sends the rest to the real
//! library first: PreMulSum, fp8, broadcast, send and receive, ...).

use crate::abi::{ncclDataType_t, ncclRedOp_t};
use crate::serve::Serve;
use strata::algo::select::{select, Shape};
use strata::capi::With;
use strata::Algo;

/// Where a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The real library's own call, arguments unchanged.
    Native,
    /// strata's algorithm on the joined communicator, on the call's stream.
    Strata(Algo),
}

/// `f` over the shape of an all-gather, reduce-scatter or all-reduce (`with`) of `count`
/// elements of `dtype` on `comm`; `None` for an op or data type strata does not serve
/// (PreMulSum, fp8).
fn on_shape<R>(
    comm: &strata::Comm,
    with: With,
    count: usize,
    dtype: ncclDataType_t,
    f: impl FnOnce(&Shape) -> R,
) -> Option<R> {
    use strata::kinds::Kind;
    let (kind, op): (Kind, Option<ncclRedOp_t>) = match with {
        With::AllGather => (Kind::AllGather, None),
        With::ReduceScatter(op) => (Kind::ReduceScatter, Some(op)),
        With::AllReduce(op) => (Kind::AllReduce, Some(op)),
    };
    let dt = strata::DataType::from_raw(dtype).ok()?;
    let redop = op.map(strata::ReduceOp::from_raw).transpose().ok()?;
    let core = comm.core();
    Some(f(&Shape {
        kind: Some(kind),
        redop,
        count,
        dtype: dt,
        topo: core.topology(),
        members: core.members(),
        hierarchy: core.hierarchy(),
        chunks: core.config().ho_ring_chunks,
    }))
}

/// The route of an all-gather, reduce-scatter or all-reduce (`with`) of `count`
/// elements of `dtype` on `comm`: [`route`] over its shape, or [`Route::Native`] for an
/// op or data type strata does not serve (PreMulSum, fp8).
pub fn route_call(
    serve: &Serve,
    comm: &strata::Comm,
    with: With,
    count: usize,
    dtype: ncclDataType_t,
) -> Route {
    on_shape(comm, with, count, dtype, |s| route(serve, s)).unwrap_or(Route::Native)
}

/// strata's model of a call's time in microseconds (NCCL's unit for
/// `ncclSimInfo_t::estimatedTime`): the estimate of the algorithm the call would run on
/// strata (`auto`'s pick, or the list's first fit; the native form is the model's
/// ring), 0 for an op or data type strata does not serve.
pub fn estimate_us(
    serve: &Serve,
    comm: &strata::Comm,
    with: With,
    count: usize,
    dtype: ncclDataType_t,
) -> f64 {
    on_shape(comm, with, count, dtype, |s| {
        let e = strata::algo::select::estimates(s);
        let algo = match (serve, route(serve, s)) {
            (Serve::Algos(_), Route::Strata(a)) => a,
            (Serve::Algos(_), Route::Native) => Algo::Ring,
            _ => e.pick(),
        };
        let t = match algo {
            Algo::Ring => e.ring,
            Algo::LogStep => e.log_step,
            Algo::HoRing => e.ho_ring,
            _ => e.hier,
        };
        if t.is_finite() {
            t
        } else {
            e.ring
        }
    })
    .unwrap_or(0.0)
}

/// THE rule (module doc).
pub fn route(serve: &Serve, s: &Shape) -> Route {
    let to = |a: Algo| match a {
        Algo::Ring | Algo::Auto => Route::Native,
        a => Route::Strata(a),
    };
    match serve {
        Serve::Off => Route::Native,
        Serve::Exact if one_node(s) => Route::Native,
        Serve::Exact => to(select(Algo::Auto, s).algo),
        Serve::Algos(list) => list
            .iter()
            .map(|&a| select(a, s))
            .find(|c| c.fallback.is_none())
            .map_or(Route::Native, |c| to(c.algo)),
    }
}

/// True when the communicator's ranks share one node (a regular mesh without the
/// network level; an irregular one is left to the model).
fn one_node(s: &Shape) -> bool {
    s.hierarchy.is_some_and(|h| {
        !h.levels
            .iter()
            .any(|l| l.0 == strata::topology::Level::Network)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata::kinds::Kind;
    use strata::topology::Hierarchy;
    use strata::{DataType, ReduceOp, Topology};

    /// `f` over the shape of `kind` over `bytes` of `dtype` (per rank chunk for
    /// all-gather and reduce-scatter, the buffer for all-reduce, sum where it reduces) on
    /// the ranks `members` of `topo` (`None`: the whole world).
    fn shaped<R>(
        topo: &str,
        members: Option<&[usize]>,
        kind: Kind,
        bytes: usize,
        dtype: DataType,
        f: impl FnOnce(&Shape) -> R,
    ) -> R {
        let t = Topology::parse(topo).unwrap();
        let all: Vec<usize> = (0..t.world_size()).collect();
        let members = members.unwrap_or(&all);
        let h = Hierarchy::detect(&t, members);
        f(&Shape {
            kind: Some(kind),
            redop: (kind != Kind::AllGather).then_some(ReduceOp::Sum),
            count: bytes / dtype.size(),
            dtype,
            topo: &t,
            members,
            hierarchy: h.as_ref(),
            chunks: None,
        })
    }

    /// The route of such a call on the whole world of `topo`.
    fn on(serve: &Serve, topo: &str, kind: Kind, bytes: usize, dtype: DataType) -> Route {
        shaped(topo, None, kind, bytes, dtype, |s| route(serve, s))
    }

    const KINDS: [Kind; 3] = [Kind::AllGather, Kind::ReduceScatter, Kind::AllReduce];
    const SIZES: [usize; 5] = [1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20];

    #[test]
    fn one_node_is_the_real_library_at_every_size() {
        // Even where strata's model prefers log-step (1 KiB on 8 ranks): NCCL's
        // intra-node kernels are outside the model.
        for topo in ["dgx-h100:1", "nodes:1x8", "frontier:1", "nodes:1x2"] {
            for k in KINDS {
                for b in SIZES {
                    assert_eq!(
                        on(&Serve::Exact, topo, k, b, DataType::F32),
                        Route::Native,
                        "{topo} {k:?} {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn across_slow_nodes_big_messages_run_hierarchically() {
        // Inter-node links an order of magnitude below the node's: 2x100 Gb/s per A100
        // node, Frontier's Slingshot, EFA, the emulated cluster's default.
        for topo in ["dgx-a100:2", "nodes:4x8", "frontier:2", "p4d:3"] {
            for k in KINDS {
                let r = on(&Serve::Exact, topo, k, 256 << 20, DataType::F32);
                assert!(
                    matches!(
                        r,
                        Route::Strata(Algo::Hier | Algo::HierRing | Algo::HierLog | Algo::HoRing)
                    ),
                    "{topo} {k:?}: {r:?}"
                );
            }
        }
    }

    #[test]
    fn rail_optimized_h100_nodes_leave_big_messages_to_the_real_library() {
        // 8 x 400 Gb/s per node (DGX H100, p5): the native ring's bandwidth is the
        // hierarchy's, so past a few MiB the real call runs; below, strata's forms pay.
        for topo in ["dgx-h100:4", "p5:2"] {
            for k in KINDS {
                assert_eq!(
                    on(&Serve::Exact, topo, k, 256 << 20, DataType::F32),
                    Route::Native
                );
            }
            assert_eq!(
                on(&Serve::Exact, topo, Kind::AllGather, 1 << 20, DataType::F32),
                Route::Strata(Algo::Hier)
            );
        }
    }

    #[test]
    fn a_node_of_a_multi_node_world_is_the_real_library() {
        // A tensor-parallel group: the first node's 8 ranks of nodes:4x8.
        let group: Vec<usize> = (0..8).collect();
        let log = Serve::parse(Some("log-step")).unwrap();
        shaped(
            "nodes:4x8",
            Some(&group),
            Kind::AllGather,
            1024,
            DataType::F32,
            |s| {
                assert_eq!(route(&Serve::Exact, s), Route::Native);
                // The same group's model alone would pick log-step: only the rule keeps NCCL.
                assert_eq!(select(Algo::Auto, s).algo, Algo::LogStep);
                // Named, log-step runs there.
                assert_eq!(route(&log, s), Route::Strata(Algo::LogStep));
            },
        );
    }

    #[test]
    fn many_ranks_small_messages_take_log_step_or_stay_native() {
        // Latency-bound: strata's model picks log-step (or a hierarchy whose inter-node
        // stage is log-step) over the ring's p-1 steps.
        let r = on(
            &Serve::Exact,
            "nodes:16x8",
            Kind::AllGather,
            1 << 10,
            DataType::F32,
        );
        assert!(
            matches!(r, Route::Strata(Algo::LogStep | Algo::Hier | Algo::HierLog)),
            "{r:?}"
        );
    }

    #[test]
    fn the_route_is_the_models_choice_at_every_size() {
        // route(exact) is select(auto) with ring as the real call: never a quantized
        // algorithm, never one that cannot run the call.
        for topo in [
            "nodes:1x1",
            "nodes:1x2",
            "nodes:2x4",
            "nodes:3x2",
            "dgx-a100:2",
            "p4d:3",
        ] {
            for k in KINDS {
                for b in SIZES {
                    for dt in [DataType::F32, DataType::BF16, DataType::I64] {
                        let r = on(&Serve::Exact, topo, k, b, dt);
                        assert!(
                            !matches!(r, Route::Strata(Algo::Qgz | Algo::Qgz1 | Algo::Qwz)),
                            "{topo} {k:?} {b}: {r:?}"
                        );
                    }
                }
            }
        }
        // One rank or one node of one level: nothing but the native call pays.
        for k in KINDS {
            for b in SIZES {
                assert_eq!(
                    on(&Serve::Exact, "nodes:1x1", k, b, DataType::F32),
                    Route::Native
                );
            }
        }
    }

    #[test]
    fn one_rank_runs_only_what_is_named_and_fits() {
        // What the GPU check runs on one GPU (STRATA_NCCL=log-step): every collective
        // through strata; the hierarchical forms need two levels and fall to NCCL.
        let log = Serve::parse(Some("log-step")).unwrap();
        let hier = Serve::parse(Some("hier,ho-ring")).unwrap();
        for k in KINDS {
            assert_eq!(
                on(&log, "nodes:1x1", k, 4000, DataType::F32),
                Route::Strata(Algo::LogStep)
            );
            assert_eq!(
                on(&hier, "nodes:1x1", k, 4000, DataType::F32),
                Route::Native
            );
        }
        let qwz = Serve::parse(Some("qwz")).unwrap();
        assert_eq!(
            on(&qwz, "nodes:1x1", Kind::AllGather, 4000, DataType::F32),
            Route::Strata(Algo::Qwz)
        );
        assert_eq!(
            on(&qwz, "nodes:1x1", Kind::AllReduce, 4000, DataType::F32),
            Route::Native
        );
    }

    #[test]
    fn off_is_always_the_real_library() {
        for k in KINDS {
            for b in SIZES {
                assert_eq!(
                    on(&Serve::Off, "nodes:4x8", k, b, DataType::F32),
                    Route::Native
                );
            }
        }
    }

    #[test]
    fn a_list_runs_its_first_name_that_fits() {
        let hier_then_log = Serve::parse(Some("hier,log-step")).unwrap();
        // Two levels: hier fits.
        assert_eq!(
            on(
                &hier_then_log,
                "nodes:2x4",
                Kind::AllReduce,
                1 << 20,
                DataType::F32
            ),
            Route::Strata(Algo::Hier)
        );
        // One node: hier needs two levels, log-step runs.
        assert_eq!(
            on(
                &hier_then_log,
                "nodes:1x4",
                Kind::AllReduce,
                1 << 20,
                DataType::F32
            ),
            Route::Strata(Algo::LogStep)
        );
        // ring named first: the real call.
        let ring = Serve::parse(Some("ring,hier")).unwrap();
        assert_eq!(
            on(&ring, "nodes:2x4", Kind::AllGather, 1 << 20, DataType::F32),
            Route::Native
        );
        // Quantized only when named, and only where it can run: qgz reduces floats with
        // sum; an integer reduce-scatter falls to the next name, then to the real call.
        let qgz = Serve::parse(Some("qgz")).unwrap();
        assert_eq!(
            on(
                &qgz,
                "nodes:2x4",
                Kind::ReduceScatter,
                1 << 20,
                DataType::F32
            ),
            Route::Strata(Algo::Qgz)
        );
        assert_eq!(
            on(
                &qgz,
                "nodes:2x4",
                Kind::ReduceScatter,
                1 << 20,
                DataType::I32
            ),
            Route::Native
        );
        assert_eq!(
            on(&qgz, "nodes:2x4", Kind::AllGather, 1 << 20, DataType::F32),
            Route::Native
        );
    }
}
