#include "core/cuda.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"

#ifdef CF_WITH_CUDA
#include "core/cuda_check.h"
#endif

namespace cf {
namespace cuda {
namespace {
std::atomic<bool> g_tf32{false};

bool sync_debug_default() {
#ifdef CF_CUDA_SYNC_DEBUG
  return true;
#else
  const char* e = std::getenv("CF_CUDA_SYNC_DEBUG");
  return e && std::strcmp(e, "1") == 0;
#endif
}
std::atomic<bool>& sync_flag() {
  static std::atomic<bool> f{sync_debug_default()};
  return f;
}

struct TransferCounters {
  std::atomic<int64_t> d2h{0}, d2h_bytes{0}, h2d{0}, h2d_bytes{0}, syncs{0}, launches{0};
};
TransferCounters& counters() {
  static TransferCounters c;
  return c;
}

// Called by copy_bytes for a copy with one side on a CUDA device (unused without CUDA).
[[maybe_unused]] void count_transfer(bool to_host, size_t n) {
  TransferCounters& c = counters();
  if (to_host) {
    ++c.d2h;
    c.d2h_bytes += int64_t(n);
  } else {
    ++c.h2d;
    c.h2d_bytes += int64_t(n);
  }
}
}  // namespace

TransferStats transfer_stats() {
  TransferCounters& c = counters();
  TransferStats s;
  s.device_to_host = c.d2h.load();
  s.device_to_host_bytes = c.d2h_bytes.load();
  s.host_to_device = c.h2d.load();
  s.host_to_device_bytes = c.h2d_bytes.load();
  s.synchronizations = c.syncs.load();
  s.kernel_launches = c.launches.load();
  return s;
}

void reset_transfer_stats() {
  TransferCounters& c = counters();
  c.d2h = 0;
  c.d2h_bytes = 0;
  c.h2d = 0;
  c.h2d_bytes = 0;
  c.syncs = 0;
  c.launches = 0;
}

TransferStats operator-(const TransferStats& b, const TransferStats& a) {
  TransferStats d;
  d.device_to_host = b.device_to_host - a.device_to_host;
  d.device_to_host_bytes = b.device_to_host_bytes - a.device_to_host_bytes;
  d.host_to_device = b.host_to_device - a.host_to_device;
  d.host_to_device_bytes = b.host_to_device_bytes - a.host_to_device_bytes;
  d.synchronizations = b.synchronizations - a.synchronizations;
  d.kernel_launches = b.kernel_launches - a.kernel_launches;
  return d;
}

void set_allow_tf32(bool on) { g_tf32.store(on); }
bool allow_tf32() { return g_tf32.load(); }
void set_sync_debug(bool on) { sync_flag().store(on); }
bool sync_debug() { return sync_flag().load(); }

#ifdef CF_WITH_CUDA

int device_count() {
  // Asked once: without a driver or GPU the runtime reports an error, which
  // here means "no devices".
  static const int n = [] {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return c;
  }();
  return n;
}

void throw_cuda_error(cudaError_t err, const char* op, const char* what) {
  (void)cudaGetLastError();  // clear a sticky-free error so later calls are not blamed
  throw DeviceError(str("[", op, "] CUDA error ", cudaGetErrorName(err), ": ",
                        cudaGetErrorString(err), " (in ", what, ")"));
}

void count_launch() {
  if (!capturing()) ++counters().launches;  // (a captured kernel is launched by its graph's replays)
}

namespace {
// True while this thread runs a deferred check's launch under the record's lock:
// check_launch must not read the record then (defer_check reads it right after).
thread_local bool t_in_check_launch = false;
// What this thread captures into (core/cuda_graph.cpp), or null.
thread_local CaptureScope* t_capture = nullptr;
}  // namespace

void set_capture_scope(CaptureScope* scope) { t_capture = scope; }
CaptureScope* capture_scope() { return t_capture; }
bool capturing() { return t_capture != nullptr; }
cudaStream_t stream() { return t_capture ? t_capture->stream : cudaStream_t(0); }

void check_launch(const char* op) {
  count_launch();
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw_cuda_error(err, op, "kernel launch");
  // (a captured kernel has not run: there is nothing to wait for, and a wait would end the capture)
  if (sync_debug() && !capturing()) {
    err = cudaDeviceSynchronize();
    if (err != cudaSuccess) throw_cuda_error(err, op, "kernel execution (CF_CUDA_SYNC_DEBUG)");
    if (!t_in_check_launch) check_errors();
  }
}

namespace {

// The deferred data checks of every device. A device's slots are one cudaMalloc'd
// array (outside cf's allocator, so memory statistics do not see it), handed out in
// order and reset together after each read; `pending` lists the unread checks in
// the order they were queued, so the first failure reported is the first queued.
struct DeferredChecks {
  static constexpr int64_t kSlots = 4096;
  struct Pending {
    int device;
    int64_t slot;
    RaiseCheck raise;
    std::shared_ptr<GraphChecks> graph;  // the slot is this graph's (null: the device's record)
  };
  std::mutex mu;
  std::vector<CheckSlot*> slots;  // per device, allocated on first use
  std::vector<int64_t> used;      // per device: slots handed out since the last read
  std::vector<Pending> pending;
  std::atomic<int64_t> count{0};  // pending.size(), read without the lock
};
DeferredChecks& deferred() {
  static DeferredChecks* d = new DeferredChecks();  // never destroyed: device memory lives to exit
  return *d;
}

const std::vector<CheckSlot>& unused_slots() {
  static const std::vector<CheckSlot> v(size_t(DeferredChecks::kSlots), CheckSlot{kNoFailure, 0, 0, 0});
  return v;
}

void reset_slots(CheckSlot* slots, int64_t n, const char* op) {
  const size_t bytes = sizeof(CheckSlot) * size_t(n);
  CF_CUDA_CHECK(cudaMemcpy(slots, unused_slots().data(), bytes, cudaMemcpyHostToDevice), op);
}

}  // namespace

struct GraphChecks {
  int device = 0;
  CheckSlot* slots = nullptr;  // DeferredChecks::kSlots of them, cudaMalloc'd
  int64_t cursor = 0;          // the slot the next captured check takes
  int64_t used = 0;            // slots taken by the capture (the largest cursor)
  std::vector<RaiseCheck> raises;
  bool queued = false;  // its slots are in the pending list (under DeferredChecks::mu)
  ~GraphChecks() {
    if (slots) (void)cudaFree(slots);
  }
};

std::shared_ptr<GraphChecks> make_graph_checks(Device d) {
  set_device(d, "cuda::Graph");
  auto c = std::make_shared<GraphChecks>();
  c->device = d.index;
  CF_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c->slots), sizeof(CheckSlot) * size_t(DeferredChecks::kSlots)),
                "cuda::Graph");
  reset_slots(c->slots, DeferredChecks::kSlots, "cuda::Graph");
  return c;
}
void set_graph_check_cursor(GraphChecks& checks, int64_t slot) { checks.cursor = slot; }
int64_t graph_check_cursor(const GraphChecks& checks) { return checks.cursor; }

