// Runs one kernel of strata_quant.cuh or strata_reduce.cuh on the CPU (see include/cuda_fp16.h):
//   emu KERNEL GRID THREADS IN_FILE IN_OFF OUT_FILE OUT_OFF GUARD FIELD...
// IN_FILE is placed at byte IN_OFF of a 64-byte-aligned buffer, OUT_FILE (poisoned,
// with GUARD bytes on each side of the output) at OUT_OFF; the kernel reads from the
// input and writes at OUT_OFF + GUARD; the whole OUT_FILE region is written back.
// FIELDs are the u64/u32 fields of the kernel's argument block after the two pointers,
// in order (tests/gpu_kernels_compile.rs builds them from src/kernels_gpu/plan.rs).
//
// The element-wise kernels of strata_reduce.cuh take the same command line; OUT_FILE
// then holds the buffer the kernel updates in place (GUARD bytes, the body, GUARD bytes):
//   strata_reduce_{DT}_{OP}: acc = the body, src = the input, FIELDs: n;
//   strata_divide_{DT}:      buf = the body (no input: IN_FILE may be empty),
//                            FIELDs: count, then n as the bits of an f64.
#include "../strata_quant.cu"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

thread_local strata_emu_dim3 threadIdx, blockIdx;
strata_emu_dim3 blockDim, gridDim;
std::barrier<>* strata_emu_barrier;
float strata_emu_shfl[1024];
unsigned int strata_emu_shfl_u[1024];

