#pragma once
// The two layer types of Cluster-Former (Wang et al. 2021, section 3).
//
// Both work on one representation of a long input: the context X (B, x, D),
// merged across windows, and, for question answering, one copy of the question
// per window, Q (B, K, q, D) with K = ceil(x / m) windows (eq. 4 counts
// q * ceil(x / m) + x hidden states). After the merge of eqs. 2-3 the windows'
// overlapping rows are equal, so (Q, X) holds exactly the paper's per-window
// states H_k = [Q_k; X[m k : m k + l]].
//
// - SlidingWindowLayer (section 3.1): windows H_k = [Q_k; X[m k : m k + l]]
//   (eq. 1; positions past x are padding) go as a batch of B*K sequences through
//   one TransformerEncoderLayer (eq. 2); each context token's output is the mean
//   of its outputs in every window that holds it (eqs. 2-3; the paper's pairwise
//   merge with the neighbouring windows is this mean whenever l <= 2m, the case
//   it describes: a token then lies in at most two windows).
// - ClusterFormerLayer (section 3.2): the states of eq. 4,
//   [Q_0; X[0 : m]; Q_1; X[m : 2m]; ...], go through a TransformerEncoderLayer
//   whose attention is ClusterFormerAttention (eqs. 5-9), then back to (Q, X).
#include <memory>

#include "nn/attention/cluster_former.h"
#include "nn/blocks/transformer.h"
#include "nn/table_cache.h"

namespace cf {
namespace nn {

// The per-layer state of a Cluster-Former stack.
struct WindowedStates {
  Tensor context;   // (B, x, D)
  Tensor question;  // (B, K, q, D) per-window copies, or undefined (no question)
};

// K = ceil(x / m), at least 1: the number of windows (eq. 4).
int64_t num_windows(int64_t context_len, int64_t stride);

// (B, K) bool: whether window k's own slice of eq. 4, X[m k : m k + m], holds
// padding only (context_mask (B, x) bool, true = padding). On the mask's device,
// without a host read.
Tensor empty_windows(const Tensor& context_mask, int64_t stride);

// Padding: the question copy of a window whose slice X[m k : m k + m] is all
// padding is masked as padding, so batch padding changes nothing.
// Shared checks and masks of both layers. context (B, x, D); context_mask bool
// (B, x) true = padding, or undefined; question (B, q, D) (the same for every
// window: the first layer) or (B, K, q, D); question_mask bool (B, q) or undefined.
class SlidingWindowLayer : public Module {
 public:
  // window l > stride m > 0; `layer` is the per-window Transformer (its
  // attention is layer.attention, full by default).
  SlidingWindowLayer(const TransformerLayerOptions& layer, int64_t window, int64_t stride,
                     Generator& gen = default_generator());
  WindowedStates forward(const Tensor& context, const Tensor& context_mask = {}, const Tensor& question = {},
                         const Tensor& question_mask = {}, bool causal = false, AuxLosses* aux = nullptr);
  int64_t window() const { return window_; }
  int64_t stride() const { return stride_; }
  std::shared_ptr<TransformerEncoderLayer> layer;

 private:
  int64_t window_, stride_;
  DeviceTableCache tables_;  // eq. 1's window positions, each position's window count, positions past x
};

class ClusterFormerLayer : public Module {
 public:
  // layer.attention is "cluster-former" (section 3.2); another variant (e.g.
  // "lsh") makes this a whole-sequence layer with that attention in the same
  // layout, the paper's Table 5 baselines. stride m lays out eq. 4.
  ClusterFormerLayer(const TransformerLayerOptions& layer, int64_t stride, Generator& gen = default_generator());
  WindowedStates forward(const Tensor& context, const Tensor& context_mask = {}, const Tensor& question = {},
                         const Tensor& question_mask = {}, bool causal = false, AuxLosses* aux = nullptr);
  // The layer's attention; its set_fixed_assignments / last_assignments ids are
  // (B, K q + x) in eq. 4's order.
  // ValueError when the layer's attention is not "cluster-former".
  ClusterFormerAttention& attention() const;
  bool has_memory_bank() const;  // the attention is "cluster-former"
  int64_t stride() const { return stride_; }
  std::shared_ptr<TransformerEncoderLayer> layer;

 private:
  int64_t stride_;
  DeviceTableCache tables_;  // eq. 4's order of (Q, X) and its inverse
};

}  // namespace nn
}  // namespace cf
