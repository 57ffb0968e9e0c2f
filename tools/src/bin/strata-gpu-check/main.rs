//! strata-gpu-check: runs every CUDA quantization kernel against the CPU reference
//! (`strata::kernels`) and times it against a device-to-device copy of the same bytes.
//!
//! Correctness: random inputs (mixed magnitudes, zero / tiny / subnormal blocks, NaN and
//! Inf, exact rounding ties, raw random packed bytes) across sizes, block sizes, bit
//! widths, element types, swizzle shapes and sender counts; device outputs are written
//! into poisoned buffers with guard bytes, at misaligned offsets too, and must equal the
//! CPU bytes exactly (docs/quantization.md lists no exception); guards must stay intact.
//!
//! Timing: CUDA events around each launch after warm-up, the median of `-n` runs (the
//! launches queued behind large copies, so the host's launch time is not counted), beside
//! a device-to-device copy of the kernel's input bytes in the same run; GB/s count bytes
//! read + written. Per kernel: the roofline (its bytes at the copy's rate) and, where
//! `python3` imports torch with CUDA, the same kernel in PyTorch under `torch.compile`
//! (scripts/kernels-compiled.py, same run), then a summary line `worst: R of roofline
//! (KERNEL); slowest vs torch.compile: C (KERNEL)`; then the launch-bound end, 64 Ki to
//! 4 Mi elements. `--tune` re-runs this executable with `--bench-only` once per
//! `STRATA_KERNEL_GEOMETRY=E,T` and prints the best geometry (docs/gpu.md).
//!
//! Run by `scripts/gpu-check` on a GPU machine (prebuilt: `cargo build --release
//! -p strata-tools --features cuda --bin strata-gpu-check`). Exit status 1 when any
//! check fails.
#![forbid(unsafe_code)]
mod bench;
mod check;
mod child;
mod compiled;
mod correctness;
mod inputs;
mod opts;
mod tune;

use bench::{bench, bench_small, Timer};
use check::Checker;
use compiled::{compiled, print_main, print_small};
use correctness::correctness;
use opts::Opts;
use rand::SeedableRng as _;
use rand_chacha::ChaCha8Rng;
use strata::device::cuda::open_device;
use strata::kernels_gpu::{self, GpuQuant};
use strata::Result;
use tune::tune;

const HELP: &str = "strata-gpu-check [--quick] [--no-bench] [--bench-only] [--tune] [--no-compiled]
                 [--compiled-timeout S] [-v] [-n ITERS] [-w WARMUP] [--seed S] [--bench-elems N]
  (none)         every kernel against the CPU reference, then the bandwidth table (strata,
                 torch.compile where torch with CUDA imports, the roofline of a copy) and
                 the small sizes
  --quick        a shorter correctness sweep, no bench; --no-bench: no bench
  --bench-only   the main bandwidth table only (no correctness, small sizes, compiled)
  --tune         the main table once per STRATA_KERNEL_GEOMETRY=E,T (E 16/32/64, T
                 128/256/512; child processes of this executable), the best geometry
  --no-compiled  no torch.compile column; --compiled-timeout S (default 180) for it
  STRATA_KERNELS_COMPILED=path: the script (default scripts/kernels-compiled.py)";

fn main() {
    let mut o = Opts {
        quick: false,
        no_bench: false,
        bench_only: false,
        tune: false,
        no_compiled: false,
        compiled_timeout: 180,
        verbose: false,
        iters: 50,
        warm: 5,
        seed: 0x5EED,
        bench_n: 1 << 26,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> usize {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{what} needs a number"))
        };
        match a.as_str() {
            "--quick" => o.quick = true,
            "--no-bench" => o.no_bench = true,
            "--bench-only" => o.bench_only = true,
            "--tune" => o.tune = true,
            "--no-compiled" => o.no_compiled = true,
            "--compiled-timeout" => o.compiled_timeout = num("--compiled-timeout").max(1) as u64,
            "-v" | "--verbose" => o.verbose = true,
            "-n" => o.iters = num("-n").max(1),
            "-w" => o.warm = num("-w"),
            "--seed" => o.seed = num("--seed") as u64,
            "--bench-elems" => o.bench_n = num("--bench-elems").max(1024),
            "-h" | "--help" => {
                println!("{HELP}");
                return;
            }
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    if o.tune {
        std::process::exit(if tune(&o) { 0 } else { 1 });
    }
    match run(&o) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("strata-gpu-check: {e}");
            std::process::exit(1);
        }
    }
}

fn run(o: &Opts) -> Result<bool> {
    let ctx = open_device(0)?;
    let name = ctx.name().unwrap_or_else(|_| "?".into());
    let t0 = std::time::Instant::now();
    let gpu = GpuQuant::new(&ctx)?;
    println!(
        "device: {name}; kernels compiled by NVRTC for {} in {:.2} s ({} kernels)",
        gpu.arch(),
        t0.elapsed().as_secs_f64(),
        kernels_gpu::kernel_names().len()
    );
    let seed = o.seed;
    // The tools' seeded generator: the same inputs for the same --seed everywhere.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut ck = Checker {
        stream: ctx.default_stream(),
        gpu,
        tally: Default::default(),
        verbose: o.verbose,
    };
    let mut ok = true;
    if !o.bench_only {
        let t0 = std::time::Instant::now();
        correctness(&mut ck, &mut rng, o.quick)?;
        println!(
            "\ncorrectness against the CPU reference ({:.1} s, seed {seed:#x}):",
            t0.elapsed().as_secs_f64()
        );
        println!(
            "{:<24} {:>7} {:>7} {:>14}",
            "kernel", "cases", "failed", "max |diff|"
        );
        for (k, t) in &ck.tally {
            println!(
                "{:<24} {:>7} {:>7} {:>14e}",
                k, t.cases, t.failed, t.max_diff
            );
            ok &= t.failed == 0;
        }
        println!(
            "{}",
            if ok {
                "all outputs bitwise equal to the CPU reference"
            } else {
                "MISMATCHES: see above"
            }
        );
        if o.no_bench || o.quick {
            return Ok(ok);
        }
    }
    let (iters, warm) = (o.iters, o.warm);
    let mut tm = Timer::new(&ctx, warm, iters)?;
    let rows = bench(&ctx, &ck.gpu, &mut rng, o.bench_n, &mut tm)?;
    let small = if o.bench_only {
        Vec::new()
    } else {
        bench_small(&ctx, &ck.gpu, &mut rng, &mut tm)?
    };
    drop(tm); // its buffers: torch.compile's process has the GPU next
    let (comp, note) = if o.bench_only {
        (Default::default(), "not run (--bench-only)".to_string())
    } else {
        compiled(o)
    };
    println!(
        "\nbandwidth ({} elements; median of {iters} runs after {warm} warm-up, CUDA events, queued; GB/s = (read + written) / time; copy GB/s: a device-to-device copy of the kernel's input (a dequantizer's output) in the same run; roofline us = (read + written) / copy GB/s; compiled: the kernel in PyTorch under torch.compile, same bytes, same run ({note}); compiled/strata > 1: strata faster):",
        o.bench_n
    );
    print_main(&rows, &comp, &note);
    if !small.is_empty() {
        println!("\nsmall sizes (int8, block 2048; us; the same timing and copy):");
        print_small(&small, &comp);
    }
    Ok(ok)
}
