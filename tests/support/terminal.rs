//! What the tools' log tests share (tools/tests/logs.rs and engine/tests/logs.rs include
//! it with `#[path]`): a command's output to a file, a pipe and a terminal (a
//! pseudo-terminal: `script` of util-linux runs the command on one), and the lines'
//! shapes (escapes and bars dropped, every word with a digit as `N`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-logs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `bin args` with stdout to a file; stderr apart.
pub fn to_file(bin: &str, args: &[String], dir: &Path) -> String {
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
pub fn to_pipe(bin: &str, args: &[String]) -> String {
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
pub fn on_terminal(bin: &str, args: &[String]) -> Option<String> {
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
pub fn no_escapes(s: &str) -> String {
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
pub fn is_bar(l: &str) -> bool {
    l.contains(['░', '█'])
}

/// The lines as a reader sees them, bars aside and in shape: cut at line ends and
/// carriage returns (a terminal's redraws), escapes out, every word with a digit `N`
/// (timings differ from run to run), every yes/no `B` (measured flags such as
/// strata-launch's `ahead`, which a loaded machine can flip), spaces squeezed.
pub fn shapes(text: &str) -> Vec<String> {
    text.split(['\n', '\r'])
        .map(no_escapes)
        .filter(|l| !l.trim().is_empty() && !is_bar(l))
        .map(|l| {
            l.split_whitespace()
                .map(|w| {
                    if w.contains(|c: char| c.is_ascii_digit()) {
                        "N"
                    } else if w == "yes" || w == "no" {
                        "B"
                    } else {
                        w
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// `bin args | head -0`: the reader is gone before the tool's first line (closed at once:
/// the tool starts, parses and computes before it prints). The tool must end with status 0
/// and no panic, as a Unix filter does on SIGPIPE (Rust's `println!` panics).
pub fn closed_stdout_ends_quietly(bin: &str, args: &str) {
    let mut child = Command::new(bin)
        .args(args.split(' '))
        .env("STRATA_TIMEOUT", "2")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !err.contains("panicked"),
        "{bin} {args} with a closed stdout: {}\n{err}",
        out.status
    );
}
