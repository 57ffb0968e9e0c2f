//! What strata-perf, strata-sim, strata-launch and strata-overlap print is the same to a
//! file (SLURM's and mpirun's output files), a pipe and a terminal, progress bars aside
//! (strata-perf draws one on stderr, on a terminal only). A terminal is a
//! pseudo-terminal: `script` (util-linux) runs the command on one.

use std::path::Path;

#[path = "../../tests/support/terminal.rs"]
mod terminal;
use terminal::*;

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
        closed_stdout_ends_quietly(bin, args);
    }
}
