#pragma once
// Fused attention kernels (CPU + CUDA, float32/float64, forward and backward).
//
// flash_attention: full softmax attention in the FlashAttention-2 manner (Dao
//   2023, Algorithm 1 forward, Algorithm 2 backward): tiles of queries and keys,
//   a running row maximum and sum (online softmax), only the output and one
//   log-sum-exp per query row kept; the backward recomputes the probabilities
//   tile by tile from that log-sum-exp. Memory O(N d), never O(N^2).
//
// block_attention: the same computation restricted to gathered blocks, the
//   mechanism of every sort-and-chunk attention (nn/attention/chunked.h): a
//   member table (B, Hm, C, w) names the original position held by each slot of
//   each of C chunks (-1: empty); chunk c's queries see the keys of the chunks
//   c + offsets[t] (cyclic). Queries and keys are read through the table and the
//   outputs written back to token order inside the kernel: no gathered copy of
//   q, k, v and no (C, w, W) score tensor is ever materialised.
//
// routed_attention: attention within index lists whose query and key lists
//   differ and may share positions (routing attention, the fixed sparse
//   pattern: nn/attention/routing.h): list c's query slots attend to list c's
//   key slots. Rows are read through the lists as above, but outputs stay in
//   slot order (a position may sit in several lists); the op averages them
//   into token order and scatters the slot gradients back.
//
// The callers (autograd/ops/attention.cpp) validate shapes and the member table
// and pass contiguous q, k, v; these kernels only compute.
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

struct FlashAttentionParams {
  double scale = 1.0;   // scores are scale * q . k
  bool causal = false;  // query i sees key j only when j <= i + (Nk - Nq)
  // Attention-weight dropout (inverted, rate `dropout`; the CPU kernel and the GEMM path, so on both devices;
  // the tensor-core and scalar CUDA kernels refuse a rate): weight (b, h, i, j) is
  // dropped when the Philox draw of counter dropout_counter0 + ((b H + h) Nq + i) Nk + j under key
  // dropout_seed falls below the rate (kernels/dropout/dropout.h's test), otherwise scaled by
  // 1 / (1 - rate). That is the counter dropout() gives entry (b, h, i, j) of the dense (B, H, Nq, Nk)
  // weights, so the fused kernel drops exactly the weights the dense path drops. The softmax
  // normaliser and lse stay those of the weights before dropout, as in the dense path; the
  // backward regenerates the mask tile by tile.
  double dropout = 0.0;
  uint64_t dropout_seed = 0, dropout_counter0 = 0;
  const uint64_t* dropout_rebase = nullptr;  // a captured CUDA graph's (core/rng.h); null on the CPU
};

// The kernels without dropout (the CUDA scalar and tensor-core kernels) call this first, so a rate that
// reaches them is an error, never silently ignored; the dispatch below sends a rate to the GEMM path.
inline void check_no_attention_dropout(double rate, const char* op, const char* kernel) {
  CF_CHECK(rate == 0, ValueError, "[", op, "] the ", kernel,
           " has no attention dropout (the op's dispatch sends a rate to a kernel that has it); got rate ", rate);
}
inline void check_flash_no_dropout(const FlashAttentionParams& p, const char* kernel) {
  check_no_attention_dropout(p.dropout, "flash_attention", kernel);
}

// q (B, H, Nq, Dk), k (B, H, Nk, Dk), v (B, H, Nk, Dv) contiguous, one float dtype.
// key_padding_mask: contiguous bool (B, Nk), true = padding, or undefined.
// Writes out (B, H, Nq, Dv) and lse (B, H, Nq) (contiguous). A query with every
// key blocked gets out = 0 and lse = -inf.
void flash_attention_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask,
                                 const FlashAttentionParams& p, const Tensor& out, const Tensor& lse);
// dout (B, H, Nq, Dv) and dlse (B, H, Nq) contiguous (dlse undefined: no gradient
// reaches lse); writes dq, dk, dv (contiguous, preallocated).
void flash_attention_backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& key_padding_mask, const FlashAttentionParams& p, const Tensor& out,
                                  const Tensor& lse, const Tensor& dout, const Tensor& dlse, const Tensor& dq,
                                  const Tensor& dk, const Tensor& dv);

// The bfloat16 arm on the CPU (issue 26): bfloat16 q, k, v (and dout) on a CPU with AMX (bf16_amx.h), or
// whose matmul uses the vdpbf16ps kernel (bf16_dot.h: AMD's), every product in float32 on either, softmax
// statistics in float32; writes float32 out and lse (forward) and float32 dq, dk, dv (backward), as the CUDA tensor-core kernels. No attention dropout. The autocast dispatch
// (autograd/ops/attention.cpp) takes it when flash_attention_bf16_supported(q, k, v).
bool flash_attention_bf16_supported(const Tensor& q, const Tensor& k, const Tensor& v);
void flash_attention_forward_bf16_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& key_padding_mask, const FlashAttentionParams& p,
                                      const Tensor& out, const Tensor& lse);
void flash_attention_backward_bf16_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& key_padding_mask, const FlashAttentionParams& p,
                                      const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dlse,
                                      const Tensor& dq, const Tensor& dk, const Tensor& dv);

