#pragma once
// The one list of ops. Tests walk it: every differentiable op must have a
// gradcheck case, and (with the CUDA backend) a CUDA parity case.
#include <string>
#include <vector>

namespace cf {

struct OpInfo {
  const char* name;     // also the name of the autograd node the op records
  bool differentiable;  // false: outputs are indices, masks or samples
  bool cuda;            // has a CUDA kernel in this build
};

const std::vector<OpInfo>& op_registry();
// nullptr when no op has that name.
const OpInfo* find_op(const std::string& name);

}  // namespace cf
