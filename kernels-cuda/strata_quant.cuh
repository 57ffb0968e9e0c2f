// strata_quant.cuh: the block-quantization kernels of strata, written once for CUDA
// (NVRTC, kernels-cuda/strata_quant.cu) and HIP (hipcc, kernels-hip/strata_quant.hip).
//
// The contract is docs/quantization.md; the oracle is the CPU reference in src/kernels/.
// Every kernel here must equal it bit for bit, under these rules:
//   * every product and sum is a separate IEEE f32 operation: compile with NVRTC
//     `--fmad=false` (and the default --prec-div=true --ftz=false) or hipcc
//     `-ffp-contract=off`; never with fast math;
//   * scale = amax / qmax and inv = qmax / amax are IEEE divisions; q = clamp(rint(x*inv));
//   * reductions over senders run in sender order, left to right, in f32;
//   * a tiny block (amax < 2^-64) is prescaled by 2^64 (exact) so qmax / amax is finite;
//   * every NaN written is canonical: f32 0x7FC00000, f16 0x7E00, bf16 0x7FC0.
// (The fused ops in hipcc's code objects, v_div_scale/v_fma/v_div_fmas and v_mad_u64,
// are its IEEE f32 division and 64-bit integer division sequences, not contraction.)
// kernels-cuda/emu/ runs these kernels on a CPU for tests/gpu_kernels_compile.rs.
//
// Wire format of one packed slice of n elements (scales first):
//   [nb f32 scales, little-endian][codes: int8 n bytes | int4 ceil(n/2) bytes,
//    element 2i in the low nibble of byte i, 2i+1 in the high nibble]
//
// Kernel shape (ZeRO++ appendix F.2: vectorized accesses, one pass, fusion):
//   * one *group* of `gs` threads (a power of two, 1..512, chosen by the host from the
//     block size) quantizes one quantization block; groups of <= one warp reduce amax
//     with xor shuffles, larger groups add one shared-memory step;
//   * the group's lanes take *vectors* of EPV elements whose input is 16 bytes (f32: 4,
//     f16/bf16: 8, packed int8 codes: 16, int4: 32); lane t holds vectors t, t + gs,
//     t + 2gs, ... (V = STRATA_LANE_ELEMS / EPV of them, 64 elements by default) in
//     registers, so each load instruction of a warp reads one contiguous run of 16-byte
//     vectors and all of a lane's loads are issued before the block's amax reduction;
//     codes go out as one 2/4/8/16-byte store per vector, contiguous across the warp;
//   * blocks of up to gs * V * EPV elements (the host sizes gs for it: 2048 elements
//     take one warp) are read from memory once; larger blocks re-read what does not fit
//     (from L2, usually); a vector that is partial or not 16-byte aligned takes the same
//     arithmetic element by element;
//   * a grid-stride loop over groups bounds the grid; the host never launches an empty
//     grid for a non-empty problem, and rejects invalid specs before launching.
//
// Kernels (extern "C", one per element type and bit width):
//   strata_quantize_{f32,f16,bf16}_{q8,q4}        swizzled (and plain) quantization
//   strata_dequantize_{f32,f16,bf16}_{q8,q4}      dequantize (k = 1, Sum)
//   strata_dequant_reduce_{f32,f16,bf16}_{q8,q4}  dequantize-reduce (any k, Sum or Avg)
//   strata_dequant_reduce_quant_{q8,q4}           the fused qgZ middle hop

#ifndef STRATA_QUANT_CUH
#define STRATA_QUANT_CUH

// ---------------------------------------------------------------------------------
// Platform layer: the only part that differs between CUDA and HIP.
// ---------------------------------------------------------------------------------
#if defined(__HIPCC__) || defined(__HIP__) || defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#define STRATA_HIP 1
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define STRATA_WARP __AMDGCN_WAVEFRONT_SIZE
#else
#define STRATA_WARP 64
#endif
#define STRATA_SHFL_XOR(v, m) __shfl_xor((v), (int)(m))
#else
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define STRATA_CUDA 1
#define STRATA_WARP 32
#define STRATA_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (int)(m))
#endif

#define STRATA_DEV __device__ __forceinline__
// Largest thread block (and group): 512 leaves 128 registers per thread on NVIDIA and
// 128 VGPRs + AGPRs on gfx90a/gfx940, so the 32 cached values never spill.
#define STRATA_MAX_THREADS 512

typedef unsigned long long strata_u64;
typedef unsigned int strata_u32;
typedef unsigned char strata_u8;

// Element types, matching strata::DataType's wire encodings.
#define STRATA_F32 0
#define STRATA_F16 1
#define STRATA_BF16 2

STRATA_DEV float strata_f16_to_f32(unsigned short h) {
  return __half2float(__ushort_as_half(h));
}

// Canonical quiet NaNs (docs/quantization.md): the only NaNs a kernel writes.
#define STRATA_NAN_F32 0x7fc00000u
#define STRATA_NAN_F16 0x7e00u
#define STRATA_NAN_BF16 0x7fc0u

STRATA_DEV unsigned short strata_f32_to_f16(float f) {
  // Round to nearest even (cvt.rn.f16.f32 / v_cvt_f16_f32), subnormals kept.
  if (f != f) return (unsigned short)STRATA_NAN_F16;
  return __half_as_ushort(__float2half_rn(f));
}

// f32 as written to an f32 output: NaNs canonical.
STRATA_DEV unsigned int strata_f32_out(float f) {
  return f != f ? STRATA_NAN_F32 : __float_as_uint(f);
}

STRATA_DEV float strata_bf16_to_f32(unsigned short h) {
  return __uint_as_float(((unsigned int)h) << 16);
}

STRATA_DEV unsigned short strata_f32_to_bf16(float f) {
  if (f != f) return (unsigned short)STRATA_NAN_BF16;
#if defined(STRATA_CUDA)
  // cvt.rn.bf16.f32 on sm_80+: round to nearest even.
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
  // Round to nearest even on the bits (no bf16 conversion instruction on gfx90a).
  unsigned int u = __float_as_uint(f);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}

// ---------------------------------------------------------------------------------
// Element access.
// ---------------------------------------------------------------------------------
STRATA_DEV bool strata_aligned(const void* p, strata_u64 a) {
  return (((strata_u64)p) & (a - 1)) == 0;
}

