//! The device transports. Everywhere: the transport-independent self test and every
//! algorithm x op x dtype x odd count on `host-local` worlds (the CPU device), checked
//! against the plain reference on device buffers. On a machine with a CUDA GPU (and
//! `--features cuda`): the same test bodies on `cuda-local` worlds of 1 to 12 ranks on
//! one GPU, and a one-rank NCCL communicator through the same checks. Without a GPU
//! those print SKIPPED (with `STRATA_REQUIRE_GPU=1`, as `scripts/gpu-check` sets, they
//! fail instead). The error paths run everywhere.
#[path = "../../tests/common/mod.rs"]
mod common;

use strata::check::{self, Kind};
use strata::transport::TransportKind;
use strata::{Algo, Comm, DataType, Error, ReduceOp, Topology};
use strata_tools::selftest;

fn gpu() -> bool {
    let n = strata::device::count(strata::device::Api::Cuda);
    if cfg!(feature = "cuda") && n > 0 {
        return true;
    }
    let why = if cfg!(feature = "cuda") {
        "no CUDA device (libcuda or a GPU missing)"
    } else {
        "built without --features cuda"
    };
    if std::env::var("STRATA_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("STRATA_REQUIRE_GPU=1 but {why}");
    }
    eprintln!("SKIPPED: {why} (set STRATA_REQUIRE_GPU=1 to make this fail)");
    false
}

/// Run `body` on every rank of a `kind` world (`cuda-local` on GPU 0, `host-local` on
/// the CPU device) of `topo`.
fn on_device_local<T: Send + 'static>(
    kind: TransportKind,
    topo: &str,
    body: impl Fn(Comm) -> strata::Result<T> + Send + Sync + 'static,
) -> Vec<strata::Result<T>> {
    let topo = Topology::parse(topo).expect("topology");
    let n = topo.world_size();
    let comms = Comm::in_process_world(kind, n, Some(topo), common::config()).expect("world");
    common::on_comms(comms, body)
}

fn self_test_on_every_shape(kind: TransportKind) {
    for topo in [
        "nodes:2x4",
        "frontier:1",
        "nodes:1x1",
        "nodes:1x3",
        "nodes:3x1",
        "nodes:3x2x2",
    ] {
        for (r, res) in on_device_local(kind, topo, |c| {
            assert!(c.device().is_some(), "a device transport");
            selftest::exercise(&c)
        })
        .into_iter()
        .enumerate()
        {
            res.unwrap_or_else(|e| panic!("{} {topo} rank {r}: {e}", kind.name()));
        }
    }
}

/// Every algorithm x op x dtype x odd count (in place and not) on device buffers, the
/// all-to-all and broadcast, and the quantized algorithms with the device kernels;
/// `counts` trims the sweep (the CPU device runs it on two cores in CI).
fn every_algorithm_matches_the_reference(kind: TransportKind, topos: &[&str], counts: &[usize]) {
    for &topo in topos {
        let counts = counts.to_vec();
        let wrong: Vec<usize> = on_device_local(kind, topo, move |c| {
            let mut wrong = 0;
            for algo in [Algo::Ring, Algo::Hier, Algo::HoRing, Algo::Auto] {
                for kind in [Kind::AllGather, Kind::ReduceScatter, Kind::AllReduce] {
                    for dt in DataType::ALL {
                        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                            if kind == Kind::AllGather && op != ReduceOp::Sum {
                                continue;
                            }
                            for &count in &counts {
                                for in_place in [false, true] {
                                    wrong += check::run_checked(
                                        &c, kind, dt, op, count, algo, in_place, 7,
                                    )?;
                                }
                            }
                        }
                    }
                }
            }
            for kind in [Kind::AllToAll, Kind::Broadcast { root: 1 % c.size() }] {
                wrong += check::run_checked(
                    &c,
                    kind,
                    DataType::BF16,
                    ReduceOp::Sum,
                    33,
                    Algo::Ring,
                    false,
                    3,
                )?;
            }
            // The quantized algorithms with the device kernels.
            for (algo, kind) in [
                (Algo::Qgz, Kind::ReduceScatter),
                (Algo::Qgz1, Kind::ReduceScatter),
                (Algo::Qwz, Kind::AllGather),
            ] {
                for dt in [DataType::F32, DataType::F16, DataType::BF16] {
                    for bits in [8, 4] {
                        let q = strata::kernels::QuantSpec::new(bits, 64)?;
                        let r = check::run_checked_quant(
                            &c,
                            kind,
                            dt,
                            ReduceOp::Avg,
                            1001,
                            algo,
                            q,
                            5,
                        )?;
                        wrong += r.wrong;
                    }
                }
            }
            Ok(wrong)
        })
        .into_iter()
        .map(|r| r.expect("rank failed"))
        .collect();
        assert!(
            wrong.iter().all(|&w| w == 0),
            "{} {topo}: wrong {wrong:?}",
            kind.name()
        );
    }
}

