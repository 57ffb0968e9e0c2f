// strata's torch.distributed backend (docs/python.md, "The C++ backend").
//
// One c10d::Backend and its c10d::Works over strata's C ABI, resolved with dlsym from
// the library the `strata` package loaded (its path comes from Python), with the types
// and constants of the generated header (include/strata.h), so the extension links to
// nothing of strata's and serves whatever library the package uses.
//
// Every call runs here. The common ones (all-reduce, all-gather, reduce-scatter in their
// tensor, list and coalesced forms, broadcast, equal all-to-all, barrier) are one strata
// call each (a group of them for a list). The rest (bool / complex / bitwise reductions,
// uneven all-to-all, gather, scatter, reduce, send / recv, non-contiguous tensors, the
// calls of a coalescing block) are turned into a plan by the Python half
// (`strata.torch.backend._Delegate`, under the GIL): strata calls in groups, the tensors
// to hold, a `post` step; the plan then runs here exactly as a common call does.
//
// Communicators: one per device (the group's mpi one, made with the group; one nccl /
// rccl one per GPU, made at its first call by the Python half through the group's own
// store), each a `Comm` counted by the backend and by every Work that uses it, destroyed
// with the last (the MPI world's is the Python package's, never destroyed here).
//
// Threads and locks: any call may come from any thread. A communicator is driven by one
// thread at a time (the C ABI's rule): its `calls` mutex, held only around strata calls,
// taken with the GIL released. The order is the GIL first, then strata's locks: no lock
// of this file is held while the GIL is taken (Python posts run after the calls' lock is
// released; a Work's state lock is never held across a post or a wait), and a thread
// holding the GIL never waits for a communicator's lock (`lock_holding_gil` tries it and
// lets the GIL go to wait).
//
// CPU (mpi): a blocking torch call (`asyncOp` false) runs at once on the calling thread;
// an async one is enqueued on the backend's strata host stream, its Work an event from a
// pool recorded after it (`wait()` synchronizes the event, `isCompleted()` queries it).
// CUDA: ProcessGroupNCCL's stream semantics (`issue_cuda`, `CudaWork`), through c10's
// device-generic streams and events, so this file needs no CUDA headers.
//
// Timeouts: `wait(timeout)` raises DistBackendError when the call has not finished by
// then; the group's timeout is enforced by a watchdog thread per backend (as
// ProcessGroupNCCL's), which aborts the communicator of a call that outlives it: the call
// fails here and on the peers, and its Work raises saying so. A failure at enqueue
// raises from the call itself.

#include <dlfcn.h>

// ATen and torch's pybind11 casters, not <torch/extension.h> (all of libtorch's C++ API,
// autograd, nn and optim): a third less compile time at install.
#include <ATen/ATen.h>
#include <ATen/Context.h>
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
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "strata.h"

namespace py = pybind11;

namespace {

using Clock = std::chrono::steady_clock;

// Calls this process's backends ran: common CPU, common CUDA, and from plans.
std::atomic<uint64_t> native_calls{0};
std::atomic<uint64_t> native_cuda_calls{0};
std::atomic<uint64_t> planned_calls{0};

// The C ABI functions this backend calls (their types from the header).
struct Api {
  decltype(&strataAllReduce) all_reduce;
  decltype(&strataAllGather) all_gather;
  decltype(&strataReduceScatter) reduce_scatter;
  decltype(&strataBroadcast) broadcast;
  decltype(&strataAllToAll) all_to_all;
  decltype(&strataSend) send;
  decltype(&strataRecv) recv;
  decltype(&strataGroupStart) group_start;
  decltype(&strataGroupEnd) group_end;
  decltype(&strataGetLastError) last_error;
  decltype(&strataGetErrorString) error_string;
  decltype(&strataStreamCreate) stream_create;
  decltype(&strataStreamDestroy) stream_destroy;
  decltype(&strataEventCreate) event_create;
  decltype(&strataEventDestroy) event_destroy;
  decltype(&strataEventRecord) event_record;
  decltype(&strataEventQuery) event_query;
  decltype(&strataEventSynchronize) event_sync;
  decltype(&strataCommGetAsyncError) async_error;
  decltype(&strataCommDestroy) comm_destroy;
  decltype(&strataCommAbort) comm_abort;
};

template <class F>
void resolve(void* lib, const char* name, const std::string& path, F& f) {
  void* p = dlsym(lib, name);
  TORCH_CHECK(p != nullptr, "strata backend: ", name, " not found in ", path);
  f = reinterpret_cast<F>(p);
}

std::atomic<const Api*> loaded_api{nullptr};

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
    resolve(lib, "strataSend", path, api.send);
    resolve(lib, "strataRecv", path, api.recv);
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
    resolve(lib, "strataCommDestroy", path, api.comm_destroy);
    resolve(lib, "strataCommAbort", path, api.comm_abort);
    loaded = path;
    loaded_api.store(&api, std::memory_order_release);
  });
  TORCH_CHECK(loaded == path, "strata backend: this process already uses ", loaded, ", not ", path);
  return api;
}

// The message of a failed call: strata's code and the communicator's last error.
std::string message(const Api& a, int rc, strataComm_t comm, const std::string& what) {
  std::string m = "strata backend: " + what + ": " + a.error_string(rc);
  const char* last = comm ? a.last_error(comm) : nullptr;
  if (last != nullptr && *last != '\0') {
    m += ": ";
    m += last;
  }
  return m;
}

[[noreturn]] void fail(const Api& a, int rc, strataComm_t comm, const std::string& what) {
  C10_THROW_ERROR(DistBackendError, message(a, rc, comm, what));
}

std::exception_ptr backend_error(const std::string& m) {
  return std::make_exception_ptr(
      c10::DistBackendError(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, m));
}

// strata's number for a dtype it reduces, -1 for others.
int reducible(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return strataFloat32;
    case at::kDouble: return strataFloat64;
    case at::kHalf: return strataFloat16;
    case at::kBFloat16: return strataBfloat16;
    case at::kChar: return strataInt8;
    case at::kByte: return strataUint8;
    case at::kInt: return strataInt32;
    case at::kLong: return strataInt64;
    case at::kUInt32: return strataUint32;
    case at::kUInt64: return strataUint64;
    default: return -1;
  }
}

// (strata op, premultiply factor; 0 for none) of a torch op strata reduces natively, or
// op -1 (the Python half plans it: BAND/BOR/BXOR, a tensor factor).
std::pair<int, double> native_op(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return {strataSum, 0.0};
    case c10d::ReduceOp::AVG: return {strataAvg, 0.0};
    case c10d::ReduceOp::MAX: return {strataMax, 0.0};
    case c10d::ReduceOp::MIN: return {strataMin, 0.0};
    case c10d::ReduceOp::PRODUCT: return {strataProd, 0.0};
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      if (s != nullptr && !s->tensor_factor.defined()) {
        return {strataSum, s->double_factor};
      }
      return {-1, 0.0};
    }
    default: return {-1, 0.0};
  }
}

// `opts.asyncOp` where this torch's options have it (recent torch), else true (every
// call async, as torch before it treated them).
template <class O>
auto async_of(const O& o, int) -> decltype(static_cast<bool>(o.asyncOp)) {
  return o.asyncOp;
}
template <class O>
bool async_of(const O&, long) {
  return true;
}
template <class O>
bool async_of(const O& o) {
  return async_of(o, 0);
}

