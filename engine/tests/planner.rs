//! The planner: memory model against the papers' formulas, AMSP's filters, the exact
//! node-symmetric replay, ranking, and the `strata-plan` binary.

use strata::Topology;
use strata_engine::config::{Factor, GradSync, Mesh, Strategy};
use strata_engine::planner::memory::{self, ActivationInputs};
use strata_engine::planner::search::{amsp_reject, amsp_triples, candidates};
use strata_engine::planner::{
    best, group_topology, parse_bytes, plan, CommModel, GroupShape, ModelShape, Norm, Overhead,
    PlanRequest,
};

fn f(a: usize, b: usize) -> Factor {
    Factor::new(a, b)
}

fn close(x: f64, y: f64, rel: f64) -> bool {
    (x - y).abs() <= rel * y.abs().max(1.0)
}

/// `a` ranks in each of `b` nodes, the ranks of one node `stride` local indices apart.
fn shape(a: usize, b: usize, stride: usize) -> GroupShape {
    GroupShape { a, b, stride }
}

#[test]
fn preset_parameter_counts_match_nominal_sizes() {
    for (name, nominal, tol) in [
        ("llama-7b", 6.74e9, 0.01),
        ("llama-13b", 13.0e9, 0.01),
        ("llama-30b", 32.5e9, 0.01),
        ("llama-65b", 65.2e9, 0.01),
        ("gpt-neox-20b", 20.6e9, 0.01),
        ("bert-base", 110e6, 0.02),
        ("bert-large", 335e6, 0.02),
    ] {
        let m = ModelShape::preset(name).unwrap();
        let p = m.params() as f64;
        assert!(close(p, nominal, tol), "{name}: {p} vs {nominal}");
        let units = m.units();
        assert_eq!(units.len(), 2 * m.layers + 2, "{name}");
        assert_eq!(units.iter().map(|u| u.params).sum::<u64>(), m.params());
        let sizes: u64 = m.unit_sizes().iter().map(|&(s, k)| s * k as u64).sum();
        assert_eq!(sizes, m.params(), "{name}");
    }
    // The published LLaMA-7B count, exactly.
    assert_eq!(
        ModelShape::preset("llama-7b").unwrap().params(),
        6_738_415_616
    );
    assert!(ModelShape::preset("gpt-5").is_err());
    assert!(ModelShape::custom(0, 4096, 32, 0, 32000, true).is_err());
    assert!(ModelShape::custom(2, 100, 3, 0, 32000, false).is_err()); // heads ∤ hidden
    let c = ModelShape::custom(2, 64, 4, 0, 100, false).unwrap();
    assert_eq!(c.ffn, 256);
    assert_eq!(c.norm, Norm::RmsNorm);
}

#[test]
fn activations_follow_korthikanti() {
    // GPT's shape (f = 4h, dropout, no FlashAttention, 16-bit): sbh(34 + 5as/h) per layer.
    let mut m = ModelShape::custom(24, 1024, 16, 0, 1000, false).unwrap();
    m.dropout = true;
    let a = ActivationInputs {
        seq: 2048,
        micro_batch: 2,
        w: 2,
        recompute: false,
        flash_attention: false,
    };
    let (s, b, h, heads) = (2048u64, 2u64, 1024u64, 16u64);
    let want = s * b * h * 34 + 5 * heads * s * s * b;
    assert_eq!(memory::layer_activations(&m, &a), want);
    // Recomputation keeps far less; FlashAttention drops the as²b terms.
    let rc = ActivationInputs {
        recompute: true,
        ..a
    };
    assert!(memory::activations(&m, &rc) < memory::activations(&m, &a) / 4);
    let fl = ActivationInputs {
        flash_attention: true,
        ..a
    };
    assert_eq!(
        memory::layer_activations(&m, &fl),
        s * b * h * 34 + 4 * heads * s * b
    );
}

