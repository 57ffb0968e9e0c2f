// HIP entry point of strata's quantization and reduction kernels: the same bodies as the CUDA ones
// (kernels-cuda/strata_quant.cuh), built with
//   hipcc --genco -O3 -ffp-contract=off --offload-arch=gfx90a (MI250X) / gfx940 (MI300)
// into code objects. No kernel code lives here.
#include "../kernels-cuda/strata_quant.cuh"
#include "../kernels-cuda/strata_reduce.cuh"

STRATA_QUANT_KERNELS()
STRATA_REDUCE_KERNELS()