// A dense tensor of a reducible kind (contiguous, strided, not complex or bool).
bool dense(const at::Tensor& t) {
  return t.is_contiguous() && t.layout() == at::kStrided && !t.is_complex() && t.scalar_type() != at::kBool;
}

// ---- the GIL ----

// Releases the GIL for the scope where the calling thread holds it (torch calls a
// backend with or without it, depending on the path); takes it back at the end, so it
// is declared before any lock of the scope (released after them).
struct NoGil {
  PyThreadState* state = PyGILState_Check() ? PyEval_SaveThread() : nullptr;
  NoGil() = default;
  NoGil(const NoGil&) = delete;
  NoGil& operator=(const NoGil&) = delete;
  ~NoGil() {
    if (state != nullptr) PyEval_RestoreThread(state);
  }
};

bool python_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// A Python object whose last reference may go on any thread: released under the GIL
// (leaked once the interpreter is going away).
using PyRef = std::shared_ptr<py::object>;
PyRef py_ref(py::object o) {
  return PyRef(new py::object(std::move(o)), [](py::object* p) {
    if (python_alive()) {
      py::gil_scoped_acquire g;
      delete p;
    } else {
      p->release();
      delete p;
    }
  });
}

// `m`, for a thread that holds the GIL: tried, and while another thread has it, waited
// for with the GIL let go, so no thread ever waits for a strata lock holding the GIL.
std::unique_lock<std::mutex> lock_holding_gil(std::mutex& m) {
  std::unique_lock<std::mutex> l(m, std::try_to_lock);
  while (!l.owns_lock()) {
    {
      py::gil_scoped_release r;
      std::lock_guard<std::mutex> w(m);
    }
    l.try_lock();
  }
  return l;
}

// ---- communicators ----

// A strata communicator shared by the backends and works that use it.
struct Comm {
  Comm(const Api& a, strataComm_t handle, bool own) : api(a), h(handle), owned(own) {}
  // Destroyed with its last user; left to the process's end once the interpreter is
  // going away (the package's exit hook may have finalized MPI by then).
  ~Comm() {
    if (owned.load() && !gone.exchange(true) && python_alive()) api.comm_destroy(h);
  }
  // strataCommAbort (any thread, also while a call is inside): its calls fail here
  // and on the peers; the handle is released.
  void abort() {
    if (!gone.exchange(true)) api.comm_abort(h);
  }
  bool failed() const {
    strataResult_t err = strataSuccess;
    return api.async_error(h, &err) != strataSuccess || err != strataSuccess;
  }

  const Api& api;
  const strataComm_t h;
  std::atomic<bool> owned;
  std::atomic<bool> gone{false};
  std::mutex calls;  // one thread at a time in strata calls on it
  // A blocking call inside (its deadline in steady-clock ticks; 0: none), and whether
  // the watchdog aborted the communicator for it.
  std::atomic<int64_t> blocking_until{0};
  std::atomic<bool> blocking_expired{false};
};

// One Comm per handle in the process, so every user of a communicator (backends, their
// works, the Python package's world operations) takes the same lock.
std::shared_ptr<Comm> comm_of(const Api& api, strataComm_t h, bool owned) {
  static std::mutex m;
  static std::unordered_map<strataComm_t, std::weak_ptr<Comm>> comms;
  std::lock_guard<std::mutex> g(m);
  std::weak_ptr<Comm>& w = comms[h];
  if (std::shared_ptr<Comm> c = w.lock()) {
    if (owned) c->owned.store(true);
    return c;
  }
  auto c = std::make_shared<Comm>(api, h, owned);
  w = c;
  return c;
}

// The Python package's hold on a communicator's lock (`with comm_lock(handle):`).
class CommLock {
 public:
  explicit CommLock(uintptr_t h) {
    const Api* api = loaded_api.load(std::memory_order_acquire);
    TORCH_CHECK(api != nullptr, "strata backend: comm_lock before the library was loaded");
    comm_ = comm_of(*api, reinterpret_cast<strataComm_t>(h), false);
  }
  void enter() {
    held_ = lock_holding_gil(comm_->calls);
  }
  void exit() {
    if (held_.owns_lock()) held_.unlock();
  }

 private:
  std::shared_ptr<Comm> comm_;
  std::unique_lock<std::mutex> held_;
};

// ---- completion and the watchdog ----

// A call the watchdog follows until it finishes, aborting its communicator past the
// deadline (the group's timeout from the call).
struct Tracked {
  Tracked(std::shared_ptr<Comm> c, Clock::time_point d) : comm(std::move(c)), deadline(d) {}
  virtual ~Tracked() = default;
  virtual bool finished() = 0;  // never blocks
  std::shared_ptr<Comm> comm;
  const Clock::time_point deadline;
  std::atomic<bool> expired{false};
};

// strata host events recorded after CPU calls, reused (an event is made once, not per
// call).
struct Events {
  explicit Events(const Api& a) : api(a) {}
  strataEvent_t get() {
    {
      std::lock_guard<std::mutex> g(m);
      if (!free.empty()) {
        strataEvent_t e = free.back();
        free.pop_back();
        return e;
      }
    }
    strataEvent_t e = nullptr;
    int rc = api.event_create(&e);
    if (rc != strataSuccess) fail(api, rc, nullptr, "strataEventCreate");
    return e;
  }
  void put(strataEvent_t e) {
    std::lock_guard<std::mutex> g(m);
    free.push_back(e);
  }
  ~Events() {
    for (strataEvent_t e : free) api.event_destroy(e);
  }
  const Api& api;
  std::mutex m;
  std::vector<strataEvent_t> free;
};

// An async CPU call: its event, owned until the last of its Work and the watchdog lets
// go (back to the pool if it was seen complete, else destroyed: it may still stand for
// the call).
struct CpuCall final : Tracked {
  CpuCall(std::shared_ptr<Comm> c, Clock::time_point d, std::shared_ptr<Events> p, strataEvent_t e)
      : Tracked(std::move(c), d), pool(std::move(p)), event(e) {}
  ~CpuCall() override {
    if (settled) {
      pool->put(event);
    } else {
      pool->api.event_destroy(event);
    }
  }
  int poll() {
    std::lock_guard<std::mutex> g(m);
    if (!settled) {
      int r = pool->api.event_query(event);
      if (r == strataInProgress) return r;
      settled = true;
      rc = r;
    }
    return rc;
  }
  int sync() {
    int r = pool->api.event_sync(event);
    std::lock_guard<std::mutex> g(m);
    if (!settled) {
      settled = true;
      rc = r;
    }
    return rc;
  }
  bool finished() override {
    return poll() != strataInProgress;
  }
  std::shared_ptr<Events> pool;
  const strataEvent_t event;
  std::mutex m;
  bool settled = false;
  int rc = strataSuccess;
};

// CUDA events (c10's device-generic Event), reused across calls (ProcessGroupNCCL's
// event cache): one made per call in flight, not per call.
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

