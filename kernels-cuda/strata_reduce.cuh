// Element-wise reductions and the Avg division on device buffers, for the device paths
// of the algorithms (HO-Ring's reduce steps, the cuda-local transport's collectives).
// Included after strata_quant.cuh (its platform layer and conversions); expanded by the
// CUDA and HIP entry files through STRATA_REDUCE_KERNELS(). Bit for bit the CPU
// reference (src/dtype.rs reduce_into / finish_avg):
//   - f16/bf16: each step in f32, rounded to nearest even; integers wrap;
//   - max/min: `if (a < b) a = b` (a NaN accumulator stays, a NaN input never enters);
//   - Avg division rounded once: f32/f16/bf16 as one f32 division narrowed to nearest
//     even (equal to the CPU's f64 path; see strata_divide_one), other types in f64;
//     integers round half away from zero and saturate; 64-bit integers divide exactly
//     in integer arithmetic, with the same rounding.
// Elements are naturally aligned (the host checks before launching).
#ifndef STRATA_REDUCE_CUH
#define STRATA_REDUCE_CUH

#define STRATA_OP_SUM 0
#define STRATA_OP_PROD 1
#define STRATA_OP_MAX 2
#define STRATA_OP_MIN 3

// Integer element types: arithmetic on the unsigned 32-bit value wraps like Rust's
// wrapping_add / wrapping_mul once truncated back to the element width.
#define STRATA_INT_OPS(T)                                                                   \
  STRATA_DEV T strata_add(T a, T b) { return (T)((strata_u32)a + (strata_u32)b); }           \
  STRATA_DEV T strata_mul(T a, T b) { return (T)((strata_u32)a * (strata_u32)b); }           \
  STRATA_DEV bool strata_lt(T a, T b) { return a < b; }
STRATA_INT_OPS(signed char)
STRATA_INT_OPS(unsigned char)
STRATA_INT_OPS(int)
STRATA_INT_OPS(unsigned int)
// 64-bit integers wrap on the unsigned 64-bit value.
#define STRATA_INT64_OPS(T)                                                                 \
  STRATA_DEV T strata_add(T a, T b) { return (T)((strata_u64)a + (strata_u64)b); }           \
  STRATA_DEV T strata_mul(T a, T b) { return (T)((strata_u64)a * (strata_u64)b); }           \
  STRATA_DEV bool strata_lt(T a, T b) { return a < b; }
STRATA_INT64_OPS(long long)
STRATA_INT64_OPS(unsigned long long)

STRATA_DEV float strata_add(float a, float b) { return __fadd_rn(a, b); }
STRATA_DEV float strata_mul(float a, float b) { return __fmul_rn(a, b); }
STRATA_DEV bool strata_lt(float a, float b) { return a < b; }
STRATA_DEV double strata_add(double a, double b) { return __dadd_rn(a, b); }
STRATA_DEV double strata_mul(double a, double b) { return __dmul_rn(a, b); }
STRATA_DEV bool strata_lt(double a, double b) { return a < b; }

// f16 / bf16 travel as their bit patterns (unsigned short) wrapped in distinct types.
struct StrataF16 { unsigned short v; };
struct StrataBF16 { unsigned short v; };
STRATA_DEV float strata_f(StrataF16 x) { return strata_f16_to_f32(x.v); }
STRATA_DEV float strata_f(StrataBF16 x) { return strata_bf16_to_f32(x.v); }
STRATA_DEV StrataF16 strata_add(StrataF16 a, StrataF16 b) {
  StrataF16 r = {strata_f32_to_f16(__fadd_rn(strata_f(a), strata_f(b)))}; return r;
}
STRATA_DEV StrataF16 strata_mul(StrataF16 a, StrataF16 b) {
  StrataF16 r = {strata_f32_to_f16(__fmul_rn(strata_f(a), strata_f(b)))}; return r;
}
STRATA_DEV bool strata_lt(StrataF16 a, StrataF16 b) { return strata_f(a) < strata_f(b); }
STRATA_DEV StrataBF16 strata_add(StrataBF16 a, StrataBF16 b) {
  StrataBF16 r = {strata_f32_to_bf16(__fadd_rn(strata_f(a), strata_f(b)))}; return r;
}
STRATA_DEV StrataBF16 strata_mul(StrataBF16 a, StrataBF16 b) {
  StrataBF16 r = {strata_f32_to_bf16(__fmul_rn(strata_f(a), strata_f(b)))}; return r;
}
STRATA_DEV bool strata_lt(StrataBF16 a, StrataBF16 b) { return strata_f(a) < strata_f(b); }

