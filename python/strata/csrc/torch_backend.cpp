// strata's torch.distributed backend in C++ (issue 49; docs/python.md, "The C++ backend").
//
// A c10d::Backend and c10d::Work over strata's C ABI, resolved with dlsym from the
// library the `strata` package already loaded (its path comes from Python), so the
// extension links to nothing of strata's and serves whatever library the package uses.
//
// The common calls run here: all-reduce (SUM, AVG, MAX, MIN, PRODUCT, PREMUL_SUM with a
// scalar factor; the reducible dtypes), all-gather (tensor, list and coalesced forms),
// reduce-scatter (the same), broadcast, equal-split all-to-all, and on CPU barrier.
// CPU tensors run on the group's mpi communicator: each call is one strata call (a group
// of them for a coalesced list) enqueued on the backend's strata host stream; the Work
// is an event recorded after it (from a pool), `wait()` synchronizes the event and raises
// the call's failure (a dead peer, an abort) as a DistBackendError, `isCompleted()`
// queries it, and the tensors are held until it completes. `asyncOp == false` (a
// blocking torch call) runs the call blocking, with nothing queued behind.
// CUDA tensors run on the group's nccl communicator with ProcessGroupNCCL's stream
// semantics (`issue_cuda`, `CudaWork`), through c10's device-generic streams and events,
// so this file needs no CUDA headers and builds against CPU and CUDA torch alike
// (`STRATA_TORCH_CPP_CUDA=0` hands CUDA tensors to the delegate instead).
//
// Everything else goes to the Python implementation (`strata.torch._Ops`, the
// "delegate"), called with the GIL: bool and complex reductions, BAND/BOR/BXOR,
// non-contiguous or mixed-dtype tensors, uneven all-to-all, gather, scatter, reduce,
// send/recv, coalescing blocks, and a barrier of a group with no CPU communicator.
// So every call the Python backend serves is served, and the hot ones cost one C call.

#include <dlfcn.h>

// ATen and torch's pybind11 casters, not <torch/extension.h> (all of libtorch's C++ API,
// autograd, nn and optim): a third less compile time at install.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace py = pybind11;

namespace {

// Calls this process's backends ran here (not handed to the delegate): CPU and CUDA.
std::atomic<uint64_t> native_calls{0};
std::atomic<uint64_t> native_cuda_calls{0};

// include/strata.h's values.
constexpr int kSuccess = 0;
constexpr int kInProgress = 7;
enum Dt : int { kI8 = 0, kU8 = 1, kI32 = 2, kU32 = 3, kI64 = 4, kU64 = 5, kF16 = 6, kF32 = 7, kF64 = 8, kBf16 = 9 };
enum Op : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4 };

// The C ABI functions this backend calls.
struct Api {
  int (*all_reduce)(const void*, void*, size_t, int, int, void*, void*);
  int (*all_gather)(const void*, void*, size_t, int, void*, void*);
  int (*reduce_scatter)(const void*, void*, size_t, int, int, void*, void*);
  int (*broadcast)(const void*, void*, size_t, int, int, void*, void*);
  int (*all_to_all)(const void*, void*, size_t, int, void*, void*);
  int (*group_start)();
  int (*group_end)();
  const char* (*last_error)(void*);
  const char* (*error_string)(int);
  int (*stream_create)(void**);
  int (*stream_destroy)(void*);
  int (*event_create)(void**);
  int (*event_destroy)(void*);
  int (*event_record)(void*, void*);
  int (*event_query)(void*);
  int (*event_sync)(void*);
  int (*async_error)(void*, int*);
};

template <class F>
void resolve(void* lib, const char* name, const std::string& path, F& f) {
  void* p = dlsym(lib, name);
  TORCH_CHECK(p != nullptr, "strata backend: ", name, " not found in ", path);
  f = reinterpret_cast<F>(p);
}

// The API of the library at `path` (the package's, already loaded by ctypes): resolved
// once per process.
const Api& api_of(const std::string& path) {
  static std::once_flag once;
  static Api api;
  static std::string loaded;
  std::call_once(once, [&] {
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    TORCH_CHECK(lib != nullptr, "strata backend: cannot load ", path, ": ", dlerror());
    resolve(lib, "strataAllReduce", path, api.all_reduce);
    resolve(lib, "strataAllGather", path, api.all_gather);
    resolve(lib, "strataReduceScatter", path, api.reduce_scatter);
    resolve(lib, "strataBroadcast", path, api.broadcast);
    resolve(lib, "strataAllToAll", path, api.all_to_all);
    resolve(lib, "strataGroupStart", path, api.group_start);
    resolve(lib, "strataGroupEnd", path, api.group_end);
    resolve(lib, "strataGetLastError", path, api.last_error);
    resolve(lib, "strataGetErrorString", path, api.error_string);
    resolve(lib, "strataStreamCreate", path, api.stream_create);
    resolve(lib, "strataStreamDestroy", path, api.stream_destroy);
    resolve(lib, "strataEventCreate", path, api.event_create);
    resolve(lib, "strataEventDestroy", path, api.event_destroy);
    resolve(lib, "strataEventRecord", path, api.event_record);
    resolve(lib, "strataEventQuery", path, api.event_query);
    resolve(lib, "strataEventSynchronize", path, api.event_sync);
    resolve(lib, "strataCommGetAsyncError", path, api.async_error);
    loaded = path;
  });
  TORCH_CHECK(loaded == path, "strata backend: this process already uses ", loaded, ", not ", path);
  return api;
}

