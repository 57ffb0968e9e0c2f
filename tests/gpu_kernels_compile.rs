//! Every GPU kernel compiles: the CUDA ones with NVRTC (loaded at run time by strata,
//! from the PyPI wheel nvidia-cuda-nvrtc-cu12, headers from
//! nvidia-cuda-runtime-cu12) for compute_80 and compute_90, the HIP ones with hipcc into
//! code objects for gfx90a and gfx940. `scripts/gpu-toolchains` installs both and prints
//! the environment this test needs.
//!
//! With `STRATA_REQUIRE_GPU_TOOLCHAINS=1` (scripts/test sets it) a missing toolchain
//! (libnvrtc, the CUDA headers, hipcc, a C++20 compiler for the host emulation) FAILS the
//! test; without it the test prints why it skipped and passes. The NVRTC part needs
//! `--features cuda` and says it skipped in a build without it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use strata::kernels_gpu::{self, HIPCC_OPTIONS, HIP_ARCHS};

fn required() -> bool {
    std::env::var("STRATA_REQUIRE_GPU_TOOLCHAINS").is_ok_and(|v| v == "1")
}

/// Fail under STRATA_REQUIRE_GPU_TOOLCHAINS=1, else print the reason and skip.
fn unavailable(what: &str, why: &str) {
    if required() {
        panic!("{what}: {why} (STRATA_REQUIRE_GPU_TOOLCHAINS=1: run scripts/gpu-toolchains)");
    }
    eprintln!("SKIPPED {what}: {why} (set STRATA_REQUIRE_GPU_TOOLCHAINS=1 to make this fail)");
}

