//! What strata-perf, strata-sim, strata-launch and strata-overlap print is the same to a
//! file (SLURM's and mpirun's output files), a pipe and a terminal, progress bars aside
//! (strata-perf draws one on stderr, on a terminal only). A terminal is a
//! pseudo-terminal: `script` (util-linux) runs the command on one.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-logs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
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

/// `bin args` to a file, a pipe and a terminal: the same lines in shape; what the
/// terminal showed (None without `script`) and the file's text.
fn same_everywhere(bin: &str, args: &str) -> (Option<String>, String) {
    let args: Vec<String> = args.split(' ').map(String::from).collect();
    let name = Path::new(bin).file_name().unwrap().to_string_lossy();
    let d = scratch(&name);
    let file = to_file(bin, &args, &d);
    let _ = std::fs::remove_dir_all(&d);
    assert!(file.lines().count() > 2, "{file}");
    assert_eq!(shapes(&to_pipe(bin, &args)), shapes(&file), "{bin}");
    let tty = on_terminal(bin, &args);
    if let Some(t) = &tty {
        assert_eq!(shapes(t), shapes(&file), "{bin} on a terminal:\n{t}");
    }
    (tty, file)
}

#[test]
fn strata_perf_prints_the_same_to_a_file_a_pipe_and_a_terminal() {
    let bin = env!("CARGO_BIN_EXE_strata-perf");
    let sweep =
        "--ranks 4 --topology nodes:2x2 --op all-gather,all-reduce -b 1K -e 64K -f 4 -n 2 -w 1";
    let (tty, file) = same_everywhere(bin, sweep);
    // 8 rows, then the footer.
    assert!(file.contains("# Avg bus bandwidth"), "{file}");
    if let Some(t) = tty {
        assert!(is_bar(&t), "a terminal shows the bar:\n{t}");
    }
    let (tty, _) = same_everywhere(bin, &format!("{sweep} --quiet"));
    if let Some(t) = tty {
        assert!(!is_bar(&t), "--quiet: no bar\n{t}");
    }
}

#[test]
fn strata_sim_prints_the_same_to_a_file_a_pipe_and_a_terminal() {
    same_everywhere(
        env!("CARGO_BIN_EXE_strata-sim"),
        "--topology nodes:2x4 --op all-gather,all-reduce --size 1M,64M",
    );
}

#[test]
fn strata_launch_prints_the_same_to_a_file_a_pipe_and_a_terminal() {
    same_everywhere(
        env!("CARGO_BIN_EXE_strata-launch"),
        "--transport host-local --topology nodes:1x2 --algo ring -b 16 -n 20",
    );
}

#[test]
fn strata_overlap_prints_the_same_to_a_file_a_pipe_and_a_terminal() {
    same_everywhere(
        env!("CARGO_BIN_EXE_strata-overlap"),
        "--transport host-local --topology nodes:1x2 --op all-reduce --algo ring -b 64K -e 64K -n 1 --busy-ms 2",
    );
}

/// `tool args | head -0`: the reader is gone before the tool's first line. Every tool
/// ends with status 0 and no panic, as a Unix filter does on SIGPIPE (Rust's `println!`
/// panics with "failed printing to stdout").
#[test]
fn a_closed_stdout_ends_each_tool_quietly() {
    for (bin, args) in [
        (
            env!("CARGO_BIN_EXE_strata-sim"),
            "--topology nodes:2x4 --op all-gather,all-reduce --size 1M,64M",
        ),
        (
            env!("CARGO_BIN_EXE_strata-launch"),
            "--transport host-local --topology nodes:1x2 --algo ring -b 16 -n 20",
        ),
        (
            env!("CARGO_BIN_EXE_strata-overlap"),
            "--transport host-local --topology nodes:1x2 --op all-reduce --algo ring -b 64K -e 64K -n 1 --busy-ms 2",
        ),
        (
            env!("CARGO_BIN_EXE_strata-perf"),
            "--ranks 2 --op all-gather -b 1K -e 1K -n 2 -w 1",
        ),
    ] {
        let mut child = Command::new(bin)
            .args(args.split(' '))
            .env("STRATA_TIMEOUT", "2")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Closed at once: the tool starts, parses and computes before its first line.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !err.contains("panicked"),
            "{bin} {args} with a closed stdout: {}\n{err}",
            out.status
        );
    }
}
