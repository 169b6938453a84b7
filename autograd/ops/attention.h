#pragma once
// Fused attention ops (kernels/attention): one kernel forward, one backward,
// one autograd node each. Float32/float64, CPU and CUDA; under autocast on CUDA,
// 16-bit q, k, v on tensor cores (kernels/attention/attention_mma_cuda.cu).
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace cf {

// softmax(scale * q k^T, blocked -> -inf) v without the (Nq, Nk) score matrix
// (FlashAttention-2): memory O(N d). q (B, H, Nq, Dk), k (B, H, Nk, Dk),
// v (B, H, Nk, Dv); key_padding_mask bool (B, Nk), true = padding, or undefined;
// scale 0 means 1/sqrt(Dk); causal: query i sees key j only when
// j <= i + (Nk - Nq). A query with every key blocked outputs zeros (and passes a
// zero gradient). Differentiable in q, k and v.
// dropout > 0: inverted attention-weight dropout at that rate, drawn from gen exactly as
// dropout(weights, dropout, true, gen) would draw it on the dense (B, H, Nq, Nk) weights (the
// same counters, so the same weights drop; nn::dense_attention is the reference). CPU and CUDA
// (there through the GEMM path, and in float32 under autocast: the tensor-core kernels have no
// dropout). 0 draws nothing from gen.
Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask = Tensor(),
                       double scale = 0.0, bool causal = false, double dropout = 0.0,
                       Generator& gen = default_generator());

struct FlashAttentionResult {
  Tensor out;  // (B, H, Nq, Dv)
  Tensor lse;  // (B, H, Nq): log-sum-exp of the query's allowed scaled scores; -inf where none
  // With dropout: the key and first counter it drew the weights' drops from (weight (bh, i, j) has
  // counter dropout_counter0 + (bh Nq + i) Nk + j), so a caller can drop gathered copies of some
  // weights alike (ops::dropout_scale_at). 0 without dropout. dropout_rebase: a captured CUDA
  // graph's move of them (core/rng.h), null outside a capture.
  uint64_t dropout_seed = 0, dropout_counter0 = 0;
  const uint64_t* dropout_rebase = nullptr;
};

// flash_attention that also hands out each query's log-sum-exp, differentiable in
// q, k and v through both (d lse_i / d S_ij = P_ij): improved clustered attention
// reads the centroid weights of the top-k keys from it, exp(S_jl - lse_j). One
// node, as flash_attention (out and lse are views of one (B, H, Nq, Dv + 1) output).
// dropout as flash_attention's: out is that of the dropped weights, lse that of the weights
// before dropout.
FlashAttentionResult flash_attention_with_lse(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& key_padding_mask = Tensor(), double scale = 0.0,
                                              bool causal = false, double dropout = 0.0,
                                              Generator& gen = default_generator());

struct BlockAttentionOptions {
  int64_t look_back = 0;   // chunk c also sees chunks c-1 .. c-look_back (cyclic)
  int64_t look_ahead = 0;  // ... and c+1 .. c+look_ahead (cyclic); a chunk reached twice counts once
  bool causal = false;     // key position j blocked for query position i when j > i (original positions)
  // Reformer (section 2): a query's own score is replaced by self_score, so it
  // gets weight 0 beside any allowed key and weight 1 when alone.
  bool self_mask = false;
  double self_score = -1e5;
  double scale = 0.0;  // 0: 1/sqrt(Dk)
  // Rounds R over one q, k, v (LSH's hashing rounds, without R copies of them): the
  // table has H * R heads, head h * R + r attending over q, k, v head h, and out and
  // lse have H * R heads; the same as block_attention on q, k, v each repeated R
  // times along the head axis (head h * R + r a copy of head h), gradients summed.
  int64_t rounds = 1;
  // With rounds > 1: out and lse are the rounds combined through their log-sum-exp
  // (the Reformer's multi-round rule), (B, H, N, Dv) and (B, H, N): lse = log sum_r
  // exp(lse_r), out = sum_r exp(lse_r - lse) out_r. The rounds' own out and lse stay
  // inside the op (kept for its backward), never handed out.
  bool combine_rounds = false;
  // Inverted attention-weight dropout at this rate (0: none, nothing drawn), drawn from *generator
  // (null: the default generator) exactly as dropout(weights, dropout, true, gen) would draw it on
  // the dense (B, H * rounds, N, N) weights of the same attention (chunked_dense_attention with its
  // dropout): the same counters, by original positions, so the same weights drop. lse (and the
  // rounds' combination) stays that of the weights before dropout. The caller passes 0 outside training.
  double dropout = 0.0;
  Generator* generator = nullptr;
};

struct BlockAttentionResult {
  Tensor out;  // (B, H * rounds, N, Dv) (H heads with combine_rounds), original token order
  Tensor lse;  // (B, H * rounds, N): log-sum-exp of the query's allowed scaled scores; -inf where none
};