// Whether `stream` (a cudaStream_t / hipStream_t) is being captured into a graph: the
// driver's cuStreamIsCapturing (HIP's hipStreamIsCapturing), from the libraries torch
// already loaded; false where neither is.
bool capturing(void* stream) {
  using Fn = int (*)(void*, int*);
  static const Fn fn = []() -> Fn {
    const std::pair<const char*, const char*> libs[] = {{"libcuda.so.1", "cuStreamIsCapturing"},
                                                        {"libamdhip64.so", "hipStreamIsCapturing"},
                                                        {"libamdhip64.so.6", "hipStreamIsCapturing"}};
    for (const auto& [lib, sym] : libs) {
      if (void* h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD)) {
        if (void* f = dlsym(h, sym)) return reinterpret_cast<Fn>(f);
      }
    }
    return nullptr;
  }();
  int status = 0;
  return fn != nullptr && fn(stream, &status) == 0 && status != 0;
}

// A CUDA call: its end event (back to the pool with the last holder), and whether it
// was recorded into a graph being captured (then never queried: its completion is the
// graph's).
struct CudaCall final : Tracked {
  CudaCall(std::shared_ptr<Comm> c, Clock::time_point d, std::shared_ptr<CudaEvents> p,
           std::unique_ptr<c10::Event> e, bool cap)
      : Tracked(std::move(c), d), pool(std::move(p)), end(std::move(e)), captured(cap) {}
  ~CudaCall() override {
    // Re-recording an event leaves earlier waits on it as they were.
    pool->put(std::move(end));
  }
  bool finished() override {
    if (captured || end->query()) return true;
    if (comm->failed()) {
      failed.store(true);
      return true;
    }
    return false;
  }
  std::shared_ptr<CudaEvents> pool;
  std::unique_ptr<c10::Event> end;
  const bool captured;
  std::atomic<bool> failed{false};
};

