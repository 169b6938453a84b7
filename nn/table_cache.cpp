#include "nn/table_cache.h"

namespace cf {
namespace nn {

std::vector<Tensor> DeviceTableCache::get(const std::vector<int64_t>& key, Device device,
                                          const std::function<std::vector<Tensor>()>& build) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!built_ || key != key_ || device != device_) {
    std::vector<Tensor> tables = build();
    for (Tensor& t : tables)
      if (t.defined()) t = t.to(device);
    tables_ = std::move(tables);
    key_ = key;
    device_ = device;
    built_ = true;
  }
  return tables_;
}

}  // namespace nn
}  // namespace cf
