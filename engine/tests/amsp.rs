//! `strata-plan --mode amsp`: AMSP's own model (engine/src/planner/amsp.rs) against the
//! paper's Table IV on its testbed (128 nodes x 8 A800, 4 HDR NICs per node).
//!
//! What the model gives, row by row (docs/planner.md, "AMSP mode"):
//! - LLaMA-7B: Table IV's `p=1x1, g=1x1, os=8x1`, as is.
//! - LLaMA-13B: `p=2x1, g=8x1, os=8x1`, 0.56% cheaper than Table IV's `p=4x1, g=4x1,
//!   os=8x1` (ranked 2nd). Table IV needs the 2x1 row not to fit: it follows with memory
//!   the model does not see of more than 6.9 GiB and at most 9.9 GiB per GPU.
//! - LLaMA-30B: `os = 8x4` cannot run on one node, so with the paper's 8-GPU start the
//!   model gives `p=g=os=8x1`; from 32 GPUs and with that unmodeled memory it gives
//!   Table IV's `os = 8x4`, but with `p = g = 4x1`: Table IV's `8x1` needs 4-GPU
//!   all-gathers below ~86% of the 8-GPU effective bandwidth (AMSP's Fig. 3 gives no
//!   numbers), or more than 24.3 GiB unmodeled for 30B alone.

use strata_engine::planner::amsp::{self, collective_us, AmspOptions, Coll};
use strata_engine::planner::{ModelShape, PlanRequest};

fn req(model: &str, extra_gib: u64) -> PlanRequest {
    let mut r = PlanRequest::new(ModelShape::preset(model).unwrap(), amsp::testbed(128));
    r.extra_memory = extra_gib << 30;
    r
}

fn top(model: &str, extra_gib: u64, from_gpus: usize) -> Vec<String> {
    let opt = AmspOptions {
        from_nodes: from_gpus / 8,
    };
    amsp::plan(&req(model, extra_gib), opt)
        .unwrap()
        .into_iter()
        .map(|c| {
            assert!(c.candidate.feasible || c.candidate.why.is_some());
            c.candidate.strategy.name
        })
        .collect()
}

const T7: &str = "amsp:p=1x1,g=1x1,os=8x1";
const T13: &str = "amsp:p=4x1,g=4x1,os=8x1";
const T30: &str = "amsp:p=8x1,g=8x1,os=8x4";

#[test]
fn table_iv_llama_7b_is_reproduced() {
    let t = top("llama-7b", 0, 8);
    assert_eq!(t[0], T7, "{:?}", &t[..4]);
    // The unmodeled memory that reproduces 13B keeps it.
    assert_eq!(top("llama-7b", 8, 8)[0], T7);
}

#[test]
fn table_iv_llama_13b_needs_unmodeled_memory_between_6_9_and_9_9_gib() {
    let r = req("llama-13b", 0);
    let ranked = amsp::plan(&r, AmspOptions::default()).unwrap();
    assert_eq!(ranked[0].candidate.strategy.name, "amsp:p=2x1,g=8x1,os=8x1");
    assert_eq!(ranked[1].candidate.strategy.name, T13);
    let gap = ranked[1].objective_us / ranked[0].objective_us - 1.0;
    assert!(gap > 1e-3 && gap < 0.01, "{gap}");
    // The window: 2x1 fits at 73.09 GiB, Table IV's row at 70.06 GiB (of 80).
    let gib = |c: &amsp::AmspCandidate| c.candidate.memory_bytes as f64 / (1u64 << 30) as f64;
    assert!(
        (gib(&ranked[0]) - 73.09).abs() < 0.01,
        "{}",
        gib(&ranked[0])
    );
    assert!(
        (gib(&ranked[1]) - 70.06).abs() < 0.01,
        "{}",
        gib(&ranked[1])
    );
    assert_eq!(top("llama-13b", 6, 8)[0], "amsp:p=2x1,g=8x1,os=8x1");
    assert_eq!(top("llama-13b", 7, 8)[0], T13);
    assert_eq!(top("llama-13b", 9, 8)[0], T13);
    assert_ne!(top("llama-13b", 10, 8)[0], T13);
}