// flash_attention through GEMMs over chunks of query rows (attention_gemm.cpp), the float32 and float64
// path on CUDA: per chunk S = (scale q) k^T into a (B, H, r, Nk) buffer by cuBLAS, one row kernel
// (attention_rows_softmax) turns it into P and lse, out = P v; the backward recomputes P from lse chunk by
// chunk and forms dS = P (dP - D) (dP = dO v^T) in one row kernel (attention_rows_grad), dq = dS (scale k),
// and adds P^T dO and dS^T (scale q) into dv and dk.
// Why: the scalar fused kernel reads two shared-memory operands per multiply-add and ran 3-9x behind PyTorch's
// memory-efficient float32 attention on an H200 (docs/benchmarks.md, 2026-11-27); the GEMMs run at cuBLAS speed
// (in TF32 when the user opts in with cf::cuda::set_allow_tf32, as every float32 matmul does).
// Memory: the score buffers hold at most clamp(4 x bytes of q, k, v, 16 MiB, 128 MiB) each (one in the forward,
// two in the backward), plus a scaled copy of q and, with several chunks, one chunk's out or dq and a dk, dv
// to add each chunk's share through, and with the keys split (below) the parts' partial products (parts x rows x
// D per (b, h): with the automatic parts about 512 tiles of 64 x 64, 8 MiB in float32): O(N d) plus a capped
// workspace, never O(N^2). chunk_rows > 0 fixes the rows per chunk, key_splits > 0 the parts of out = P v and
// dq = dS k (flash_gemm_key_splits; tests). Same contracts as flash_attention_forward_cpu / _backward_cpu; any
// device.
void flash_attention_forward_gemm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask,
                                  const FlashAttentionParams& p, const Tensor& out, const Tensor& lse,
                                  int64_t chunk_rows = 0, int64_t key_splits = 0);
void flash_attention_backward_gemm(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& key_padding_mask, const FlashAttentionParams& p, const Tensor& out,
                                   const Tensor& lse, const Tensor& dout, const Tensor& dlse, const Tensor& dq,
                                   const Tensor& dk, const Tensor& dv, int64_t chunk_rows = 0, int64_t key_splits = 0);

// The GEMM path's products with a thin output, out = P v and dq = dS k ((rows x D) per (b, h), inner axis the
// keys), split their keys into this many parts, one batched GEMM over (B, H, parts) and a sum. Why: a chunk of
// 128 rows at Nk = 65536 gives cuBLAS one 128 x 64 output tile per head, a handful of thread blocks each
// running 65536 multiply-adds while the rest of the GPU idles (H200, 2026-11-28: 2.7 ms a chunk, the forward
// 10.8x behind PyTorch's memory-efficient SDPA at N = 65536, 3.5x at 16384). Parts: enough for about
// kFlashGemmWantedTiles 64 x 64 output tiles in all (a few per SM), each part at least kFlashGemmMinSplitKeys
// keys (the partial products cost parts x rows x D against rows x keys read); 1 when the output is wide enough.
constexpr int64_t kFlashGemmWantedTiles = 512;
constexpr int64_t kFlashGemmMinSplitKeys = 512;
int64_t flash_gemm_key_splits(int64_t batch_heads, int64_t rows, int64_t D, int64_t keys);

// The row step of the GEMM path. scores (B, H, r, W) contiguous hold the (already scaled) scores of query
// rows row0 .. row0 + r - 1 of Nq against keys 0 .. W - 1 of Nk (W < Nk: a causal chunk's key prefix, the
// keys past it blocked for all its rows); key j is blocked for query i when key_padding_mask[b, j] ((B, Nk))
// or, causal, j > i + Nk - Nq.
//   attention_rows_softmax (forward): each row becomes its softmax and its log-sum-exp is written to lse
//     (B, H, Nq) contiguous.
//   attention_rows_grad (backward, in one pass): each score becomes P = exp(s - lse_i) and dp (the same
//     shape, holding dP = dO v^T) becomes dS = P (dP - D_i), D (B, H, Nq) contiguous (dO . O - dlse).
// Blocked entries, and every entry of a row with nothing allowed (lse -inf), become 0 (P and dS).
// With dropout.rate > 0 the row step also drops weights as FlashAttentionParams says (the counter of weight
// (bh, i, j) is counter0 + (bh Nq + i) Nk + j, key j the score's column): the forward drops P after its
// lse is written (the normaliser is that of the weights before dropout); the backward leaves the dropped,
// scaled weights Z in scores (they met V: dV = Z^T dO) and dS = P (dP' - D) in dp, where dP' = dP / (1 - rate)
// at the kept weights and 0 at the dropped ones (D = dO . O is still rowsum(P dP')).
struct RowDropout {
  double rate = 0.0;
  uint64_t seed = 0, counter0 = 0;
  const uint64_t* rebase = nullptr;  // a captured CUDA graph's (core/rng.h); null on the CPU
};
struct AttentionRows {
  int64_t row0 = 0, Nq = 0;
  bool causal = false;
  int64_t Nk = 0;  // keys in all; 0: the scores' width W
  RowDropout dropout;
};
void attention_rows_softmax_cpu(const Tensor& scores, const Tensor& key_padding_mask, const AttentionRows& rows,
                                const Tensor& lse);
void attention_rows_grad_cpu(const Tensor& scores, const Tensor& dp, const Tensor& key_padding_mask,
                             const AttentionRows& rows, const Tensor& lse, const Tensor& D);
#ifdef CF_WITH_CUDA
void attention_rows_softmax_cuda(const Tensor& scores, const Tensor& key_padding_mask, const AttentionRows& rows,
                                 const Tensor& lse);
void attention_rows_grad_cuda(const Tensor& scores, const Tensor& dp, const Tensor& key_padding_mask,
                              const AttentionRows& rows, const Tensor& lse, const Tensor& D);
#endif
inline void attention_rows_softmax(const Tensor& scores, const Tensor& kpm, const AttentionRows& rows,
                                   const Tensor& lse) {
  CF_DEVICE_DISPATCH("flash_attention", scores.device(), attention_rows_softmax_cpu(scores, kpm, rows, lse),
                     attention_rows_softmax_cuda(scores, kpm, rows, lse));
}
inline void attention_rows_grad(const Tensor& scores, const Tensor& dp, const Tensor& kpm, const AttentionRows& rows,
                                const Tensor& lse, const Tensor& D) {
  CF_DEVICE_DISPATCH("flash_attention", scores.device(), attention_rows_grad_cpu(scores, dp, kpm, rows, lse, D),
                     attention_rows_grad_cuda(scores, dp, kpm, rows, lse, D));
}