template <typename T, int OP> STRATA_DEV T strata_combine(T a, T b) {
  if (OP == STRATA_OP_SUM) return strata_add(a, b);
  if (OP == STRATA_OP_PROD) return strata_mul(a, b);
  if (OP == STRATA_OP_MAX) return strata_lt(a, b) ? b : a;
  return strata_lt(b, a) ? b : a;
}

// 16 bytes of elements as one register vector (uint4) or as its N elements.
template <typename T> union StrataVec16 {
  uint4 u;
  T t[16 / sizeof(T)];
};
#define STRATA_EW_UNROLL 4

// acc[i] = op(acc[i], src[i]) for i < n (grid-stride). When both buffers are 16-byte
// aligned, each thread takes 16-byte vectors, STRATA_EW_UNROLL of them per round with
// every load issued before the first combine (NCCL's reduce loop does the same); the
// last n % N elements, and misaligned buffers, go element by element.
template <typename T, int OP>
STRATA_DEV void strata_reduce_body(T* acc, const T* src, strata_u64 n) {
  const strata_u64 step = (strata_u64)gridDim.x * blockDim.x;
  const strata_u64 tid = (strata_u64)blockIdx.x * blockDim.x + threadIdx.x;
  strata_u64 tail = 0;
  if (strata_aligned(acc, 16) && strata_aligned(src, 16)) {
    typedef StrataVec16<T> Vec;
    const int N = (int)(16 / sizeof(T));
    const int U = STRATA_EW_UNROLL;
    const strata_u64 nv = n / N;
    uint4* av = reinterpret_cast<uint4*>(acc);
    const uint4* sv = reinterpret_cast<const uint4*>(src);
    strata_u64 v = tid;
    for (; v + (U - 1) * step < nv; v += U * step) {
      Vec x[U], y[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        x[u].u = av[v + u * step];
        y[u].u = sv[v + u * step];
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int j = 0; j < N; ++j) x[u].t[j] = strata_combine<T, OP>(x[u].t[j], y[u].t[j]);
        av[v + u * step] = x[u].u;
      }
    }
    for (; v < nv; v += step) {
      Vec x, y;
      x.u = av[v];
      y.u = sv[v];
#pragma unroll
      for (int j = 0; j < N; ++j) x.t[j] = strata_combine<T, OP>(x.t[j], y.t[j]);
      av[v] = x.u;
    }
    tail = nv * N;
  }
  for (strata_u64 i = tail + tid; i < n; i += step) acc[i] = strata_combine<T, OP>(acc[i], src[i]);
}