// Element i of a buffer with no alignment guarantee (host buffers and views may start
// anywhere: the CPU reference takes byte slices), read and written as little-endian bytes
// when the element is not naturally aligned.
template <int DT> struct StrataElem {
  static const int size = DT == STRATA_F32 ? 4 : 2;
  // The bits of element i (no conversion), at any alignment.
  STRATA_DEV static unsigned int bits(const strata_u8* p, strata_u32 i) {
    const strata_u8* e = p + (strata_u64)i * size;
    if (DT == STRATA_F32) {
      if (strata_aligned(e, 4)) return *reinterpret_cast<const unsigned int*>(e);
      return (unsigned int)e[0] | ((unsigned int)e[1] << 8) | ((unsigned int)e[2] << 16) |
             ((unsigned int)e[3] << 24);
    }
    if (strata_aligned(e, 2)) return *reinterpret_cast<const unsigned short*>(e);
    return (unsigned int)e[0] | ((unsigned int)e[1] << 8);
  }
  STRATA_DEV static float load(const strata_u8* p, strata_u32 i) {
    const strata_u8* e = p + (strata_u64)i * size;
    if (DT == STRATA_F32) {
      unsigned int u;
      if (strata_aligned(e, 4))
        u = *reinterpret_cast<const unsigned int*>(e);
      else
        u = (unsigned int)e[0] | ((unsigned int)e[1] << 8) | ((unsigned int)e[2] << 16) |
            ((unsigned int)e[3] << 24);
      return __uint_as_float(u);
    }
    unsigned short h;
    if (strata_aligned(e, 2))
      h = *reinterpret_cast<const unsigned short*>(e);
    else
      h = (unsigned short)((unsigned int)e[0] | ((unsigned int)e[1] << 8));
    return DT == STRATA_F16 ? strata_f16_to_f32(h) : strata_bf16_to_f32(h);
  }
  STRATA_DEV static void store(strata_u8* p, strata_u32 i, float v) {
    strata_u8* e = p + (strata_u64)i * size;
    if (DT == STRATA_F32) {
      const unsigned int u = strata_f32_out(v);
      if (strata_aligned(e, 4)) {
        *reinterpret_cast<unsigned int*>(e) = u;
      } else {
        e[0] = (strata_u8)(u & 0xffu);
        e[1] = (strata_u8)((u >> 8) & 0xffu);
        e[2] = (strata_u8)((u >> 16) & 0xffu);
        e[3] = (strata_u8)(u >> 24);
      }
      return;
    }
    const unsigned short h = DT == STRATA_F16 ? strata_f32_to_f16(v) : strata_f32_to_bf16(v);
    if (strata_aligned(e, 2)) {
      *reinterpret_cast<unsigned short*>(e) = h;
    } else {
      e[0] = (strata_u8)(h & 0xffu);
      e[1] = (strata_u8)(h >> 8);
    }
  }
};

// Loads CH elements starting at p (16-byte aligned) as floats, with 16-byte loads.
template <int DT, int CH>
STRATA_DEV void strata_load_vec(const strata_u8* p, float (&v)[CH]) {
  const uint4* q = reinterpret_cast<const uint4*>(p);
  if (DT == STRATA_F32) {
#pragma unroll
    for (int w = 0; w < CH / 4; ++w) {
      uint4 u = q[w];
      v[4 * w + 0] = __uint_as_float(u.x);
      v[4 * w + 1] = __uint_as_float(u.y);
      v[4 * w + 2] = __uint_as_float(u.z);
      v[4 * w + 3] = __uint_as_float(u.w);
    }
  } else {
#pragma unroll
    for (int w = 0; w < CH / 8; ++w) {
      uint4 u = q[w];
      unsigned int h[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        unsigned short lo = (unsigned short)(h[i] & 0xffffu);
        unsigned short hi = (unsigned short)(h[i] >> 16);
        v[8 * w + 2 * i] = DT == STRATA_F16 ? strata_f16_to_f32(lo) : strata_bf16_to_f32(lo);
        v[8 * w + 2 * i + 1] = DT == STRATA_F16 ? strata_f16_to_f32(hi) : strata_bf16_to_f32(hi);
      }
    }
  }
}

// Stores CH floats at p (16-byte aligned) converted to DT, with 16-byte stores.
template <int DT, int CH>
STRATA_DEV void strata_store_vec(strata_u8* p, const float (&v)[CH]) {
  uint4* q = reinterpret_cast<uint4*>(p);
  if (DT == STRATA_F32) {
#pragma unroll
    for (int w = 0; w < CH / 4; ++w) {
      uint4 u;
      u.x = strata_f32_out(v[4 * w + 0]);
      u.y = strata_f32_out(v[4 * w + 1]);
      u.z = strata_f32_out(v[4 * w + 2]);
      u.w = strata_f32_out(v[4 * w + 3]);
      q[w] = u;
    }
  } else {
#pragma unroll
    for (int w = 0; w < CH / 8; ++w) {
      unsigned int h[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        unsigned int lo = DT == STRATA_F16 ? strata_f32_to_f16(v[8 * w + 2 * i])
                                           : strata_f32_to_bf16(v[8 * w + 2 * i]);
        unsigned int hi = DT == STRATA_F16 ? strata_f32_to_f16(v[8 * w + 2 * i + 1])
                                           : strata_f32_to_bf16(v[8 * w + 2 * i + 1]);
        h[i] = lo | (hi << 16);
      }
      uint4 u;
      u.x = h[0];
      u.y = h[1];
      u.z = h[2];
      u.w = h[3];
      q[w] = u;
    }
  }
}

// f32 scale at any byte address (packed slices are concatenated, so a slice may start
// at an odd address).
STRATA_DEV float strata_load_scale(const strata_u8* p) {
  if (strata_aligned(p, 4)) return *reinterpret_cast<const float*>(p);
  unsigned int u = (unsigned int)p[0] | ((unsigned int)p[1] << 8) | ((unsigned int)p[2] << 16) |
                   ((unsigned int)p[3] << 24);
  return __uint_as_float(u);
}

STRATA_DEV void strata_store_scale(strata_u8* p, float s) {
  if (strata_aligned(p, 4)) {
    *reinterpret_cast<float*>(p) = s;
    return;
  }
  unsigned int u = __float_as_uint(s);
  p[0] = (strata_u8)(u & 0xffu);
  p[1] = (strata_u8)((u >> 8) & 0xffu);
  p[2] = (strata_u8)((u >> 16) & 0xffu);
  p[3] = (strata_u8)(u >> 24);
}

