#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "core/allocator.h"
#include "core/device.h"

namespace cf {

// A block of device memory. Views share one Storage, and with it the version
// counter that detects in-place changes to tensors saved for backward.
struct Storage {
  // nbytes from the device's allocator.
  Storage(size_t nbytes, Device device);
  // Memory owned by someone else (a DLPack producer such as NumPy or PyTorch):
  // cf reads and writes it in place and calls `release` once when the last view
  // goes away. Not counted by memory_stats().
  Storage(void* data, size_t nbytes, Device device, std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  std::atomic<int64_t> version{0};
  std::function<void()> release;  // set for borrowed memory: called instead of the allocator
};

}  // namespace cf