// The message of a failed call: strata's code and the communicator's last error.
std::string message(const Api& a, int rc, void* comm, const char* what) {
  std::string m = std::string("strata backend: ") + what + ": " + a.error_string(rc);
  const char* last = comm ? a.last_error(comm) : nullptr;
  if (last != nullptr && *last != '\0') {
    m += ": ";
    m += last;
  }
  return m;
}

[[noreturn]] void fail(const Api& a, int rc, void* comm, const char* what) {
  C10_THROW_ERROR(DistBackendError, message(a, rc, comm, what));
}

// strata's number for a dtype it reduces, -1 for others.
int reducible(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return kF32;
    case at::kDouble: return kF64;
    case at::kHalf: return kF16;
    case at::kBFloat16: return kBf16;
    case at::kChar: return kI8;
    case at::kByte: return kU8;
    case at::kInt: return kI32;
    case at::kLong: return kI64;
    case at::kUInt32: return kU32;
    case at::kUInt64: return kU64;
    default: return -1;
  }
}

// (strata op, premultiply factor; 0 for none) of a torch op strata reduces natively, or
// op -1 (the delegate serves it: BAND/BOR/BXOR, a tensor factor).
std::pair<int, double> native_op(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return {kSum, 0.0};
    case c10d::ReduceOp::AVG: return {kAvg, 0.0};
    case c10d::ReduceOp::MAX: return {kMax, 0.0};
    case c10d::ReduceOp::MIN: return {kMin, 0.0};
    case c10d::ReduceOp::PRODUCT: return {kProd, 0.0};
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      if (s != nullptr && !s->tensor_factor.defined()) {
        return {kSum, s->double_factor};
      }
      return {-1, 0.0};
    }
    default: return {-1, 0.0};
  }
}

// A dense tensor of a reducible kind (contiguous, strided, not complex or bool).
bool dense(const at::Tensor& t) {
  return t.is_contiguous() && t.layout() == at::kStrided && !t.is_complex() && t.scalar_type() != at::kBool;
}

// Releases the GIL for a blocking strata call where the calling thread holds it (torch
// calls a backend with or without it, depending on the path).
struct NoGil {
  PyThreadState* state = PyGILState_Check() ? PyEval_SaveThread() : nullptr;
  NoGil() = default;
  NoGil(const NoGil&) = delete;
  NoGil& operator=(const NoGil&) = delete;
  ~NoGil() {
    if (state != nullptr) PyEval_RestoreThread(state);
  }
};

// Events recorded after calls, reused (an event is made once, not per call).
struct Events {
  const Api* api;
  std::mutex m;
  std::vector<void*> free;

  void* get() {
    {
      std::lock_guard<std::mutex> g(m);
      if (!free.empty()) {
        void* e = free.back();
        free.pop_back();
        return e;
      }
    }
    void* e = nullptr;
    int rc = api->event_create(&e);
    if (rc != kSuccess) fail(*api, rc, nullptr, "strataEventCreate");
    return e;
  }
  void put(void* e) {
    std::lock_guard<std::mutex> g(m);
    free.push_back(e);
  }
  ~Events() {
    for (void* e : free) api->event_destroy(e);
  }
};

// A call of the backend: complete when its event is (or at once, for a blocking call).
class StrataWork : public c10d::Work {
 public:
  StrataWork(c10d::OpType type, const char* what, std::shared_ptr<Events> events, void* event, void* comm,
             std::vector<at::Tensor> hold, std::vector<at::Tensor> outputs, std::function<void()> post)
      : c10d::Work(-1, type),
        what_(what),
        events_(std::move(events)),
        event_(event),
        comm_(comm),
        hold_(std::move(hold)),
        outputs_(std::move(outputs)),
        post_(std::move(post)) {
    if (event_ == nullptr) settle(kSuccess);
  }

