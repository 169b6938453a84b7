#pragma once
// Index and mask tables that depend on sizes alone (the local heads' windows,
// SparseAttention's fixed pattern, Cluster-Former's window and eq. 4 orders) are
// built on the host once and kept on the device, so that a forward on CUDA
// copies nothing from the host (issue 25).
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "core/tensor.h"

namespace cf {
namespace nn {

// The device copies of the host tables `build` returns for a key (the sizes they
// depend on) and a device: built on first use, then reused. It keeps the
// kEntries most recently used keys, so that batches of a few different lengths
// (a padded-to-the-longest loader) do not rebuild, and so upload, the tables on
// every change of length. Thread-safe; a module holds one per set of tables.
class DeviceTableCache {
 public:
  static constexpr size_t kEntries = 8;
  std::vector<Tensor> get(const std::vector<int64_t>& key, Device device,
                          const std::function<std::vector<Tensor>()>& build);

 private:
  struct Entry {
    std::vector<int64_t> key;
    Device device;
    std::vector<Tensor> tables;
  };
  std::mutex mu_;
  std::vector<Entry> entries_;  // most recently used first
};

}  // namespace nn
}  // namespace cf
