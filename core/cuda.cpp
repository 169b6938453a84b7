#include "core/cuda.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
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

void count_launch() { ++counters().launches; }

namespace {
// True while this thread runs a deferred check's launch under the record's lock:
// check_launch must not read the record then (defer_check reads it right after).
thread_local bool t_in_check_launch = false;
}  // namespace

void check_launch(const char* op) {
  count_launch();
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw_cuda_error(err, op, "kernel launch");
  if (sync_debug()) {
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

}  // namespace

void defer_check(Device d, RaiseCheck raise, const char* op, const std::function<void(CheckSlot*)>& launch) {
  check_device(d, op);
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
        const cudaError_t err = cudaMemcpy(p, unused_slots().data(), bytes, cudaMemcpyHostToDevice);
        if (err != cudaSuccess) {
          (void)cudaFree(p);
          throw_cuda_error(err, op, "cudaMemcpy of the check record");
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
        r.pending.push_back({d.index, r.used[dev], std::move(raise)});
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
  std::vector<DeferredChecks::Pending> pending;
  std::vector<std::vector<CheckSlot>> read(r.slots.size());
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
    CF_CUDA_CHECK(cudaSetDevice(current), "check_errors");
  }
  for (const DeferredChecks::Pending& p : pending) {
    const CheckSlot& s = read[size_t(p.device)][size_t(p.slot)];
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
  ++counters().syncs;
  CF_CUDA_CHECK(cudaDeviceSynchronize(), "synchronize");
  check_errors();
}

#else

int device_count() { return 0; }
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
namespace {

// Caching allocator for one CUDA device. cudaMalloc and cudaFree synchronise
// the device and cost tens of microseconds, so freed blocks are kept by size
// class and handed out again (all cf work runs on the default stream, so a
// block freed by the host is free for any later kernel). Size classes: 512-byte
// steps below 1 MiB, 8 classes per power of two above (at most 12.5% slack).
// Counters count the bytes asked for, like the CPU allocator.
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int index) : index_(index) {}

  void* allocate(size_t nbytes) override {
    const size_t cls = size_class(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    void* p = nullptr;
    auto it = cache_.find(cls);
    if (it != cache_.end()) {
      p = it->second;
      cache_.erase(it);
      cached_ -= cls;
    } else {
      cuda::set_device(Device::cuda(index_), "allocate");
      cudaError_t err = cudaMalloc(&p, cls);
      if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        release_cache_locked();  // give cached blocks back, then try once more
        err = cudaMalloc(&p, cls);
      }
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        throw DeviceError(str("[allocate] cannot allocate ", nbytes, " bytes on cuda:", index_, ": ",
                              cudaGetErrorString(err), " (live ", live_, " bytes, cached ", cached_,
                              " bytes)"));
      }
    }
    live_ += int64_t(nbytes);
    if (live_ > peak_) peak_ = live_;
    ++count_;
    return p;
  }
  void deallocate(void* p, size_t nbytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    live_ -= int64_t(nbytes);
    const size_t cls = size_class(nbytes);
    cache_.emplace(cls, p);
    cached_ += cls;
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
  void release_cache_locked() {
    if (cache_.empty()) return;
    cuda::set_device(Device::cuda(index_), "empty_cache");
    // Blocks may still be read by queued kernels: wait before freeing them.
    CF_CUDA_CHECK(cudaDeviceSynchronize(), "empty_cache");
    for (auto& e : cache_) (void)cudaFree(e.second);
    cache_.clear();
    cached_ = 0;
  }

  int index_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cache_;
  size_t cached_ = 0;
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
    CF_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice), op);
    return;
  }
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
