//! Build script. Without feature `rocm` it does nothing. With it, it builds strata's HIP
//! kernels (`kernels-hip/strata_quant.hip`, which expands the bodies of
//! `kernels-cuda/*.cuh`) with hipcc into one code object per AMD target, in `OUT_DIR`:
//! `strata_gfx90a.co` (MI250X), `strata_gfx940.co` (MI300) and `strata_gfx942.co`
//! (MI300X/MI300A), which `src/device/hip/code.rs` embeds. gfx942 is optional: a hipcc that
//! does not know it (Debian's 5.2) leaves an empty file and a cargo warning, and the HIP
//! device then says the kernels for gfx942 need a newer hipcc. The options are those of `HIPCC_OPTIONS` in
//! `src/kernels_gpu/mod.rs` (`--genco -O3 -ffp-contract=off`) plus
//! `--no-gpu-bundle-output`, so each file is a plain AMDGPU ELF code object rather than
//! a clang offload bundle; the arches are `HIP_ARCHS` there (a unit test of
//! `device::hip` checks both lists against the `STRATA_HIPCC_*` variables set here).
//!
//! hipcc is `$HIPCC`, else `$HIP_PATH/bin/hipcc`, else `hipcc` on `PATH`; when none
//! exists the build fails naming what was tried and how to install it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Keep in sync with `HIP_ARCHS` in src/kernels_gpu/mod.rs (checked by a unit test).
const HIP_ARCHS: [&str; 3] = ["gfx90a", "gfx940", "gfx942"];
/// Targets a hipcc may not know yet: built when it can, else left empty with a warning.
const OPTIONAL_ARCHS: [&str; 1] = ["gfx942"];
/// `HIPCC_OPTIONS` of src/kernels_gpu/mod.rs (checked by a unit test), then
/// `--no-gpu-bundle-output`: a bare ELF code object per arch.
const HIPCC_OPTIONS: [&str; 4] = [
    "--genco",
    "-O3",
    "-ffp-contract=off",
    "--no-gpu-bundle-output",
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_ROCM").is_none() {
        return;
    }
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed=kernels-hip");
    println!("cargo:rerun-if-changed=kernels-hip/strata_quant.hip");
    if let Ok(dir) = std::fs::read_dir(root.join("kernels-cuda")) {
        let mut headers: Vec<PathBuf> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "cuh"))
            .collect();
        headers.sort();
        for h in headers {
            println!("cargo:rerun-if-changed={}", h.display());
        }
    }
    for var in ["HIPCC", "HIP_PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let hipcc = find_hipcc().unwrap_or_else(|tried| {
        fail(&format!(
            "feature `rocm` builds strata's HIP kernels with hipcc, which was not found.\n\
             Tried: {}.\n\
             Install it (Debian/Ubuntu: `apt-get install hipcc`, then build with \
             HIP_PATH=/usr; ROCm: HIP_PATH=/opt/rocm) or set HIPCC to the hipcc to use.",
            tried.join("; ")
        ))
    });
    let src = root.join("kernels-hip/strata_quant.hip");
    // One hipcc per arch, in parallel (each takes several seconds).
    let jobs: Vec<_> = HIP_ARCHS
        .iter()
        .map(|arch| {
            let (hipcc, src) = (hipcc.clone(), src.clone());
            let dst = out.join(format!("strata_{arch}.co"));
            std::thread::spawn(move || compile(&hipcc, &src, arch, &dst))
        })
        .collect();
    let mut errors = Vec::new();
    let mut skipped = Vec::new();
    for (j, arch) in jobs.into_iter().zip(HIP_ARCHS) {
        if let Err(e) = j
            .join()
            .unwrap_or_else(|_| Err("hipcc thread panicked".into()))
        {
            if OPTIONAL_ARCHS.contains(&arch) {
                let dst = out.join(format!("strata_{arch}.co"));
                if let Err(w) = std::fs::write(&dst, b"") {
                    errors.push(format!("{}: {w}", dst.display()));
                }
                let first = e.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
                println!(
                    "cargo:warning=strata: this hipcc cannot build {arch} (MI300X) kernels \
                     ({first}); HIP devices of that target will be refused"
                );
                skipped.push(arch);
            } else {
                errors.push(e);
            }
        }
    }
    if !errors.is_empty() {
        let hip_path = std::env::var("HIP_PATH").unwrap_or_else(|_| "unset".into());
        fail(&format!(
            "{}\nHIP_PATH is {hip_path}; Debian's hipcc wants HIP_PATH=/usr (or unset), ROCm's \
             /opt/rocm.",
            errors.join("\n\n")
        ));
    }
    println!("cargo:rustc-env=STRATA_HIPCC={}", hipcc.display());
    println!(
        "cargo:rustc-env=STRATA_HIPCC_OPTIONS={}",
        HIPCC_OPTIONS.join(" ")
    );
    println!("cargo:rustc-env=STRATA_HIP_ARCHS={}", HIP_ARCHS.join(","));
    println!("cargo:rustc-env=STRATA_HIP_SKIPPED={}", skipped.join(","));
}

fn fail(msg: &str) -> ! {
    eprintln!("error: strata build script: {msg}");
    std::process::exit(1);
}

/// hipcc to use, or the list of what was tried.
fn find_hipcc() -> Result<PathBuf, Vec<String>> {
    let mut tried = Vec::new();
    if let Some(v) = std::env::var_os("HIPCC").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(&v);
        // An explicit choice is used as given (a bare name is looked up on PATH).
        if p.components().count() == 1 {
            if let Some(found) = on_path(&p) {
                return Ok(found);
            }
        } else if p.is_file() {
            return Ok(p);
        }
        tried.push(format!("$HIPCC={} (not found)", p.display()));
        return Err(tried);
    }
    tried.push("$HIPCC (unset)".into());
    match std::env::var_os("HIP_PATH").filter(|v| !v.is_empty()) {
        Some(h) => {
            let p = Path::new(&h).join("bin/hipcc");
            if p.is_file() {
                return Ok(p);
            }
            tried.push(format!("$HIP_PATH/bin/hipcc = {} (missing)", p.display()));
        }
        None => tried.push("$HIP_PATH/bin/hipcc (HIP_PATH unset)".into()),
    }
    match on_path(Path::new("hipcc")) {
        Some(p) => Ok(p),
        None => {
            tried.push("hipcc on PATH (not found)".into());
            Err(tried)
        }
    }
}

fn on_path(name: &Path) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn compile(hipcc: &Path, src: &Path, arch: &str, dst: &Path) -> Result<(), String> {
    let mut cmd = Command::new(hipcc);
    cmd.args(HIPCC_OPTIONS)
        .arg(format!("--offload-arch={arch}"))
        .arg("-o")
        .arg(dst)
        .arg(src);
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| format!("running {shown}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{shown} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    match std::fs::read(dst) {
        Ok(b) if b.starts_with(b"\x7fELF") => Ok(()),
        Ok(b) => Err(format!(
            "{shown} wrote {} bytes that are not an ELF code object (a hipcc without \
             --no-gpu-bundle-output support?)",
            b.len()
        )),
        Err(e) => Err(format!("{shown} succeeded but {}: {e}", dst.display())),
    }
}
