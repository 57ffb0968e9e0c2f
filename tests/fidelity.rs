//! The model against published figures (`strata::sim::fidelity`, the table of
//! docs/model-fidelity.md): every nccl-tests bus bandwidth within 15%, every paper ratio
//! within 10 percentage points except the one the docs explain.

use strata::check::Kind;
use strata::sim::fidelity::{self, Measure};
use strata::{Algo, Topology};

#[test]
fn bus_bandwidths_within_15_percent_of_published() {
    let rows = fidelity::rows().unwrap();
    let bus: Vec<_> = rows
        .iter()
        .filter(|r| r.measure == Measure::BusBw)
        .collect();
    // 1, 2 and 16 nodes of DGX A100 and H100, three ops each, plus the 4-NIC A100 rows.
    assert_eq!(bus.len(), 2 * 3 * 3 + 2);
    for r in &bus {
        assert!(
            (r.ratio() - 1.0).abs() <= 0.15,
            "{} {} modeled {:.1} GB/s vs published {:.1} ({})",
            r.cluster,
            r.kind.name(),
            r.modeled,
            r.published,
            r.source
        );
    }
    // Predictions (not calibration inputs) exist for both multi-node shapes of the A100.
    assert!(bus.iter().filter(|r| !r.calibrates).count() >= 8);
}

#[test]
fn paper_ratios_reproduced_or_explained() {
    let rows = fidelity::rows().unwrap();
    let ratio = |cluster: &str| {
        rows.iter()
            .find(|r| {
                matches!(r.measure, Measure::RatioToRing(_)) && r.cluster.starts_with(cluster)
            })
            .unwrap_or_else(|| panic!("no {cluster} row"))
    };
    // MiCS: hier vs ring on 2 p3dn at 128 MB, within 10 pp.
    let m = ratio("p3dn:2");
    assert!(
        (m.modeled - m.published).abs() <= 0.10,
        "MiCS {:.3} vs {:.3}",
        m.modeled,
        m.published
    );
    // PaRO: HO-Ring vs ring on "2 DGX nodes" whose cross-machine bandwidth PaRO §3.3
    // gives as 56 GB/s per node. Modeled as described, the network binds and HO-Ring
    // moves (p-k)/(p-1) = 8/15 of ring's inter-node bytes (0.54); on a real DGX A100
    // (8 x 24 GB/s) the NICs deliver nearly what NVLink does and HO-Ring gains less
    // (0.79). The published 0.673 lies between the two (docs/model-fidelity.md).
    let (cloud, dgx) = (ratio("PaRO testbed"), ratio("dgx-a100:2"));
    assert!(
        (cloud.modeled - 8.0 / 15.0).abs() < 0.03,
        "{}",
        cloud.modeled
    );
    assert!(
        cloud.modeled < cloud.published && cloud.published < dgx.modeled,
        "PaRO {:.3} outside [{:.3}, {:.3}]",
        cloud.published,
        cloud.modeled,
        dgx.modeled
    );
}

#[test]
fn multi_nic_rings_are_not_one_nic() {
    // The symptom: one rank-order ring through one NIC put ho-ring at 0.09x of
    // ring for 1 GiB on dgx-a100:2. With NCCL's rings every hierarchical algorithm is
    // within a small factor of ring there, and on p3dn's single EFA interface the ring
    // is unchanged (hier well below ring).
    let t = Topology::parse("dgx-a100:2").unwrap();
    let g = 1u64 << 30;
    let ring = fidelity::time_us(&t, Kind::AllGather, Algo::Ring, g).unwrap();
    for algo in [Algo::Hier, Algo::HoRing] {
        let x = fidelity::time_us(&t, Kind::AllGather, algo, g).unwrap() / ring;
        assert!(x > 0.5 && x < 2.0, "{algo}: {x:.3}");
    }
    let p3 = Topology::parse("p3dn:2").unwrap();
    let x = fidelity::time_us(&p3, Kind::AllGather, Algo::Hier, g).unwrap()
        / fidelity::time_us(&p3, Kind::AllGather, Algo::Ring, g).unwrap();
    assert!(x < 0.7, "{x}");
}

#[test]
fn markdown_has_a_row_per_figure() {
    let rows = fidelity::rows().unwrap();
    let md = fidelity::markdown(&rows);
    assert_eq!(md.lines().count(), rows.len() + 2);
    assert!(md.contains("NVIDIA/nccl#812"));
}