// f64 -> element, as DataType::set.
STRATA_DEV double strata_clamp(double v, double lo, double hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}
STRATA_DEV signed char strata_from_f64(double v, signed char) {
  return (signed char)(int)strata_clamp(round(v), -128.0, 127.0);
}
STRATA_DEV unsigned char strata_from_f64(double v, unsigned char) {
  return (unsigned char)(int)strata_clamp(round(v), 0.0, 255.0);
}
STRATA_DEV int strata_from_f64(double v, int) {
  return (int)strata_clamp(round(v), -2147483648.0, 2147483647.0);
}
STRATA_DEV unsigned int strata_from_f64(double v, unsigned int) {
  return (unsigned int)strata_clamp(round(v), 0.0, 4294967295.0);
}
STRATA_DEV float strata_from_f64(double v, float) { return __double2float_rn(v); }
STRATA_DEV double strata_from_f64(double v, double) { return v; }
// f64 -> f16/bf16 rounded once: f64 to f32 rounding to odd (exact where f32 holds the
// value, else truncated with the last bit set), then f32 -> 16 bits to nearest even;
// f32 keeps >= 2 more bits than either, so the two steps equal one correct rounding.
STRATA_DEV float strata_f64_to_f32_odd(double v) {
  float f = (float)v;
  double d = (double)f;
  if (d == v || v != v) return f;
  if (isinf(f)) return __uint_as_float(v < 0 ? 0xff7fffffu : 0x7f7fffffu);
  unsigned int u = __float_as_uint(f);
  if (fabs(d) > fabs(v)) u -= 1u;  // one step toward zero (sign-magnitude)
  return __uint_as_float(u | 1u);
}
STRATA_DEV StrataF16 strata_from_f64(double v, StrataF16) {
  StrataF16 r = {strata_f32_to_f16(strata_f64_to_f32_odd(v))}; return r;
}
STRATA_DEV StrataBF16 strata_from_f64(double v, StrataBF16) {
  StrataBF16 r = {strata_f32_to_bf16(strata_f64_to_f32_odd(v))}; return r;
}
STRATA_DEV double strata_to_f64(signed char x) { return (double)x; }
STRATA_DEV double strata_to_f64(unsigned char x) { return (double)x; }
STRATA_DEV double strata_to_f64(int x) { return (double)x; }
STRATA_DEV double strata_to_f64(unsigned int x) { return (double)x; }
STRATA_DEV double strata_to_f64(float x) { return (double)x; }
STRATA_DEV double strata_to_f64(double x) { return x; }
STRATA_DEV double strata_to_f64(StrataF16 x) { return (double)strata_f(x); }
STRATA_DEV double strata_to_f64(StrataBF16 x) { return (double)strata_f(x); }

// x / n rounded once: through f64 for the types it holds exactly; 64-bit integers in
// integer arithmetic, rounded half away from zero (src/dtype.rs int_avg).
template <typename T> STRATA_DEV T strata_divide_one(T x, double n) {
  return strata_from_f64(strata_to_f64(x) / n, T());
}
// f32, f16 and bf16 when n is an f32 (n <= 2^24, the world size): the f32 quotient (one
// IEEE division) narrowed to nearest even. Rounding twice is then the same as rounding
// the exact quotient once: the first format keeps at least 2p + 2 bits of the p-bit
// result (f32: 24 >= 2 * 11 + 2 for f16, 2 * 8 + 2 for bf16; the CPU's f64: 53 >= 2 * 24
// + 2 for f32; Figueroa, "When is double rounding innocuous?", 1995), so this equals
// the f64 path of DataType::set bit for bit at a fraction of its cost.
STRATA_DEV float strata_f32_quotient(float x, double n, bool& ok) {
  const float nf = (float)n;
  ok = (double)nf == n;
  return ok ? x / nf : 0.0f;
}
STRATA_DEV float strata_divide_one(float x, double n) {
  bool ok;
  const float q = strata_f32_quotient(x, n, ok);
  return ok ? q : __double2float_rn((double)x / n);
}
STRATA_DEV StrataF16 strata_narrow(float q, StrataF16) {
  StrataF16 r = {strata_f32_to_f16(q)};
  return r;
}
STRATA_DEV StrataBF16 strata_narrow(float q, StrataBF16) {
  StrataBF16 r = {strata_f32_to_bf16(q)};
  return r;
}
template <typename H> STRATA_DEV H strata_divide_half(H x, double n) {
  bool ok;
  const float q = strata_f32_quotient(strata_f(x), n, ok);
  return ok ? strata_narrow(q, H()) : strata_from_f64(strata_to_f64(x) / n, H());
}
STRATA_DEV StrataF16 strata_divide_one(StrataF16 x, double n) { return strata_divide_half(x, n); }
STRATA_DEV StrataBF16 strata_divide_one(StrataBF16 x, double n) { return strata_divide_half(x, n); }
STRATA_DEV long long strata_divide_one(long long x, double n) {
  long long d = (long long)n, q = x / d, r = x % d;
  strata_u64 twice = 2 * (strata_u64)(r < 0 ? -r : r);
  return twice >= (strata_u64)d ? q + (x < 0 ? -1 : 1) : q;
}
STRATA_DEV unsigned long long strata_divide_one(unsigned long long x, double n) {
  unsigned long long d = (unsigned long long)n, q = x / d, r = x % d;
  return r >= d - r ? q + 1 : q;
}

