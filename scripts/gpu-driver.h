/*
 * The CUDA driver API as the C checks on a GPU use it (scripts/gpu-check-capi.c,
 * scripts/gpu-call-cost.c): the few types and entry points they call, loaded from
 * libcuda.so.1 with dlopen at run time (as strata loads it), so the checks build here
 * without a CUDA toolkit. Include after "strata.h", <dlfcn.h>, <stdio.h>, <stdlib.h>,
 * <string.h>; FAIL, CHECK and OK come from tests/c/check.h.
 */
#ifndef STRATA_GPU_DRIVER_H
#define STRATA_GPU_DRIVER_H

#include "../tests/c/check.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUmodule;
typedef void *CUfunction;
enum { CUDA_ERROR_NOT_READY = 600 };

static CUresult (*cuInit)(unsigned int);
static CUresult (*cuDeviceGet)(CUdevice *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemFree)(CUdeviceptr);
static CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
static CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
static CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
static CUresult (*cuStreamCreate)(CUstream *, unsigned int);
static CUresult (*cuStreamSynchronize)(CUstream);
static CUresult (*cuStreamQuery)(CUstream);
static CUresult (*cuStreamDestroy)(CUstream);
static CUresult (*cuStreamBeginCapture)(CUstream, int);
static CUresult (*cuStreamEndCapture)(CUstream, void **);
static CUresult (*cuGraphDestroy)(void *);
static CUresult (*cuGraphInstantiateWithFlags)(void **, void *, unsigned long long);
static CUresult (*cuGraphLaunch)(void *, CUstream);
static CUresult (*cuGraphExecDestroy)(void *);
static CUresult (*cuEventCreate)(CUevent *, unsigned int);
static CUresult (*cuEventRecord)(CUevent, CUstream);
static CUresult (*cuEventQuery)(CUevent);
static CUresult (*cuEventDestroy)(CUevent);
static CUresult (*cuModuleLoadData)(CUmodule *, const void *);
static CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
static CUresult (*cuLaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                                  unsigned int, unsigned int, unsigned int, CUstream, void **, void **);

#define CU(call)                                                                   \
  do {                                                                             \
    CUresult c_ = (call);                                                          \
    if (c_ != 0) FAIL("%s -> CUresult %d", #call, c_);                             \
  } while (0)

/* `name` from `lib` (`what` names it in the failure) into the function pointer `fn`. */
static inline void load(void *lib, const char *what, const char *name, void *fn) {
  void *p = dlsym(lib, name);
  if (!p) FAIL("%s has no %s", what, name);
  memcpy(fn, &p, sizeof p); /* POSIX: data and function pointers have one size */
}

/* One entry point to load: its symbol and the function pointer it goes to. */
struct entry {
  const char *name;
  void *fn;
};

/* dlopen `path` with `flags` and load the `n` entries `e` (`what` names the library in a
 * failure); 0 when the library is not there. */
static inline int load_all(const char *path, int flags, const char *what, const struct entry *e,
                           size_t n) {
  void *lib = dlopen(path, flags);
  if (!lib) return 0;
  for (size_t i = 0; i < n; i++) load(lib, what, e[i].name, e[i].fn);
  return 1;
}

/* Loads every entry point above; 0 when there is no driver (the check is skipped). */
static inline int load_driver(void) {
  /* E: the symbol of the pointer's name; V2: its versioned symbol (`_v2`). */
#define E(f) {#f, &f}
#define V2(f) {#f "_v2", &f}
  static const struct entry e[] = {
      E(cuInit), E(cuDeviceGet), E(cuDevicePrimaryCtxRetain), E(cuCtxSetCurrent),
      V2(cuMemAlloc), V2(cuMemFree), V2(cuMemcpyHtoD), V2(cuMemcpyDtoH), E(cuMemsetD32Async),
      E(cuStreamCreate), E(cuStreamSynchronize), E(cuStreamQuery), V2(cuStreamDestroy),
      V2(cuStreamBeginCapture), E(cuStreamEndCapture), E(cuGraphDestroy),
      E(cuGraphInstantiateWithFlags), E(cuGraphLaunch), E(cuGraphExecDestroy),
      E(cuEventCreate), E(cuEventRecord), E(cuEventQuery), V2(cuEventDestroy),
      E(cuModuleLoadData), E(cuModuleGetFunction), E(cuLaunchKernel),
  };
#undef E
#undef V2
  return load_all("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL, "libcuda", e, sizeof e / sizeof *e);
}

/* Device 0 made current (its primary context), as an NCCL program starts; without a
 * driver or a device, prints why `prog` is skipped and exits 77. */
static inline void open_device0(const char *prog) {
  if (!load_driver()) {
    printf("%s: skipped (no libcuda.so.1: %s)\n", prog, dlerror());
    exit(77);
  }
  CUdevice d;
  CUcontext ctx;
  if (cuInit(0) != 0 || cuDeviceGet(&d, 0) != 0) {
    printf("%s: skipped (no CUDA device)\n", prog);
    exit(77);
  }
  CU(cuDevicePrimaryCtxRetain(&ctx, d));
  CU(cuCtxSetCurrent(ctx));
}

#endif