  ~StrataWork() override {
    // A Work dropped before it was seen complete: its event is not reused (it may still
    // stand for the call), and nothing here waits.
    if (event_ != nullptr) events_->api->event_destroy(event_);
  }

  bool isCompleted() override {
    std::lock_guard<std::mutex> g(mutex_);
    if (event_ == nullptr) return true;
    int rc = events_->api->event_query(event_);
    if (rc == kInProgress) return false;
    settle(rc);
    return true;
  }

  bool isSuccess() const override {
    std::lock_guard<std::mutex> g(mutex_);
    return completed_ && !exception_;
  }

  bool wait(std::chrono::milliseconds /*timeout: the communicator's bounds every wait*/) override {
    {
      std::lock_guard<std::mutex> g(mutex_);
      if (event_ != nullptr) {
        int rc;
        {
          NoGil nogil;
          rc = events_->api->event_sync(event_);
        }
        settle(rc);
      }
    }
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }

  std::vector<at::Tensor> result() override {
    return outputs_;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    // Made only when asked, completed once the call is (CPU: this waits).
    if (!future_) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
      try {
        wait(kNoTimeout);
        future_->markCompleted(c10::IValue(outputs_));
      } catch (...) {
        future_->setError(std::current_exception());
      }
    }
    return future_;
  }

 private:
  // Under mutex_ (or in the constructor): the call's outcome, once.
  void settle(int rc) {
    if (event_ != nullptr) {
      events_->put(event_);
      event_ = nullptr;
    }
    if (rc != kSuccess) {
      exception_ = std::make_exception_ptr(
          c10::DistBackendError(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                message(*events_->api, rc, comm_, what_)));
    } else if (post_) {
      try {
        post_();
      } catch (...) {
        exception_ = std::current_exception();
      }
    }
    post_ = nullptr;
    hold_.clear();
    completed_ = true;
  }

  const char* what_;
  std::shared_ptr<Events> events_;
  void* event_;
  void* comm_;
  std::vector<at::Tensor> hold_;
  std::vector<at::Tensor> outputs_;
  std::function<void()> post_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// CUDA events (c10's device-generic Event: no CUDA headers or libraries needed here),
// reused across calls (ProcessGroupNCCL's event cache): one made per call in flight, not
// per call.
struct CudaEvents {
  std::mutex m;
  std::vector<std::unique_ptr<c10::Event>> free;

  std::unique_ptr<c10::Event> get(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> g(m);
    for (size_t i = free.size(); i-- > 0;) {
      // An event belongs to the device it was first recorded on.
      if (free[i]->device_index() == device || free[i]->device_index() == -1) {
        std::unique_ptr<c10::Event> e = std::move(free[i]);
        free.erase(free.begin() + static_cast<std::ptrdiff_t>(i));
        return e;
      }
    }
    return std::make_unique<c10::Event>(c10::DeviceType::CUDA);
  }
  void put(std::unique_ptr<c10::Event> e) {
    std::lock_guard<std::mutex> g(m);
    free.push_back(std::move(e));
  }
};

// The failure that aborted `comm` after a call was made (a device error, a peer gone
// past the timeout, an abort), raised as ProcessGroupNCCL raises its watchdog's.
void raise_async(const Api& a, void* comm, const char* what) {
  int err = kSuccess;
  int rc = a.async_error(comm, &err);
  if (rc != kSuccess) fail(a, rc, comm, what);
  if (err != kSuccess) fail(a, err, comm, what);
}

bool failed_async(const Api& a, void* comm) {
  int err = kSuccess;
  return a.async_error(comm, &err) != kSuccess || err != kSuccess;
}

// A CUDA call, as ProcessGroupNCCL's work: an end event recorded on the call's stream
// after it (from the pool); `wait()` makes the current stream wait for it (the host
// blocks only for a finite timeout) and raises a failure the communicator saw;
// `isCompleted()` is the event or that failure; `getFuture()` is made when asked, a
// Future of the call's device completed on the call's stream. The call's tensors are
// held until the work is dropped (and recorded on an internal stream by the caller).
class CudaWork : public c10d::Work {
 public:
  CudaWork(c10d::OpType type, const char* what, const Api& api, std::shared_ptr<CudaEvents> pool,
           std::unique_ptr<c10::Event> end, c10::Stream stream, void* comm, std::vector<at::Tensor> hold,
           std::vector<at::Tensor> outputs)
      : c10d::Work(-1, type),
        what_(what),
        api_(api),
        pool_(std::move(pool)),
        end_(std::move(end)),
        stream_(stream),
        comm_(comm),
        hold_(std::move(hold)),
        outputs_(std::move(outputs)) {}