// buf[i] = buf[i] / n, rounded once (the exact mean of Avg); 16-byte vectors as in
// strata_reduce_body when buf is aligned.
template <typename T> STRATA_DEV void strata_divide_body(T* buf, strata_u64 count, double n) {
  const strata_u64 step = (strata_u64)gridDim.x * blockDim.x;
  const strata_u64 tid = (strata_u64)blockIdx.x * blockDim.x + threadIdx.x;
  strata_u64 tail = 0;
  if (strata_aligned(buf, 16)) {
    typedef StrataVec16<T> Vec;
    const int N = (int)(16 / sizeof(T));
    const int U = STRATA_EW_UNROLL;
    const strata_u64 nv = count / N;
    uint4* bv = reinterpret_cast<uint4*>(buf);
    strata_u64 v = tid;
    for (; v + (U - 1) * step < nv; v += U * step) {
      Vec x[U];
#pragma unroll
      for (int u = 0; u < U; ++u) x[u].u = bv[v + u * step];
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int j = 0; j < N; ++j) x[u].t[j] = strata_divide_one(x[u].t[j], n);
        bv[v + u * step] = x[u].u;
      }
    }
    for (; v < nv; v += step) {
      Vec x;
      x.u = bv[v];
#pragma unroll
      for (int j = 0; j < N; ++j) x.t[j] = strata_divide_one(x.t[j], n);
      bv[v] = x.u;
    }
    tail = nv * N;
  }
  for (strata_u64 i = tail + tid; i < count; i += step) buf[i] = strata_divide_one(buf[i], n);
}

#define STRATA_REDUCE_KERNEL(DTN, T, OPN, OP)                                               \
  extern "C" __global__ void strata_reduce_##DTN##_##OPN(T* acc, const T* src,              \
                                                         strata_u64 n) {                    \
    strata_reduce_body<T, OP>(acc, src, n);                                                 \
  }
#define STRATA_REDUCE_TYPE(DTN, T)                                                          \
  STRATA_REDUCE_KERNEL(DTN, T, sum, STRATA_OP_SUM)                                          \
  STRATA_REDUCE_KERNEL(DTN, T, prod, STRATA_OP_PROD)                                        \
  STRATA_REDUCE_KERNEL(DTN, T, max, STRATA_OP_MAX)                                          \
  STRATA_REDUCE_KERNEL(DTN, T, min, STRATA_OP_MIN)                                          \
  extern "C" __global__ void strata_divide_##DTN(T* buf, strata_u64 count, double n) {      \
    strata_divide_body<T>(buf, count, n);                                                   \
  }
#define STRATA_REDUCE_KERNELS()                                                             \
  STRATA_REDUCE_TYPE(f32, float)                                                            \
  STRATA_REDUCE_TYPE(f16, StrataF16)                                                        \
  STRATA_REDUCE_TYPE(bf16, StrataBF16)                                                      \
  STRATA_REDUCE_TYPE(i8, signed char)                                                       \
  STRATA_REDUCE_TYPE(u8, unsigned char)                                                     \
  STRATA_REDUCE_TYPE(i32, int)                                                              \
  STRATA_REDUCE_TYPE(u32, unsigned int)                                                     \
  STRATA_REDUCE_TYPE(i64, long long)                                                        \
  STRATA_REDUCE_TYPE(u64, unsigned long long)                                               \
  STRATA_REDUCE_TYPE(f64, double)

#endif  // STRATA_REDUCE_CUH
