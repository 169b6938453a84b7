#include "core/cuda_graph.h"

#include <mutex>
#include <utility>
#include <vector>

#include "core/cuda.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/storage.h"
#include "core/tensor.h"

#ifdef CF_WITH_CUDA
#include "core/cuda_check.h"
#endif

namespace cf::cuda {

#ifdef CF_WITH_CUDA

namespace {

// One capture stream per thread and device (two threads may capture at once). A blocking stream
// (not cudaStreamNonBlocking), so that work a capture misses, queued on the legacy default stream,
// fails with cudaErrorStreamCaptureImplicit instead of running eagerly outside the graph. Kept for
// the thread's life (a graph refreshes its replayable parts on the thread that replays it).
cudaStream_t capture_stream(Device d) {
  thread_local std::vector<cudaStream_t> streams;
  if (streams.empty()) streams.assign(size_t(device_count()), nullptr);
  cudaStream_t& s = streams[size_t(d.index)];
  if (!s) CF_CUDA_CHECK(cudaStreamCreate(&s), "cuda::Graph");
  return s;
}

// Ends the capture under way on `stream` and returns what it recorded, or throws with `why`.
cudaGraph_t end_capture(cudaStream_t stream) {
  cudaGraph_t g = nullptr;
  const cudaError_t err = cudaStreamEndCapture(stream, &g);
  if (err != cudaSuccess) {
    if (g) (void)cudaGraphDestroy(g);
    (void)cudaGetLastError();
    throw DeviceError(str("[cuda::Graph] the capture failed: ", cudaGetErrorName(err), " (",
                          cudaGetErrorString(err),
                          "): work was queued outside the capture stream during it (on the legacy default "
                          "stream, or from another thread), or an op waited for the device"));
  }
  return g;
}

}  // namespace

struct Graph::Impl {
  struct Part {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    std::function<void()> refresh;  // a replayable part's host code (empty: a plain part)
    int64_t first_check = 0;        // its first deferred-check slot
    bool fresh = true;              // its arguments are the next replay's (set by the capture's call)
  };

  // A generator the capture drew from: its state at the first draw and the counters the capture
  // reserved from it; its pair in `rebase` is (seed, counter shift) for the replay under way.
  // A generator gone by the end of the capture (a layer's own per-call generator, made from a fixed
  // seed every forward) is fixed: a new one draws the same counters each step, so its pair stays
  // (seed, 0) and nothing advances.
  struct Draws {
    Generator* gen;
    std::weak_ptr<const bool> alive;
    uint64_t seed, start, count;
    bool fixed;
  };
  static constexpr size_t kMaxGenerators = 64;

  Device device = Device::cuda(0);
  std::vector<Part> parts;
  CaptureScope scope;
  std::vector<Draws> draws;
  uint64_t* rebase = nullptr;  // device, kMaxGenerators pairs (allocated once, outside the pool)
  int rebase_device = -1;
  int64_t replays = 0;
  bool captured = false;
  std::vector<Tensor> kept;  // keep_for_graph's

  ~Impl() {
    clear();
    if (rebase) (void)cudaFree(rebase);
  }

  void begin() { begin_on(scope.stream); }
  static void begin_on(cudaStream_t stream) {
    CF_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "cuda::Graph");
  }

  // Ends the part under capture; a plain part that recorded nothing is dropped.
  void finish(std::function<void()> refresh, int64_t first_check) {
    cudaGraph_t g = end_capture(scope.stream);
    size_t nodes = 0;
    CF_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &nodes), "cuda::Graph");
    if (nodes == 0 && !refresh) {
      (void)cudaGraphDestroy(g);
      return;
    }
    Part part;
    part.graph = g;
    const cudaError_t err = cudaGraphInstantiate(&part.exec, g, 0);
    if (err != cudaSuccess) {
      (void)cudaGraphDestroy(g);
      throw_cuda_error(err, "cuda::Graph", "cudaGraphInstantiate");
    }
    part.refresh = std::move(refresh);
    part.first_check = first_check;
    parts.push_back(std::move(part));
  }

  // Calls a replayable part's host code again under capture and moves the kernel arguments it
  // queued now into the part's executable graph (cudaGraphExecUpdate: same kernels, new values).
  void refresh(Part& part) {
    CaptureScope s = scope;
    s.stream = capture_stream(device);  // (this thread's: the replaying one)
    s.refreshing = true;
    set_graph_check_cursor(*s.checks, part.first_check);
    const int64_t allocations = graph_pool_allocations(*s.pool);
    set_capture_scope(&s);
    cudaGraph_t g = nullptr;
    try {
      begin_on(s.stream);
      try {
        part.refresh();
      } catch (...) {
        cudaGraph_t dropped = nullptr;
        (void)cudaStreamEndCapture(s.stream, &dropped);
        if (dropped) (void)cudaGraphDestroy(dropped);
        (void)cudaGetLastError();
        throw;
      }
      g = end_capture(s.stream);
    } catch (...) {
      set_capture_scope(nullptr);
      throw;
    }
    set_capture_scope(nullptr);
    if (graph_pool_allocations(*s.pool) != allocations) {
      (void)cudaGraphDestroy(g);
      throw DeviceError(
          "[cuda::Graph] a replayable part allocated device memory when called again before a replay (its "
          "kernels would read memory the graph does not hold): it must allocate nothing");
    }
    cudaGraphExecUpdateResultInfo info{};
    const cudaError_t err = cudaGraphExecUpdate(part.exec, g, &info);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      (void)cudaGraphDestroy(g);
      throw DeviceError(str("[cuda::Graph] a replayable part queued other work before this replay than at capture "
                            "(cudaGraphExecUpdate result ",
                            int(info.result),
                            "): it must launch the same kernels each time (an optimizer whose parameters "
                            "gained or lost a gradient since the capture?)"));
    }
    (void)cudaGraphDestroy(part.graph);
    part.graph = g;
  }

  void clear() {
    for (Part& p : parts) {
      if (p.exec) (void)cudaGraphExecDestroy(p.exec);  // (a launch in flight completes first)
      if (p.graph) (void)cudaGraphDestroy(p.graph);
    }
    parts.clear();
    draws.clear();
    kept.clear();  // (before the pool retires: their blocks may go to it, or on to the shared cache)
    replays = 0;
    // Blocks of the pool are retired only now: no replay can be queued after this, and the
    // ones queued before run first on the stream any later user of a block runs on.
    retire_graph_pool(scope.pool);
    scope = CaptureScope{};
    captured = false;
  }
};