// One thread per backend (ProcessGroupNCCL's watchdog): every 100 ms it drops the calls
// that finished and aborts the communicator of any past its deadline, and `scan`s the
// backend's communicators for a blocking call past its deadline (a blocking call costs
// two atomic stores, no allocation).
class Watchdog {
 public:
  explicit Watchdog(std::function<void()> scan) : scan_(std::move(scan)) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void watch(std::shared_ptr<Tracked> t) {
    std::lock_guard<std::mutex> g(m_);
    q_.push_back(std::move(t));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  void start() {
    if (started_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> g(m_);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    started_.store(true, std::memory_order_release);
  }

 private:
  void run() {
    std::unique_lock<std::mutex> l(m_);
    while (!stop_) {
      cv_.wait_for(l, std::chrono::milliseconds(100));
      if (stop_) break;
      std::deque<std::shared_ptr<Tracked>> batch;
      batch.swap(q_);
      l.unlock();
      const Clock::time_point now = Clock::now();
      std::vector<std::shared_ptr<Tracked>> keep;
      for (auto& t : batch) {
        if (t->finished()) continue;
        if (now > t->deadline) {
          t->expired.store(true);
          t->comm->abort();
          continue;
        }
        keep.push_back(std::move(t));
      }
      batch.clear();
      scan_();
      l.lock();
      for (auto it = keep.rbegin(); it != keep.rend(); ++it) q_.push_front(std::move(*it));
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Tracked>> q_;
  std::thread thread_;
  std::atomic<bool> started_{false};
  bool stop_ = false;
  std::function<void()> scan_;
};

std::string timed_out(const std::string& what, int64_t ms) {
  return "strata backend: " + what + ": did not complete within the group's timeout of " + std::to_string(ms) +
         " ms: the watchdog aborted the communicator (the call failed here and on the peers)";
}

// ---- works ----

// A CPU call: complete when its event is (or at once, for a blocking call). The first
// to see it complete runs its `post` (copies out, under the GIL where it is Python's)
// with no lock held; others wait for that.
class StrataWork : public c10d::Work {
 public:
  StrataWork(c10d::OpType type, std::string what, std::shared_ptr<CpuCall> call, std::vector<at::Tensor> hold,
             std::vector<at::Tensor> outputs, std::function<void()> post, int64_t timeout_ms)
      : c10d::Work(-1, type),
        what_(std::move(what)),
        call_(std::move(call)),
        hold_(std::move(hold)),
        outputs_(std::move(outputs)),
        post_(std::move(post)),
        timeout_ms_(timeout_ms) {
    if (!call_) state_ = kDone;
  }

  bool isCompleted() override {
    {
      std::lock_guard<std::mutex> g(m_);
      if (state_ != kPending) return state_ == kDone;
    }
    int rc = call_->poll();
    if (rc == strataInProgress) return false;
    finish(rc);
    return true;
  }

  bool isSuccess() const override {
    std::lock_guard<std::mutex> g(m_);
    return state_ == kDone && !error_;
  }

  bool wait(std::chrono::milliseconds timeout) override {
    bool pending;
    {
      NoGil nogil;
      std::unique_lock<std::mutex> l(m_);
      cv_.wait(l, [&] { return state_ != kSettling; });
      pending = state_ == kPending;
    }
    if (pending) {
      int rc;
      {
        NoGil nogil;
        if (timeout == kNoTimeout) {
          rc = call_->sync();
        } else {
          const auto deadline = Clock::now() + timeout;
          while ((rc = call_->poll()) == strataInProgress) {
            if (Clock::now() > deadline) {
              C10_THROW_ERROR(DistBackendError, "strata backend: " + what_ + ": did not complete within the wait's timeout of " +
                                                    std::to_string(timeout.count()) + " ms (it is still running)");
            }
            std::this_thread::sleep_for(std::chrono::microseconds(50));
          }
        }
      }
      finish(rc);
    }
    std::lock_guard<std::mutex> g(m_);
    if (error_) std::rethrow_exception(error_);
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
  enum State { kPending, kSettling, kDone };

  // The call's outcome `rc`, once: the post run by the first to get here, outside m_.
  void finish(int rc) {
    {
      NoGil nogil;
      std::unique_lock<std::mutex> l(m_);
      if (state_ == kSettling) cv_.wait(l, [&] { return state_ == kDone; });
      if (state_ == kDone) return;
      state_ = kSettling;
    }
    std::exception_ptr err;
    if (rc != strataSuccess) {
      err = backend_error(call_->expired.load() ? timed_out(what_, timeout_ms_)
                                                : message(call_->pool->api, rc, call_->comm->h, what_));
    } else if (post_) {
      try {
        post_();
      } catch (...) {
        err = std::current_exception();
      }
    }
    std::function<void()> post;
    std::vector<at::Tensor> hold;
    {
      std::lock_guard<std::mutex> g(m_);
      error_ = err;
      post = std::move(post_);
      hold = std::move(hold_);
      state_ = kDone;
    }
    cv_.notify_all();
    // `post` and `hold` go here, no lock held (a Python post takes the GIL to go).
  }

  const std::string what_;
  std::shared_ptr<CpuCall> call_;
  std::vector<at::Tensor> hold_;
  std::vector<at::Tensor> outputs_;
  std::function<void()> post_;
  const int64_t timeout_ms_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  State state_ = kPending;
  std::exception_ptr error_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// A CUDA call, as ProcessGroupNCCL's work: an end event recorded on the call's stream
// after it (from the pool); `wait()` makes the current stream wait for it (the host
// blocks only for a finite timeout) and raises a failure seen for this call (its
// communicator failed once the event completed, or the watchdog saw it fail or time
// out); `isCompleted()` is the event (never queried for a call captured into a graph);
// `getFuture()` is made when asked, a Future of the call's device completed on the
// call's stream. The call's tensors are held until the work is dropped (and recorded on
// an internal stream by the caller).
class CudaWork : public c10d::Work {
 public:
  CudaWork(c10d::OpType type, std::string what, std::shared_ptr<CudaCall> call, c10::Stream stream,
           std::vector<at::Tensor> hold, std::vector<at::Tensor> outputs, int64_t timeout_ms)
      : c10d::Work(-1, type),
        what_(std::move(what)),
        call_(std::move(call)),
        stream_(stream),
        hold_(std::move(hold)),
        outputs_(std::move(outputs)),
        timeout_ms_(timeout_ms) {}

  bool isCompleted() override {
    if (call_->captured) return !capturing(stream_.native_handle());
    return failure() != nullptr || call_->end->query();
  }

  bool isSuccess() const override {
    if (call_->captured) return !capturing(stream_.native_handle());
    return call_->end->query() && failure() == nullptr;
  }

  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout != kNoTimeout && !call_->captured) {
      NoGil nogil;
      const auto deadline = Clock::now() + timeout;
      while (!call_->end->query() && failure() == nullptr) {
        if (Clock::now() > deadline) {
          C10_THROW_ERROR(DistBackendError, "strata backend: " + what_ + ": the CUDA call did not finish within the wait's timeout of " +
                                                std::to_string(timeout.count()) + " ms (it is still running)");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    if (std::exception_ptr e = failure()) std::rethrow_exception(e);
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    call_->end->block(impl.getStream(stream_.device()));
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
      if (std::exception_ptr e = failure()) {
        future_->setError(e);
      } else {
        future_->markCompleted(c10::IValue(outputs_));
      }
    }
    return future_;
  }

 private:
  // The failure of this call, once known: the watchdog's verdict (a timeout, a failed
  // communicator), or the communicator's failure once the call's event completed.
  std::exception_ptr failure() const {
    if (call_->expired.load()) return backend_error(timed_out(what_, timeout_ms_));
    if (call_->failed.load() || (!call_->captured && call_->end->query())) {
      strataResult_t err = strataSuccess;
      const Api& a = call_->comm->api;
      int rc = a.async_error(call_->comm->h, &err);
      if (rc != strataSuccess || err != strataSuccess) {
        return backend_error(message(a, rc != strataSuccess ? rc : err, call_->comm->h, what_));
      }
    }
    return nullptr;
  }

  const std::string what_;
  std::shared_ptr<CudaCall> call_;
  c10::Stream stream_;
  std::vector<at::Tensor> hold_;
  std::vector<at::Tensor> outputs_;
  const int64_t timeout_ms_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// ---- plans (the Python half's) ----

// One strata call of a plan (`strata.torch.backend._Recorder`'s tuple).
enum Kind : int { kAllReduce = 0, kAllGather, kReduceScatter, kBroadcast, kAllToAll, kSend, kRecv };
struct Op {
  int kind;
  uintptr_t send;
  uintptr_t recv;
  size_t count;
  int dtype;
  int op;
  int peer;
};

// A call as the Python half planned it: strata calls in groups, the tensors to hold
// and to return, a post step, the device's first tensor, asyncOp.
struct Plan {
  std::vector<std::vector<Op>> groups;
  std::vector<PyRef> posts;
  std::vector<at::Tensor> hold;
  std::vector<at::Tensor> outputs;
  at::Tensor first;
  bool async = true;

  // Under the GIL.
  static Plan from(const py::object& p) {
    Plan plan;
    auto t = p.cast<py::tuple>();
    for (py::handle g : t[0]) {
      std::vector<Op> ops;
      for (py::handle o : g) {
        auto x = o.cast<py::tuple>();
        ops.push_back(Op{x[0].cast<int>(), x[1].cast<uintptr_t>(), x[2].cast<uintptr_t>(), x[3].cast<size_t>(),
                         x[4].cast<int>(), x[5].cast<int>(), x[6].cast<int>()});
      }
      plan.groups.push_back(std::move(ops));
    }
    if (!t[1].is_none()) plan.posts.push_back(py_ref(py::reinterpret_borrow<py::object>(t[1])));
    plan.hold = t[2].cast<std::vector<at::Tensor>>();
    plan.outputs = t[3].cast<std::vector<at::Tensor>>();
    plan.first = t[4].cast<at::Tensor>();
    plan.async = t[5].cast<bool>();
    return plan;
  }

  // The posts as one step, run under the GIL (taken there: no lock is held by then).
  std::function<void()> post() const {
    if (posts.empty()) return nullptr;
    return [posts = posts]() {
      py::gil_scoped_acquire g;
      for (const PyRef& p : posts) (*p)();
    };
  }
};

class StrataBackend : public c10d::Backend {
 public:
  StrataBackend(py::object delegate, int rank, int size, const std::string& lib, uintptr_t cpu, bool cpu_owned,
                int64_t timeout_ms)
      : c10d::Backend(rank, size),
        api_(api_of(lib)),
        lib_(lib),
        delegate_(std::move(delegate)),
        timeout_ms_(timeout_ms > 0 ? timeout_ms : 30 * 60 * 1000) {
    events_ = std::make_shared<Events>(api_);
    cuda_events_ = std::make_shared<CudaEvents>();
    if (cpu != 0) cpu_ = comm_of(api_, reinterpret_cast<strataComm_t>(cpu), cpu_owned);
  }

  ~StrataBackend() override {
    if (stream_ != nullptr) api_.stream_destroy(stream_);
    if (python_alive()) {
      py::gil_scoped_acquire g;
      delegate_ = py::object();
    } else {
      delegate_.release();
    }
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
    if (!gather_pair(out, in)) return planned("all_gather_single", c10d::OpType::_ALLGATHER_BASE, out, in, opts);
    return issue("_allgather_base", c10d::OpType::_ALLGATHER_BASE, async_of(opts), in, {out, in}, {out}, nullptr,
                 [&](strataComm_t c, strataStream_t s) { return gather_call(out, in, c, s); });
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outs,
                                                                 std::vector<at::Tensor>& ins,
                                                                 const c10d::AllgatherOptions& opts) override {
    bool ok = !ins.empty() && outs.size() == ins.size();
    for (size_t i = 0; ok && i < ins.size(); ++i) ok = gather_pair(outs[i], ins[i]);
    if (!ok) return planned("all_gather_single_coalesced", c10d::OpType::COALESCED, outs, ins, opts);
    std::vector<at::Tensor> hold(outs);
    hold.insert(hold.end(), ins.begin(), ins.end());
    return issue("allgather_into_tensor_coalesced", c10d::OpType::COALESCED, async_of(opts), ins[0], std::move(hold),
                 outs, nullptr, [&](strataComm_t c, strataStream_t s) {
                   for (size_t i = 0; i < ins.size(); ++i) {
                     int rc = gather_call(outs[i], ins[i], c, s);
                     if (rc != strataSuccess) return rc;
                   }
                   return static_cast<int>(strataSuccess);
                 }, ins.size() > 1);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                                           const c10d::AllgatherOptions& opts) override {
    bool ok = ins.size() == 1 && outs.size() == 1 && static_cast<int>(outs[0].size()) == size_ && !coalescing_here() &&
              here(ins[0]) && dense(ins[0]);
    for (size_t i = 0; ok && i < outs[0].size(); ++i) {
      ok = outs[0][i].device() == ins[0].device() && outs[0][i].numel() == ins[0].numel() &&
           outs[0][i].scalar_type() == ins[0].scalar_type();
    }
    if (!ok) return planned("allgather", c10d::OpType::ALLGATHER, outs, ins, opts);
    // Into one flat tensor, then copied out to the list (torch's list form).
    at::Tensor flat = at::empty({static_cast<int64_t>(size_) * ins[0].numel()}, ins[0].options());
    at::Tensor in = ins[0];
    std::vector<at::Tensor> list = outs[0];
    auto post = [flat, list, n = in.numel()]() mutable {
      for (size_t r = 0; r < list.size(); ++r) {
        list[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view(list[r].sizes()));
      }
    };
    return issue("allgather", c10d::OpType::ALLGATHER, async_of(opts), in, {flat, in}, list, post,
                 [&](strataComm_t c, strataStream_t s) { return gather_call(flat, in, c, s); });
  }

  // -- reduce-scatter --
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                      const c10d::ReduceScatterOptions& opts) override {
    auto [op, factor] = native_op(opts.reduceOp);
    if (op < 0 || !scatter_pair(out, in)) {
      return planned("reduce_scatter_single", c10d::OpType::_REDUCE_SCATTER_BASE, out, in, opts);
    }
    at::Tensor src = factor != 0.0 ? in * factor : in;
    return issue("_reduce_scatter_base", c10d::OpType::_REDUCE_SCATTER_BASE, async_of(opts), in, {out, src}, {out},
                 nullptr, [&, op = op](strataComm_t c, strataStream_t s) { return scatter_call(out, src, op, c, s); });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outs,
                                                                 std::vector<at::Tensor>& ins,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    auto [op, factor] = native_op(opts.reduceOp);
    bool ok = op >= 0 && !ins.empty() && outs.size() == ins.size();
    for (size_t i = 0; ok && i < ins.size(); ++i) ok = scatter_pair(outs[i], ins[i]);
    if (!ok) return planned("reduce_scatter_single_coalesced", c10d::OpType::COALESCED, outs, ins, opts);
    std::vector<at::Tensor> srcs;
    for (auto& t : ins) srcs.push_back(factor != 0.0 ? t * factor : t);
    std::vector<at::Tensor> hold(outs);
    hold.insert(hold.end(), srcs.begin(), srcs.end());
    return issue("reduce_scatter_tensor_coalesced", c10d::OpType::COALESCED, async_of(opts), ins[0], std::move(hold),
                 outs, nullptr, [&, op = op](strataComm_t c, strataStream_t s) {
                   for (size_t i = 0; i < srcs.size(); ++i) {
                     int rc = scatter_call(outs[i], srcs[i], op, c, s);
                     if (rc != strataSuccess) return rc;
                   }
                   return static_cast<int>(strataSuccess);
                 }, ins.size() > 1);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outs,
                                                std::vector<std::vector<at::Tensor>>& ins,
                                                const c10d::ReduceScatterOptions& opts) override {
    auto [op, factor] = native_op(opts.reduceOp);
    bool ok = op >= 0 && outs.size() == 1 && ins.size() == 1 && static_cast<int>(ins[0].size()) == size_ &&
              !coalescing_here() && here(outs[0]) && dense(outs[0]) && reducible(outs[0].scalar_type()) >= 0;
    for (size_t i = 0; ok && i < ins[0].size(); ++i) {
      ok = ins[0][i].device() == outs[0].device() && ins[0][i].numel() == outs[0].numel() &&
           ins[0][i].scalar_type() == outs[0].scalar_type();
    }
    if (!ok) return planned("reduce_scatter", c10d::OpType::REDUCE_SCATTER, outs, ins, opts);
    // The list as one flat input (torch's list form), premultiplied where asked.
    std::vector<at::Tensor> flat_parts;
    for (auto& t : ins[0]) flat_parts.push_back(t.reshape({-1}));
    at::Tensor src = at::cat(flat_parts);
    if (factor != 0.0) src.mul_(factor);
    at::Tensor out = outs[0];
    return issue("reduce_scatter", c10d::OpType::REDUCE_SCATTER, async_of(opts), out, {out, src}, {out}, nullptr,
                 [&, op = op](strataComm_t c, strataStream_t s) { return scatter_call(out, src, op, c, s); });
  }

  // -- broadcast, all-to-all, barrier --
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    bool ok = tensors.size() == 1 && opts.rootTensor == 0 && !coalescing_here() && here(tensors[0]) &&
              tensors[0].is_contiguous() && tensors[0].layout() == at::kStrided;
    if (!ok) return planned("broadcast", c10d::OpType::BROADCAST, tensors, opts);
    at::Tensor t = tensors[0];
    int root = static_cast<int>(opts.rootRank);
    return issue("broadcast", c10d::OpType::BROADCAST, async_of(opts), t, {t}, {t}, nullptr,
                 [&](strataComm_t c, strataStream_t s) {
                   void* p = t.data_ptr();
                   return api_.broadcast(p, p, t.numel() * t.element_size(), strataUint8, root, c, s);
                 });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits,
                                               const c10d::AllToAllOptions& opts) override {
    bool ok = out_splits.empty() && in_splits.empty() && !coalescing_here() && here(in) &&
              out.device() == in.device() && in.is_contiguous() && out.is_contiguous() && in.numel() == out.numel() &&
              in.scalar_type() == out.scalar_type() && in.numel() % size_ == 0;
    if (!ok) return planned("all_to_all_single", c10d::OpType::ALLTOALL_BASE, out, in, out_splits, in_splits, opts);
    return issue("alltoall_base", c10d::OpType::ALLTOALL_BASE, async_of(opts), in, {out, in}, {out}, nullptr,
                 [&](strataComm_t c, strataStream_t s) {
                   size_t bytes = static_cast<size_t>(in.numel() / size_) * in.element_size();
                   return api_.all_to_all(in.data_ptr(), out.data_ptr(), bytes, strataUint8, c, s);
                 });
  }

  // A one-element all-reduce, blocking: on the GPU of `device_ids`, else on the CPU
  // when the group has an mpi communicator, else on a GPU it has a communicator of, else
  // on the current GPU; the host waits for it on a GPU too, as NCCL's barrier does.
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    c10::Device dev(c10::DeviceType::CPU);
    if (!opts.device_ids.empty()) {
      dev = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(opts.device_ids[0]));
    } else if (!cpu_) {
      c10::DeviceIndex index = -1;
      {
        std::lock_guard<std::mutex> g(gpus_m_);
        if (!gpus_.empty()) index = gpus_.front().first;
      }
      if (index < 0 && at::hasCUDA()) index = c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getDevice().index();
      if (index >= 0) dev = c10::Device(c10::DeviceType::CUDA, index);
    }
    at::Tensor one = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(dev));
    auto work = issue("barrier", c10d::OpType::BARRIER, false, one, {one}, {}, nullptr,
                      [&](strataComm_t c, strataStream_t s) {
                        return api_.all_reduce(one.data_ptr(), one.data_ptr(), 1, strataInt32, strataMax, c, s);
                      });
    if (dev.is_cuda()) {
      NoGil nogil;
      c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getStream(dev).synchronize();
    }
    return work;
  }

  // -- planned by the Python half --
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    return planned("reduce", c10d::OpType::REDUCE, tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                                        const c10d::GatherOptions& opts) override {
    return planned("gather", c10d::OpType::GATHER, outs, ins, opts);
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outs, std::vector<std::vector<at::Tensor>>& ins,
                                         const c10d::ScatterOptions& opts) override {
    return planned("scatter", c10d::OpType::SCATTER, outs, ins, opts);
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                                          const c10d::AllToAllOptions& opts) override {
    return planned("alltoall", c10d::OpType::ALLTOALL, outs, ins, opts);
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return planned("send", c10d::OpType::SEND, tensors, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return planned("recv", c10d::OpType::RECV, tensors, src, tag);
  }

  // A coalescing block (torch's coalescing manager, batch_isend_irecv): the calls this
  // thread makes until endCoalescing are planned, and run as one strata group there.
  void startCoalescing() override {
    std::lock_guard<std::mutex> g(block_m_);
    if (block_depth_ > 0 && block_thread_ != std::this_thread::get_id()) {
      C10_THROW_ERROR(DistBackendError, "strata backend: startCoalescing: another thread's block is open on this group");
    }
    if (block_depth_++ == 0) {
      block_thread_ = std::this_thread::get_id();
      block_ = Plan{};
      block_open_.store(true, std::memory_order_release);
    }
  }

  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    Plan b;
    {
      std::lock_guard<std::mutex> g(block_m_);
      if (block_depth_ == 0 || block_thread_ != std::this_thread::get_id()) {
        C10_THROW_ERROR(DistBackendError, "strata backend: endCoalescing: no block of this thread is open");
      }
      if (--block_depth_ > 0) return done_work(c10d::OpType::COALESCED, {});
      block_open_.store(false, std::memory_order_release);
      b = std::move(block_);
    }
    if (b.groups.empty()) return done_work(c10d::OpType::COALESCED, {});
    // The block as one group, run now: on CPU complete before returning (code written
    // for NCCL's stream order reads a block's outputs without waiting on its work), on
    // a GPU on the current stream.
    std::vector<Op> all;
    for (auto& g : b.groups) all.insert(all.end(), g.begin(), g.end());
    b.groups = {std::move(all)};
    return issue("coalesced", c10d::OpType::COALESCED, false, b.first, std::move(b.hold), std::move(b.outputs),
                 b.post(), [&](strataComm_t c, strataStream_t s) { return run_plan(b.groups, c, s); }, false, false);
  }

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11)
  // torch.distributed.shrink_group (torch 2.11 and 2.15 have it): the survivors' backend,
  // its communicators shrunk by the Python half (Comm.shrink), the excluded ranks not
  // calling.
  bool supportsShrinking() const override {
    return true;
  }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                           const c10::intrusive_ptr<Options>& /*opts_override*/) override {
    py::gil_scoped_acquire g;
    py::dict gpus;
    for (const auto& [index, c] : gpu_comms()) gpus[py::int_(index)] = reinterpret_cast<uintptr_t>(c->h);
    uintptr_t cpu = cpu_ ? reinterpret_cast<uintptr_t>(cpu_->h) : 0;
    py::tuple r = delegate_.attr("_shrunk")(ranks_to_exclude, shrink_flags, cpu, gpus);
    auto b = c10::make_intrusive<StrataBackend>(r[0].cast<py::object>(), r[1].cast<int>(), r[2].cast<int>(), lib_,
                                                r[3].cast<uintptr_t>(), true, timeout_ms_);
    for (auto item : r[4].cast<py::dict>()) {
      b->gpus_.emplace_back(item.first.cast<c10::DeviceIndex>(),
                            comm_of(api_, reinterpret_cast<strataComm_t>(item.second.cast<uintptr_t>()), true));
    }
    return b;
  }
#endif

