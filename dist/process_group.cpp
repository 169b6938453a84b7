// The process group: one MPI backend for CPU tensors (and the bootstrap), an
// NCCL backend for CUDA tensors when built with it; validation, the descriptor
// check across ranks, the mean, and the timeout (dist/dist.h explains each).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <thread>

#include "autograd/grad_mode.h"
#include "autograd/dropout_share.h"
#include "autograd/ops/elementwise.h"
#include "core/cuda.h"
#include "dist/backend.h"

namespace cf {
namespace dist {

using detail::Backend;
using detail::Request;

namespace {

// Bounds the blocking calls: a thread that, when a call it was told about
// outlives the timeout, prints the error and ends this process (mpirun then
// ends the job). A blocking MPI call cannot be interrupted, and the process
// group is unusable after such a timeout anyway (PyTorch's NCCL watchdog
// does the same).
std::string timeout_message(const char* op, const Tensor* t);

class Watchdog {
 public:
  Watchdog() : thread_([this] { run(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Two atomic stores per call (no lock, no wake-up: small collectives take a
  // microsecond); the thread looks every 50 ms, so it fires within 50 ms of the
  // deadline. `t` (the tensor, for the message; may be null) must outlive the call.
  // `problem` (may be null): this rank's own failed check, waiting to be told to the others; it must
  // outlive the call too.
  void arm(const char* op, const Tensor* t, double timeout_s, const std::string* problem = nullptr) {
    op_.store(op, std::memory_order_relaxed);
    what_.store(t, std::memory_order_relaxed);
    problem_.store(problem, std::memory_order_relaxed);
    timeout_ns_.store(int64_t(timeout_s * 1e9), std::memory_order_relaxed);
    since_ns_.store(now_ns(), std::memory_order_release);
  }
  void disarm() { since_ns_.store(0, std::memory_order_release); }

 private:
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void run() {
    std::unique_lock<std::mutex> l(m_);
    while (!cv_.wait_for(l, std::chrono::milliseconds(50), [&] { return stop_; })) {
      const int64_t since = since_ns_.load(std::memory_order_acquire);
      if (since == 0 || now_ns() - since <= timeout_ns_.load(std::memory_order_relaxed)) continue;
      std::string msg = timeout_message(op_.load(std::memory_order_relaxed), what_.load(std::memory_order_relaxed));
      if (const std::string* p = problem_.load(std::memory_order_relaxed))
        msg += "this rank's own call had failed its checks (" + *p + "); ";
      msg += "ending this process (mpirun then stops the job); restart from the last checkpoint";
      std::fprintf(stderr, "%s\n", msg.c_str());
      std::fflush(stderr);
      std::_Exit(kTimeoutExitCode);
    }
  }
  std::atomic<const std::string*> problem_{nullptr};
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<int64_t> since_ns_{0}, timeout_ns_{0};
  std::atomic<const char*> op_{""};
  std::atomic<const Tensor*> what_{nullptr};
  std::thread thread_;

 public:
  static constexpr int kTimeoutExitCode = 124;  // timeout(1)'s status
};

struct Group {
  bool initialized = false;
  bool owns_mpi = false;
  bool broken = false;  // a collective timed out: the ranks are out of step for good
  std::string broken_by;
  int rank = 0;
  int world = 1;
  double timeout = 300;
  bool check = true;
  std::unique_ptr<Backend> cpu;   // mpi, or null for backend "none"
  std::unique_ptr<Backend> cuda;  // nccl, or null
  std::unique_ptr<Watchdog> watchdog;  // with a backend and several ranks
};

Group& group() {
  static Group g;
  return g;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0) return -1;
  return int(x);
}

double env_timeout() {
  const char* v = std::getenv("CF_DIST_TIMEOUT");
  if (!v || !*v) return 300;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  if (*end != '\0' || !(x > 0))
    throw DistError(str("[dist] CF_DIST_TIMEOUT='", v, "' is not a positive number of seconds"));
  return x;
}

void require_init(const char* op) {
  Group& g = group();
  if (!g.initialized)
    throw DistError(str("[", op, "] the process group is not initialised: call cf::dist::init() first"));
  if (g.broken)
    throw DistError(str("[", op, "] the process group is broken: ", g.broken_by,
                        "; the ranks are out of step, exit and restart the job"));
}

Backend* backend_for(const Tensor& t, const char* op) {
  Group& g = group();
  if (t.device().is_cuda()) {
    if (g.cuda) return g.cuda.get();
    if (g.world == 1) return nullptr;
    throw DistError(str("[", op, "] tensor ", t.describe(), " is on CUDA but the process group has no CUDA backend (",
                        built_with("nccl") ? "init() with backend 'nccl' or 'auto' on a machine with a GPU"
                                           : "cf was built without NCCL (CF_NCCL=OFF, no CUDA or no nccl.h)",
                        "); move it to the CPU or use NCCL"));
  }
  return g.cpu.get();  // null for backend "none" (world of one)
}

void check_tensor(const Tensor& t, const char* op, bool allow_bool) {
  CF_CHECK(t.defined(), dist::DistError, "[", op, "] undefined tensor");
  CF_CHECK(t.is_contiguous(), dist::DistError, "[", op, "] tensor ", t.describe(),
           " is not contiguous; call contiguous() first (collectives move one flat buffer)");
  bool ok = t.dtype() == kFloat32 || t.dtype() == kFloat64 || t.dtype() == kInt64 ||
            (allow_bool && t.dtype() == kBool);
  CF_CHECK(ok, dist::DistError, "[", op, "] dtype ", t.dtype(), " is not supported (tensor ", t.describe(), ")");
}

// The tensor is described only when the message is needed (describe() costs
// about a microsecond: as much as a small all-reduce).
std::string timeout_message(const char* op, const Tensor* t) {
  Group& g = group();
  return str("[", op, "] rank ", g.rank, " of ", g.world, " timed out after ", g.timeout,
             " s waiting for the other ranks (", t ? t->describe() : std::string("no tensor"),
             "): a rank may have died, hung, or called a different collective; ");
}

// A blocking backend call, bounded by the watchdog.
template <class F>
std::unique_ptr<Request> blocking(const char* op, const Tensor* what, F&& start, const std::string* problem = nullptr) {
  Group& g = group();
  if (!g.watchdog) return start();
  g.watchdog->arm(op, what, g.timeout, problem);
  struct Disarm {
    Watchdog* w;
    ~Disarm() { w->disarm(); }
  } disarm{g.watchdog.get()};
  return start();
}

// Wait for r, polling, at most the group's timeout. Open MPI advances a
// non-blocking collective only inside MPI calls, so the first 20 ms poll without
// pause (a blocking MPI call spins the same way); a longer wait (a slow peer)
// backs off to sleeps of up to 1 ms so an idle rank leaves its core to the others.
void wait_for(Request& r, const char* op, const Tensor* what, const std::string* problem = nullptr) {
  Group& g = group();
  const auto start = std::chrono::steady_clock::now();
  int64_t polls = 0;
  auto sleep = std::chrono::microseconds(20);
  while (!r.test()) {
    if ((++polls & 255) != 0) continue;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > g.timeout) {
      g.broken = true;
      g.broken_by = str(op, " timed out");
      throw DistError(timeout_message(op, what) +
                      (problem ? "this rank's own call had failed its checks (" + *problem + "); " : std::string()) +
                      "exit (mpirun then stops the job) and restart from the last checkpoint");
    }
    if (waited > 0.02) {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
    } else {
      std::this_thread::yield();
    }
  }
}

// ---- the descriptor check ----
// Each rank's call as numbers: kind, dtype, device, op or root, rank, numel, whether the call failed its
// own checks on that rank, a hash of the whole shape, then the first kMaxDims sizes.
enum Kind : int64_t { kAllReduce = 1, kBroadcast, kAllGather, kReduceScatter };
constexpr int kMaxDims = 8;
constexpr int kDescLen = 8 + kMaxDims;

const char* kind_name(int64_t k) {
  switch (k) {
    case kAllReduce: return "all_reduce";
    case kBroadcast: return "broadcast";
    case kAllGather: return "all_gather";
    case kReduceScatter: return "reduce_scatter";
  }
  return "?";
}

std::vector<int64_t> descriptor(Kind kind, const Tensor& t, int64_t arg) {
  std::vector<int64_t> d(kDescLen, -1);
  d[0] = kind;
  d[1] = int64_t(t.dtype());
  d[2] = int64_t(t.device().type);
  d[3] = arg;  // op or root
  d[4] = t.dim();
  d[5] = t.numel();
  d[6] = 0;
  uint64_t h = 1469598103934665603ull;  // FNV-1a over every size (sizes past kMaxDims are compared too)
  for (int64_t i = 0; i < t.dim(); ++i) h = (h ^ uint64_t(t.size(i))) * 1099511628211ull;
  d[7] = int64_t(h >> 1);
  for (int i = 0; i < t.dim() && i < kMaxDims; ++i) d[8 + i] = t.size(i);
  return d;
}

std::string describe_desc(const int64_t* d) {
  std::string s = kind_name(d[0]);
  if (d[0] == kAllReduce || d[0] == kReduceScatter)
    s += str("(", reduce_op_name(ReduceOp(d[3])), ")");
  if (d[0] == kBroadcast) s += str("(root ", d[3], ")");
  s += str(" of ", DType(d[1]), " (");
  for (int64_t i = 0; i < d[4] && i < kMaxDims; ++i) s += str(i ? "," : "", d[8 + i]);
  if (d[4] > kMaxDims) s += ",...";
  s += str(") on ", d[2] == int64_t(DeviceType::CPU) ? "cpu" : "cuda");
  return s;
}

// A collective's own checks on this rank (tensor, dtype, root, shape rules), as their message: "" when it
// passes. They run before the ranks meet, so a failure is told to the others in the descriptors below
// (thrown alone, it left every other rank waiting for the collective until the timeout).
template <class F>
std::string local_problem(F&& checks) {
  try {
    checks();
    return "";
  } catch (const DistError& e) {
    return e.what();
  }
}

// Exchange the ranks' descriptors (when the check is on) and throw on every rank when any rank's call
// failed its own checks (`problem`) or the calls disagree.
void check_descriptors(Kind kind, const Tensor& t, int64_t arg, const char* op, const std::string& problem) {
  Group& g = group();
  if (!g.check || g.world == 1 || !g.cpu) {
    if (!problem.empty()) throw DistError(problem);
    return;
  }
  std::vector<int64_t> mine(kDescLen, -1);
  if (problem.empty()) {
    mine = descriptor(kind, t, arg);
  } else {
    mine[0] = kind;
    mine[6] = 1;
  }
  std::vector<int64_t> all(size_t(kDescLen) * size_t(g.world));
  // (a time-out here, the other ranks at no exchange, still reports this rank's failed check)
  const std::string* own = problem.empty() ? nullptr : &problem;
  auto r = blocking(op, problem.empty() ? &t : nullptr,
                    [&] { return g.cpu->all_gather(mine.data(), all.data(), kDescLen, kInt64, false); }, own);
  wait_for(*r, op, problem.empty() ? &t : nullptr, own);
  if (!problem.empty()) throw DistError(problem + " (on rank " + std::to_string(g.rank) + "; the other ranks stop too)");
  for (int q = 0; q < g.world; ++q)
    if (all[size_t(q) * kDescLen + 6] == 1)
      throw DistError(str("[", op, "] rank ", q, "'s call failed its own checks (rank ", q,
                          " reports why); rank ", g.rank, " stops too, rather than wait for it"));
  for (int q = 0; q < g.world; ++q) {
    const int64_t* d = all.data() + size_t(q) * kDescLen;
    if (std::memcmp(d, all.data(), sizeof(int64_t) * kDescLen) != 0)
      throw DistError(str("[", op, "] ranks disagree: rank 0 calls ", describe_desc(all.data()), ", rank ", q,
                          " calls ", describe_desc(d), " (every rank must call the same collective on tensors "
                          "of the same shape and dtype, in the same order)"));
  }
}

// Divide t (the sum) by the world size, in place, on its own device.
void divide_by_world(Tensor& t) {
  Group& g = group();
  if (g.world == 1) return;
  NoGradGuard ng;
  Tensor d = t.detach();
  copy_(d, div(d, double(g.world)));
}

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::mean: return "mean";
    case ReduceOp::max: return "max";
  }
  return "?";
}

LauncherEnv launcher_env() {
  LauncherEnv e;
  e.rank = env_int("OMPI_COMM_WORLD_RANK");
  e.world_size = env_int("OMPI_COMM_WORLD_SIZE");
  if (e.rank < 0 || e.world_size < 0) {
    e.rank = env_int("PMI_RANK");
    e.world_size = env_int("PMI_SIZE");
  }
  if (e.rank < 0 && env_int("PMIX_RANK") >= 0) e.rank = env_int("PMIX_RANK");
  e.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK");
  if (e.local_rank < 0) e.local_rank = env_int("MPI_LOCALRANKID");
  if (e.local_rank < 0) e.local_rank = env_int("SLURM_LOCALID");
  return e;
}

int local_device_index(int device_count) {
  const int local = launcher_env().local_rank;
  return device_count > 0 && local > 0 ? local % device_count : 0;
}

bool built_with(const std::string& backend) {
#ifdef CF_WITH_MPI
  if (backend == "mpi") return true;
#endif
#ifdef CF_WITH_NCCL
  if (backend == "nccl") return true;
#endif
  return backend == "none";
}

void init(const InitOptions& options) {
  Group& g = group();
  if (g.initialized) throw DistError("[dist::init] already initialised (once per process: with MPI, init() after finalize() is refused too)");
  const std::string& b = options.backend;
  if (b != "auto" && b != "mpi" && b != "nccl" && b != "none")
    throw DistError(str("[dist::init] unknown backend '", b, "' (expected auto, mpi, nccl or none)"));
  LauncherEnv env = launcher_env();
  g.timeout = options.timeout_s > 0 ? options.timeout_s : env_timeout();
  g.check = true;
  g.broken = false;
  // Refuse an impossible 'nccl' before MPI is started: MPI_Init cannot be undone
  // in this process (MPI_Finalize allows no second MPI_Init).
  if (b == "nccl") {
#ifdef CF_WITH_NCCL
    if (!cuda::is_available()) throw DistError("[dist::init] backend 'nccl' needs a visible CUDA device");
#else
    throw DistError("[dist::init] backend 'nccl' asked for but cf was built without NCCL (CF_NCCL=OFF, no CUDA, "
                    "or nccl.h/libnccl not found at configure time)");
#endif
  }
  bool want_mpi = b == "mpi" || b == "nccl" || (b == "auto" && built_with("mpi"));
  if (want_mpi) {
#ifdef CF_WITH_MPI
    // cf finalises only an MPI it started: one the program (or another library) started stays theirs to end.
    const bool already_running = detail::mpi_initialized();
    g.cpu = detail::make_mpi_backend();
    g.owns_mpi = !already_running;
    g.rank = g.cpu->rank();
    g.world = g.cpu->world_size();
#else
    throw DistError(str("[dist::init] backend '", b, "' needs MPI but cf was built without it (CF_MPI=OFF or "
                        "libopenmpi-dev missing at configure time); rebuild with MPI, or use backend 'none' "
                        "for a single process"));
#endif
  } else {
    // backend "none", or "auto" without MPI: a world of one, unless a launcher started several.
    if (env.world_size > 1)
      throw DistError(str("[dist::init] started by a launcher as rank ", env.rank, " of ", env.world_size,
                          " but cf was built without MPI (CF_MPI=OFF or libopenmpi-dev missing); "
                          "rebuild with MPI or run one process"));
    g.rank = 0;
    g.world = 1;
  }
  if ((options.rank >= 0 && options.rank != g.rank) || (options.world_size >= 0 && options.world_size != g.world)) {
    int r = g.rank, w = g.world;
    g.cpu.reset();
    throw DistError(str("[dist::init] asked for rank ", options.rank, " of ", options.world_size,
                        " but the launcher started this process as rank ", r, " of ", w));
  }
  // auto: NCCL when every process on this node can have its own GPU (NCCL refuses
  // two ranks on one device).
  int local_size = std::max(1, env_int("OMPI_COMM_WORLD_LOCAL_SIZE"));
  bool want_nccl = b == "nccl" || (b == "auto" && built_with("nccl") && cuda::is_available() &&
                                   cuda::device_count() >= local_size);
  if (want_nccl) {
#ifdef CF_WITH_NCCL
    try {
      g.cuda = detail::make_nccl_backend(*g.cpu);
    } catch (...) {
      g.cpu.reset();
      throw;
    }
#endif
  }
  if (g.cpu && g.world > 1) g.watchdog = std::make_unique<Watchdog>();
  g.initialized = true;
  set_dropout_share(g.rank, g.world);  // each rank its own dropout masks, generators in step
}

bool is_initialized() { return group().initialized; }

void finalize() {
  Group& g = group();
  if (!g.initialized) return;
  g.watchdog.reset();
  g.cuda.reset();
  g.cpu.reset();
  g.initialized = false;
  g.rank = 0;
  g.world = 1;
  set_dropout_share(0, 1);
#ifdef CF_WITH_MPI
  if (g.owns_mpi && !g.broken) detail::mpi_finalize();
#endif
  g.owns_mpi = false;
}

int rank() { return group().rank; }
int world_size() { return group().world; }
bool is_main() { return group().rank == 0; }
std::string backend_name(const Device& device) {
  Group& g = group();
  Backend* b = device.is_cuda() ? g.cuda.get() : g.cpu.get();
  return b ? b->name() : "none";
}
double timeout_s() { return group().timeout; }
void set_timeout(double seconds) {
  CF_CHECK(seconds > 0, dist::DistError, "[dist::set_timeout] timeout must be positive, got ", seconds);
  group().timeout = seconds;
}
bool check_enabled() { return group().check; }
void set_check(bool on) { group().check = on; }

void all_reduce(Tensor& t, ReduceOp op) {
  require_init("all_reduce");
  Backend* b = nullptr;
  const std::string problem = local_problem([&] {
    check_tensor(t, "all_reduce", false);
    CF_CHECK(op != ReduceOp::mean || is_floating(t.dtype()), dist::DistError,
             "[all_reduce] mean needs a float tensor, got ", t.describe());
    b = backend_for(t, "all_reduce");
  });
  check_descriptors(kAllReduce, t, int64_t(op), "all_reduce", problem);
  if (b && t.numel() > 0) {
    auto r = blocking("all_reduce", &t, [&] {
      return b->all_reduce(t.raw_data(), t.numel(), t.dtype(), op == ReduceOp::max ? op : ReduceOp::sum, false);
    });
    wait_for(*r, "all_reduce", &t);
  }
  if (op == ReduceOp::mean) divide_by_world(t);
  t.bump_version();
}

void broadcast(Tensor& t, int root) {
  require_init("broadcast");
  Group& g = group();
  Backend* b = nullptr;
  const std::string problem = local_problem([&] {
    check_tensor(t, "broadcast", true);
    CF_CHECK(root >= 0 && root < g.world, dist::DistError, "[broadcast] root ", root, " is not a rank of a world of ",
             g.world);
    b = backend_for(t, "broadcast");
  });
  check_descriptors(kBroadcast, t, root, "broadcast", problem);
  if (b && t.numel() > 0) {
    auto r = blocking("broadcast", &t,
                      [&] { return b->broadcast(t.raw_data(), t.numel(), t.dtype(), root, false); });
    wait_for(*r, "broadcast", &t);
  }
  t.bump_version();
}

Tensor all_gather(const Tensor& t) {
  require_init("all_gather");
  Group& g = group();
  Backend* b = nullptr;
  const std::string problem = local_problem([&] {
    check_tensor(t, "all_gather", true);
    CF_CHECK(t.dim() >= 1, dist::DistError, "[all_gather] needs at least one dimension (rows to stack), got ",
             t.describe());
    b = backend_for(t, "all_gather");
  });
  check_descriptors(kAllGather, t, 0, "all_gather", problem);
  Shape s = t.shape();
  s[0] *= g.world;
  Tensor out = Tensor::empty(s, t.dtype(), t.device());
  if (!b) {
    NoGradGuard ng;
    copy_(out, t.detach());
    return out;
  }
  if (t.numel() > 0) {
    auto r = blocking("all_gather", &t,
                      [&] { return b->all_gather(t.raw_data(), out.raw_data(), t.numel(), t.dtype(), false); });
    wait_for(*r, "all_gather", &t);
  }
  return out;
}

Tensor reduce_scatter(const Tensor& t, ReduceOp op) {
  require_init("reduce_scatter");
  Group& g = group();
  Backend* b = nullptr;
  const std::string problem = local_problem([&] {
    check_tensor(t, "reduce_scatter", false);
    CF_CHECK(t.dim() >= 1 && t.size(0) % g.world == 0, dist::DistError, "[reduce_scatter] the first dimension of ",
             t.describe(), " must be a multiple of the world size ", g.world);
    CF_CHECK(op != ReduceOp::mean || is_floating(t.dtype()), dist::DistError,
             "[reduce_scatter] mean needs a float tensor, got ", t.describe());
    b = backend_for(t, "reduce_scatter");
  });
  check_descriptors(kReduceScatter, t, int64_t(op), "reduce_scatter", problem);
  Shape s = t.shape();
  s[0] /= g.world;
  Tensor out = Tensor::empty(s, t.dtype(), t.device());
  if (!b) {
    NoGradGuard ng;
    copy_(out, t.detach());
    return out;
  }
  if (out.numel() > 0) {
    auto r = blocking("reduce_scatter", &t, [&] {
      return b->reduce_scatter(t.raw_data(), out.raw_data(), out.numel(), t.dtype(),
                               op == ReduceOp::max ? op : ReduceOp::sum, false);
    });
    wait_for(*r, "reduce_scatter", &t);
  }
  if (op == ReduceOp::mean) divide_by_world(out);
  return out;
}

void barrier() {
  require_init("barrier");
  Group& g = group();
  if (!g.cpu) return;
  auto r = blocking("barrier", nullptr, [&] { return g.cpu->barrier(false); });
  wait_for(*r, "barrier", nullptr);
}

namespace {
class AsyncAllReduce : public Work {
 public:
  AsyncAllReduce(Tensor t, ReduceOp op, std::unique_ptr<Request> r)
      : t_(std::move(t)), op_(op), r_(std::move(r)) {}
  bool test() override { return !r_ || r_->test(); }
  void wait() override {
    if (done_) return;
    if (r_) wait_for(*r_, "all_reduce", &t_);
    if (op_ == ReduceOp::mean) divide_by_world(t_);
    t_.bump_version();
    done_ = true;
  }

 private:
  Tensor t_;
  ReduceOp op_;
  std::unique_ptr<Request> r_;
  bool done_ = false;
};
}  // namespace

std::shared_ptr<Work> all_reduce_async(Tensor& t, ReduceOp op) {
  require_init("all_reduce");
  check_tensor(t, "all_reduce", false);
  CF_CHECK(op != ReduceOp::mean || is_floating(t.dtype()), dist::DistError,
           "[all_reduce] mean needs a float tensor, got ", t.describe());
  Backend* b = backend_for(t, "all_reduce");
  std::unique_ptr<Request> r;
  if (b && t.numel() > 0)
    r = b->all_reduce(t.raw_data(), t.numel(), t.dtype(), op == ReduceOp::max ? op : ReduceOp::sum, true);
  return std::make_shared<AsyncAllReduce>(t, op, std::move(r));
}

void abort(int code, const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
#ifdef CF_WITH_MPI
  if (group().cpu) detail::mpi_abort(code);
#endif
  std::_Exit(code);
}

}  // namespace dist
}  // namespace cf
