#include "nn/table_cache.h"

#include <algorithm>
#include <cstddef>

#include "core/cuda_graph.h"

namespace cf {
namespace nn {

std::vector<Tensor> DeviceTableCache::get(const std::vector<int64_t>& key, Device device,
                                          const std::function<std::vector<Tensor>()>& build) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].key == key && entries_[i].device == device) {
      std::rotate(entries_.begin(), entries_.begin() + std::ptrdiff_t(i), entries_.begin() + std::ptrdiff_t(i) + 1);
      for (const Tensor& t : entries_.front().tables) cuda::keep_for_graph(t);  // (it may drop them first)
      return entries_.front().tables;
    }
  std::vector<Tensor> tables = build();
  for (Tensor& t : tables)
    if (t.defined()) t = t.to(device);
  if (entries_.size() == kEntries) entries_.pop_back();  // the least recently used
  entries_.insert(entries_.begin(), Entry{key, device, tables});
  return tables;
}

}  // namespace nn
}  // namespace cf
