/*
 * libstrata_nccl.so (NCCL's API in front of the real libnccl.so.2, docs/nccl.md) on a GPU
 * with the real NCCL behind it (issue 67, "Checks with a GPU"). No CUDA toolkit or
 * nccl.h is needed to build it: the few NCCL types are declared below, and the driver
 * API (libcuda.so.1), the front and the real libnccl are loaded with dlopen.
 * scripts/gpu-all --build compiles it into the bundle (cc -Wall -Wextra -Werror, -ldl).
 *
 *   gpu-nccl-front check FRONT      FRONT: the path of libstrata_nccl.so (dlopen'ed),
 *                                   `preload` (the program runs under
 *                                   LD_PRELOAD=libstrata_nccl.so: the functions are
 *                                   looked up with RTLD_DEFAULT and must lie in it) or
 *                                   `audit` (under LD_AUDIT=libstrata_nccl_audit.so:
 *                                   dlopen("libnccl.so.2") must give libstrata_nccl.so)
 *   gpu-nccl-front cost FRONT [--bar R] [--batch B] [--reps N]
 *   [--ranks N]                     (check) ranks, one per GPU: default every GPU, at most 8
 *
 * The real library: STRATA_NCCL_LIB (what the front reads too; scripts/gpu-all sets it),
 * else libnccl.so.2. The program dlopens it as well (RTLD_LOCAL: the same copy the front
 * loaded) for the direct calls it compares against (not under LD_AUDIT: there every
 * libnccl.so.2 opened by the program is the front).
 *
 * check: ncclCommInitAll over N GPUs (one rank per GPU; NCCL refuses two ranks on one)
 *   through the front, and:
 *   - ncclGetVersion through the front equals the real library's; ncclGetErrorString
 *     equals the real one's; the front's communicators are the real library's (its own
 *     ncclCommCount takes them); ncclCommCount/UserRank/CuDevice/GetAsyncError;
 *   - every served collective (AllReduce, Reduce, ReduceScatter, AllGather, Broadcast,
 *     Bcast, AlltoAll, Gather, Scatter, Send/Recv in a ring), each issued for every rank
 *     in a group, in every type NCCL has but fp8 (int8, uint8, int32, uint32, int64,
 *     uint64, half, float, double, bfloat16), the reductions with every op (sum, prod,
 *     max, min, avg, PreMulSum with its scalar on the host), 1003 elements, on device
 *     buffers, checked element by element against a host reference (integers small
 *     enough to be exact in every type; avg of floats within 1%), and the bytes after
 *     each output untouched; in place for AllReduce, AllGather and ReduceScatter;
 *     PreMulSum with a device scalar; one group mixing an all-gather, a reduce-scatter
 *     and send/recv; the nccl*Config forms (where the real library has them; where it
 *     has not, the front must return ncclInternalError); ncclCommSplit and a collective
 *     on the split; ncclMemAlloc + ncclCommRegister'ed buffers;
 *   - a forwarded function through the front's trampoline: ncclCommMemStats equal to the
 *     real one's on the same communicator (where the real library has it; else
 *     ncclResetDebugInit is called);
 *   prints "nccl-front-c OK checks=K (...)" and exits 0, else "FAIL ..." and exits 1.
 * cost: the host time of a 1 KiB ncclAllReduce (256 floats, sum, out of place, one
 *   rank) through the front against the real library's ncclAllReduce called directly
 *   (dlsym on the real library), same communicator, stream and buffers: batches of B
 *   back-to-back calls (default 50), the stream synchronized between batches, the two
 *   alternating (which goes first alternates too), the median over N batches (default
 *   41) of each. Prints "nccl-front-cost: ratio X.XX (front A us, direct B us)" and
 *   fails over the bar (default 1.2, the issue's) or on a wrong result.
 *
 * With STRATA_NCCL_DEVICE=cpu the front serves every call on strata's CPU device and
 * nothing is compared with the real library: with a stand-in libcuda.so.1 whose device
 * memory is host memory, that runs this program's own logic where there is no GPU.
 *
 * Exit 77 without a CUDA driver, a device or the real libnccl (skipped).
 */
#define _GNU_SOURCE /* dladdr, RTLD_DEFAULT */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long checks;
#define CHECK_PASSED() (checks++)
#include "gpu-driver.h"

/* ------------------------------------------------------------------ NCCL's API */
typedef struct {
  char internal[128];
} ncclUniqueId;
typedef void *ncclComm_t;
typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
enum { ncclInternalError = 3, ncclInvalidArgument = 4 };
enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, PREMUL = 100 };
enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 };
enum { NTYPES = 10 }; /* ncclInt8 .. ncclBfloat16 (0..9); fp8 (10, 11) left out */
enum { I8, U8, I32, U32, I64, U64, F16, F32, F64, BF16 };
static const char *TNAME[NTYPES] = {"int8", "uint8", "int32", "uint32", "int64",
                                    "uint64", "half", "float", "double", "bfloat16"};
static const size_t TSIZE[NTYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

/* ncclCollConfig_t of NCCL 2.32 (nccl.h's NCCL_COLLCONFIG_INITIALIZER below). */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  void *ext;
  int minCTAs, maxCTAs, nvlsCTAs, cgaClusterSize;
  void *algSelection;
  int forceAlgSelection;
  int CTAPolicy;
  uint64_t userProfilerTag;
  void *launchCompletionEvent;
} ncclCollConfig_t;
#define UNDEF_INT (-2147483647 - 1)
static const ncclCollConfig_t COLL_CONFIG = {
    sizeof(ncclCollConfig_t), 0xcafebeef, 23203, NULL, UNDEF_INT, UNDEF_INT, UNDEF_INT,
    UNDEF_INT, NULL, 1, UNDEF_INT, 0, NULL};