void queue_graph_checks(const std::shared_ptr<GraphChecks>& checks) {
  DeferredChecks& r = deferred();
  std::lock_guard<std::mutex> lock(r.mu);
  // A failure stays in its slot until read, so a graph replayed again before the read needs no
  // second entry: the read reports its first failure either way.
  if (checks->queued || checks->used == 0) return;
  for (int64_t i = 0; i < checks->used; ++i) r.pending.push_back({checks->device, i, checks->raises[size_t(i)], checks});
  checks->queued = true;
  r.count += checks->used;
}

void defer_check(Device d, RaiseCheck raise, const char* op, const std::function<void(CheckSlot*)>& launch) {
  check_device(d, op);
  if (CaptureScope* cap = capture_scope()) {
    // A captured check: a slot of the graph's own (the same one each time its part is re-captured),
    // written at every replay and queued by Graph::replay.
    GraphChecks& g = *cap->checks;
    CF_CHECK(d.index == g.device, DeviceError, "[", op, "] checks data on ", d, " while capturing a CUDA graph on cuda:",
             g.device);
    CF_CHECK(g.cursor < DeferredChecks::kSlots, DeviceError, "[", op, "] a CUDA graph holds at most ",
             DeferredChecks::kSlots, " deferred data checks");
    set_device(d, op);
    launch(g.slots + g.cursor);
    if (g.cursor < int64_t(g.raises.size()))
      g.raises[size_t(g.cursor)] = std::move(raise);
    else
      g.raises.push_back(std::move(raise));
    g.used = std::max(g.used, ++g.cursor);
    return;
  }
  DeferredChecks& r = deferred();
  const size_t dev = size_t(d.index);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(r.mu);
      if (r.slots.empty()) {
        r.slots.assign(size_t(device_count()), nullptr);
        r.used.assign(size_t(device_count()), 0);
      }
      if (!r.slots[dev]) {
        set_device(d, op);
        const size_t bytes = sizeof(CheckSlot) * size_t(DeferredChecks::kSlots);
        CheckSlot* p = nullptr;
        CF_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), bytes), op);
        try {
          reset_slots(p, DeferredChecks::kSlots, op);
        } catch (...) {
          (void)cudaFree(p);
          throw;
        }
        r.slots[dev] = p;  // only once initialised
      }
      if (r.used[dev] < DeferredChecks::kSlots) {
        CheckSlot* slot = r.slots[dev] + r.used[dev];
        set_device(d, op);
        struct Flag {  // reset however launch leaves
          Flag() { t_in_check_launch = true; }
          ~Flag() { t_in_check_launch = false; }
        } flag;
        launch(slot);  // may throw: then nothing is reserved
        r.pending.push_back({d.index, r.used[dev], std::move(raise), nullptr});
        ++r.used[dev];
        ++r.count;
        break;
      }
    }
    check_errors();  // every slot holds an unread check: read them (waits), then take one
  }
  if (sync_debug()) check_errors();  // CF_CUDA_SYNC_DEBUG: the failing op throws itself
}