struct BlockAttentionParams {
  // The chunk offsets every chunk sees, distinct modulo C, offsets[0] == 0.
  std::vector<int64_t> offsets;
  double scale = 1.0;
  bool causal = false;     // key position j blocked for query position p when j > p
  bool self_mask = false;  // a query's own score is replaced by self_score (Reformer)
  double self_score = -1e5;
  // Rounds R over one q, k, v (LSH's hashing rounds): output head h * R + r attends
  // with table head h * R + r over q, k, v head h; the backward sums the rounds'
  // gradients into one dq, dk, dv (round by round, so deterministically).
  int64_t rounds = 1;
  // Attention-weight dropout (inverted, rate `dropout`; the CPU kernel and the GEMM path, so on both devices;
  // the fused and tensor-core CUDA kernels refuse a rate, and the dispatch sends one to the GEMM path): the
  // weight of query position i on key position j in output head (b, ho) is dropped when the Philox draw of
  // counter dropout_counter0 + ((b Ho + ho) N + i) N + j under key dropout_seed falls below the rate, else
  // scaled by 1 / (1 - rate): the counter dropout() gives that entry of the dense (B, Ho, N, N) weights of
  // the same attention (nn::chunked_dense_attention), so both drop the same weights. lse stays that of the
  // weights before dropout (it also combines LSH's rounds).
  double dropout = 0.0;
  uint64_t dropout_seed = 0, dropout_counter0 = 0;
  const uint64_t* dropout_rebase = nullptr;  // a captured CUDA graph's (core/rng.h); null on the CPU
};

// The same arm of block_attention (any rounds, no dropout): bfloat16 q, k, v gathered into bfloat16 tiles, every
// product on AMX or vdpbf16ps, float32 out, lse and gradients; dout bfloat16 (any strides, as the float kernels).
bool block_attention_bf16_supported(const Tensor& q, const Tensor& k, const Tensor& v);
void block_attention_forward_bf16_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                     const Tensor& key_padding_mask, const BlockAttentionParams& p,
                                     const Tensor& out, const Tensor& lse);
void block_attention_backward_bf16_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                      const Tensor& key_padding_mask, const BlockAttentionParams& p,
                                      const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dlse,
                                      const Tensor& dq, const Tensor& dk, const Tensor& dv);

// block_attention through GEMMs over chunks of blocks (attention_gemm.cpp), the float32 and float64 path on CUDA for
// large calls and for every call with attention dropout (block_attention_forward below says when). Per chunk of n
// blocks: a window table (B, Hm, C, W) (W = offsets.size() * w: block c's own slots, then those of blocks c +
// offsets[t]) names the rows; q, k, v rows are gathered into (B, Ho, n, w | W, D) slots (gather_slot_rows), S =
// (scale Q) K^T by one batched GEMM, one row kernel (block_rows_softmax) masks and normalises it and writes lse at
// the query positions, O = P V, and O's rows go back to token order (scatter_slot_rows). The backward recomputes P =
// exp(S - lse) and dS = P (dP - D) in one row kernel (block_rows_grad) and scatters dQ, and dK, dV window part by
// window part, into dq, dk, dv. Why: the fused kernel reads two shared-memory operands per multiply-add; it ran 3.4x
// / 5.8x behind PyTorch's gather + bmm at N = 16384 / 65536 on an H200 (docs/benchmarks.md, 2026-11-27), and the
// batched GEMMs run at cuBLAS speed. Memory: the buffers of one chunk hold at most clamp(4 x bytes of q, k, v, 16
// MiB, 128 MiB) together; chunk_blocks > 0 fixes the blocks per chunk (tests). Same contracts as
// block_attention_forward_cpu / _backward_cpu; any device.
void block_attention_forward_gemm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                  const Tensor& key_padding_mask, const BlockAttentionParams& p, const Tensor& out,
                                  const Tensor& lse, int64_t chunk_blocks = 0);
void block_attention_backward_gemm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                   const Tensor& key_padding_mask, const BlockAttentionParams& p,
                                   const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dlse,
                                   const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t chunk_blocks = 0);

// The slot steps of the block GEMM path. A slot table is an int64 view (B, Ho, n, s) (any strides: a slice
// of the window table, stride 0 over heads for a shared table); a position outside [0, N) is an empty slot.
//   gather_slot_rows: out (B, Ho, n, s, D) contiguous = the rows x[b, ho / rounds, pos] of x (B, Ho / rounds,
//     N, D) (last axis unit-stride), zeros for empty slots.
//   scatter_slot_rows: for head h < Ho / rounds, the rows src[b, h * rounds + round, c, u] (src (B, Ho, n, s,
//     D), last axis unit-stride) written (accumulate: added) to out[b, h, pos] (out (B, Ho / rounds, N, D),
//     last axis unit-stride); empty slots skipped. A position sits in one slot of a table's (b, ho), so one
//     call writes each row of out at most once (no atomics; rounds are separate calls, in order).
void gather_slot_rows_cpu(const Tensor& x, const Tensor& table, int64_t rounds, const Tensor& out);
void scatter_slot_rows_cpu(const Tensor& src, const Tensor& table, int64_t rounds, int64_t round, bool accumulate,
                           const Tensor& out);
// The row steps: scores (B, Ho, n, w, W) contiguous (already scaled) against the window table view
// (B, Ho, n, W) (its first w columns are the query slots' positions); an entry is blocked as in block
// attention (empty query or key slot, a padded key, key after query when causal) and the own score becomes
// self_score under self_mask.
//   block_rows_softmax: each row its softmax (a row with nothing allowed: zeros), its log-sum-exp written to
//     lse[b, ho, pos] (lse (B, Ho, N), any strides; empty query slots write nothing).
//   block_rows_grad: scores become P = exp(S - lse[b, ho, pos]) and dp (same shape) becomes
//     dS = P (dP - D[b, ho, c, r]) (D (B, Ho, n, w) contiguous, one value per query slot: dO . O - dlse),
//     0 where the score was self_score (a constant).
// With dropout.rate > 0 the row steps also drop weights as BlockAttentionParams says (counters by the original
// positions of the table), and hand on the dropped weights and dS as attention_rows_grad does.
struct BlockRows {
  bool causal = false;
  bool self_mask = false;
  double self_score = -1e5;
  RowDropout dropout;
};
void block_rows_softmax_cpu(const Tensor& scores, const Tensor& table, const Tensor& key_padding_mask,
                            const BlockRows& rows, const Tensor& lse);