Graph::Graph() : impl_(std::make_unique<Impl>()) {}
Graph::~Graph() = default;

void Graph::capture(const std::function<void()>& fn, Device device) {
  CF_CHECK(device.is_cuda(), ValueError, "[cuda::Graph] captures CUDA work: device ", device, " is not a CUDA device");
  check_device(device, "cuda::Graph");
  CF_CHECK(!capturing(), DeviceError, "[cuda::Graph] capture called while this thread already captures a graph");
  Impl& g = *impl_;
  g.clear();
  set_device(device, "cuda::Graph");
  g.device = device;
  g.scope.device = device;
  g.scope.stream = capture_stream(device);
  g.scope.pool = make_graph_pool(device);
  g.scope.checks = make_graph_checks(device);
  g.scope.graph = &g;
  if (g.rebase && g.rebase_device != device.index) {
    (void)cudaFree(g.rebase);
    g.rebase = nullptr;
  }
  if (!g.rebase) {
    CF_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&g.rebase), 2 * sizeof(uint64_t) * Impl::kMaxGenerators),
                  "cuda::Graph");
    g.rebase_device = device.index;
  }
  set_capture_scope(&g.scope);
  try {
    g.begin();
    try {
      fn();
    } catch (...) {
      cudaGraph_t dropped = nullptr;
      (void)cudaStreamEndCapture(g.scope.stream, &dropped);
      if (dropped) (void)cudaGraphDestroy(dropped);
      (void)cudaGetLastError();
      throw;
    }
    g.finish(nullptr, graph_check_cursor(*g.scope.checks));
  } catch (...) {
    set_capture_scope(nullptr);
    g.clear();
    throw;
  }
  set_capture_scope(nullptr);
  // The first replay is the captured step itself: its draws at the counters reserved during the capture.
  try {
    for (size_t i = 0; i < g.draws.size(); ++i) {
      Impl::Draws& d = g.draws[i];
      d.fixed = d.alive.expired();
      d.count = d.fixed ? 0 : d.gen->offset() - d.start;
      const uint64_t pair[2] = {d.seed, 0};
      CF_CUDA_CHECK(cudaMemcpy(g.rebase + 2 * i, pair, sizeof(pair), cudaMemcpyHostToDevice), "cuda::Graph");
    }
  } catch (...) {
    g.clear();
    throw;
  }
  g.captured = true;
}