int64_t pending_checks() { return deferred().count.load(); }

void check_errors() {
  DeferredChecks& r = deferred();
  if (r.count.load() == 0) return;
  CF_CHECK(!capturing(), DeviceError,
           "[check_errors] reads the deferred data checks back to the host while this thread captures a CUDA graph "
           "(a captured step cannot wait for the device)");
  std::vector<DeferredChecks::Pending> pending;
  std::vector<std::vector<CheckSlot>> read(r.slots.size());
  std::map<const GraphChecks*, std::vector<CheckSlot>> graph_read;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    pending.swap(r.pending);
    r.count = 0;
    std::vector<int64_t> used(r.used.size(), 0);
    used.swap(r.used);  // every slot is free again, whatever happens below
    int current = -1;
    CF_CUDA_CHECK(cudaGetDevice(&current), "check_errors");
    // The record's own copies are part of the host read that called this: they are
    // not counted in transfer_stats. Each device's copy runs with that device
    // current, so it is ordered after the check kernels queued on it.
    for (size_t dev = 0; dev < r.slots.size(); ++dev) {
      const int64_t n = used[dev];
      if (n == 0) continue;
      CF_CUDA_CHECK(cudaSetDevice(int(dev)), "check_errors");
      const size_t bytes = sizeof(CheckSlot) * size_t(n);
      read[dev].resize(size_t(n));
      CF_CUDA_CHECK(cudaMemcpy(read[dev].data(), r.slots[dev], bytes, cudaMemcpyDeviceToHost), "check_errors");
      CF_CUDA_CHECK(cudaMemcpy(r.slots[dev], unused_slots().data(), bytes, cudaMemcpyHostToDevice), "check_errors");
    }
    // Each queued graph's slots (every replay since the last read wrote the same ones), reset after.
    for (const DeferredChecks::Pending& p : pending) {
      if (!p.graph || graph_read.count(p.graph.get())) continue;
      GraphChecks& g = *p.graph;
      g.queued = false;
      std::vector<CheckSlot>& into = graph_read[&g];
      into.resize(size_t(g.used));
      CF_CUDA_CHECK(cudaSetDevice(g.device), "check_errors");
      CF_CUDA_CHECK(cudaMemcpy(into.data(), g.slots, sizeof(CheckSlot) * into.size(), cudaMemcpyDeviceToHost),
                    "check_errors");
      reset_slots(g.slots, g.used, "check_errors");
    }
    CF_CUDA_CHECK(cudaSetDevice(current), "check_errors");
  }
  for (const DeferredChecks::Pending& p : pending) {
    const CheckSlot& s =
        p.graph ? graph_read[p.graph.get()][size_t(p.slot)] : read[size_t(p.device)][size_t(p.slot)];
    if (s.position != kNoFailure) p.raise(int64_t(s.position), int64_t(s.value));
  }
}

void set_device(Device d, const char* op) {
  check_device(d, op);
  int cur = -1;
  CF_CUDA_CHECK(cudaGetDevice(&cur), op);
  if (cur != d.index) CF_CUDA_CHECK(cudaSetDevice(d.index), op);
}