void block_rows_grad_cpu(const Tensor& scores, const Tensor& dp, const Tensor& table, const Tensor& key_padding_mask,
                         const BlockRows& rows, const Tensor& lse, const Tensor& D);
#ifdef CF_WITH_CUDA
void gather_slot_rows_cuda(const Tensor& x, const Tensor& table, int64_t rounds, const Tensor& out);
void scatter_slot_rows_cuda(const Tensor& src, const Tensor& table, int64_t rounds, int64_t round, bool accumulate,
                            const Tensor& out);
void block_rows_softmax_cuda(const Tensor& scores, const Tensor& table, const Tensor& key_padding_mask,
                             const BlockRows& rows, const Tensor& lse);
void block_rows_grad_cuda(const Tensor& scores, const Tensor& dp, const Tensor& table,
                          const Tensor& key_padding_mask, const BlockRows& rows, const Tensor& lse, const Tensor& D);
#endif
inline void gather_slot_rows(const Tensor& x, const Tensor& table, int64_t rounds, const Tensor& out) {
  CF_DEVICE_DISPATCH("block_attention", out.device(), gather_slot_rows_cpu(x, table, rounds, out),
                     gather_slot_rows_cuda(x, table, rounds, out));
}
inline void scatter_slot_rows(const Tensor& src, const Tensor& table, int64_t rounds, int64_t round,
                              bool accumulate, const Tensor& out) {
  CF_DEVICE_DISPATCH("block_attention", out.device(),
                     scatter_slot_rows_cpu(src, table, rounds, round, accumulate, out),
                     scatter_slot_rows_cuda(src, table, rounds, round, accumulate, out));
}
inline void block_rows_softmax(const Tensor& scores, const Tensor& table, const Tensor& kpm, const BlockRows& rows,
                               const Tensor& lse) {
  CF_DEVICE_DISPATCH("block_attention", scores.device(), block_rows_softmax_cpu(scores, table, kpm, rows, lse),
                     block_rows_softmax_cuda(scores, table, kpm, rows, lse));
}
inline void block_rows_grad(const Tensor& scores, const Tensor& dp, const Tensor& table, const Tensor& kpm,
                            const BlockRows& rows, const Tensor& lse, const Tensor& D) {
  CF_DEVICE_DISPATCH("block_attention", scores.device(), block_rows_grad_cpu(scores, dp, table, kpm, rows, lse, D),
                     block_rows_grad_cuda(scores, dp, table, kpm, rows, lse, D));
}

// Which float32 / float64 block attention path CUDA takes: kAuto picks the GEMM path when one round of a call
// scores at least kBlockGemmMinScores entries (B * H * C * w * W, H the heads of q) or the call has more than
// 65535 blocks or batch*heads (the fused kernel's grid limits), the fused kernel below. kMma takes the
// tensor-core kernels for float32 where they take the call (block_attention_takes_mma), else as kAuto. The
// environment variable CF_BLOCK_ATTENTION_PATH=fused|gemm|mma|auto sets it at start-up (benchmarks compare
// the paths); set_block_attention_path changes it later. The CPU always runs its fused kernel. A call with
// attention dropout takes the GEMM path whatever the setting (the fused and tensor-core kernels have none).
// kAuto takes the float32 tensor-core kernels too, where block_attention_mma_preferred says they were measured
// faster (below); the forward and the backward choose separately, since every path reads the out and lse the
// others write.
enum class BlockAttentionPath { kAuto, kFused, kGemm, kMma };
BlockAttentionPath parse_block_attention_path(const std::string& name);  // "auto", "fused", "gemm", "mma"
void set_block_attention_path(BlockAttentionPath path);
BlockAttentionPath block_attention_path();
bool block_attention_takes_gemm(const Tensor& q, const Tensor& members, const BlockAttentionParams& p);
// The call is float32, without dropout, and block_attention_mma_supported (contiguous, 16-byte aligned q, k, v
// of head size 64 on a device with tensor cores), and the path is kMma, or kAuto and
// block_attention_mma_preferred for this direction (backward: the backward pass). Rounds (LSH) take them under
// kAuto too: on an H200 (2026-11-30, scripts/gpu_check.sh mma, peers.py LSH rows, 4 heads, d 64, N = 1024 ...
// 65536) the tensor-core kernels took 0.40-0.73 of kAuto's fused / GEMM time, forward and forward + backward,
// and LSH's model step (cf-bench model, N = 512 / 2048) 2.18x / 1.45x full attention's instead of 3.81x / 2.64x.
bool block_attention_takes_mma(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                               const BlockAttentionParams& p, bool backward = false);
// Where kAuto takes the float32 tensor-core kernels. Measured on an H200 (2026-11-29, peers.py fwd and fwd+bwd,
// 4 heads, d 64, kMma against kAuto's fused / GEMM choice, scripts/gpu_check.sh mma): with blocks of at most
// kBlockMmaMaxRows rows the tensor-core kernels were faster both ways (block attention at k = sqrt(N), blocks of
// 32 / 64 / 128: forward 0.89 / 0.53 / 0.49 of the time, backward 0.84 / 0.70 / 0.96; neural clustering alike).
// Wider blocks (Cluster-Former's 256, block attention at N = 65536): their backward was 1.2-1.4x slower at
// every size, their forward faster once the call had at least one block per multiprocessor (B H C >= 256 on 132
// SMs: 0.51-0.79 of the time) and slower below (16 and 64 blocks: 1.26-1.35x), where one (block, 64-row tile)
// per thread block leaves most of the chip idle while the GEMM path's batched products spread further.
// block_attention_mma_preferred (declared with the kernels below) holds that rule.
constexpr int64_t kBlockMmaMaxRows = 128;

