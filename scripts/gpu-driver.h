/*
 * The CUDA driver API as the C checks on a GPU use it (scripts/gpu-check-capi.c,
 * scripts/gpu-call-cost.c): the few types and entry points they call, loaded from
 * libcuda.so.1 with dlopen at run time (as strata loads it), so the checks build here
 * without a CUDA toolkit. Include after <dlfcn.h>, <stdio.h>, <stdlib.h>, <string.h>.
 */
#ifndef STRATA_GPU_DRIVER_H
#define STRATA_GPU_DRIVER_H

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

#define FAIL(...)                                                                  \
  do {                                                                             \
    fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                           \
    fprintf(stderr, __VA_ARGS__);                                                  \
    fprintf(stderr, "\n");                                                         \
    exit(1);                                                                       \
  } while (0)
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

/* Loads every entry point above; 0 when there is no driver (the check is skipped). */
static inline int load_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) return 0;
  const char *w = "libcuda";
  load(lib, w, "cuInit", &cuInit);
  load(lib, w, "cuDeviceGet", &cuDeviceGet);
  load(lib, w, "cuDevicePrimaryCtxRetain", &cuDevicePrimaryCtxRetain);
  load(lib, w, "cuCtxSetCurrent", &cuCtxSetCurrent);
  load(lib, w, "cuMemAlloc_v2", &cuMemAlloc);
  load(lib, w, "cuMemFree_v2", &cuMemFree);
  load(lib, w, "cuMemcpyHtoD_v2", &cuMemcpyHtoD);
  load(lib, w, "cuMemcpyDtoH_v2", &cuMemcpyDtoH);
  load(lib, w, "cuMemsetD32Async", &cuMemsetD32Async);
  load(lib, w, "cuStreamCreate", &cuStreamCreate);
  load(lib, w, "cuStreamSynchronize", &cuStreamSynchronize);
  load(lib, w, "cuStreamQuery", &cuStreamQuery);
  load(lib, w, "cuStreamDestroy_v2", &cuStreamDestroy);
  load(lib, w, "cuStreamBeginCapture_v2", &cuStreamBeginCapture);
  load(lib, w, "cuStreamEndCapture", &cuStreamEndCapture);
  load(lib, w, "cuGraphDestroy", &cuGraphDestroy);
  load(lib, w, "cuGraphInstantiateWithFlags", &cuGraphInstantiateWithFlags);
  load(lib, w, "cuGraphLaunch", &cuGraphLaunch);
  load(lib, w, "cuGraphExecDestroy", &cuGraphExecDestroy);
  load(lib, w, "cuEventCreate", &cuEventCreate);
  load(lib, w, "cuEventRecord", &cuEventRecord);
  load(lib, w, "cuEventQuery", &cuEventQuery);
  load(lib, w, "cuEventDestroy_v2", &cuEventDestroy);
  load(lib, w, "cuModuleLoadData", &cuModuleLoadData);
  load(lib, w, "cuModuleGetFunction", &cuModuleGetFunction);
  load(lib, w, "cuLaunchKernel", &cuLaunchKernel);
  return 1;
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
