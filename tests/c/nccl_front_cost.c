/* nccl_front_cost LIBSTRATA_NCCL LIBSTRATA [CALLS] [ROUNDS]: the host cost of a call
 * through libstrata_nccl.so's ncclAllReduce against strata's own C ABI strataAllReduce
 * (libstrata.so), both on a communicator of one rank on strata's CPU device (the front's
 * ncclCommInitAll with 1 under STRATA_NCCL_DEVICE=cpu; strataCommInitLocal with 1 rank,
 * the local transport), 1 KiB all-reduces (256 floats, out of place).
 *
 * Both libraries are dlopen'ed (RTLD_LOCAL: each keeps its own copy of strata's state);
 * ROUNDS rounds of CALLS calls each, the two interleaved (which goes first alternates),
 * and the median round of each compared. Prints
 *   nccl_front_cost: ... ratio R (median ...)
 * and exits 0 (the caller decides what ratio fails); exit 1 when a call fails or a
 * result is wrong. */
#define _POSIX_C_SOURCE 200809L
#include <nccl.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "strata.h"

typedef ncclResult_t (*nccl_init_all_t)(ncclComm_t *, int, const int *);
typedef ncclResult_t (*nccl_all_reduce_t)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                          ncclComm_t, cudaStream_t);
typedef ncclResult_t (*nccl_destroy_t)(ncclComm_t);
typedef strataResult_t (*strata_init_local_t)(strataComm_t *, int, const char *,
                                              const struct strataConfig_t *);
typedef strataResult_t (*strata_all_reduce_t)(const void *, void *, size_t, strataDataType_t,
                                              strataRedOp_t, strataComm_t, strataStream_t);
typedef strataResult_t (*strata_destroy_t)(strataComm_t);

static void *open_lib(const char *path) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "nccl_front_cost: cannot load %s: %s\n", path, dlerror());
    exit(1);
  }
  return h;
}

static void *sym(void *h, const char *lib, const char *name) {
  void *p = dlsym(h, name);
  if (!p) {
    fprintf(stderr, "nccl_front_cost: %s has no %s\n", lib, name);
    exit(1);
  }
  return p;
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

#define COUNT 256 /* floats: 1 KiB */

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: nccl_front_cost LIBSTRATA_NCCL LIBSTRATA [CALLS] [ROUNDS]\n");
    return 2;
  }
  long calls = argc > 3 ? atol(argv[3]) : 20000;
  int rounds = argc > 4 ? atoi(argv[4]) : 15;
  if (calls < 1 || rounds < 1 || rounds > 1000) {
    fprintf(stderr, "nccl_front_cost: bad CALLS or ROUNDS\n");
    return 2;
  }

  void *hn = open_lib(argv[1]), *hs = open_lib(argv[2]);
  nccl_init_all_t nInitAll = (nccl_init_all_t)sym(hn, argv[1], "ncclCommInitAll");
  nccl_all_reduce_t nAllReduce = (nccl_all_reduce_t)sym(hn, argv[1], "ncclAllReduce");
  nccl_destroy_t nDestroy = (nccl_destroy_t)sym(hn, argv[1], "ncclCommDestroy");
  strata_init_local_t sInitLocal = (strata_init_local_t)sym(hs, argv[2], "strataCommInitLocal");
  strata_all_reduce_t sAllReduce = (strata_all_reduce_t)sym(hs, argv[2], "strataAllReduce");
  strata_destroy_t sDestroy = (strata_destroy_t)sym(hs, argv[2], "strataCommDestroy");

  ncclComm_t nc = NULL;
  strataComm_t scomm = NULL;
  ncclResult_t nr = nInitAll(&nc, 1, NULL);
  if (nr != ncclSuccess) {
    fprintf(stderr, "nccl_front_cost: ncclCommInitAll(1) returned %d\n", (int)nr);
    return 1;
  }
  strataResult_t sr = sInitLocal(&scomm, 1, NULL, NULL);
  if (sr != strataSuccess) {
    fprintf(stderr, "nccl_front_cost: strataCommInitLocal(1) returned %d\n", sr);
    return 1;
  }

  float *send = malloc(COUNT * sizeof(float)), *recv_n = malloc(COUNT * sizeof(float)),
        *recv_s = malloc(COUNT * sizeof(float));
  for (int i = 0; i < COUNT; i++) send[i] = (float)(i % 13);

  double *tn = calloc((size_t)rounds, sizeof(double)), *ts = calloc((size_t)rounds, sizeof(double));
  /* Warm-up: first calls fault pages in and fill caches on both paths. */
  for (long i = 0; i < calls / 10 + 1; i++) {
    nr = nAllReduce(send, recv_n, COUNT, ncclFloat32, ncclSum, nc, NULL);
    sr = sAllReduce(send, recv_s, COUNT, strataFloat32, strataSum, scomm, NULL);
    if (nr != ncclSuccess || sr != strataSuccess) {
      fprintf(stderr, "nccl_front_cost: ncclAllReduce %d, strataAllReduce %d\n", (int)nr, sr);
      return 1;
    }
  }
  for (int r = 0; r < rounds; r++) {
    for (int which = 0; which < 2; which++) {
      int nccl_turn = (which == 0) == (r % 2 == 0);
      double t0 = now_ns();
      if (nccl_turn) {
        for (long i = 0; i < calls; i++) nr |= nAllReduce(send, recv_n, COUNT, ncclFloat32, ncclSum, nc, NULL);
        tn[r] = (now_ns() - t0) / (double)calls;
      } else {
        for (long i = 0; i < calls; i++) sr |= sAllReduce(send, recv_s, COUNT, strataFloat32, strataSum, scomm, NULL);
        ts[r] = (now_ns() - t0) / (double)calls;
      }
    }
  }
  if (nr != ncclSuccess || sr != strataSuccess) {
    fprintf(stderr, "nccl_front_cost: a timed call failed (ncclAllReduce %d, strataAllReduce %d)\n", (int)nr, sr);
    return 1;
  }
  for (int i = 0; i < COUNT; i++) {
    if (recv_n[i] != send[i] || recv_s[i] != send[i]) {
      fprintf(stderr, "nccl_front_cost: wrong one-rank all-reduce at %d: %g / %g, want %g\n", i,
              recv_n[i], recv_s[i], send[i]);
      return 1;
    }
  }
  /* Per-round ratios too: their spread says how steady the machine was. */
  double *ratio = calloc((size_t)rounds, sizeof(double));
  for (int r = 0; r < rounds; r++) ratio[r] = tn[r] / ts[r];
  qsort(tn, (size_t)rounds, sizeof(double), cmp_double);
  qsort(ts, (size_t)rounds, sizeof(double), cmp_double);
  qsort(ratio, (size_t)rounds, sizeof(double), cmp_double);
  double mn = tn[rounds / 2], ms = ts[rounds / 2];
  printf("nccl_front_cost: 1 KiB all-reduce on 1 rank (CPU device): ncclAllReduce (libstrata_nccl) %.1f ns/call, "
         "strataAllReduce (libstrata) %.1f ns/call; ratio %.3f (median of %d rounds of %ld calls; min %.1f/%.1f ns; "
         "per-round ratios %.3f..%.3f, median %.3f)\n",
         mn, ms, mn / ms, rounds, calls, tn[0], ts[0], ratio[0], ratio[rounds - 1], ratio[rounds / 2]);

  nDestroy(nc);
  sDestroy(scomm);
  free(send), free(recv_n), free(recv_s), free(tn), free(ts), free(ratio);
  return 0;
}
