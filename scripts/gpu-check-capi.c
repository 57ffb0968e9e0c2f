/*
 * GPU check of the C ABI: a C program on device memory, for a machine with an NVIDIA
 * GPU (run by scripts/gpu-check's caller, not by CI). No CUDA toolkit is needed to build
 * it: the driver API (libcuda.so.1) is loaded with dlopen, as strata loads it.
 *
 *   cargo build --release --features cuda
 *   cc -std=c11 -Wall -Wextra -Werror -Iinclude scripts/gpu-check-capi.c \
 *      -Ltarget/release -Wl,-rpath,$PWD/target/release -lstrata -ldl -o gpu-check-capi
 *   ./gpu-check-capi          # STRATA_NCCL_LIB=.../libnccl.so.2 when it is not on the path
 *
 * Checks, on device 0 (made current first, as an NCCL program does):
 *   1. nccl: strataGetUniqueIdForTransport(strataTransportNccl) embeds an NCCL id; a
 *      1-rank communicator from strataCommInitRankConfig; all-reduce (out of place, after
 *      a memset queued on the caller's stream, and in place), all-gather in place,
 *      reduce-scatter, broadcast, a group of two all-reduces, each read after
 *      synchronizing the stream (the calls are stream-ordered); an all-reduce captured
 *      into a CUDA graph (global capture mode) and replayed 100 times, then once more
 *      after its input changed; a host pointer is strataInvalidArgument.
 *   2. cuda-local: strataCommInitLocal of 2 ranks on the one GPU, driven from one thread
 *      inside a group (all-reduce and all-gather), results checked.
 * Prints "gpu-check-capi: N passed, 0 failed" and exits 0; exits 1 on the first failed
 * check; exits 77 when there is no CUDA driver or device (skipped).
 */
#define _POSIX_C_SOURCE 200809L
#include "strata.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long passed;
#define CHECK_PASSED() (passed++)
#include "gpu-driver.h"

enum { N = 4096 };

static CUdeviceptr dev_floats(size_t n, float first, float step) {
  CUdeviceptr p;
  CU(cuMemAlloc(&p, n * sizeof(float)));
  float *h = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) h[i] = first + step * (float)i;
  CU(cuMemcpyHtoD(p, h, n * sizeof(float)));
  free(h);
  return p;
}

/* Every element of `n` floats at `p` equals first + step * i. */
static int dev_equals(CUdeviceptr p, size_t n, float first, float step) {
  float *h = malloc(n * sizeof(float));
  CU(cuMemcpyDtoH(h, p, n * sizeof(float)));
  int ok = 1;
  for (size_t i = 0; i < n && ok; i++)
    if (h[i] != first + step * (float)i) {
      fprintf(stderr, "  [%zu] = %g, expected %g\n", i, h[i], first + step * (float)i);
      ok = 0;
    }
  free(h);
  return ok;
}

