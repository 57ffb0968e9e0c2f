//! `strata-perf` from the outside: small sweeps on the local transport, the JSON records,
//! the closed-form traffic figures, coalesced calls, and clean failures on bad input.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn perf_env(args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata-perf"));
    cmd.args(args);
    for v in [
        "STRATA_TOPOLOGY",
        "STRATA_ALGO",
        "STRATA_TIMEOUT",
        "STRATA_DEBUG",
    ] {
        cmd.env_remove(v);
    }
    cmd.envs(env.iter().copied());
    let o = cmd.output().expect("run strata-perf");
    let out = Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    };
    assert!(
        !out.stderr.contains("panicked"),
        "strata-perf panicked:\n{}",
        out.stderr
    );
    out
}

fn perf(args: &[&str]) -> Out {
    perf_env(args, &[])
}

/// Run and require exit 0.
fn perf_ok(args: &[&str]) -> Out {
    let o = perf(args);
    assert_eq!(
        o.code, 0,
        "strata-perf {args:?} failed\nstdout:\n{}\nstderr:\n{}",
        o.stdout, o.stderr
    );
    o
}

/// One data row: size, count, type, redop, algo, time, algbw, busbw, bound_us, %bound,
/// #wrong, [max_err, rms_err, bound: sweeps with a quantized algo], intra_pkg,
/// intra_node, inter_node, node_egress.
#[derive(Debug)]
struct Row {
    size: u64,
    count: u64,
    dtype: String,
    redop: String,
    algo: String,
    wrong: String,
    /// The error columns as printed (None: the table has none).
    err: Option<[String; 3]>,
    traffic: [u64; 4],
}

impl Row {
    /// (max_err, rms_err, bound) of a checked quantized row.
    fn errors(&self) -> (f64, f64, f64) {
        let e = self.err.as_ref().expect("the table has error columns");
        let v = |i: usize| {
            e[i].parse::<f64>()
                .unwrap_or_else(|_| panic!("error column {i} of {self:?} is not a number"))
        };
        (v(0), v(1), v(2))
    }
}

fn rows(stdout: &str) -> Vec<Row> {
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(
                f.len() == 15 || f.len() == 18,
                "row has 15 columns (18 with the error columns): {l}"
            );
            let t = f.len() - 4;
            let n = |i: usize| {
                f[i].parse::<u64>()
                    .unwrap_or_else(|_| panic!("column {i} of '{l}' is not an integer"))
            };
            for (i, v) in f.iter().enumerate().take(10).skip(5) {
                v.parse::<f64>()
                    .unwrap_or_else(|_| panic!("column {i} of '{l}' is not a number"));
            }
            Row {
                size: n(0),
                count: n(1),
                dtype: f[2].into(),
                redop: f[3].into(),
                algo: f[4].into(),
                wrong: f[10].into(),
                err: (f.len() == 18).then(|| [f[11].into(), f[12].into(), f[13].into()]),
                traffic: [n(t), n(t + 1), n(t + 2), n(t + 3)],
            }
        })
        .collect()
}

fn tmp(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("perf_cli-{}-{name}", std::process::id()))
}

fn read_json(path: &PathBuf) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("json file written");
    let _ = std::fs::remove_file(path);
    match serde_json::from_str::<Value>(&text).expect("valid JSON") {
        Value::Array(v) => v,
        other => panic!("expected a JSON array, got {other}"),
    }
}

const QUICK: [&str; 6] = ["-n", "3", "-w", "1", "--timeout", "60"];

/// A command line written as one string (words split at spaces), then `more` as they
/// are (paths).
fn words<'a>(line: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    line.split_whitespace()
        .chain(more.iter().copied())
        .collect()
}

fn args<'a>(a: &[&'a str]) -> Vec<&'a str> {
    a.iter().copied().chain(QUICK).collect()
}

