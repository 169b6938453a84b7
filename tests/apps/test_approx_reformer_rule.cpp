// cf-approx's evaluation attentions under the Reformer's key rule (apps/approx/reformer_rule.h):
// with one query per cluster and every key kept they are the Reformer's shared-QK full attention
// (LSH attention with one bucket), with fewer clusters plain clustered attention is eq. 4's softmax
// without the query's own key, and every variant gives a query's own key no weight while another
// key is allowed.
#include <cmath>

#include "apps/approx/reformer_rule.h"
#include "nn/attention/lsh.h"
#include "nn/nn_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

nn::ClusteredOptions clustered_options(int64_t clusters, int64_t topk) {
  nn::ClusteredOptions o;
  o.clusters = clusters;
  o.improved = topk > 0;
  o.topk = topk > 0 ? topk : 1;
  o.fixed_planes = true;
  o.hash_seed = 3;
  return o;
}

// (B, H, N) int64: query i in cluster i (one query per cluster).
Tensor own_clusters(int64_t B, int64_t H, int64_t N) {
  return contiguous(expand(reshape(Tensor::arange(N, kInt64), {1, 1, N}), {B, H, N}));
}

}  // namespace

TEST_CASE("Reformer key rule: one query per cluster and every key kept is LSH attention with one bucket") {
  const int64_t B = 2, H = 2, N = 7;
  Tensor q = leaf64({B, H, N, 4}, 1), v = leaf64({B, H, N, 3}, 2);
  Tensor kpm = pad_mask(B, N, {{1, 5}, {1, 6}});
  for (bool padded : {false, true}) {
    INFO("padded ", padded);
    Tensor mask = padded ? kpm : Tensor();
    nn::LSHAttention full(/*n_hashes=*/1, /*bucket_size=*/N, /*n_buckets=*/1);
    const std::vector<double> want = real_rows(full.forward(attention_args(q, q, v, mask)), mask);
    auto clustered = apps::ReformerRuleAttention::clustered(clustered_options(N, 0));
    clustered->set_assignment(own_clusters(B, H, N), N);
    auto improved = apps::ReformerRuleAttention::clustered(clustered_options(N, N));
    improved->set_assignment(own_clusters(B, H, N), N);
    auto oracle = apps::ReformerRuleAttention::oracle_top(N);
    for (auto* att : {clustered.get(), improved.get(), oracle.get()}) {
      INFO(att->type());
      CHECK(att->shares_qk());
      check_vec_close(real_rows(att->forward(attention_args(q, q, v, mask)), mask), want, 1e-12);
    }
  }
}

TEST_CASE("Reformer key rule: clustered attention is the centroid's softmax over every key but the query's own") {
  const int64_t B = 1, H = 2, N = 9, C = 3, D = 4;
  Tensor q = leaf64({B, H, N, D}, 4), v = leaf64({B, H, N, 2}, 5);
  Generator g(6);
  Tensor assignment = randint(0, C, {B, H, N}, g);
  auto att = apps::ReformerRuleAttention::clustered(clustered_options(C, 0));
  att->set_assignment(assignment, C);
  Tensor got = att->forward(attention_args(q, q, v));
  // Reference, query by query: centroid of the scaled member queries (eq. 3), scores with the normalised keys,
  // the query's own score at -1e5 (the Reformer), softmax (eq. 4), times the values.
  const double scale = 1.0 / std::sqrt(double(D));
  auto qv = values(q), vv = values(v), kv = values(nn::l2_normalize(q));
  auto av = assignment.to_vector<int64_t>();
  std::vector<double> want;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < N; ++i) {
      const int64_t c = av[size_t(h * N + i)];
      std::vector<double> centroid(D, 0.0);
      double members = 0;
      for (int64_t j = 0; j < N; ++j)
        if (av[size_t(h * N + j)] == c) {
          members += 1;
          for (int64_t d = 0; d < D; ++d) centroid[size_t(d)] += scale * qv[size_t((h * N + j) * D + d)];
        }
      std::vector<double> s(N);
      double top = -INFINITY;
      for (int64_t l = 0; l < N; ++l) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += centroid[size_t(d)] / members * kv[size_t((h * N + l) * D + d)];
        s[size_t(l)] = l == i ? nn::kSelfMaskedScore : dot;
        top = std::max(top, s[size_t(l)]);
      }
      double z = 0;
      for (double& x : s) z += (x = std::exp(x - top));
      for (int64_t e = 0; e < 2; ++e) {
        double o = 0;
        for (int64_t l = 0; l < N; ++l) o += s[size_t(l)] / z * vv[size_t((h * N + l) * 2 + e)];
        want.push_back(o);
      }
    }
  check_vec_close(values(got), want, 1e-12);
}