/// AMSP §IV-D: D = 2Φ/(s_p⁰s_p¹) + 2Φ/(s_g⁰s_g¹) + 12Φ/(s_os⁰s_os¹), for every AMSP
/// candidate, every preset and w = 2.
#[test]
fn model_states_equal_amsp_d_formula() {
    let m = ModelShape::preset("llama-13b").unwrap();
    let phi = m.params();
    let mesh = Mesh::new(8, 16);
    for s in candidates(mesh, 1) {
        let (p, g, os, sec) = memory::model_states(phi, 2, &s);
        let d = (2 * phi).div_ceil(s.p.size() as u64)
            + (2 * phi).div_ceil(s.g.size() as u64)
            + (12 * phi).div_ceil(s.os.size() as u64);
        assert_eq!(p + g + os, d, "{}", s.name);
        assert_eq!(sec > 0, s.hpz.is_some(), "{}", s.name);
    }
}

/// PaRO Table 1 (N GPUs in all, M per group = one node, K = 12), each column.
#[test]
fn model_states_equal_paro_table_1() {
    let m = ModelShape::preset("llama-7b").unwrap();
    let psi = m.params() as f64;
    let mesh = Mesh::new(8, 4);
    let (n, mm, k) = (32.0, 8.0, 12.0);
    let rows: [(&str, [f64; 3]); 8] = [
        ("zero1", [2.0 * psi, 2.0 * psi, k * psi / n]),
        ("zero2", [2.0 * psi, 2.0 * psi / n, k * psi / n]),
        ("zero3", [2.0 * psi / n, 2.0 * psi / n, k * psi / n]),
        ("mics:8", [2.0 * psi / mm, 2.0 * psi / mm, k * psi / mm]),
        (
            "zeropp",
            [2.0 * psi / n + 2.0 * psi / mm, 2.0 * psi / n, k * psi / n],
        ),
        ("paro-igg", [2.0 * psi / mm, 2.0 * psi / n, k * psi / n]),
        ("paro-iig", [2.0 * psi / mm, 2.0 * psi / mm, k * psi / n]),
        ("paro-nig", [2.0 * psi, 2.0 * psi / mm, k * psi / n]),
    ];
    for (name, [wp, wg, wos]) in rows {
        let s = Strategy::parse(name, mesh).unwrap();
        let (p, g, os, sec) = memory::model_states(m.params(), 2, &s);
        // Shards round up: at most one byte per term off the real-valued formula.
        assert!(((p + sec) as f64 - wp).abs() <= 2.0, "{name} P");
        assert!((g as f64 - wg).abs() <= 1.0, "{name} G");
        assert!((os as f64 - wos).abs() <= 1.0, "{name} OS");
    }
}

#[test]
fn zero3_uses_less_memory_than_mics_than_dp() {
    let cluster = Topology::parse("dgx-a100:4").unwrap();
    let mut req = PlanRequest::new(ModelShape::preset("llama-7b").unwrap(), cluster);
    req.recompute = Some(true);
    let ranked = plan(&req).unwrap();
    let mem = |n: &str| {
        ranked
            .iter()
            .find(|c| c.strategy.name == n)
            .unwrap_or_else(|| panic!("{n} missing"))
            .memory_bytes
    };
    assert!(mem("zero3") < mem("mics:8"), "zero3 < mics");
    assert!(mem("mics:8") < mem("dp"), "mics < dp");
    assert!(mem("zero3") < mem("zero2") && mem("zero2") < mem("zero1"));
}

/// AMSP §V-B eqs 3-7 with s_dp = R x N, s_g ∈ {s_p, s_os}, written out here.
fn passes(p: Factor, g: Factor, os: Factor, r: usize, n: usize) -> bool {
    let fs = [p, g, os];
    let eq3 = 1 <= p.intra && p.intra <= g.intra && g.intra <= os.intra && os.intra <= r;
    let eq4 = 1 <= p.inter && p.inter <= g.inter && g.inter <= os.inter && os.inter <= n;
    let eq5 = fs.iter().all(|x| r % x.intra == 0);
    let eq6 = fs.iter().all(|x| n % x.inter == 0);
    let eq7 = fs.iter().all(|x| x.inter == 1 || x.intra == r);
    let nest = p.divides(g) && g.divides(os);
    let sg = g == p || g == os;
    eq3 && eq4 && eq5 && eq6 && eq7 && nest && sg
}

