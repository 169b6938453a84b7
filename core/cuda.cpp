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
  std::atomic<int64_t> d2h{0}, d2h_bytes{0}, h2d{0}, h2d_bytes{0}, syncs{0};
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
  return s;
}

void reset_transfer_stats() {
  TransferCounters& c = counters();
  c.d2h = 0;
  c.d2h_bytes = 0;
  c.h2d = 0;
  c.h2d_bytes = 0;
  c.syncs = 0;
}

TransferStats operator-(const TransferStats& b, const TransferStats& a) {
  TransferStats d;
  d.device_to_host = b.device_to_host - a.device_to_host;
  d.device_to_host_bytes = b.device_to_host_bytes - a.device_to_host_bytes;
  d.host_to_device = b.host_to_device - a.host_to_device;
  d.host_to_device_bytes = b.host_to_device_bytes - a.host_to_device_bytes;
  d.synchronizations = b.synchronizations - a.synchronizations;
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

void check_launch(const char* op) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw_cuda_error(err, op, "kernel launch");
  if (sync_debug()) {
    err = cudaDeviceSynchronize();
    if (err != cudaSuccess) throw_cuda_error(err, op, "kernel execution (CF_CUDA_SYNC_DEBUG)");
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
}

#else

int device_count() { return 0; }
void synchronize() {}

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
    return;
  }
  static PinnedStaging* staging = new PinnedStaging();  // never destroyed: pinned memory lives to exit
  staging->copy(dst, dst_device, src, n);
#else
  cuda::check_device(dst_device.is_cuda() ? dst_device : src_device, op);
#endif
}

}  // namespace cf