/* The functions, through the front (f_) and directly from the real library (r_). */
typedef struct {
  ncclResult_t (*GetVersion)(int *);
  const char *(*GetErrorString)(ncclResult_t);
  const char *(*GetLastError)(ncclComm_t);
  ncclResult_t (*CommInitAll)(ncclComm_t *, int, const int *);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*CommFinalize)(ncclComm_t);
  ncclResult_t (*CommSplit)(ncclComm_t, int, int, ncclComm_t *, void *);
  ncclResult_t (*CommCount)(ncclComm_t, int *);
  ncclResult_t (*CommUserRank)(ncclComm_t, int *);
  ncclResult_t (*CommCuDevice)(ncclComm_t, int *);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
  ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, CUstream);
  ncclResult_t (*Reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, CUstream);
  ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, CUstream);
  ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, CUstream);
  ncclResult_t (*Broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, CUstream);
  ncclResult_t (*Bcast)(void *, size_t, ncclDataType_t, int, ncclComm_t, CUstream);
  ncclResult_t (*AlltoAll)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, CUstream);
  ncclResult_t (*Gather)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, CUstream);
  ncclResult_t (*Scatter)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, CUstream);
  ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, CUstream);
  ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, CUstream);
  ncclResult_t (*AllReduceConfig)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, CUstream, const ncclCollConfig_t *);
  ncclResult_t (*ReduceConfig)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, CUstream, const ncclCollConfig_t *);
  ncclResult_t (*ReduceScatterConfig)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, CUstream, const ncclCollConfig_t *);
  ncclResult_t (*AllGatherConfig)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, CUstream, const ncclCollConfig_t *);
  ncclResult_t (*BroadcastConfig)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, CUstream, const ncclCollConfig_t *);
  ncclResult_t (*AlltoAllConfig)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, CUstream, const ncclCollConfig_t *);
  ncclResult_t (*GatherConfig)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, CUstream, const ncclCollConfig_t *);
  ncclResult_t (*ScatterConfig)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, CUstream, const ncclCollConfig_t *);
  ncclResult_t (*GroupStart)(void);
  ncclResult_t (*GroupEnd)(void);
  ncclResult_t (*RedOpCreatePreMulSum)(ncclRedOp_t *, void *, ncclDataType_t, int, ncclComm_t);
  ncclResult_t (*RedOpDestroy)(ncclRedOp_t, ncclComm_t);
  ncclResult_t (*MemAlloc)(void **, size_t);
  ncclResult_t (*MemFree)(void *);
  ncclResult_t (*CommRegister)(ncclComm_t, void *, size_t, void **);
  ncclResult_t (*CommDeregister)(ncclComm_t, void *);
  ncclResult_t (*CommMemStats)(ncclComm_t, int, uint64_t *); /* forwarded */
  void (*ResetDebugInit)(void);                              /* forwarded */
} Nccl;

/* Entry i of Nccl is "nccl" NAMES[i] (the same order as the fields). */
static const char *NAMES[] = {
    "GetVersion", "GetErrorString", "GetLastError", "CommInitAll", "CommDestroy", "CommFinalize",
    "CommSplit", "CommCount", "CommUserRank", "CommCuDevice", "CommGetAsyncError", "AllReduce",
    "Reduce", "ReduceScatter", "AllGather", "Broadcast", "Bcast", "AlltoAll", "Gather", "Scatter",
    "Send", "Recv", "AllReduceConfig", "ReduceConfig", "ReduceScatterConfig", "AllGatherConfig",
    "BroadcastConfig", "AlltoAllConfig", "GatherConfig", "ScatterConfig", "GroupStart", "GroupEnd",
    "RedOpCreatePreMulSum", "RedOpDestroy", "MemAlloc", "MemFree", "CommRegister",
    "CommDeregister", "CommMemStats", "ResetDebugInit"};
_Static_assert(sizeof(NAMES) / sizeof(*NAMES) == sizeof(Nccl) / sizeof(void *), "NAMES and Nccl differ");

static Nccl F, R;    /* the front's functions; the real library's (NULL where it lacks one) */
static int have_real; /* R loaded (not under LD_AUDIT) */
static void *real;    /* its handle */
static int cpu;       /* STRATA_NCCL_DEVICE=cpu (main) */

/* Fills `t` from `lib` (RTLD_DEFAULT included); `need`: every served name must be there. */
static void lookup(void *lib, Nccl *t, const char *what, int need) {
  void **slot = (void **)t;
  for (size_t i = 0; i < sizeof NAMES / sizeof *NAMES; i++) {
    char name[64];
    snprintf(name, sizeof name, "nccl%s", NAMES[i]);
    void *p = dlsym(lib, name);
    if (!p && need) FAIL("%s has no %s", what, name);
    memcpy(&slot[i], &p, sizeof p);
  }
}

/* The object `fn` lies in. */
static const char *object_of(const void *fn) {
  Dl_info info;
  return dladdr(fn, &info) && info.dli_fname ? info.dli_fname : "(unknown)";
}

static const char *real_name(void) {
  const char *e = getenv("STRATA_NCCL_LIB");
  return e && *e ? e : "libnccl.so.2";
}

#define NC(call)                                                                   \
  do {                                                                             \
    ncclResult_t n_ = (call);                                                      \
    if (n_ != 0)                                                                   \
      FAIL("%s -> ncclResult %d (%s): %s", #call, n_, F.GetErrorString(n_),        \
           F.GetLastError ? F.GetLastError(NULL) : "");                            \
    CHECK_PASSED();                                                                \
  } while (0)

