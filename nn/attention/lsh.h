#pragma once
// LSH attention (Kitaev, Kaiser, Levskaya 2020, "Reformer: The Efficient Transformer", section 2).
//
//  * Shared-QK (section 2, "Shared-QK Transformer"): keys are the queries' projection, normalised,
//    k_j = q_j / |q_j|; MultiHeadAttention honours shares_qk() by passing k = q.
//  * Hashing (section 2, "Locality sensitive hashing", Figure 1): per round r a random rotation R_r (d_k x b/2,
//    Gaussian entries) maps x to h(x) = argmax([xR; -xR]), b = n_buckets buckets. Rotations are drawn per head
//    and per round from a Generator at every forward, or fixed by the "seed" option (the same seed in two
//    layers gives them the same rotations: give each layer its own).
//  * Sort and chunk (section 2, "LSH attention", and Figure 2): tokens sorted by (bucket, position),
//    cut into chunks of m = bucket_size consecutive tokens; each chunk attends to itself and to the previous
//    chunk (cyclically within the round: the reference code's look-adjacent for one round; it sorts all rounds
//    as one sequence, so there a round's first chunk looks back at the previous round's last), i.e. P~_i = {j : floor(s_i/m) - 1 <= floor(s_j/m)
//    <= floor(s_i/m)}. Default n_buckets = 2N/m (rounded to an even number >= 2), the paper's m = 2l/n_buckets:
//    chunks twice the average bucket size.
//  * "Causal masking for shared-QK attention": a token does not attend to itself unless it has no other target
//    (the self score becomes -1e5), causal masks use the ORIGINAL positions.
//  * Multi-round (section 2, "Multi-round LSH attention"): P_i = union_r P_i^(r); the n_hashes rounds run
//    independently and combine as o_i = sum_r exp(z(i, P_i^(r)) - z(i, P_i)) o_i^(r), z the log-sum-exp of the
//    round's scores (the reference code's combination; keys found in several rounds are not de-duplicated).
//  * Key padding: padded tokens are masked as keys and sorted behind every real bucket so that they take no slot
//    of a real chunk; any N works (the last chunk is padded internally). Real tokens' outputs still depend on
//    how much padding a sample has, in two ways: the default n_buckets counts padded positions (2N/m), and the
//    cyclic look-back of the first chunk reaches the last chunk, which padding fills (nothing to attend there)
//    where without padding it would be the last real chunk. (The reference code hashes padding like any token,
//    so there it takes slots too.) A fixed n_buckets and no padding beyond the chunk of the last real token
//    (N rounded up to a multiple of m) give the unpadded outputs.
// The sort-and-chunk attention itself is the shared nn/attention/chunked.h (rounds folded into the head axis).
// Nothing builds an N x N matrix: memory O(B * H * n_hashes * N * 2m). A bucket_size m above N is one chunk of N.
#include <cstdint>

#include "core/rng.h"
#include "nn/attention/attention.h"

namespace cf {
namespace nn {

// Gaussian random rotations (H, D, n_hashes, n_buckets / 2) for n_buckets even >= 2, drawn on `device` (on CUDA
// the generator's stream gives the CPU's values to within the device libm's rounding: randn's parity).
Tensor lsh_rotations(int64_t n_heads, int64_t head_dim, int64_t n_hashes, int64_t n_buckets, DType dtype,
                     Generator& gen, Device device = Device::cpu());

// Buckets h(x) = argmax([x R; -x R]) of x (B, H, N, D) under rotations (H, D, n_hashes, n_buckets / 2):
// int64 (B, H, n_hashes, N) in [0, n_buckets). The projections x R are made for a chunk of rows at a time,
// at most chunk_bytes of them (at least one row): whole, they would grow as N^2.
Tensor lsh_buckets(const Tensor& x, const Tensor& rotations, int64_t chunk_bytes = int64_t(64) << 20);

// LSH attention of q (B, H, N, D) (keys: q normalised) and v (B, H, N, Dv) for fixed buckets (B, H, n_hashes, N)
// with values in [0, n_buckets]; tokens with key_padding_mask (B, N) true are moved to bucket n_buckets. With
// dense_reference the same computation with explicit N x N masks (chunked_dense_attention): for tests.
// dropout: attention-weight dropout at that rate (0: none) drawn from *gen (null: the default generator),
// the same weights on both forms (ChunkedAttentionOptions::dropout).
Tensor lsh_attention(const Tensor& q, const Tensor& v, const Tensor& buckets, int64_t n_buckets,
                     const Tensor& key_padding_mask, bool causal, int64_t bucket_size, double scale,
                     bool dense_reference = false, double dropout = 0.0, Generator* gen = nullptr);

// Options (JSON), all optional:
//   "n_hashes": hashing rounds, default 8 (the port github.com/lucidrains/reformer-pytorch the ClusterFormer
//               comparison used, and the Reformer's best setting, LSH-8, section 5);
//   "bucket_size": chunk length m, default 64 (both);
//   "n_buckets": 0 (default) = 2N/m rounded to an even number >= 2; 1 = no hashing (one bucket); else even;
//   "seed": -1 (default) draws new rotations from the default generator each forward; >= 0 fixes them;
//   "scale": score scale, default 1/sqrt(d_k);
//   "dropout": attention-weight dropout in training, in [0, 1), default 0 (inside the block kernel).
class LSHAttention : public Attention {
 public:
  LSHAttention(int64_t n_hashes = 8, int64_t bucket_size = 64, int64_t n_buckets = 0, int64_t seed = -1,
               double scale = 0.0, double dropout = 0.0);
  static std::shared_ptr<Attention> create(const AttentionSpec& spec);
  Tensor forward(const AttentionArgs& args) override;
  std::string type() const override { return "lsh"; }
  bool shares_qk() const override { return true; }
  // The bucket count used for a sequence of n tokens.
  int64_t buckets_for(int64_t n) const;
  // The buckets a forward over q would use (draws rotations like forward: fixed when seeded).
  Tensor hash(const Tensor& q);

 private:
  int64_t n_hashes_, bucket_size_, n_buckets_, seed_;
  double scale_, dropout_;
};

}  // namespace nn
}  // namespace cf
