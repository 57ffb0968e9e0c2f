//! Measured per-rank model-state memory equals PaRO Table 1 and AMSP's D formula.
//!
//! Notation (PaRO §3.6): Ψ parameters (here Ψ' = every unit padded to a multiple of the
//! world size, the engine's even sharding), N ranks in the world, M ranks per group (a
//! node), w = 2 bytes (bf16 parameters and gradients), K = 12 (fp32 master + Adam m, v).
//! AMSP §IV-D: D = wΦ/s_p + wΦ/s_g + 12Φ/s_os (+ ZeRO++'s secondary wΦ/s_hpz).
use strata::Topology;
use strata_engine::model::TinyLm;
use strata_engine::train::{train_local, TrainOptions};
use strata_engine::{Precision, UnitModel};

/// Measured (params + secondary, grads, optimizer) bytes of rank-max after one step.
fn measure(strategy: &str, topo: &str) -> (u64, u64, u64, u64) {
    let mut o = TrainOptions::new(strategy, Topology::parse(topo).unwrap(), 1);
    o.precision = Precision::Bf16;
    let r = train_local(&o, &mut |_| {}).unwrap();
    let m = r[0].memory;
    assert_eq!(
        m.model_states,
        m.params + m.secondary + m.grads + m.optimizer
    );
    (m.params, m.secondary, m.grads, m.optimizer)
}

fn psi(world: usize) -> u64 {
    let o = TrainOptions::new("dp", Topology::parse("nodes:1x1").unwrap(), 1);
    TinyLm::new(o.model)
        .unwrap()
        .unit_sizes()
        .iter()
        .map(|n| n.div_ceil(world) * world)
        .sum::<usize>() as u64
}

#[test]
fn paro_table_1_on_two_nodes_of_four() {
    let (n, m) = (8u64, 4u64); // N ranks, M per group (node)
    let p = psi(8);
    let w = 2u64;
    let k = 12u64;
    // strategy: (P, secondary, G, OS) in bytes, as PaRO Table 1 writes them.
    let table: [(&str, [u64; 4]); 9] = [
        ("dp", [w * p, 0, w * p, k * p]),
        ("zero1", [w * p, 0, w * p, k * p / n]),
        ("zero2", [w * p, 0, w * p / n, k * p / n]),
        ("zero3", [w * p / n, 0, w * p / n, k * p / n]),
        ("mics:4", [w * p / m, 0, w * p / m, k * p / m]),
        // ZeRO++: 2Ψ/N + 2Ψ/M (primary + hpZ secondary within the node).
        ("zeropp", [w * p / n, w * p / m, w * p / n, k * p / n]),
        ("paro-igg", [w * p / m, 0, w * p / n, k * p / n]),
        ("paro-iig", [w * p / m, 0, w * p / m, k * p / n]),
        ("paro-nig", [w * p, 0, w * p / m, k * p / n]),
    ];
    for (s, [pp, sec, g, os]) in table {
        assert_eq!(measure(s, "nodes:2x4"), (pp, sec, g, os), "{s}");
    }
}

#[test]
fn amsp_d_formula_and_frontier() {
    let p = psi(8);
    let w = 2u64;
    // AMSP D = 2Φ/s_p + 2Φ/s_g + 12Φ/s_os for s_p = 2, s_g = 4, s_os = 8.
    let (pp, sec, g, os) = measure("amsp:p=2x1,g=4x1,os=4x2", "nodes:2x4");
    assert_eq!((pp, sec, g, os), (w * p / 2, 0, w * p / 4, 12 * p / 8));
    // Frontier §V on one node of 4 MI250X (8 GCDs): weights over a GCD pair (s_p = 2),
    // gradients over the node (8), optimizer states over the world (8 here).
    let (pp, sec, g, os) = measure("frontier-topo", "frontier:1");
    assert_eq!((pp, sec, g, os), (w * p / 2, 0, w * p / 8, 12 * p / 8));
    // Table IV's LLaMA-13B point on this shape: s_p = s_g = 4x1, s_os = 8x1.
    let (pp, _, g, os) = measure("amsp:p=4x1,g=4x1,os=4x2", "nodes:2x4");
    assert_eq!((pp, g, os), (w * p / 4, w * p / 4, 12 * p / 8));
}