static void *vp(CUdeviceptr p) { return (void *)(uintptr_t)p; }

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ------------------------------------------------------------------ the GPUs */
enum { MAXR = 8 };
static int NR = 1; /* ranks, one per device */
static CUcontext ctx[MAXR];
static CUstream stream[MAXR];
static ncclComm_t comm[MAXR];

static void use(int r) { CU(cuCtxSetCurrent(ctx[r])); }

static void open_devices(int want) {
  open_device0("gpu-nccl-front"); /* exit 77 without a driver or device */
  CUresult (*count)(int *) = NULL;
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (cuda) load(cuda, "libcuda", "cuDeviceGetCount", &count);
  int n = 1;
  if (count) CU(count(&n));
  if (want > 0 && want < n) n = want;
  NR = n < MAXR ? n : MAXR;
  for (int r = 0; r < NR; r++) {
    CUdevice d;
    CU(cuDeviceGet(&d, r));
    CU(cuDevicePrimaryCtxRetain(&ctx[r], d));
    use(r);
    CU(cuStreamCreate(&stream[r], 1 /* CU_STREAM_NON_BLOCKING */));
  }
  use(0);
}

static void sync_all(void) {
  for (int r = 0; r < NR; r++) {
    use(r);
    CU(cuStreamSynchronize(stream[r]));
  }
}

/* ------------------------------------------------------------------ values */
/* Small integers and their encodings, exact in every type (|v| <= 2048 for half). */
static uint16_t to_half(double v) {
  if (v == 0) return 0;
  int e = 0;
  double m = v;
  while (m >= 2) m /= 2, e++;
  while (m < 1) m *= 2, e--;
  return (uint16_t)(((e + 15) << 10) | (int)((m - 1) * 1024));
}
static double from_half(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? m / 1024.0 / 16384.0 : (1 + m / 1024.0) * (e >= 15 ? (double)(1 << (e - 15)) : 1.0 / (1 << (15 - e)));
  return (h & 0x8000) ? -v : v;
}
static void put(int t, void *p, size_t i, double v) {
  char *b = (char *)p + i * TSIZE[t];
  switch (t) {
    case I8: { int8_t x = (int8_t)v; memcpy(b, &x, 1); break; }
    case U8: { uint8_t x = (uint8_t)v; memcpy(b, &x, 1); break; }
    case I32: { int32_t x = (int32_t)v; memcpy(b, &x, 4); break; }
    case U32: { uint32_t x = (uint32_t)v; memcpy(b, &x, 4); break; }
    case I64: { int64_t x = (int64_t)v; memcpy(b, &x, 8); break; }
    case U64: { uint64_t x = (uint64_t)v; memcpy(b, &x, 8); break; }
    case F16: { uint16_t x = to_half(v); memcpy(b, &x, 2); break; }
    case F32: { float x = (float)v; memcpy(b, &x, 4); break; }
    case F64: memcpy(b, &v, 8); break;
    case BF16: { float f = (float)v; uint32_t u; memcpy(&u, &f, 4); uint16_t x = (uint16_t)(u >> 16); memcpy(b, &x, 2); break; }
  }
}
static double get(int t, const void *p, size_t i) {
  const char *b = (const char *)p + i * TSIZE[t];
  switch (t) {
    case I8: { int8_t x; memcpy(&x, b, 1); return x; }
    case U8: { uint8_t x; memcpy(&x, b, 1); return x; }
    case I32: { int32_t x; memcpy(&x, b, 4); return x; }
    case U32: { uint32_t x; memcpy(&x, b, 4); return x; }
    case I64: { int64_t x; memcpy(&x, b, 8); return (double)x; }
    case U64: { uint64_t x; memcpy(&x, b, 8); return (double)x; }
    case F16: { uint16_t x; memcpy(&x, b, 2); return from_half(x); }
    case F32: { float x; memcpy(&x, b, 4); return x; }
    case F64: { double x; memcpy(&x, b, 8); return x; }
    case BF16: { uint16_t x; memcpy(&x, b, 2); uint32_t u = (uint32_t)x << 16; float f; memcpy(&f, &u, 4); return f; }
  }
  return 0;
}

/* Rank r's input element k for op: sums of NR of them stay <= 24; a product has one
   factor above 1; avg's inputs are the same on every rank (so the mean is exact). */
static double gen(int op, int r, size_t k) {
  switch (op) {
    case ncclProd: return r == (int)(k % (size_t)NR) ? 1 + (double)(k % 3) : 1;
    case ncclAvg: return 1 + (double)(k % 3);
    default: return 1 + (double)(((size_t)r + k) % 3);
  }
}
static const double SCALAR = 2; /* PreMulSum's */
static double reduce_ref(int op, size_t k) {
  double a = gen(op, 0, k);
  for (int r = 1; r < NR; r++) {
    double b = gen(op, r, k);
    switch (op) {
      case ncclProd: a *= b; break;
      case ncclMax: a = a > b ? a : b; break;
      case ncclMin: a = a < b ? a : b; break;
      default: a += b; break;
    }
  }
  if (op == ncclAvg) a /= NR;
  if (op == PREMUL) a *= SCALAR;
  return a;
}

/* ------------------------------------------------------------------ one collective */
enum { AR, RED, RS, AG, BC, BCAST, A2A, GATHER, SCATTER, SENDRECV, NKINDS };
static const char *KNAME[NKINDS] = {"AllReduce", "Reduce", "ReduceScatter", "AllGather", "Broadcast",
                                    "Bcast", "AlltoAll", "Gather", "Scatter", "Send/Recv"};
enum { C = 1003, GUARD = 64 };
static CUdeviceptr sendb[MAXR], recvb[MAXR];
static size_t BUFBYTES;
static char *host;