#[test]
fn filters_reject_what_eqs_3_to_7_reject() {
    for (r, n) in [(8, 4), (4, 6), (8, 1), (2, 8)] {
        let mesh = Mesh::new(r, n);
        let got = amsp_triples(mesh);
        let mut want = Vec::new();
        let all: Vec<Factor> = (1..=r)
            .flat_map(|a| (1..=n).map(move |b| Factor::new(a, b)))
            .collect();
        for &p in &all {
            for &g in &all {
                for &os in &all {
                    let ok = passes(p, g, os, r, n);
                    assert_eq!(
                        amsp_reject(p, g, os, mesh).is_none(),
                        ok,
                        "{r}x{n}: {p} {g} {os}"
                    );
                    if ok {
                        want.push((p, g, os));
                    }
                }
            }
        }
        assert_eq!(got.len(), want.len(), "{r}x{n}");
        for t in &want {
            assert!(got.contains(t), "{r}x{n}: {t:?} missing");
        }
    }
    let m = Mesh::new(8, 4);
    let why = |p, g, os| amsp_reject(p, g, os, m).unwrap_or_default();
    assert!(why(f(1, 2), f(1, 2), f(1, 2)).contains("eq. 7"));
    assert!(why(f(3, 1), f(3, 1), f(3, 1)).contains("eq. 5"));
    assert!(why(f(8, 3), f(8, 3), f(8, 3)).contains("eq. 6"));
    assert!(why(f(4, 1), f(2, 1), f(8, 1)).contains("eq. 3"));
    assert!(why(f(8, 4), f(8, 2), f(8, 4)).contains("eq. 4"));
    assert!(why(f(1, 1), f(2, 1), f(8, 1)).contains("AMSP §IV-C3"));
    assert!(amsp_reject(f(1, 1), f(1, 1), f(8, 1), m).is_none());
    // Every AMSP candidate syncs with all-reduce and validates in the engine.
    for (p, g, os) in amsp_triples(m) {
        let s = Strategy::parse(&format!("amsp:p={p},g={g},os={os}"), m).unwrap();
        assert_eq!(s.sync, GradSync::AllReduce);
    }
}

#[test]
fn group_topologies_keep_each_ranks_nic_share() {
    // DGX: one NIC per GPU, 4 ranks of each of 2 nodes keep 4 NICs.
    let dgx = Topology::parse("dgx-a100:4").unwrap();
    let t = group_topology(&dgx, shape(4, 2, 1)).unwrap();
    assert_eq!(
        (t.nodes, t.ranks_per_node(), t.links.nics_per_node),
        (2, 4, 4)
    );
    assert_eq!(t.links.nic_bandwidth_gbs, dgx.links.nic_bandwidth_gbs);
    // p3dn: one NIC (12.5 GB/s line rate) for 8 GPUs; half the node's ranks get half of it.
    let p3 = Topology::parse("p3dn:4").unwrap();
    let t = group_topology(&p3, shape(4, 2, 1)).unwrap();
    let nic = p3.links.nic_bandwidth_gbs;
    assert_eq!(t.links.nics_per_node, 1);
    assert!(close(t.links.nic_bandwidth_gbs, nic / 2.0, 1e-12));
    assert!(close(t.links.inter_node.bandwidth_gbs, nic / 8.0, 1e-12));
    let t = group_topology(&p3, shape(1, 4, 1)).unwrap();
    assert!(close(t.links.nic_bandwidth_gbs, nic / 8.0, 1e-12));
    // p4d: 2 GPUs per NIC; a stride-2 group has one member per NIC.
    let p4 = Topology::parse("p4d:2").unwrap();
    let t = group_topology(&p4, shape(4, 2, 2)).unwrap();
    assert_eq!(t.links.nics_per_node, 4);
    assert!(close(
        t.links.nic_bandwidth_gbs,
        p4.links.nic_bandwidth_gbs / 2.0,
        1e-12
    ));
    // Frontier: a GCD pair is one package; every other GCD spans packages.
    let fr = Topology::parse("frontier:2").unwrap();
    let t = group_topology(&fr, shape(2, 1, 1)).unwrap();
    assert_eq!((t.packages_per_node, t.dies_per_package), (1, 2));
    let t = group_topology(&fr, shape(4, 1, 2)).unwrap();
    assert_eq!((t.packages_per_node, t.dies_per_package), (4, 1));
    assert!(group_topology(&fr, shape(16, 1, 1)).is_err());
}