#[test]
fn hier_and_ring_all_gather_on_two_nodes() {
    let o = perf_ok(&args(&words(
        "--ranks 8 --topology nodes:2x4 --op all-gather --algo hier,ring -b 1K -e 64K -f 4",
        &[],
    )));
    let r = rows(&o.stdout);
    let sizes = [1024u64, 4096, 16384, 65536];
    assert_eq!(r.len(), 2 * sizes.len(), "{}", o.stdout);
    for (i, row) in r.iter().enumerate() {
        let m = sizes[i % 4];
        assert_eq!(row.size, m);
        assert_eq!(
            row.count,
            m / (4 * 8),
            "all-gather count is the per-rank sendcount"
        );
        assert_eq!((row.dtype.as_str(), row.redop.as_str()), ("f32", "none"));
        assert_eq!(row.wrong, "0");
        // Closed forms for 2 nodes x 4 ranks (n = 2, k = 4, p = 8), M = size.
        let want = if i < 4 {
            assert_eq!(row.algo, "hier");
            [0, 2 * 3 * m, m, m / 2] // intra_node n(k-1)M, inter (n-1)M, egress (p-k)/p M
        } else {
            assert_eq!(row.algo, "ring");
            [0, 6 * 7 * m / 8, 2 * 7 * m / 8, 7 * m / 8] // 6 intra and 2 inter ring links of (p-1)/p M
        };
        assert_eq!(row.traffic, want, "traffic of {row:?}");
    }
    assert!(
        o.stdout.contains("# Out of bounds values : 0 OK"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("# Avg bus bandwidth"), "{}", o.stdout);
    for key in [
        "transport",
        "topology",
        "ranks",
        "algo",
        "dtype",
        "op",
        "redop",
        "iters",
        "warmup",
        "check",
    ] {
        assert!(
            o.stdout
                .lines()
                .any(|l| l.starts_with('#') && l.contains(key)),
            "header names {key}:\n{}",
            o.stdout
        );
    }
}

#[test]
fn json_records_every_op() {
    let path = tmp("every-op.json");
    let o = perf_ok(&args(&words("--ranks 4 --topology nodes:2x2 --op all-gather,reduce-scatter,all-reduce,all-to-all,broadcast --algo ring -b 512 -e 2K -f 2 --json", &[path.to_str().unwrap()])));
    let recs = read_json(&path);
    assert_eq!(recs.len(), 5 * 3, "one record per (op, size)");
    assert_eq!(rows(&o.stdout).len(), recs.len());
    let p = 4.0;
    for r in &recs {
        let op = r["op"].as_str().unwrap();
        let size = r["size"].as_u64().unwrap();
        let count = r["count"].as_u64().unwrap();
        let per = match op {
            "all-gather" | "reduce-scatter" | "all-to-all" => 4 * 4,
            _ => 4,
        };
        assert_eq!(size, count * per, "{r}");
        assert_eq!(r["ranks"], 4);
        assert_eq!(r["topology"], "nodes:2x2");
        assert_eq!(r["transport"], "local");
        assert_eq!(r["dtype"], "f32");
        assert_eq!(r["algo"], "ring");
        assert_eq!(r["wrong"], 0, "{r}");
        assert_eq!(r["traffic_source"], "measured");
        assert!(r["coalesce"].is_null());
        let t = &r["traffic"];
        for k in [
            "intra_package",
            "intra_node",
            "inter_node",
            "max_node_egress",
        ] {
            assert!(t[k].is_u64(), "traffic.{k} in {r}");
        }
        assert!(
            t["inter_node"].as_u64().unwrap() > 0,
            "2 nodes exchange bytes: {r}"
        );
        let (time, algbw, busbw) = (
            r["time_us"].as_f64().unwrap(),
            r["algbw"].as_f64().unwrap(),
            r["busbw"].as_f64().unwrap(),
        );
        assert!(time > 0.0);
        assert!(
            (algbw - size as f64 / (time * 1e3)).abs() <= 1e-9 * algbw.max(1.0),
            "algbw = size / time: {r}"
        );
        let factor = match op {
            "all-reduce" => 2.0 * (p - 1.0) / p,
            "broadcast" => 1.0,
            _ => (p - 1.0) / p,
        };
        assert!(
            (busbw - algbw * factor).abs() <= 1e-9 * busbw.max(1.0),
            "busbw factor of {op}: {r}"
        );
        let want_redop = if matches!(op, "reduce-scatter" | "all-reduce") {
            "sum"
        } else {
            "none"
        };
        assert_eq!(r["redop"], want_redop);
    }
}

#[test]
fn coalesced_reduce_scatter_avg() {
    let path = tmp("coalesced.json");
    let o = perf_ok(&args(&words("--ranks 8 --topology nodes:2x4 --op reduce-scatter --redop avg -d bf16,f32 --algo ring,hier --coalesce 5 -b 1K -e 16K -f 4 --json", &[path.to_str().unwrap()])));
    let recs = read_json(&path);
    assert_eq!(recs.len(), 2 * 2 * 3);
    for r in &recs {
        assert_eq!(r["coalesce"], 5);
        assert_eq!(r["redop"], "avg");
        assert_eq!(r["wrong"], 0, "{r}");
        // Coalescing packs the tensors into one flat call: same bytes as the plain call.
        let m = r["size"].as_u64().unwrap();
        let t = &r["traffic"];
        if r["algo"] == "hier" {
            assert_eq!(r["algo_used"], "hier");
            assert_eq!(t["inter_node"], m, "{r}");
            assert_eq!(t["max_node_egress"], m / 2, "{r}");
        } else {
            assert_eq!(t["max_node_egress"], 7 * m / 8, "{r}");
        }
    }
    assert!(rows(&o.stdout).iter().all(|r| r.wrong == "0"));
}

#[test]
fn coalesced_all_gather_uneven_counts() {
    // 3 ranks, odd counts: the 4 tensors' counts are uneven and not multiples of 3.
    let o = perf_ok(&args(&words(
        "--ranks 3 --op all-gather --coalesce 4 -d f16 -b 100 -e 1000 -f 3",
        &[],
    )));
    let r = rows(&o.stdout);
    assert_eq!(
        r.iter().map(|r| r.size).collect::<Vec<_>>(),
        vec![96, 300, 900]
    );
    assert!(r.iter().all(|r| r.wrong == "0"), "{}", o.stdout);
}

#[test]
fn sizes_are_rounded_and_deduplicated() {
    // all-gather on 8 ranks, f32: size is a multiple of 32 bytes, at least one element per rank.
    let o = perf_ok(&args(&["--ranks", "8", "-b", "1", "-e", "64", "-f", "2"]));
    assert_eq!(
        rows(&o.stdout).iter().map(|r| r.size).collect::<Vec<_>>(),
        vec![32, 64]
    );
    let o = perf_ok(&args(&["--ranks", "8", "-b", "1000", "-e", "1000"]));
    assert_eq!(
        rows(&o.stdout)
            .iter()
            .map(|r| (r.size, r.count))
            .collect::<Vec<_>>(),
        vec![(992, 31)]
    );
    // all-reduce: count·s; -i steps when -f is 1.
    let o = perf_ok(&args(&words(
        "--ranks 2 --op all-reduce -d f16 -b 7 -e 25 -i 6",
        &[],
    )));
    assert_eq!(
        rows(&o.stdout).iter().map(|r| r.size).collect::<Vec<_>>(),
        vec![6, 12, 18, 24]
    );
}

#[test]
fn rounds_report_each_row_once_in_order() {
    // Three rounds over eight rows: the same rows in the same order as one round, each
    // reported once, checked, and one JSON record each with a time.
    let sweep = [
        "--ranks",
        "3",
        "--op",
        "all-gather,all-reduce",
        "--algo",
        "ring,log-step",
        "-b",
        "96",
        "-e",
        "384",
        "-f",
        "4",
        "-z",
        "1",
    ];
    let key = |r: &Row| (r.size, r.algo.clone(), r.redop.clone());
    let once = perf_ok(&args(&sweep));
    let path = tmp("rounds.json");
    let mut a = args(&sweep);
    a.extend(["--rounds", "3", "--json", path.to_str().unwrap()]);
    let thrice = perf_ok(&a);
    let (r1, r3) = (rows(&once.stdout), rows(&thrice.stdout));
    assert_eq!(r3.len(), 8, "{}", thrice.stdout);
    assert_eq!(
        r1.iter().map(key).collect::<Vec<_>>(),
        r3.iter().map(key).collect::<Vec<_>>()
    );
    assert!(r3.iter().all(|r| r.wrong == "0"), "{}", thrice.stdout);
    let recs = read_json(&path);
    assert_eq!(recs.len(), 8);
    assert!(recs
        .iter()
        .all(|r| r["time_us"].as_f64().is_some_and(|t| t > 0.0)));
    fails(&["--rounds", "0"], 2, "--rounds");
}

#[test]
fn topology_from_env_and_check_off() {
    let path = tmp("check-off.json");
    let o = perf_env(
        &args(&words("-c 0 -b 64 -e 64 --json", &[path.to_str().unwrap()])),
        &[("STRATA_TOPOLOGY", "nodes:2x2")],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout
            .lines()
            .any(|l| l.contains("ranks") && l.trim_end().ends_with(" 4")),
        "{}",
        o.stdout
    );
    let r = rows(&o.stdout);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].wrong, "N/A");
    let recs = read_json(&path);
    assert!(recs[0]["wrong"].is_null());
    assert_eq!(recs[0]["topology"], "nodes:2x2");
}