  // Release this group's communicators (each goes with its last Work).
  void shutdown() override {
    {
      std::lock_guard<std::mutex> g(gpus_m_);
      cpu_.reset();
      gpus_.clear();
    }
    py::gil_scoped_acquire g;
    delegate_.attr("shutdown")();
  }

  // ProcessGroup.abort() (and torch's _abort_process_group): the group's communicators
  // aborted (strataCommAbort: the calls in flight fail, here and on the peers), and every
  // later call raises, as ProcessGroupNCCL's after an abort.
  void abort() override {
    aborted_.store(true, std::memory_order_release);
    if (cpu_) cpu_->abort();
    for (const auto& [index, c] : gpu_comms()) c->abort();
    py::gil_scoped_acquire g;
    delegate_.attr("_abort")();
  }

 private:
  using Comms = std::vector<std::pair<c10::DeviceIndex, std::shared_ptr<Comm>>>;

  // A tensor on a device this backend serves itself: CPU (mpi) and CUDA (nccl / rccl).
  static bool here(const at::Tensor& t) {
    return t.device().is_cpu() || t.device().is_cuda();
  }

  // True while this thread has a coalescing block open on this backend.
  bool coalescing_here() {
    if (!block_open_.load(std::memory_order_acquire)) return false;
    std::lock_guard<std::mutex> g(block_m_);
    return block_depth_ > 0 && block_thread_ == std::this_thread::get_id();
  }