// Which float32 / float64 flash_attention path CUDA takes: the GEMM path (kAuto, kGemm), or for float32 the
// tensor-core kernels (kMma, where flash_attention_takes_mma: contiguous, 16-byte aligned q, k, v of head
// size 64; else the GEMM path). CF_FLASH_ATTENTION_PATH=auto|gemm|mma sets it at start-up,
// set_flash_attention_path later. kAuto stays on the GEMM path: on an H200 (2026-11-29, q, k, v (1, 4, N, 64))
// the float32 tensor-core kernels' forward took 0.97-2.2x the GEMM path's time and their backward 2.3-5.5x
// (N = 1024 ... 65536), so the GEMM path (cuBLAS SGEMM and one row kernel) stays float32 full attention's.
// A call with attention dropout takes the GEMM path whatever the setting: the tensor-core kernels have none.
enum class FlashAttentionPath { kAuto, kGemm, kMma };
FlashAttentionPath parse_flash_attention_path(const std::string& name);  // "auto", "gemm", "mma"
void set_flash_attention_path(FlashAttentionPath path);
FlashAttentionPath flash_attention_path();
bool flash_attention_takes_mma(const Tensor& q, const Tensor& k, const Tensor& v, double dropout = 0.0);

// Which float32 / float64 routed_attention path CUDA takes: for float32 the tensor-core kernels (kAuto, kMma,
// where routed_attention_takes_mma: contiguous, 16-byte aligned q, k, v of head size 64), else its fused kernel
// (kFused, and every call the tensor-core kernels do not take). CF_ROUTED_ATTENTION_PATH=auto|fused|mma at
// start-up, set_routed_attention_path later. Measured on an H200 (2026-11-29, routing attention fwd+bwd, N =
// 1024 ... 65536, causal and not): the tensor-core kernels' backward took 0.52-0.99 of the fused kernel's time,
// their forward 0.89-1.02 (one cell, N = 1024 non-causal, 1.43; its causal twin 0.99). A call with attention
// dropout takes the fused kernel whatever the setting (the tensor-core kernels have none).
enum class RoutedAttentionPath { kAuto, kFused, kMma };
RoutedAttentionPath parse_routed_attention_path(const std::string& name);  // "auto", "fused", "mma"
void set_routed_attention_path(RoutedAttentionPath path);
RoutedAttentionPath routed_attention_path();
bool routed_attention_takes_mma(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_members,
                                const Tensor& key_members, double dropout = 0.0);
// Measured on an H200 (2026-11-28, cf-bench attention fwd+bwd, 4 heads, both paths forced): the GEMM path was
// as fast or faster from 2 M entries a round (neural clustering N = 4096: 0.88 against 1.05 ms; Cluster-Former
// N = 1024, blocks of 256: 0.88 against 1.42 ms; LSH-8 N = 4096: 6.26 against 6.18) and 1.2-2.4x faster from
// 16.8 M, the fused kernel faster at 0.5 M a round (LSH-8 N = 1024: 2.92 against 4.96 ms, its backward
// scattering each round's gradients in launches of their own). Per round, since the GEMM path's launches
// grow with the rounds; the switch sits at the geometric middle of 0.5 M and 2 M.
constexpr int64_t kBlockGemmMinScores = int64_t(1) << 20;

// q, k (B, H, N, Dk), v (B, H, N, Dv) contiguous; members contiguous int64
// (B, Hm, C, w), Hm == H * rounds or 1, every position at most once per (b, hm),
// in [-1, N). key_padding_mask as above. out (B, H * rounds, N, Dv) and lse
// (B, H * rounds, N) may be strided views (last axis of out unit-stride): tokens
// in no slot, and queries with nothing allowed, get out = 0 and lse = -inf.
void block_attention_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                 const Tensor& key_padding_mask, const BlockAttentionParams& p, const Tensor& out,
                                 const Tensor& lse);
// dout (B, H * rounds, N, Dv) (last axis unit-stride) and dlse (B, H * rounds, N)
// (undefined: no gradient reaches lse) may be strided views; out and lse as the
// forward wrote them. Writes dq, dk, dv (q, k, v's shapes; contiguous, preallocated).
void block_attention_backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                  const Tensor& key_padding_mask, const BlockAttentionParams& p, const Tensor& out,
                                  const Tensor& lse, const Tensor& dout, const Tensor& dlse, const Tensor& dq,
                                  const Tensor& dk, const Tensor& dv);

struct RoutedAttentionParams {
  double scale = 1.0;
  bool causal = false;  // key position j blocked for query position i when j > i
  // Attention-weight dropout (inverted, rate `dropout`; the CPU kernel and the fused CUDA kernel, the tensor-core
  // kernels refuse a rate and the dispatch sends one to the fused kernel): the weight of query position i on key
  // position j in list c of head (b, h) is dropped when the Philox draw of counter dropout_counter0 + (((c B + b) H +
  // h) N + i) N + j under key dropout_seed falls below the rate, else scaled by 1 / (1 - rate): list c's share of C
  // successive dense (B, H, N, N) weight tensors, the counters dropout() gives them in
  // routed_attention_dense_reference's loop over the lists (under a dropout share of 1:
  // autograd/dropout_share.h).
  double dropout = 0.0;
  uint64_t dropout_seed = 0, dropout_counter0 = 0;
  const uint64_t* dropout_rebase = nullptr;  // a captured CUDA graph's (core/rng.h); null on the CPU
  int64_t list0 = 0;  // c above is list0 + the list's index in this call (a backward over a slice of the lists)
};

// q, k (B, H, N, Dk), v (B, H, N, Dv) contiguous; query_members (B', H', C, wq) and
// key_members (B', H', C, wk) contiguous int64, B' in {1, B}, H' in {1, H}, a
// position outside [0, N) counting as an empty slot. key_padding_mask as above.
// Writes out (B, H, C * wq, Dv) and lse (B, H, C * wq), contiguous, in slot order
// (row c * wq + r: slot r of list c); empty query slots and queries with nothing
// allowed get out = 0, lse = -inf.
void routed_attention_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_members,
                                  const Tensor& key_members, const Tensor& key_padding_mask,
                                  const RoutedAttentionParams& p, const Tensor& out, const Tensor& lse);
