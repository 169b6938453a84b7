#pragma once
// Per-device allocators with live/peak byte counters. Peak bytes are the memory
// figure every benchmark reports (DESIGN.md section 2).
#include <cstddef>
#include <cstdint>

#include "core/device.h"

namespace cf {

struct MemoryStats {
  int64_t live_bytes = 0;    // bytes handed out and not yet returned
  int64_t peak_bytes = 0;    // maximum of live_bytes since the last reset_peak_memory
  int64_t cached_bytes = 0;  // bytes held by a caching allocator but not in use
  int64_t num_allocs = 0;    // allocations served since start
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* p, size_t nbytes) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual void empty_cache() {}
};

// The allocator serving a device; throws DeviceError for a device this build lacks.
Allocator& allocator_for(Device d);

MemoryStats memory_stats(Device d = Device::cpu());
void reset_peak_memory(Device d = Device::cpu());
void empty_cache(Device d = Device::cpu());

}  // namespace cf