fn fails(args: &[&str], code: i32, needle: &str) {
    let o = perf(args);
    assert_eq!(
        o.code, code,
        "strata-perf {args:?}: exit code\nstderr:\n{}",
        o.stderr
    );
    assert!(
        o.stderr.contains(needle),
        "strata-perf {args:?}: stderr should mention '{needle}':\n{}",
        o.stderr
    );
}

/// Each `(command line, what stderr must mention)`: a usage error (exit code 2).
fn usage_errors(cases: &[(&str, &str)]) {
    for (line, needle) in cases {
        fails(&words(line, &[]), 2, needle);
    }
}

#[test]
fn bad_input_fails_cleanly() {
    fails(&["--algo", "bogus"], 2, "unknown algorithm 'bogus'");
    fails(&["--op", "all-gather,bogus"], 2, "unknown op 'bogus'");
    fails(&["-d", "f8"], 2, "unknown dtype");
    fails(&["--redop", "prod"], 2, "prod");
    fails(&["-b", "1Q"], 2, "not a size");
    fails(&["-b", "2K", "-e", "1K"], 2, "larger than");
    fails(&["-c", "2"], 2, "--check");
    fails(
        &["--coalesce", "2", "--op", "all-reduce"],
        2,
        "--coalesce applies to all-gather and reduce-scatter only",
    );
    fails(
        &["--coalesce", "2", "--op", "all-gather,all-to-all"],
        2,
        "not all-to-all",
    );
    fails(&["--transport", "infiniband"], 2, "unknown transport");
    fails(
        &words("--ranks 6 --topology nodes:2x4 -b 1K -e 1K", &[]),
        1,
        "topology nodes:2x4 describes 8 ranks",
    );
    fails(
        &words("--ranks 6 --topology nodes:2x4 -b 1K -e 1K", &[]),
        1,
        "give a topology of 6 ranks (e.g. nodes:1x6) or start 8 ranks",
    );
    fails(&["--topology", "nodes:0x3"], 1, "bad topology spec");
    // docs/errors.md: a transport not compiled in names the tool's own build.
    fails(&["--transport", "nccl"], 1, "not compiled");
    fails(
        &["--transport", "nccl"],
        1,
        "next: cargo run --release -p strata-tools --features cuda --bin strata-perf --",
    );
    fails(&["--transport", "cuda-local"], 1, "not compiled");
    if !cfg!(feature = "mpi") {
        fails(&["--transport", "mpi"], 1, "not compiled");
        fails(
            &["--transport", "mpi"],
            1,
            "next: cargo build --release -p strata-tools --features mpi, then mpirun -np <ranks> target/release/strata-perf --transport mpi",
        );
    }
    let missing = tmp("no-such-dir").join("out.json");
    fails(
        &["-b", "1K", "-e", "1K", "--json", missing.to_str().unwrap()],
        1,
        "cannot create",
    );
    let o = perf_env(&["-b", "1K", "-e", "1K"], &[("STRATA_TOPOLOGY", "bogus:3")]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stderr.contains("STRATA_TOPOLOGY"), "{}", o.stderr);
}