void synchronize() {
  if (device_count() == 0) return;
  CF_CHECK(!capturing(), DeviceError,
           "[synchronize] waits for the device while this thread captures a CUDA graph (a captured step cannot wait)");
  ++counters().syncs;
  CF_CUDA_CHECK(cudaDeviceSynchronize(), "synchronize");
  check_errors();
}

#else

int device_count() { return 0; }
bool capturing() { return false; }
void synchronize() {}
void check_errors() {}
int64_t pending_checks() { return 0; }

#endif

bool is_available() { return device_count() > 0; }

void check_device(Device d, const char* op) {
  if (!d.is_cuda()) return;
  if (!cuda_built())
    throw DeviceError(str("[", op, "] device ", d, " is not available: this build has no CUDA backend"));
  const int n = device_count();
  if (d.index < 0 || d.index >= n)
    throw DeviceError(str("[", op, "] device ", d, " is not available: ",
                          n == 0 ? std::string("no CUDA device is visible")
                                 : str(n, " CUDA device(s) are visible")));
}

}  // namespace cuda

#ifdef CF_WITH_CUDA
namespace cuda {
struct GraphPool {
  int device = 0;
  std::multimap<size_t, void*> cache;  // its freed blocks, by size class
  int64_t allocations = 0;
  bool retired = false;
};
}  // namespace cuda