#[test]
fn host_local_self_test_on_every_shape() {
    self_test_on_every_shape(TransportKind::HostLocal);
}

#[test]
fn host_local_every_algorithm_matches_the_reference() {
    every_algorithm_matches_the_reference(
        TransportKind::HostLocal,
        &["nodes:2x3", "nodes:3x1", "frontier:1"],
        &[1, 1003],
    );
}

#[test]
fn cuda_local_self_test_on_every_shape() {
    if !gpu() {
        return;
    }
    self_test_on_every_shape(TransportKind::CudaLocal);
}

#[test]
fn cuda_local_every_algorithm_matches_the_reference() {
    if !gpu() {
        return;
    }
    every_algorithm_matches_the_reference(
        TransportKind::CudaLocal,
        &["nodes:2x4", "nodes:3x1", "frontier:1"],
        &[1, 7, 1003],
    );
}

#[test]
fn nccl_one_rank_communicator() {
    if !gpu() {
        return;
    }
    #[cfg(feature = "cuda")]
    if let Err(e) =
        strata::transport::vendor::VendorLib::get(strata::transport::vendor::Vendor::Nccl)
    {
        if std::env::var("STRATA_REQUIRE_GPU").is_ok_and(|v| v == "1") {
            panic!("{e}");
        }
        eprintln!("SKIPPED: {e}");
        return;
    }
    let boot = Comm::local_world(1, None, common::config())
        .unwrap()
        .remove(0);
    let comm = Comm::vendor_world(&boot, TransportKind::Nccl, common::config()).unwrap();
    assert_eq!(comm.transport_kind(), TransportKind::Nccl);
    selftest::exercise(&comm).unwrap();
}

#[test]
fn gpu_transports_say_what_they_need() {
    for k in [
        TransportKind::Nccl,
        TransportKind::Rccl,
        TransportKind::CudaLocal,
    ] {
        assert!(k.is_gpu());
        let f = k.feature().unwrap();
        assert_eq!(
            k.compiled(),
            cfg!(feature = "cuda") && f == "cuda" || cfg!(feature = "rocm") && f == "rocm"
        );
    }
    match Comm::cuda_local_world(2, None, common::config(), 0) {
        Err(Error::NotCompiled(m)) => {
            assert!(!cfg!(feature = "cuda"));
            assert!(m.contains("--features cuda"), "{m}");
        }
        // Built with cuda on a machine without a GPU: a clear error, no panic.
        Err(e @ (Error::System(_) | Error::Device(_))) => {
            assert!(cfg!(feature = "cuda"), "{e}");
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(w) => {
            assert!(cfg!(feature = "cuda"));
            assert_eq!(w.len(), 2);
        }
    }
    let boot = Comm::local_world(1, None, common::config())
        .unwrap()
        .remove(0);
    match Comm::vendor_world(&boot, TransportKind::Nccl, common::config()) {
        Err(Error::NotCompiled(m)) => assert!(m.contains("cuda"), "{m}"),
        Err(_) => assert!(cfg!(feature = "cuda")),
        Ok(_) => assert!(cfg!(feature = "cuda")),
    }
    let e = Comm::vendor_world(&boot, TransportKind::Local, common::config()).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(_) | Error::NotCompiled(_)),
        "{e}"
    );
}