// ---------------------------------------------------------------------------------------
// Quantized collectives (qgz, qgz-1hop, qwz)
// ---------------------------------------------------------------------------------------

/// Fast settings for the quantized sweeps: one timed call, no warm-up.
const ONCE: [&str; 6] = ["-n", "1", "-w", "0", "--timeout", "60"];

fn quant_args<'a>(a: &[&'a str]) -> Vec<&'a str> {
    a.iter().copied().chain(ONCE).collect()
}

/// Every row of a checked quantized sweep: no element outside the bound, a nonzero
/// error no larger than the bound, RMS <= max; exact algos show "-" error columns.
fn assert_within_bound(o: &Out) -> Vec<Row> {
    let r = rows(&o.stdout);
    assert!(!r.is_empty(), "{}", o.stdout);
    for row in &r {
        assert_eq!(row.wrong, "0", "{row:?}\n{}", o.stdout);
        if matches!(row.algo.as_str(), "qgz" | "qgz-1hop" | "qwz") {
            let (max, rms, bound) = row.errors();
            assert!(max > 0.0, "quantization is lossy: {row:?}");
            assert!(max <= bound, "max_err <= bound: {row:?}");
            assert!(rms > 0.0 && rms <= max, "0 < rms_err <= max_err: {row:?}");
        } else {
            let e = row.err.as_ref().expect("error columns");
            assert!(e.iter().all(|v| v == "-"), "{row:?}");
        }
    }
    assert!(
        o.stdout.contains("# Out of bounds values : 0 OK"),
        "{}",
        o.stdout
    );
    r
}

