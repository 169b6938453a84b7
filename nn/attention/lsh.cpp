#include "nn/attention/lsh.h"

#include <cmath>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/nn_functional.h"
#include "autograd/ops/random.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/sort.h"
#include "autograd/ops/common.h"
#include "core/error.h"
#include "nn/attention/chunked.h"
#include "nn/attention/routing.h"  // l2_normalize

namespace cf {
namespace nn {

Tensor lsh_rotations(int64_t n_heads, int64_t head_dim, int64_t n_hashes, int64_t n_buckets, DType dtype,
                     Generator& gen, Device device) {
  CF_CHECK(n_heads > 0 && head_dim > 0 && n_hashes > 0 && n_buckets >= 2 && n_buckets % 2 == 0, ValueError,
           "[lsh_rotations] need positive n_heads, head_dim, n_hashes and an even n_buckets >= 2, got n_heads=",
           n_heads, " head_dim=", head_dim, " n_hashes=", n_hashes, " n_buckets=", n_buckets);
  return randn({n_heads, head_dim, n_hashes, n_buckets / 2}, dtype, gen, 0.0, 1.0, device);
}

Tensor lsh_buckets(const Tensor& x, const Tensor& rotations, int64_t chunk_bytes) {
  CF_CHECK(x.defined() && rotations.defined() && x.dim() == 4 && rotations.dim() == 4 &&
               rotations.shape()[0] == x.shape()[1] && rotations.shape()[1] == x.shape()[3],
           ShapeError, "[lsh_buckets] expected x (B, H, N, D) and rotations (H, D, n_hashes, n_buckets/2), got x ",
           x.defined() ? shape_str(x.shape()) : "undefined", ", rotations ",
           rotations.defined() ? shape_str(rotations.shape()) : "undefined");
  CF_CHECK(x.dtype() == rotations.dtype(), DTypeError, "[lsh_buckets] x is ", x.dtype(), ", rotations ",
           rotations.dtype());
  NoGradGuard ng;
  const Shape& s = x.shape();
  const int64_t B = s[0], H = s[1], N = s[2], D = s[3], R = rotations.shape()[2], half = rotations.shape()[3];
  const Tensor rot = reshape(rotations, {1, H, D, R * half});
  // Figure 1: h(x) = argmax([xR; -xR]) for each round's rotation, over chunks of rows: the
  // projections xR, (B, H, rows, R, n_buckets / 2), are the one large temporary, and whole they
  // would grow as N^2 (n_buckets grows with N: 8.6 GB for 8 rounds of 4 heads at N = 65536).
  const int64_t row_bytes = std::max<int64_t>(1, B * H * R * half * int64_t(dtype_size(x.dtype())));
  const int64_t rows = std::max<int64_t>(1, chunk_bytes / row_bytes);
  std::vector<Tensor> parts;
  for (int64_t n0 = 0; n0 < N; n0 += rows) {
    const int64_t n = std::min(rows, N - n0);
    Tensor xr = reshape(matmul(narrow(x.detach(), 2, n0, n), rot), {B, H, n, R, half});
    // argmax over [xR; -xR] without building it, one pass and one kernel (on a tie the first index,
    // which lies in the xR half, as argmax of the concatenation).
    parts.push_back(ops::signed_argmax(xr));  // (B, H, n, R)
  }
  if (parts.empty()) return Tensor::empty({B, H, R, 0}, kInt64, x.device());
  return contiguous(transpose(parts.size() == 1 ? parts[0] : cat(parts, 2), 2, 3));
}

Tensor lsh_attention(const Tensor& q, const Tensor& v, const Tensor& buckets, int64_t n_buckets,
                     const Tensor& key_padding_mask, bool causal, int64_t bucket_size, double scale,
                     bool dense_reference, double dropout, Generator* gen) {
  const char* who = "lsh_attention";
  CF_CHECK(q.defined() && v.defined() && q.dim() == 4 && v.dim() == 4 && v.shape()[0] == q.shape()[0] &&
               v.shape()[1] == q.shape()[1] && v.shape()[2] == q.shape()[2],
           ShapeError, "[", who, "] expected q (B, H, N, D) and v (B, H, N, Dv), got q ",
           q.defined() ? shape_str(q.shape()) : "undefined", ", v ", v.defined() ? shape_str(v.shape()) : "undefined");
  const int64_t B = q.shape()[0], H = q.shape()[1], N = q.shape()[2];
  CF_CHECK(buckets.defined() && buckets.dtype() == kInt64 && buckets.dim() == 4 && buckets.shape()[0] == B &&
               buckets.shape()[1] == H && buckets.shape()[3] == N && buckets.shape()[2] >= 1,
           ShapeError, "[", who, "] buckets must be int64 (B, H, n_hashes, N) = (", B, ", ", H, ", n_hashes, ", N,
           "), got ", buckets.defined() ? buckets.describe() : std::string("undefined"));
  CF_CHECK(bucket_size > 0 && n_buckets > 0, ValueError, "[", who,
           "] bucket_size and n_buckets must be positive, got ", bucket_size, " and ", n_buckets);
  const int64_t R = buckets.shape()[2];
  // A data check: on CUDA deferred to the next host read (no wait here).
  check_indices(who, buckets, n_buckets + 1, [who = std::string(who), n_buckets](int64_t at, int64_t id) {
    throw IndexError(str("[", who, "] bucket id ", id, " at flat position ", at, " is out of range [0, ", n_buckets,
                         "] (n_buckets)"));
  });
  Tensor b = buckets;
  // Padding sorts behind every real bucket: it never takes a slot in a chunk of real tokens.
  if (key_padding_mask.defined()) {
    CF_CHECK(key_padding_mask.dtype() == kBool && key_padding_mask.dim() == 2 &&
                 key_padding_mask.shape()[0] == B && key_padding_mask.shape()[1] == N,
             ShapeError, "[", who, "] key_padding_mask must be bool (B, N) = (", B, ", ", N, "), got ",
             key_padding_mask.describe());
    b = where(reshape(key_padding_mask, {B, 1, 1, N}), Tensor::full({1}, double(n_buckets), kInt64, b.device()), b);
  }
  // Sort by (bucket, position): the sort is stable, so equal buckets keep position order.
  Tensor order = reshape(argsort(b, -1), {B, H * R, N});
  ops::KnownGoodIndices built_here;  // the member table is argsort's order: no scan of it
  // (B, H * R, C, m); a chunk wider than the sequence is one chunk of N slots (the same attention, without
  // B H R (m - N) empty slots: bucket_size = 2^40 allocated them)
  Tensor members = chunk_order(order, std::max<int64_t>(1, std::min(bucket_size, N)));
  // One chunked call for all rounds: the kernel reads q, k, v through each round's
  // table (head h * R + r), so no round holds a copy of them.
  const Tensor k = l2_normalize(q);  // section 2: k_j = q_j / |q_j|
  ChunkedAttentionOptions o;
  o.look_back = 1;  // section 2, "LSH attention": own chunk and the previous one
  o.causal = causal;
  o.self_mask = true;
  o.scale = scale;
  o.rounds = R;
  // Multi-round (section 2.1): o_i = sum_r exp(z_r - logsumexp_r z_r) o_i^(r), inside the op; all rounds
  // -inf (nothing to attend) -> zeros.
  o.combine_rounds = true;
  o.dropout = dropout;
  o.generator = gen;
  ChunkedAttentionResult r = dense_reference ? chunked_dense_attention(q, k, v, members, key_padding_mask, o)
                                             : chunked_attention(q, k, v, members, key_padding_mask, o);
  return r.out;
}

LSHAttention::LSHAttention(int64_t n_hashes, int64_t bucket_size, int64_t n_buckets, int64_t seed, double scale,
                           double dropout)
    : n_hashes_(n_hashes), bucket_size_(bucket_size), n_buckets_(n_buckets), seed_(seed), scale_(scale),
      dropout_(dropout) {
  CF_CHECK(n_hashes > 0, ValueError, "[LSHAttention] n_hashes must be positive, got ", n_hashes);
  CF_CHECK(bucket_size > 0, ValueError, "[LSHAttention] bucket_size must be positive, got ", bucket_size);
  CF_CHECK(n_buckets == 0 || n_buckets == 1 || (n_buckets >= 2 && n_buckets % 2 == 0), ValueError,
           "[LSHAttention] n_buckets must be 0 (auto), 1 (no hashing) or even (argmax over [xR; -xR]), got ",
           n_buckets);
  CF_CHECK(seed >= -1, ValueError, "[LSHAttention] seed must be -1 (fresh rotations) or >= 0, got ", seed);
  CF_CHECK(scale >= 0, ValueError, "[LSHAttention] scale must be >= 0 (0: 1/sqrt(d_k)), got ", scale);
  CF_CHECK(dropout >= 0 && dropout < 1, ValueError, "[LSHAttention] dropout must be in [0, 1), got ", dropout);
}

std::shared_ptr<Attention> LSHAttention::create(const AttentionSpec& spec) {
  const Config& o = spec.options;
  int64_t n_hashes = o.get<int64_t>("n_hashes", 8);
  int64_t bucket_size = o.get<int64_t>("bucket_size", 64);
  int64_t n_buckets = o.get<int64_t>("n_buckets", 0);
  int64_t seed = o.get<int64_t>("seed", -1);
  double scale = o.get<double>("scale", 0.0);
  double dropout = o.get<double>("dropout", 0.0);
  o.finish();
  return std::make_shared<LSHAttention>(n_hashes, bucket_size, n_buckets, seed, scale, dropout);
}

int64_t LSHAttention::buckets_for(int64_t n) const {
  if (n_buckets_ > 0) return n_buckets_;
  // m = 2l / n_buckets (section 2): chunks twice the average bucket.
  int64_t nb = (2 * n + bucket_size_ - 1) / bucket_size_;
  nb += nb % 2;
  return std::max<int64_t>(2, nb);
}

Tensor LSHAttention::hash(const Tensor& q) {
  ops::check_defined(q, "LSHAttention.hash", "q");
  CF_CHECK(q.dim() == 4 && is_floating(q.dtype()), ShapeError,
           "[LSHAttention.hash] expected float q (B, H, N, D), got ", q.describe());
  const Shape& s = q.shape();
  const int64_t nb = buckets_for(s[2]);
  if (nb == 1) return Tensor::zeros({s[0], s[1], n_hashes_, s[2]}, kInt64, q.device());
  Generator fixed(uint64_t(seed_ < 0 ? 0 : seed_));
  Generator& gen = seed_ >= 0 ? fixed : default_generator();
  // Drawn on the host (the same stream on every device), then moved to q's device.
  return lsh_buckets(q, lsh_rotations(s[1], s[3], n_hashes_, nb, q.dtype(), gen, q.device()));
}

Tensor LSHAttention::forward(const AttentionArgs& a) {
  // Autocast: the hashing (random rotations, argmax) would bucket 16-bit-rounded products and
  // the gathered block kernel has no 16-bit path yet (issue 26): a float32 island on float32
  // copies of 16-bit q, v, output float32 (attention.h).
  if (autocast_dtype()) {
    const AttentionArgs a32 = autocast_float32_args(a);  // cast before turning the policy off
    AutocastGuard off(std::nullopt);
    return forward(a32);
  }
  check_attention_args(a, "LSHAttention");
  CF_CHECK(a.k.is_same(a.q), ValueError,
           "[LSHAttention] shares queries and keys (Reformer section 2): args.k must be args.q, got k ",
           shape_str(a.k.shape()), " distinct from q ", shape_str(a.q.shape()));
  const int64_t N = a.q.shape()[2];
  if (N == 0) return Tensor::zeros({a.q.shape()[0], a.q.shape()[1], 0, a.v.shape()[3]}, a.v.dtype(), a.v.device());
  const double scale = scale_ > 0 ? scale_ : 1.0 / std::sqrt(double(a.q.shape()[3]));
  return lsh_attention(a.q, a.v, hash(a.q), buckets_for(N), a.key_padding_mask, a.causal, bucket_size_, scale,
                       false, is_training() ? dropout_ : 0.0);
}

}  // namespace nn
}  // namespace cf
