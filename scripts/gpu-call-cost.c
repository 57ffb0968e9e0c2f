/*
 * What one collective costs the calling thread, strata's C ABI on `nccl` beside a direct
 * NCCL call through the same libnccl in the same process, and whether a thousand calls
 * queue behind GPU work without waiting for it (issue 48, "Measure it"; docs/gpu.md,
 * "Per-call cost against NCCL"). For a machine with an NVIDIA GPU and NCCL; no CUDA
 * toolkit is needed to build it: the driver API (libcuda.so.1) and libnccl are loaded with
 * dlopen, as strata loads them. scripts/gpu-all --build compiles it into the bundle.
 *
 *   cargo build --release --features cuda
 *   cc -std=c11 -O2 -Wall -Wextra -Werror -Iinclude scripts/gpu-call-cost.c \
 *      -Ltarget/release -Wl,-rpath,$PWD/target/release -lstrata -ldl -o gpu-call-cost
 *   STRATA_NCCL_LIB=.../libnccl.so.2 ./gpu-call-cost [cost|queue|all] [--bar R]
 *
 * Both communicators have one rank (NCCL refuses two ranks on one GPU) on device 0: a
 * direct one (ncclGetUniqueId, ncclCommInitRank) and strata's on strataTransportNccl
 * (strataGetUniqueIdForTransport, strataCommInitRankConfig). Every call of both goes on
 * ONE stream, on the same device buffers. libnccl is STRATA_NCCL_LIB when set, else
 * libnccl.so.2, so strata (which reads the same variable) and this program call the same
 * library; the loaded copies of libnccl are listed to show it.
 *
 * cost: the host time of a call, what a training step pays per collective while the GPU
 *   is busy. For 1 KiB all-reduce (256 f32, sum, out of place) and 1 KiB all-gather (256
 *   f32 per rank): the time to enqueue B back-to-back calls (default 50: far from the
 *   driver's queue depth of about a thousand entries, so no call waits for room), over B;
 *   the stream synchronized between batches; blocking (each call alone) and grouped
 *   (K calls between strataGroupStart/End, against K between ncclGroupStart/End,
 *   default K 10; the group's time over its calls). Both libraries warm up first; the
 *   figure is the median over REPS batches, strata's and NCCL's batches alternating so
 *   drift hits both. Printed: op, form, nccl us/call, strata us/call, ratio, and last
 *   "call-cost: worst ratio X.XX (bar R, PASS|FAIL)". Fails when the worst ratio is
 *   over the bar (default 1.2, the issue's) or a result is wrong.
 * queue: whether calls return while the GPU is busy, as NCCL's do. About 0.3 s of GPU
 *   work goes on the stream first (strata_spin, a one-thread kernel that waits on the
 *   GPU's %globaltimer: PTX text below, JIT-compiled by the driver, launched through
 *   the dlopen'ed driver API), then an event; then 1000 all-reduces of 1 KiB on that
 *   stream, each on its own buffers (blocking form), and in a second run the same 1000
 *   calls as 100 groups of 10. When the last call has returned, the event must still be
 *   pending (cuEventQuery: CUDA_ERROR_NOT_READY): no call waited for the GPU work ahead
 *   of it, nor for room in the driver's queue. After a synchronize every output must
 *   equal its input exactly (one rank: the sum is the input; inputs are integers below
 *   2^24). The same runs on direct NCCL are the reference (printed; a reference that does
 *   not return ahead is flagged, and means the driver's queue, not strata, is the
 *   limit). "queue: PASS" when strata's two runs return ahead and every result of the
 *   four runs is right, else "queue: FAIL".
 *
 * Exit 0 when everything asked passed, 1 on a failure, 77 when there is no CUDA driver,
 * device or libnccl (skipped).
 */
#define _GNU_SOURCE /* dladdr, dl_iterate_phdr */
#include "strata.h"

#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ the driver API */
#include "gpu-driver.h"

/* ------------------------------------------------------------------ NCCL's API */
typedef struct {
  char internal[128];
} ncclUniqueId;
typedef void *ncclComm_t;
typedef int ncclResult_t;
enum { ncclFloat32 = 7, ncclSum = 0 };

