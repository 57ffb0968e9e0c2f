//! `strata-overlap` from the outside, on `host-local` (the CPU device): every point of
//! the table is checked (`#wrong` 0), the columns are what the header says, and bad
//! arguments are clear errors. The overlap figures themselves are measurements, not
//! asserted here.

use std::process::Command;

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_strata-overlap"))
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

#[test]
fn every_point_is_checked_on_host_local() {
    let (code, out, err) = run(&[
        "--transport",
        "host-local",
        "--topology",
        "nodes:2x2",
        "--op",
        "all-gather,reduce-scatter,all-reduce",
        "--algo",
        "ring,hier",
        "-b",
        "64K",
        "-e",
        "256K",
        "-n",
        "1",
        "--busy-ms",
        "5",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3 * 2 * 2, "{out}");
    for r in &rows {
        assert_eq!(r.len(), 8, "{r:?}");
        assert_eq!(r[7], "0", "wrong results: {r:?}");
        let busy: f64 = r[3].parse().unwrap();
        assert!(
            busy >= 5.0,
            "the busy stream ran {busy} ms, asked for 5: {r:?}"
        );
    }
}

#[test]
fn bad_arguments_are_clear_errors() {
    let (code, _, err) = run(&["--transport", "local"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("host-local, cuda-local"), "{err}");
    let (code, _, err) = run(&["--transport", "host-local", "-b", "2M", "-e", "1M"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("-b <= -e"), "{err}");
    let (code, _, err) = run(&["--transport", "host-local", "--op", "all-to-all"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not all-to-all"), "{err}");
}