// Attention within gathered blocks (the sort-and-chunk mechanism, nn/attention/chunked.h):
// q, k (B, H, N, Dk), v (B, H, N, Dv); members int64 (B, Hm, C, w), Hm == H * rounds or 1,
// the original position held by each slot (-1 empty), each position at most
// once per (b, hm). Query slot s of chunk c attends to the key slots of chunks
// c - look_back .. c + look_ahead, except empty slots, padded keys, later
// positions when causal; tokens in no slot and queries with nothing allowed get
// out = 0, lse = -inf. Differentiable in q, k and v through out and lse (one
// node: its output packs out and lse as (B, H, N, Dv + 1); out and lse are views).
BlockAttentionResult block_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                     const Tensor& key_padding_mask = Tensor(),
                                     const BlockAttentionOptions& options = {});

// Attention within index lists whose query and key lists differ (routing attention,
// the fixed sparse pattern: nn/attention/routing.h). q, k (B, H, N, Dk), v (B, H, N, Dv);
// query_members (B', H', C, wq) and key_members (B', H', C, wk) int64, B' in {1, B},
// H' in {1, H}, holding positions in [-1, N) (-1: empty slot). Query slot s of list c
// attends to the key slots of list c, except empty slots, padded keys and, when
// causal, later positions. A position may sit in several lists (or in none): its
// output is the average of its outputs over the query lists holding it where it sees
// at least one key (a list whose keys are all later or padded gives it no output, and
// is not counted), zeros if none. Within one list a position is meant to appear once (a repeated query slot
// counts twice in its average, a repeated key twice in the list's softmax; the lists'
// values are not checked for it). Every list has at least one slot (wq, wk >= 1).
// One node: one attention kernel per direction over the lists as they are (no
// gathered copies of q, k, v, no (C, wq, wk) scores kept), the slot outputs averaged
// into token order by a scatter-add, and in the backward the slot gradients
// scatter-added back to the positions. scale 0 means 1/sqrt(Dk). Differentiable in
// q, k and v.
// dropout > 0: inverted attention-weight dropout at that rate, drawn from gen as dropout() would draw
// it on C successive dense (B, H, N, N) weight tensors, one per list (routed_attention_dense_reference
// with the same generator drops the same weights). CPU and CUDA (there in the fused kernel: the
// tensor-core kernels have no dropout). 0 draws nothing.
Tensor routed_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_members,
                        const Tensor& key_members, const Tensor& key_padding_mask = Tensor(), double scale = 0.0,
                        bool causal = false, double dropout = 0.0, Generator& gen = default_generator());

namespace ops {

// The chunk offsets a chunk sees, deduplicated modulo C: 0, -1, ..., -look_back,
// 1, ..., look_ahead (a chunk reached twice through the wrap-around counts once).
std::vector<int64_t> block_window_offsets(int64_t C, int64_t look_back, int64_t look_ahead);

// The argument checks of block_attention, `who` naming the caller in errors:
// shapes, one float dtype and device, the mask, the options, and the member
// table (positions in [-1, N), each at most once per (batch, head); this reads
// the table on the host).
void check_block_attention_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                const Tensor& key_padding_mask, const BlockAttentionOptions& options,
                                const char* who);

// Autocast (issue 26): whether block attention runs these q, k, v on float32 copies. True under
// autocast for 16-bit inputs the tensor-core kernels do not take (they take CUDA, one 16-bit dtype,
// head size 64: float32 out and lse); the float32 kernels then run on the copies.
// Rounds other than 1 always take the float32 kernels.
// Attention dropout always takes the float32 kernels too (the tensor-core ones have none).
bool block_attention_on_float32_copies(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                       int64_t rounds = 1, double dropout = 0.0);
// block_attention without the checks, for a caller that ran
// check_block_attention_args itself (under its own name).
BlockAttentionResult block_attention_unchecked(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& members, const Tensor& key_padding_mask,
                                               const BlockAttentionOptions& options);

// routed_attention's argument checks, `who` naming the caller in errors. With
// check_range the lists' positions are checked to lie in [-1, N) (an IndexError;
// deferred to the next host read on CUDA); callers whose lists are in range by
// construction (top-k indices, fixed patterns) skip it. The kernels treat a
// position outside [0, N) as an empty slot either way.
void check_routed_attention_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_members,
                                 const Tensor& key_members, const Tensor& key_padding_mask, double scale,
                                 const char* who, bool check_range = true);
// routed_attention without the checks, for a caller that ran them (the dropout rate is checked here).
Tensor routed_attention_unchecked(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_members,
                                  const Tensor& key_members, const Tensor& key_padding_mask, double scale,
                                  bool causal, double dropout = 0.0, Generator* gen = nullptr);

}  // namespace ops

}  // namespace cf
