#include "nn/attention/full.h"

#include <cmath>

#include "autograd/ops/attention.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/nn_functional.h"
#include "autograd/ops/shape.h"
#include "core/error.h"

namespace cf {
namespace nn {

Tensor dense_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& blocked, double scale,
                       double dropout_p, bool training, Generator& gen) {
  // Scale q (N x d) rather than the scores (N x N): one pass over the smaller tensor.
  Tensor scores = matmul(q * scale, transpose(k, -2, -1));
  if (blocked.defined()) {
    // (a misfit mask failed inside [masked_fill], naming neither this op nor the scores' axes)
    const Shape& s = scores.shape();
    CF_CHECK(blocked.dtype() == kBool && broadcasts_to(blocked.shape(), s), ShapeError, "[dense_attention] blocked must be bool broadcastable to the scores (B, H, Nq, Nk) = ",
             shape_str(s), ", got ", blocked.describe());
    scores = masked_fill(scores, blocked, -INFINITY);
  }
  Tensor w = softmax(scores, -1);
  if (training && dropout_p > 0) w = dropout(w, dropout_p, true, gen);
  return matmul(w, v);
}

FullAttention::FullAttention(double dropout, double scale) : dropout_(dropout), scale_(scale) {
  CF_CHECK(dropout >= 0 && dropout < 1, ValueError, "[FullAttention] dropout must be in [0, 1), got ", dropout);
  CF_CHECK(scale >= 0, ValueError, "[FullAttention] scale must be >= 0 (0: 1/sqrt(d_k)), got ", scale);
}

std::shared_ptr<Attention> FullAttention::create(const AttentionSpec& spec) {
  const Config& o = spec.options;
  double dropout = o.get<double>("dropout", 0.0);
  double scale = o.get<double>("scale", 0.0);
  o.finish();
  return std::make_shared<FullAttention>(dropout, scale);
}

Tensor FullAttention::forward(const AttentionArgs& a) {
  check_attention_args(a, "FullAttention");
  double scale = scale_ > 0 ? scale_ : 1.0 / std::sqrt(double(a.q.shape()[3]));
  const double drop = is_training() ? dropout_ : 0.0;
  // The fused kernel (FlashAttention-2): no (Nq, Nk) matrix, O(N d) memory; it drops the weights
  // inside its tiles (or rows, on CUDA) on both devices.
  return flash_attention(a.q, a.k, a.v, a.key_padding_mask, scale, a.causal, drop);
}

}  // namespace nn
}  // namespace cf
