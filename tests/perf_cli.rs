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

/// One data row: size, count, type, redop, algo, time, algbw, busbw, #wrong, intra_pkg,
/// intra_node, inter_node, node_egress.
#[derive(Debug)]
struct Row {
    size: u64,
    count: u64,
    dtype: String,
    redop: String,
    algo: String,
    wrong: String,
    traffic: [u64; 4],
}

fn rows(stdout: &str) -> Vec<Row> {
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 13, "row has 13 columns: {l}");
            let n = |i: usize| {
                f[i].parse::<u64>()
                    .unwrap_or_else(|_| panic!("column {i} of '{l}' is not an integer"))
            };
            for (i, v) in f.iter().enumerate().take(8).skip(5) {
                v.parse::<f64>()
                    .unwrap_or_else(|_| panic!("column {i} of '{l}' is not a number"));
            }
            Row {
                size: n(0),
                count: n(1),
                dtype: f[2].into(),
                redop: f[3].into(),
                algo: f[4].into(),
                wrong: f[8].into(),
                traffic: [n(9), n(10), n(11), n(12)],
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

fn args<'a>(a: &[&'a str]) -> Vec<&'a str> {
    a.iter().copied().chain(QUICK).collect()
}

#[test]
fn hier_and_ring_all_gather_on_two_nodes() {
    let o = perf_ok(&args(&[
        "--ranks",
        "8",
        "--topology",
        "nodes:2x4",
        "--op",
        "all-gather",
        "--algo",
        "hier,ring",
        "-b",
        "1K",
        "-e",
        "64K",
        "-f",
        "4",
    ]));
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
    let o = perf_ok(&args(&[
        "--ranks",
        "4",
        "--topology",
        "nodes:2x2",
        "--op",
        "all-gather,reduce-scatter,all-reduce,all-to-all,broadcast",
        "--algo",
        "ring",
        "-b",
        "512",
        "-e",
        "2K",
        "-f",
        "2",
        "--json",
        path.to_str().unwrap(),
    ]));
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
    let o = perf_ok(&args(&[
        "--ranks",
        "8",
        "--topology",
        "nodes:2x4",
        "--op",
        "reduce-scatter",
        "--redop",
        "avg",
        "-d",
        "bf16,f32",
        "--algo",
        "ring,hier",
        "--coalesce",
        "5",
        "-b",
        "1K",
        "-e",
        "16K",
        "-f",
        "4",
        "--json",
        path.to_str().unwrap(),
    ]));
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
    let o = perf_ok(&args(&[
        "--ranks",
        "3",
        "--op",
        "all-gather",
        "--coalesce",
        "4",
        "-d",
        "f16",
        "-b",
        "100",
        "-e",
        "1000",
        "-f",
        "3",
    ]));
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
    let o = perf_ok(&args(&[
        "--ranks",
        "2",
        "--op",
        "all-reduce",
        "-d",
        "f16",
        "-b",
        "7",
        "-e",
        "25",
        "-i",
        "6",
    ]));
    assert_eq!(
        rows(&o.stdout).iter().map(|r| r.size).collect::<Vec<_>>(),
        vec![6, 12, 18, 24]
    );
}

#[test]
fn topology_from_env_and_check_off() {
    let path = tmp("check-off.json");
    let o = perf_env(
        &args(&[
            "-c",
            "0",
            "-b",
            "64",
            "-e",
            "64",
            "--json",
            path.to_str().unwrap(),
        ]),
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

#[test]
fn bad_input_fails_cleanly() {
    fails(&["--algo", "bogus"], 2, "unknown algorithm 'bogus'");
    fails(&["--op", "all-gather,bogus"], 2, "unknown op 'bogus'");
    fails(&["-d", "f64"], 2, "unknown dtype");
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
        &[
            "--ranks",
            "6",
            "--topology",
            "nodes:2x4",
            "-b",
            "1K",
            "-e",
            "1K",
        ],
        1,
        "topology nodes:2x4 describes 8 ranks",
    );
    fails(&["--topology", "nodes:0x3"], 1, "bad topology spec");
    fails(&["--transport", "nccl"], 1, "not compiled");
    fails(&["--transport", "cuda-local"], 1, "not compiled");
    if !cfg!(feature = "mpi") {
        fails(&["--transport", "mpi"], 1, "not compiled");
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