// ---------------------------------------------------------------------------------
// Codes.
// ---------------------------------------------------------------------------------
template <int BITS> struct StrataCodes {
  static const int QMAX = BITS == 8 ? 127 : 7;

  // Byte offset of element e's code (e even when BITS == 4).
  STRATA_DEV static strata_u64 offset(strata_u64 e) { return BITS == 8 ? e : e / 2; }
  STRATA_DEV static strata_u64 bytes(strata_u64 n) { return BITS == 8 ? n : (n + 1) / 2; }

  // The codes of one vector (EPV elements, NB = EPV * BITS / 8 bytes: 2, 4, 8 or 16)
  // travel as up to four 32-bit words, little-endian: element j's code is byte j (int8)
  // or nibble j (int4) of them. Working on words, not on EPV ints, keeps register
  // pressure low.

  // Code j as an f32, exactly, from words whose codes had their sign bit flipped
  // (flip(w)): code + 2^(BITS-1) is then an unsigned field, placed under the exponent of
  // 1.5 * 2^23 and subtracted back (two full-rate operations instead of a conversion).
  STRATA_DEV static unsigned int flip(unsigned int w) {
    return w ^ (BITS == 8 ? 0x80808080u : 0x88888888u);
  }
  STRATA_DEV static float value(const unsigned int (&wx)[4], int j) {
    const unsigned int f = BITS == 8 ? (wx[j >> 2] >> (8 * (j & 3))) & 0xffu
                                     : (wx[j >> 3] >> (4 * (j & 7))) & 0xfu;
    return __uint_as_float(0x4b400000u | f) - (BITS == 8 ? 12583040.0f : 12582920.0f);
  }

  // Adds code q (already clamped; only its low BITS bits are used) of element j.
  STRATA_DEV static void put(unsigned int (&w)[4], int j, int q) {
    if (BITS == 8)
      w[j >> 2] |= ((unsigned int)q & 0xffu) << (8 * (j & 3));
    else
      w[j >> 3] |= ((unsigned int)q & 0xfu) << (4 * (j & 7));
  }

  // The code words of a vector of cnt elements at c: one NB-byte load when `full` (c
  // aligned to 16 bytes' worth of the vector's offset, cnt == EPV), else byte loads of
  // its code bytes (a padding nibble is read as stored and ignored by the caller, as the
  // CPU does); words past the codes are 0.
  template <int NB>
  STRATA_DEV static void load(const strata_u8* c, strata_u32 cnt, bool full, unsigned int (&w)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = 0;
    if (full) {
      if (NB == 16) {
        const uint4 u = *reinterpret_cast<const uint4*>(c);
        w[0] = u.x;
        w[1] = u.y;
        w[2] = u.z;
        w[3] = u.w;
      } else if (NB == 8) {
        const uint2 u = *reinterpret_cast<const uint2*>(c);
        w[0] = u.x;
        w[1] = u.y;
      } else if (NB == 4) {
        w[0] = *reinterpret_cast<const unsigned int*>(c);
      } else {
        w[0] = *reinterpret_cast<const unsigned short*>(c);
      }
      return;
    }
    const strata_u32 nbytes = (strata_u32)bytes(cnt);
#pragma unroll
    for (int j = 0; j < NB; ++j)
      if ((strata_u32)j < nbytes) w[j >> 2] |= (unsigned int)c[j] << (8 * (j & 3));
  }

  // Stores the code words of a vector of cnt elements at c: one NB-byte store when
  // `full`, else the vector's code bytes one by one (codes of elements >= cnt must be 0
  // in w, so an odd slice's last high nibble is 0).
  template <int NB>
  STRATA_DEV static void store(strata_u8* c, strata_u32 cnt, bool full, const unsigned int (&w)[4]) {
    if (full) {
      if (NB == 16) {
        uint4 u;
        u.x = w[0];
        u.y = w[1];
        u.z = w[2];
        u.w = w[3];
        *reinterpret_cast<uint4*>(c) = u;
      } else if (NB == 8) {
        uint2 u;
        u.x = w[0];
        u.y = w[1];
        *reinterpret_cast<uint2*>(c) = u;
      } else if (NB == 4) {
        *reinterpret_cast<unsigned int*>(c) = w[0];
      } else {
        *reinterpret_cast<unsigned short*>(c) = (unsigned short)w[0];
      }
      return;
    }
    const strata_u32 nbytes = (strata_u32)bytes(cnt);
#pragma unroll
    for (int j = 0; j < NB; ++j)
      if ((strata_u32)j < nbytes) c[j] = (strata_u8)((w[j >> 2] >> (8 * (j & 3))) & 0xffu);
  }
};

// ---------------------------------------------------------------------------------
// Lane geometry. A *vector* is 16 bytes of a kernel's input: 4 f32 or 8 f16/bf16
// elements (quantization), 16 codes (16 bytes of int8, 8 of int4: the fused kernel);
// in dequantization 16 bytes of its output. Each lane of a group holds V vectors of its block in registers,
// vectors i * gs + lane (i < V), so every load instruction of a warp reads one
// contiguous run of vectors, all of a lane's loads are issued before the first use, and
// a block of up to gs * V vectors is read from memory once. STRATA_LANE_ELEMS (a
// compile-time choice the host's plan::Geometry mirrors) sets the bytes a lane keeps in
// flight: quantization holds STRATA_LANE_ELEMS * 4 bytes of input as loaded (64 f32 or
// 128 bf16 elements by default), the fused kernel half as many elements as f32 sums,
// dequantization half as many output elements (of k senders or with Avg: a quarter).
// ---------------------------------------------------------------------------------
#ifndef STRATA_LANE_ELEMS
#define STRATA_LANE_ELEMS 64
#endif
#define STRATA_MAX1(x) ((x) > 0 ? (x) : 1)
#define STRATA_QUANT_VECS STRATA_MAX1(STRATA_LANE_ELEMS / 4)
#define STRATA_DRQ_VECS STRATA_MAX1(STRATA_LANE_ELEMS / 32)
// Senders whose loads are issued together in the k-sender kernels (in sender order).
#define STRATA_SENDERS_AT_ONCE 4

