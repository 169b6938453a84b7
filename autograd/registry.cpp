#include "autograd/registry.h"

namespace cf {

const std::vector<OpInfo>& op_registry() {
  static const std::vector<OpInfo> ops = {
      // elementwise
      {"add", true, false}, {"sub", true, false}, {"mul", true, false}, {"div", true, false},
      {"pow", true, false}, {"maximum", true, false}, {"minimum", true, false},
      {"where", true, false}, {"neg", true, false}, {"abs", true, false}, {"square", true, false},
      {"exp", true, false}, {"log", true, false}, {"sqrt", true, false}, {"rsqrt", true, false},
      {"sin", true, false}, {"cos", true, false}, {"tanh", true, false}, {"sigmoid", true, false},
      {"relu", true, false}, {"gelu", true, false}, {"leaky_relu", true, false},
      {"reciprocal", true, false}, {"log1p", true, false}, {"expm1", true, false},
      {"erf", true, false}, {"clamp", true, false}, {"to", true, false}, {"clone", true, false},
      {"eq", false, false}, {"ne", false, false}, {"lt", false, false}, {"le", false, false},
      {"gt", false, false}, {"ge", false, false}, {"logical_and", false, false},
      {"logical_or", false, false}, {"logical_not", false, false}, {"sign", false, false},
      // reductions
      {"sum", true, false}, {"mean", true, false}, {"var", true, false},
      {"logsumexp", true, false}, {"amax", true, false}, {"amin", true, false},
      {"max", true, false}, {"min", true, false}, {"argmax", false, false},
      {"argmin", false, false},
      // linear algebra
      {"matmul", true, false},
      // shape
      {"reshape", true, false}, {"permute", true, false}, {"slice", true, false},
      {"expand", true, false}, {"cat", true, false}, {"stack", true, false},
      {"pad", true, false},
      // indexing
      {"gather", true, false}, {"scatter_add", true, false}, {"index_select", true, false},
      {"index_add", true, false}, {"take_along_dim", true, false},
      {"masked_fill", true, false}, {"one_hot", false, false},
      // sorting
      {"sort", true, false}, {"topk", true, false}, {"argsort", false, false},
      // fused layers
      {"softmax", true, false}, {"log_softmax", true, false}, {"layer_norm", true, false},
      {"cross_entropy", true, false}, {"dropout", true, false},
      // random
      {"rand", false, false}, {"randn", false, false}, {"randint", false, false},
      {"bernoulli", false, false},
  };
  return ops;
}

const OpInfo* find_op(const std::string& name) {
  for (const OpInfo& op : op_registry())
    if (name == op.name) return &op;
  return nullptr;
}

}  // namespace cf