/// On one node of 4 ranks with a ring everywhere, the phases reduce to the alpha-beta
/// closed forms: zero1 = ring all-reduce of wΦ + ring all-gather of wΦ/4 per rank.
#[test]
fn phases_match_closed_forms_on_one_node() {
    let t = Topology::parse("nodes:1x4").unwrap();
    let mesh = Mesh::of(&t);
    let m = ModelShape::custom(2, 64, 4, 0, 128, false).unwrap();
    let phi = m.params() as f64;
    let mut comm = CommModel::new(&t).unwrap();
    let s = Strategy::parse("zero1,algo=ring", mesh).unwrap();
    let (ph, _) = comm.phase_times(&m, &s, 2, 1).unwrap();
    let (a, bw) = (
        t.links.intra_node.latency_us,
        t.links.intra_node.bandwidth_gbs * 1e3,
    );
    let chunk = |bytes: f64| (bytes / 4.0 / 2.0).ceil() * 2.0; // whole elements per rank
    let ar = 2.0 * 3.0 * (a + chunk(2.0 * phi) / bw);
    let ag = 3.0 * (a + chunk(2.0 * phi) / bw);
    assert!(
        close(ph.boundary_us, ar, 1e-9),
        "{} vs {ar}",
        ph.boundary_us
    );
    assert!(close(ph.spread_us, ag, 1e-9), "{} vs {ag}", ph.spread_us);
    assert_eq!(ph.fwd_gather_us + ph.bwd_gather_us + ph.grad_reduce_us, 0.0);
    // zero3 with M micro-batches: 2 gathers + 1 reduce-scatter per unit per micro-batch.
    let s = Strategy::parse("zero3,algo=ring", mesh).unwrap();
    let (ph3, _) = comm.phase_times(&m, &s, 2, 3).unwrap();
    let per: f64 = m
        .unit_sizes()
        .iter()
        .map(|&(u, k)| k as f64 * 3.0 * (a + chunk(2.0 * u as f64) / bw))
        .sum();
    assert!(close(ph3.fwd_gather_us, 3.0 * per, 1e-9));
    assert!(close(ph3.grad_reduce_us, 3.0 * per, 1e-9));
    assert_eq!(ph3.boundary_us + ph3.spread_us, 0.0);
    // AMSP T_g: (M-1) all-reduces when s_g > s_p, none with M = 1.
    let s = Strategy::parse("amsp:p=1x1,g=4x1,os=4x1", mesh).unwrap();
    assert_eq!(
        comm.phase_times(&m, &s, 2, 1).unwrap().0.grad_reduce_us,
        0.0
    );
    assert!(comm.phase_times(&m, &s, 2, 3).unwrap().0.grad_reduce_us > 0.0);
}

#[test]
fn small_cluster_plan_is_ranked_and_deterministic() {
    let cluster = Topology::parse("dgx-a100:2").unwrap();
    let mut req = PlanRequest::new(ModelShape::preset("llama-7b").unwrap(), cluster);
    req.gpu_mem = 40 << 30;
    req.global_batch_tokens = 16 * 4096 * 4; // M = 4
    assert_eq!(req.accum_steps(), 4);
    let a = plan(&req).unwrap();
    let b = plan(&req).unwrap();
    assert_eq!(a, b);
    assert!(a.iter().any(|c| c.feasible) && a.iter().any(|c| !c.feasible));
    let split = a.iter().position(|c| !c.feasible).unwrap();
    assert!(a[split..].iter().all(|c| !c.feasible));
    for w in a[..split].windows(2) {
        assert!(w[0].comm_time_us <= w[1].comm_time_us);
    }
    for w in a[split..].windows(2) {
        assert!(w[0].memory_bytes <= w[1].memory_bytes);
    }
    for c in &a {
        assert_eq!(c.strategy.accum, 4);
        assert!(close(c.comm_time_us, c.phases.total(), 1e-12));
        assert_eq!(c.memory_bytes, c.memory.total());
        assert_eq!(c.feasible, c.why.is_none());
        if let Some(w) = &c.why {
            assert!(w.contains("out of memory") && w.contains("GiB"), "{w}");
        }
    }
    assert_eq!(best(&req).unwrap(), a[0].strategy);
    // Every preset is there, expanded for 8 x 2.
    for name in [
        "dp", "zero1", "zero2", "zero3", "mics:8", "mics:16", "zeropp", "paro-igg", "paro-iig",
        "paro-nig",
    ] {
        assert!(a.iter().any(|c| c.strategy.name == name), "{name}");
    }
    // Nothing fits 1 GiB: a clear error.
    req.gpu_mem = 1 << 30;
    let e = best(&req).unwrap_err().to_string();
    assert!(e.contains("no strategy fits"), "{e}");
}