#[test]
fn qgz_int4_bf16_on_four_nodes() {
    // The command, on a short sweep.
    let o = perf_ok(&quant_args(&words("--transport local --ranks 32 --topology nodes:4x8 --op reduce-scatter --algo qgz --bits 4 -d bf16 -b 1K -e 64K -f 8 -c 1", &[])));
    let r = assert_within_bound(&o);
    assert_eq!(
        r.iter().map(|r| (r.size, r.count)).collect::<Vec<_>>(),
        vec![(1024, 16), (8192, 128), (65536, 1024)]
    );
    assert!(r
        .iter()
        .all(|r| r.algo == "qgz" && r.dtype == "bf16" && r.redop == "sum"));
    assert!(
        o.stdout
            .lines()
            .any(|l| l.starts_with("#  quant") && l.contains("qgz int4/256")),
        "{}",
        o.stdout
    );
    for h in ["max_err", "rms_err", "bound"] {
        assert!(o.stdout.contains(h), "{}", o.stdout);
    }
}

#[test]
fn qgz_dtypes_redops_and_odd_counts() {
    // f16, f32 and bf16 with sum and avg; 1000 B on 32 ranks gives odd per-rank counts
    // (15 f16 / bf16 elements, 7 f32 ones) not divisible by the block or the nodes.
    let o = perf_ok(&quant_args(&words("--ranks 32 --topology nodes:4x8 --op reduce-scatter --algo qgz,qgz-1hop --redop sum,avg -d f16,f32,bf16 -b 1000 -e 9000 -f 9", &[])));
    let r = assert_within_bound(&o);
    assert_eq!(r.len(), 2 * 2 * 3 * 2, "{}", o.stdout);
    for row in &r {
        let s = if row.dtype == "f32" { 4 } else { 2 };
        assert_eq!(row.size, row.count * 32 * s, "{row:?}");
    }
    assert!(r.iter().any(|r| r.count == 15 && r.dtype == "f16"));
    assert!(r.iter().any(|r| r.count == 7 && r.dtype == "f32"));
    assert!(r.iter().any(|r| r.count == 140 && r.dtype == "bf16"));
    assert!(r.iter().any(|r| r.redop == "avg") && r.iter().any(|r| r.redop == "sum"));
}

#[test]
fn qgz_int8_and_other_node_counts() {
    // --bits 8 on 4 nodes, int4 on 3 nodes (odd) and on one node (no inter-node hop).
    for (topo, bits, dtype) in [
        ("nodes:4x8", "8", "f32"),
        ("nodes:3x8", "4", "f16"),
        ("nodes:1x8", "4", "bf16"),
    ] {
        let o = perf_ok(&quant_args(&[
            "--topology",
            topo,
            "--op",
            "reduce-scatter",
            "--algo",
            "qgz",
            "--bits",
            bits,
            "--redop",
            "sum,avg",
            "-d",
            dtype,
            "-b",
            "1000",
            "-e",
            "16K",
            "-f",
            "16",
        ]));
        let r = assert_within_bound(&o);
        assert_eq!(r.len(), 4, "{}", o.stdout);
        assert!(
            o.stdout.contains(&format!("qgz int{bits}/256")),
            "{}",
            o.stdout
        );
        if topo == "nodes:1x8" {
            assert!(
                r.iter().all(|r| r.traffic[2] == 0),
                "one node: no inter-node bytes"
            );
        }
    }
}