// dout (B, H, C * wq, Dv) contiguous, slot order (rows of empty query slots are
// ignored); out and lse as the forward wrote them. Writes the slot-order
// gradients dq (B, H, C * wq, Dk), dk (B, H, C * wk, Dk), dv (B, H, C * wk, Dv)
// (contiguous, preallocated; empty slots get zero rows): the caller adds them to
// the positions the slots hold.
void routed_attention_backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_members,
                                   const Tensor& key_members, const Tensor& key_padding_mask,
                                   const RoutedAttentionParams& p, const Tensor& out, const Tensor& lse,
                                   const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv);

// routed_attention's steps between slot order and token order (autograd/ops/attention.cpp). Slot s = c w + r
// of a list table `lists` (B', H', n, w) contiguous int64 (B' in {1, B}, H' in {1, H}) holds the position
// lists[b', h', c, r]; one outside [0, N) is an empty slot. Each position's terms are added in increasing s on
// both devices (CUDA: grouped by position with segments_by_key_cuda, no floating-point atomics): the same bits.
//   routed_slots_to_tokens: out (B, H, N, Dv) = for each position, the sum of the rows slots (B, H, n w, Dv) of
//     the slots holding it, divided by count (B, H, N) (written, slots' dtype): how many of those slots see a
//     key (lse (B, H, n w) > -inf), at least 1 in the divisor (a position in no list, or seeing no key, gets 0:
//     the rows of a slot that sees no key are 0). The reference code's scatter_mean over the lists that give
//     the query an output.
//   routed_tokens_to_slots: gs (B, H, n w, Dv) = g[b, h, pos(s)] / max(count[b, h, pos(s)], 1) (g (B, H, N, Dv)
//     contiguous), rows of empty slots 0.
//   routed_slots_add: out (B, H, N, D) += the rows src (B, H, n w, D) at the positions their slots hold (empty
//     slots skipped); src2 / out2 alike with the same lists, where defined (the key lists' dk and dv). With
//     accumulate false out is overwritten (the sums start from 0; a position no slot holds gets 0): no fill
//     before the first chunk.
// A list table as both arms read it: slot s of head bh = b H + h holds pos(bh, s), or -1 for an empty slot.
struct RoutedLists {
  const int64_t* p;
  int64_t B, H, Bl, Hl, S, N;
  CF_HOST_DEVICE int64_t pos(int64_t bh, int64_t s) const {
    const int64_t b = bh / H, h = bh % H;
    const int64_t v = p[((Bl == 1 ? 0 : b) * Hl + (Hl == 1 ? 0 : h)) * S + s];
    return v >= 0 && v < N ? v : -1;
  }
};
inline RoutedLists routed_lists_of(const Tensor& lists, int64_t B, int64_t H, int64_t N) {
  return {static_cast<const int64_t*>(lists.raw_data()), B, H, lists.shape()[0], lists.shape()[1],
          lists.shape()[2] * lists.shape()[3], N};
}
void routed_slots_to_tokens_cpu(const Tensor& slots, const Tensor& lse, const Tensor& lists, const Tensor& out,
                                const Tensor& count);
void routed_tokens_to_slots_cpu(const Tensor& g, const Tensor& count, const Tensor& lists, const Tensor& gs);
void routed_slots_add_cpu(const Tensor& src, const Tensor& lists, const Tensor& out, const Tensor& src2,
                          const Tensor& out2, bool accumulate);
#ifdef CF_WITH_CUDA
void routed_slots_to_tokens_cuda(const Tensor& slots, const Tensor& lse, const Tensor& lists, const Tensor& out,
                                 const Tensor& count);
void routed_tokens_to_slots_cuda(const Tensor& g, const Tensor& count, const Tensor& lists, const Tensor& gs);
void routed_slots_add_cuda(const Tensor& src, const Tensor& lists, const Tensor& out, const Tensor& src2,
                           const Tensor& out2, bool accumulate);
#endif
inline void routed_slots_to_tokens(const Tensor& slots, const Tensor& lse, const Tensor& lists, const Tensor& out,
                                   const Tensor& count) {
  CF_DEVICE_DISPATCH("routed_attention", out.device(), routed_slots_to_tokens_cpu(slots, lse, lists, out, count),
                     routed_slots_to_tokens_cuda(slots, lse, lists, out, count));
}
inline void routed_tokens_to_slots(const Tensor& g, const Tensor& count, const Tensor& lists, const Tensor& gs) {
  CF_DEVICE_DISPATCH("routed_attention", gs.device(), routed_tokens_to_slots_cpu(g, count, lists, gs),
                     routed_tokens_to_slots_cuda(g, count, lists, gs));
}
inline void routed_slots_add(const Tensor& src, const Tensor& lists, const Tensor& out, const Tensor& src2,
                             const Tensor& out2, bool accumulate) {
  CF_DEVICE_DISPATCH("routed_attention", out.device(), routed_slots_add_cpu(src, lists, out, src2, out2, accumulate),
                     routed_slots_add_cuda(src, lists, out, src2, out2, accumulate));
}

// Rounds combined through their log-sum-exp (the Reformer's multi-round rule), on
// block_attention's packed rows [out | lse]: per_round (B, H * R, N, Dv + 1)
// (head h * R + r: round r of head h) and combined (B, H, N, Dv + 1), contiguous.
//   combine: lse = log sum_r exp(lse_r), out = sum_r w_r out_r, w_r = exp(lse_r - lse)
//            (every round -inf: out 0, lse -inf).
//   split:   given the combined rows' gradient g = [g_out | g_lse], each round's
//            [w_r g_out | w_r (g_out . (out_r - out) + g_lse)] into per_round_grad.
void rounds_combine_cpu(const Tensor& per_round, int64_t rounds, const Tensor& combined);
void rounds_split_cpu(const Tensor& per_round, const Tensor& combined, const Tensor& grad, int64_t rounds,
                      const Tensor& per_round_grad);