void Graph::replay() {
  Impl& g = *impl_;
  CF_CHECK(g.captured, DeviceError, "[cuda::Graph] replay before a successful capture");
  CF_CHECK(!capturing(), DeviceError, "[cuda::Graph] replay called while this thread captures a graph");
  set_device(g.device, "cuda::Graph");
  // Everything that can fail before anything changes: a generator the step draws from is gone, or a
  // refreshed part fails (its host code may have run: an optimizer's step counts advanced while its
  // kernels were not updated). The graph is dropped then, to be captured again, rather than replayed
  // out of step.
  try {
    if (g.replays > 0)
      for (const Impl::Draws& d : g.draws)
        CF_CHECK(d.fixed || !d.alive.expired(), DeviceError,
                 "[cuda::Graph] a generator the captured step drew random numbers from was destroyed");
    for (Impl::Part& p : g.parts)
      if (p.refresh && !p.fresh) g.refresh(p);
  } catch (...) {
    g.clear();
    throw;
  }
  for (Impl::Part& p : g.parts) p.fresh = false;
  // Each later replay draws the counters its eager step would reserve now: the pair (seed, now - start)
  // rebases the captured ones, queued before the launch; the generator advances past them.
  if (g.replays > 0) {
    for (size_t i = 0; i < g.draws.size(); ++i) {
      Impl::Draws& d = g.draws[i];
      if (d.fixed) continue;
      const auto [seed, offset] = d.gen->take(d.count);
      const uint64_t shift = offset - d.start;
      fill_device(g.rebase + 2 * i, g.device, &seed, sizeof(seed), 1, "cuda::Graph");
      fill_device(g.rebase + 2 * i + 1, g.device, &shift, sizeof(shift), 1, "cuda::Graph");
    }
  }
  ++g.replays;
  for (Impl::Part& p : g.parts) {
    CF_CUDA_CHECK(cudaGraphLaunch(p.exec, 0), "cuda::Graph");
    count_launch();
  }
  queue_graph_checks(g.scope.checks);
  if (sync_debug()) {
    const cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) throw_cuda_error(err, "cuda::Graph", "replay (CF_CUDA_SYNC_DEBUG)");
    check_errors();
  }
}

bool Graph::captured() const { return impl_->captured; }
int64_t Graph::parts() const { return int64_t(impl_->parts.size()); }
void Graph::reset() { impl_->clear(); }

void replayable(const std::function<void()>& fn) {
  CaptureScope* s = capture_scope();
  if (!s || s->refreshing || s->in_replayable) {
    fn();
    return;
  }
  // A part of its own: the plain part before it ends here, and a new one starts after it.
  Graph::Impl& g = *static_cast<Graph::Impl*>(s->graph);
  g.finish(nullptr, graph_check_cursor(*s->checks));
  const int64_t first_check = graph_check_cursor(*s->checks);
  g.begin();
  s->in_replayable = true;  // (a replayable call inside fn is part of this one)
  try {
    fn();
  } catch (...) {
    s->in_replayable = false;
    throw;  // (Graph::capture ends the capture and drops the graph)
  }
  s->in_replayable = false;
  g.finish(fn, first_check);
  g.begin();
}

const uint64_t* philox_rebase_for(Generator& gen, Device device, const char* op) {
  CaptureScope* s = capture_scope();
  if (!s || !device.is_cuda()) return nullptr;
  CF_CHECK(!s->refreshing && !s->in_replayable, DeviceError, "[", op,
           "] draws random numbers inside a replayable part (cuda::replayable), which is called again before each "
           "replay: draw outside it");
  Graph::Impl& g = *static_cast<Graph::Impl*>(s->graph);
  CF_CHECK(device == g.device, DeviceError, "[", op, "] draws random numbers on ", device,
           " while this thread captures a CUDA graph on ", g.device);
  for (size_t i = 0; i < g.draws.size(); ++i)
    if (g.draws[i].gen == &gen && !g.draws[i].alive.expired()) return g.rebase + 2 * i;
  CF_CHECK(g.draws.size() < Graph::Impl::kMaxGenerators, DeviceError, "[", op, "] a CUDA graph draws from at most ",
           Graph::Impl::kMaxGenerators, " generators");
  const auto [seed, offset] = gen.state();
  g.draws.push_back({&gen, gen.lifetime(), seed, offset, 0, false});
  return g.rebase + 2 * (g.draws.size() - 1);
}

void keep_for_graph(const Tensor& t) {
  CaptureScope* s = capture_scope();
  if (!s || s->refreshing || !t.defined() || !t.device().is_cuda()) return;
  std::vector<Tensor>& kept = static_cast<Graph::Impl*>(s->graph)->kept;
  for (const Tensor& k : kept)
    if (k.impl_ptr() == t.impl_ptr()) return;
  kept.push_back(t);
}

bool made_before_capture(const Tensor& t) {
  CaptureScope* s = capture_scope();
  if (!s || !t.defined() || !t.device().is_cuda() || !t.impl_ptr()->storage) return false;
  const Storage& st = *t.impl_ptr()->storage;
  return st.release || !graph_pool_owns(*s->pool, st.data);
}

#else  // no CUDA backend

struct Graph::Impl {};

Graph::Graph() : impl_(std::make_unique<Impl>()) {}
Graph::~Graph() = default;

void Graph::capture(const std::function<void()>&, Device device) {
  CF_CHECK(device.is_cuda(), ValueError, "[cuda::Graph] captures CUDA work: device ", device, " is not a CUDA device");
  check_device(device, "cuda::Graph");  // throws: no CUDA backend
}
void Graph::replay() { throw DeviceError("[cuda::Graph] replay before a successful capture"); }
bool Graph::captured() const { return false; }
int64_t Graph::parts() const { return 0; }
void Graph::reset() {}
void replayable(const std::function<void()>& fn) { fn(); }
const uint64_t* philox_rebase_for(Generator&, Device, const char*) { return nullptr; }
void keep_for_graph(const Tensor&) {}
bool made_before_capture(const Tensor&) { return false; }

#endif

}  // namespace cf::cuda