#[test]
fn frontier_plans_include_the_topology_preset() {
    let cluster = Topology::parse("frontier:2").unwrap();
    let mut req = PlanRequest::new(ModelShape::preset("bert-large").unwrap(), cluster);
    req.seq = 512;
    req.micro_batch = 8;
    let a = plan(&req).unwrap();
    let ft = a
        .iter()
        .find(|c| c.strategy.name == "frontier-topo")
        .unwrap();
    assert_eq!(
        (ft.strategy.p, ft.strategy.g),
        (Factor::new(2, 1), Factor::new(8, 1))
    );
    assert!(ft.feasible && ft.comm_time_us > 0.0);
}

#[test]
fn bad_requests_are_explained() {
    let cluster = Topology::parse("dgx-a100:2").unwrap();
    let mut req = PlanRequest::new(ModelShape::preset("bert-base").unwrap(), cluster);
    req.seq = 0;
    assert!(plan(&req)
        .unwrap_err()
        .to_string()
        .contains("sequence length"));
    req.seq = 128;
    req.dtype_bytes = 3;
    assert!(plan(&req).unwrap_err().to_string().contains("bf16"));
    req.dtype_bytes = 2;
    req.overhead = Overhead::Reserve(req.gpu_mem);
    assert!(plan(&req).unwrap_err().to_string().contains("reserve"));
    assert_eq!(parse_bytes("80G").unwrap(), 80 << 30);
    assert_eq!(parse_bytes("80GiB").unwrap(), 80 << 30);
    assert_eq!(parse_bytes("80gb").unwrap(), 80 << 30);
    assert_eq!(parse_bytes("85899345920").unwrap(), 80 << 30);
    assert_eq!(parse_bytes("1.5K").unwrap(), 1536);
    assert_eq!(parse_bytes("4MB").unwrap(), 4 << 20);
    for bad in ["", "G", "-1G", "80X", "0", "1e400", "NaN", "inf"] {
        assert!(parse_bytes(bad).is_err(), "{bad}");
    }
}

