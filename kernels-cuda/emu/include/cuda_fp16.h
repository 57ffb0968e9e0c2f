// Host emulation of the few CUDA device facilities strata_quant.cuh uses, so that its
// kernels run on a CPU (one OS thread per CUDA thread, one thread block at a time) and
// can be compared with the CPU reference without a GPU (tests/gpu_kernels_compile.rs).
// Not a CUDA implementation: only what the header needs, with CUDA's semantics.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static

struct strata_emu_dim3 {
  unsigned int x, y, z;
};
extern thread_local strata_emu_dim3 threadIdx, blockIdx;
extern strata_emu_dim3 blockDim, gridDim;
extern std::barrier<>* strata_emu_barrier;
extern float strata_emu_shfl[1024];

struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};

inline void __syncthreads() { strata_emu_barrier->arrive_and_wait(); }

// Every thread of the block calls the shuffles the same number of times (the kernels
// guarantee it), so a block-wide exchange has the warp's semantics.
inline float __shfl_xor_sync(unsigned int, float v, int m) {
  const unsigned int t = threadIdx.x;
  strata_emu_shfl[t] = v;
  strata_emu_barrier->arrive_and_wait();
  const float r = strata_emu_shfl[t ^ (unsigned int)m];
  strata_emu_barrier->arrive_and_wait();
  return r;
}

inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  return u;
}

struct __half {
  unsigned short x;
};
inline __half __ushort_as_half(unsigned short h) { return __half{h}; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline float __half2float(__half h) {
  _Float16 v;
  std::memcpy(&v, &h.x, 2);
  return (float)v;  // exact
}
inline __half __float2half_rn(float f) {
  _Float16 v = (_Float16)f;  // IEEE conversion: round to nearest even
  __half h;
  std::memcpy(&h.x, &v, 2);
  return h;
}

struct __nv_bfloat16 {
  unsigned short x;
};
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.x; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  // cvt.rn.bf16.f32: round to nearest even (NaN handled by the caller).
  unsigned int u = __float_as_uint(f);
  return __nv_bfloat16{(unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
