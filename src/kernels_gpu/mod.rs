//! GPU twins of the CPU reference kernels in [`crate::kernels`]: block quantization,
//! dequantization, swizzled quantization, fused dequantize-reduce-quantize and
//! dequantize-reduce (ZeRO++ appendix F.2: 16-byte vectorized accesses, one pass over
//! memory, reordering and the qgZ middle hop fused into one kernel each).
//!
//! The kernel bodies are written once in `kernels-cuda/strata_quant.cuh` and expanded
//! by two thin entry files: `kernels-cuda/strata_quant.cu` (compiled at run time by NVRTC
//! through cudarc, feature `cuda`, so the crate builds without a CUDA toolkit) and
//! `kernels-hip/strata_quant.hip` (built by hipcc into code objects for gfx90a and
//! gfx940; loading them belongs to the `rocm` transport). Both follow
//! `docs/quantization.md` bit for bit: no FMA contraction (`--fmad=false`,
//! `-ffp-contract=off`), IEEE division, no flush to zero, sender-order f32 sums,
//! canonical NaNs.
//!
//! This module always exists: without feature `cuda` it exposes the embedded sources,
//! the kernel names, the launch geometry and a [`compile_cuda_ptx`] that returns
//! [`Error::NotCompiled`](crate::Error::NotCompiled). With it, [`GpuQuant`] holds the loaded module and launches the
//! kernels on cudarc device buffers.

use crate::error::Result;

pub mod cache;
pub mod call;
pub mod launch;
pub mod plan;
pub use plan::{group_size, Geometry, Launch};

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub use cuda::GpuQuant;
#[cfg(feature = "cuda")]
pub(crate) mod nvrtc;

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

/// What a kernel does (one extern "C" entry per op, element type and bit width).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelOp {
    /// Swizzled (and plain) quantization: elements in, packed slices out.
    Quantize,
    /// Dequantization (k = 1) and dequantize-reduce: packed slices in, elements out.
    DequantReduce,
    /// Dequantization of one sender without a division (k = 1, Sum; the arguments of
    /// `DequantReduce`, more elements a lane).
    Dequantize,
    /// Fused dequantize-reduce-quantize: packed slices in and out.
    DequantReduceQuant,
}

/// Every kernel of the sources, as `(op, dtype, bits)`; `dtype` is `None` for the fused
/// packed-to-packed kernel.
pub fn kernels() -> Vec<(KernelOp, Option<crate::DataType>, u32)> {
    use crate::DataType::{BF16, F16, F32};
    let mut v = Vec::new();
    for dt in [F32, F16, BF16] {
        for bits in [8, 4] {
            v.push((KernelOp::Quantize, Some(dt), bits));
            v.push((KernelOp::Dequantize, Some(dt), bits));
            v.push((KernelOp::DequantReduce, Some(dt), bits));
        }
    }
    for bits in [8, 4] {
        v.push((KernelOp::DequantReduceQuant, None, bits));
    }
    v
}

/// The symbol of a kernel, e.g. `strata_quantize_bf16_q4`.
pub fn kernel_name(op: KernelOp, dtype: Option<crate::DataType>, bits: u32) -> String {
    let dt = dtype.map(|d| d.name()).unwrap_or("");
    match op {
        KernelOp::Quantize => format!("strata_quantize_{dt}_q{bits}"),
        KernelOp::DequantReduce => format!("strata_dequant_reduce_{dt}_q{bits}"),
        KernelOp::Dequantize => format!("strata_dequantize_{dt}_q{bits}"),
        KernelOp::DequantReduceQuant => format!("strata_dequant_reduce_quant_q{bits}"),
    }
}

/// The dequantizing kernel: `strata_dequantize_*` for one sender without a division
/// (`one`), `strata_dequant_reduce_*` otherwise (same arguments).
pub fn dequant_kernel_name(dtype: crate::DataType, bits: u32, one: bool) -> String {
    let op = if one {
        KernelOp::Dequantize
    } else {
        KernelOp::DequantReduce
    };
    kernel_name(op, Some(dtype), bits)
}

/// Every kernel symbol (20: 3 element types x 2 widths x 3 ops, plus 2 fused).
pub fn kernel_names() -> Vec<String> {
    kernels()
        .into_iter()
        .map(|(op, dt, bits)| kernel_name(op, dt, bits))
        .collect()
}

/// The reduction kernels: `strata_reduce_{dtype}_{sum|prod|max|min}(acc, src, n)` and
/// `strata_divide_{dtype}(buf, count, n as f64)` for every [`crate::DataType`].
pub fn reduce_kernel_name(dtype: crate::DataType, op: Option<crate::ReduceOp>) -> String {
    use crate::ReduceOp::*;
    match op {
        None => format!("strata_divide_{}", dtype.name()),
        Some(Sum | Avg) => format!("strata_reduce_{}_sum", dtype.name()),
        Some(o) => format!("strata_reduce_{}_{}", dtype.name(), o.name()),
    }
}

/// Every reduction kernel symbol (10 element types x (4 ops + divide)).
pub fn reduce_kernel_names() -> Vec<String> {
    use crate::ReduceOp::*;
    crate::DataType::ALL
        .into_iter()
        .flat_map(|dt| {
            [Some(Sum), Some(Prod), Some(Max), Some(Min), None]
                .into_iter()
                .map(move |op| reduce_kernel_name(dt, op))
        })
        .collect()
}

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

