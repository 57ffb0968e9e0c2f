// CUDA entry point of strata's quantization kernels: compiled at run time by NVRTC
// (src/kernels_gpu/), with --fmad=false. The bodies live in strata_quant.cuh, shared
// with kernels-hip/strata_quant.hip; src/kernels_gpu/ prepends the header to this file,
// so NVRTC needs no include path for it (only for cuda_fp16.h / cuda_bf16.h).
#ifndef STRATA_QUANT_CUH
#include "strata_quant.cuh"
#endif
#ifndef STRATA_REDUCE_CUH
#include "strata_reduce.cuh"
#endif

STRATA_QUANT_KERNELS()
STRATA_REDUCE_KERNELS()
