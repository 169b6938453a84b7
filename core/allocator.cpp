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
// of the same size class, or by a smaller one the block exceeds by at most 25%. malloc
// hands large blocks out as fresh mmap'd pages and unmaps them on free, so every
// large tensor paid a page fault per 4 KiB on first touch: 20% of a Transformer
// training step at N = 2048 was the kernel clearing pages (perf). Size classes are
// 8 per power of two (at most 12.5% slack). The cache holds at most the larger of
// kCacheFloor and the most bytes tensors ever held at once (what a repeated step
// needs back; plus 1/8 for the classes' rounding), and never more than kCacheCap; a block that does not fit evicts the
// oldest cached ones. (Without that bound a training run whose lengths vary kept a
// block of every size it had met: 350 MB cached beside a 35 MB peak in a hunt's
// run.) empty_cache() releases it all. Under AddressSanitizer the cache is off, so
// a use after free of a large tensor is still reported.
// From 64 KiB, below glibc's default mmap threshold (128 KiB): with 1 MiB, the
// (2, 4, 128, 128) scores of one attention call (512 KiB) and their gradients
// were faulted in afresh every call, 24% of its forward + backward (perf).
constexpr size_t kCacheMin = size_t(64) << 10;
constexpr size_t kCacheFloor = size_t(64) << 20;
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
    const bool cacheable = nbytes >= kCacheMin && kCacheLarge;
    void* p = cacheable ? take_cached(size_class(nbytes)) : nullptr;
    if (!p) {
      p = fresh(cacheable ? size_class(nbytes) : nbytes);
      if (cacheable) block_bytes(p) = size_class(nbytes);
    }
    const int64_t live = live_.fetch_add(int64_t(nbytes)) + int64_t(nbytes);
    raise(peak_, live);
    raise(high_water_, live);
    count_.fetch_add(1);
    return p;
  }
  void deallocate(void* p, size_t nbytes) override {
    live_.fetch_sub(int64_t(nbytes));
    if (nbytes >= kCacheMin && kCacheLarge) {
      const size_t cls = block_bytes(p);  // (a cached block may serve a smaller class than its own)
      // (+ 1/8: the blocks' classes round the live bytes up by at most that)
      const size_t hw = size_t(high_water_.load()), budget = std::min(kCacheCap, std::max(kCacheFloor, hw + hw / 8));
      if (cls <= budget) {
        // The evicted blocks are freed after the lock (a large free is an munmap: the other threads'
        // allocations would wait for it).
        // (a fixed array: a free path must not allocate; the rare eviction beyond it frees under the lock)
        void* evicted[16];
        size_t n_evicted = 0;
        {
          std::lock_guard<std::mutex> lock(mu_);
          while (cached_ + cls > budget) {
            void* raw = evict_oldest();
            if (n_evicted < 16)
              evicted[n_evicted++] = raw;
            else
              std::free(raw);
          }
          const auto it = by_size_.emplace(cls, Cached{p, next_seq_});
          by_age_.emplace(next_seq_++, it);
          cached_ += cls;
        }
        for (size_t i = 0; i < n_evicted; ++i) std::free(evicted[i]);
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
    raise(peak_, live_.load());  // an allocation between the load and the store raised live_ past it
  }
  void empty_cache() override {
    BySize blocks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks.swap(by_size_);
      by_age_.clear();
      cached_ = 0;
    }
    for (auto& e : blocks) std::free(static_cast<void**>(e.second.p)[-1]);
  }

 private:
  struct Cached {
    void* p;
    uint64_t seq;  // when it was cached (by_age_'s key)
  };
  using BySize = std::multimap<size_t, Cached>;  // size class -> block

  // The malloc'd address sits just before the aligned block, and a cacheable block's size class before
  // that (malloc's 16-byte alignment leaves at least 16 bytes of room there).
  static void* fresh(size_t nbytes) {
    void* raw = std::malloc(std::max<size_t>(nbytes, 1) + kAlign);
    if (!raw) throw Error(str("[allocate] out of CPU memory allocating ", nbytes, " bytes"));
    uintptr_t aligned = (reinterpret_cast<uintptr_t>(raw) + kAlign) & ~uintptr_t(kAlign - 1);
    void* p = reinterpret_cast<void*>(aligned);
    static_cast<void**>(p)[-1] = raw;
    return p;
  }
  static size_t& block_bytes(void* p) { return static_cast<size_t*>(p)[-2]; }
  // The smallest cached block of class cls or of a class at most 25% larger (about two classes up: reuse
  // across lengths that vary a little), or null.
  void* take_cached(size_t cls) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_size_.lower_bound(cls);
    if (it == by_size_.end() || it->first > cls + cls / 4) return nullptr;
    void* p = it->second.p;
    by_age_.erase(it->second.seq);
    cached_ -= it->first;
    by_size_.erase(it);
    return p;
  }
  // Takes the oldest cached block out of the cache and returns its malloc'd address, for the caller to free
  // once it let go of mu_. (under mu_, with a block cached)
  void* evict_oldest() {
    auto age = by_age_.begin();
    BySize::iterator it = age->second;
    void* raw = static_cast<void**>(it->second.p)[-1];
    cached_ -= it->first;
    by_size_.erase(it);
    by_age_.erase(age);
    return raw;
  }

  static void raise(std::atomic<int64_t>& to, int64_t live) {
    int64_t seen = to.load();
    while (live > seen && !to.compare_exchange_weak(seen, live)) {
    }
  }
  std::atomic<int64_t> live_{0}, peak_{0}, count_{0};
  std::atomic<int64_t> high_water_{0};  // the most bytes ever live at once (peak_ without its resets)
  mutable std::mutex mu_;
  BySize by_size_;
  std::map<uint64_t, BySize::iterator> by_age_;  // oldest first
  uint64_t next_seq_ = 0;
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