/// Compile every kernel of [`CUDA_SOURCE`] to PTX for `arch` (e.g. `compute_80`) with
/// NVRTC, loaded at run time by strata (`STRATA_NVRTC_LIB`, else `libnvrtc.so.13`,
/// `.so.12`, `.so.11.2`, `libnvrtc.so` on the loader path; e.g. the
/// `nvidia/cuda_nvrtc/lib` of the PyPI wheel on `LD_LIBRARY_PATH`, as
/// `scripts/gpu-toolchains` prints).
///
/// Errors, never panics: [`Error::NotCompiled`](crate::Error::NotCompiled) without feature `cuda`;
/// [`Error::System`](crate::Error::System) naming the library candidates tried when libnvrtc is missing, or the
/// include directories tried when `cuda_fp16.h` is missing, or NVRTC's log when the
/// compilation fails.
pub fn compile_cuda_ptx(arch: &str) -> Result<String> {
    compile_cuda_ptx_in(arch, cache::default_dir().as_deref())
}

/// [`compile_cuda_ptx`] with the compiled-kernel cache in `cache_dir` (`None`: no cache;
/// [`cache`]).
pub fn compile_cuda_ptx_in(arch: &str, cache_dir: Option<&std::path::Path>) -> Result<String> {
    if !arch.starts_with("compute_") {
        return Err(crate::error::Error::InvalidArgument(format!(
            "PTX is compiled for a virtual architecture such as compute_80, got {arch:?}"
        )));
    }
    #[cfg(feature = "cuda")]
    {
        match nvrtc::compile(arch, cache_dir)? {
            nvrtc::Output::Ptx(p) => Ok(p),
            nvrtc::Output::Cubin(_) => Err(crate::error::Error::Internal(
                "NVRTC returned a CUBIN for a PTX request".into(),
            )),
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (arch, cache_dir);
        Err(crate::error::Error::NotCompiled(
            "compiling the CUDA kernels needs the `cuda` feature (cudarc + NVRTC)".into(),
        ))
    }
}

/// Compile every kernel of [`CUDA_SOURCE`] to a CUBIN for the real architecture `arch`
/// (e.g. `sm_90`): what the CUDA device loads first, so a driver older than the NVRTC
/// (which would reject its PTX version) still runs the kernels, and nothing is
/// JIT-compiled at load. Errors as [`compile_cuda_ptx`], and `System` for an NVRTC
/// without `nvrtcGetCUBIN` (before CUDA 11.1) or one that does not know `arch`.
pub fn compile_cuda_cubin(arch: &str) -> Result<Vec<u8>> {
    compile_cuda_cubin_in(arch, cache::default_dir().as_deref())
}

/// [`compile_cuda_cubin`] with the compiled-kernel cache in `cache_dir` (`None`: no
/// cache; [`cache`]).
pub fn compile_cuda_cubin_in(arch: &str, cache_dir: Option<&std::path::Path>) -> Result<Vec<u8>> {
    if !arch.starts_with("sm_") {
        return Err(crate::error::Error::InvalidArgument(format!(
            "a CUBIN is compiled for a real architecture such as sm_90, got {arch:?}"
        )));
    }
    #[cfg(feature = "cuda")]
    {
        match nvrtc::compile(arch, cache_dir)? {
            nvrtc::Output::Cubin(c) => Ok(c),
            nvrtc::Output::Ptx(_) => Err(crate::error::Error::Internal(
                "NVRTC returned PTX for a CUBIN request".into(),
            )),
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = cache_dir;
        Err(crate::error::Error::NotCompiled(
            "compiling the CUDA kernels needs the `cuda` feature (cudarc + NVRTC)".into(),
        ))
    }
}

/// The NVRTC that [`compile_cuda_ptx`] uses: `(library name, major, minor)`. Errors as
/// [`compile_cuda_ptx`] for a missing library or feature.
pub fn nvrtc_version() -> Result<(String, i32, i32)> {
    #[cfg(feature = "cuda")]
    {
        nvrtc::nvrtc_version()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(crate::error::Error::NotCompiled(
            "NVRTC needs the `cuda` feature".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_name_every_kernel_once() {
        let names = kernel_names();
        assert_eq!(names.len(), 20);
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 20);
        assert_eq!(
            dequant_kernel_name(crate::DataType::BF16, 4, true),
            "strata_dequantize_bf16_q4"
        );
        assert_eq!(
            dequant_kernel_name(crate::DataType::F32, 8, false),
            "strata_dequant_reduce_f32_q8"
        );
        // The names are built by token pasting in the header's instantiation macro.
        assert!(CUDA_HEADER.contains("strata_quantize_##DTN##_q##BITS"));
        assert!(CUDA_HEADER.contains("strata_dequant_reduce_quant_q8"));
        assert!(CUDA_SOURCE.starts_with(CUDA_HEADER));
        assert!(CUDA_SOURCE.contains(REDUCE_HEADER));
        assert!(CUDA_ENTRY.contains("STRATA_QUANT_KERNELS()"));
        assert!(CUDA_ENTRY.contains("STRATA_REDUCE_KERNELS()"));
        let reduce = reduce_kernel_names();
        assert_eq!(reduce.len(), 50);
        assert!(REDUCE_HEADER.contains("strata_reduce_##DTN##_##OPN"));
        assert!(REDUCE_HEADER.contains("strata_divide_##DTN"));
    }

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

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn compile_without_feature_is_not_compiled() {
        assert!(matches!(
            compile_cuda_ptx("compute_80"),
            Err(crate::error::Error::NotCompiled(_))
        ));
    }
}
