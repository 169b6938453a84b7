#pragma once
// Autocast (mixed precision), PyTorch's torch.autocast for cf: within the scope of an
// AutocastGuard, the ops below run in the chosen low-precision dtype or in float32
// whatever dtype their inputs have. The casts are ordinary differentiable cf::to nodes,
// so the gradient of a float32 parameter comes back in float32. Per-op policy
// (docs/design-notes.md, "Autocast"):
//   low dtype:  matmul and linear (nn::Linear, with its bias; every attention's score and
//               value products, bmm-style batched products) -- the tensor-core work;
//   float32:    softmax, log_softmax, layer_norm, l2_normalize, cross_entropy, clustering_loss,
//               centroid_sorting_loss, commitment_loss, cluster_means, cluster_topk_attention, sum,
//               mean, var, logsumexp
//               (statistics whose error would grow with the row length); flash and block
//               attention take 16-bit q, k, v on CUDA's tensor cores where those take the
//               shapes and no dropout is asked for, and float32 copies otherwise (always on
//               the CPU, and routed attention always): autograd/ops/attention.h;
//   unchanged:  everything else (elementwise ops follow dtype promotion: a bfloat16 product
//               plus a float32 bias is float32).
// Nesting restores the outer policy; AutocastGuard(std::nullopt) turns autocast off inside.
// The policy is per thread, like grad mode.
#include <optional>

#include "core/dtype.h"

namespace cf {

// The active autocast dtype of this thread (bfloat16 or float16), or nullopt.
std::optional<DType> autocast_dtype();
void set_autocast_dtype(std::optional<DType> dtype);

class AutocastGuard {
 public:
  // dtype must be kBFloat16 or kFloat16 (DTypeError otherwise); nullopt disables autocast.
  explicit AutocastGuard(std::optional<DType> dtype);
  ~AutocastGuard() { set_autocast_dtype(prev_); }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  std::optional<DType> prev_;
};

class Tensor;
namespace autocast {
// x cast to the autocast dtype when autocast is on and x is float32 or the other 16-bit dtype
// (matmul's inputs); x itself otherwise.
Tensor to_low(const Tensor& x);
// x cast to float32 when autocast is on and x is bfloat16/float16 (the float32 ops' inputs).
Tensor to_float32(const Tensor& x);
}  // namespace autocast

}  // namespace cf