// ---------------------------------------------------------------------------------
// Group reduction (amax). Called by every thread of the thread block the same number of
// times (gs is uniform over the launch), so shuffles and barriers never diverge.
// ---------------------------------------------------------------------------------
STRATA_DEV strata_u32 strata_group_max(strata_u32 v, strata_u32 gs, strata_u32* smem) {
  const strata_u32 lim = gs < (strata_u32)STRATA_WARP ? gs : (strata_u32)STRATA_WARP;
  for (strata_u32 o = 1; o < lim; o <<= 1) {
    const strata_u32 u = STRATA_SHFL_XOR(v, o);
    v = u > v ? u : v;
  }
  if (gs > (strata_u32)STRATA_WARP) {
    const strata_u32 warp = threadIdx.x / STRATA_WARP;
    const strata_u32 lane = threadIdx.x % STRATA_WARP;
    __syncthreads();  // the previous round's readers are done with smem
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    const strata_u32 wpg = gs / STRATA_WARP;
    const strata_u32 first = (warp / wpg) * wpg;
    v = smem[first];
    for (strata_u32 i = 1; i < wpg; ++i) v = smem[first + i] > v ? smem[first + i] : v;
  }
  return v;
}

// |x| as its bits, for amax: on magnitudes (sign cleared) f32 order is unsigned integer
// order, and every NaN and infinity is >= 0x7F800000, so the block's largest value says
// at once whether it holds one (mode 2) and otherwise is amax itself.
STRATA_DEV strata_u32 strata_abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }
#define STRATA_INF_BITS 0x7f800000u

// 2^-64 and 2^64: blocks with amax < 2^-64 are prescaled by 2^64 (exact) so that
// qmax / amax stays finite (docs/quantization.md, "Tiny blocks").
#define STRATA_TINY 5.42101086242752217e-20f
#define STRATA_UP 18446744073709551616.0f

// Quantization of one value of a finite block with amax > 0:
// q = clamp(rint(x * inv), -qmax, qmax) (f32 multiply, round half to even), with x first
// multiplied by 2^64 in a tiny block (mul = 2^64, else 1: x * 1 is x exactly). Clamping
// before rounding gives the same integer (qmax is one, rounding is monotonic); adding
// 1.5 * 2^23 rounds |c| <= 127 to an integer half to even (the sum's ulp is 1), and the
// low bits of the sum's encoding are the code in two's complement. Returns those bits.
STRATA_DEV strata_u32 strata_quant_bits(float x, float mul, float inv, float qmax) {
  const float v = (x * mul) * inv;  // |v| <= qmax * (1 + 2^-22), never NaN
  const float c = fminf(fmaxf(v, -qmax), qmax);
  return __float_as_uint(c + 12582912.0f);
}

// ---------------------------------------------------------------------------------
// Kernel arguments (mirrored by #[repr(C)] structs in src/kernels_gpu/).
// ---------------------------------------------------------------------------------

// Swizzled quantization (docs/quantization.md, "Swizzled quantization"). Input: p = nodes
// * devices chunks of `chunk` elements, rank-major (chunk r = b * devices + j). Output, for
// stage s, local destination j, node b: the packed slice of chunk (b, j)'s elements in
// stage range s. Plain quantization of `slices` slices of n elements is nodes = 1,
// devices = slices, chunk = n, stages = 1.
struct StrataQuantArgs {
  const strata_u8* in;
  strata_u8* out;
  strata_u64 block;
  strata_u64 nodes;
  strata_u64 devices;
  strata_u64 chunk;
  strata_u64 stages;
  strata_u64 total_blocks;  // quantization blocks over all slices (host computed)
  strata_u32 gs;            // threads per quantization block, power of two <= 512
  strata_u32 pad;
};

// Dequantize-reduce: k senders, sender s's `slices` packed slices of n elements at
// in + s * in_stride; output slice i (n elements of DT) at out + i * n * sizeof(DT).
// out = (sum over senders in order of q * scale), divided once by `divisor` (the world
// size as f32, host-converted like the CPU's `d as f32`) when `avg` is set, then
// converted to DT (NaN canonical).
struct StrataDequantArgs {
  const strata_u8* in;
  strata_u8* out;
  strata_u64 block;
  strata_u64 n;
  strata_u64 slices;
  strata_u64 k;
  strata_u64 in_stride;
  strata_u64 total_blocks;
  strata_u32 gs;
  strata_u32 avg;
  float divisor;
  strata_u32 pad;
};

// Fused dequantize-reduce-quantize (qgZ middle hop): k senders as above; output slice i
// = quantize(sum over senders of deq(sender slice i)) at out + i * packed_len(n).
struct StrataDrqArgs {
  const strata_u8* in;
  strata_u8* out;
  strata_u64 block;
  strata_u64 n;
  strata_u64 slices;
  strata_u64 k;
  strata_u64 in_stride;
  strata_u64 total_blocks;
  strata_u32 gs;
  strata_u32 pad;
};

// a / b and a % b, in 32-bit arithmetic when both fit (the common case: 64-bit division
// is a long software sequence on both vendors).
STRATA_DEV void strata_divmod(strata_u64 a, strata_u64 b, strata_u64& q, strata_u64& r) {
  if (((a | b) >> 32) == 0) {
    const strata_u32 a32 = (strata_u32)a, b32 = (strata_u32)b;
    q = a32 / b32;
    r = a32 - (strata_u32)q * b32;
  } else {
    q = a / b;
    r = a - q * b;
  }
}

template <int BITS>
STRATA_DEV strata_u64 strata_nblocks(strata_u64 n, strata_u64 block) {
  return (n + block - 1) / block;
}

template <int BITS>
STRATA_DEV strata_u64 strata_packed_len(strata_u64 n, strata_u64 block) {
  return 4 * strata_nblocks<BITS>(n, block) + StrataCodes<BITS>::bytes(n);
}

// ---------------------------------------------------------------------------------
// Sources of values for the shared quantize body. A source yields the vectors of one
// block (vector q: elements [q * EPV, q * EPV + EPV), zeros past m) as `Vec`s, what a
// lane keeps in registers; lane_amax() gives the bits of their largest |x|
// (strata_abs_bits) and value() element e as an f32.
// ---------------------------------------------------------------------------------

