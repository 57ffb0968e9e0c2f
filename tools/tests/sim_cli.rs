//! `strata-perf --dry-run / --model` and `strata-sim` from the outside: the modeled
//! columns, JSON records, traces and plots the simulator's command lines write, and their
//! usage errors (the simulator itself is tested in the library's `tests/sim.rs`).

use std::path::PathBuf;
use std::process::Command;

/// A test's own directory under the system's temporary one, removed with everything
/// the commands wrote into it when the test ends (passed or not).
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("strata-sim-test-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

fn run(bin: &str, args: &[&str]) -> (bool, String, String) {
    let o = Command::new(bin).args(args).output().unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

fn rows(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

/// A command line written as one string (words split at spaces), then `more` as they
/// are (paths).
fn words<'a>(line: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    line.split_whitespace()
        .chain(more.iter().copied())
        .collect()
}

#[test]
fn strata_perf_dry_run_trace_and_plot() {
    let perf = env!("CARGO_BIN_EXE_strata-perf");
    let dir = Scratch::new("dry-run");
    let (json, trace, plot) = (
        dir.file("dry.json"),
        dir.file("trace.json"),
        dir.file("dry.svg"),
    );
    let (ok, out, err) = run(
        perf,
        &[
            "--dry-run",
            "--model",
            "dgx-a100:2",
            "--op",
            "all-gather,reduce-scatter",
            "--algo",
            "ring,ho-ring",
            "-b",
            "1M",
            "-e",
            "4M",
            "-f",
            "4",
            "--json",
            json.to_str().unwrap(),
            "--trace",
            trace.to_str().unwrap(),
            "--plot",
            plot.to_str().unwrap(),
        ],
    );
    assert!(ok, "{out}\n{err}");
    let r = rows(&out);
    assert_eq!(r.len(), 8, "{out}");
    assert!(r.iter().all(|x| x.len() == 15), "{out}");
    let recs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let recs = recs.as_array().unwrap();
    assert_eq!(recs.len(), 8);
    for rec in recs {
        for k in ["model_time_us", "model_busbw", "lower_bound_us", "traffic"] {
            assert!(!rec[k].is_null(), "{k} in {rec}");
        }
        assert_eq!(rec["traffic_source"], "modeled");
    }
    // one trace per (op, algo), of the largest size
    for (op, algo) in [("all-gather", "ring"), ("reduce-scatter", "ho-ring")] {
        let f = trace.with_file_name(format!("trace-{op}-{algo}.json"));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        assert!(
            v["traceEvents"].as_array().unwrap().len() > 16,
            "{}",
            f.display()
        );
    }
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 4);
    assert!(svg.contains("all-gather ho-ring"));

    // usage errors
    let (ok, _, err) = run(perf, &["--dry-run"]);
    assert!(!ok && err.contains("--model"), "{err}");
    let (ok, _, err) = run(
        perf,
        &["--dry-run", "--model", "dgx-a100:2", "--ranks", "8"],
    );
    assert!(!ok && err.contains("16 ranks"), "{err}");
    let (ok, _, err) = run(
        perf,
        &["--dry-run", "--model", "dgx-a100:2", "--op", "all-to-all"],
    );
    assert!(!ok && err.contains("all-to-all"), "{err}");
    let (ok, _, err) = run(perf, &["--ranks", "2", "--trace", "x.json"]);
    assert!(!ok && err.contains("--model"), "{err}");
}

#[test]
fn strata_perf_model_columns_beside_measured_ones() {
    let perf = env!("CARGO_BIN_EXE_strata-perf");
    let dir = Scratch::new("model");
    let json = dir.file("model.json");
    let (ok, out, err) = run(
        perf,
        &words("--topology nodes:2x4 --model dgx-a100:1 --op all-gather --algo ring,ho-ring -b 1K -e 4K -f 4 -n 1 -w 0 --json", &[json.to_str().unwrap()]),
    );
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("model_us") && out.contains("model_busbw"),
        "{out}"
    );
    let r = rows(&out);
    assert_eq!(r.len(), 4);
    assert!(
        r.iter()
            .all(|x| x.len() == 17 && x[10].parse::<f64>().unwrap() > 0.0 && x[8] == x[10]),
        "{out}"
    );
    let recs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for rec in recs.as_array().unwrap() {
        assert!(rec["model_time_us"].as_f64().unwrap() > 0.0);
        assert!(rec["lower_bound_us"].as_f64().unwrap() > 0.0);
        assert!(!rec["time_us"].is_null());
    }
    // the model must have the run's world size
    let (ok, _, err) = run(
        perf,
        &words("--topology nodes:2x4 --model dgx-a100:2 -b 1K -e 1K", &[]),
    );
    assert!(!ok && err.contains("16 ranks"), "{err}");
    // without --model nothing changes
    let (ok, out, _) = run(
        perf,
        &["--ranks", "4", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0"],
    );
    assert!(ok && !out.contains("model_us"));
    assert!(rows(&out).iter().all(|x| x.len() == 15));
}

#[test]
fn strata_sim_answers_how_long() {
    let bin = env!("CARGO_BIN_EXE_strata-sim");
    let dir = Scratch::new("sim");
    let trace = dir.file("sim.json");
    let (ok, out, err) = run(
        bin,
        &words("--topology frontier:4 --op all-gather --algo ring,hier,ho-ring --size 256M -d bf16 --trace", &[trace.to_str().unwrap()]),
    );
    assert!(ok, "{out}\n{err}");
    let r = rows(&out);
    assert_eq!(r.len(), 3, "{out}");
    let t: Vec<f64> = r.iter().map(|x| x[4].parse().unwrap()).collect();
    assert!(t[2] < t[1] && t[1] < t[0], "{out}");
    // pieces: only ho-ring's (256 MiB over 32 ranks: 8 MiB chunks, 8 pieces)
    assert_eq!([&r[0][3], &r[1][3], &r[2][3]], ["-", "-", "8"]);
    for a in ["ring", "hier", "ho-ring"] {
        assert!(trace
            .with_file_name(format!("sim-all-gather-{a}.json"))
            .exists());
    }
    assert!(out.contains("lower_bnd") && out.contains("inter_node"));
    let (ok, _, err) = run(bin, &["--topology", "frontier:4", "--op", "broadcast"]);
    assert!(!ok && err.contains("broadcast"), "{err}");
}

#[test]
fn strata_sim_fidelity_table() {
    let sim = env!("CARGO_BIN_EXE_strata-sim");
    let (ok, out, err) = run(sim, &["--fidelity"]);
    assert!(ok, "{err}");
    // A header, its rule, then one row per published figure (docs/model-fidelity.md).
    let table: Vec<&str> = out.lines().filter(|l| l.starts_with('|')).collect();
    assert_eq!(table.len(), 2 + 2 * 3 * 3 + 2 + 3, "{out}");
    for want in [
        "dgx-a100:16",
        "dgx-h100:2",
        "NVIDIA/nccl#812",
        "MiCS",
        "PaRO",
        "prediction",
    ] {
        assert!(out.contains(want), "{want} missing:\n{out}");
    }
    // Without --fidelity a topology is required.
    let (ok, _, err) = run(sim, &["--op", "all-gather"]);
    assert!(!ok);
    assert!(err.contains("--topology"), "{err}");
}
