#include "core/cuda_graph.h"

#include <mutex>
#include <utility>
#include <vector>

#include "core/cuda.h"
#include "core/error.h"

#ifdef CF_WITH_CUDA
#include "core/cuda_check.h"
#endif

namespace cf::cuda {

#ifdef CF_WITH_CUDA

namespace {

// One capture stream per device. A blocking stream (not cudaStreamNonBlocking), so that work a
// capture misses, queued on the legacy default stream, fails with cudaErrorStreamCaptureImplicit
// instead of running eagerly outside the graph.
cudaStream_t capture_stream(Device d) {
  static std::mutex mu;
  static std::vector<cudaStream_t>* streams = new std::vector<cudaStream_t>();  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
  if (streams->empty()) streams->assign(size_t(device_count()), nullptr);
  cudaStream_t& s = (*streams)[size_t(d.index)];
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

  Device device = Device::cuda(0);
  std::vector<Part> parts;
  CaptureScope scope;
  bool captured = false;

  ~Impl() { clear(); }

  void begin() { CF_CUDA_CHECK(cudaStreamBeginCapture(scope.stream, cudaStreamCaptureModeRelaxed), "cuda::Graph"); }

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
    s.refreshing = true;
    set_graph_check_cursor(*s.checks, part.first_check);
    const int64_t allocations = graph_pool_allocations(*s.pool);
    set_capture_scope(&s);
    cudaGraph_t g = nullptr;
    try {
      begin();
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
  g.captured = true;
}

void Graph::replay() {
  Impl& g = *impl_;
  CF_CHECK(g.captured, DeviceError, "[cuda::Graph] replay before a successful capture");
  CF_CHECK(!capturing(), DeviceError, "[cuda::Graph] replay called while this thread captures a graph");
  set_device(g.device, "cuda::Graph");
  // Every part's arguments first, so that a refresh that throws leaves nothing of this replay queued.
  for (Impl::Part& p : g.parts) {
    if (p.refresh && !p.fresh) g.refresh(p);
    p.fresh = false;
  }
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
  if (!s || s->refreshing || !s->graph) {
    fn();
    return;
  }
  // A part of its own: the plain part before it ends here, and a new one starts after it.
  Graph::Impl& g = *static_cast<Graph::Impl*>(s->graph);
  g.finish(nullptr, graph_check_cursor(*s->checks));
  const int64_t first_check = graph_check_cursor(*s->checks);
  g.begin();
  void* const graph = s->graph;
  s->graph = nullptr;  // (a replayable call inside fn is part of this one)
  try {
    fn();
  } catch (...) {
    s->graph = graph;
    throw;  // (Graph::capture ends the capture and drops the graph)
  }
  s->graph = graph;
  g.finish(fn, first_check);
  g.begin();
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

#endif

}  // namespace cf::cuda