#[test]
fn qwz_all_gather_beside_exact_algos() {
    let o = perf_ok(&quant_args(&words("--ranks 32 --topology nodes:4x8 --op all-gather --algo ring,qwz -d f16,bf16 --block 64 -b 1000 -e 16K -f 16", &[])));
    let r = assert_within_bound(&o);
    assert_eq!(r.len(), 2 * 2 * 2);
    assert!(r.iter().any(|r| r.algo == "ring") && r.iter().any(|r| r.algo == "qwz"));
    assert!(o.stdout.contains("qwz int8/64"), "{}", o.stdout);
}

/// Per (algo, size): (max_node_egress, record).
fn egress(recs: &[Value], algo: &str) -> Vec<(u64, u64)> {
    recs.iter()
        .filter(|r| r["algo"] == algo)
        .map(|r| {
            (
                r["size"].as_u64().unwrap(),
                r["traffic"]["max_node_egress"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn quantized_egress_against_ring_and_json_fields() {
    // qgz int4 on f16: at most 0.27 of ring's reduce-scatter egress on nodes:4x8.
    let path = tmp("qgz.json");
    perf_ok(&quant_args(&words("--ranks 32 --topology nodes:4x8 --op reduce-scatter --algo ring,qgz --bits 4 -d f16 -b 16K -e 64K -f 4 --json", &[path.to_str().unwrap()])));
    let recs = read_json(&path);
    assert_eq!(recs.len(), 4);
    for r in &recs {
        assert_eq!(r["wrong"], 0, "{r}");
        assert_eq!(r["traffic_source"], "measured");
        if r["algo"] == "qgz" {
            assert_eq!(r["algo_used"], "qgz");
            assert_eq!(
                (r["bits"].as_u64(), r["block"].as_u64()),
                (Some(4), Some(256))
            );
            let (max, rms, bound) = (
                r["max_err"].as_f64().unwrap(),
                r["rms_err"].as_f64().unwrap(),
                r["bound"].as_f64().unwrap(),
            );
            assert!(0.0 < rms && rms <= max && max <= bound, "{r}");
        } else {
            for k in ["bits", "block", "max_err", "rms_err", "bound"] {
                assert!(
                    r.get(k).is_some_and(Value::is_null),
                    "{k} is null for ring: {r}"
                );
            }
        }
    }
    let (ring, qgz) = (egress(&recs, "ring"), egress(&recs, "qgz"));
    assert_eq!(ring.len(), 2);
    for ((size, e_ring), (size_q, e_q)) in ring.iter().zip(&qgz) {
        assert_eq!(size, size_q);
        assert!(*e_ring > 0);
        let ratio = *e_q as f64 / *e_ring as f64;
        assert!(ratio <= 0.27, "qgz/ring egress at {size} B: {ratio:.3}");
    }

    // qwz int8 on f16: at most 0.52 of ring's all-gather egress.
    let path = tmp("qwz.json");
    perf_ok(&quant_args(&words("--ranks 32 --topology nodes:4x8 --op all-gather --algo ring,qwz --bits 8 -d f16 -b 16K -e 64K -f 4 --json", &[path.to_str().unwrap()])));
    let recs = read_json(&path);
    let (ring, qwz) = (egress(&recs, "ring"), egress(&recs, "qwz"));
    assert_eq!((ring.len(), qwz.len()), (2, 2));
    for ((size, e_ring), (_, e_q)) in ring.iter().zip(&qwz) {
        let ratio = *e_q as f64 / *e_ring as f64;
        assert!(ratio <= 0.52, "qwz/ring egress at {size} B: {ratio:.3}");
    }
    let q = recs.iter().find(|r| r["algo"] == "qwz").unwrap();
    assert_eq!(
        (q["bits"].as_u64(), q["block"].as_u64()),
        (Some(8), Some(256))
    );
    assert!(q["max_err"].as_f64().unwrap() <= q["bound"].as_f64().unwrap());
}

#[test]
fn quantized_unchecked_and_modeled() {
    // -c 0: the error columns say N/A (JSON null); --model: qgz is not modeled ("-").
    let path = tmp("qgz-model.json");
    let o = perf_ok(&quant_args(&words("--topology nodes:2x4 --model nodes:2x4 --op reduce-scatter --algo ring,qgz -d bf16 -b 1K -e 1K -c 0 --json", &[path.to_str().unwrap()])));
    let lines: Vec<Vec<&str>> = o
        .stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 2, "{}", o.stdout);
    // size count type redop algo time algbw busbw bound_us %bound model_us model_busbw
    // #wrong max rms bound + 4; with --model the bound is the modeled time.
    assert!(lines.iter().all(|f| f.len() == 20), "{}", o.stdout);
    assert_ne!(lines[0][10], "-", "ring is modeled: {}", o.stdout);
    assert_eq!(
        lines[0][8], lines[0][10],
        "bound_us is model_us: {}",
        o.stdout
    );
    assert_eq!(
        &lines[1][8..16],
        &["-", "-", "-", "-", "N/A", "N/A", "N/A", "N/A"],
        "{}",
        o.stdout
    );
    let recs = read_json(&path);
    let q = &recs[1];
    assert_eq!(q["algo"], "qgz");
    assert!(q["wrong"].is_null() && q["max_err"].is_null() && q["bound"].is_null());
    assert_eq!(q["bits"], 4);
    assert!(q.get("model_time_us").map_or(true, Value::is_null), "{q}");
    assert!(recs[0]["model_time_us"].as_f64().unwrap() > 0.0);
}

#[test]
fn quantized_bad_input_fails_cleanly() {
    usage_errors(&[
        ("--bits 3", "bits must be 4 or 8"),
        ("--block 0", "quantization block must be in 1..="),
        ("--block many", "not a block size"),
        ("--op reduce-scatter --algo qgz --block 255", "even block"),
        ("--algo qgz", "qgz is a quantized reduce-scatter only"),
        (
            "--op reduce-scatter,all-reduce --algo ring,qgz-1hop",
            "cannot run all-reduce",
        ),
        (
            "--op reduce-scatter --algo qwz",
            "qwz is a quantized all-gather only",
        ),
        (
            "--op reduce-scatter --algo qgz --redop sum,max",
            "sum or avg only, not max",
        ),
        (
            "--op all-gather --algo qwz -d i32",
            "f32, f16 and bf16 only",
        ),
        ("--op reduce-scatter --algo qgz --coalesce 3", "--coalesce"),
        (
            "--dry-run --model nodes:2x4 --op reduce-scatter --algo qgz",
            "--dry-run models",
        ),
    ]);
    // STRATA_ALGO names a quantized algo for an op it does not run: the same usage error.
    let o = perf_env(
        &["-b", "1K", "-e", "1K"],
        &[("STRATA_ALGO", "qwz"), ("STRATA_TOPOLOGY", "nodes:2x2")],
    );
    assert_eq!(
        o.code, 0,
        "qwz is the all-gather default here: {}",
        o.stderr
    );
    let o = perf_env(&["-b", "1K", "-e", "1K"], &[("STRATA_ALGO", "qgz")]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("reduce-scatter only"), "{}", o.stderr);
    // --bits / --block without a quantized algo: accepted, noted in the header.
    let o = perf_ok(&quant_args(&[
        "--ranks", "4", "--bits", "8", "--block", "32", "-b", "1K", "-e", "1K",
    ]));
    assert!(
        o.stdout
            .lines()
            .any(|l| l.starts_with('#') && l.contains("--bits / --block ignored")),
        "{}",
        o.stdout
    );
    assert!(
        rows(&o.stdout).iter().all(|r| r.err.is_none()),
        "no error columns"
    );
}

// ---------------------------------------------------------------------------------------
// Soak runs (--soak)
// ---------------------------------------------------------------------------------------

/// The value after `key=` in `line` (the summary's `by op` / `failures=` fields).
fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.trim_end_matches(',').parse().ok())
}

#[test]
fn soak_runs_checked_mixes_and_summarises() {
    let o = perf_ok(&words(
        "--soak 2 --seed 7 --topology nodes:2x2 --timeout 60",
        &[],
    ));
    let out = &o.stdout;
    assert!(out.contains("#  seed      : 7"), "{out}");
    // nodes:2x2 has the node x rail grid and the pairs x parity grids: chains run.
    assert!(out.contains("world = node x rail"), "{out}");
    let done = out
        .lines()
        .find(|l| l.starts_with("# soak done:"))
        .unwrap_or_else(|| panic!("no summary:\n{out}"));
    assert_eq!(field(done, "failures"), Some(0), "{done}");
    let ops: u64 = done
        .split_whitespace()
        .nth(3)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no collective count in {done}"));
    assert!(ops > 0, "{done}");
    // Every collective is counted once by op, by algo, by comm and by dtype.
    for key in ["by op", "by algo", "by comm", "by dtype"] {
        let l = out
            .lines()
            .find(|l| l.starts_with(&format!("#  {key}")))
            .unwrap_or_else(|| panic!("no '{key}' line:\n{out}"));
        let sum: u64 = l
            .split_whitespace()
            .filter_map(|w| w.split_once('=').and_then(|(_, v)| v.parse::<u64>().ok()))
            .sum();
        assert_eq!(sum, ops, "{l}");
    }
    assert!(out.contains("#  chains   :"), "{out}");
    // The same seed gives the same schedule: the same first collectives.
    let again = perf_ok(&words(
        "--soak 2 --seed 7 --topology nodes:2x2 --timeout 60",
        &[],
    ));
    assert!(again.stdout.contains("#  comms     : "), "{}", again.stdout);
    let comms = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("#  comms"))
            .map(str::to_string)
    };
    assert_eq!(comms(out), comms(&again.stdout));
}

