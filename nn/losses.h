#pragma once
// Losses, built from the public differentiable ops; float32 and float64; every
// one takes a Reduction (None / Mean / Sum, from autograd/ops/nn_functional.h).
// Bad input throws a cf::Error whose message starts with the loss's name.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops/nn_functional.h"
#include "core/tensor.h"

namespace cf {
namespace nn {

// ---------------- cross entropy ----------------

struct CrossEntropyLossOptions {
  int64_t ignore_index = -100;   // targets equal to this add no loss and no gradient
  double label_smoothing = 0.0;  // in [0, 1)
  Tensor weight;                 // optional class weights (C,), logits' dtype and device
  Reduction reduction = Reduction::Mean;
};

// logits (N, C) or (N, C, d1, ...) with the class axis 1 (as cf::cross_entropy),
// targets int64 (N) or (N, d1, ...) in [0, C) or equal to ignore_index.
// PyTorch's F.cross_entropy semantics. With p = log_softmax(logits, 1), eps the
// label smoothing and w the class weights (all 1 without weights), per target i
// that is not ignored:
//   nll_i    = -w[y_i] * p[i, y_i]
//   smooth_i = -sum_c w[c] * p[i, c]
//   loss_i   = (1 - eps) * nll_i + (eps / C) * smooth_i          (0 when ignored)
// Mean divides sum_i loss_i by sum_i w[y_i] over the non-ignored targets (the
// number of them without weights); when that sum is 0 (e.g. every target
// ignored) the mean is sum_i loss_i = 0 with a zero gradient, not NaN (cf's
// convention, see cf::cross_entropy). Weights are constants (no gradient).
// Without weights this is the fused cf::cross_entropy.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                     const CrossEntropyLossOptions& options = {});

// ---------------- binary cross entropy with logits ----------------

struct BCEWithLogitsOptions {
  Tensor pos_weight;  // optional, broadcast to logits (typically (C,) for (..., C) logits)
  Tensor weight;      // optional per-element rescaling, broadcast to logits
  Reduction reduction = Reduction::Mean;
};

// targets: same shape and dtype as logits, values in [0, 1]. With x the logits,
// y the targets and lw = 1 + (pos_weight - 1) * y (lw = 1 without pos_weight):
//   loss = weight * ((1 - y) * x + lw * softplus(-x))
// which without pos_weight is PyTorch's max(x, 0) - x*y + log1p(exp(-|x|)).
// softplus(-x) = log(1 + exp(-x)) is computed as logsumexp([0, -x]), which is
// stable for any x and has the exact gradient at x = 0 as well.
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& targets,
                                        const BCEWithLogitsOptions& options = {});

// ---------------- mean squared error ----------------

// (a - b)^2 elementwise, reduced; a and b must have the same shape and dtype.
Tensor mse_loss(const Tensor& a, const Tensor& b, Reduction reduction = Reduction::Mean);

// ---------------- Chamfer distance ----------------

// Point sets a (B, N, D) and b (B, M, D), N, M >= 1. With squared Euclidean
// distances d(i, j) = |a_i - b_j|^2 (squared, as PyTorch3D's chamfer_distance):
//   chamfer[b] = mean_i min_j d(i, j) + mean_j min_i d(i, j)
// Reduction: None gives (B), Mean the mean over the batch, Sum the sum.
// d is computed as |a|^2 - 2 a b^T + |b|^2 with one batched matmul (a B x N x M
// tensor, never B x N x M x D) and clamped at 0 against rounding. The gradient
// flows through the minima (amin: shared equally between exact ties).
Tensor chamfer_distance(const Tensor& a, const Tensor& b, Reduction reduction = Reduction::Mean);

// ---------------- auxiliary losses ----------------

// Collects named auxiliary losses during a forward pass (e.g. a clustering
// layer's "cluster_l1"); the model sums them with per-name weights.
//   AuxLosses aux;  model.forward(x, &aux);  loss = main + aux.total({{"cluster_l1", 0.1}});
class AuxLosses {
 public:
  // Appends a 0-d (or one-element) float loss under name.
  void add(const std::string& name, const Tensor& loss);
  // The losses added under name (empty when none).
  const std::vector<Tensor>& get(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  bool empty() const { return losses_.empty(); }
  void clear() { losses_.clear(); }
  // sum over names of weights[name] * (sum of that name's losses), a 0-d tensor.
  // Every collected name needs a weight and every weight a collected name: a
  // missing or unknown name is a ValueError listing both sides (a typo in a
  // config must not silently drop a loss). Throws when nothing was collected.
  Tensor total(const std::map<std::string, double>& weights) const;

 private:
  std::map<std::string, std::vector<Tensor>> losses_;
};

}  // namespace nn
}  // namespace cf
