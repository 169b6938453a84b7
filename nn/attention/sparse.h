#pragma once
// Fixed sparse attention (Child, Gray, Radford, Sutskever 2019, "Generating Long Sequences with Sparse
// Transformers", section 4.3, the "fixed" factorisation): the "Sparse Attention" baseline of Cluster-Former's
// Tables 2 and 5, there run over hand-picked positions across the chunks of the sliding-window layers.
//
// The sequence is cut into blocks of l positions (the stride). Query i attends to
//   A(1)_i = { j : floor(j / l) = floor(i / l) }     its own block, and
//   A(2)_i = { j : j mod l >= l - c }                the last c positions of every block (the "summary" cells
//                                                    through which information crosses blocks),
// all in one softmax over A(1) u A(2) (the paper's merged head: every head attends to the union). Under a causal
// mask only keys j <= i remain, so a query reads its block's past and the summaries of earlier blocks: two
// layers connect any position to any earlier one. Key padding removes keys as everywhere (attention.h).
//
// Not implemented: the paper's "strided" factorisation (the previous l positions and every l-th one, its
// choice for images) and heads attending to distinct summary sub-blocks (its multi-head refinement); every
// head here uses the same pattern.
//
// Cost: each query scores at most l + c * ceil(N / l) keys, O(N (l + c N / l)): O(N^1.5) for l ~ sqrt(N) and a
// fixed c, while with the default ratio c = l / 4 a quarter of the keys are summaries (N^2 / 4 scores). The pattern
// becomes index lists (one per block: its queries, and its block's keys followed by the other blocks' summaries)
// run by the fused routed_attention op (autograd/ops/attention.h), which reads the keys through the lists: no
// N x N matrix, no gathered copies of the summary keys and values in the forward, and no scores kept (they are
// recomputed in the backward); the time stays O(N (l + c N / l) d). The backward runs the lists in chunks whose
// key slots hold about N rows, so each chunk's key-slot dk, dv stay the size of k and v before they are added to
// the positions (docs/design-notes.md, "Routed lists").
#include <cstdint>

#include "nn/attention/attention.h"
#include "nn/attention/routing.h"

namespace cf {
namespace nn {

// The pattern as routed_attention's index lists for a sequence of n positions, blocks of `block` (l) and
// `summary` (c) summary positions per block: query_members (1, 1, C, l) holds block b's positions and
// key_members (1, 1, C, l + (C - 1) c) its block's positions, then the summary positions of every other block
// (only the earlier ones when causal); -1 marks an empty slot (past the end of the sequence, or a later block's
// summary under causal). C = ceil(n / l).
void fixed_sparse_members(int64_t n, int64_t block, int64_t summary, bool causal, Tensor& query_members,
                          Tensor& key_members);

// The dense reference pattern, straight from A(1) and A(2) above: bool (n, n), true where key j is NOT in
// A(1)_i u A(2)_i (causality not included). O(n^2): for tests.
Tensor fixed_sparse_blocked(int64_t n, int64_t block, int64_t summary, Device device = Device::cpu());

// Options (JSON), all optional:
//   "block_size": l, default 0 = ceil(sqrt(N)) for a sequence of N positions (the paper's l ~ sqrt(N));
//   "summary": c in [1, l], default 0 = max(1, l / 4), the ratio of the paper's enwik8 model (l = 128, c = 32);
//   "scale": score scale, default 1/sqrt(d_k);
//   "dropout": attention-weight dropout in training, in [0, 1), default 0 (inside the routed kernel).
class SparseAttention : public Attention {
 public:
  explicit SparseAttention(int64_t block_size = 0, int64_t summary = 0, double scale = 0.0, double dropout = 0.0);
  static std::shared_ptr<Attention> create(const AttentionSpec& spec);
  Tensor forward(const AttentionArgs& args) override;
  std::string type() const override { return "sparse"; }

  // l and c used for a sequence of n positions.
  int64_t block_for(int64_t n) const;
  int64_t summary_for(int64_t block) const;

 private:
  int64_t block_size_, summary_;
  double scale_, dropout_;
  DeviceTableCache tables_;  // (query_members, key_members) of the fixed pattern
};

}  // namespace nn
}  // namespace cf
