#include "nn/attention/sparse.h"

#include <cmath>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/ops/elementwise.h"
#include "core/error.h"
#include "nn/attention/routing.h"

namespace cf {
namespace nn {

namespace {

void check_pattern(int64_t n, int64_t block, int64_t summary, const char* who) {
  CF_CHECK(n >= 0 && block >= 1 && summary >= 1 && summary <= block, ValueError, "[", who,
           "] needs n >= 0, block size l >= 1 and 1 <= summary c <= l; got n=", n, " l=", block, " c=", summary);
}

}  // namespace

void fixed_sparse_members(int64_t n, int64_t block, int64_t summary, bool causal, Tensor& query_members,
                          Tensor& key_members) {
  check_pattern(n, block, summary, "fixed_sparse_members");
  const int64_t C = std::max<int64_t>(1, (n + block - 1) / block), wk = block + (C - 1) * summary;
  std::vector<int64_t> qm(size_t(C * block), -1), km(size_t(C * wk), -1);
  auto in_seq = [&](int64_t p) { return p < n ? p : -1; };
  for (int64_t b = 0; b < C; ++b) {
    for (int64_t s = 0; s < block; ++s) {
      qm[size_t(b * block + s)] = in_seq(b * block + s);
      km[size_t(b * wk + s)] = in_seq(b * block + s);  // A(1): the own block
    }
    int64_t slot = block;
    for (int64_t o = 0; o < C; ++o) {  // A(2): the other blocks' last c positions
      if (o == b) continue;
      for (int64_t s = block - summary; s < block; ++s, ++slot)
        km[size_t(b * wk + slot)] = causal && o > b ? -1 : in_seq(o * block + s);
    }
  }
  query_members = Tensor::from_vector(qm, {1, 1, C, block});
  key_members = Tensor::from_vector(km, {1, 1, C, wk});
}

Tensor fixed_sparse_blocked(int64_t n, int64_t block, int64_t summary, Device device) {
  check_pattern(n, block, summary, "fixed_sparse_blocked");
  std::vector<bool> blocked(size_t(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const bool same_block = j / block == i / block, summary_cell = j % block >= block - summary;
      blocked[size_t(i * n + j)] = !(same_block || summary_cell);
    }
  return Tensor::from_vector(blocked, {n, n}, device);
}

SparseAttention::SparseAttention(int64_t block_size, int64_t summary, double scale, double dropout)
    : block_size_(block_size), summary_(summary), scale_(scale), dropout_(dropout) {
  CF_CHECK(block_size >= 0 && summary >= 0, ValueError,
           "[SparseAttention] block_size and summary must be >= 0 (0: the default), got block_size=", block_size,
           " summary=", summary);
  CF_CHECK(block_size == 0 || summary <= block_size, ValueError, "[SparseAttention] summary (c = ", summary,
           ") must be <= block_size (l = ", block_size, "): c of each block's l positions are its summary");
  CF_CHECK(scale >= 0, ValueError, "[SparseAttention] scale must be >= 0 (0: 1/sqrt(d_k)), got ", scale);
  CF_CHECK(dropout >= 0 && dropout < 1, ValueError, "[SparseAttention] dropout must be in [0, 1), got ", dropout);
}

std::shared_ptr<Attention> SparseAttention::create(const AttentionSpec& spec) {
  const Config& o = spec.options;
  int64_t block = o.get<int64_t>("block_size", 0);
  int64_t summary = o.get<int64_t>("summary", 0);
  double scale = o.get<double>("scale", 0.0);
  double dropout = o.get<double>("dropout", 0.0);
  o.finish();
  return std::make_shared<SparseAttention>(block, summary, scale, dropout);
}

int64_t SparseAttention::block_for(int64_t n) const {
  // A block longer than the sequence is one block of n (the same pattern; block_size = 2^40 allocated
  // lists of 2^40 slots)
  if (block_size_ > 0) return std::max<int64_t>(1, std::min(block_size_, n));
  return std::max<int64_t>(1, int64_t(std::ceil(std::sqrt(double(n)))));
}

int64_t SparseAttention::summary_for(int64_t block) const {
  if (summary_ > 0) return std::min(summary_, block);  // a derived l may be smaller than a given c
  return std::max<int64_t>(1, block / 4);
}

Tensor SparseAttention::forward(const AttentionArgs& a) {
  // Autocast: the routed_attention kernel has no 16-bit path yet (issue 26): a float32 island like routing's (attention.h).
  if (autocast_dtype()) {
    const AttentionArgs a32 = autocast_float32_args(a);
    AutocastGuard off(std::nullopt);
    return forward(a32);
  }
  check_attention_args(a, "SparseAttention");
  const int64_t B = a.q.shape()[0], H = a.q.shape()[1], N = a.q.shape()[2];
  CF_CHECK(a.k.shape()[2] == N, ShapeError, "[SparseAttention] the fixed pattern is self-attention: q has ", N,
           " positions, k ", a.k.shape()[2]);
  if (N == 0) return Tensor::zeros({B, H, 0, a.v.shape()[3]}, a.v.dtype(), a.v.device());
  const int64_t l = block_for(N);
  const int64_t c = summary_for(l);
  const std::vector<Tensor> tables = tables_.get({N, l, c, a.causal}, a.q.device(), [&] {
    Tensor q_table, k_table;
    fixed_sparse_members(N, l, c, a.causal, q_table, k_table);
    return std::vector<Tensor>{q_table, k_table};
  });
  const Tensor &qm = tables[0], &km = tables[1];
  const double scale = scale_ > 0 ? scale_ : 1.0 / std::sqrt(double(a.q.shape()[3]));
  return routed_lists_attention(a.q, a.k, a.v, qm, km, a.key_padding_mask, scale, a.causal,
                                is_training() ? dropout_ : 0.0);
}

}  // namespace nn
}  // namespace cf
