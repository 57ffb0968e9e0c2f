//! What the libstrata_nccl.so tests share: where the built libraries are, the real
//! library (`STRATA_NCCL_LIB`, the wheel's `libnccl.so.2` that `scripts/gpu-toolchains`
//! installs and names), a C compiler, and skipping with a note when one of them is
//! missing (failing instead under `STRATA_REQUIRE_NCCL=1`, as CI runs).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// True when a missing real library or tool must fail the test instead of skipping it.
pub fn required() -> bool {
    std::env::var("STRATA_REQUIRE_NCCL").is_ok_and(|v| v == "1")
}

/// Skips (prints why, returns `None`) or, under `STRATA_REQUIRE_NCCL=1`, fails.
pub fn skip<T>(why: &str) -> Option<T> {
    assert!(!required(), "STRATA_REQUIRE_NCCL=1: {why}");
    eprintln!("note: skipped: {why}");
    None
}

/// The real `libnccl.so.2` (`STRATA_NCCL_LIB`).
pub fn real_lib() -> Option<PathBuf> {
    match std::env::var_os("STRATA_NCCL_LIB").map(PathBuf::from) {
        Some(p) if p.is_file() => Some(p),
        Some(p) => skip(&format!("STRATA_NCCL_LIB={} is not a file", p.display())),
        None => skip("STRATA_NCCL_LIB is unset (bash scripts/gpu-toolchains prints it)"),
    }
}

/// `target/<profile>`, where cargo puts the libraries: the test executable lives in its
/// `deps/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// `libstrata_nccl.so` as this `cargo test` built it: cargo compiles the library with
/// all its crate types for the tests, the cdylib into `target/<profile>/deps/` (it copies
/// it up to `target/<profile>/` only on `cargo build`, so the copy there can be stale).
pub fn front_lib() -> PathBuf {
    let dir = profile_dir();
    [
        dir.join("deps/libstrata_nccl.so"),
        dir.join("libstrata_nccl.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .expect("libstrata_nccl.so was built (target/<profile>/deps/)")
}

/// `libstrata_nccl_audit.so`, another package: built here (`cargo build -p
/// strata-nccl-audit`, same profile; a no-op when it is fresh).
pub fn audit_lib() -> PathBuf {
    let dir = profile_dir();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("audit/Cargo.toml");
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--quiet",
        "-p",
        "strata-nccl-audit",
        "--manifest-path",
    ])
    .arg(&manifest);
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let st = cmd.status().expect("cargo runs");
    assert!(st.success(), "cargo build -p strata-nccl-audit failed");
    let p = dir.join("libstrata_nccl_audit.so");
    assert!(p.is_file(), "{} was not built", p.display());
    p
}

/// A scratch directory for this test's binaries.
pub fn scratch(name: &str) -> PathBuf {
    let d = profile_dir().join("nccl-tests").join(name);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Compiles `tests/c/<src>` with `args` (`$CC`, else `cc`) into `out`; `None` (skipped)
/// without a C compiler.
pub fn cc(src: &str, out: &Path, args: &[&str]) -> Option<()> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(src);
    let res = Command::new(&cc)
        .arg("-Wall")
        .arg(&src)
        .arg("-o")
        .arg(out)
        .args(args)
        .output();
    match res {
        Err(e) => skip(&format!("no C compiler ({cc}: {e})")),
        Ok(o) => {
            assert!(
                o.status.success(),
                "{cc} {}: {}",
                src.display(),
                String::from_utf8_lossy(&o.stderr)
            );
            Some(())
        }
    }
}

/// Runs `exe` with `args` in a clean NCCL environment plus `env` (a `None` value removes
/// the variable); returns its output after checking it ran.
pub fn run(exe: &Path, args: &[&str], env: &[(&str, Option<&str>)]) -> Output {
    let mut cmd = Command::new(exe);
    cmd.args(args);
    for var in [
        "LD_PRELOAD",
        "LD_AUDIT",
        "LD_LIBRARY_PATH",
        "STRATA_NCCL_REAL_LIB",
        "STRATA_NCCL_LIB",
        "STRATA_NCCL_DEVICE",
        "STRATA_NCCL_FRONT_LIB",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("NCCL_DEBUG", "WARN");
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let o = cmd.output().expect("the test program runs");
    if !o.status.success() {
        panic!(
            "{} {args:?} {env:?}: {}\nstdout:\n{}\nstderr:\n{}",
            exe.display(),
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    o
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}
