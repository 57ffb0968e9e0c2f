//! `--tune`: this executable once per kernel geometry, the best geometry.

use crate::child::run_child;
use crate::compiled::opt_us;
use crate::opts::Opts;

/// The variable the library reads once per process: "E,T", E elements per lane and T
/// threads per thread block of its kernels.
pub(crate) const GEOMETRY_VAR: &str = "STRATA_KERNEL_GEOMETRY";

/// (name, strata us) of the main table in a `--bench-only` child's output: the name is
/// the words before the first number, the time the third number.
pub(crate) fn parse_rows(out: &str) -> Vec<(String, f64)> {
    let mut rows = Vec::new();
    let mut table = false;
    for line in out.lines() {
        if line.starts_with("bandwidth (") {
            table = true;
            continue;
        }
        if !table {
            continue;
        }
        if line.trim().is_empty() || line.starts_with("worst:") {
            break;
        }
        let tok: Vec<&str> = line.split_whitespace().collect();
        let Some(i) = tok.iter().position(|t| t.parse::<f64>().is_ok()) else {
            continue; // the header
        };
        if let (true, Some(Ok(us))) = (i > 0, tok.get(i + 2).map(|t| t.parse::<f64>())) {
            rows.push((tok[..i].join(" "), us));
        }
    }
    rows
}

/// Re-runs this executable with `--bench-only` once with the library's own geometry and
/// once per geometry E x T, prints kernel x geometry -> us, the best geometry per kernel,
/// and `best geometry: E,T: X us over K kernels (default Y us)` (the smallest sum of the
/// kernels' times among the geometries that ran every kernel). True when every child ran.
pub(crate) fn tune(o: &Opts) -> bool {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("strata-gpu-check --tune: no path to this executable: {e}");
            return false;
        }
    };
    let mut geoms: Vec<Option<(u32, u32)>> = vec![None];
    for e in [16, 32, 64] {
        for t in [128, 256, 512] {
            geoms.push(Some((e, t)));
        }
    }
    let mut all_ok = true;
    let mut names: Vec<String> = Vec::new();
    let mut cols: Vec<(String, std::collections::HashMap<String, f64>)> = Vec::new();
    let mut device = None;
    for g in geoms {
        let label = g.map_or("default".to_string(), |(e, t)| format!("{e},{t}"));
        let mut cmd = std::process::Command::new(&exe);
        cmd.args([
            "--bench-only",
            "-n",
            &o.iters.to_string(),
            "-w",
            &o.warm.to_string(),
        ])
        .args([
            "--seed",
            &o.seed.to_string(),
            "--bench-elems",
            &o.bench_n.to_string(),
        ]);
        match g {
            None => cmd.env_remove(GEOMETRY_VAR),
            Some(_) => cmd.env(GEOMETRY_VAR, &label),
        };
        let rows = match run_child(cmd, std::time::Duration::from_secs(90), true) {
            Ok(r) if r.ok() => {
                let rows = parse_rows(&r.stdout);
                if device.is_none() {
                    device = r
                        .stdout
                        .lines()
                        .find(|l| l.starts_with("device:"))
                        .map(String::from);
                }
                eprintln!(
                    "tune: geometry {label}: {} rows in {:.1} s",
                    rows.len(),
                    r.secs
                );
                rows
            }
            Ok(r) => {
                eprintln!("tune: geometry {label}: FAILED, {}", r.why());
                Vec::new()
            }
            Err(e) => {
                eprintln!("tune: geometry {label}: did not start: {e}");
                Vec::new()
            }
        };
        all_ok &= !rows.is_empty();
        for (n, _) in &rows {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
        cols.push((label, rows.into_iter().collect()));
    }
    if let Some(d) = device {
        println!("{d}");
    }
    println!(
        "\ntune ({GEOMETRY_VAR}=E,T: E elements per lane, T threads per block; {} elements; strata us, median of {} runs; default: the variable unset):",
        o.bench_n, o.iters
    );
    print!("{:<44}", "kernel");
    for (l, _) in &cols {
        print!(" {l:>8}");
    }
    println!("  best");
    for n in &names {
        print!("{n:<44}");
        for (_, c) in &cols {
            print!(" {:>8}", opt_us(c.get(n).copied()));
        }
        let best = cols[1..]
            .iter()
            .filter_map(|(l, c)| Some((l, *c.get(n)?)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        match best {
            Some((l, us)) => println!("  {l} {us:.1}"),
            None => println!("  -"),
        }
    }
    let total = |c: &std::collections::HashMap<String, f64>| -> Option<f64> {
        names.iter().map(|n| c.get(n)).sum::<Option<f64>>()
    };
    let default = cols.first().and_then(|(_, c)| total(c));
    let best = cols[1..]
        .iter()
        .filter_map(|(l, c)| Some((l, total(c)?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .filter(|_| !names.is_empty());
    match best {
        Some((l, t)) => println!(
            "best geometry: {l}: {t:.1} us over {} kernels (default {} us)",
            names.len(),
            opt_us(default)
        ),
        None => println!("best geometry: none (no geometry ran every kernel)"),
    }
    all_ok
}