#ifdef CF_WITH_CUDA
void rounds_combine_cuda(const Tensor& per_round, int64_t rounds, const Tensor& combined);
void rounds_split_cuda(const Tensor& per_round, const Tensor& combined, const Tensor& grad, int64_t rounds,
                       const Tensor& per_round_grad);
void flash_attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& key_padding_mask, const FlashAttentionParams& p, const Tensor& out,
                                  const Tensor& lse);
void flash_attention_backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& key_padding_mask, const FlashAttentionParams& p,
                                   const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dlse,
                                   const Tensor& dq, const Tensor& dk, const Tensor& dv);
void block_attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                  const Tensor& key_padding_mask, const BlockAttentionParams& p,
                                  const Tensor& out, const Tensor& lse);
void block_attention_backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                   const Tensor& key_padding_mask, const BlockAttentionParams& p,
                                   const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dlse,
                                   const Tensor& dq, const Tensor& dk, const Tensor& dv);
void routed_attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_members,
                                   const Tensor& key_members, const Tensor& key_padding_mask,
                                   const RoutedAttentionParams& p, const Tensor& out, const Tensor& lse);
void routed_attention_backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_members,
                                    const Tensor& key_members, const Tensor& key_padding_mask,
                                    const RoutedAttentionParams& p, const Tensor& out, const Tensor& lse,
                                    const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv);
#endif

// The tensor-core kernels (attention_mma_cuda.cu): whether they take q, k, v (CUDA, one dtype of bfloat16,
// float16 or float32, compute capability 8.0 or newer, batch*heads <= 65535) and the kernels themselves: q, k,
// v contiguous and 16-byte aligned; out and lse float32 (out's last axis unit-stride), written as the float32
// forward writes them, so the float32 backward can read them too.
//   16-bit q, k, v under autocast (issue 26): mma.m16n8k16 with float32 accumulation.
//   float32 q, k, v (issue 24): mma.m16n8k8 in TF32 with each operand split into two TF32 parts and three
//     products summed (3xTF32: about float32's accuracy, as PyTorch's memory-efficient attention computes
//     float32), one product when the user allowed TF32 (cf::cuda::set_allow_tf32). Taken by the float32 ops
//     below only through the path settings (flash_attention_path, block_attention_path).
// flash_attention: head size 64 or (16-bit) 128 forward, 64 backward (other sizes run the float32 backward on
// float32 copies). block_attention: head size 64, forward and backward, over rounds too (a table per output head
// h * R + r, or one shared; supported() takes the call's rounds; the backward launches once per round, adding
// each round's gradients to the last, as the scalar kernels). routed_attention (float32
// only, through its path setting; its 16-bit inputs still run on float32 copies): head size 64, outputs and
// gradients in slot order as routed_attention_forward_cpu's. The backward takes q, k, v, the float32 out,
// lse, dout (last axis unit-stride) and dlse (or undefined), and writes float32 dq, dk, dv (contiguous).
#ifdef CF_WITH_CUDA
bool flash_attention_mma_supported(const Tensor& q, const Tensor& k, const Tensor& v);
void flash_attention_forward_mma_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& key_padding_mask, const FlashAttentionParams& p,
                                      const Tensor& out, const Tensor& lse);
bool flash_attention_backward_mma_supported(const Tensor& q, const Tensor& k, const Tensor& v);
void flash_attention_backward_mma_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& key_padding_mask, const FlashAttentionParams& p,
                                       const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dlse,
                                       const Tensor& dq, const Tensor& dk, const Tensor& dv);
bool block_attention_mma_supported(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                   int64_t rounds = 1);
bool block_attention_mma_preferred(const Tensor& q, const Tensor& members, bool backward, int64_t rounds = 1);
void block_attention_forward_mma_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                      const Tensor& key_padding_mask, const BlockAttentionParams& p,
                                      const Tensor& out, const Tensor& lse);
void block_attention_backward_mma_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                       const Tensor& key_padding_mask, const BlockAttentionParams& p,
                                       const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dlse,
                                       const Tensor& dq, const Tensor& dk, const Tensor& dv);
bool routed_attention_mma_supported(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_members,
                                    const Tensor& key_members);
void routed_attention_forward_mma_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_members,
                                       const Tensor& key_members, const Tensor& key_padding_mask,
                                       const RoutedAttentionParams& p, const Tensor& out, const Tensor& lse);
void routed_attention_backward_mma_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& query_members, const Tensor& key_members,
                                        const Tensor& key_padding_mask, const RoutedAttentionParams& p,
                                        const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                                        const Tensor& dk, const Tensor& dv);
#else
inline bool flash_attention_mma_supported(const Tensor&, const Tensor&, const Tensor&) { return false; }
inline bool flash_attention_backward_mma_supported(const Tensor&, const Tensor&, const Tensor&) { return false; }
inline bool block_attention_mma_supported(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                          int64_t = 1) {
  return false;
}
inline bool block_attention_mma_preferred(const Tensor&, const Tensor&, bool, int64_t = 1) { return false; }
inline bool routed_attention_mma_supported(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                           const Tensor&) {
  return false;
}
// Never reached without CUDA (the supported() checks are false): the callers compile in CPU-only builds too.
inline void flash_attention_forward_mma_cuda(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                             const FlashAttentionParams&, const Tensor&, const Tensor&) {
  throw Error("[flash_attention] internal: the tensor-core kernel needs a CUDA build");
}
inline void flash_attention_backward_mma_cuda(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                              const FlashAttentionParams&, const Tensor&, const Tensor&,
                                              const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                              const Tensor&) {
  throw Error("[flash_attention] internal: the tensor-core kernel needs a CUDA build");
}
inline void block_attention_forward_mma_cuda(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                             const Tensor&, const BlockAttentionParams&, const Tensor&,
                                             const Tensor&) {
  throw Error("[block_attention] internal: the tensor-core kernel needs a CUDA build");
}
inline void block_attention_backward_mma_cuda(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                              const Tensor&, const BlockAttentionParams&, const Tensor&,
                                              const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                              const Tensor&, const Tensor&) {
  throw Error("[block_attention] internal: the tensor-core kernel needs a CUDA build");
}
inline void routed_attention_forward_mma_cuda(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                              const Tensor&, const Tensor&, const RoutedAttentionParams&,
                                              const Tensor&, const Tensor&) {
  throw Error("[routed_attention] internal: the tensor-core kernel needs a CUDA build");
}
inline void routed_attention_backward_mma_cuda(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                               const Tensor&, const Tensor&, const RoutedAttentionParams&,
                                               const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                               const Tensor&, const Tensor&) {
  throw Error("[routed_attention] internal: the tensor-core kernel needs a CUDA build");
}
#endif