  ~CudaWork() override {
    // Re-recording an event leaves earlier waits on it as they were, so it goes back
    // to the pool whether or not the call has passed.
    pool_->put(std::move(end_));
  }

  bool isCompleted() override {
    return failed_async(api_, comm_) || end_->query();
  }

  bool isSuccess() const override {
    return end_->query() && !failed_async(api_, comm_);
  }

  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout != kNoTimeout) {
      NoGil nogil;
      auto deadline = std::chrono::steady_clock::now() + timeout;
      while (!end_->query() && !failed_async(api_, comm_)) {
        if (std::chrono::steady_clock::now() > deadline) {
          C10_THROW_ERROR(DistBackendError, std::string("strata backend: ") + what_ + ": the CUDA call did not finish within " +
                                                std::to_string(timeout.count()) + " ms");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    raise_async(api_, comm_, what_);
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    end_->block(impl.getStream(stream_.device()));
    return true;
  }

  void synchronize() override {
    wait(kNoTimeout);
  }

  std::vector<at::Tensor> result() override {
    return outputs_;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    if (!future_) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                         std::vector<c10::Device>{stream_.device()});
      // Completed on the call's stream: the Future records its own event there, so
      // callbacks and waiters on other streams are ordered after the call.
      c10::StreamGuard g(stream_);
      try {
        raise_async(api_, comm_, what_);
        future_->markCompleted(c10::IValue(outputs_));
      } catch (...) {
        future_->setError(std::current_exception());
      }
    }
    return future_;
  }

 private:
  const char* what_;
  const Api& api_;
  std::shared_ptr<CudaEvents> pool_;
  std::unique_ptr<c10::Event> end_;
  c10::Stream stream_;
  void* comm_;
  std::vector<at::Tensor> hold_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class StrataBackend : public c10d::Backend {
 public:
  StrataBackend(py::object delegate, int rank, int size, const std::string& lib)
      : c10d::Backend(rank, size), api_(api_of(lib)), lib_(lib), delegate_(std::move(delegate)) {
    events_ = std::make_shared<Events>();
    events_->api = &api_;
    cuda_events_ = std::make_shared<CudaEvents>();
    // STRATA_TORCH_CPP_CUDA=0: CUDA tensors go to the delegate (the Python path).
    const char* v = std::getenv("STRATA_TORCH_CPP_CUDA");
    cuda_ok_ = v == nullptr || std::string(v) != "0";
  }

  ~StrataBackend() override {
    if (stream_ != nullptr) api_.stream_destroy(stream_);
    py::gil_scoped_acquire g;
    delegate_ = py::object();
  }

  const std::string getBackendName() const override {
    return "strata";
  }

  bool supportsCoalescing() const override {
    return true;
  }

  // -- all-reduce --
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    return allreduce_list("allreduce", tensors, opts, c10d::OpType::ALLREDUCE);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    return allreduce_list("allreduce_coalesced", tensors, opts, c10d::OpType::ALLREDUCE_COALESCED);
  }

  // -- all-gather --
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions& opts) override {
    if (!gather_pair(out, in)) return delegate("all_gather_single", out, in, opts);
    std::vector<at::Tensor> hold{out, in};
    return issue("_allgather_base", c10d::OpType::_ALLGATHER_BASE, opts.asyncOp, in, std::move(hold), {out}, nullptr,
                 [&](void* c, void* s) { return gather_call(out, in, c, s); });
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outs,
                                                                 std::vector<at::Tensor>& ins,
                                                                 const c10d::AllgatherOptions& opts) override {
    bool ok = !ins.empty() && outs.size() == ins.size() && !coalescing_;
    for (size_t i = 0; ok && i < ins.size(); ++i) ok = gather_pair(outs[i], ins[i]);
    if (!ok) return delegate("all_gather_single_coalesced", outs, ins, opts);
    std::vector<at::Tensor> hold(outs);
    hold.insert(hold.end(), ins.begin(), ins.end());
    return issue("allgather_into_tensor_coalesced", c10d::OpType::COALESCED, opts.asyncOp, ins[0], std::move(hold),
                 outs, nullptr, [&](void* c, void* s) {
                   for (size_t i = 0; i < ins.size(); ++i) {
                     int rc = gather_call(outs[i], ins[i], c, s);
                     if (rc != kSuccess) return rc;
                   }
                   return kSuccess;
                 }, ins.size() > 1);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                                           const c10d::AllgatherOptions& opts) override {
    bool ok = ins.size() == 1 && outs.size() == 1 && static_cast<int>(outs[0].size()) == size_ && !coalescing_ &&
              here(ins[0]) && dense(ins[0]);
    for (size_t i = 0; ok && i < outs[0].size(); ++i) {
      ok = outs[0][i].device() == ins[0].device() && outs[0][i].numel() == ins[0].numel() &&
           outs[0][i].scalar_type() == ins[0].scalar_type();
    }
    if (!ok) return delegate("allgather", outs, ins, opts);
    // Into one flat tensor, then copied out to the list (torch's list form).
    at::Tensor flat = at::empty({static_cast<int64_t>(size_) * ins[0].numel()}, ins[0].options());
    at::Tensor in = ins[0];
    std::vector<at::Tensor> list = outs[0];
    auto post = [flat, list, n = in.numel()]() mutable {
      for (size_t r = 0; r < list.size(); ++r) {
        list[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view(list[r].sizes()));
      }
    };
    return issue("allgather", c10d::OpType::ALLGATHER, opts.asyncOp, in, {flat, in}, list, post,
                 [&](void* c, void* s) { return gather_call(flat, in, c, s); });
  }

  // -- reduce-scatter --
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                      const c10d::ReduceScatterOptions& opts) override {
    auto [op, factor] = native_op(opts.reduceOp);
    if (op < 0 || !scatter_pair(out, in)) return delegate("reduce_scatter_single", out, in, opts);
    at::Tensor src = factor != 0.0 ? in * factor : in;
    return issue("_reduce_scatter_base", c10d::OpType::_REDUCE_SCATTER_BASE, opts.asyncOp, in, {out, src}, {out},
                 nullptr, [&, op = op](void* c, void* s) { return scatter_call(out, src, op, c, s); });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outs,
                                                                 std::vector<at::Tensor>& ins,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    auto [op, factor] = native_op(opts.reduceOp);
    bool ok = op >= 0 && !ins.empty() && outs.size() == ins.size() && !coalescing_;
    for (size_t i = 0; ok && i < ins.size(); ++i) ok = scatter_pair(outs[i], ins[i]);
    if (!ok) return delegate("reduce_scatter_single_coalesced", outs, ins, opts);
    std::vector<at::Tensor> srcs;
    for (auto& t : ins) srcs.push_back(factor != 0.0 ? t * factor : t);
    std::vector<at::Tensor> hold(outs);
    hold.insert(hold.end(), srcs.begin(), srcs.end());
    return issue("reduce_scatter_tensor_coalesced", c10d::OpType::COALESCED, opts.asyncOp, ins[0], std::move(hold),
                 outs, nullptr, [&, op = op](void* c, void* s) {
                   for (size_t i = 0; i < srcs.size(); ++i) {
                     int rc = scatter_call(outs[i], srcs[i], op, c, s);
                     if (rc != kSuccess) return rc;
                   }
                   return kSuccess;
                 }, ins.size() > 1);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outs,
                                                std::vector<std::vector<at::Tensor>>& ins,
                                                const c10d::ReduceScatterOptions& opts) override {
    auto [op, factor] = native_op(opts.reduceOp);
    bool ok = op >= 0 && outs.size() == 1 && ins.size() == 1 && static_cast<int>(ins[0].size()) == size_ &&
              !coalescing_ && here(outs[0]) && dense(outs[0]) && reducible(outs[0].scalar_type()) >= 0;
    for (size_t i = 0; ok && i < ins[0].size(); ++i) {
      ok = ins[0][i].device() == outs[0].device() && ins[0][i].numel() == outs[0].numel() &&
           ins[0][i].scalar_type() == outs[0].scalar_type();
    }
    if (!ok) return delegate("reduce_scatter", outs, ins, opts);
    // The list as one flat input (torch's list form), premultiplied where asked.
    std::vector<at::Tensor> flat_parts;
    for (auto& t : ins[0]) flat_parts.push_back(t.reshape({-1}));
    at::Tensor src = at::cat(flat_parts);
    if (factor != 0.0) src.mul_(factor);
    at::Tensor out = outs[0];
    return issue("reduce_scatter", c10d::OpType::REDUCE_SCATTER, opts.asyncOp, out, {out, src}, {out}, nullptr,
                 [&, op = op](void* c, void* s) { return scatter_call(out, src, op, c, s); });
  }

  // -- broadcast, all-to-all, barrier --
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    bool ok = tensors.size() == 1 && opts.rootTensor == 0 && !coalescing_ && here(tensors[0]) &&
              tensors[0].is_contiguous() && tensors[0].layout() == at::kStrided;
    if (!ok) return delegate("broadcast", tensors, opts);
    at::Tensor t = tensors[0];
    int root = static_cast<int>(opts.rootRank);
    return issue("broadcast", c10d::OpType::BROADCAST, opts.asyncOp, t, {t}, {t}, nullptr, [&](void* c, void* s) {
      void* p = t.data_ptr();
      return api_.broadcast(p, p, t.numel() * t.element_size(), kU8, root, c, s);
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits,
                                               const c10d::AllToAllOptions& opts) override {
    bool ok = out_splits.empty() && in_splits.empty() && !coalescing_ && here(in) &&
              out.device() == in.device() && in.is_contiguous() && out.is_contiguous() && in.numel() == out.numel() &&
              in.scalar_type() == out.scalar_type() && in.numel() % size_ == 0;
    if (!ok) return delegate("all_to_all_single", out, in, out_splits, in_splits, opts);
    return issue("alltoall_base", c10d::OpType::ALLTOALL_BASE, opts.asyncOp, in, {out, in}, {out}, nullptr,
                 [&](void* c, void* s) {
                   size_t bytes = static_cast<size_t>(in.numel() / size_) * in.element_size();
                   return api_.all_to_all(in.data_ptr(), out.data_ptr(), bytes, kU8, c, s);
                 });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    // CPU groups (the mpi communicator made, or no CUDA one asked for): a one-byte
    // all-reduce, blocking; else the delegate (a barrier on the group's GPU).
    if (cpu_.load() == nullptr || !opts.device_ids.empty() || coalescing_) return delegate("barrier", opts);
    at::Tensor one = at::zeros({1}, at::kByte);
    return issue("barrier", c10d::OpType::BARRIER, false, one, {one}, {}, nullptr, [&](void* c, void* s) {
      return api_.all_reduce(one.data_ptr(), one.data_ptr(), 1, kU8, kMax, c, s);
    });
  }

  // -- served by the delegate --
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    return delegate("reduce", tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                                        const c10d::GatherOptions& opts) override {
    return delegate("gather", outs, ins, opts);
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outs, std::vector<std::vector<at::Tensor>>& ins,
                                         const c10d::ScatterOptions& opts) override {
    return delegate("scatter", outs, ins, opts);
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                                          const c10d::AllToAllOptions& opts) override {
    return delegate("alltoall", outs, ins, opts);
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return delegate("send", tensors, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return delegate("recv", tensors, src, tag);
  }

  // A coalescing block goes to the delegate whole (its calls as one strata group).
  void startCoalescing() override {
    py::gil_scoped_acquire g;
    delegate_.attr("_start_coalescing")();
    coalescing_ = true;
  }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    coalescing_ = false;
    return delegate("_end_coalescing");
  }

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11)
  // torch.distributed.shrink_group (torch 2.11 and 2.15 have it): the survivors' backend, its communicators shrunk by
  // the delegate (Comm.shrink), the excluded ranks not calling.
  bool supportsShrinking() const override {
    return true;
  }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                           const c10::intrusive_ptr<Options>& /*opts_override*/) override {
    py::gil_scoped_acquire g;
    py::object d = delegate_.attr("_shrunk")(ranks_to_exclude, shrink_flags);
    int rank = d.attr("rank")().cast<int>(), size = d.attr("size")().cast<int>();
    return c10::make_intrusive<StrataBackend>(std::move(d), rank, size, lib_);
  }
