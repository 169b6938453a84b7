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

// The dict with every defined tensor copied to the CPU: what save_checkpoint and save_safetensors take
// (a model or optimizer on CUDA hands out CUDA tensors). Module::load_state_dict and
// Optimizer::load_state_dict take such a CPU dict back on any device.
inline StateDict state_on_cpu(StateDict dict) {
  for (auto& e : dict)
    if (e.second.defined()) e.second = e.second.cpu();
  return dict;
}

// dst = src, src from any device (a CPU checkpoint's entry into a CUDA parameter or optimizer slot): copied
// to dst's device first, one tensor at a time. The loading half of state_on_cpu.
void copy_from_any_device(Tensor& dst, const Tensor& src);

}  // namespace nn
}  // namespace cf