TEST_CASE("Reformer key rule: improved clustered and oracle-top weights written out") {
  const int64_t H = 2, N = 10, C = 3, D = 4, K = 4;
  Tensor q = leaf64({1, H, N, D}, 8);
  // Values = the identity: the output rows are the attention weights.
  Tensor eye = to(eq(reshape(Tensor::arange(N, kInt64), {N, 1}), reshape(Tensor::arange(N, kInt64), {1, N})),
                  kFloat64);
  Tensor v = contiguous(expand(reshape(eye, {1, 1, N, N}), {1, H, N, N}));
  Generator g(9);
  Tensor assignment = randint(0, C, {1, H, N}, g);
  auto improved = apps::ReformerRuleAttention::clustered(clustered_options(C, K));
  improved->set_assignment(assignment, C);
  auto oracle = apps::ReformerRuleAttention::oracle_top(K);
  const auto got_improved = values(improved->forward(attention_args(q, q, v)));
  const auto got_oracle = values(oracle->forward(attention_args(q, q, v)));
  const double scale = 1.0 / std::sqrt(double(D));
  auto qv = values(q), kv = values(nn::l2_normalize(q));
  auto av = assignment.to_vector<int64_t>();
  auto dot = [&](const std::vector<double>& x, int64_t h, int64_t l) {
    double r = 0;
    for (int64_t d = 0; d < D; ++d) r += x[size_t(d)] * kv[size_t((h * N + l) * D + d)];
    return r;
  };
  auto softmax_over = [](const std::vector<double>& s, const std::vector<bool>& keep) {
    double top = -INFINITY, z = 0;
    for (size_t l = 0; l < s.size(); ++l)
      if (keep[l]) top = std::max(top, s[l]);
    std::vector<double> p(s.size(), 0.0);
    for (size_t l = 0; l < s.size(); ++l)
      if (keep[l]) z += (p[l] = std::exp(s[l] - top));
    for (double& x : p) x /= z;
    return p;
  };
  auto top_k = [&](const std::vector<double>& s) {  // the K highest scores (distinct for random inputs)
    std::vector<bool> keep(s.size(), false);
    for (int64_t t = 0; t < K; ++t) {
      size_t best = 0;
      while (keep[best]) ++best;
      for (size_t l = 0; l < s.size(); ++l)
        if (!keep[l] && s[l] > s[best]) best = l;
      keep[best] = true;
    }
    return keep;
  };
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < N; ++i) {
      INFO("head ", h, " query ", i);
      std::vector<double> qi(D), centroid(D, 0.0);
      double members = 0;
      for (int64_t d = 0; d < D; ++d) qi[size_t(d)] = scale * qv[size_t((h * N + i) * D + d)];
      for (int64_t j = 0; j < N; ++j)
        if (av[size_t(h * N + j)] == av[size_t(h * N + i)]) {
          members += 1;
          for (int64_t d = 0; d < D; ++d) centroid[size_t(d)] += scale * qv[size_t((h * N + j) * D + d)];
        }
      for (double& x : centroid) x /= members;
      // Improved clustered (eqs. 9-10): the centroid's weights A^c, its top-K keys T and their mass m; the query's
      // exact softmax over T scaled by m, A^c elsewhere; then the own weight dropped and the row rescaled.
      std::vector<double> sc(N), se(N);
      for (int64_t l = 0; l < N; ++l) {
        sc[size_t(l)] = dot(centroid, h, l);
        se[size_t(l)] = dot(qi, h, l);
      }
      const std::vector<double> ac = softmax_over(sc, std::vector<bool>(N, true));
      const std::vector<bool> in_t = top_k(sc);
      const std::vector<double> exact = softmax_over(se, in_t);
      double mass = 0;
      for (int64_t l = 0; l < N; ++l) mass += in_t[size_t(l)] ? ac[size_t(l)] : 0.0;
      std::vector<double> w(N);
      for (int64_t l = 0; l < N; ++l) w[size_t(l)] = in_t[size_t(l)] ? mass * exact[size_t(l)] : ac[size_t(l)];
      const double rest = 1.0 - w[size_t(i)];
      w[size_t(i)] = 0;
      // Oracle-top: the K best scores other than the query's own, softmax over them.
      std::vector<double> so = se;
      so[size_t(i)] = nn::kSelfMaskedScore;
      const std::vector<double> wo = softmax_over(so, top_k(so));
      for (int64_t l = 0; l < N; ++l) {
        CHECK(got_improved[size_t((h * N + i) * N + l)] == doctest::Approx(w[size_t(l)] / rest).epsilon(1e-10));
        CHECK(got_oracle[size_t((h * N + i) * N + l)] == doctest::Approx(wo[size_t(l)]).epsilon(1e-10));
      }
    }
}

