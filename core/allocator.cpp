#include "core/allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "core/error.h"

namespace cf {
namespace {

// 64-byte aligned CPU allocator; counters are atomics so worker threads may allocate.
// Alignment is done by hand on top of malloc (the raw pointer is stored just
// before the aligned block): glibc's aligned_alloc splits chunks, which makes
// every free take the slow path, and tiny tensors are allocated constantly.
constexpr size_t kAlign = 64;

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    void* raw = std::malloc(std::max<size_t>(nbytes, 1) + kAlign);
    if (!raw) throw Error(str("[allocate] out of CPU memory allocating ", nbytes, " bytes"));
    uintptr_t aligned = (reinterpret_cast<uintptr_t>(raw) + kAlign) & ~uintptr_t(kAlign - 1);
    void* p = reinterpret_cast<void*>(aligned);
    static_cast<void**>(p)[-1] = raw;
    int64_t live = live_.fetch_add(int64_t(nbytes)) + int64_t(nbytes);
    int64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    count_.fetch_add(1);
    return p;
  }
  void deallocate(void* p, size_t nbytes) override {
    std::free(static_cast<void**>(p)[-1]);
    live_.fetch_sub(int64_t(nbytes));
  }
  MemoryStats stats() const override {
    MemoryStats s;
    s.live_bytes = live_.load();
    s.peak_bytes = peak_.load();
    s.num_allocs = count_.load();
    return s;
  }
  void reset_peak() override { peak_.store(live_.load()); }

 private:
  std::atomic<int64_t> live_{0}, peak_{0}, count_{0};
};

}  // namespace

Allocator& allocator_for(Device d) {
  static CpuAllocator* cpu = new CpuAllocator();  // never destroyed: tensors may outlive statics
  if (d.is_cpu()) return *cpu;
  throw DeviceError(str("[allocate] device ", d, " is not available: ",
                        cuda_built() ? "no such CUDA device" : "this build has no CUDA backend"));
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
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 &&
      s.find_first_not_of("0123456789", 5) == std::string::npos)
    return cuda(std::stoi(s.substr(5)));
  throw ValueError(cf::str("[device] cannot parse device '", s, "': expected cpu, cuda or cuda:N"));
}

}  // namespace cf