inline void rounds_combine(const Tensor& per_round, int64_t rounds, const Tensor& combined) {
  CF_DEVICE_DISPATCH("block_attention", combined.device(), rounds_combine_cpu(per_round, rounds, combined),
                     rounds_combine_cuda(per_round, rounds, combined));
}
inline void rounds_split(const Tensor& per_round, const Tensor& combined, const Tensor& grad, int64_t rounds,
                         const Tensor& per_round_grad) {
  CF_DEVICE_DISPATCH("block_attention", combined.device(),
                     rounds_split_cpu(per_round, combined, grad, rounds, per_round_grad),
                     rounds_split_cuda(per_round, combined, grad, rounds, per_round_grad));
}
// float32 and float64 flash_attention: the fused kernel on the CPU, the GEMM path or (float32, when the path
// setting says so) the tensor-core kernels on CUDA (see above; the fused CUDA kernels stay, tested against
// them, and serve block_attention and routed_attention).
inline void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                    const FlashAttentionParams& p, const Tensor& out, const Tensor& lse) {
  CF_DEVICE_DISPATCH("flash_attention", out.device(), flash_attention_forward_cpu(q, k, v, kpm, p, out, lse),
                     flash_attention_takes_mma(q, k, v, p.dropout)
                         ? flash_attention_forward_mma_cuda(q, k, v, kpm, p, out, lse)
                         : flash_attention_forward_gemm(q, k, v, kpm, p, out, lse));
}
inline void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                     const FlashAttentionParams& p, const Tensor& out, const Tensor& lse,
                                     const Tensor& dout, const Tensor& dlse, const Tensor& dq, const Tensor& dk,
                                     const Tensor& dv) {
  CF_DEVICE_DISPATCH("flash_attention", out.device(),
                     flash_attention_backward_cpu(q, k, v, kpm, p, out, lse, dout, dlse, dq, dk, dv),
                     flash_attention_takes_mma(q, k, v, p.dropout)
                         ? flash_attention_backward_mma_cuda(q, k, v, kpm, p, out, lse, dout, dlse, dq, dk, dv)
                         : flash_attention_backward_gemm(q, k, v, kpm, p, out, lse, dout, dlse, dq, dk, dv));
}
inline void block_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                    const Tensor& kpm, const BlockAttentionParams& p, const Tensor& out,
                                    const Tensor& lse) {
  CF_DEVICE_DISPATCH("block_attention", out.device(),
                     block_attention_forward_cpu(q, k, v, members, kpm, p, out, lse),
                     block_attention_takes_mma(q, k, v, members, p, /*backward=*/false)
                         ? block_attention_forward_mma_cuda(q, k, v, members, kpm, p, out, lse)
                     : block_attention_takes_gemm(q, members, p)
                         ? block_attention_forward_gemm(q, k, v, members, kpm, p, out, lse)
                         : block_attention_forward_cuda(q, k, v, members, kpm, p, out, lse));
}
inline void block_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                     const Tensor& kpm, const BlockAttentionParams& p, const Tensor& out,
                                     const Tensor& lse, const Tensor& dout, const Tensor& dlse, const Tensor& dq,
                                     const Tensor& dk, const Tensor& dv) {
  CF_DEVICE_DISPATCH(
      "block_attention", out.device(),
      block_attention_backward_cpu(q, k, v, members, kpm, p, out, lse, dout, dlse, dq, dk, dv),
      block_attention_takes_mma(q, k, v, members, p, /*backward=*/true)
          ? block_attention_backward_mma_cuda(q, k, v, members, kpm, p, out, lse, dout, dlse, dq, dk, dv)
      : block_attention_takes_gemm(q, members, p)
          ? block_attention_backward_gemm(q, k, v, members, kpm, p, out, lse, dout, dlse, dq, dk, dv)
          : block_attention_backward_cuda(q, k, v, members, kpm, p, out, lse, dout, dlse, dq, dk, dv));
}

inline void routed_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qm,
                                     const Tensor& km, const Tensor& kpm, const RoutedAttentionParams& p,
                                     const Tensor& out, const Tensor& lse) {
  CF_DEVICE_DISPATCH("routed_attention", out.device(),
                     routed_attention_forward_cpu(q, k, v, qm, km, kpm, p, out, lse),
                     routed_attention_takes_mma(q, k, v, qm, km, p.dropout)
                         ? routed_attention_forward_mma_cuda(q, k, v, qm, km, kpm, p, out, lse)
                         : routed_attention_forward_cuda(q, k, v, qm, km, kpm, p, out, lse));
}
inline void routed_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qm,
                                      const Tensor& km, const Tensor& kpm, const RoutedAttentionParams& p,
                                      const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                                      const Tensor& dk, const Tensor& dv) {
  CF_DEVICE_DISPATCH("routed_attention", out.device(),
                     routed_attention_backward_cpu(q, k, v, qm, km, kpm, p, out, lse, dout, dq, dk, dv),
                     routed_attention_takes_mma(q, k, v, qm, km, p.dropout)
                         ? routed_attention_backward_mma_cuda(q, k, v, qm, km, kpm, p, out, lse, dout, dq, dk, dv)
                         : routed_attention_backward_cuda(q, k, v, qm, km, kpm, p, out, lse, dout, dq, dk, dv));
}

}  // namespace cf::kernels