TEST_CASE("Reformer key rule: no weight on the query's own key while another key is allowed") {
  const int64_t B = 2, H = 1, N = 8;
  Tensor q = leaf64({B, H, N, 4}, 7);
  // Values = the identity: the output rows are the attention weights.
  Tensor eye = to(eq(reshape(Tensor::arange(N, kInt64), {N, 1}), reshape(Tensor::arange(N, kInt64), {1, N})),
                  kFloat64);
  Tensor v = contiguous(expand(reshape(eye, {1, 1, N, N}), {B, H, N, N}));
  Tensor kpm = pad_mask(B, N, {{1, 1}, {1, 2}, {1, 3}, {1, 4}, {1, 5}, {1, 6}, {1, 7}});  // batch 1: one real key
  const int64_t k = 3;
  auto clustered = apps::ReformerRuleAttention::clustered(clustered_options(2, 0));
  auto improved = apps::ReformerRuleAttention::clustered(clustered_options(2, k));
  auto oracle = apps::ReformerRuleAttention::oracle_top(k);
  for (auto* att : {clustered.get(), improved.get(), oracle.get()}) {
    INFO(att->type());
    auto w = values(att->forward(attention_args(q, q, v, kpm)));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < N; ++i) {
        if (b == 1 && i > 0) continue;  // padded queries
        const double* row = &w[size_t((b * N + i) * N)];
        double total = 0;
        int64_t nonzero = 0;
        for (int64_t l = 0; l < N; ++l) {
          total += row[l];
          nonzero += row[l] > 0;
        }
        CHECK(total == doctest::Approx(1.0).epsilon(1e-12));
        if (b == 0) {
          CHECK(row[i] == 0.0);  // its own key, beside seven others
          if (att == oracle.get()) CHECK(nonzero == k);  // the k best other keys
        } else {
          CHECK(row[0] == doctest::Approx(1.0));  // the only real key is its own: it keeps it
        }
      }
  }
}

TEST_CASE("Reformer key rule: bad input names the attention") {
  Tensor q = leaf64({1, 1, 4, 2}, 1), v = leaf64({1, 1, 4, 2}, 2);
  auto att = apps::ReformerRuleAttention::oracle_top(2);
  nn::AttentionArgs cross = attention_args(q, leaf64({1, 1, 5, 2}, 3), leaf64({1, 1, 5, 2}, 4));
  CHECK_THROWS_MSG(att->forward(cross), ShapeError,
                   "[ReformerRuleAttention] the Reformer's rule is for self-attention: q has 4 positions but k has 5");
  CHECK_THROWS_MSG(att->forward(attention_args(q, q, v, Tensor(), /*causal=*/true)), NotImplementedError,
                   "[ReformerRuleAttention] causal masking is not supported");
  CHECK_THROWS_MSG(apps::ReformerRuleAttention::oracle_top(0), ValueError,
                   "[ReformerRuleAttention] oracle-top needs k >= 1, got 0");
  auto clustered = apps::ReformerRuleAttention::clustered(clustered_options(2, 0));
  clustered->set_assignment(Tensor::zeros({1, 1, 3}, kInt64), 1);
  CHECK_THROWS_MSG(clustered->forward(attention_args(q, q, v)), ShapeError,
                   "[ReformerRuleAttention] the assignment must be (B, H, N) = (1, 1, 4), got");
}