#[test]
fn strata_plan_binary_writes_json() {
    let dir = std::env::temp_dir().join(format!("strata-plan-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("plan.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata-plan"))
        .args([
            "--model",
            "llama-7b",
            "--cluster",
            "dgx-a100:128",
            "--gpu-mem",
            "80G",
            "--seq",
            "4096",
            "--micro-batch",
            "1",
            "--global-batch-tokens",
            "4194304",
            "--top",
            "5",
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("rank") && stdout.contains("planned in"),
        "{stdout}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["request"]["model"]["name"], "llama-7b");
    let c = v["candidates"].as_array().unwrap();
    assert!(c.len() > 100);
    let is_factor = |x: &serde_json::Value| {
        x.as_str()
            .and_then(|s| s.split_once('x'))
            .is_some_and(|(a, b)| a.parse::<usize>().is_ok() && b.parse::<usize>().is_ok())
    };
    for x in c {
        assert!(x["strategy"].is_string());
        assert!(
            is_factor(&x["p"]) && is_factor(&x["g"]) && is_factor(&x["os"]),
            "{x}"
        );
        assert!(x["comm_time_us"].as_f64().is_some_and(|t| t >= 0.0));
        assert!(x["memory_bytes"].as_u64().is_some());
        assert!(x["feasible"].is_boolean());
    }
    assert_eq!(c[0]["feasible"], true);
    // Bad input: a clear error, exit code 2, no panic.
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_strata-plan"))
        .args(["--model", "llama-7b", "--cluster", "dgx-a100:0"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--cluster"));
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_strata-plan"))
        .args([
            "--model",
            "llama-7b",
            "--cluster",
            "dgx-a100:2",
            "--gpu-mem",
            "lots",
        ])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--gpu-mem"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--global-batch-tokens 4M` is 4,194,304 tokens (strata's one size parser), and the
/// other size flags take suffixes too.
#[test]
fn strata_plan_takes_size_suffixes() {
    let dir = std::env::temp_dir().join(format!("strata-plan-units-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |tokens: &str, extra: &[&str], name: &str| -> serde_json::Value {
        let json = dir.join(name);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata-plan"))
            .args(["--model", "bert-base", "--cluster", "dgx-a100:2"])
            .args(["--global-batch-tokens", tokens, "--top", "1", "--json"])
            .arg(&json)
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
    };
    let a = run("4M", &["--seq", "512"], "a.json");
    let b = run("4194304", &["--seq", "512"], "b.json");
    assert_eq!(a["request"]["global_batch_tokens"], 4194304);
    assert_eq!(a["request"], b["request"]);
    assert_eq!(a["candidates"], b["candidates"]);
    let c = run(
        "4MiB",
        &["--gpu-mem", "81920MiB", "--seq", "0.5K"],
        "c.json",
    );
    assert_eq!(c["request"], b["request"]);
    // The modeled overhead is in the breakdown; --overhead off and --reserve 0 drop it,
    // --reserve replaces it.
    let m = &a["candidates"][0]["memory"];
    assert_eq!(m["context"], 768u64 << 20);
    assert!(m["comm_buffers"].as_u64().unwrap() >= 294 << 20, "{m}");
    assert!(m["fragmentation"].as_u64().unwrap() > 0);
    for (extra, name) in [
        (["--overhead", "off"], "d.json"),
        (["--reserve", "0"], "e.json"),
    ] {
        let d = run("4M", &[&extra[..], &["--seq", "512"]].concat(), name);
        let m = &d["candidates"][0]["memory"];
        assert_eq!(m["context"], 0, "{extra:?}");
        assert_eq!(m["fragmentation"], 0, "{extra:?}");
        assert_eq!(d["request"]["overhead"], "off");
    }
    let r = run("4M", &["--reserve", "8G", "--seq", "512"], "f.json");
    assert_eq!(r["candidates"][0]["memory"]["reserve"], 8u64 << 30);
    assert_eq!(r["candidates"][0]["memory"]["context"], 0);
    // A bad size names the flag and the accepted forms.
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_strata-plan"))
        .args(["--model", "bert-base", "--cluster", "dgx-a100:2"])
        .args(["--global-batch-tokens", "4 million"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let e = String::from_utf8_lossy(&bad.stderr);
    assert!(
        e.contains("--global-batch-tokens") && e.contains("4MiB"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The framework overhead, term by term (memory.rs): CUDA context, NCCL buffers per
/// communicator, fragmentation of the dynamic allocations.
#[test]
fn overhead_terms_follow_their_formulas() {
    use strata_engine::planner::memory::{add_overhead, communicators, nccl_buffers};
    let mesh = Mesh::new(8, 4);
    // NCCL: 16 channels x 2 peers x (4 MiB + 4,915,200 + 512 KiB) per communicator.
    assert_eq!(nccl_buffers(1), 32 * ((4 << 20) + 4_915_200 + (512 << 10)));
    assert_eq!(nccl_buffers(1) >> 20, 294);
    // zero1: the world only (dp/p is the world); its spread over OS/P is the world too.
    let z1 = Strategy::parse("zero1", mesh).unwrap();
    assert!(communicators(&z1, mesh).is_empty());
    // AMSP 7B's os=8x1: the world (all-reduce) and the node (spread).
    let a = Strategy::parse("amsp:p=1x1,g=1x1,os=8x1", mesh).unwrap();
    assert_eq!(communicators(&a, mesh), vec![GroupShape::block(f(8, 1))]);
    // mics:8: P = node, replicas across nodes.
    let m8 = Strategy::parse("mics:8", mesh).unwrap();
    assert_eq!(communicators(&m8, mesh).len(), 2);
    let mut b = memory::MemoryBreakdown {
        activations: 1000,
        buffers: 500,
        ..Default::default()
    };
    add_overhead(&mut b, Overhead::Modeled, &a, mesh);
    assert_eq!(b.context, 768 << 20);
    assert_eq!(b.comm_buffers, nccl_buffers(2));
    assert_eq!(b.fragmentation, 300);
    assert_eq!(b.total(), 1500 + b.context + b.comm_buffers + 300);
    add_overhead(&mut b, Overhead::Reserve(7), &a, mesh);
    assert_eq!(b.overhead(), 7);
    add_overhead(&mut b, Overhead::Off, &a, mesh);
    assert_eq!(b.total(), 1500);
}

/// With the overhead modeled, the 1024-GPU LLaMA plans recommend only what fits a real
/// 80 GiB card: every feasible row's total includes context, NCCL buffers and
/// fragmentation; the 13B (76.2 GiB) and 30B (77.3 GiB) rows of the overhead-free
/// model are out.
#[test]
fn llama_13b_and_30b_tops_fit_with_overhead() {
    let cluster = Topology::parse("dgx-a100:128").unwrap();
    for (name, gone) in [
        ("llama-13b", "amsp:p=1x1,g=8x1,os=8x1"),
        ("llama-30b", "paro-nig"),
    ] {
        let req = PlanRequest::new(ModelShape::preset(name).unwrap(), cluster.clone());
        let ranked = plan(&req).unwrap();
        let top = &ranked[0];
        assert!(top.feasible, "{name}");
        assert!(top.memory.overhead() > 1 << 30, "{name}: {:?}", top.memory);
        assert!(top.memory_bytes <= 80 << 30);
        let c = ranked.iter().find(|c| c.strategy.name == gone).unwrap();
        assert!(
            !c.feasible || c.recompute,
            "{name}: {gone} {:?}",
            c.memory_bytes
        );
        let mut off = req.clone();
        off.overhead = Overhead::Off;
        let o = plan(&off).unwrap();
        let c0 = o.iter().find(|c| c.strategy.name == gone).unwrap();
        assert!(c0.feasible, "{name}: {gone} fits without overhead");
    }
}

#[test]
fn quantized_phases_pay_their_kernels_at_the_measured_rates() {
    use strata_engine::planner::KernelRates;
    let t = Topology::parse("dgx-a100:2").unwrap();
    let mesh = Mesh::of(&t);
    let m = ModelShape::custom(2, 256, 4, 0, 512, false).unwrap();
    let free = CommModel::new(&t)
        .unwrap()
        .with_kernel_rates(KernelRates::free())
        .unwrap();
    let h200 = CommModel::new(&t).unwrap();
    let (mut free, mut h200) = (free, h200);
    // zeropp: qwZ int8 all-gathers (fwd over P, bwd over hpZ) and qgZ int4 reduce-scatters.
    let s = Strategy::parse("zeropp", mesh).unwrap();
    let (a, _) = free.phase_times(&m, &s, 2, 1).unwrap();
    let (b, _) = h200.phase_times(&m, &s, 2, 1).unwrap();
    // The grad reduce of each unit adds exactly its kernels' bytes over their rates.
    let r = KernelRates::h200();
    let (p, nodes, local) = (16u64, 2u64, 8u64);
    let extra: f64 = m
        .unit_sizes()
        .iter()
        .map(|&(u, k)| {
            let c = u.div_ceil(p);
            let packed = strata::kernels::QuantSpec::new(4, 256)
                .unwrap()
                .packed_len(c as usize) as u64;
            k as f64 * r.collective_us(false, false, c, packed, 2, 4, local, nodes)
        })
        .sum();
    assert!(extra > 0.0);
    assert!(
        close(b.grad_reduce_us - a.grad_reduce_us, extra, 1e-9),
        "{} - {} vs {extra}",
        b.grad_reduce_us,
        a.grad_reduce_us
    );
    // qwZ quantizes the forward gather; the backward one (hpZ's, in the node) is plain.
    assert!(b.fwd_gather_us > a.fwd_gather_us);
    assert_eq!(b.bwd_gather_us, a.bwd_gather_us);
    // Unquantized strategies pay nothing more.
    let s = Strategy::parse("zero3", mesh).unwrap();
    assert_eq!(
        free.phase_times(&m, &s, 2, 1).unwrap().0,
        h200.phase_times(&m, &s, 2, 1).unwrap().0
    );
    // Bad rates are refused.
    let mut bad = KernelRates::h200();
    bad.dequant_reduce_quant.q8 = -1.0;
    assert!(CommModel::new(&t).unwrap().with_kernel_rates(bad).is_err());
}