namespace {

// Caching allocator for one CUDA device. cudaMalloc and cudaFree synchronise
// the device and cost tens of microseconds, so freed blocks are kept by size
// class and handed out again (all eager cf work runs on the default stream, so a
// block freed by the host is free for any later kernel). Size classes: 512-byte
// steps below 1 MiB, 8 classes per power of two above (at most 12.5% slack).
// Counters count the bytes asked for, like the CPU allocator. A CUDA graph's
// allocations while it is captured come from its private pool (cuda::GraphPool).
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int index) : index_(index) {}

  void* allocate(size_t nbytes) override {
    const size_t cls = size_class(nbytes);
    cuda::CaptureScope* cap = cuda::capture_scope();
    const std::shared_ptr<cuda::GraphPool>& pool =
        cap && cap->pool && cap->pool->device == index_ ? cap->pool : no_pool_;
    std::lock_guard<std::mutex> lock(mu_);
    void* p = pool ? take_locked(pool->cache, cls) : nullptr;
    if (!p) p = take_locked(cache_, cls);
    if (!p) {
      cuda::set_device(Device::cuda(index_), "allocate");
      cudaError_t err = cudaMalloc(&p, cls);
      // Give cached blocks back, then try once more (not while capturing: freeing waits for the device).
      if (err == cudaErrorMemoryAllocation && !cap) {
        (void)cudaGetLastError();
        release_cache_locked();
        err = cudaMalloc(&p, cls);
      }
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        throw DeviceError(str("[allocate] cannot allocate ", nbytes, " bytes on cuda:", index_, ": ",
                              cudaGetErrorString(err), " (live ", live_, " bytes, cached ", cached_, " bytes",
                              cap ? "; a CUDA graph capture cannot release cached blocks: empty_cache() before it"
                                  : "",
                              ")"));
      }
    }
    if (pool) {
      own_locked(p, pool);  // (a block from the shared cache joins the pool)
      ++pool->allocations;
    }
    live_ += int64_t(nbytes);
    if (live_ > peak_) peak_ = live_;
    ++count_;
    return p;
  }
  void deallocate(void* p, size_t nbytes) override {
    cuda::CaptureScope* cap = cuda::capture_scope();
    std::lock_guard<std::mutex> lock(mu_);
    live_ -= int64_t(nbytes);
    const size_t cls = size_class(nbytes);
    cached_ += cls;
    // Freed while this thread captures: captured kernels may use it (a buffer the step replaced, a
    // tensor an earlier graph made), so the capturing graph owns it too.
    park_locked(p, cls, cap && cap->pool && cap->pool->device == index_ ? cap->pool : no_pool_);
  }
  bool owns(const cuda::GraphPool& pool, const void* block) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = owner_.find(const_cast<void*>(block));
    if (it == owner_.end()) return false;
    for (const auto& q : it->second)
      if (q.get() == &pool) return true;
    return false;
  }
  // The graph that owned `pool` is gone: its cached blocks go to another live owner, else to everyone.
  void retire(const std::shared_ptr<cuda::GraphPool>& pool) {
    std::lock_guard<std::mutex> lock(mu_);
    pool->retired = true;
    std::multimap<size_t, void*> blocks;
    blocks.swap(pool->cache);
    for (auto& e : blocks) park_locked(e.second, e.first, no_pool_);
  }
  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    MemoryStats s;
    s.live_bytes = live_;
    s.peak_bytes = peak_;
    s.cached_bytes = int64_t(cached_);
    s.num_allocs = count_;
    return s;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    peak_ = live_;
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    release_cache_locked();
  }

 private:
  static size_t size_class(size_t n) {
    n = n == 0 ? 1 : n;
    if (n < (size_t(1) << 20)) return (n + 511) / 512 * 512;
    size_t top = size_t(1) << (63 - __builtin_clzll(n));
    size_t step = top / 8;
    return (n + step - 1) / step * step;
  }
  void own_locked(void* p, const std::shared_ptr<cuda::GraphPool>& pool) {
    Owners& o = owner_[p];
    if (std::find(o.begin(), o.end(), pool) == o.end()) o.push_back(pool);
  }
  // Caches a free block (counted in cached_ already): in the capturing graph's pool, else in a live
  // graph's that used it, else in the shared cache. A block a live graph's replays may write is never
  // handed to eager work.
  // A block another live graph owns stays in that graph's cache (its replays may write it: the
  // capturing graph must not keep data there), the capturing graph becoming an owner too.
  void park_locked(void* p, size_t cls, const std::shared_ptr<cuda::GraphPool>& capturing) {
    auto it = owner_.find(p);
    if (it != owner_.end()) {
      Owners& o = it->second;
      o.erase(std::remove_if(o.begin(), o.end(), [](const auto& q) { return q->retired; }), o.end());
      auto other = std::find_if(o.begin(), o.end(), [&](const auto& q) { return q != capturing; });
      if (other != o.end()) {
        std::shared_ptr<cuda::GraphPool> keeper = *other;
        if (capturing) own_locked(p, capturing);
        keeper->cache.emplace(cls, p);
        return;
      }
      if (o.empty()) owner_.erase(it);
    }
    if (capturing) {
      own_locked(p, capturing);
      capturing->cache.emplace(cls, p);
      return;
    }
    cache_.emplace(cls, p);
  }
  void* take_locked(std::multimap<size_t, void*>& from, size_t cls) {
    auto it = from.find(cls);
    if (it == from.end()) return nullptr;
    void* p = it->second;
    from.erase(it);
    cached_ -= cls;
    return p;
  }
  // The shared cache only: a live graph's pool keeps its blocks (a replay writes them).
  void release_cache_locked() {
    if (cache_.empty()) return;
    cuda::set_device(Device::cuda(index_), "empty_cache");
    CF_CHECK(!cuda::capturing(), DeviceError, "[empty_cache] frees device memory while this thread captures a CUDA graph");
    // Blocks may still be read by queued kernels: wait before freeing them.
    CF_CUDA_CHECK(cudaDeviceSynchronize(), "empty_cache");
    for (auto& e : cache_) {
      (void)cudaFree(e.second);
      cached_ -= e.first;
    }
    cache_.clear();
  }

  int index_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cache_;
  // Blocks of graphs' private pools, live or cached, and the graphs whose captures used them (until
  // all of those are retired).
  using Owners = std::vector<std::shared_ptr<cuda::GraphPool>>;
  std::unordered_map<void*, Owners> owner_;
  const std::shared_ptr<cuda::GraphPool> no_pool_;
  size_t cached_ = 0;  // shared cache and pools' caches
  int64_t live_ = 0, peak_ = 0, count_ = 0;
};

// Two pinned host buffers: a large host<->device copy goes through them in
// chunks, the host memcpy of one chunk overlapping the DMA of the other.
class PinnedStaging {
 public:
  static constexpr size_t kChunk = size_t(4) << 20;

