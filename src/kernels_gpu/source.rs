//! The kernel sources embedded in the crate (one portable header, two thin entry files),
//! the compiler options and architectures they are built with, and where the CUDA
//! half-precision headers are looked for.

#![forbid(unsafe_code)]

/// The shared portable header with every kernel body (CUDA and HIP).
pub const CUDA_HEADER: &str = include_str!("../../kernels-cuda/strata_quant.cuh");
/// Element-wise reductions and the `Avg` division (device paths of the algorithms),
/// built on [`CUDA_HEADER`]'s platform layer.
pub const REDUCE_HEADER: &str = include_str!("../../kernels-cuda/strata_reduce.cuh");
/// The CUDA entry file (expands the kernels of [`CUDA_HEADER`] and [`REDUCE_HEADER`]).
pub const CUDA_ENTRY: &str = include_str!("../../kernels-cuda/strata_quant.cu");
/// The HIP entry file (includes `../kernels-cuda/strata_quant.cuh`; no kernel code).
pub const HIP_ENTRY: &str = include_str!("../../kernels-hip/strata_quant.hip");
/// The whole translation unit NVRTC compiles: the headers, then the entry file (whose
/// `#include`s of the headers are skipped by their guards), so NVRTC needs an include
/// path only for `cuda_fp16.h` / `cuda_bf16.h`.
pub const CUDA_SOURCE: &str = concat!(
    include_str!("../../kernels-cuda/strata_quant.cuh"),
    "\n",
    include_str!("../../kernels-cuda/strata_reduce.cuh"),
    "\n",
    include_str!("../../kernels-cuda/strata_quant.cu")
);

/// NVRTC options every build uses (the arch and include paths are added per call):
/// contraction off and IEEE arithmetic, as `docs/quantization.md` requires.
pub const NVRTC_OPTIONS: [&str; 6] = [
    "--fmad=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--ftz=false",
    "-default-device",
    "--std=c++17",
];
/// Virtual architectures the CI compiles for (A100 and H100 class).
pub const CUDA_ARCHS: [&str; 2] = ["compute_80", "compute_90"];
/// hipcc options (plus `--offload-arch=ARCH -o FILE`): code objects, contraction off.
pub const HIPCC_OPTIONS: [&str; 3] = ["--genco", "-O3", "-ffp-contract=off"];
/// AMD targets: MI250X and the MI300 target Debian's hipcc 5.2 knows (it rejects gfx942).
pub const HIP_ARCHS: [&str; 3] = ["gfx90a", "gfx940", "gfx942"];

/// Directories searched for `cuda_fp16.h` / `cuda_bf16.h`, in order: the entries of
/// `STRATA_CUDA_INCLUDE` (`:`-separated), `$CUDA_HOME/include`, `$CUDA_PATH/include`,
/// `/usr/local/cuda/include`. Returns the candidates that hold `cuda_fp16.h` and the
/// whole list tried (for error messages).
pub fn cuda_include_dirs() -> (Vec<std::path::PathBuf>, Vec<std::path::PathBuf>) {
    use std::path::PathBuf;
    let mut tried: Vec<PathBuf> = Vec::new();
    if let Ok(v) = std::env::var("STRATA_CUDA_INCLUDE") {
        tried.extend(v.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(v) = std::env::var(var) {
            if !v.is_empty() {
                tried.push(PathBuf::from(v).join("include"));
            }
        }
    }
    tried.push(PathBuf::from("/usr/local/cuda/include"));
    let found = tried
        .iter()
        .filter(|d| d.join("cuda_fp16.h").is_file())
        .cloned()
        .collect();
    (found, tried)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hip_entry_has_no_kernel_code() {
        assert!(HIP_ENTRY.contains("#include \"../kernels-cuda/strata_quant.cuh\""));
        assert!(HIP_ENTRY.contains("#include \"../kernels-cuda/strata_reduce.cuh\""));
        assert!(HIP_ENTRY.contains("STRATA_QUANT_KERNELS()"));
        assert!(HIP_ENTRY.contains("STRATA_REDUCE_KERNELS()"));
        for word in ["__global__", "__device__", "template", "threadIdx"] {
            assert!(
                !HIP_ENTRY.contains(word),
                "kernels-hip/ must not copy kernel code: {word}"
            );
            assert!(
                !CUDA_ENTRY.contains(word),
                "the .cu entry must stay thin: {word}"
            );
        }
    }
}
