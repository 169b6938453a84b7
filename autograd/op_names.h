#pragma once
// The one list of ops: each op's name is written here once. X(name, differentiable)
// expands to the registry's entries (autograd/registry.cpp) and to the constants
// cf::opname::<name>, which the ops record as their autograd node names and put
// in their errors, and which the tests' GRADCHECK_CASE / PARITY_CASE macros and
// the Python bindings take, so a misspelt name does not compile.
// differentiable = false: the outputs are indices, masks or samples.
#include <cstddef>

#define CF_OP_LIST(X) \
  /* elementwise */ \
  X(add, true) X(sub, true) X(mul, true) X(div, true) X(floor_divide, false) X(remainder, true) X(pow, true) \
  X(maximum, true) X(minimum, true) \
  X(where, true) X(neg, true) X(abs, true) X(square, true) X(exp, true) X(log, true) X(sqrt, true) \
  X(rsqrt, true) X(sin, true) X(cos, true) X(tanh, true) X(sigmoid, true) X(relu, true) X(gelu, true) \
  X(leaky_relu, true) X(reciprocal, true) X(log1p, true) X(expm1, true) X(erf, true) X(clamp, true) \
  X(to, true) X(clone, true) X(eq, false) X(ne, false) X(lt, false) X(le, false) X(gt, false) X(ge, false) \
  X(logical_and, false) X(logical_or, false) X(logical_not, false) X(sign, false) X(floor, false) X(ceil, false) \
  X(round, false) X(trunc, false) \
  /* reductions */ \
  X(sum, true) X(mean, true) X(var, true) X(logsumexp, true) X(amax, true) X(amin, true) X(max, true) \
  X(min, true) X(argmax, false) X(argmin, false) \
  /* scans */ \
  X(cumsum, true) \
  /* linear algebra */ \
  X(matmul, true) X(linear, true) \
  /* shape */ \
  X(reshape, true) X(permute, true) X(slice, true) X(expand, true) X(cat, true) X(stack, true) X(pad, true) \
  /* indexing */ \
  X(gather, true) X(scatter, true) X(scatter_add, true) X(index_select, true) X(index_add, true) X(take_along_dim, true) \
  X(masked_fill, true) X(one_hot, false) \
  /* sorting */ \
  X(sort, true) X(topk, true) X(argsort, false) X(searchsorted, false) \
  /* fused layers */ \
  X(softmax, true) X(log_softmax, true) X(layer_norm, true) X(cross_entropy, true) X(dropout, true) \
  X(l2_normalize, true) \
  /* fused attention */ \
  X(flash_attention, true) X(block_attention, true) X(routed_attention, true) \
  /* sparse products (improved clustered attention) */ \
  X(sparse_dot, true) X(sparse_weighted_sum, true) X(cluster_topk_attention, true) \
  /* clustering */ \
  X(hash_codes, false) X(hamming_kmeans, false) X(clustering_loss, true) X(centroid_sorting_loss, true) \
  X(commitment_loss, true) X(cluster_means, true) \
  /* point sets (centroid attention) */ \
  X(farthest_point_sampling, false) X(group_max, false) \
  /* random */ \
  X(rand, false) X(randn, false) X(randint, false) X(bernoulli, false)

namespace cf::opname {
#define CF_OP_NAME_CONSTANT(name, differentiable) inline constexpr char name[] = #name;
CF_OP_LIST(CF_OP_NAME_CONSTANT)
#undef CF_OP_NAME_CONSTANT
}  // namespace cf::opname

namespace cf {
#define CF_OP_COUNT_ONE(name, differentiable) +1
inline constexpr std::size_t kOpCount = 0 CF_OP_LIST(CF_OP_COUNT_ONE);
#undef CF_OP_COUNT_ONE
}  // namespace cf