  void copy(void* dst, Device dd, const void* src, size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    init();
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    const size_t chunks = (n + kChunk - 1) / kChunk;
    auto len = [&](size_t i) { return std::min(kChunk, n - i * kChunk); };
    if (dd.is_cuda()) {  // host -> device
      for (size_t i = 0; i < chunks; ++i) {
        const size_t b = i % 2;
        CF_CUDA_CHECK(cudaEventSynchronize(done_[b]), "to");  // buffer b is free again
        std::memcpy(buf_[b], s + i * kChunk, len(i));
        CF_CUDA_CHECK(cudaMemcpyAsync(d + i * kChunk, buf_[b], len(i), cudaMemcpyHostToDevice, 0), "to");
        CF_CUDA_CHECK(cudaEventRecord(done_[b], 0), "to");
      }
      CF_CUDA_CHECK(cudaStreamSynchronize(0), "to");
    } else {  // device -> host
      for (size_t i = 0; i <= chunks; ++i) {
        if (i < chunks) {
          const size_t b = i % 2;
          CF_CUDA_CHECK(cudaMemcpyAsync(buf_[b], s + i * kChunk, len(i), cudaMemcpyDeviceToHost, 0), "to");
          CF_CUDA_CHECK(cudaEventRecord(done_[b], 0), "to");
        }
        if (i > 0) {  // drain the previous chunk while this one is in flight
          const size_t b = (i - 1) % 2;
          CF_CUDA_CHECK(cudaEventSynchronize(done_[b]), "to");
          std::memcpy(d + (i - 1) * kChunk, buf_[b], len(i - 1));
        }
      }
    }
  }

 private:
  void init() {
    if (buf_[0]) return;
    for (int b = 0; b < 2; ++b) {
      CF_CUDA_CHECK(cudaMallocHost(&buf_[b], kChunk), "to");
      CF_CUDA_CHECK(cudaEventCreateWithFlags(&done_[b], cudaEventDisableTiming), "to");
      CF_CUDA_CHECK(cudaEventRecord(done_[b], 0), "to");
    }
  }
  std::mutex mu_;
  void* buf_[2] = {nullptr, nullptr};
  cudaEvent_t done_[2] = {};
};

}  // namespace

Allocator& cuda_allocator(Device d) {
  cuda::check_device(d, "allocate");
  static std::mutex mu;
  static std::vector<CudaAllocator*>* allocs = new std::vector<CudaAllocator*>();  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
  if (allocs->empty())
    for (int i = 0; i < cuda::device_count(); ++i) allocs->push_back(new CudaAllocator(i));
  return *(*allocs)[size_t(d.index)];
}

namespace cuda {
std::shared_ptr<GraphPool> make_graph_pool(Device d) {
  check_device(d, "cuda::Graph");
  auto pool = std::make_shared<GraphPool>();
  pool->device = d.index;
  return pool;
}
void retire_graph_pool(const std::shared_ptr<GraphPool>& pool) {
  if (pool) static_cast<CudaAllocator&>(cuda_allocator(Device::cuda(pool->device))).retire(pool);
}
int64_t graph_pool_allocations(const GraphPool& pool) { return pool.allocations; }
bool graph_pool_owns(const GraphPool& pool, const void* block) {
  return static_cast<CudaAllocator&>(cuda_allocator(Device::cuda(pool.device))).owns(pool, block);
}
}  // namespace cuda
#endif

#ifndef CF_WITH_CUDA
void fill_device(void*, Device device, const void*, size_t, int64_t, const char* op) {
  cuda::check_device(device, op);
}
void arange_device(void*, Device device, DType, int64_t, const char* op) { cuda::check_device(device, op); }
#endif

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n,
                const char* op) {
  if (n == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, n);
    return;
  }
#ifdef CF_WITH_CUDA
  cuda::check_device(dst_device, op);
  cuda::check_device(src_device, op);
  if (dst_device.is_cuda() && src_device.is_cuda()) {
    // (queued like a kernel: cudaMemcpy between device buffers does not make the host wait either)
    CF_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, cuda::stream()), op);
    return;
  }
  CF_CHECK(!cuda::capturing(), DeviceError, "[", op, "] copies ", n, " bytes from ", src_device, " to ", dst_device,
           " while this thread captures a CUDA graph: a captured step cannot read or write host memory (inputs go "
           "into device tensors the step reads, copied there before each replay)");
  cuda::set_device(dst_device.is_cuda() ? dst_device : src_device, op);
  cuda::count_transfer(dst_device.is_cpu(), n);
  if (n < PinnedStaging::kChunk) {
    CF_CUDA_CHECK(cudaMemcpy(dst, src, n, dst_device.is_cuda() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost),
                  op);
  } else {
    static PinnedStaging* staging = new PinnedStaging();  // never destroyed: pinned memory lives to exit
    staging->copy(dst, dst_device, src, n);
  }
  // A value read back to the host: the deferred checks queued before it have run,
  // and a failed one is reported here instead of the value.
  if (dst_device.is_cpu()) cuda::check_errors();
#else
  cuda::check_device(dst_device.is_cuda() ? dst_device : src_device, op);
#endif
}

}  // namespace cf