static int is_reduction(int k) { return k == AR || k == RED || k == RS; }
static int root(void) { return NR - 1; }

/* Elements of rank r's input and output of kind k (count C per rank). */
static size_t in_len(int k) { return (k == RS || k == A2A || k == SCATTER) ? (size_t)NR * C : C; }
static size_t out_len(int k) { return (k == AG || k == A2A || k == GATHER) ? (size_t)NR * C : C; }

/* Rank r's expected output element i into *v; 0 when rank r has no output. */
static int want(int k, int op, int r, size_t i, double *v) {
  int rt = root();
  switch (k) {
    case AR: *v = reduce_ref(op, i); return 1;
    case RED: if (r != rt) return 0; *v = reduce_ref(op, i); return 1;
    case RS: *v = reduce_ref(op, (size_t)r * C + i); return 1;
    case AG: *v = gen(ncclSum, (int)(i / C), i % C); return 1;
    case BC: case BCAST: *v = gen(ncclSum, rt, i); return 1;
    case A2A: *v = gen(ncclSum, (int)(i / C), (size_t)r * C + i % C); return 1;
    case GATHER: if (r != rt) return 0; *v = gen(ncclSum, (int)(i / C), i % C); return 1;
    case SCATTER: *v = gen(ncclSum, rt, (size_t)r * C + i); return 1;
    case SENDRECV: *v = gen(ncclSum, (r + NR - 1) % NR, i); return 1;
  }
  return 0;
}

/* Where rank r's input and output lie (byte offsets in recvb for in place, else the
   input at sendb). */
typedef struct {
  CUdeviceptr in, out;
} Place;
static Place place(int k, int r, int t, int inplace) {
  size_t sz = TSIZE[t];
  Place p = {sendb[r], recvb[r]};
  if (k == BCAST) p.in = p.out = recvb[r];
  if (inplace) {
    if (k == AR) p.in = p.out = recvb[r];
    if (k == AG) p.in = recvb[r] + (CUdeviceptr)((size_t)r * C * sz), p.out = recvb[r];
    if (k == RS) p.in = recvb[r], p.out = recvb[r] + (CUdeviceptr)((size_t)r * C * sz);
  }
  return p;
}

/* Rank r's nccl*Config call of kind k; its result. */
static ncclResult_t issue_config(int k, int r, int t, ncclRedOp_t op, Place p) {
  const ncclCollConfig_t *c = &COLL_CONFIG;
  void *in = vp(p.in), *out = vp(p.out);
  ncclComm_t m = comm[r];
  CUstream s = stream[r];
  int rt = root();
  use(r);
  switch (k) {
    case AR: return F.AllReduceConfig(in, out, C, t, op, m, s, c);
    case RED: return F.ReduceConfig(in, out, C, t, op, rt, m, s, c);
    case RS: return F.ReduceScatterConfig(in, out, C, t, op, m, s, c);
    case AG: return F.AllGatherConfig(in, out, C, t, m, s, c);
    case BC: return F.BroadcastConfig(in, out, C, t, rt, m, s, c);
    case A2A: return F.AlltoAllConfig(in, out, C, t, m, s, c);
    case GATHER: return F.GatherConfig(in, out, C, t, rt, m, s, c);
    case SCATTER: return F.ScatterConfig(in, out, C, t, rt, m, s, c);
  }
  FAIL("no nccl*Config form of %s", KNAME[k]);
}

/* Rank r's call of kind k (inside a group). cfg: the nccl*Config form. */
static void issue(int k, int r, int t, ncclRedOp_t op, Place p, int cfg) {
  void *in = vp(p.in), *out = vp(p.out);
  ncclComm_t m = comm[r];
  CUstream s = stream[r];
  int rt = root();
  if (cfg) {
    NC(issue_config(k, r, t, op, p));
    return;
  }
  use(r);
  switch (k) {
    case AR: NC(F.AllReduce(in, out, C, t, op, m, s)); break;
    case RED: NC(F.Reduce(in, out, C, t, op, rt, m, s)); break;
    case RS: NC(F.ReduceScatter(in, out, C, t, op, m, s)); break;
    case AG: NC(F.AllGather(in, out, C, t, m, s)); break;
    case BC: NC(F.Broadcast(in, out, C, t, rt, m, s)); break;
    case BCAST: NC(F.Bcast(out, C, t, rt, m, s)); break;
    case A2A: NC(F.AlltoAll(in, out, C, t, m, s)); break;
    case GATHER: NC(F.Gather(in, out, C, t, rt, m, s)); break;
    case SCATTER: NC(F.Scatter(in, out, C, t, rt, m, s)); break;
    case SENDRECV:
      NC(F.Send(in, C, t, (r + 1) % NR, m, s));
      NC(F.Recv(out, C, t, (r + NR - 1) % NR, m, s));
      break;
  }
}

/* Fills rank r's input and poisons its output (0xff bytes over the whole recv buffer). */
static void prepare(int k, int r, int t, int op, Place p) {
  use(r);
  CU(cuMemsetD32Async(recvb[r], 0xffffffffu, BUFBYTES / 4, stream[r]));
  CU(cuStreamSynchronize(stream[r]));
  size_t n = in_len(k);
  int gop = is_reduction(k) ? (op == PREMUL ? ncclSum : op) : ncclSum;
  for (size_t i = 0; i < n; i++) put(t, host, i, gen(gop, r, i));
  CU(cuMemcpyHtoD(p.in, host, n * TSIZE[t]));
}