static std::vector<unsigned char> slurp(const char* path) {
  std::vector<unsigned char> v;
  FILE* f = std::fopen(path, "rb");
  if (!f) { std::perror(path); std::exit(2); }
  unsigned char buf[65536];
  size_t r;
  while ((r = std::fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + r);
  std::fclose(f);
  return v;
}

// Runs `k()` as a kernel launch of `grid` blocks of `threads` threads.
template <class K>
static void launch_fn(K k, unsigned grid, unsigned threads) {
  blockDim = {threads, 1, 1};
  gridDim = {grid, 1, 1};
  // One OS thread per CUDA thread of a block; the blocks run one after the other, with
  // a barrier between them (so __shared__ statics are never used by two blocks at once).
  std::barrier<> bar(threads);
  strata_emu_barrier = &bar;
  std::vector<std::thread> ts;
  ts.reserve(threads);
  for (unsigned t = 0; t < threads; ++t)
    ts.emplace_back([=, &bar] {
      threadIdx = {t, 0, 0};
      for (unsigned b = 0; b < grid; ++b) {
        blockIdx = {b, 0, 0};
        k();
        bar.arrive_and_wait();
      }
    });
  for (auto& t : ts) t.join();
}

template <class Args>
static void launch(void (*k)(Args), Args a, unsigned grid, unsigned threads) {
  launch_fn([=] { k(a); }, grid, threads);
}

int main(int argc, char** argv) {
  if (argc < 10) { std::fprintf(stderr, "usage: see emu.cpp\n"); return 2; }
  const std::string name = argv[1];
  const unsigned grid = (unsigned)std::strtoul(argv[2], 0, 10);
  const unsigned threads = (unsigned)std::strtoul(argv[3], 0, 10);
  std::vector<unsigned char> in = slurp(argv[4]);
  const size_t in_off = std::strtoull(argv[5], 0, 10);
  std::vector<unsigned char> out = slurp(argv[6]);
  const size_t out_off = std::strtoull(argv[7], 0, 10);
  const size_t guard = std::strtoull(argv[8], 0, 10);
  std::vector<unsigned long long> f;
  for (int i = 9; i < argc; ++i) f.push_back(std::strtoull(argv[i], 0, 0));

  unsigned char* ib = (unsigned char*)std::aligned_alloc(64, ((in.size() + in_off) / 64 + 1) * 64);
  unsigned char* ob = (unsigned char*)std::aligned_alloc(64, ((out.size() + out_off) / 64 + 1) * 64);
  if (!in.empty()) std::memcpy(ib + in_off, in.data(), in.size());
  std::memcpy(ob + out_off, out.data(), out.size());
  const unsigned char* ip = ib + in_off;
  unsigned char* op = ob + out_off + guard;

  bool found = false;
#define EMU_Q(DTN, BITS)                                                              \
  if (name == "strata_quantize_" #DTN "_q" #BITS) {                                   \
    StrataQuantArgs a{ip, op, f[0], f[1], f[2], f[3], f[4], f[5], (strata_u32)f[6], 0}; \
    launch(strata_quantize_##DTN##_q##BITS, a, grid, threads);                          \
    found = true;                                                                     \
  }                                                                                   \
  if (name == "strata_dequantize_" #DTN "_q" #BITS) {                                \
    StrataDequantArgs a{ip, op, f[0], f[1], f[2], f[3], f[4], f[5],                   \
                        (strata_u32)f[6], (strata_u32)f[7], __uint_as_float((unsigned)f[8]), 0}; \
    launch(strata_dequantize_##DTN##_q##BITS, a, grid, threads);                        \
    found = true;                                                                     \
  }                                                                                   \
  if (name == "strata_dequant_reduce_" #DTN "_q" #BITS) {                             \
    StrataDequantArgs a{ip, op, f[0], f[1], f[2], f[3], f[4], f[5],                   \
                        (strata_u32)f[6], (strata_u32)f[7], __uint_as_float((unsigned)f[8]), 0}; \
    launch(strata_dequant_reduce_##DTN##_q##BITS, a, grid, threads);                    \
    found = true;                                                                     \
  }
  EMU_Q(f32, 8) EMU_Q(f32, 4) EMU_Q(f16, 8) EMU_Q(f16, 4) EMU_Q(bf16, 8) EMU_Q(bf16, 4)
#define EMU_DRQ(BITS)                                                                 \
  if (name == "strata_dequant_reduce_quant_q" #BITS) {                                \
    StrataDrqArgs a{ip, op, f[0], f[1], f[2], f[3], f[4], f[5], (strata_u32)f[6], 0};   \
    launch(strata_dequant_reduce_quant_q##BITS, a, grid, threads);                      \
    found = true;                                                                     \
  }
  EMU_DRQ(8) EMU_DRQ(4)
#define EMU_RED1(DTN, T, OPN)                                                         \
  if (name == "strata_reduce_" #DTN "_" #OPN) {                                       \
    T* acc = (T*)op;                                                                  \
    const T* src = (const T*)ip;                                                      \
    const strata_u64 n = f.at(0);                                                     \
    launch_fn([=] { strata_reduce_##DTN##_##OPN(acc, src, n); }, grid, threads);      \
    found = true;                                                                     \
  }
#define EMU_RED(DTN, T)                                                               \
  EMU_RED1(DTN, T, sum) EMU_RED1(DTN, T, prod) EMU_RED1(DTN, T, max)                  \
  EMU_RED1(DTN, T, min)                                                               \
  if (name == "strata_divide_" #DTN) {                                                \
    T* buf = (T*)op;                                                                  \
    const strata_u64 count = f.at(0);                                                 \
    double n;                                                                         \
    const unsigned long long nb = f.at(1);                                            \
    std::memcpy(&n, &nb, 8);                                                          \
    launch_fn([=] { strata_divide_##DTN(buf, count, n); }, grid, threads);            \
    found = true;                                                                     \
  }
  EMU_RED(f32, float) EMU_RED(f16, StrataF16) EMU_RED(bf16, StrataBF16)
  EMU_RED(i8, signed char) EMU_RED(u8, unsigned char) EMU_RED(i32, int)
  EMU_RED(u32, unsigned int) EMU_RED(i64, long long) EMU_RED(u64, unsigned long long)
  EMU_RED(f64, double)
  if (!found) { std::fprintf(stderr, "unknown kernel %s\n", name.c_str()); return 2; }

  FILE* o = std::fopen(argv[6], "wb");
  if (!o || std::fwrite(ob + out_off, 1, out.size(), o) != out.size()) { std::perror(argv[6]); return 2; }
  std::fclose(o);
  return 0;
}
