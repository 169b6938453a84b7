#include "core/allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include "core/error.h"

namespace cf {
namespace {

// 64-byte aligned CPU allocator; counters are atomics so worker threads may allocate.
// Alignment is done by hand on top of malloc (the raw pointer is stored just
// before the aligned block): glibc's aligned_alloc splits chunks, which makes
// every free take the slow path, and tiny tensors are allocated constantly.
constexpr size_t kAlign = 64;

// Large blocks (>= kCacheMin) are cached on free and reused by a later request
// of the same size class. malloc hands large blocks out as fresh mmap'd pages and
// unmaps them on free, so every large tensor paid a page fault per 4 KiB on
// first touch: 20% of a Transformer training step at N = 2048 was the kernel
// clearing pages (perf). Size classes are 8 per power of two (at most 12.5%
// slack); the cache holds at most kCacheCap bytes (beyond, a freed block goes
// back to malloc); empty_cache() releases it all. Under AddressSanitizer the
// cache is off, so a use after free of a large tensor is still reported.
// From 64 KiB, below glibc's default mmap threshold (128 KiB): with 1 MiB, the
// (2, 4, 128, 128) scores of one attention call (512 KiB) and their gradients
// were faulted in afresh every call, 24% of its forward + backward (perf).
constexpr size_t kCacheMin = size_t(64) << 10;
constexpr size_t kCacheCap = size_t(2) << 30;
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCacheLarge = false;
#else
constexpr bool kCacheLarge = true;
#endif

size_t size_class(size_t n) {
  size_t top = size_t(1) << (63 - __builtin_clzll(n));  // highest power of two <= n
  size_t step = std::max<size_t>(top / 8, kAlign);
  return (n + step - 1) / step * step;
}

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    void* p = nbytes >= kCacheMin && kCacheLarge ? take_cached(size_class(nbytes)) : nullptr;
    if (!p) p = fresh(nbytes >= kCacheMin && kCacheLarge ? size_class(nbytes) : nbytes);
    raise_peak(live_.fetch_add(int64_t(nbytes)) + int64_t(nbytes));
    count_.fetch_add(1);
    return p;
  }
  void deallocate(void* p, size_t nbytes) override {
    live_.fetch_sub(int64_t(nbytes));
    if (nbytes >= kCacheMin && kCacheLarge) {
      const size_t cls = size_class(nbytes);
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + cls <= kCacheCap) {
        cache_.emplace(cls, p);
        cached_ += cls;
        return;
      }
    }
    std::free(static_cast<void**>(p)[-1]);
  }
  MemoryStats stats() const override {
    MemoryStats s;
    s.live_bytes = live_.load();
    // (an allocation in another thread may have raised live_ and not yet peak_)
    s.peak_bytes = std::max(peak_.load(), s.live_bytes);
    s.num_allocs = count_.load();
    std::lock_guard<std::mutex> lock(mu_);
    s.cached_bytes = int64_t(cached_);
    return s;
  }
  void reset_peak() override {
    peak_.store(live_.load());
    raise_peak(live_.load());  // an allocation between the load and the store raised live_ past it
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& e : cache_) std::free(static_cast<void**>(e.second)[-1]);
    cache_.clear();
    cached_ = 0;
  }

 private:
  static void* fresh(size_t nbytes) {
    void* raw = std::malloc(std::max<size_t>(nbytes, 1) + kAlign);
    if (!raw) throw Error(str("[allocate] out of CPU memory allocating ", nbytes, " bytes"));
    uintptr_t aligned = (reinterpret_cast<uintptr_t>(raw) + kAlign) & ~uintptr_t(kAlign - 1);
    void* p = reinterpret_cast<void*>(aligned);
    static_cast<void**>(p)[-1] = raw;
    return p;
  }
  void* take_cached(size_t cls) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(cls);
    if (it == cache_.end()) return nullptr;
    void* p = it->second;
    cache_.erase(it);
    cached_ -= cls;
    return p;
  }

  void raise_peak(int64_t live) {
    int64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
  }
  std::atomic<int64_t> live_{0}, peak_{0}, count_{0};
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cache_;  // size class -> aligned block
  size_t cached_ = 0;
};

}  // namespace

#ifdef CF_WITH_CUDA
Allocator& cuda_allocator(Device d);  // core/cuda.cpp
#endif

Allocator& allocator_for(Device d) {
  static CpuAllocator* cpu = new CpuAllocator();  // never destroyed: tensors may outlive statics
  if (d.is_cpu()) return *cpu;
#ifdef CF_WITH_CUDA
  return cuda_allocator(d);
#else
  throw DeviceError(str("[allocate] device ", d, " is not available: this build has no CUDA backend"));
#endif
}

MemoryStats memory_stats(Device d) { return allocator_for(d).stats(); }
void reset_peak_memory(Device d) { allocator_for(d).reset_peak(); }
void empty_cache(Device d) { allocator_for(d).empty_cache(); }

bool cuda_built() {
#ifdef CF_WITH_CUDA
  return true;
#else
  return false;
#endif
}

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  // (at most 9 digits: the index fits an int; a longer one failed with std::stoi's bare "stoi")
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 && s.size() <= 14 &&
      s.find_first_not_of("0123456789", 5) == std::string::npos)
    return cuda(std::stoi(s.substr(5)));
  throw ValueError(cf::str("[device] cannot parse device '", s, "': expected cpu, cuda or cuda:N"));
}

}  // namespace cf
