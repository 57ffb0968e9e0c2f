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

pub mod cache;
pub mod call;
mod compile;
pub mod launch;
mod names;
pub mod plan;
mod source;
pub use plan::{group_size, Geometry, Launch};

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub use cuda::GpuQuant;
#[cfg(feature = "cuda")]
pub(crate) mod nvrtc;
pub use compile::{
    compile_cuda_cubin, compile_cuda_cubin_in, compile_cuda_ptx, compile_cuda_ptx_in, nvrtc_version,
};
pub use names::{
    dequant_kernel_name, kernel_name, kernel_names, kernels, reduce_kernel_name,
    reduce_kernel_names, KernelOp,
};
pub use source::{
    cuda_include_dirs, CUDA_ARCHS, CUDA_ENTRY, CUDA_HEADER, CUDA_SOURCE, HIPCC_OPTIONS, HIP_ARCHS,
    HIP_ENTRY, NVRTC_OPTIONS, REDUCE_HEADER,
};