  bool gather_pair(const at::Tensor& out, const at::Tensor& in) {
    return !coalescing_here() && here(in) && out.device() == in.device() && in.is_contiguous() &&
           out.is_contiguous() && in.layout() == at::kStrided && out.layout() == at::kStrided &&
           in.scalar_type() == out.scalar_type() && out.numel() == in.numel() * size_;
  }

  bool scatter_pair(const at::Tensor& out, const at::Tensor& in) {
    return !coalescing_here() && here(in) && out.device() == in.device() && dense(out) && dense(in) &&
           reducible(in.scalar_type()) >= 0 && in.scalar_type() == out.scalar_type() &&
           in.numel() == out.numel() * size_;
  }

  // All-gather of `in` into `out`, as bytes (any dtype).
  int gather_call(const at::Tensor& out, const at::Tensor& in, strataComm_t c, strataStream_t s) {
    return api_.all_gather(in.data_ptr(), out.data_ptr(), in.numel() * in.element_size(), strataUint8, c, s);
  }

  int scatter_call(const at::Tensor& out, const at::Tensor& in, int op, strataComm_t c, strataStream_t s) {
    return api_.reduce_scatter(in.data_ptr(), out.data_ptr(), out.numel(), reducible(in.scalar_type()), op, c, s);
  }

  template <class Opts>
  c10::intrusive_ptr<c10d::Work> allreduce_list(const char* method, std::vector<at::Tensor>& tensors,
                                                const Opts& opts, c10d::OpType type) {
    auto [op, factor] = native_op(opts.reduceOp);
    bool ok = op >= 0 && !tensors.empty() && !coalescing_here();
    for (auto& t : tensors) {
      ok = ok && here(t) && t.device() == tensors[0].device() && dense(t) && reducible(t.scalar_type()) >= 0;
    }
    if (!ok) return planned(method, type, tensors, opts);
    if (factor != 0.0) {
      for (auto& t : tensors) t.mul_(factor);
    }
    return issue(method, type, async_of(opts), tensors[0], tensors, tensors, nullptr,
                 [&, op = op](strataComm_t c, strataStream_t s) {
                   for (auto& t : tensors) {
                     int rc = api_.all_reduce(t.data_ptr(), t.data_ptr(), t.numel(), reducible(t.scalar_type()), op,
                                              c, s);
                     if (rc != strataSuccess) return rc;
                   }
                   return static_cast<int>(strataSuccess);
                 }, tensors.size() > 1);
  }