#endif

  void shutdown() override {
    py::gil_scoped_acquire g;
    delegate_.attr("shutdown")();
  }

  // ProcessGroup.abort() (and torch's _abort_process_group): the group's communicators
  // aborted (strataCommAbort: the calls in flight fail, here and on the peers), and every
  // later call raises, as ProcessGroupNCCL's after an abort.
  void abort() override {
    aborted_.store(true, std::memory_order_release);
    py::gil_scoped_acquire g;
    delegate_.attr("_abort")();
  }

 private:
  // A tensor on a device this backend serves itself: CPU (the mpi communicator) and
  // CUDA (the nccl one) unless STRATA_TORCH_CPP_CUDA=0.
  bool here(const at::Tensor& t) const {
    return t.device().is_cpu() || (cuda_ok_ && t.device().is_cuda());
  }

  bool gather_pair(const at::Tensor& out, const at::Tensor& in) const {
    return !coalescing_ && here(in) && out.device() == in.device() && in.is_contiguous() &&
           out.is_contiguous() && in.layout() == at::kStrided && out.layout() == at::kStrided &&
           in.scalar_type() == out.scalar_type() && out.numel() == in.numel() * size_;
  }

  bool scatter_pair(const at::Tensor& out, const at::Tensor& in) const {
    return !coalescing_ && here(in) && out.device() == in.device() && dense(out) && dense(in) &&
           reducible(in.scalar_type()) >= 0 &&
           in.scalar_type() == out.scalar_type() && in.numel() == out.numel() * size_;
  }

  // All-gather of `in` into `out`, as bytes (any dtype).
  int gather_call(const at::Tensor& out, const at::Tensor& in, void* c, void* s) {
    return api_.all_gather(in.data_ptr(), out.data_ptr(), in.numel() * in.element_size(), kU8, c, s);
  }

  int scatter_call(const at::Tensor& out, const at::Tensor& in, int op, void* c, void* s) {
    return api_.reduce_scatter(in.data_ptr(), out.data_ptr(), out.numel(), reducible(in.scalar_type()), op, c, s);
  }

  template <class Opts>
  c10::intrusive_ptr<c10d::Work> allreduce_list(const char* method, std::vector<at::Tensor>& tensors,
                                                const Opts& opts, c10d::OpType type) {
    auto [op, factor] = native_op(opts.reduceOp);
    bool ok = op >= 0 && !tensors.empty() && !coalescing_;
    for (auto& t : tensors) {
      ok = ok && here(t) && t.device() == tensors[0].device() && dense(t) && reducible(t.scalar_type()) >= 0;
    }
    if (!ok) return delegate(method, tensors, opts);
    if (factor != 0.0) {
      for (auto& t : tensors) t.mul_(factor);
    }
    return issue(method, type, opts.asyncOp, tensors[0], tensors, tensors, nullptr,
                 [&, op = op](void* c, void* s) {
                   for (auto& t : tensors) {
                     int rc = api_.all_reduce(t.data_ptr(), t.data_ptr(), t.numel(), reducible(t.scalar_type()), op, c, s);
                     if (rc != kSuccess) return rc;
                   }
                   return kSuccess;
                 }, tensors.size() > 1);
  }

  // The group's communicator for `t`'s device, kept in `slot` (`cpu_`: mpi, `cuda_`:
  // nccl on the tensor's GPU), made by the delegate at first use (under the GIL, which
  // serializes the making).
  void* comm_for(std::atomic<void*>& slot, const at::Tensor& t, const char* method) {
    void* c = slot.load(std::memory_order_acquire);
    if (c == nullptr) {
      py::gil_scoped_acquire g;
      c = slot.load(std::memory_order_acquire);
      if (c == nullptr) {
        py::object comm = delegate_.attr("_comm")(t, method);
        c = reinterpret_cast<void*>(comm.attr("handle").cast<uintptr_t>());
        slot.store(c, std::memory_order_release);
      }
    }
    return c;
  }

  // `call(comm, stream)`, inside one strata group when `grouped`; the first failure.
  template <class F>
  int run_calls(F& call, void* comm, void* stream, bool grouped) {
    if (!grouped) return call(comm, stream);
    int rc = api_.group_start();
    int body = rc == kSuccess ? call(comm, stream) : rc;
    int end = rc == kSuccess ? api_.group_end() : rc;
    return body != kSuccess ? body : end;
  }

  // Run `call(comm, stream)` (a group of calls when `grouped`) on the calls' strata group:
  // a CUDA tensor's call as ProcessGroupNCCL's (`issue_cuda`); on CPU blocking where the
  // torch call is, else on the backend's host stream with an event recorded after it.
  template <class F>
  c10::intrusive_ptr<c10d::Work> issue(const char* what, c10d::OpType type, bool async, const at::Tensor& first,
                                       std::vector<at::Tensor> hold, std::vector<at::Tensor> outputs,
                                       std::function<void()> post, F&& call, bool grouped = false) {
    if (aborted_.load(std::memory_order_acquire)) {
      C10_THROW_ERROR(DistBackendError, std::string("strata backend: ") + what + ": the group was aborted");
    }
    if (first.device().is_cuda()) {
      return issue_cuda(what, type, async, first, std::move(hold), std::move(outputs), std::move(post),
                        std::forward<F>(call), grouped);
    }
    void* comm = comm_for(cpu_, first, what);
    native_calls.fetch_add(1, std::memory_order_relaxed);
    // One thread at a time on the communicator (the C ABI's rule; DDP's hooks run on
    // autograd threads). Taken without the GIL held by this path, never while waiting
    // for it.
    std::lock_guard<std::mutex> serial(calls_);
    void* stream = nullptr;
    if (async) {
      if (stream_ == nullptr) {
        int rc = api_.stream_create(&stream_);
        if (rc != kSuccess) fail(api_, rc, nullptr, "strataStreamCreate");
      }
      stream = stream_;
    }
    int rc;
    {
      NoGil nogil;
      rc = run_calls(call, comm, stream, grouped);
    }
    if (rc != kSuccess) fail(api_, rc, comm, what);
    void* event = nullptr;
    if (async) {
      event = events_->get();
      rc = api_.event_record(event, stream);
      if (rc != kSuccess) {
        events_->put(event);
        fail(api_, rc, comm, "strataEventRecord");
      }
    }
    return c10::make_intrusive<StrataWork>(type, what, events_, event, comm, std::move(hold), std::move(outputs),
                                           std::move(post));
  }

  // A CUDA call, with ProcessGroupNCCL's stream semantics: a blocking torch call
  // (`async` false) is enqueued on the current stream; an async one on this backend's
  // internal stream of the device, which first waits for the current one (an event
  // from the pool), its tensors recorded on that stream for the caching allocator. The
  // strata call is stream-ordered (the C ABI's rule on nccl) and returns without
  // waiting for the GPU; `post` (copies out of a flat buffer) follows it on the same
  // stream; the Work is an end event recorded there ([`CudaWork`]). Stream entries per
  // call: the call's own, the end event, and for an async call the wait's two.
  template <class F>
  c10::intrusive_ptr<c10d::Work> issue_cuda(const char* what, c10d::OpType type, bool async, const at::Tensor& first,
                                            std::vector<at::Tensor> hold, std::vector<at::Tensor> outputs,
                                            std::function<void()> post, F&& call, bool grouped) {
    void* comm = comm_for(cuda_, first, what);
    native_cuda_calls.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> serial(calls_);
    const c10::Device dev = first.device();
    c10::DeviceGuard on_device(dev);
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    const c10::Stream current = impl.getStream(dev);
    c10::Stream stream = current;
    if (async) {
      stream = side_stream(impl, dev);
      std::unique_ptr<c10::Event> ready = cuda_events_->get(dev.index());
      ready->record(current);
      ready->block(stream);
      cuda_events_->put(std::move(ready));  // the wait keeps the state it saw
    }
    int rc;
    {
      NoGil nogil;
      rc = run_calls(call, comm, stream.native_handle(), grouped);
    }
    if (rc != kSuccess) fail(api_, rc, comm, what);
    if (post) {
      c10::StreamGuard on_stream(stream);
      post();
    }
    if (async) {
      for (const auto* list : {&hold, &outputs}) {
        for (const at::Tensor& t : *list) {
          if (t.defined() && t.device().is_cuda() && t.has_storage()) {
            impl.recordDataPtrOnStream(t.storage().data_ptr(), stream);
          }
        }
      }
    }
    std::unique_ptr<c10::Event> end = cuda_events_->get(dev.index());
    end->record(stream);
    return c10::make_intrusive<CudaWork>(type, what, api_, cuda_events_, std::move(end), stream, comm,
                                         std::move(hold), std::move(outputs));
  }

  // This backend's internal stream of `dev` (ProcessGroupNCCL's per-device NCCL stream),
  // one from torch's pool, kept.
  c10::Stream side_stream(const c10::impl::VirtualGuardImpl& impl, const c10::Device& dev) {
    for (auto& [index, s] : side_streams_) {
      if (index == dev.index()) return s;
    }
    c10::Stream s = impl.getStreamFromGlobalPool(dev, false);
    side_streams_.emplace_back(dev.index(), s);
    return s;
  }

  template <class... A>
  c10::intrusive_ptr<c10d::Work> delegate(const char* method, A&&... args) {
    py::gil_scoped_acquire g;
    py::object w = delegate_.attr(method)(std::forward<A>(args)...);
    return w.cast<c10::intrusive_ptr<c10d::Work>>();
  }

  const Api& api_;
  std::string lib_;
  py::object delegate_;
  std::shared_ptr<Events> events_;
  std::mutex calls_;
  std::shared_ptr<CudaEvents> cuda_events_;
  std::atomic<void*> cpu_{nullptr};
  std::atomic<void*> cuda_{nullptr};
  void* stream_ = nullptr;
  std::vector<std::pair<c10::DeviceIndex, c10::Stream>> side_streams_;
  bool coalescing_ = false;
  bool cuda_ok_ = true;
  std::atomic<bool> aborted_{false};
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "strata's torch.distributed backend in C++ (strata.torch builds and loads it)";
  m.def(
      "new_backend",
      [](py::object delegate, int rank, int size, const std::string& lib) -> c10::intrusive_ptr<c10d::Backend> {
        return c10::make_intrusive<StrataBackend>(std::move(delegate), rank, size, lib);
      },
      py::arg("delegate"), py::arg("rank"), py::arg("size"), py::arg("lib"));
  m.def("native_calls", [] { return native_calls.load(std::memory_order_relaxed); },
        "CPU calls the C++ backends of this process ran themselves (not through the delegate).");
  m.def("native_cuda_calls", [] { return native_cuda_calls.load(std::memory_order_relaxed); },
        "CUDA calls the C++ backends of this process ran themselves (not through the delegate).");
}