static ncclResult_t (*ncclGetVersion)(int *);
static ncclResult_t (*ncclGetUniqueId)(ncclUniqueId *);
static ncclResult_t (*ncclCommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
static ncclResult_t (*ncclCommDestroy)(ncclComm_t);
static ncclResult_t (*ncclAllReduce)(const void *, void *, size_t, int, int, ncclComm_t, CUstream);
static ncclResult_t (*ncclAllGather)(const void *, void *, size_t, int, ncclComm_t, CUstream);
static ncclResult_t (*ncclGroupStart)(void);
static ncclResult_t (*ncclGroupEnd)(void);
static const char *(*ncclGetErrorString)(ncclResult_t);

/* ------------------------------------------------------------------ checks */
#define NC(call)                                                                   \
  do {                                                                             \
    ncclResult_t n_ = (call);                                                      \
    if (n_ != 0) FAIL("%s -> ncclResult %d (%s)", #call, n_, ncclGetErrorString(n_)); \
  } while (0)

/* The library strata loads too (src/transport/vendor/loader.rs reads STRATA_NCCL_LIB first). */
static const char *nccl_name(void) {
  const char *e = getenv("STRATA_NCCL_LIB");
  return e && *e ? e : "libnccl.so.2";
}

static int load_nccl(void) {
#define E(f) {#f, &f}
  static const struct entry e[] = {
      E(ncclGetVersion), E(ncclGetUniqueId), E(ncclCommInitRank), E(ncclCommDestroy),
      E(ncclAllReduce), E(ncclAllGather), E(ncclGroupStart), E(ncclGroupEnd), E(ncclGetErrorString),
  };
#undef E
  return load_all(nccl_name(), RTLD_NOW | RTLD_LOCAL, "libnccl", e, sizeof e / sizeof *e);
}

/* Prints every libnccl mapped into the process; returns how many. */
static int list_nccl(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  if (info->dlpi_name && strstr(info->dlpi_name, "libnccl")) {
    printf("  loaded: %s\n", info->dlpi_name);
    ++*(int *)data;
  }
  return 0;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, by_value);
  return v[n / 2];
}

/* ------------------------------------------------------------------ the spin kernel */
/* strata_spin(ns): one thread that sleeps in 1 us steps until the GPU's global timer has
   advanced ns nanoseconds: GPU work of a known length that takes no SM time to speak of.
   The same PTX as strata's own delay (src/device/cuda.rs); nanosleep needs sm_70. */
static const char SPIN_PTX[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    ".visible .entry strata_spin(.param .u64 strata_spin_ns)\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b64 %rd<5>;\n"
    "    ld.param.u64 %rd1, [strata_spin_ns];\n"
    "    mov.u64 %rd2, %globaltimer;\n"
    "$L_spin:\n"
    "    nanosleep.u32 1000;\n"
    "    mov.u64 %rd3, %globaltimer;\n"
    "    sub.s64 %rd4, %rd3, %rd2;\n"
    "    setp.lt.u64 %p1, %rd4, %rd1;\n"
    "    @%p1 bra $L_spin;\n"
    "    ret;\n"
    "}\n";

static CUfunction spin_fn;

static void spin(CUstream s, double seconds) {
  unsigned long long ns = (unsigned long long)(seconds * 1e9);
  void *args[] = {&ns};
  CU(cuLaunchKernel(spin_fn, 1, 1, 1, 1, 1, 1, 0, s, args, NULL));
}

/* ------------------------------------------------------------------ the two libraries */
enum { COUNT = 256 };          /* 1 KiB of f32 */
enum { NCCL = 0, STRATA = 1 }; /* implementations */
enum { AR = 0, AG = 1 };       /* ops */
enum { BLOCK = 0, GROUP = 1 }; /* forms */
static const char *IMPL[] = {"nccl", "strata"};
static const char *OPS[] = {"all-reduce", "all-gather"};
static const char *FORMS[] = {"blocking", "grouped"};

static CUstream stream;
static ncclComm_t ncomm;
static strataComm_t scomm;

static void *vp(CUdeviceptr p) { return (void *)(uintptr_t)p; }

/* One 1 KiB call of `op` from `send` into `recv`, on the stream, by `impl`. */
static void call(int impl, int op, CUdeviceptr send, CUdeviceptr recv) {
  if (impl == NCCL) {
    if (op == AR) NC(ncclAllReduce(vp(send), vp(recv), COUNT, ncclFloat32, ncclSum, ncomm, stream));
    else NC(ncclAllGather(vp(send), vp(recv), COUNT, ncclFloat32, ncomm, stream));
  } else {
    if (op == AR) OK(strataAllReduce(vp(send), vp(recv), COUNT, strataFloat32, strataSum, scomm, stream));
    else OK(strataAllGather(vp(send), vp(recv), COUNT, strataFloat32, scomm, stream));
  }
}

static void group_start(int impl) {
  if (impl == NCCL) NC(ncclGroupStart());
  else OK(strataGroupStart());
}

static void group_end(int impl) {
  if (impl == NCCL) NC(ncclGroupEnd());
  else OK(strataGroupEnd());
}

/* n floats at p set to first + i. */
static CUdeviceptr dev_iota(size_t n, float first) {
  CUdeviceptr p;
  CU(cuMemAlloc(&p, n * sizeof(float)));
  float *h = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) h[i] = first + (float)i;
  CU(cuMemcpyHtoD(p, h, n * sizeof(float)));
  free(h);
  return p;
}

/* Number of the n floats at p that differ from first + i (after a synchronize). */
static size_t dev_wrong(CUdeviceptr p, size_t n, float first) {
  float *h = malloc(n * sizeof(float));
  CU(cuStreamSynchronize(stream));
  CU(cuMemcpyDtoH(h, p, n * sizeof(float)));
  size_t wrong = 0;
  for (size_t i = 0; i < n; i++) wrong += h[i] != first + (float)i;
  free(h);
  return wrong;
}

static void poison(CUdeviceptr p, size_t n) { CU(cuMemsetD32Async(p, 0xffffffffu, n, stream)); }

/* ------------------------------------------------------------------ cost */
static int B = 50;     /* calls per timed batch */
static int K = 10;     /* calls per group in the grouped form */
static int REPS = 41;  /* timed batches per library, op and form */
static double BAR = 1.2;

/* Seconds per call of one batch of B calls (the stream synchronized after it). */
static double batch(int impl, int op, int form, CUdeviceptr send, CUdeviceptr recv) {
  double t0 = now();
  if (form == BLOCK) {
    for (int i = 0; i < B; i++) call(impl, op, send, recv);
  } else {
    for (int g = 0; g < B / K; g++) {
      group_start(impl);
      for (int i = 0; i < K; i++) call(impl, op, send, recv);
      group_end(impl);
    }
  }
  double dt = now() - t0;
  CU(cuStreamSynchronize(stream));
  return dt / (form == BLOCK ? B : (B / K) * K);
}

static int run_cost(void) {
  CUdeviceptr send = dev_iota(COUNT, 1.0f), recv;
  CU(cuMemAlloc(&recv, COUNT * sizeof(float)));
  double *t[2] = {malloc(REPS * sizeof(double)), malloc(REPS * sizeof(double))};
  double worst = 0.0;
  int bad = 0;
  printf("\ncost: host time per 1 KiB call, median of %d batches of %d calls (groups of %d), "
         "stream synchronized between batches\n", REPS, B, K);
  printf("%-11s %-9s %12s %14s %7s\n", "op", "form", "nccl us/call", "strata us/call", "ratio");
  for (int op = AR; op <= AG; op++) {
    for (int form = BLOCK; form <= GROUP; form++) {
      for (int impl = NCCL; impl <= STRATA; impl++) /* warm-up */
        for (int w = 0; w < 5; w++) batch(impl, op, form, send, recv);
      for (int r = 0; r < REPS; r++) /* alternate who goes first */
        for (int j = 0; j < 2; j++) {
          int impl = (r + j) % 2;
          t[impl][r] = batch(impl, op, form, send, recv);
        }
      double n = median(t[NCCL], REPS) * 1e6, s = median(t[STRATA], REPS) * 1e6;
      double ratio = s / n;
      if (ratio > worst) worst = ratio;
      printf("%-11s %-9s %12.2f %14.2f %7.2f\n", OPS[op], FORMS[form], n, s, ratio);
      /* The last call's result (both libraries wrote the same bytes). */
      poison(recv, COUNT);
      call(STRATA, op, send, recv);
      size_t w = dev_wrong(recv, COUNT, 1.0f);
      if (w) {
        printf("  WRONG: %zu of %d elements of strata's %s\n", w, COUNT, OPS[op]);
        bad = 1;
      }
    }
  }
  strataResult_t async = strataSuccess;
  OK(strataCommGetAsyncError(scomm, &async));
  if (async != strataSuccess) {
    printf("  strata's communicator reports an asynchronous error %d (%s)\n", async, strataGetErrorString(async));
    bad = 1;
  }
  free(t[0]);
  free(t[1]);
  CU(cuMemFree(send));
  CU(cuMemFree(recv));
  int pass = !bad && worst <= BAR;
  printf("call-cost: worst ratio %.2f (bar %.2f, %s)\n", worst, BAR, pass ? "PASS" : "FAIL");
  return pass;
}

/* ------------------------------------------------------------------ queue */
enum { QCALLS = 1000, QGROUP = 10 };
static const double SPIN_S = 0.3;

/* 1000 all-reduces by `impl` behind the spin; returns 1 when they all returned before
   the spin ended, and counts the wrong elements into *wrong. */
static int queue_run(int impl, int form, CUdeviceptr send, CUdeviceptr recv, CUevent after_spin,
                     size_t *wrong) {
  poison(recv, (size_t)QCALLS * COUNT);
  double t0 = now();
  spin(stream, SPIN_S);
  CU(cuEventRecord(after_spin, stream));
  for (int g = 0; g < QCALLS / QGROUP; g++) {
    if (form == GROUP) group_start(impl);
    for (int i = g * QGROUP; i < (g + 1) * QGROUP; i++)
      call(impl, AR, send + (CUdeviceptr)i * COUNT * sizeof(float), recv + (CUdeviceptr)i * COUNT * sizeof(float));
    if (form == GROUP) group_end(impl);
  }
  double returned = now() - t0;
  CUresult q = cuEventQuery(after_spin);
  if (q != 0 && q != CUDA_ERROR_NOT_READY) FAIL("cuEventQuery -> CUresult %d", q);
  int ahead = q == CUDA_ERROR_NOT_READY;
  CUresult sq = cuStreamQuery(stream);
  if (sq != 0 && sq != CUDA_ERROR_NOT_READY) FAIL("cuStreamQuery -> CUresult %d", sq);
  *wrong = dev_wrong(recv, (size_t)QCALLS * COUNT, 1.0f);
  double done = now() - t0;
  printf("%-7s %-9s %12.2f %8s %14.1f %8zu\n", IMPL[impl], FORMS[form], returned * 1e3,
         ahead ? "yes" : "NO", done * 1e3, *wrong);
  return ahead;
}

static int run_queue(void) {
  /* Call i reads floats [256 i, 256 i + 256) of one allocation, whose values are
     1 + their index (integers below 2^24: exact), and writes the same range of another. */
  CUdeviceptr send = dev_iota((size_t)QCALLS * COUNT, 1.0f), recv;
  CU(cuMemAlloc(&recv, (size_t)QCALLS * COUNT * sizeof(float)));
  CUevent after_spin;
  CU(cuEventCreate(&after_spin, 2 /* CU_EVENT_DISABLE_TIMING */));
  /* Warm-up of both libraries, both forms, on these buffers. */
  for (int impl = NCCL; impl <= STRATA; impl++)
    for (int form = BLOCK; form <= GROUP; form++) {
      if (form == GROUP) group_start(impl);
      for (int i = 0; i < QGROUP; i++) call(impl, AR, send, recv);
      if (form == GROUP) group_end(impl);
    }
  CU(cuStreamSynchronize(stream));
  printf("\nqueue: %d all-reduces of 1 KiB (blocking, then %d groups of %d) behind %.0f ms of GPU "
         "work on their stream\n", QCALLS, QCALLS / QGROUP, QGROUP, SPIN_S * 1e3);
  printf("%-7s %-9s %12s %8s %14s %8s\n", "", "form", "returned(ms)", "ahead", "completed(ms)", "#wrong");
  int ahead[2][2];
  size_t wrong[2][2], all_wrong = 0;
  for (int impl = NCCL; impl <= STRATA; impl++)
    for (int form = BLOCK; form <= GROUP; form++) {
      ahead[impl][form] = queue_run(impl, form, send, recv, after_spin, &wrong[impl][form]);
      all_wrong += wrong[impl][form];
    }
  strataResult_t async = strataSuccess;
  OK(strataCommGetAsyncError(scomm, &async));
  if (!ahead[NCCL][BLOCK] || !ahead[NCCL][GROUP])
    printf("  note: NCCL's own calls did not all return ahead of the GPU work: the driver's "
           "queue is the limit on this machine, not strata\n");
  if (async != strataSuccess)
    printf("  strata's communicator reports an asynchronous error %d (%s)\n", async, strataGetErrorString(async));
  int pass = ahead[STRATA][BLOCK] && ahead[STRATA][GROUP] && all_wrong == 0 && async == strataSuccess;
  CU(cuEventDestroy(after_spin));
  CU(cuMemFree(send));
  CU(cuMemFree(recv));
  printf("queue: %s (strata %s/%s, nccl %s/%s ahead of the %.0f ms; %zu wrong)\n", pass ? "PASS" : "FAIL",
         ahead[STRATA][BLOCK] ? "yes" : "no", ahead[STRATA][GROUP] ? "yes" : "no",
         ahead[NCCL][BLOCK] ? "yes" : "no", ahead[NCCL][GROUP] ? "yes" : "no", SPIN_S * 1e3, all_wrong);
  return pass;
}

/* ------------------------------------------------------------------ main */
static void usage(void) {
  fprintf(stderr, "usage: gpu-call-cost [cost|queue|all] [--bar R] [--batch B] [--group K] [--reps N]\n");
  exit(2);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  int do_cost = 1, do_queue = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "cost")) do_queue = 0;
    else if (!strcmp(a, "queue")) do_cost = 0;
    else if (!strcmp(a, "all")) do_cost = do_queue = 1;
    else if (i + 1 < argc && !strcmp(a, "--bar")) BAR = atof(argv[++i]);
    else if (i + 1 < argc && !strcmp(a, "--batch")) B = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(a, "--group")) K = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(a, "--reps")) REPS = atoi(argv[++i]);
    else usage();
  }
  if (B < 1 || K < 1 || K > B || REPS < 1 || !(BAR > 0)) usage();
  open_device0("gpu-call-cost");
  if (!load_nccl()) {
    printf("gpu-call-cost: skipped (no %s: %s)\n", nccl_name(), dlerror());
    return 77;
  }
  CU(cuStreamCreate(&stream, 1 /* CU_STREAM_NON_BLOCKING */));
  CUmodule mod;
  CU(cuModuleLoadData(&mod, SPIN_PTX));
  CU(cuModuleGetFunction(&spin_fn, mod, "strata_spin"));

  int version = 0;
  NC(ncclGetVersion(&version));
  ncclUniqueId nid;
  NC(ncclGetUniqueId(&nid));
  NC(ncclCommInitRank(&ncomm, 1, nid, 0));
  strataUniqueId sid;
  OK(strataGetUniqueIdForTransport(strataTransportNccl, &sid));
  strataConfig_t cfg = STRATA_CONFIG_INITIALIZER;
  cfg.transport = strataTransportNccl;
  cfg.timeout_ms = 60000;
  OK(strataCommInitRankConfig(&scomm, 1, sid, 0, &cfg));
  printf("gpu-call-cost: NCCL %d (%s) directly and through strata's C ABI on nccl, one rank each, "
         "device 0, one stream\n", version, nccl_name());
  int copies = 0;
  dl_iterate_phdr(list_nccl, &copies);
  if (copies != 1)
    printf("  note: %d copies of libnccl in the process: strata and this program may not call the "
           "same library (set STRATA_NCCL_LIB)\n", copies);

  int ok = 1;
  if (do_cost) ok &= run_cost();
  if (do_queue) ok &= run_queue();

  CU(cuStreamSynchronize(stream));
  OK(strataCommDestroy(scomm));
  NC(ncclCommDestroy(ncomm));
  CU(cuStreamDestroy(stream));
  return ok ? 0 : 1;
}