/* Rank r's output against the reference, and the bytes after it still 0xff. */
static void verify(int k, int r, int t, int op, Place p, const char *label) {
  use(r);
  CU(cuMemcpyDtoH(host, recvb[r], BUFBYTES));
  size_t off = (size_t)(p.out - recvb[r]), n = out_len(k), sz = TSIZE[t];
  size_t end = off + n * sz;
  if (p.in >= recvb[r] && p.in < recvb[r] + BUFBYTES) { /* in place: the input may end later */
    size_t ie = (size_t)(p.in - recvb[r]) + in_len(k) * sz;
    if (ie > end) end = ie;
  }
  double w;
  if (!want(k, op, r, 0, &w)) return; /* no output on this rank */
  size_t wrong = 0, first = 0;
  double fw = 0, fg = 0;
  for (size_t i = 0; i < n; i++) {
    want(k, op, r, i, &w);
    double g = get(t, host + off, i);
    int ok = (op == ncclAvg && (t == F16 || t == BF16 || t == F32 || t == F64))
                 ? (g - w <= 0.01 * w && w - g <= 0.01 * w)
                 : g == w;
    if (!ok && wrong++ == 0) first = i, fw = w, fg = g;
  }
  CHECK(wrong == 0, "%s: rank %d: %zu of %zu elements wrong, the first [%zu] %g (want %g)", label, r,
        wrong, n, first, fg, fw);
  size_t b = end;
  while (b < BUFBYTES && (unsigned char)host[b] == 0xff) b++;
  CHECK(b == BUFBYTES, "%s: rank %d: byte %zu after the output written", label, r, b - end);
}

static const char *opname(int op) {
  static const char *n[] = {"sum", "prod", "max", "min", "avg"};
  return op == PREMUL ? "premulsum" : n[op];
}

/* Kind k in type t with op, for every rank in one group, checked. */
static void run(int k, int t, int op, int inplace, int cfg) {
  char label[128];
  snprintf(label, sizeof label, "%s%s %s%s%s%s", KNAME[k], cfg ? "Config" : "", TNAME[t],
           is_reduction(k) ? " " : "", is_reduction(k) ? opname(op) : "", inplace ? " in place" : "");
  Place p[MAXR];
  ncclRedOp_t rop[MAXR];
  for (int r = 0; r < NR; r++) {
    p[r] = place(k, r, t, inplace);
    prepare(k, r, t, op, p[r]);
    rop[r] = op;
    if (op == PREMUL) {
      char scalar[8];
      put(t, scalar, 0, SCALAR);
      NC(F.RedOpCreatePreMulSum(&rop[r], scalar, t, ncclScalarHostImmediate, comm[r]));
    }
  }
  NC(F.GroupStart());
  for (int r = 0; r < NR; r++) issue(k, r, t, rop[r], p[r], cfg);
  NC(F.GroupEnd());
  sync_all();
  for (int r = 0; r < NR; r++) verify(k, r, t, op, p[r], label);
  if (op == PREMUL)
    for (int r = 0; r < NR; r++) NC(F.RedOpDestroy(rop[r], comm[r]));
}

