#include "autograd/registry.h"

#include "core/device.h"

namespace cf {

const std::vector<OpInfo>& op_registry() {
  // Every op has a CUDA kernel in a CUDA build (tests/cuda: one parity case each).
  const bool c = cuda_built();
  static const std::vector<OpInfo> ops = {
      // elementwise
      {"add", true, c}, {"sub", true, c}, {"mul", true, c}, {"div", true, c},
      {"pow", true, c}, {"maximum", true, c}, {"minimum", true, c},
      {"where", true, c}, {"neg", true, c}, {"abs", true, c}, {"square", true, c},
      {"exp", true, c}, {"log", true, c}, {"sqrt", true, c}, {"rsqrt", true, c},
      {"sin", true, c}, {"cos", true, c}, {"tanh", true, c}, {"sigmoid", true, c},
      {"relu", true, c}, {"gelu", true, c}, {"leaky_relu", true, c},
      {"reciprocal", true, c}, {"log1p", true, c}, {"expm1", true, c},
      {"erf", true, c}, {"clamp", true, c}, {"to", true, c}, {"clone", true, c},
      {"eq", false, c}, {"ne", false, c}, {"lt", false, c}, {"le", false, c},
      {"gt", false, c}, {"ge", false, c}, {"logical_and", false, c},
      {"logical_or", false, c}, {"logical_not", false, c}, {"sign", false, c},
      // reductions
      {"sum", true, c}, {"mean", true, c}, {"var", true, c},
      {"logsumexp", true, c}, {"amax", true, c}, {"amin", true, c},
      {"max", true, c}, {"min", true, c}, {"argmax", false, c},
      {"argmin", false, c},
      // linear algebra
      {"matmul", true, c},
      // shape
      {"reshape", true, c}, {"permute", true, c}, {"slice", true, c},
      {"expand", true, c}, {"cat", true, c}, {"stack", true, c},
      {"pad", true, c},
      // indexing
      {"gather", true, c}, {"scatter_add", true, c}, {"index_select", true, c},
      {"index_add", true, c}, {"take_along_dim", true, c},
      {"masked_fill", true, c}, {"one_hot", false, c},
      // sorting
      {"sort", true, c}, {"topk", true, c}, {"argsort", false, c},
      // fused layers
      {"softmax", true, c}, {"log_softmax", true, c}, {"layer_norm", true, c},
      {"cross_entropy", true, c}, {"dropout", true, c},
      // fused attention
      {"flash_attention", true, c}, {"block_attention", true, c},
      // sparse products (improved clustered attention)
      {"sparse_dot", true, c}, {"sparse_weighted_sum", true, c},
      // clustering
      {"hash_codes", false, c}, {"hamming_kmeans", false, c},
      // point sets (centroid attention)
      {"farthest_point_sampling", false, c}, {"group_max", false, c},
      // random
      {"rand", false, c}, {"randn", false, c}, {"randint", false, c},
      {"bernoulli", false, c},
  };
  return ops;
}

const OpInfo* find_op(const std::string& name) {
  for (const OpInfo& op : op_registry())
    if (name == op.name) return &op;
  return nullptr;
}

}  // namespace cf