  void check_alive(const char* what) const {
    if (aborted_.load(std::memory_order_acquire)) {
      C10_THROW_ERROR(DistBackendError, std::string("strata backend: ") + what + ": the group was aborted");
    }
  }

  Comms gpu_comms() {
    std::lock_guard<std::mutex> g(gpus_m_);
    return gpus_;
  }

  // The group's communicator of GPU `index`: made at its first call by the Python half
  // (the GIL taken with no lock of this file held; the Python half serializes the
  // making and keys it in the group's store).
  std::shared_ptr<Comm> gpu_comm(c10::DeviceIndex index) {
    {
      std::lock_guard<std::mutex> g(gpus_m_);
      for (const auto& [i, c] : gpus_) {
        if (i == index) return c;
      }
    }
    uintptr_t h;
    {
      py::gil_scoped_acquire g;
      h = delegate_.attr("_gpu_handle")(index).cast<uintptr_t>();
    }
    std::shared_ptr<Comm> c = comm_of(api_, reinterpret_cast<strataComm_t>(h), true);
    std::lock_guard<std::mutex> g(gpus_m_);
    for (const auto& [i, have] : gpus_) {
      if (i == index) return have;
    }
    gpus_.emplace_back(index, c);
    return c;
  }

  std::shared_ptr<Comm> cpu_comm(const char* what) {
    if (!cpu_) {
      C10_THROW_ERROR(DistBackendError, std::string("strata backend: ") + what +
                                            ": CPU tensors run on the mpi transport: launch with mpirun "
                                            "-np <ranks> python <script>, or give CPU tensors to gloo: "
                                            "backend=\"cpu:gloo,cuda:strata\" "
                                            "(OMPI_COMM_WORLD_RANK was not set when the group was made)");
    }
    return cpu_;
  }

  // `call(comm, stream)`, inside one strata group when `grouped`; the first failure.
  template <class F>
  int run_calls(F& call, strataComm_t comm, strataStream_t stream, bool grouped) {
    if (!grouped) return call(comm, stream);
    int rc = api_.group_start();
    int body = rc == strataSuccess ? call(comm, stream) : rc;
    int end = rc == strataSuccess ? api_.group_end() : rc;
    return body != strataSuccess ? body : end;
  }

  int run_op(const Op& o, strataComm_t c, strataStream_t s) {
    auto* send = reinterpret_cast<void*>(o.send);
    auto* recv = reinterpret_cast<void*>(o.recv);
    switch (o.kind) {
      case kAllReduce: return api_.all_reduce(send, recv, o.count, o.dtype, o.op, c, s);
      case kAllGather: return api_.all_gather(send, recv, o.count, o.dtype, c, s);
      case kReduceScatter: return api_.reduce_scatter(send, recv, o.count, o.dtype, o.op, c, s);
      case kBroadcast: return api_.broadcast(send, recv, o.count, o.dtype, o.peer, c, s);
      case kAllToAll: return api_.all_to_all(send, recv, o.count, o.dtype, c, s);
      case kSend: return api_.send(send, o.count, o.dtype, o.peer, c, s);
      case kRecv: return api_.recv(recv, o.count, o.dtype, o.peer, c, s);
      default: return strataInternalError;
    }
  }

  // A plan's groups in order, each a strata group (a lone call alone); the first failure.
  int run_plan(const std::vector<std::vector<Op>>& groups, strataComm_t c, strataStream_t s) {
    for (const auto& g : groups) {
      const bool grouped = g.size() > 1;
      int rc = grouped ? api_.group_start() : strataSuccess;
      for (size_t i = 0; rc == strataSuccess && i < g.size(); ++i) rc = run_op(g[i], c, s);
      if (grouped) {
        int end = api_.group_end();
        if (rc == strataSuccess) rc = end;
      }
      if (rc != strataSuccess) return rc;
    }
    return strataSuccess;
  }

  // A call the Python half plans (`_Delegate.<method>`, under the GIL), then run here
  // as a common one; inside a coalescing block, added to the block.
  template <class... A>
  c10::intrusive_ptr<c10d::Work> planned(const char* method, c10d::OpType type, A&&... args) {
    check_alive(method);
    Plan plan;
    {
      py::gil_scoped_acquire g;
      plan = Plan::from(delegate_.attr(method)(std::forward<A>(args)...));
    }
    planned_calls.fetch_add(1, std::memory_order_relaxed);
    if (coalescing_here()) {
      std::vector<at::Tensor> outputs = plan.outputs;
      std::lock_guard<std::mutex> g(block_m_);
      if (block_.first.defined() && block_.first.device() != plan.first.device()) {
        C10_THROW_ERROR(DistBackendError, std::string("strata backend: ") + method +
                                              ": a coalescing block's calls must be on one device");
      }
      if (!block_.first.defined()) block_.first = plan.first;
      for (auto& grp : plan.groups) block_.groups.push_back(std::move(grp));
      block_.posts.insert(block_.posts.end(), plan.posts.begin(), plan.posts.end());
      block_.hold.insert(block_.hold.end(), plan.hold.begin(), plan.hold.end());
      block_.outputs.insert(block_.outputs.end(), plan.outputs.begin(), plan.outputs.end());
      return done_work(type, std::move(outputs));
    }
    return issue(method, type, plan.async, plan.first, std::move(plan.hold), std::move(plan.outputs), plan.post(),
                 [&](strataComm_t c, strataStream_t s) { return run_plan(plan.groups, c, s); }, false, false);
  }

  c10::intrusive_ptr<c10d::Work> done_work(c10d::OpType type, std::vector<at::Tensor> outputs) {
    return c10::make_intrusive<StrataWork>(type, "", nullptr, std::vector<at::Tensor>{}, std::move(outputs), nullptr,
                                           timeout_ms_);
  }

  Clock::time_point deadline() const {
    return Clock::now() + std::chrono::milliseconds(timeout_ms_);
  }

