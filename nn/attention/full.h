#pragma once
// Full softmax attention (Vaswani et al. 2017, eq. 1): softmax(Q K^T / sqrt(d_k)) V.
// FullAttention runs the fused flash_attention kernel (autograd/ops/attention.h:
// no (B, H, Nq, Nk) matrix, O(N d) memory), attention-weight dropout in training
// included on both devices. dense_attention materialises the score matrix; it is the
// dense reference of the efficient variants' tests, and draws the same dropout mask.
#include "core/rng.h"
#include "nn/attention/attention.h"

namespace cf {
namespace nn {

// softmax(scale * q k^T, blocked -> -inf) v. `blocked` is bool broadcastable to
// (B, H, Nq, Nk), true = not allowed, or undefined. A row with every key blocked
// gives zeros. Dropout with probability p applies to the attention weights.
Tensor dense_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& blocked, double scale,
                       double dropout_p = 0.0, bool training = false, Generator& gen = default_generator());

// Options (JSON): {"dropout": attention-weight dropout in [0, 1), default 0;
//                  "scale": score scale, default 1/sqrt(d_k)}.
class FullAttention : public Attention {
 public:
  explicit FullAttention(double dropout = 0.0, double scale = 0.0 /* 0: 1/sqrt(d_k) */);
  static std::shared_ptr<Attention> create(const AttentionSpec& spec);
  Tensor forward(const AttentionArgs& args) override;
  std::string type() const override { return "full"; }

 private:
  double dropout_, scale_;
};

}  // namespace nn
}  // namespace cf
