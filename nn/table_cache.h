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

// The device copies of the host tables `build` returns, rebuilt on first use and
// whenever the key (the sizes they depend on) or the device changes, else reused.
// One entry: a module alternating between sizes rebuilds each time. Thread-safe;
// a module holds one per set of tables.
class DeviceTableCache {
 public:
  std::vector<Tensor> get(const std::vector<int64_t>& key, Device device,
                          const std::function<std::vector<Tensor>()>& build);

 private:
  std::mutex mu_;
  std::vector<int64_t> key_;
  Device device_ = Device::cpu();
  bool built_ = false;
  std::vector<Tensor> tables_;
};

}  // namespace nn
}  // namespace cf
