//! What strata-train and strata-plan print is the same to a file (SLURM's and mpirun's
//! output files), a pipe and a terminal, progress bars aside: every step line at the
//! `--log-every` interval, `# recovered: ...` and the summary, each as it happens.
//! A terminal is a pseudo-terminal: `script` (util-linux) runs the command on one.

use std::path::Path;
use std::sync::OnceLock;

#[path = "../../tests/support/terminal.rs"]
mod terminal;
use terminal::*;

/// docs/engine.md's run: world rank 5 lost before step 7, checkpoints every 4 steps.
fn train_args(ck: &Path) -> Vec<String> {
    let mut a: Vec<String> =
        "--strategy zero3 --topology nodes:2x4 --steps 12 --checkpoint-every 4 --survive --lose 5@7"
            .split(' ')
            .map(String::from)
            .collect();
    a.extend(["--checkpoint".into(), ck.display().to_string()]);
    a
}

/// docs/engine.md's run with stdout to a file, once for the tests below.
fn train_to_file() -> &'static str {
    static OUT: OnceLock<String> = OnceLock::new();
    OUT.get_or_init(|| {
        let d = scratch("train-file");
        let out = to_file(
            env!("CARGO_BIN_EXE_strata-train"),
            &train_args(&d.join("ck")),
            &d,
        );
        let _ = std::fs::remove_dir_all(&d);
        out
    })
}

#[test]
fn strata_train_prints_steps_and_recoveries_to_a_file() {
    let out = train_to_file();
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("# strata-train: strategy zero3"),
        "{out}"
    );
    // --log-every 10: step 1, 10 and the last.
    let steps: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("step ")?.split_whitespace().next())
        .collect();
    assert_eq!(steps, ["1", "10", "12"], "{out}");
    let rec = lines.iter().position(|l| {
        l.starts_with("# recovered: world ranks [5] lost after step 6; 7 ranks (nodes:1x7) went on from step 4's state (checkpoint)")
    });
    assert_eq!(rec, Some(2), "the recovery between steps 1 and 10:\n{out}");
    assert!(lines[5].starts_with("# loss "), "{out}");
    assert_eq!(lines.len(), 6, "{out}");
}

#[test]
fn strata_train_prints_the_same_on_a_terminal() {
    let d = scratch("train-tty");
    let Some(tty) = on_terminal(
        env!("CARGO_BIN_EXE_strata-train"),
        &train_args(&d.join("ck")),
    ) else {
        return;
    };
    let _ = std::fs::remove_dir_all(&d);
    assert!(is_bar(&tty), "a terminal shows the bar:\n{tty}");
    assert_eq!(shapes(&tty), shapes(train_to_file()), "{tty}");
}

#[test]
fn strata_train_quiet_prints_the_same_lines() {
    // A short run without losses: --quiet drops the bar only.
    let args: Vec<String> = "--strategy zero1 --ranks 2 --steps 3 --log-every 2 --quiet"
        .split(' ')
        .map(String::from)
        .collect();
    let d = scratch("train-quiet");
    let file = to_file(env!("CARGO_BIN_EXE_strata-train"), &args, &d);
    let _ = std::fs::remove_dir_all(&d);
    let tty = match on_terminal(env!("CARGO_BIN_EXE_strata-train"), &args) {
        Some(t) => t,
        None => return,
    };
    assert!(!is_bar(&tty), "--quiet: no bar\n{tty}");
    assert_eq!(shapes(&tty), shapes(&file));
    // Steps 1, 2 and the last, then the summary.
    assert_eq!(shapes(&file).len(), 5, "{file}");
}

#[test]
fn strata_plan_prints_the_same_to_a_file_a_pipe_and_a_terminal() {
    let bin = env!("CARGO_BIN_EXE_strata-plan");
    let args: Vec<String> = "--model llama-7b --cluster dgx-a100:16 --seq 512 --top 5"
        .split(' ')
        .map(String::from)
        .collect();
    let d = scratch("plan");
    let file = to_file(bin, &args, &d);
    let _ = std::fs::remove_dir_all(&d);
    assert!(file.lines().count() > 5, "{file}");
    assert_eq!(shapes(&to_pipe(bin, &args)), shapes(&file));
    if let Some(tty) = on_terminal(bin, &args) {
        assert_eq!(shapes(&tty), shapes(&file), "{tty}");
    }
}

/// `strata-plan ... | head -0`: the reader is gone before the first line; the planner
/// ends with status 0 and no panic, as a Unix filter does on SIGPIPE.
#[test]
fn strata_plan_with_a_closed_stdout_ends_quietly() {
    closed_stdout_ends_quietly(
        env!("CARGO_BIN_EXE_strata-plan"),
        "--model llama-7b --cluster dgx-a100:16 --seq 512 --top 5",
    );
}