/* ------------------------------------------------------------------ check */
static int check(const char *how) {
  int ndev[MAXR];
  for (int r = 0; r < NR; r++) ndev[r] = r;
  NC(F.CommInitAll(comm, NR, ndev));
  int version = 0, real_version = -1;
  NC(F.GetVersion(&version));
  if (have_real) {
    NC(R.GetVersion(&real_version));
    CHECK(version == real_version, "ncclGetVersion: the front says %d, the real library %d", version, real_version);
    CHECK(!strcmp(F.GetErrorString(ncclInvalidArgument), R.GetErrorString(ncclInvalidArgument)),
          "ncclGetErrorString(4): the front says \"%s\", the real library \"%s\"",
          F.GetErrorString(ncclInvalidArgument), R.GetErrorString(ncclInvalidArgument));
  }
  for (int r = 0; r < NR; r++) {
    int n = -1, rank = -1, dev = -1;
    ncclResult_t async = -1;
    NC(F.CommCount(comm[r], &n));
    NC(F.CommUserRank(comm[r], &rank));
    NC(F.CommCuDevice(comm[r], &dev));
    NC(F.CommGetAsyncError(comm[r], &async));
    CHECK(n == NR && rank == r && (dev == r || cpu) && async == 0, "rank %d: count %d, rank %d, device %d, async %d", r, n,
          rank, dev, async);
    if (have_real) { /* the handle is the real library's own communicator */
      n = -1;
      NC(R.CommCount(comm[r], &n));
      CHECK(n == NR, "rank %d: the real ncclCommCount on the front's communicator says %d", r, n);
    }
  }
  printf("nccl-front-c: NCCL %d through %s (real: %s), %d rank%s, one per GPU\n", version, how,
         have_real ? object_of((void *)R.GetVersion) : "found by the front", NR, NR > 1 ? "s" : "");

  BUFBYTES = ((size_t)NR * C * 8 + GUARD + 3) & ~(size_t)3;
  host = malloc(BUFBYTES);
  for (int r = 0; r < NR; r++) {
    use(r);
    CU(cuMemAlloc(&sendb[r], BUFBYTES));
    CU(cuMemAlloc(&recvb[r], BUFBYTES));
  }
  /* Every collective, every type, every op. */
  long before = checks;
  static const int OPS[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, PREMUL};
  /* The collectives an older real library lacks (AlltoAll, Gather and Scatter came in
     NCCL 2.28): the front must refuse them with ncclInternalError (outside a group:
     nothing reaches the real library). */
  int lacks[NKINDS] = {0};
  static const char *NEWER[NKINDS] = {[A2A] = "ncclAlltoAll", [GATHER] = "ncclGather", [SCATTER] = "ncclScatter"};
  for (int k = 0; k < NKINDS; k++)
    if (NEWER[k] && have_real && !dlsym(real, NEWER[k])) {
      lacks[k] = 1;
      Place p = place(k, 0, F32, 0);
      use(0);
      ncclResult_t rc = k == A2A      ? F.AlltoAll(vp(p.in), vp(p.out), C, F32, comm[0], stream[0])
                        : k == GATHER ? F.Gather(vp(p.in), vp(p.out), C, F32, 0, comm[0], stream[0])
                                      : F.Scatter(vp(p.in), vp(p.out), C, F32, 0, comm[0], stream[0]);
      CHECK(rc == ncclInternalError, "%s, which the real library lacks: the front returned %d", NEWER[k], rc);
      printf("  %s: not in the real library; the front refuses it (ncclInternalError)\n", NEWER[k]);
    }
  for (int t = 0; t < NTYPES; t++)
    for (int k = 0; k < NKINDS; k++) {
      if (lacks[k]) continue;
      if (is_reduction(k))
        for (size_t o = 0; o < sizeof OPS / sizeof *OPS; o++) run(k, t, OPS[o], 0, 0);
      else run(k, t, ncclSum, 0, 0);
    }
  printf("  every collective x 10 types (x 6 ops for the reductions): %ld checks\n", checks - before);
  /* In place. */
  for (int t = 0; t < NTYPES; t++) {
    run(AR, t, ncclSum, 1, 0);
    run(AG, t, ncclSum, 1, 0);
    run(RS, t, ncclSum, 1, 0);
  }
  /* PreMulSum with its scalar in device memory (read when the collective runs). */
  {
    ncclRedOp_t op[MAXR];
    CUdeviceptr sc[MAXR];
    float two = (float)SCALAR;
    Place p[MAXR];
    for (int r = 0; r < NR; r++) {
      use(r);
      CU(cuMemAlloc(&sc[r], sizeof two));
      CU(cuMemcpyHtoD(sc[r], &two, sizeof two));
      NC(F.RedOpCreatePreMulSum(&op[r], vp(sc[r]), F32, ncclScalarDevice, comm[r]));
      p[r] = place(AR, r, F32, 0);
      prepare(AR, r, F32, ncclSum, p[r]);
    }
    NC(F.GroupStart());
    for (int r = 0; r < NR; r++) issue(AR, r, F32, op[r], p[r], 0);
    NC(F.GroupEnd());
    sync_all();
    for (int r = 0; r < NR; r++) {
      verify(AR, r, F32, PREMUL, p[r], "AllReduce float premulsum (device scalar)");
      NC(F.RedOpDestroy(op[r], comm[r]));
      use(r);
      CU(cuMemFree(sc[r]));
    }
  }
  /* One group mixing an all-gather, a reduce-scatter and send/recv (three buffers per
     rank: the all-gather's output in recvb, the reduce-scatter's in a third, the
     send/recv's in a fourth; inputs from sendb). */
  {
    CUdeviceptr rs_out[MAXR], sr_out[MAXR];
    size_t sz = TSIZE[F32];
    for (int r = 0; r < NR; r++) {
      use(r);
      CU(cuMemAlloc(&rs_out[r], C * sz));
      CU(cuMemAlloc(&sr_out[r], C * sz));
      for (size_t i = 0; i < (size_t)NR * C; i++) put(F32, host, i, gen(ncclSum, r, i));
      CU(cuMemcpyHtoD(sendb[r], host, (size_t)NR * C * sz));
      CU(cuMemsetD32Async(recvb[r], 0xffffffffu, BUFBYTES / 4, stream[r]));
    }
    sync_all();
    NC(F.GroupStart());
    for (int r = 0; r < NR; r++) {
      use(r);
      NC(F.AllGather(vp(sendb[r]), vp(recvb[r]), C, F32, comm[r], stream[r]));
      NC(F.ReduceScatter(vp(sendb[r]), vp(rs_out[r]), C, F32, ncclSum, comm[r], stream[r]));
      NC(F.Send(vp(sendb[r]), C, F32, (r + 1) % NR, comm[r], stream[r]));
      NC(F.Recv(vp(sr_out[r]), C, F32, (r + NR - 1) % NR, comm[r], stream[r]));
    }
    NC(F.GroupEnd());
    sync_all();
    for (int r = 0; r < NR; r++) {
      verify(AG, r, F32, ncclSum, (Place){sendb[r], recvb[r]}, "mixed group: AllGather");
      use(r);
      float *h = (float *)host;
      CU(cuMemcpyDtoH(h, rs_out[r], C * sz));
      size_t wrong = 0;
      for (size_t i = 0; i < C; i++) wrong += h[i] != reduce_ref(ncclSum, (size_t)r * C + i);
      CHECK(wrong == 0, "mixed group: ReduceScatter: rank %d: %zu wrong", r, wrong);
      CU(cuMemcpyDtoH(h, sr_out[r], C * sz));
      wrong = 0;
      for (size_t i = 0; i < C; i++) wrong += h[i] != gen(ncclSum, (r + NR - 1) % NR, i);
      CHECK(wrong == 0, "mixed group: Send/Recv: rank %d: %zu wrong", r, wrong);
      CU(cuMemFree(rs_out[r]));
      CU(cuMemFree(sr_out[r]));
    }
  }
  /* The nccl*Config forms: where the real library has them, they run and are checked;
     where it has not (an NCCL before them), the front says so with ncclInternalError. */
  {
    static const int K[] = {AR, RED, RS, AG, BC, A2A, GATHER, SCATTER};
    static const char *CN[] = {"ncclAllReduceConfig", "ncclReduceConfig", "ncclReduceScatterConfig",
                               "ncclAllGatherConfig", "ncclBroadcastConfig", "ncclAlltoAllConfig",
                               "ncclGatherConfig", "ncclScatterConfig"};
    int ran = 0, refused = 0;
    for (size_t i = 0; i < sizeof K / sizeof *K; i++) {
      if (!have_real || dlsym(real, CN[i])) {
        run(K[i], F32, ncclSum, 0, 1);
        ran++;
      } else { /* outside a group: nothing reaches the real library */
        ncclResult_t rc = issue_config(K[i], 0, F32, ncclSum, place(K[i], 0, F32, 0));
        CHECK(rc == ncclInternalError, "%s, which the real library lacks: the front returned %d, not ncclInternalError",
              CN[i], rc);
        refused++;
      }
    }
    printf("  nccl*Config: %d run and checked, %d not in the real library\n", ran, refused);
  }
  /* A split (every rank, color 0, key = rank) and an all-reduce on it. */
  {
    ncclComm_t sub[MAXR], keep[MAXR];
    NC(F.GroupStart());
    for (int r = 0; r < NR; r++) {
      use(r);
      NC(F.CommSplit(comm[r], 0, r, &sub[r], NULL));
    }
    NC(F.GroupEnd());
    for (int r = 0; r < NR; r++) {
      int n = -1;
      NC(F.CommCount(sub[r], &n));
      CHECK(n == NR, "split: rank %d: count %d", r, n);
      keep[r] = comm[r];
      comm[r] = sub[r];
    }
    run(AR, F32, ncclSum, 0, 0);
    run(AG, BF16, ncclSum, 0, 0);
    for (int r = 0; r < NR; r++) {
      use(r);
      NC(F.CommFinalize(sub[r]));
      NC(F.CommDestroy(sub[r]));
      comm[r] = keep[r];
    }
  }
  /* ncclMemAlloc'ed buffers, registered with the communicator, as an all-reduce's. */
  {
    void *mem[MAXR], *reg[MAXR];
    size_t bytes = (size_t)C * sizeof(float);
    for (int r = 0; r < NR; r++) {
      use(r);
      NC(F.MemAlloc(&mem[r], bytes));
      NC(F.CommRegister(comm[r], mem[r], bytes, &reg[r]));
      for (size_t i = 0; i < C; i++) put(F32, host, i, gen(ncclSum, r, i));
      CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)mem[r], host, bytes));
    }
    NC(F.GroupStart());
    for (int r = 0; r < NR; r++) {
      use(r);
      NC(F.AllReduce(mem[r], mem[r], C, F32, ncclSum, comm[r], stream[r]));
    }
    NC(F.GroupEnd());
    sync_all();
    for (int r = 0; r < NR; r++) {
      use(r);
      CU(cuMemcpyDtoH(host, (CUdeviceptr)(uintptr_t)mem[r], bytes));
      size_t wrong = 0;
      for (size_t i = 0; i < C; i++) wrong += get(F32, host, i) != reduce_ref(ncclSum, i);
      CHECK(wrong == 0, "ncclMemAlloc'ed, registered all-reduce: rank %d: %zu wrong", r, wrong);
      NC(F.CommDeregister(comm[r], reg[r]));
      NC(F.MemFree(mem[r]));
    }
  }
  /* A forwarded function, through the front's trampoline. */
  if (have_real && R.CommMemStats) {
    for (int r = 0; r < NR; r++) {
      uint64_t a = 1, b = 2;
      NC(F.CommMemStats(comm[r], 3 /* ncclStatGpuMemTotal */, &a));
      NC(R.CommMemStats(comm[r], 3, &b));
      CHECK(a == b, "ncclCommMemStats(ncclStatGpuMemTotal): the front says %llu, the real library %llu",
            (unsigned long long)a, (unsigned long long)b);
      if (r == 0) printf("  forwarded: ncclCommMemStats(ncclStatGpuMemTotal) = %llu bytes, as the real library's\n", (unsigned long long)a);
    }
  } else {
    F.ResetDebugInit();
    CHECK_PASSED();
    printf("  forwarded: ncclResetDebugInit called (no ncclCommMemStats in the real library%s)\n",
           have_real ? "" : " to compare against: LD_AUDIT or the CPU device");
  }
  for (int r = 0; r < NR; r++) {
    ncclResult_t async = -1;
    NC(F.CommGetAsyncError(comm[r], &async));
    CHECK(async == 0, "rank %d: asynchronous error %d", r, async);
    use(r);
    CU(cuMemFree(sendb[r]));
    CU(cuMemFree(recvb[r]));
  }
  for (int r = 0; r < NR; r++) {
    use(r);
    NC(F.CommDestroy(comm[r]));
  }
  free(host);
  printf("nccl-front-c OK checks=%ld (%s; NCCL %d; %d rank%s)\n", checks, how, version, NR, NR > 1 ? "s" : "");
  return 1;
}

