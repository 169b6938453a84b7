#pragma once
// Fused kernels for the layers: each is one kernel forward and one backward,
// numerically stable, float32/float64.
#include "core/rng.h"
#include "core/tensor.h"

namespace cf {

Tensor softmax(const Tensor& x, int64_t axis = -1);
Tensor log_softmax(const Tensor& x, int64_t axis = -1);
// Normalise over the last normalized_shape.size() axes; weight and bias optional
// (undefined Tensor) and shaped like normalized_shape.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

// x scaled to unit length along its last axis: x / sqrt(sum x^2 + eps) (routing attention's
// normalisation of queries and keys, Reformer's shared keys). One kernel each way; float32 and
// float64 in their dtype, a 16-bit x through float32 (float32 under autocast); eps > 0, so a zero
// row stays 0.
Tensor l2_normalize(const Tensor& x, double eps = 1e-12);

enum class Reduction { None, Mean, Sum };
struct CrossEntropyOptions {
  int64_t ignore_index = -100;    // targets equal to this add no loss and no gradient
  double label_smoothing = 0.0;   // in [0, 1)
  // Mean is over the non-ignored targets. When every target is ignored (or the
  // batch is empty) the mean is 0 with a zero gradient, not NaN as in PyTorch: a
  // fully padded batch must not fill the weights with NaN.
  Reduction reduction = Reduction::Mean;
};
// logits (N, C) or (N, C, d1, ...) with class axis 1; targets int64 (N) or (N, d1, ...).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options = {});
// The argument checks of cross_entropy (defined, one device, float logits (N, C, ...),
// int64 targets (N, ...), label_smoothing in [0, 1)), shared with the class-weighted
// loss in nn/losses.h so both report bad input alike.
void check_cross_entropy_args(const Tensor& logits, const Tensor& targets, double label_smoothing);

// Inverted dropout: zero with probability p, scale survivors by 1/(1-p); identity
// when !training or p == 0. Mask drawn from the Philox generator.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen = default_generator());

namespace ops {
// What dropout(x, p, true, gen) multiplied some entries of x by, when x has rows of row_len
// entries and the call reserved its counters from counter0 under key seed: cols int64
// (..., R, T) names T columns of each of x's rows (rows counted over every axis but the
// last), and the result, of cols' shape and device in dtype, holds 0 where that entry dropped
// and 1/(1-p) where it was kept. A constant (no gradient): a gathered copy of those entries
// times it drops exactly as the whole tensor's dropout did (improved clustered attention's
// top-k centroid weights beside flash attention's dropout). The columns only name counters,
// so they are not range-checked. rebase: the call's dropout_rebase inside a CUDA graph capture
// (core/rng.h), null otherwise.
Tensor dropout_scale_at(const Tensor& cols, int64_t row_len, double p, uint64_t seed, uint64_t counter0, DType dtype,
                        const uint64_t* rebase = nullptr);
}  // namespace ops

}  // namespace cf
