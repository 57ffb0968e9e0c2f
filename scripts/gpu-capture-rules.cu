// Which host waits leave a CUDA graph capture valid? strata's in-process ranks share one
// device, so one rank's thread may wait on a private stream, copy, or query an event
// while another thread captures. strata relies on this: with the waiting thread's
// capture mode RELAXED (cuThreadExchangeStreamCaptureMode), waits on streams and events
// outside the capture do not invalidate a capture begun in GLOBAL mode by another
// thread. This probe checks that on the machine's driver and prints a table; exit 0 only
// when every RELAXED case from another thread kept the capture valid.
//
//   nvcc -O2 -std=c++17 -o /tmp/gpu-capture-rules scripts/gpu-capture-rules.cu && /tmp/gpu-capture-rules
#include <cuda_runtime.h>
#include <cstdio>
#include <cstring>
#include <thread>

__global__ void touch(int *p) { p[threadIdx.x] += 1; }

enum Action { STREAM_SYNC, EVENT_QUERY, COPY_SYNC, ALLOC_ASYNC_SYNC, N_ACTIONS };
static const char *action_name[] = {"cudaStreamSynchronize(other)", "cudaEventQuery(uncaptured)",
                                    "cudaMemcpyAsync D2H + sync", "cudaMallocAsync + sync"};

// Runs `a` on stream `s2` (not captured; made before the capture, as `ev`), in capture
// mode `mode`; returns its error.
static cudaError_t act(Action a, cudaStreamCaptureMode mode, int *dev_buf, cudaStream_t s2,
                       cudaEvent_t ev) {
  cudaStreamCaptureMode m = mode;
  cudaThreadExchangeStreamCaptureMode(&m);
  cudaError_t e = cudaSuccess;
  int host[32];
  void *p = nullptr;
  switch (a) {
  case STREAM_SYNC:
    touch<<<1, 32, 0, s2>>>(dev_buf);
    e = cudaStreamSynchronize(s2);
    break;
  case EVENT_QUERY:
    e = cudaEventQuery(ev);
    if (e == cudaErrorNotReady) e = cudaSuccess;
    break;
  case COPY_SYNC:
    e = cudaMemcpyAsync(host, dev_buf, sizeof host, cudaMemcpyDeviceToHost, s2);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s2);
    break;
  case ALLOC_ASYNC_SYNC:
    e = cudaMallocAsync(&p, 1 << 20, s2);
    if (e == cudaSuccess) e = cudaFreeAsync(p, s2);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s2);
    break;
  default:
    break;
  }
  cudaThreadExchangeStreamCaptureMode(&m);
  return e;
}

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("gpu-capture-rules: no CUDA device\n");
    return 77;
  }
  int *buf;
  cudaMalloc(&buf, 32 * sizeof(int));
  cudaMemset(buf, 0, 32 * sizeof(int));
  cudaDeviceSynchronize();
  std::printf("%-30s %-9s %-8s %-10s %s\n", "action (during a GLOBAL capture)", "thread", "mode",
              "action", "capture");
  int bad = 0;
  for (int other = 1; other >= 0; other--) {
    for (cudaStreamCaptureMode mode : {cudaStreamCaptureModeRelaxed, cudaStreamCaptureModeGlobal}) {
      for (int a = 0; a < N_ACTIONS; a++) {
        cudaStream_t s, s2;
        cudaEvent_t ev;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
        cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        touch<<<1, 32, 0, s2>>>(buf);
        cudaEventRecord(ev, s2);
        cudaGetLastError();
        cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
        touch<<<1, 32, 0, s>>>(buf);
        cudaError_t e = cudaSuccess;
        if (other) {
          std::thread t([&] { e = act(Action(a), mode, buf, s2, ev); });
          t.join();
        } else {
          e = act(Action(a), mode, buf, s2, ev);
        }
        touch<<<1, 32, 0, s>>>(buf);
        cudaGraph_t g = nullptr;
        cudaError_t end = cudaStreamEndCapture(s, &g);
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        cudaStreamSynchronize(s2);
        cudaEventDestroy(ev);
        cudaStreamDestroy(s2);
        cudaStreamDestroy(s);
        bool valid = end == cudaSuccess;
        bool relaxed = mode == cudaStreamCaptureModeRelaxed;
        if (other && relaxed && (!valid || e != cudaSuccess)) bad++;
        std::printf("%-30s %-9s %-8s %-10s %s\n", action_name[a], other ? "other" : "capturer",
                    relaxed ? "RELAXED" : "GLOBAL", e == cudaSuccess ? "ok" : cudaGetErrorName(e),
                    valid ? "valid" : cudaGetErrorName(end));
      }
    }
  }
  cudaFree(buf);
  std::printf("gpu-capture-rules: %s\n",
              bad ? "a RELAXED wait from another thread broke the capture"
                  : "RELAXED waits from other threads keep a GLOBAL capture valid");
  return bad ? 1 : 0;
}