// Elements of type DT of one block, kept as loaded (16 bytes a vector: f16/bf16 are
// widened only when used, so a lane holds twice as many of them as of f32).
template <int DT> struct StrataElemSource {
  static const int EPV = 16 / StrataElem<DT>::size;
  static const int V = STRATA_QUANT_VECS;
  struct Vec {
    unsigned int w[4];
  };
  const strata_u8* p;  // first element of the block
  bool vec;            // p is 16-byte aligned
  // Vector q of a block of m elements: one 16-byte load when `full` (aligned, whole
  // vector inside the block), else element by element.
  STRATA_DEV void load(strata_u32 q, strata_u32 m, bool full, Vec& c) const {
    const strata_u32 first = q * EPV;
    if (full) {
      const uint4 u = *reinterpret_cast<const uint4*>(p + (strata_u64)first * StrataElem<DT>::size);
      c.w[0] = u.x;
      c.w[1] = u.y;
      c.w[2] = u.z;
      c.w[3] = u.w;
      return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) c.w[i] = 0u;
#pragma unroll
    for (int j = 0; j < EPV; ++j) {
      if (first + (strata_u32)j < m) {
        const unsigned int b = StrataElem<DT>::bits(p, first + j);
        if (DT == STRATA_F32)
          c.w[j] = b;
        else
          c.w[j >> 1] |= b << (16 * (j & 1));
      }
    }
  }
  // A lane's V vectors q = q0 + i * gs (i < V). When the whole window of the group is
  // inside the block and aligned, V unconditional 16-byte loads.
  STRATA_DEV void load_lane(strata_u32 q0, strata_u32 window_end, strata_u32 gs, strata_u32 m,
                            Vec (&c)[V]) const {
    if (vec && window_end <= m) {  // straight-line: every load issued before any use
#pragma unroll
      for (int i = 0; i < V; ++i) load(q0 + (strata_u32)i * gs, m, true, c[i]);
      return;
    }
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const strata_u32 q = q0 + (strata_u32)i * gs;
      load(q, m, vec && (q + 1) * EPV <= m, c[i]);
    }
  }
  STRATA_DEV static float value(const Vec& c, int e) {
    if (DT == STRATA_F32) return __uint_as_float(c.w[e]);
    const unsigned int h = (c.w[e >> 1] >> (16 * (e & 1))) & 0xffffu;
    return DT == STRATA_BF16 ? __uint_as_float(h << 16) : strata_f16_to_f32((unsigned short)h);
  }
  // On magnitude bits, f16 and bf16 order like f32 too: the largest is found on the
  // 16-bit patterns and widened once (bf16: the high half of an f32; f16 exactly).
  STRATA_DEV static strata_u32 lane_amax(const Vec (&c)[V]) {
    strata_u32 m = 0u;
#pragma unroll
    for (int i = 0; i < V; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (DT == STRATA_F32) {
          const strata_u32 b = c[i].w[j] & 0x7fffffffu;
          m = b > m ? b : m;
        } else {
          const strata_u32 lo = c[i].w[j] & 0x7fffu, hi = (c[i].w[j] >> 16) & 0x7fffu;
          m = lo > m ? lo : m;
          m = hi > m ? hi : m;
        }
      }
    if (DT == STRATA_BF16) return m << 16;
    if (DT == STRATA_F16) return m >= 0x7c00u ? STRATA_INF_BITS : __float_as_uint(strata_f16_to_f32((unsigned short)m));
    return m;
  }
};

// Adds the decoded vectors of senders s0 .. s0 + KS - 1 (those below k) into `at(i, e)`
// in sender order: w holds each sender's V code vectors as loaded, sc its scale; code
// times scale is one f32 multiply, and sender 0 starts the sum (no 0 + x).
template <int BITS, int KS, int V, int EPV, class At>
STRATA_DEV void strata_add_senders(unsigned int (&w)[KS][V][4], const float (&sc)[KS],
                                   strata_u32 s0, strata_u32 k, At at) {
  typedef StrataCodes<BITS> C;
#pragma unroll
  for (int j = 0; j < KS; ++j) {
    const strata_u32 s = s0 + (strata_u32)j;
    if (s < k) {
#pragma unroll
      for (int i = 0; i < V; ++i) {
#pragma unroll
        for (int t = 0; t < 4; ++t) w[j][i][t] = C::flip(w[j][i][t]);
#pragma unroll
        for (int e = 0; e < EPV; ++e) {
          const float d = C::value(w[j][i], e) * sc[j];
          float& acc = at(i, e);
          acc = s == 0 ? d : acc + d;
        }
      }
    }
  }
}

// The sum over k senders, in sender order, of the dequantized values of one block: a
// vector is 16 codes (16 bytes of int8, 8 of int4), kept as f32 sums.
template <int BITS> struct StrataDeqSource {
  static const int EPV = 16;
  static const int NB = EPV * BITS / 8;
  static const int V = STRATA_DRQ_VECS;
  struct Vec {
    float v[16];
  };
  const strata_u8* scales;  // sender 0's scale of this block
  const strata_u8* codes;   // sender 0's first code of this block
  strata_u64 stride;        // bytes between senders
  strata_u32 k;
  bool vec;                 // every sender's codes of this block are 16-byte aligned
  // A lane's V vectors: senders in groups of STRATA_SENDERS_AT_ONCE, each group's code
  // loads issued together, then added in sender order.
  STRATA_DEV void load_lane(strata_u32 q0, strata_u32 window_end, strata_u32 gs, strata_u32 m,
                            Vec (&c)[V]) const {
    typedef StrataCodes<BITS> C;
    const int KS = STRATA_SENDERS_AT_ONCE;
    const bool all = vec && window_end <= m;
    for (strata_u32 s0 = 0; s0 < k; s0 += KS) {
      float scale[KS];
      unsigned int w[KS][V][4];
#pragma unroll
      for (int j = 0; j < KS; ++j) {
        const strata_u32 s = s0 + (strata_u32)j;
        scale[j] = s < k ? strata_load_scale(scales + s * stride) : 0.0f;
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const strata_u32 first = (q0 + (strata_u32)i * gs) * EPV;
          const strata_u32 cnt =
              first < m ? (m - first < (strata_u32)EPV ? m - first : (strata_u32)EPV) : 0u;
          if (s < k && (all || cnt > 0)) {
            C::template load<NB>(codes + s * stride + C::offset(first), all ? EPV : cnt,
                                 all || (vec && cnt == (strata_u32)EPV), w[j][i]);
          } else {
#pragma unroll
            for (int t = 0; t < 4; ++t) w[j][i][t] = 0u;
          }
        }
      }
      strata_add_senders<BITS, KS, V, EPV>(w, scale, s0, k,
                                          [&](int i, int e) -> float& { return c[i].v[e]; });
    }
    if (!all) {  // elements past the block read as 0 (their codes may decode to NaN)
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const strata_u32 first = (q0 + (strata_u32)i * gs) * EPV;
#pragma unroll
        for (int e = 0; e < EPV; ++e)
          if (first + (strata_u32)e >= m) c[i].v[e] = 0.0f;
      }
    }
  }
  STRATA_DEV static float value(const Vec& c, int e) { return c.v[e]; }
  STRATA_DEV static strata_u32 lane_amax(const Vec (&c)[V]) {
    strata_u32 m = 0u;
#pragma unroll
    for (int i = 0; i < V; ++i)
#pragma unroll
      for (int e = 0; e < EPV; ++e) {
        const strata_u32 b = strata_abs_bits(c[i].v[e]);
        m = b > m ? b : m;
      }
    return m;
  }
};