  // Run `call(comm, stream)` (a group of calls when `grouped`): a CUDA tensor's call as
  // ProcessGroupNCCL's (`issue_cuda`); on CPU at once where the torch call blocks, else
  // on the backend's host stream with an event recorded after it. A failure to enqueue
  // raises here.
  template <class F>
  c10::intrusive_ptr<c10d::Work> issue(const char* what, c10d::OpType type, bool async, const at::Tensor& first,
                                       std::vector<at::Tensor> hold, std::vector<at::Tensor> outputs,
                                       std::function<void()> post, F&& call, bool grouped = false,
                                       bool native = true) {
    check_alive(what);
    if (first.device().is_cuda()) {
      return issue_cuda(what, type, async, first, std::move(hold), std::move(outputs), std::move(post), call,
                        grouped, native);
    }
    if (!first.device().is_cpu()) {
      C10_THROW_ERROR(DistBackendError, std::string("strata backend: ") + what + ": tensors on " +
                                            first.device().str() + " (cpu: mpi transport, cuda: nccl / rccl)");
    }
    std::shared_ptr<Comm> comm = cpu_comm(what);
    if (native) native_calls.fetch_add(1, std::memory_order_relaxed);
    if (!async) {
      watchdog_.start();
      int rc;
      {
        NoGil nogil;
        std::lock_guard<std::mutex> serial(comm->calls);
        comm->blocking_until.store(deadline().time_since_epoch().count(), std::memory_order_relaxed);
        rc = run_calls(call, comm->h, nullptr, grouped);
        comm->blocking_until.store(0, std::memory_order_relaxed);
      }
      if (rc != strataSuccess) {
        if (comm->blocking_expired.load()) C10_THROW_ERROR(DistBackendError, timed_out(what, timeout_ms_));
        fail(api_, rc, comm->h, what);
      }
      if (post) post();
      return done_work(type, std::move(outputs));
    }
    strataEvent_t event = events_->get();
    int rc = strataSuccess;
    {
      NoGil nogil;
      std::lock_guard<std::mutex> serial(comm->calls);
      if (stream_ == nullptr) rc = api_.stream_create(&stream_);
      if (rc == strataSuccess) rc = run_calls(call, comm->h, stream_, grouped);
      if (rc == strataSuccess) rc = api_.event_record(event, stream_);
    }
    if (rc != strataSuccess) {
      events_->put(event);
      fail(api_, rc, comm->h, what);
    }
    auto c = std::make_shared<CpuCall>(std::move(comm), deadline(), events_, event);
    watchdog_.watch(c);
    return c10::make_intrusive<StrataWork>(type, what, std::move(c), std::move(hold), std::move(outputs),
                                           std::move(post), timeout_ms_);
  }

  // A CUDA call, with ProcessGroupNCCL's stream semantics: a blocking torch call
  // (`async` false) is enqueued on the current stream; an async one on this backend's
  // internal stream of the device, which first waits for the current one (an event
  // from the pool), its tensors recorded on that stream for the caching allocator. The
  // strata call is stream-ordered (the C ABI's rule on nccl) and returns without
  // waiting for the GPU; `post` (copies out) follows it on the same stream; the Work is
  // an end event recorded there ([`CudaWork`]). Stream entries per call: the call's own,
  // the end event, and for an async call the wait's two.
  template <class F>
  c10::intrusive_ptr<c10d::Work> issue_cuda(const char* what, c10d::OpType type, bool async, const at::Tensor& first,
                                            std::vector<at::Tensor> hold, std::vector<at::Tensor> outputs,
                                            std::function<void()> post, F& call, bool grouped, bool native) {
    const c10::Device dev = first.device();
    std::shared_ptr<Comm> comm = gpu_comm(dev.index());
    if (native) native_cuda_calls.fetch_add(1, std::memory_order_relaxed);
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
    const bool captured = capturing(stream.native_handle());
    int rc;
    {
      NoGil nogil;
      std::lock_guard<std::mutex> serial(comm->calls);
      rc = run_calls(call, comm->h, stream.native_handle(), grouped);
    }
    if (rc != strataSuccess) fail(api_, rc, comm->h, what);
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
    auto c = std::make_shared<CudaCall>(std::move(comm), deadline(), cuda_events_, std::move(end), captured);
    if (!captured) watchdog_.watch(c);
    return c10::make_intrusive<CudaWork>(type, what, std::move(c), stream, std::move(hold), std::move(outputs),
                                         timeout_ms_);
  }

  // This backend's internal stream of `dev` (ProcessGroupNCCL's per-device NCCL stream),
  // one from torch's pool, kept.
  c10::Stream side_stream(const c10::impl::VirtualGuardImpl& impl, const c10::Device& dev) {
    std::lock_guard<std::mutex> g(side_m_);
    for (auto& [index, s] : side_streams_) {
      if (index == dev.index()) return s;
    }
    c10::Stream s = impl.getStreamFromGlobalPool(dev, false);
    side_streams_.emplace_back(dev.index(), s);
    return s;
  }

  const Api& api_;
  std::string lib_;
  py::object delegate_;
  const int64_t timeout_ms_;
  std::shared_ptr<Events> events_;
  std::shared_ptr<CudaEvents> cuda_events_;
  std::shared_ptr<Comm> cpu_;  // reset (shutdown) and read by the watchdog under gpus_m_
  std::mutex gpus_m_;
  Comms gpus_;
  strataStream_t stream_ = nullptr;  // the host stream, under cpu_'s calls lock
  std::mutex side_m_;
  std::vector<std::pair<c10::DeviceIndex, c10::Stream>> side_streams_;
  std::mutex block_m_;
  std::atomic<bool> block_open_{false};
  int block_depth_ = 0;
  std::thread::id block_thread_;
  Plan block_;
  std::atomic<bool> aborted_{false};
  // Last: stopped first, while the rest is alive. Its scan: a blocking call past its
  // deadline aborts its communicator.
  Watchdog watchdog_{[this] {
    const int64_t now = Clock::now().time_since_epoch().count();
    Comms all;
    {
      std::lock_guard<std::mutex> g(gpus_m_);
      all = gpus_;
      if (cpu_) all.emplace_back(-1, cpu_);
    }
    for (const auto& [index, c] : all) {
      int64_t until = c->blocking_until.load(std::memory_order_relaxed);
      if (until != 0 && now > until && !c->blocking_expired.exchange(true)) c->abort();
    }
  }};
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "strata's torch.distributed backend in C++ (strata.torch builds and loads it)";
  m.def(
      "load", [](const std::string& lib) { api_of(lib); }, py::arg("lib"),
      "Resolve the C ABI of the library at `lib` (the package's), once per process.");
  m.def(
      "new_backend",
      [](py::object delegate, int rank, int size, const std::string& lib, uintptr_t cpu, bool cpu_owned,
         int64_t timeout_ms) -> c10::intrusive_ptr<c10d::Backend> {
        return c10::make_intrusive<StrataBackend>(std::move(delegate), rank, size, lib, cpu, cpu_owned, timeout_ms);
      },
      py::arg("delegate"), py::arg("rank"), py::arg("size"), py::arg("lib"), py::arg("cpu"), py::arg("cpu_owned"),
      py::arg("timeout_ms"));
  py::class_<CommLock>(m, "CommLock")
      .def("__enter__", [](CommLock& l) { l.enter(); })
      .def("__exit__", [](CommLock& l, py::args) { l.exit(); });
  m.def(
      "comm_lock", [](uintptr_t h) { return std::make_unique<CommLock>(h); }, py::arg("handle"),
      "The lock of communicator `handle` that the backends' calls on it take (`with comm_lock(h):`).");
  m.def("native_calls", [] { return native_calls.load(std::memory_order_relaxed); },
        "Common CPU calls the C++ backends of this process ran.");
  m.def("native_cuda_calls", [] { return native_cuda_calls.load(std::memory_order_relaxed); },
        "Common CUDA calls the C++ backends of this process ran.");
  m.def("planned_calls", [] { return planned_calls.load(std::memory_order_relaxed); },
        "Calls the C++ backends of this process ran from their Python half's plans.");
}