/* ------------------------------------------------------------------ cost */
static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int cost(double bar, int batch, int reps) {
  if (!have_real) FAIL("cost needs the real library beside the front (not under LD_AUDIT)");
  NR = 1;
  int dev0 = 0;
  NC(F.CommInitAll(comm, 1, &dev0));
  int n = -1;
  NC(R.CommCount(comm[0], &n)); /* the front's communicator is the real one */
  enum { COUNT = 256 };
  CUdeviceptr send, recv;
  use(0);
  CU(cuMemAlloc(&send, COUNT * sizeof(float)));
  CU(cuMemAlloc(&recv, COUNT * sizeof(float)));
  float h[COUNT];
  for (int i = 0; i < COUNT; i++) h[i] = 1.0f + (float)i;
  CU(cuMemcpyHtoD(send, h, sizeof h));
  typedef ncclResult_t (*ar_t)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, CUstream);
  ar_t fn[2] = {F.AllReduce, R.AllReduce}; /* 0: the front, 1: direct */
  if ((void *)fn[0] == (void *)fn[1]) FAIL("the front's ncclAllReduce is the real library's: no front loaded");
  double *t[2] = {malloc((size_t)reps * sizeof(double)), malloc((size_t)reps * sizeof(double))};
  for (int rep = -5; rep < reps; rep++) /* 5 warm-up rounds */
    for (int j = 0; j < 2; j++) {
      int w = ((rep < 0 ? -rep : rep) + j) % 2;
      double t0 = now();
      for (int i = 0; i < batch; i++) {
        ncclResult_t rc = fn[w](vp(send), vp(recv), COUNT, F32, ncclSum, comm[0], stream[0]);
        if (rc != 0) FAIL("ncclAllReduce (%s) -> %d", w ? "direct" : "front", rc);
      }
      double dt = (now() - t0) / batch;
      CU(cuStreamSynchronize(stream[0]));
      if (rep >= 0) t[w][rep] = dt;
    }
  qsort(t[0], (size_t)reps, sizeof(double), by_value);
  qsort(t[1], (size_t)reps, sizeof(double), by_value);
  double front = t[0][reps / 2] * 1e6, direct = t[1][reps / 2] * 1e6, ratio = front / direct;
  /* The last call's result: one rank, so the input. */
  CU(cuMemsetD32Async(recv, 0xffffffffu, COUNT, stream[0]));
  if (F.AllReduce(vp(send), vp(recv), COUNT, F32, ncclSum, comm[0], stream[0]) != 0) FAIL("ncclAllReduce (front)");
  CU(cuStreamSynchronize(stream[0]));
  float o[COUNT];
  CU(cuMemcpyDtoH(o, recv, sizeof o));
  int wrong = 0;
  for (int i = 0; i < COUNT; i++) wrong += o[i] != h[i];
  printf("nccl-front-cost: 1 KiB ncclAllReduce, one rank, median of %d batches of %d calls, interleaved\n",
         reps, batch);
  printf("  front  %s\n  direct %s\n", object_of((void *)fn[0]), object_of((void *)fn[1]));
  int pass = ratio <= bar && wrong == 0;
  printf("nccl-front-cost: ratio %.2f (front %.2f us, direct %.2f us)%s; bar %.2f: %s\n", ratio, front, direct,
         wrong ? "; WRONG RESULT" : "", bar, pass ? "PASS" : "FAIL");
  CU(cuMemFree(send));
  CU(cuMemFree(recv));
  NC(F.CommDestroy(comm[0]));
  free(t[0]);
  free(t[1]);
  return pass;
}