// ---------------------------------------------------------------------------------
// The shared quantize body: one group quantizes the m values of one block from `src`
// into a scale at `scale_out` and codes at `codes_out`. Every thread of the thread block
// calls it (inactive groups with m = 0) so that the amax reduction stays uniform.
// The block is read in windows of gs * V vectors, `nwin` of them (uniform over the
// launch, from the spec's block size, so that every group reduces alike). A block of one
// window (the host sizes gs for it) stays in registers between the amax and the quantize
// passes: read once. Larger blocks read every window twice (the second time from L2,
// usually).
// ---------------------------------------------------------------------------------
template <int BITS, class Src>
STRATA_DEV void strata_quantize_block(const Src& src, strata_u32 m, strata_u32 nwin,
                                      strata_u8* scale_out, strata_u8* codes_out,
                                      bool codes_vec, strata_u32 tig, strata_u32 gs,
                                      strata_u32* smem) {
  typedef StrataCodes<BITS> C;
  const int EPV = Src::EPV;
  const int V = Src::V;
  const int NB = EPV * BITS / 8;
  const strata_u32 nvec = (m + EPV - 1) / EPV;
  const strata_u32 wvec = (strata_u32)V * gs;  // vectors of one window
  typename Src::Vec cache[V];
  strata_u32 amax = 0u;  // bits of the largest |x| (strata_abs_bits)
#pragma unroll 1
  for (strata_u32 w = 0; w < nwin; ++w) {
    src.load_lane(w * wvec + tig, (w + 1) * wvec * EPV, gs, m, cache);
    const strata_u32 b = Src::lane_amax(cache);
    amax = b > amax ? b : amax;
  }
  amax = strata_group_max(amax, gs, smem);
  if (nvec == 0) return;

  // mode 0: finite, amax > 0; 1: all zero; 2: a NaN or an infinity in the block.
  const float qmax = (float)C::QMAX;
  const int mode = amax == 0u ? 1 : (amax < STRATA_INF_BITS ? 0 : 2);
  const float am = __uint_as_float(amax);
  const float scale = mode == 0 ? am / qmax : (mode == 1 ? 0.0f : __uint_as_float(STRATA_NAN_F32));
  const bool tiny = am < STRATA_TINY;
  const float mul = tiny ? STRATA_UP : 1.0f;
  const float inv = mode != 0 ? 0.0f : (tiny ? qmax / (am * STRATA_UP) : qmax / am);
  if (tig == 0) strata_store_scale(scale_out, scale);

#pragma unroll 1
  for (strata_u32 w = 0; w < nwin; ++w) {
    if (nwin > 1) src.load_lane(w * wvec + tig, (w + 1) * wvec * EPV, gs, m, cache);
    if (codes_vec && (w + 1) * wvec * EPV <= m) {  // every vector full and aligned
#pragma unroll
      for (int i = 0; i < V; ++i) {
        unsigned int c[4] = {0u, 0u, 0u, 0u};
        if (mode == 0) {
#pragma unroll
          for (int e = 0; e < EPV; ++e)
            C::put(c, e, (int)strata_quant_bits(Src::value(cache[i], e), mul, inv, qmax));
        }
        C::template store<NB>(codes_out + C::offset((w * wvec + tig + (strata_u32)i * gs) * EPV), EPV,
                              true, c);
      }
      continue;
    }
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const strata_u32 q = w * wvec + tig + (strata_u32)i * gs;
      if (q < nvec) {
        const strata_u32 first = q * EPV;
        const strata_u32 cnt = m - first < (strata_u32)EPV ? m - first : (strata_u32)EPV;
        unsigned int c[4] = {0u, 0u, 0u, 0u};
        if (mode == 0) {
#pragma unroll
          for (int e = 0; e < EPV; ++e)
            if ((strata_u32)e < cnt)
              C::put(c, e, (int)strata_quant_bits(Src::value(cache[i], e), mul, inv, qmax));
        }
        C::template store<NB>(codes_out + C::offset(first), cnt,
                              codes_vec && cnt == (strata_u32)EPV, c);
      }
    }
  }
}