#[test]
fn soak_bad_flags_fail_cleanly() {
    fails(&["--soak", "2", "--dry-run"], 2, "cannot be used with");
    fails(
        &["--soak", "2", "--op", "all-reduce"],
        2,
        "cannot be used with",
    );
    fails(&["--soak", "2", "-c", "0"], 2, "cannot be used with");
    fails(&["--seed", "3"], 2, "--soak");
    fails(&["--soak", "0"], 2, "not a positive number of seconds");
    fails(
        &["--soak", "2", "--transport", "nccl"],
        2,
        "--soak runs on the local and mpi transports, not nccl",
    );
}

// ---------------------------------------------------------------------------------------
// The bound column and the `mpi` baseline's usage errors
// ---------------------------------------------------------------------------------------

#[test]
fn bound_column_is_the_memory_traffic_at_the_measured_bandwidth() {
    let path = tmp("bound.json");
    let o = perf_ok(&args(&words("--ranks 4 --op all-gather,reduce-scatter,all-reduce,all-to-all,broadcast -b 1M -e 1M --json", &[path.to_str().unwrap()])));
    // The header gives the per-rank memory bandwidth (GB/s) the bound uses.
    let bw: f64 = o
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("#  bound     : memory "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no memory bandwidth in the header:\n{}", o.stdout));
    assert!(bw > 0.0, "{}", o.stdout);
    let recs = read_json(&path);
    assert_eq!(recs.len(), 5);
    let p = 4.0;
    for r in &recs {
        let m = r["size"].as_f64().unwrap();
        // Bytes read + written per rank: docs/perf.md, "The bound column".
        let traffic = match r["op"].as_str().unwrap() {
            "reduce-scatter" => m * (p + 1.0) / p,
            "all-reduce" => m * (3.0 * p - 1.0) / p,
            _ => 2.0 * m,
        };
        let bound = r["bound_us"].as_f64().unwrap();
        // The header rounds the bandwidth to 10 MB/s.
        let want = traffic / (bw * 1e9) * 1e6;
        assert!(
            (bound - want).abs() <= 0.01 * want,
            "{r}: bound {bound}, want {want}"
        );
        let pct = r["pct_bound"].as_f64().unwrap();
        let time = r["time_us"].as_f64().unwrap();
        assert!(
            (pct - 100.0 * bound / time).abs() <= 1e-6 * pct.max(1.0),
            "{r}"
        );
    }
    // The table shows the same two columns after busbw.
    let rows = rows(&o.stdout);
    assert_eq!(rows.len(), 5, "{}", o.stdout);
}

#[test]
fn mpi_baseline_needs_the_mpi_transport() {
    usage_errors(&[
        (
            "--algo ring,mpi -b 1K -e 1K",
            "the `mpi` baseline needs --transport mpi",
        ),
        (
            "--transport nccl --algo mpi -b 1K -e 1K",
            "`ring` is the vendor library's own",
        ),
        // Refused before any MPI is touched (these fail the same in builds without it).
        (
            "--transport mpi --algo mpi --op all-reduce -d bf16",
            "cannot reduce bf16",
        ),
        (
            "--transport mpi --algo mpi --coalesce 2",
            "--coalesce does not apply to the `mpi` baseline",
        ),
        ("--algo mpii", "or mpi (the MPI library's own collective"),
    ]);
}
