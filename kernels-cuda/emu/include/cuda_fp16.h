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
#define __launch_bounds__(...)
#define __shared__ static

struct strata_emu_dim3 {
  unsigned int x, y, z;
};
extern thread_local strata_emu_dim3 threadIdx, blockIdx;
extern strata_emu_dim3 blockDim, gridDim;
extern std::barrier<>* strata_emu_barrier;
extern float strata_emu_shfl[1024];
extern unsigned int strata_emu_shfl_u[1024];

struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned int x, y;
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

inline unsigned int __shfl_xor_sync(unsigned int, unsigned int v, int m) {
  const unsigned int t = threadIdx.x;
  strata_emu_shfl_u[t] = v;
  strata_emu_barrier->arrive_and_wait();
  const unsigned int r = strata_emu_shfl_u[t ^ (unsigned int)m];
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

// Device runtime functions (built into NVRTC, no header), as the reduction kernels use
// them. __fadd_rn / __fmul_rn are single IEEE f32 operations rounded to nearest even,
// never contracted into an FMA: the emulator must be compiled with -ffp-contract=off
// (tests/gpu_kernels_compile.rs does), and the host must not flush subnormals (x86-64
// SSE does not by default). A NaN result is the canonical NaN of the PTX instructions
// add.rn.f32 / mul.rn.f32 (0x7FFFFFFF), whatever the operands' payloads.
inline float strata_emu_ptx_nan(float r) { return r != r ? __uint_as_float(0x7fffffffu) : r; }
inline float __fadd_rn(float a, float b) { return strata_emu_ptx_nan(a + b); }
inline float __fmul_rn(float a, float b) { return strata_emu_ptx_nan(a * b); }
// add.rn.f64 / mul.rn.f64 likewise, their NaN the canonical 0x7FFFFFFFFFFFFFFF.
inline double strata_emu_ptx_nan(double r) {
  if (r == r) return r;
  unsigned long long u = 0x7fffffffffffffffull;
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}
inline double __dadd_rn(double a, double b) { return strata_emu_ptx_nan(a + b); }
inline double __dmul_rn(double a, double b) { return strata_emu_ptx_nan(a * b); }
// cvt.rn.f32.f64: round to nearest even, subnormals kept, overflow to infinity.
inline float __double2float_rn(double v) { return (float)v; }
// CUDA's math functions live in the global namespace, for float and double.
using std::fabs;
using std::isinf;
using std::isnan;
using std::round;
using std::rint;

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