/* ------------------------------------------------------------------ main */
static void usage(void) {
  fprintf(stderr, "usage: gpu-nccl-front check|cost FRONT|preload|audit [--ranks N] [--bar R] [--batch B] [--reps N]\n");
  exit(2);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc < 3) usage();
  const char *mode = argv[1], *front = argv[2];
  int ranks = 0, batch = 50, reps = 41;
  double bar = 1.2;
  for (int i = 3; i < argc; i++) {
    if (i + 1 < argc && !strcmp(argv[i], "--ranks")) ranks = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--bar")) bar = atof(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--batch")) batch = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--reps")) reps = atoi(argv[++i]);
    else usage();
  }
  if ((strcmp(mode, "check") && strcmp(mode, "cost")) || batch < 1 || reps < 1 || !(bar > 0)) usage();
  open_devices(ranks);

  /* The real library first (the front then finds this copy, loaded already). */
  int audit = !strcmp(front, "audit");
  /* STRATA_NCCL_DEVICE=cpu: the front serves on strata's CPU device (a self-test of this
     program with a stand-in libcuda.so.1 whose "device memory" is host memory); its
     communicators are not the real library's, so nothing is compared with it. */
  const char *dev = getenv("STRATA_NCCL_DEVICE");
  cpu = dev && !strcmp(dev, "cpu");
  if (!audit && !cpu) {
    real = dlopen(real_name(), RTLD_NOW | RTLD_LOCAL);
    if (!real) {
      printf("gpu-nccl-front: skipped (no %s: %s)\n", real_name(), dlerror());
      return 77;
    }
    lookup(real, &R, real_name(), 0);
    if (!R.GetVersion || !R.AllReduce || !R.CommCount || !R.GetErrorString) FAIL("%s lacks NCCL's basics", real_name());
    have_real = 1;
  }
  void *lib;
  const char *how;
  if (!strcmp(front, "preload")) {
    lib = RTLD_DEFAULT;
    how = "LD_PRELOAD";
  } else if (audit) {
    lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) FAIL("LD_AUDIT: dlopen(libnccl.so.2): %s", dlerror());
    how = "LD_AUDIT (dlopen libnccl.so.2)";
  } else {
    lib = dlopen(front, RTLD_NOW | RTLD_LOCAL);
    if (!lib) FAIL("cannot load the front %s: %s", front, dlerror());
    how = "dlopen of the front";
  }
  lookup(lib, &F, "the front", 1);
  const char *where = object_of((void *)F.AllReduce);
  CHECK(strstr(where, "libstrata_nccl") != NULL, "%s: ncclAllReduce lies in %s, not libstrata_nccl.so", how, where);
  if (have_real)
    CHECK((void *)F.AllReduce != (void *)R.AllReduce, "the front's ncclAllReduce is the real one");
  printf("gpu-nccl-front: the front %s (%s), the real library %s\n", where, how,
         have_real ? object_of((void *)R.AllReduce) : "(found by the front)");
  int ok = !strcmp(mode, "check") ? check(how) : cost(bar, batch, reps);
  return ok ? 0 : 1;
}
