#include "autograd/registry.h"

#include "autograd/op_names.h"
#include "core/device.h"

namespace cf {

const std::vector<OpInfo>& op_registry() {
  // Every op has a CUDA kernel in a CUDA build (one parity case each, in its
  // family's tests/ops file).
  const bool c = cuda_built();
#define CF_OP_REGISTRY_ENTRY(name, differentiable) {opname::name, differentiable, c},
  static const std::vector<OpInfo> ops = {CF_OP_LIST(CF_OP_REGISTRY_ENTRY)};
#undef CF_OP_REGISTRY_ENTRY
  return ops;
}
const OpInfo* find_op(const std::string& name) {
  for (const OpInfo& op : op_registry())
    if (name == op.name) return &op;
  return nullptr;
}

}  // namespace cf
