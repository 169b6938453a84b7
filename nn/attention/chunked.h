#pragma once
// Sort-and-chunk attention: the one mechanism shared by every variant that puts
// tokens into chunks by some key and attends within a chunk and its neighbours:
//   neural clustering attention (ClusterFormer eqs. 8-10: cluster-sorted blocks,
//     block i sees blocks i-1 and i),
//   LSH attention (Reformer section 2: bucket-sorted chunks, each chunk sees
//     itself and the previous one, no attention to oneself),
//   routing attention (attention within a routing cluster),
//   the Cluster-Former layer (Cluster-Former eq. 7: attention within a chunk).
// The caller decides which original position sits in which slot of which chunk
// (`members`); chunked_attention runs the fused block_attention kernel
// (autograd/ops/attention.h, kernels/attention): rows read through the member
// table, (chunk x window) score tiles computed and consumed in fast memory,
// outputs written back in token order. Never builds an N x N matrix, nor the
// gathered copies or (C, w, W) score tensors: memory is O(B H N d) (the CPU
// backward adds O(B H N d (1 + L + A)) of per-window key gradients).
#include "core/rng.h"
#include "core/tensor.h"

namespace cf {
namespace nn {

struct ChunkedAttentionOptions {
  int64_t look_back = 0;   // each chunk's queries also see the previous look_back chunks (cyclic: chunk 0 sees the last)
  int64_t look_ahead = 0;  // ... and the next look_ahead chunks (cyclic)
  bool causal = false;     // block keys whose ORIGINAL position is after the query's original position
  // Reformer rule (section 2, "Causal masking for shared-QK attention"): a query
  // attends to its own position only when no other key is allowed. Realised as
  // the Reformer does: the self score is replaced by -1e5, so it gets weight 0
  // next to any allowed key and weight 1 when it is alone.
  bool self_mask = false;
  double scale = 0.0;  // score scale; 0 means 1/sqrt(d_k)
  // Rounds R of chunking over the same q, k, v (LSH's hashing rounds): members has
  // H * R heads, head h * R + r chunking q, k, v head h, and the results have H * R
  // heads. The kernel reads q, k, v once per round through the table: no R copies.
  int64_t rounds = 1;
  // With rounds > 1: the results are the rounds combined through their log-sum-exp
  // (Reformer section 2.1, multi-round LSH: out = sum_r exp(lse_r - lse) out_r,
  // lse = log sum_r exp(lse_r)), H heads; the per-round results never leave the op.
  bool combine_rounds = false;
  // Inverted attention-weight dropout at this rate (0: none; callers pass 0 outside training), drawn
  // from *generator (null: the default generator) with the counters dropout() gives the dense
  // (B, H * rounds, N, N) weights, so chunked_dense_attention with the same options and a generator
  // in the same state drops the same weights (BlockAttentionOptions::dropout).
  double dropout = 0.0;
  Generator* generator = nullptr;
};

// The score a self-masked query gives itself (Reformer).
constexpr double kSelfMaskedScore = -1e5;

struct ChunkedAttentionResult {
  Tensor out;  // (B, H * rounds, N, Dv) (H heads with combine_rounds), original token order
  Tensor lse;  // (B, H * rounds, N): log-sum-exp of the query's allowed scaled scores; -inf where none
};

// q, k (B, H, N, Dk), v (B, H, N, Dv): one float dtype, self-attention (same N).
// members: int64 (B, Hm, C, w), Hm == H * rounds or 1 (shared by the heads): the original
// position held by each of the w slots of each of the C chunks; -1 marks an empty
// slot. A position appears at most once in members[b, h]; a position in no slot
// gets out = 0 and lse = -inf.
// Query slot s of chunk c attends to the key slots of chunks c - look_back ..
// c + look_ahead (cyclic; a chunk reached twice through the wrap-around counts
// once), except empty slots, keys with key_padding_mask[b, pos] true (bool (B, N),
// true = padding, may be undefined), later positions when causal, and itself when
// self_mask applies. A query with nothing allowed outputs zeros, lse -inf.
// Differentiable in q, k and v (lse too: LSH combines rounds through it).
ChunkedAttentionResult chunked_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                         const Tensor& key_padding_mask, const ChunkedAttentionOptions& options);

// A sort order (B, Hm, N) int64 (order[b, h, i] = original position of the i-th
// token in sorted order) cut into members (B, Hm, ceil(N / w), w); the tail of the
// last chunk is padded with -1.
Tensor chunk_order(const Tensor& order, int64_t w);

// ---- dense references, for tests: the same rule with an explicit N x N mask ----

// bool (B, Hm, N, N), true where query position i may NOT attend to key position j
// under chunked_attention's rule (the self_mask rule is not a block: see below).
Tensor chunked_dense_mask(const Tensor& members, int64_t n, const Tensor& key_padding_mask,
                          const ChunkedAttentionOptions& options);

// What chunked_attention computes, written densely: softmax over the N x N scores
// with chunked_dense_mask and, with self_mask, the self score replaced by
// kSelfMaskedScore where the query is in a slot; with a dropout rate, dropout() of those
// (B, H * rounds, N, N) weights. Same result layout.
ChunkedAttentionResult chunked_dense_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& members, const Tensor& key_padding_mask,
                                               const ChunkedAttentionOptions& options);

}  // namespace nn
}  // namespace cf
