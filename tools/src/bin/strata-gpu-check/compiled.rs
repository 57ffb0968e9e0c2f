//! The torch.compile column and the printed tables.

use crate::bench::{Row, SMALL};
use crate::child::run_child;
use crate::opts::Opts;

/// The script that writes the kernels in PyTorch and times them compiled: the path in
/// `STRATA_KERNELS_COMPILED`, else `scripts/kernels-compiled.py` under the working
/// directory or under a folder above this executable (target/release/, gpu-bundle/).
pub(crate) fn compiled_script() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("STRATA_KERNELS_COMPILED") {
        return Some(p.into());
    }
    let rel = std::path::Path::new("scripts/kernels-compiled.py");
    let mut dirs: Vec<std::path::PathBuf> = std::env::current_dir().into_iter().collect();
    if let Ok(exe) = std::env::current_exe() {
        dirs.extend(exe.ancestors().skip(1).map(|d| d.to_path_buf()));
    }
    dirs.into_iter().map(|d| d.join(rel)).find(|p| p.is_file())
}

/// The compiled figures, {row name, or "ROW @N" for the small sizes: us}, and a line
/// saying where they came from or why there are none.
pub(crate) fn compiled(o: &Opts) -> (std::collections::HashMap<String, f64>, String) {
    use std::process::Command;
    use std::time::Duration;
    let none = std::collections::HashMap::new();
    if o.no_compiled {
        return (none, "not run (--no-compiled)".into());
    }
    let mut probe = Command::new("python3");
    probe.args(["-c", "import torch; assert torch.cuda.is_available()"]);
    match run_child(probe, Duration::from_secs(120), true) {
        Ok(r) if r.ok() => {}
        Ok(r) => {
            return (
                none,
                format!("skipped: torch with CUDA is not importable ({})", r.why()),
            )
        }
        Err(e) => return (none, format!("skipped: no python3 ({e})")),
    }
    let Some(script) = compiled_script() else {
        return (
            none,
            "skipped: scripts/kernels-compiled.py not found (STRATA_KERNELS_COMPILED=path)".into(),
        );
    };
    let small: Vec<String> = SMALL.iter().map(|n| n.to_string()).collect();
    let mut cmd = Command::new("python3");
    cmd.arg(&script).args([
        "--elems",
        &o.bench_n.to_string(),
        "--small",
        &small.join(","),
        "--iters",
        &o.iters.to_string(),
        "--warmup",
        &o.warm.to_string(),
        "--budget",
        &o.compiled_timeout.saturating_sub(30).max(10).to_string(),
    ]);
    println!(
        "\ntorch.compile: {} (timeout {} s; its diagnostics on stderr) ...",
        script.display(),
        o.compiled_timeout
    );
    let r = match run_child(cmd, Duration::from_secs(o.compiled_timeout), false) {
        Ok(r) => r,
        Err(e) => {
            return (
                none,
                format!("skipped: {} did not start ({e})", script.display()),
            )
        }
    };
    if !r.ok() {
        return (none, format!("failed: {}", r.why()));
    }
    let last = r.stdout.lines().rev().find(|l| !l.trim().is_empty());
    let map: serde_json::Map<String, serde_json::Value> = match last.map(serde_json::from_str) {
        Some(Ok(m)) => m,
        _ => return (none, "failed: its output was not one JSON object".into()),
    };
    let figures: std::collections::HashMap<String, f64> = map
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.as_f64()?)))
        .collect();
    let why = format!(
        "{} rows from torch.compile in {:.0} s",
        figures.len(),
        r.secs
    );
    (figures, why)
}

pub(crate) fn opt_us(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

pub(crate) fn opt_ratio(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

/// The main table, then the summary line (its format is what scripts/gpu-all reads):
/// `worst: R of roofline (KERNEL); slowest vs torch.compile: C (KERNEL)`, C = compiled /
/// strata, `-` and the reason in parentheses where there are no compiled figures.
pub(crate) fn print_main(rows: &[Row], comp: &std::collections::HashMap<String, f64>, note: &str) {
    println!(
        "{:<44} {:>8} {:>8} {:>9} {:>6} {:>9} {:>11} {:>11} {:>11} {:>15}",
        "kernel",
        "read MB",
        "write MB",
        "strata us",
        "GB/s",
        "copy GB/s",
        "roofline us",
        "of roofline",
        "compiled us",
        "compiled/strata"
    );
    for r in rows {
        let c = comp.get(&r.name).copied();
        println!(
            "{:<44} {:>8.1} {:>8.1} {:>9.1} {:>6.0} {:>9.0} {:>11.1} {:>11.2} {:>11} {:>15}",
            r.name,
            r.read as f64 / 1e6,
            r.written as f64 / 1e6,
            r.kernel_us,
            r.gbs(),
            r.copy_gbs(),
            r.roofline_us(),
            r.of_roofline(),
            opt_us(c),
            opt_ratio(c.map(|c| c / r.kernel_us)),
        );
    }
    let worst = rows
        .iter()
        .min_by(|a, b| a.of_roofline().total_cmp(&b.of_roofline()));
    let slowest = rows
        .iter()
        .filter_map(|r| Some((comp.get(&r.name)? / r.kernel_us, &r.name)))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    if let Some(w) = worst {
        println!(
            "worst: {:.2} of roofline ({}); slowest vs torch.compile: {}",
            w.of_roofline(),
            w.name,
            match slowest {
                Some((c, name)) => format!("{c:.2} ({name})"),
                None => format!("- ({note})"),
            }
        );
    }
}

pub(crate) fn print_small(rows: &[(usize, Row)], comp: &std::collections::HashMap<String, f64>) {
    println!(
        "{:>9} {:<36} {:>9} {:>8} {:>11} {:>11} {:>11} {:>15}",
        "elements",
        "kernel",
        "strata us",
        "copy us",
        "roofline us",
        "of roofline",
        "compiled us",
        "compiled/strata"
    );
    for (n, r) in rows {
        let c = comp.get(&format!("{} @{n}", r.name)).copied();
        println!(
            "{:>9} {:<36} {:>9.2} {:>8.2} {:>11.2} {:>11.2} {:>11} {:>15}",
            n,
            r.name,
            r.kernel_us,
            r.copy_us,
            r.roofline_us(),
            r.of_roofline(),
            c.map_or("-".into(), |v| format!("{v:.2}")),
            opt_ratio(c.map(|c| c / r.kernel_us)),
        );
    }
}