#[test]
fn cuda_kernels_compile_with_nvrtc() {
    if !cfg!(feature = "cuda") {
        // Not a missing toolchain: this build has no NVRTC path at all. Skipped even
        // under STRATA_REQUIRE_GPU_TOOLCHAINS=1, so that a plain `cargo test` stays green;
        // the CI runs this test with --features cuda.
        eprintln!("SKIPPED NVRTC compile: built without --features cuda (run: cargo test --features cuda --test gpu_kernels_compile)");
        return;
    }
    let dir = cache_dir("ptx");
    for arch in kernels_gpu::CUDA_ARCHS {
        // A fresh cache directory (compute_90) or none: either way NVRTC compiles the
        // source here; the compute_90 entry then serves the cache's checks below.
        let cached = arch == "compute_90";
        let compiled = kernels_gpu::compile_cuda_ptx_in(arch, cached.then_some(dir.as_path()));
        let Some(ptx) = nvrtc_output("NVRTC compile", arch, compiled) else {
            return;
        };
        assert_every_kernel(arch, "PTX", |name| ptx.contains(&format!(".entry {name}(")));
        let (lib, major, minor) = kernels_gpu::nvrtc_version().expect("NVRTC compiled the kernels");
        assert!(major >= 11, "{lib}: NVRTC {major}.{minor}");
        eprintln!("{arch}: {lib} (NVRTC {major}.{minor})");
        // --fmad=false: no fused multiply-add anywhere (docs/quantization.md), IEEE
        // division, no register spills to local memory.
        assert!(
            !ptx.contains("fma.rn.f32"),
            "{arch}: FMA contraction in the PTX"
        );
        assert!(
            !ptx.contains("div.approx"),
            "{arch}: approximate division in the PTX"
        );
        assert!(
            !ptx.contains(".ftz."),
            "{arch}: flush-to-zero arithmetic in the PTX"
        );
        let entries = ptx.matches(".entry ").count();
        eprintln!(
            "NVRTC {arch}: {entries} kernels, {} bytes of PTX",
            ptx.len()
        );
        if cached {
            let compile =
                || kernels_gpu::compile_cuda_ptx_in(arch, Some(&dir)).map(String::into_bytes);
            check_cache(&dir, ptx.as_bytes(), compile, true);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The CUBIN the CUDA device loads first: an ELF image for the real architecture with
/// every kernel's symbol in it.
#[test]
fn cuda_kernels_compile_to_cubin() {
    if !cfg!(feature = "cuda") {
        eprintln!("SKIPPED NVRTC CUBIN: built without --features cuda");
        return;
    }
    let dir = cache_dir("cubin");
    for arch in ["sm_80", "sm_90"] {
        let cached = arch == "sm_90";
        let compiled = kernels_gpu::compile_cuda_cubin_in(arch, cached.then_some(dir.as_path()));
        let Some(cubin) = nvrtc_output("NVRTC CUBIN", arch, compiled) else {
            return;
        };
        assert_eq!(&cubin[..4], b"\x7fELF", "{arch}: not an ELF image");
        assert_every_kernel(arch, "CUBIN", |name| {
            cubin
                .windows(name.len() + 1)
                .any(|w| w[..name.len()] == *name.as_bytes() && w[name.len()] == 0)
        });
        eprintln!("NVRTC {arch}: {} bytes of CUBIN", cubin.len());
        if cached {
            // The damaged-entry case (a recompile) is the PTX test's, which costs half.
            check_cache(
                &dir,
                &cubin,
                || kernels_gpu::compile_cuda_cubin_in(arch, Some(&dir)),
                false,
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// What NVRTC made for `arch`, or None where NVRTC is missing (`what` is then skipped,
/// or fails under STRATA_REQUIRE_GPU_TOOLCHAINS=1): a missing library or header is the
/// toolchain's absence; any other error, such as a compile error in our own source,
/// always fails.
fn nvrtc_output<T>(what: &str, arch: &str, compiled: strata::Result<T>) -> Option<T> {
    match compiled {
        Ok(out) => Some(out),
        Err(e @ strata::Error::System(_)) if e.to_string().contains("not found") => {
            unavailable(what, &e.to_string());
            None
        }
        Err(e) => panic!("{arch}: {e}"),
    }
}

/// Every kernel's symbol is in `arch`'s `what` (PTX or CUBIN), as `has` looks for it.
fn assert_every_kernel(arch: &str, what: &str, has: impl Fn(&str) -> bool) {
    for name in kernels_gpu::kernel_names()
        .into_iter()
        .chain(kernels_gpu::reduce_kernel_names())
    {
        assert!(has(&name), "{arch}: kernel {name} missing from the {what}");
    }
}

fn cache_dir(what: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("strata-kcache-test-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A process's compilation is kept on disk and the next one loads it: `dir` holds the one
/// entry that compiling `first` made (its identity, a blank line, the output). Proven by
/// replacing the cached body (same identity) and getting that back from `compile`; with
/// `damaged`, a truncated entry is a miss, compiled over (a full recompile). The PTX and
/// CUBIN tests call this on the compilation they made anyway, so the cache costs them one
/// recompile in all, not three.
fn check_cache(
    dir: &Path,
    first: &[u8],
    compile: impl Fn() -> strata::Result<Vec<u8>>,
    damaged: bool,
) {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let data = std::fs::read(&files[0]).unwrap();
    let head = data.windows(2).position(|w| w == b"\n\n").unwrap() + 2;
    assert_eq!(
        &data[head..],
        first,
        "the file holds the output after its identity"
    );
    // The same identity with another body: loaded, not recompiled.
    let mut fake = data[..head].to_vec();
    fake.extend_from_slice(b"cached body");
    std::fs::write(&files[0], &fake).unwrap();
    assert_eq!(compile().unwrap(), b"cached body");
    if damaged {
        // A truncated file is a miss: compiled again, and the entry repaired.
        std::fs::write(&files[0], &data[..head / 2]).unwrap();
        assert_eq!(compile().unwrap(), first);
        assert_eq!(std::fs::read(&files[0]).unwrap(), data);
    }
}

#[test]
fn nvrtc_rejects_a_bad_arch_without_panicking() {
    let r = kernels_gpu::compile_cuda_ptx("sm_90");
    assert!(matches!(r, Err(strata::Error::InvalidArgument(_))), "{r:?}");
    let r = kernels_gpu::compile_cuda_cubin("compute_90");
    assert!(matches!(r, Err(strata::Error::InvalidArgument(_))), "{r:?}");
    if cfg!(feature = "cuda") {
        let r = kernels_gpu::compile_cuda_cubin("sm_9x!");
        assert!(matches!(r, Err(strata::Error::InvalidArgument(_))), "{r:?}");
    }
}

fn find_hipcc() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("HIPCC") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("hipcc"))
        .find(|p| p.is_file())
}

#[test]
fn hip_kernels_compile_with_hipcc() {
    let Some(hipcc) = find_hipcc() else {
        unavailable("hipcc compile", "hipcc not found on PATH (nor $HIPCC)");
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("kernels-hip/strata_quant.hip");
    let out_dir = std::env::temp_dir().join(format!("strata-hip-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    // One hipcc per architecture, all at once (each is single-threaded).
    let runs: Vec<_> = HIP_ARCHS
        .iter()
        .map(|arch| {
            let out = out_dir.join(format!("strata_quant_{arch}.co"));
            let mut cmd = Command::new(&hipcc);
            cmd.args(HIPCC_OPTIONS)
                .arg(format!("--offload-arch={arch}"))
                .arg(&src)
                .arg("-o")
                .arg(&out)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if std::env::var_os("HIP_PATH").is_none() {
                cmd.env("HIP_PATH", "/usr"); // Debian's layout
            }
            let child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("running {hipcc:?}: {e}"));
            (*arch, out, child)
        })
        .collect();
    for (arch, out, child) in runs {
        let res = child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("running {hipcc:?}: {e}"));
        let stderr = String::from_utf8_lossy(&res.stderr);
        if arch == "gfx942" && !res.status.success() && stderr.contains("invalid target ID") {
            // Optional (build.rs): a hipcc older than ROCm 5.7 (Debian's 5.2) lacks it.
            eprintln!("SKIPPED gfx942: this hipcc does not know it");
            continue;
        }
        assert!(
            res.status.success(),
            "hipcc {arch} failed:\n{}\n{}",
            String::from_utf8_lossy(&res.stdout),
            String::from_utf8_lossy(&res.stderr)
        );
        let co = std::fs::read(&out).unwrap();
        for name in kernels_gpu::kernel_names()
            .into_iter()
            .chain(kernels_gpu::reduce_kernel_names())
        {
            let sym = format!("{name}.kd");
            assert!(
                co.windows(sym.len()).any(|w| w == sym.as_bytes()),
                "{arch}: kernel descriptor {sym} missing from the code object"
            );
        }
        eprintln!("hipcc {arch}: {} bytes of code object", co.len());
    }
    let _ = std::fs::remove_dir_all(&out_dir);
}

// ---------------------------------------------------------------------------------
// The kernels themselves, run on the CPU: kernels-cuda/emu/ compiles the CUDA entry file
// with a host C++ compiler against a small emulation of the CUDA facilities it uses (one
// OS thread per CUDA thread, block-wide barriers and shuffles), launched with the
// geometry and argument blocks of src/kernels_gpu/plan.rs. Every output must equal the
// CPU reference byte for byte, and the poisoned guard bytes around it must survive. This
// checks indexing, layouts, vector and scalar paths and group reductions without a GPU;
// the GPU itself is checked by scripts/gpu-check.

use rand::{Rng as _, RngCore as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;
use strata::kernels::{self as cpu, QuantSpec};
use strata::kernels_gpu::plan;
use strata::{DataType, ReduceOp};

fn values(rng: &mut ChaCha8Rng, n: usize, dt: DataType) -> Vec<u8> {
    let mut out = vec![0u8; n * dt.size()];
    let mut i = 0;
    while i < n {
        let run = (1 + rng.random_range(0..700u64) as usize).min(n - i);
        let profile = rng.random_range(0..8u64);
        let mag = 2f64.powi(rng.random_range(0..41u64) as i32 - 20);
        for e in i..i + run {
            let u = rng.random::<f64>() * 2.0 - 1.0;
            let v = match profile {
                0 | 1 => u * mag,
                2 => (rng.random_range(0..509u64) as f64 - 254.0) / 2.0,
                3 => 0.0,
                4 => u * 2f64.powi(-70 - rng.random_range(0..60u64) as i32),
                5 => match rng.random_range(0..100u64) {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    2 => f64::NEG_INFINITY,
                    _ => u * mag,
                },
                6 => u * 3.0e38,
                _ => u * 1e-30,
            };
            dt.set(&mut out, e, v);
        }
        i += run;
    }
    out
}

fn packed(rng: &mut ChaCha8Rng, s: QuantSpec, n: usize, raw: bool) -> Vec<u8> {
    if raw {
        return (0..s.packed_len(n)).map(|_| rng.next_u64() as u8).collect();
    }
    let src = values(rng, n, DataType::F32);
    let mut p = vec![0u8; s.packed_len(n)];
    cpu::quantize(s, DataType::F32, &src, &mut p).unwrap();
    p
}

const GUARD: usize = 32;

struct Emu {
    exe: PathBuf,
    dir: PathBuf,
    runs: usize,
}

impl Emu {
    /// Run `kernel` on `input`; the output region is `want.len()` bytes; compare.
    #[allow(clippy::too_many_arguments)]
    fn check(
        &mut self,
        what: &str,
        kernel: &str,
        l: plan::Launch,
        fields: &[u64],
        input: &[u8],
        in_off: usize,
        out_off: usize,
        want: &[u8],
    ) {
        let got = self.run(
            kernel,
            (l.grid, l.threads),
            fields,
            input,
            in_off,
            out_off,
            None,
            want.len(),
            what,
        );
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            let bad = (0..want.len()).filter(|&i| got[i] != want[i]).count();
            panic!(
                "{what}: {bad} of {} bytes differ from the CPU reference, first at byte {i}: cpu {:#04x} emulated {:#04x}",
                want.len(),
                want[i],
                got[i]
            );
        }
    }

    /// Run `kernel` with `grid` blocks of `threads` threads on `input` (placed at byte
    /// `in_off`) and an output region of `len` bytes at byte `out_off` + GUARD, holding
    /// `init` before the launch (the in-place buffer of the element-wise kernels) or
    /// poison; check the poisoned guard bytes around it and return the region.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        kernel: &str,
        (grid, threads): (u32, u32),
        fields: &[u64],
        input: &[u8],
        in_off: usize,
        out_off: usize,
        init: Option<&[u8]>,
        len: usize,
        what: &str,
    ) -> Vec<u8> {
        self.runs += 1;
        let (inf, outf) = (self.dir.join("in.bin"), self.dir.join("out.bin"));
        std::fs::write(&inf, input).unwrap();
        let poison = (self.runs as u8).wrapping_mul(37) | 1;
        let mut buf = vec![poison; len + 2 * GUARD];
        if let Some(init) = init {
            buf[GUARD..GUARD + len].copy_from_slice(init);
        }
        std::fs::write(&outf, &buf).unwrap();
        let mut cmd = Command::new(&self.exe);
        cmd.arg(kernel)
            .arg(grid.to_string())
            .arg(threads.to_string())
            .arg(&inf)
            .arg(in_off.to_string())
            .arg(&outf)
            .arg(out_off.to_string())
            .arg(GUARD.to_string())
            .args(fields.iter().map(|f| f.to_string()));
        let res = cmd.output().expect("running the emulator");
        assert!(
            res.status.success(),
            "{what}: emulator failed: {}",
            String::from_utf8_lossy(&res.stderr)
        );
        let got = std::fs::read(&outf).unwrap();
        assert_eq!(got.len(), len + 2 * GUARD, "{what}: output file resized");
        assert!(
            got[..GUARD].iter().all(|&b| b == poison)
                && got[GUARD + len..].iter().all(|&b| b == poison),
            "{what}: guard bytes overwritten"
        );
        got[GUARD..GUARD + len].to_vec()
    }
}

fn find_cxx() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("CXX") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    for name in ["g++", "clang++", "c++"] {
        if let Some(p) = std::env::split_paths(&path)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
        {
            return Some(p);
        }
    }
    None
}

fn quant_fields(a: &plan::QuantArgs) -> Vec<u64> {
    vec![
        a.block,
        a.nodes,
        a.devices,
        a.chunk,
        a.stages,
        a.total_blocks,
        a.gs as u64,
    ]
}
fn deq_fields(a: &plan::DequantArgs) -> Vec<u64> {
    vec![
        a.block,
        a.n,
        a.slices,
        a.k,
        a.in_stride,
        a.total_blocks,
        a.gs as u64,
        a.avg as u64,
        a.divisor.to_bits() as u64,
    ]
}
fn drq_fields(a: &plan::DrqArgs) -> Vec<u64> {
    vec![
        a.block,
        a.n,
        a.slices,
        a.k,
        a.in_stride,
        a.total_blocks,
        a.gs as u64,
    ]
}

/// The launch geometry of one case: mostly the default (the kernels' own), sometimes
/// fewer elements a lane than the emulator's kernels hold (larger groups than they need,
/// so more lanes than vectors) or other thread blocks: any geometry gives the same bytes.
fn geom(rng: &mut ChaCha8Rng) -> plan::Geometry {
    match rng.random_range(0..4u64) {
        0 => plan::Geometry::parse("16,128").unwrap(),
        1 => plan::Geometry::parse("32,512").unwrap(),
        _ => plan::Geometry::DEFAULT,
    }
}

/// Compile kernels-cuda/emu/ into a directory of its own (`tag`: the tests run in
/// parallel, in one process); None when the toolchain is missing (and allowed to be).
fn build_emulator(what: &str, tag: &str) -> Option<Emu> {
    let Some(cxx) = find_cxx() else {
        unavailable(what, "no C++ compiler (g++, clang++, c++ or $CXX)");
        return None;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("strata-emu-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("strata_emu");
    let res = Command::new(&cxx)
        .args(["-std=c++20", "-O1", "-ffp-contract=off", "-pthread"])
        .arg(format!(
            "-I{}",
            root.join("kernels-cuda/emu/include").display()
        ))
        .arg(root.join("kernels-cuda/emu/emu.cpp"))
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("running the C++ compiler");
    if !res.status.success() {
        let err = String::from_utf8_lossy(&res.stderr).to_string();
        // An old compiler without C++20 <barrier> or _Float16 is the toolchain's absence.
        if err.contains("barrier") || err.contains("_Float16") {
            unavailable(what, &format!("{cxx:?} lacks C++20/_Float16: {err}"));
            return None;
        }
        panic!("compiling the kernels for host emulation failed:\n{err}");
    }
    Some(Emu { exe, dir, runs: 0 })
}

#[test]
fn emulated_kernels_match_the_cpu_reference() {
    let Some(mut emu) = build_emulator("emulated kernels", "quant") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0xC0FFEE);
    let dts = [DataType::F32, DataType::F16, DataType::BF16];

    // quantize and dequantize: every type, both widths, block sizes across the group
    // sizes (1 thread .. 1024 threads per block), full and partial blocks, misaligned
    // buffers (scalar paths) and aligned ones (16-byte paths).
    for (bits, block) in [
        (8, 1),
        (8, 7),
        (4, 2),
        (4, 6),
        (8, 32),
        (4, 64),
        (8, 130),
        (4, 2048),
        (8, 2048),
        (8, 40000),
        (4, 40000),
    ] {
        let s = QuantSpec::new(bits, block).unwrap();
        for n in [1usize, 33, 1000, 4099, 45000] {
            if n > 5000 && block < 1000 {
                continue;
            }
            for dt in dts {
                let src = values(&mut rng, n, dt);
                let mut want = vec![0u8; s.packed_len(n)];
                cpu::quantize(s, dt, &src, &mut want).unwrap();
                let (l, a) = plan::quantize_plan(s, dt, n, 1, 1, 1, geom(&mut rng)).unwrap();
                let in_off = [0, 16, dt.size(), 1][rng.random_range(0..4u64) as usize];
                let out_off = [0, 16, 3][rng.random_range(0..3u64) as usize];
                let what =
                    format!("quantize {dt} q{bits} block {block} n {n} offsets {in_off}/{out_off}");
                emu.check(
                    &what,
                    &format!("strata_quantize_{dt}_q{bits}"),
                    l,
                    &quant_fields(&a),
                    &src,
                    in_off,
                    out_off,
                    &want,
                );

                let raw = rng.random_range(0..4u64) == 0;
                let p = if raw {
                    packed(&mut rng, s, n, true)
                } else {
                    want.clone()
                };
                let mut want = vec![0u8; n * dt.size()];
                cpu::dequantize(s, &p, n, dt, &mut want).unwrap();
                let (l, a) = plan::dequant_plan(s, dt, n, 1, None, geom(&mut rng)).unwrap();
                let in_off = [0, 16, 5][rng.random_range(0..3u64) as usize];
                let out_off = [0, 16, dt.size(), 1][rng.random_range(0..4u64) as usize];
                let what = format!("dequantize {dt} q{bits} block {block} n {n} raw {raw} offsets {in_off}/{out_off}");
                emu.check(
                    &what,
                    // One sender: its own kernel, or the k-sender one (same arguments).
                    &if rng.random_range(0..4u64) == 0 {
                        format!("strata_dequant_reduce_{dt}_q{bits}")
                    } else {
                        kernels_gpu::dequant_kernel_name(dt, bits, true)
                    },
                    l,
                    &deq_fields(&a),
                    &p,
                    in_off,
                    out_off,
                    &want,
                );
            }
        }
    }

    // swizzled quantization: odd node counts, one node, more stages than elements.
    for (nodes, devices, stages, c, bits, block) in [
        (2, 4, 1, 100, 8, 32),
        (3, 2, 2, 1001, 4, 64),
        (1, 3, 4, 37, 8, 5),
        (3, 2, 5, 3, 4, 2),
        (4, 2, 3, 5000, 8, 2048),
        (2, 2, 2, 0, 8, 4),
    ] {
        let s = QuantSpec::new(bits, block).unwrap();
        let dt = dts[rng.random_range(0..3u64) as usize];
        let src = values(&mut rng, nodes * devices * c, dt);
        let len = cpu::swizzled_len(s, c, nodes, devices, stages);
        let mut want = vec![0u8; len];
        cpu::swizzled_quantize(s, dt, &src, c, nodes, devices, stages, &mut want).unwrap();
        let what = format!("swizzled {dt} q{bits} block {block} c {c} {nodes}x{devices}x{stages}");
        match plan::quantize_plan(s, dt, c, nodes, devices, stages, geom(&mut rng)) {
            Some((l, a)) => {
                let off = [0, 16, 1][rng.random_range(0..3u64) as usize];
                emu.check(
                    &what,
                    &format!("strata_quantize_{dt}_q{bits}"),
                    l,
                    &quant_fields(&a),
                    &src,
                    0,
                    off,
                    &want,
                );
            }
            None => assert!(want.is_empty(), "{what}: no launch for a non-empty output"),
        }
    }

    // fused dequantize-reduce-quantize and dequantize-reduce, k senders in order.
    for (bits, block) in [(8, 1), (4, 2), (8, 32), (4, 130), (8, 2048), (4, 40000)] {
        let s = QuantSpec::new(bits, block).unwrap();
        for n in [1usize, 999, 5000, 41000] {
            if n > 5000 && block < 1000 {
                continue;
            }
            for (k, slices) in [(1usize, 1usize), (3, 2), (8, 1)] {
                let raw = rng.random_range(0..4u64) == 0;
                let per = s.packed_len(n) * slices;
                let all: Vec<u8> = (0..k * slices)
                    .flat_map(|_| packed(&mut rng, s, n, raw))
                    .collect();
                let ins: Vec<&[u8]> = all.chunks(per).collect();
                let mut want = vec![0u8; per];
                cpu::dequant_reduce_quant(s, &ins, n, slices, &mut want).unwrap();
                let (l, a) = plan::drq_plan(s, n, slices, k, geom(&mut rng)).unwrap();
                let (in_off, out_off) = (
                    [0, 16, 3][rng.random_range(0..3u64) as usize],
                    [0, 16, 1][rng.random_range(0..3u64) as usize],
                );
                let what = format!("dequant_reduce_quant q{bits} block {block} n {n} k {k} slices {slices} raw {raw} offsets {in_off}/{out_off}");
                emu.check(
                    &what,
                    &format!("strata_dequant_reduce_quant_q{bits}"),
                    l,
                    &drq_fields(&a),
                    &all,
                    in_off,
                    out_off,
                    &want,
                );

                let dt = dts[rng.random_range(0..3u64) as usize];
                let (op, div) = if rng.random_range(0..2u64) == 0 {
                    (ReduceOp::Sum, 1)
                } else {
                    (ReduceOp::Avg, 3 + rng.random_range(0..30u64) as usize)
                };
                let one = s.packed_len(n);
                let ins: Vec<&[u8]> = all[..k * one].chunks(one).collect();
                let mut want = vec![0u8; n * dt.size()];
                cpu::dequant_reduce(s, &ins, n, op, div, dt, &mut want).unwrap();
                let d = (op == ReduceOp::Avg).then_some(div as f32);
                let (l, a) = plan::dequant_plan(s, dt, n, k, d, geom(&mut rng)).unwrap();
                let what = format!(
                    "dequant_reduce {dt} q{bits} block {block} n {n} k {k} {op}/{div} raw {raw}"
                );
                emu.check(
                    &what,
                    &kernels_gpu::dequant_kernel_name(dt, bits, plan::one_sender(k, d)),
                    l,
                    &deq_fields(&a),
                    &all[..k * one],
                    in_off,
                    0,
                    &want,
                );
            }
        }
    }
    eprintln!(
        "emulated kernels: {} runs, all bitwise equal to the CPU reference",
        emu.runs
    );
    let _ = std::fs::remove_dir_all(&emu.dir);
}

// ---------------------------------------------------------------------------------
// The element-wise kernels of kernels-cuda/strata_reduce.cuh (the device reduce steps and
// the Avg division), run on the CPU against strata::dtype::reduce_into / finish_avg.

use strata::dtype::{finish_avg, reduce_into};

/// Bit patterns worth combining, per element type: NaNs (quiet, signalling, negative,
/// with payloads), infinities, signed zeros, subnormals, the extremes, values whose sum or
/// product overflows (f16: 65504, 32768, 255.9), ones; the integer extremes.
fn special_bits(dt: DataType) -> &'static [u64] {
    match dt {
        DataType::F32 => &[
            0x7fc0_0000,
            0x7f80_0001,
            0xffc1_2345,
            0x7fff_ffff,
            0x7f80_0000,
            0xff80_0000,
            0,
            0x8000_0000,
            1,
            0x8000_0001,
            0x007f_ffff,
            0x0080_0000,
            0x7f7f_ffff,
            0xff7f_ffff,
            0x3f80_0000,
            0xbf80_0000,
            0x477f_e000,
            0x4780_0000,
            0x3380_0000,
            0x5f80_0000,
            0x1f80_0000,
        ],
        DataType::F16 => &[
            0x7e00, 0x7c01, 0xfe5a, 0x7fff, 0x7c00, 0xfc00, 0, 0x8000, 1, 0x8001, 0x03ff, 0x0400,
            0x7bff, 0xfbff, 0x3c00, 0xbc00, 0x7800, 0x5bff, 0x1400, 0x3555,
        ],
        DataType::BF16 => &[
            0x7fc0, 0x7f81, 0xffc1, 0x7fff, 0x7f80, 0xff80, 0, 0x8000, 1, 0x8001, 0x007f, 0x0080,
            0x7f7f, 0xff7f, 0x3f80, 0xbf80, 0x5f80, 0x1f80, 0x3eab,
        ],
        DataType::I8 | DataType::U8 => &[0, 1, 0xff, 0x7f, 0x80, 0x81, 2, 0x10],
        DataType::I32 | DataType::U32 => &[
            0,
            1,
            0xffff_ffff,
            0x7fff_ffff,
            0x8000_0000,
            0x8000_0001,
            0x0001_0000,
            0xffff_0000,
        ],
        DataType::I64 | DataType::U64 => &[
            0,
            1,
            u64::MAX,
            0x7fff_ffff_ffff_ffff,
            1 << 63,
            (1 << 63) + 1,
            0x0000_0001_0000_0000,
            0xffff_ffff_0000_0000,
            0x0020_0000_0000_0001,
        ],
        DataType::F64 => &[
            0x7ff8_0000_0000_0000,
            0x7ff0_0000_0000_0001,
            0xfff8_0000_1234_5678,
            0x7fff_ffff_ffff_ffff,
            0x7ff0_0000_0000_0000,
            0xfff0_0000_0000_0000,
            0,
            1 << 63,
            1,
            (1 << 63) + 1,
            0x000f_ffff_ffff_ffff,
            0x0010_0000_0000_0000,
            0x7fef_ffff_ffff_ffff,
            0xffef_ffff_ffff_ffff,
            0x3ff0_0000_0000_0000,
            0xbff0_0000_0000_0000,
            0x3ca0_0000_0000_0000,
        ],
    }
}

/// `n` elements of `dt`: runs of the profiles of `values` (magnitudes from 2^-130 to
/// 3e38, NaN, infinities; saturated or rounded for integers), special values, and random
/// bit patterns (every class, every NaN payload).
fn operands(rng: &mut ChaCha8Rng, n: usize, dt: DataType) -> Vec<u8> {
    let s = dt.size();
    let mut out = values(rng, n, dt);
    let specials = special_bits(dt);
    for e in out.chunks_mut(s) {
        let bits = match rng.random_range(0..8u64) {
            0 | 1 => specials[rng.random_range(0..specials.len() as u64) as usize],
            2 => rng.next_u64(),
            _ => continue,
        };
        e.copy_from_slice(&bits.to_le_bytes()[..s]);
    }
    out
}

fn is_nan(dt: DataType, e: &[u8]) -> bool {
    match dt {
        DataType::F32 => f32::from_le_bytes([e[0], e[1], e[2], e[3]]).is_nan(),
        DataType::F16 => u16::from_le_bytes([e[0], e[1]]) & 0x7fff > 0x7c00,
        DataType::BF16 => u16::from_le_bytes([e[0], e[1]]) & 0x7fff > 0x7f80,
        DataType::F64 => f64::from_le_bytes(e[..8].try_into().unwrap()).is_nan(),
        _ => false,
    }
}

/// Compare element by element, bit for bit, except that any NaN equals any NaN (the GPU
/// writes its own NaN, the CPU propagates payloads). Returns how many NaN pairs differed
/// in their bits.
fn compare(what: &str, dt: DataType, got: &[u8], want: &[u8]) -> usize {
    let s = dt.size();
    let mut nan_payloads = 0;
    let mut bad = Vec::new();
    for (i, (g, w)) in got.chunks(s).zip(want.chunks(s)).enumerate() {
        if g == w {
            continue;
        }
        if is_nan(dt, g) && is_nan(dt, w) {
            nan_payloads += 1;
        } else {
            bad.push(i);
        }
    }
    if let Some(&i) = bad.first() {
        let hex = |b: &[u8]| {
            b.iter()
                .rev()
                .map(|x| format!("{x:02x}"))
                .collect::<String>()
        };
        panic!(
            "{what}: {} of {} elements differ from the CPU reference, first at element {i}: cpu {} emulated {}",
            bad.len(),
            want.len() / s,
            hex(&want[i * s..(i + 1) * s]),
            hex(&got[i * s..(i + 1) * s])
        );
    }
    nan_payloads
}

/// The launch of the element-wise kernels (strata::device::elementwise_grid), with fewer
/// threads per block where `threads` says so: the kernels are grid-stride loops, so any
/// geometry covers the buffer, and the emulator runs one OS thread per CUDA thread.
fn elementwise_launch(count: usize, dt: DataType, threads: u32) -> (u32, u32) {
    let (grid, full) = strata::device::elementwise_grid(count, dt);
    (grid, threads.min(full))
}

#[test]
fn emulated_reductions_match_the_cpu_reference() {
    let Some(mut emu) = build_emulator("emulated reductions", "reduce") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0x0005_EED5_0F_CAFE);
    let (mut cases, mut elements, mut nan_payloads) = (0usize, 0usize, 0usize);

    // acc[i] = op(acc[i], src[i]): every type, every op, odd counts, every geometry shape
    // (one thread, fewer threads than elements, the full 256-thread blocks).
    for dt in DataType::ALL {
        let s = dt.size();
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
            for (count, threads) in [
                (0usize, 64u32),
                (1, 64),
                (7, 1),
                (7, 64),
                (1000, 64),
                (1000, 256),
                (4099, 64),
                (4099, 33),
            ] {
                let acc = operands(&mut rng, count, dt);
                let src = operands(&mut rng, count, dt);
                let mut want = acc.clone();
                reduce_into(&mut want, &src, dt, op);
                let l = elementwise_launch(count, dt, threads);
                let (in_off, out_off) = (
                    [0, 16, s][rng.random_range(0..3u64) as usize],
                    [0, 16, s][rng.random_range(0..3u64) as usize],
                );
                let kernel = kernels_gpu::reduce_kernel_name(dt, Some(op));
                let what =
                    format!("{kernel} count {count} launch {l:?} offsets {in_off}/{out_off}");
                let got = emu.run(
                    &kernel,
                    l,
                    &[count as u64],
                    &src,
                    in_off,
                    out_off,
                    Some(&acc),
                    acc.len(),
                    &what,
                );
                nan_payloads += compare(&what, dt, &got, &want);
                cases += 1;
                elements += count;
            }
        }
    }

    // buf[i] /= n (Avg), every type, several n: the single rounding from f64.
    for dt in DataType::ALL {
        let s = dt.size();
        for n in [1usize, 3, 7, 8, 1024] {
            for (count, threads) in [(1usize, 64u32), (1000, 64), (4099, 64)] {
                let buf = operands(&mut rng, count, dt);
                let mut want = buf.clone();
                finish_avg(&mut want, dt, n);
                let l = elementwise_launch(count, dt, threads);
                let out_off = [0, 16, s][rng.random_range(0..3u64) as usize];
                let kernel = kernels_gpu::reduce_kernel_name(dt, None);
                let what = format!("{kernel} n {n} count {count} launch {l:?} offset {out_off}");
                let got = emu.run(
                    &kernel,
                    l,
                    &[count as u64, (n as f64).to_bits()],
                    &[],
                    0,
                    out_off,
                    Some(&buf),
                    buf.len(),
                    &what,
                );
                nan_payloads += compare(&what, dt, &got, &want);
                cases += 1;
                elements += count;
            }
        }
    }
    eprintln!(
        "emulated reductions: {cases} launches, {elements} elements, all equal to the CPU reference bit for bit ({nan_payloads} NaNs with other payloads)"
    );
    let _ = std::fs::remove_dir_all(&emu.dir);
}
