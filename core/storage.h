#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/allocator.h"
#include "core/device.h"

namespace cf {

// A block of device memory. Views share one Storage, and with it the version
// counter that detects in-place changes to tensors saved for backward.
struct Storage {
  Storage(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  std::atomic<int64_t> version{0};
};

}  // namespace cf