#[test]
fn table_iv_llama_30b_os_is_reproduced_from_32_gpus_not_its_p() {
    // From 8 GPUs, os=8x4 does not exist; its one-node form p=g=os=8x1 wins.
    assert_eq!(top("llama-30b", 0, 8)[0], "amsp:p=8x1,g=8x1,os=8x1");
    // From 32 GPUs with the 13B window's unmodeled memory: os=8x4, p=g=4x1.
    let t = top("llama-30b", 8, 32);
    assert_eq!(t[0], "amsp:p=4x1,g=4x1,os=8x4", "{:?}", &t[..4]);
    let at = t.iter().position(|n| n == T30).unwrap();
    assert!(at <= 3, "Table IV's 30B row ranks {}", at + 1);
    // Table IV's p=8x1 needs > 24.3 GiB unmodeled for 30B (p=4x1 at 55.67 GiB).
    assert_eq!(top("llama-30b", 25, 32)[0], T30);
    assert_ne!(top("llama-30b", 24, 32)[0], T30);
}

/// AMSP §IV-A's ring cost, as the effective bandwidth model writes it.
#[test]
fn effective_bandwidth_is_ncclring_on_the_testbed() {
    let t = amsp::testbed(128);
    let l = &t.links;
    // Intra-node all-gather of 1 GB over 8 A800s: 7 NVLink steps + 7/8 GB at 200 GB/s.
    let ag = collective_us(l, 8, Coll::AllGather, 1e9, 8, 1);
    assert!(
        (ag - (7.0 * 1.5 + 7.0 / 8.0 * 1e9 / 200e3)).abs() < 1e-6,
        "{ag}"
    );
    // One rank per node over 128 nodes: 1/8 of 4 x 25 GB/s, 127 IB steps.
    let ar = collective_us(l, 8, Coll::AllReduce, 1e9, 1, 128);
    let want = 2.0 * (127.0 * 4.0 + 127.0 / 128.0 * 1e9 / 12.5e3);
    assert!((ar - want).abs() < 1e-6, "{ar} vs {want}");
    // Broadcast pays the volume once.
    let bc = collective_us(l, 8, Coll::Broadcast, 1e9, 4, 1);
    assert!((bc - (3.0 * 1.5 + 1e9 / 200e3)).abs() < 1e-6);
    assert_eq!(collective_us(l, 8, Coll::AllReduce, 1e9, 1, 1), 0.0);
    // The testbed: the paper's intra/inter ratio of 2 (§III-A).
    assert_eq!(l.intra_node.bandwidth_gbs * 8.0 / l.node_egress_gbs(), 16.0);
    assert_eq!(
        2.0 * l.intra_node.bandwidth_gbs / (2.0 * l.node_egress_gbs()),
        2.0
    );
    assert!(amsp::parse_cluster("amsp-a800:0").unwrap().is_err());
    assert_eq!(
        amsp::parse_cluster("amsp-a800:16").unwrap().unwrap().nodes,
        16
    );
    assert!(amsp::parse_cluster("dgx-a100:16").is_none());
}

/// The recomputation setting of §VI-A4 and the scale rule.
#[test]
fn recomputation_and_scales_follow_the_paper() {
    for (m, rc) in [
        ("llama-7b", false),
        ("llama-13b", false),
        ("llama-30b", true),
    ] {
        assert_eq!(
            amsp::recompute_for(&ModelShape::preset(m).unwrap()),
            rc,
            "{m}"
        );
    }
    assert_eq!(amsp::scales(128), vec![1, 2, 4, 8, 16, 32, 64, 128]);
    assert_eq!(amsp::scales(12), vec![1, 2, 4, 12]);
    let r = req("llama-7b", 0);
    let c = amsp::plan(&r, AmspOptions::default()).unwrap();
    let t7 = c.iter().find(|c| c.candidate.strategy.name == T7).unwrap();
    // 8 scales, M = 128 on 8 GPUs down to 1 on 1024 (§VI-A3).
    let acc: Vec<usize> = t7.scales.iter().map(|s| s.accum).collect();
    assert_eq!(acc, vec![128, 64, 32, 16, 8, 4, 2, 1]);
    assert!(!t7.candidate.recompute);
    // 30B's os=8x4 exists only from 4 nodes.
    assert!(!top("llama-30b", 0, 8).iter().any(|n| n == T30));
    assert!(amsp::plan(&r, AmspOptions { from_nodes: 3 }).is_err());
}
