#pragma once
// Named tensors in a fixed order: the currency between modules, optimizers and
// checkpoint files. Order is insertion order, so a state dict written and read
// back lists its entries in the same order.
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace cf {
namespace nn {

using NamedTensor = std::pair<std::string, Tensor>;
using StateDict = std::vector<NamedTensor>;

// The entry called `name`, or nullptr.
inline const Tensor* find_entry(const StateDict& dict, const std::string& name) {
  for (const auto& e : dict)
    if (e.first == name) return &e.second;
  return nullptr;
}

}  // namespace nn
}  // namespace cf
