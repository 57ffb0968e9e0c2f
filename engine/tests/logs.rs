//! What strata-train and strata-plan print is the same to a file (SLURM's and mpirun's
//! output files), a pipe and a terminal, progress bars aside: every step line at the
//! `--log-every` interval, `# recovered: ...` and the summary, each as it happens.
//! A terminal is a pseudo-terminal: `script` (util-linux) runs the command on one.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-logs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

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

/// `bin args` with stdout to a file; stderr apart.
fn to_file(bin: &str, args: &[String], dir: &Path) -> String {
    let path = dir.join("stdout.txt");
    let st = Command::new(bin)
        .args(args)
        .env("STRATA_TIMEOUT", "2")
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::fs::File::create(&path).unwrap()))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let out = std::fs::read_to_string(&path).unwrap();
    assert!(
        st.status.success(),
        "{bin} {args:?}\n{out}\n{}",
        String::from_utf8_lossy(&st.stderr)
    );
    out
}

/// `bin args` with stdout to a pipe.
fn to_pipe(bin: &str, args: &[String]) -> String {
    let o = Command::new(bin)
        .args(args)
        .env("STRATA_TIMEOUT", "2")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{bin} {args:?}");
    String::from_utf8_lossy(&o.stdout).into()
}

/// `bin args` on a pseudo-terminal (stdout and stderr both): all it wrote there, bars
/// included; None (said on stderr) where `script` is missing.
fn on_terminal(bin: &str, args: &[String]) -> Option<String> {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: no `script` (util-linux) to run {bin} on a pseudo-terminal");
        return None;
    }
    let line: Vec<String> = std::iter::once(bin)
        .chain(args.iter().map(String::as_str))
        .map(|w| format!("'{}'", w.replace('\'', r"'\''")))
        .collect();
    let o = Command::new("script")
        .args(["-qefc", &line.join(" "), "/dev/null"])
        .env("STRATA_TIMEOUT", "2")
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{bin} {args:?} on a terminal:\n{out}");
    Some(out)
}

/// Escape sequences (`ESC [ ... final`) out.
fn no_escapes(s: &str) -> String {
    let mut out = String::new();
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\x1b' && it.peek() == Some(&'[') {
            it.next();
            for c in it.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A progress bar's drawing (indicatif's bar glyphs).
fn is_bar(l: &str) -> bool {
    l.contains(['░', '█'])
}

/// The lines as a reader sees them, bars aside and in shape: cut at line ends and
/// carriage returns (a terminal's redraws), escapes out, every word with a digit `N`
/// (timings differ from run to run), spaces squeezed.
fn shapes(text: &str) -> Vec<String> {
    text.split(['\n', '\r'])
        .map(no_escapes)
        .filter(|l| !l.trim().is_empty() && !is_bar(l))
        .map(|l| {
            l.split_whitespace()
                .map(|w| {
                    if w.contains(|c: char| c.is_ascii_digit()) {
                        "N"
                    } else {
                        w
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata-plan"))
        .args("--model llama-7b --cluster dgx-a100:16 --seq 512 --top 5".split(' '))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Closed at once: the planner parses and searches before its first line.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !err.contains("panicked"),
        "strata-plan with a closed stdout: {}\n{err}",
        out.status
    );
}