// Group geometry of a launch: blockDim.x = max(gs, CTA) threads, blockDim.x / gs groups.
#define STRATA_GROUP_LOOP_BEGIN(total, gs_)                                               \
  const strata_u32 gs = (gs_);                                                            \
  const strata_u32 tig = threadIdx.x & (gs - 1);                                          \
  const strata_u32 gpc = blockDim.x / gs;                                                 \
  const strata_u32 gic = threadIdx.x / gs;                                                \
  for (strata_u64 base = (strata_u64)blockIdx.x * gpc; base < (total);                    \
       base += (strata_u64)gridDim.x * gpc) {                                             \
    const strata_u64 id = base + gic;                                                     \
    const bool active = id < (total);
#define STRATA_GROUP_LOOP_END }

// ---------------------------------------------------------------------------------
// Kernel bodies.
// ---------------------------------------------------------------------------------
template <int DT, int BITS>
STRATA_DEV void strata_quantize_body(const StrataQuantArgs& a) {
  __shared__ strata_u32 smem[STRATA_MAX_THREADS / STRATA_WARP];
  typedef StrataCodes<BITS> C;
  const strata_u64 p = a.nodes * a.devices;
  const strata_u64 S = a.stages;
  const strata_u64 qlen = a.chunk / S;  // short stage length
  const strata_u64 rem = a.chunk % S;   // the first rem stages are one element longer
  const strata_u64 nbL = strata_nblocks<BITS>(qlen + 1, a.block);
  const strata_u64 nbS = strata_nblocks<BITS>(qlen, a.block);
  const strata_u64 plL = strata_packed_len<BITS>(qlen + 1, a.block);
  const strata_u64 plS = strata_packed_len<BITS>(qlen, a.block);
  const strata_u64 long_blocks = rem * p * nbL;
  STRATA_GROUP_LOOP_BEGIN(a.total_blocks, a.gs)
  strata_u32 m = 0;
  const strata_u8* in = a.in;
  strata_u8* scale_out = a.out;
  strata_u8* codes_out = a.out;
  bool in_vec = false, codes_vec = false;
  if (active) {
    strata_u64 s, w, len, nb, pl, out_base;
    if (id < long_blocks) {  // a stage of qlen + 1 elements per slice
      strata_divmod(id, p * nbL, s, w);
      len = qlen + 1;
      nb = nbL;
      pl = plL;
      out_base = s * p * plL;
    } else {  // a stage of qlen elements (qlen > 0 here: else no block is left)
      const strata_u64 id2 = id - long_blocks;
      strata_divmod(id2, p * nbS, s, w);
      s += rem;
      len = qlen;
      nb = nbS;
      pl = plS;
      out_base = rem * p * plL + (s - rem) * p * plS;
    }
    strata_u64 L, blk, j, b;
    strata_divmod(w, nb, L, blk);     // L: slice within the stage (j * nodes + b)
    strata_divmod(L, a.nodes, j, b);  // j: local destination, b: node
    const strata_u64 r = b * a.devices + j;  // source chunk, rank-major
    const strata_u64 stage_start = s * qlen + (s < rem ? s : rem);
    const strata_u64 e0 = blk * a.block;
    const strata_u64 left = len - e0;
    m = (strata_u32)(left < a.block ? left : a.block);
    in = a.in + (r * a.chunk + stage_start + e0) * StrataElem<DT>::size;
    const strata_u64 slice = out_base + L * pl;
    scale_out = a.out + slice + 4 * blk;
    codes_out = a.out + slice + 4 * nb + C::offset(e0);
    in_vec = strata_aligned(in, 16);
    codes_vec = strata_aligned(codes_out, 16);
  }
  StrataElemSource<DT> src;
  src.p = in;
  src.vec = in_vec;
  const strata_u64 window = (strata_u64)StrataElemSource<DT>::V * gs * StrataElemSource<DT>::EPV;
  const strata_u32 nwin = (strata_u32)((a.block + window - 1) / window);
  strata_quantize_block<BITS>(src, m, nwin, scale_out, codes_out, codes_vec, tig, gs, smem);
  STRATA_GROUP_LOOP_END
}

// Dequantize-reduce of one block (m elements; codes of sender s at codes + s * stride):
// a vector is the EPV output elements of one 16-byte store (f32: 4, f16/bf16: 8) and
// their NB code bytes; a lane takes V vectors at a time, so the code loads and the
// stores of a warp are contiguous runs. Senders go in groups of KS whose code loads are
// issued together, added in sender order. No reduction across lanes.
template <int DT, int BITS, int V, int KS, bool AVG>
STRATA_DEV void strata_dequant_block(const StrataDequantArgs& a, strata_u32 m,
                                     const strata_u8* scales, const strata_u8* codes, bool vec,
                                     strata_u8* out, bool out_vec, strata_u32 tig,
                                     strata_u32 gs) {
  typedef StrataCodes<BITS> C;
  const int EPV = 16 / StrataElem<DT>::size;  // output elements of a vector
  const int NB = EPV * BITS / 8;              // their code bytes: 2, 4 or 8
  const strata_u32 k = (strata_u32)a.k;
  const strata_u32 nvec = (m + EPV - 1) / EPV;
  for (strata_u32 q0 = tig; q0 < nvec; q0 += (strata_u32)V * gs) {
    const bool all = vec && out_vec && (q0 - tig + (strata_u32)V * gs) * EPV <= m;
    float v[V][EPV];
    for (strata_u32 s0 = 0; s0 < k; s0 += KS) {
      float sc[KS];
      unsigned int w[KS][V][4];
#pragma unroll
      for (int j = 0; j < KS; ++j) {
        const strata_u32 s = s0 + (strata_u32)j;
        sc[j] = s < k ? strata_load_scale(scales + s * a.in_stride) : 0.0f;
        const strata_u8* c = codes + s * a.in_stride;
        if (all) {
#pragma unroll
          for (int u = 0; u < V; ++u) {
            if (s < k) {
              C::template load<NB>(c + C::offset((q0 + (strata_u32)u * gs) * EPV), EPV, true, w[j][u]);
            } else {
#pragma unroll
              for (int t = 0; t < 4; ++t) w[j][u][t] = 0u;
            }
          }
          continue;
        }
#pragma unroll
        for (int u = 0; u < V; ++u) {
          const strata_u32 first = (q0 + (strata_u32)u * gs) * EPV;
          const strata_u32 cnt =
              first < m ? (m - first < (strata_u32)EPV ? m - first : (strata_u32)EPV) : 0u;
          if (s < k && cnt > 0) {
            C::template load<NB>(c + C::offset(first), cnt, vec && cnt == (strata_u32)EPV, w[j][u]);
          } else {
#pragma unroll
            for (int t = 0; t < 4; ++t) w[j][u][t] = 0u;
          }
        }
      }
      strata_add_senders<BITS, KS, V, EPV>(w, sc, s0, k,
                                          [&](int u, int e) -> float& { return v[u][e]; });
    }
#pragma unroll
    for (int u = 0; u < V; ++u) {
      const strata_u32 first = (q0 + (strata_u32)u * gs) * EPV;
      if (!all && first >= m) continue;
      const strata_u32 cnt = m - first < (strata_u32)EPV ? m - first : (strata_u32)EPV;
      if (AVG && a.avg != 0) {
#pragma unroll
        for (int e = 0; e < EPV; ++e) v[u][e] = v[u][e] / a.divisor;  // one IEEE division
      }
      if (all || (out_vec && cnt == (strata_u32)EPV)) {
        strata_store_vec<DT, EPV>(out + (strata_u64)first * StrataElem<DT>::size, v[u]);
      } else {
#pragma unroll
        for (int e = 0; e < EPV; ++e)
          if ((strata_u32)e < cnt) StrataElem<DT>::store(out, first + e, v[u][e]);
      }
    }
  }
}

// Dequantize-reduce over a launch, a lane holding V vectors, KS senders' loads at once:
// strata_dequantize_* (one sender, Sum: half of STRATA_LANE_ELEMS elements a lane, no
// division) and strata_dequant_reduce_* (any k and Avg: a quarter, so that the sums
// and four senders' codes leave room for many resident warps).
template <int DT, int BITS, int V, int KS, bool AVG>
STRATA_DEV void strata_dequant_reduce_body(const StrataDequantArgs& a) {
  typedef StrataCodes<BITS> C;
  const strata_u64 nb = strata_nblocks<BITS>(a.n, a.block);
  const strata_u64 pl = strata_packed_len<BITS>(a.n, a.block);
  STRATA_GROUP_LOOP_BEGIN(a.total_blocks, a.gs)
  if (active) {
    strata_u64 i, blk;  // slice, block within the slice
    strata_divmod(id, nb, i, blk);
    const strata_u64 e0 = blk * a.block;
    const strata_u64 left = a.n - e0;
    const strata_u32 m = (strata_u32)(left < a.block ? left : a.block);
    const strata_u8* scales = a.in + i * pl + 4 * blk;
    const strata_u8* codes = a.in + i * pl + 4 * nb + C::offset(e0);
    const bool vec = strata_aligned(codes, 16) && (a.k == 1 || a.in_stride % 16 == 0);
    strata_u8* out = a.out + (i * a.n + e0) * StrataElem<DT>::size;
    strata_dequant_block<DT, BITS, V, KS, AVG>(a, m, scales, codes, vec, out, strata_aligned(out, 16),
                                          tig, gs);
  }
  STRATA_GROUP_LOOP_END
}
#define STRATA_DEQ1_VECS(DT) STRATA_MAX1(STRATA_LANE_ELEMS / 2 / (16 / StrataElem<DT>::size))
#define STRATA_DEQK_VECS(DT) STRATA_MAX1(STRATA_LANE_ELEMS / 4 / (16 / StrataElem<DT>::size))

template <int BITS>
STRATA_DEV void strata_dequant_reduce_quant_body(const StrataDrqArgs& a) {
  __shared__ strata_u32 smem[STRATA_MAX_THREADS / STRATA_WARP];
  typedef StrataCodes<BITS> C;
  const strata_u64 nb = strata_nblocks<BITS>(a.n, a.block);
  const strata_u64 pl = strata_packed_len<BITS>(a.n, a.block);
  STRATA_GROUP_LOOP_BEGIN(a.total_blocks, a.gs)
  strata_u32 m = 0;
  StrataDeqSource<BITS> src;
  src.scales = a.in;
  src.codes = a.in;
  src.stride = a.in_stride;
  src.k = (strata_u32)a.k;
  src.vec = false;
  strata_u8* scale_out = a.out;
  strata_u8* codes_out = a.out;
  bool codes_vec = false;
  if (active) {
    strata_u64 i, blk;
    strata_divmod(id, nb, i, blk);
    const strata_u64 e0 = blk * a.block;
    const strata_u64 left = a.n - e0;
    m = (strata_u32)(left < a.block ? left : a.block);
    src.scales = a.in + i * pl + 4 * blk;
    src.codes = a.in + i * pl + 4 * nb + C::offset(e0);
    src.vec = strata_aligned(src.codes, 16) && (a.k == 1 || a.in_stride % 16 == 0);
    scale_out = a.out + i * pl + 4 * blk;
    codes_out = a.out + i * pl + 4 * nb + C::offset(e0);
    codes_vec = strata_aligned(codes_out, 16);
  }
  const strata_u64 window = (strata_u64)StrataDeqSource<BITS>::V * gs * StrataDeqSource<BITS>::EPV;
  const strata_u32 nwin = (strata_u32)((a.block + window - 1) / window);
  strata_quantize_block<BITS>(src, m, nwin, scale_out, codes_out, codes_vec, tig, gs, smem);
  STRATA_GROUP_LOOP_END
}

// ---------------------------------------------------------------------------------
// The extern "C" entry points. kernels-cuda/strata_quant.cu and
// kernels-hip/strata_quant.hip expand this macro once; nothing else is per-platform.
// ---------------------------------------------------------------------------------
#define STRATA_QUANT_KERNEL(DTN, DT, BITS)                                                  \
  extern "C" __global__ void __launch_bounds__(STRATA_MAX_THREADS, 1)                          \
      strata_quantize_##DTN##_q##BITS(StrataQuantArgs a) {                                  \
    strata_quantize_body<DT, BITS>(a);                                                      \
  }                                                                                         \
  extern "C" __global__ void __launch_bounds__(STRATA_MAX_THREADS, 1)                       \
      strata_dequantize_##DTN##_q##BITS(StrataDequantArgs a) {                              \
    strata_dequant_reduce_body<DT, BITS, STRATA_DEQ1_VECS(DT), 1, false>(a);                \
  }                                                                                         \
  extern "C" __global__ void __launch_bounds__(STRATA_MAX_THREADS, 1)                       \
      strata_dequant_reduce_##DTN##_q##BITS(StrataDequantArgs a) {                          \
    strata_dequant_reduce_body<DT, BITS, STRATA_DEQK_VECS(DT), STRATA_SENDERS_AT_ONCE, true>(a); \
  }

#define STRATA_QUANT_KERNELS()                                                              \
  STRATA_QUANT_KERNEL(f32, STRATA_F32, 8)                                                   \
  STRATA_QUANT_KERNEL(f32, STRATA_F32, 4)                                                   \
  STRATA_QUANT_KERNEL(f16, STRATA_F16, 8)                                                   \
  STRATA_QUANT_KERNEL(f16, STRATA_F16, 4)                                                   \
  STRATA_QUANT_KERNEL(bf16, STRATA_BF16, 8)                                                 \
  STRATA_QUANT_KERNEL(bf16, STRATA_BF16, 4)                                                 \
  extern "C" __global__ void __launch_bounds__(STRATA_MAX_THREADS, 1)                          \
      strata_dequant_reduce_quant_q8(StrataDrqArgs a) {                                     \
    strata_dequant_reduce_quant_body<8>(a);                                                 \
  }                                                                                         \
  extern "C" __global__ void __launch_bounds__(STRATA_MAX_THREADS, 1)                          \
      strata_dequant_reduce_quant_q4(StrataDrqArgs a) {                                     \
    strata_dequant_reduce_quant_body<4>(a);                                                 \
  }

#endif  // STRATA_QUANT_CUH