static void check_nccl(CUstream stream) {
  strataUniqueId id;
  OK(strataGetUniqueIdForTransport(strataTransportNccl, &id));
  int nonzero = 0;
  for (int i = STRATA_UNIQUE_ID_VENDOR_OFFSET; i < STRATA_UNIQUE_ID_BYTES; i++) nonzero |= id.internal[i];
  CHECK(nonzero, "the unique id carries an NCCL id");
  strataConfig_t cfg = STRATA_CONFIG_INITIALIZER;
  cfg.transport = strataTransportNccl;
  cfg.timeout_ms = 60000;
  strataComm_t c = NULL;
  OK(strataCommInitRankConfig(&c, 1, id, 0, &cfg));
  strataTransport_t t = 0;
  OK(strataCommGetTransport(c, &t));
  CHECK(t == strataTransportNccl, "transport %d", t);

  CUdeviceptr send = dev_floats(N, 0.0f, 1.0f), recv = dev_floats(N, -1.0f, 0.0f);
  /* 7.0f queued on the caller's stream just before the call: the collective must see it. */
  float seven = 7.0f;
  unsigned int bits;
  memcpy(&bits, &seven, sizeof bits);
  CU(cuMemsetD32Async(send, bits, N, stream));
  OK(strataAllReduce((void *)(uintptr_t)send, (void *)(uintptr_t)recv, N, strataFloat32, strataSum, c, stream));
  CU(cuStreamSynchronize(stream)); /* stream-ordered: wait for the stream, not the call */
  CHECK(dev_equals(recv, N, 7.0f, 0.0f), "all-reduce after the caller's memset");
  OK(strataAllReduce((void *)(uintptr_t)recv, (void *)(uintptr_t)recv, N, strataFloat32, strataAvg, c, stream));
  CU(cuStreamSynchronize(stream)); /* stream-ordered: wait for the stream, not the call */
  CHECK(dev_equals(recv, N, 7.0f, 0.0f), "in-place all-reduce (avg over 1 rank)");

  CUdeviceptr g = dev_floats(N, 0.0f, 2.0f);
  OK(strataAllGather((void *)(uintptr_t)g, (void *)(uintptr_t)g, N, strataFloat32, c, stream));
  CU(cuStreamSynchronize(stream)); /* stream-ordered: wait for the stream, not the call */
  CHECK(dev_equals(g, N, 0.0f, 2.0f), "in-place all-gather");
  CUdeviceptr rs = dev_floats(N, 0.0f, 0.0f), src = dev_floats(N, 1.0f, 1.0f);
  OK(strataReduceScatter((void *)(uintptr_t)src, (void *)(uintptr_t)rs, N, strataFloat32, strataMax, c, stream));
  CU(cuStreamSynchronize(stream)); /* stream-ordered: wait for the stream, not the call */
  CHECK(dev_equals(rs, N, 1.0f, 1.0f), "reduce-scatter");
  OK(strataBroadcast((void *)(uintptr_t)src, (void *)(uintptr_t)g, N, strataFloat32, 0, c, NULL));
  CU(cuStreamSynchronize(NULL)); /* stream-ordered: wait for the stream, not the call */
  CHECK(dev_equals(g, N, 1.0f, 1.0f), "broadcast on the default stream");

  OK(strataGroupStart());
  OK(strataAllReduce((void *)(uintptr_t)src, (void *)(uintptr_t)recv, N, strataFloat32, strataSum, c, stream));
  OK(strataAllReduce((void *)(uintptr_t)g, (void *)(uintptr_t)g, N, strataFloat32, strataSum, c, stream));
  OK(strataGroupEnd());
  CU(cuStreamSynchronize(stream)); /* stream-ordered: wait for the stream, not the call */
  CHECK(dev_equals(recv, N, 1.0f, 1.0f) && dev_equals(g, N, 1.0f, 1.0f), "group of two all-reduces");

  /* Graph capture: the all-reduce of src into recv (same shape as above: warmed up) is
     recorded into a graph, replayed 100 times from zeroed output, then once more after
     its input changed. */
  void *graph = NULL, *exec = NULL;
  CU(cuStreamBeginCapture(stream, 0 /* CU_STREAM_CAPTURE_MODE_GLOBAL */));
  strataResult_t cap = strataAllReduce((void *)(uintptr_t)src, (void *)(uintptr_t)recv, N, strataFloat32, strataSum, c, stream);
  CU(cuStreamEndCapture(stream, &graph));
  CHECK(cap == strataSuccess, "a collective on a capturing stream -> %d (%s)", cap, strataGetLastError(c));
  CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
  CU(cuMemsetD32Async(recv, 0, N, stream));
  for (int i = 0; i < 100; i++) CU(cuGraphLaunch(exec, stream));
  CU(cuStreamSynchronize(stream));
  CHECK(dev_equals(recv, N, 1.0f, 1.0f), "100 replays of a captured all-reduce");
  CU(cuMemsetD32Async(src, bits, N, stream));
  CU(cuGraphLaunch(exec, stream));
  CU(cuStreamSynchronize(stream));
  CHECK(dev_equals(recv, N, 7.0f, 0.0f), "a replay after the input changed");
  printf("  graph capture: 101 replays of a captured all-reduce correct\n");
  CU(cuGraphExecDestroy(exec));
  CU(cuGraphDestroy(graph));

  float host[4] = {1, 2, 3, 4};
  strataResult_t r = strataAllReduce(host, host, 4, strataFloat32, strataSum, c, stream);
  CHECK(r == strataInvalidArgument, "host pointer on nccl -> %d (%s)", r, strataGetLastError(c));
  printf("  host pointer refused: %s\n", strataGetLastError(c));

  OK(strataCommDestroy(c));
  CU(cuMemFree(send));
  CU(cuMemFree(recv));
  CU(cuMemFree(g));
  CU(cuMemFree(rs));
  CU(cuMemFree(src));
}

static void check_cuda_local(void) {
  strataConfig_t cfg = STRATA_CONFIG_INITIALIZER;
  cfg.transport = strataTransportCudaLocal;
  cfg.timeout_ms = 60000;
  strataComm_t cs[2];
  OK(strataCommInitLocal(cs, 2, NULL, &cfg));
  strataTransport_t t = 0;
  OK(strataCommGetTransport(cs[1], &t));
  CHECK(t == strataTransportCudaLocal, "transport %d", t);
  CUdeviceptr x[2], ag[2];
  for (int r = 0; r < 2; r++) {
    x[r] = dev_floats(N, (float)r, 1.0f);
    CU(cuMemAlloc(&ag[r], 2 * N * sizeof(float)));
  }
  OK(strataGroupStart());
  for (int r = 0; r < 2; r++)
    OK(strataAllReduce((void *)(uintptr_t)x[r], (void *)(uintptr_t)x[r], N, strataFloat32, strataSum, cs[r], NULL));
  OK(strataGroupEnd());
  for (int r = 0; r < 2; r++) CHECK(dev_equals(x[r], N, 1.0f, 2.0f), "cuda-local all-reduce, rank %d", r);
  OK(strataGroupStart());
  for (int r = 0; r < 2; r++)
    OK(strataAllGather((void *)(uintptr_t)x[r], (void *)(uintptr_t)ag[r], N, strataFloat32, cs[r], NULL));
  OK(strataGroupEnd());
  for (int r = 0; r < 2; r++) {
    CU(cuStreamSynchronize(NULL)); /* stream-ordered: wait for the stream, not the call */
    CHECK(dev_equals(ag[r], N, 1.0f, 2.0f) && dev_equals(ag[r] + N * sizeof(float), N, 1.0f, 2.0f),
          "cuda-local all-gather, rank %d", r);
    CU(cuMemFree(x[r]));
    CU(cuMemFree(ag[r]));
  }
  for (int r = 0; r < 2; r++) OK(strataCommDestroy(cs[r]));
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  open_device0("gpu-check-capi");
  CUstream stream;
  CU(cuStreamCreate(&stream, 1 /* CU_STREAM_NON_BLOCKING */));
  printf("gpu-check-capi: nccl, 1 rank\n");
  check_nccl(stream);
  printf("gpu-check-capi: cuda-local, 2 ranks\n");
  check_cuda_local();
  CU(cuStreamSynchronize(stream));
  CU(cuStreamDestroy(stream));
  printf("gpu-check-capi: %ld passed, 0 failed\n", passed);
  return 0;
}
