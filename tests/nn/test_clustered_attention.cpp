// Clustered and improved clustered attention (Vyas et al. 2020, eqs. 3-11) and
// switching a trained model's attention (Table 1). Their ops: tests/ops/test_clustering.cpp
// (hashing, Hamming K-Means) and tests/ops/test_sparse.cpp (the top-k products).
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "models/attention_switch.h"
#include "models/transformer.h"
#include "nn/attention/clustered.h"
#include "nn/attention/neural_clustering.h"
#include "nn/bigram_task.h"
#include "nn/nn_test_util.h"
#include "nn/pattern_lm.h"
#include "nn/optim/adam.h"
#include "nn/optim/schedule.h"

using namespace cf;
using namespace cf::test;

namespace {

Tensor bools(const std::vector<bool>& v, const Shape& s) { return Tensor::from_vector(v, s); }

// Batch 1 pads its last two positions (keys and queries alike).
Tensor padding_2x6() {
  return bools({false, false, false, false, false, false, false, false, false, false, true, true}, {2, 6});
}

// (B, H, N) int64 with each query in its own cluster.
Tensor singleton_clusters(int64_t B, int64_t H, int64_t N) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < B * H * N; ++i) v.push_back(i % N);
  return ti64(v, {B, H, N});
}

// Random ids in [0, C), every id used in every (b, h) row (C <= N).
Tensor random_clusters(int64_t B, int64_t H, int64_t N, int64_t C, uint64_t seed) {
  Generator g(seed);
  std::vector<int64_t> v;
  for (int64_t r = 0; r < B * H; ++r) {
    auto ids = randint(0, C, {N}, g).to_vector<int64_t>();
    for (int64_t j = 0; j < C; ++j) ids[size_t(j)] = j;  // no empty cluster
    v.insert(v.end(), ids.begin(), ids.end());
  }
  return ti64(v, {B, H, N});
}

// 1 on valid queries, 0 on padded ones, as (B, 1, N, 1) float64.
Tensor valid_rows(const Tensor& qpm) {
  const int64_t B = qpm.shape()[0], N = qpm.shape()[1];
  return reshape(to(logical_not(qpm), kFloat64), {B, 1, N, 1});
}

struct Grads {
  std::vector<double> out, dq, dk, dv;
};

// Output and the gradients of sum(w * out * valid) with respect to q, k, v.
Grads run(const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& f, const Tensor& q,
          const Tensor& k, const Tensor& v, const Tensor& row_weight) {
  Tensor qq = q.detach().set_requires_grad(true), kk = k.detach().set_requires_grad(true),
         vv = v.detach().set_requires_grad(true);
  Tensor out = f(qq, kk, vv);
  Generator g(99);
  Tensor w = rand(out.shape(), kFloat64, g, -1.0, 1.0);
  if (row_weight.defined()) w = w * row_weight;
  sum(out * w).backward();
  Tensor o = row_weight.defined() ? out * row_weight : out;
  return {values(o), values(qq.grad()), values(kk.grad()), values(vv.grad())};
}

void check_same(const std::vector<double>& a, const std::vector<double>& b, double tol, const char* what) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  CHECK_MESSAGE(worst <= tol, what, ": max |difference| ", worst);
}

void check_same(const Grads& a, const Grads& b, double tol) {
  check_same(a.out, b.out, tol, "output");
  check_same(a.dq, b.dq, tol, "dq");
  check_same(a.dk, b.dk, tol, "dk");
  check_same(a.dv, b.dv, tol, "dv");
}

// Nq = 20 queries in C = 6 clusters of which cluster 4 is empty, a few queries without
// a cluster (-1, as padded ones), Nk = 13 keys of which batch 1 pads the last 5.
struct MixedCase {
  static constexpr int64_t B = 2, H = 2, Nq = 20, Nk = 13, D = 5, C = 6;
  Tensor q, k, v, kpm, assign;
  std::vector<int64_t> ids;
};

MixedCase mixed_case(uint64_t seed) {
  using M = MixedCase;
  MixedCase m;
  m.q = leaf64({M::B, M::H, M::Nq, M::D}, seed, -2, 2);
  m.k = leaf64({M::B, M::H, M::Nk, M::D}, seed + 1, -2, 2);
  m.v = leaf64({M::B, M::H, M::Nk, 3}, seed + 2);
  std::vector<bool> pad(size_t(M::B * M::Nk), false);
  for (int64_t l = M::Nk - 5; l < M::Nk; ++l) pad[size_t(M::Nk + l)] = true;
  m.kpm = bools(pad, {M::B, M::Nk});
  Generator g(seed + 3);
  m.ids = randint(0, M::C - 1, {M::B * M::H * M::Nq}, g).to_vector<int64_t>();
  for (int64_t& id : m.ids) id = id >= 4 ? id + 1 : id;        // ids 0-3 and 5: cluster 4 stays empty
  for (size_t i = 3; i < m.ids.size(); i += 7) m.ids[i] = -1;  // some queries in no cluster
  m.assign = ti64(m.ids, {M::B, M::H, M::Nq});
  return m;
}

Tensor full_reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm) {
  Tensor blocked = kpm.defined() ? reshape(kpm, {kpm.shape()[0], 1, 1, kpm.shape()[1]}) : Tensor();
  return nn::dense_attention(q, k, v, blocked, 1.0 / std::sqrt(double(q.shape()[3])));
}

std::shared_ptr<nn::ClusteredAttention> make_layer(const std::string& type, const nlohmann::json& options) {
  nn::AttentionSpec spec;
  spec.type = type;
  spec.d_model = 8;
  spec.n_heads = 2;
  spec.options = nn::Config(options.is_null() ? nlohmann::json::object() : options, "attention");
  return std::dynamic_pointer_cast<nn::ClusteredAttention>(nn::make_attention(spec));
}

}  // namespace

TEST_SUITE("clustered_attention") {

TEST_CASE("clustered attention with one query per cluster equals full attention, forward and backward") {
  const int64_t B = 2, H = 2, N = 6;
  Tensor q = leaf64({B, H, N, 3}, 1, -2, 2), k = leaf64({B, H, N, 3}, 2, -2, 2), v = leaf64({B, H, N, 4}, 3);
  Tensor kpm = padding_2x6();
  Tensor valid = valid_rows(kpm);
  auto layer = make_layer("clustered", {});
  layer->set_assignment(singleton_clusters(B, H, N));
  Grads got = run([&](const Tensor& a, const Tensor& b, const Tensor& c) { return layer->forward(attention_args(a, b, c, kpm)); },
                  q, k, v, valid);
  Grads want = run([&](const Tensor& a, const Tensor& b, const Tensor& c) { return full_reference(a, b, c, kpm); }, q,
                   k, v, valid);
  check_same(got, want, 1e-12);
  // Padded queries belong to no cluster: their rows are zero.
  Tensor y = layer->forward(attention_args(q, k, v, kpm));
  auto a = layer->last_assignment().to_vector<int64_t>();
  CHECK(a[size_t((1 * H + 0) * N + 4)] == -1);
  CHECK(a[size_t((1 * H + 1) * N + 5)] == -1);
  for (double x : values(slice(slice(y, 0, 1, 2), 2, 4, 6))) CHECK(x == 0.0);
  // And without any mask.
  Grads g2 = run([&](const Tensor& a2, const Tensor& b2, const Tensor& c2) {
    return layer->forward(attention_args(a2, b2, c2, Tensor()));
  }, q, k, v, Tensor());
  Grads w2 = run([&](const Tensor& a2, const Tensor& b2, const Tensor& c2) { return full_reference(a2, b2, c2, Tensor()); },
                 q, k, v, Tensor());
  check_same(g2, w2, 1e-12);
}

TEST_CASE("improved clustered attention with top-k = number of keys equals full attention, forward and backward") {
  const int64_t B = 2, H = 2, N = 6;
  Tensor q = leaf64({B, H, N, 3}, 4, -2, 2), k = leaf64({B, H, N, 3}, 5, -2, 2), v = leaf64({B, H, N, 4}, 6);
  Tensor kpm = padding_2x6();
  Tensor valid = valid_rows(kpm);
  for (int64_t C : {1, 2, 3}) {
    INFO("clusters: ", C);
    auto layer = make_layer("improved-clustered", {{"topk", N}});
    layer->set_assignment(random_clusters(B, H, N, C, uint64_t(10 + C)));
    Grads got = run([&](const Tensor& a, const Tensor& b, const Tensor& c) {
      return layer->forward(attention_args(a, b, c, kpm));
    }, q, k, v, valid);
    Grads want = run([&](const Tensor& a, const Tensor& b, const Tensor& c) { return full_reference(a, b, c, kpm); },
                     q, k, v, valid);
    check_same(got, want, 1e-12);
  }
}

TEST_CASE("the efficient paths match the dense reference matrices, forward and backward, with padding") {
  const int64_t B = 2, H = 2, N = 6;
  Tensor q = leaf64({B, H, N, 3}, 7, -2, 2), k = leaf64({B, H, N, 3}, 8, -2, 2), v = leaf64({B, H, N, 4}, 9);
  Tensor kpm = padding_2x6();
  const double scale = 1.0 / std::sqrt(3.0);
  // Padded queries get -1, as the layer does.
  Tensor assign = where(expand(reshape(kpm, {B, 1, N}), {B, H, N}), Tensor::full({1}, -1.0, kInt64),
                        random_clusters(B, H, N, 3, 21));
  for (int64_t topk : {0, 2, 3}) {
    INFO("topk: ", topk);
    Grads want = run([&](const Tensor& a, const Tensor& b, const Tensor& c) {
      return matmul(nn::clustered_attention_weights(a, b, assign, 3, kpm, scale, topk), c);
    }, q, k, v, Tensor());
    for (nn::CentroidPath path : {nn::CentroidPath::kFused, nn::CentroidPath::kDense}) {
      INFO("path: ", path == nn::CentroidPath::kFused ? "fused" : "dense");
      Grads got = run([&](const Tensor& a, const Tensor& b, const Tensor& c) {
        return nn::clustered_attention(a, b, c, assign, 3, kpm, scale, topk, 0.0, false, default_generator(), false,
                                       path);
      }, q, k, v, Tensor());
      check_same(got, want, 1e-12);
    }
    // The rows of the dense matrices are distributions over the valid keys.
    Tensor w = nn::clustered_attention_weights(q, k, assign, 3, kpm, scale, topk);
    auto rows = values(sum(w, {-1}));
    auto a = assign.to_vector<int64_t>();
    for (size_t i = 0; i < rows.size(); ++i) CHECK(rows[i] == doctest::Approx(a[i] < 0 ? 0.0 : 1.0).epsilon(1e-12));
    for (double x : values(slice(slice(w, 0, 1, 2), 3, 4, 6))) CHECK(x == 0.0);  // padded keys
  }
}

TEST_CASE("the efficient paths match the dense reference with more queries than keys, an empty cluster and no-cluster queries") {
  const MixedCase m = mixed_case(31);
  const Tensor &q = m.q, &k = m.k, &v = m.v, &kpm = m.kpm, &assign = m.assign;
  const std::vector<int64_t>& ids = m.ids;
  const int64_t C = MixedCase::C;
  const double scale = 0.4;
  for (int64_t topk : {0, 1, 4, 9, 13}) {
    INFO("topk: ", topk);
    Grads want = run([&](const Tensor& a, const Tensor& b, const Tensor& c) {
      return matmul(nn::clustered_attention_weights(a, b, assign, C, kpm, scale, topk), c);
    }, q, k, v, Tensor());
    for (nn::CentroidPath path : {nn::CentroidPath::kFused, nn::CentroidPath::kDense}) {
      INFO("path: ", path == nn::CentroidPath::kFused ? "fused" : "dense");
      Grads got = run([&](const Tensor& a, const Tensor& b, const Tensor& c) {
        return nn::clustered_attention(a, b, c, assign, C, kpm, scale, topk, 0.0, false, default_generator(), false,
                                       path);
      }, q, k, v, Tensor());
      check_same(got, want, 1e-12);
      auto out = got.out;
      for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] < 0)
          for (int64_t c = 0; c < 3; ++c) CHECK(out[i * 3 + size_t(c)] == 0.0);  // no cluster: zero output
    }
  }
}

TEST_CASE("clustered_top_keys: key chunks give one top-k's keys in score order, ties to the lower key index") {
  // Integer centroids and keys in [-2, 2]: many equal scores, so the tie rule shows.
  const int64_t B = 2, H = 2, C = 5, Nk = 37, D = 3;
  Generator g(41);
  Tensor c = to(randint(-2, 3, {B, H, C, D}, g), kFloat64), k = to(randint(-2, 3, {B, H, Nk, D}, g), kFloat64);
  std::vector<bool> pad(size_t(B * Nk), false);
  for (int64_t l : {3, 30, 31, 32, 33, 34, 35, 36}) pad[size_t(Nk + l)] = true;  // batch 1
  Tensor kpm = bools(pad, {B, Nk});
  const std::vector<double> s = values(matmul(c, transpose(k, 2, 3)));  // (B, H, C, Nk)
  for (int64_t topk : {1, 7, 36, 50}) {
    const int64_t kk = std::min(topk, Nk);
    // The reference: every row's keys sorted by score, descending, padding last, stable.
    std::vector<int64_t> want;
    for (int64_t row = 0; row < B * H * C; ++row) {
      const int64_t b = row / (H * C);
      std::vector<int64_t> keys(static_cast<size_t>(Nk));
      for (int64_t l = 0; l < Nk; ++l) keys[size_t(l)] = l;
      auto score = [&](int64_t l) { return pad[size_t(b * Nk + l)] ? -INFINITY : s[size_t(row * Nk + l)]; };
      std::stable_sort(keys.begin(), keys.end(), [&](int64_t x, int64_t y) { return score(x) > score(y); });
      want.insert(want.end(), keys.begin(), keys.begin() + kk);
    }
    // chunk_bytes 1: chunks of kk keys; 1600 bytes: 10 keys of the 20 rows of 8 bytes; default: one chunk.
    for (int64_t chunk : {int64_t(1), int64_t(1600), int64_t(64) << 20}) {
      INFO("topk ", topk, " chunk_bytes ", chunk);
      Tensor got = nn::clustered_top_keys(c, k, kpm, topk, chunk);
      CHECK(got.shape() == Shape{B, H, C, kk});
      CHECK(got.to_vector<int64_t>() == want);
    }
  }
  CHECK_THROWS_MSG(nn::clustered_top_keys(c, slice(k, 3, 0, 2), kpm, 3), ShapeError,
                   "[clustered_top_keys] expected centroids (B, H, C, D) and k (B, H, Nk, D)");
  CHECK_THROWS_MSG(nn::clustered_top_keys(c, to(k, kFloat32), kpm, 3), DTypeError,
                   "[clustered_top_keys] centroids and k must share one float dtype");
  CHECK_THROWS_MSG(nn::clustered_top_keys(c, k, slice(kpm, 1, 0, 5), 3), ShapeError,
                   "[clustered_top_keys] key_padding_mask must be bool (B, Nk) = (2, 37)");
  CHECK_THROWS_MSG(nn::clustered_top_keys(c, k, kpm, 0), ValueError, "[clustered_top_keys] topk and chunk_bytes",
                   "topk=0");
}

TEST_CASE("the fused path (flash attention over the centroids) equals the path through the centroid weights") {
  // kFused: the centroids attend through flash_attention (improved: its log-sum-exp
  // gives the top-k keys' weights); kDense goes through the (C, Nk) weights A^c: the two
  // paths, forward and backward, with padding, an empty cluster, no-cluster queries.
  const MixedCase m = mixed_case(51);
  const Tensor &q = m.q, &k = m.k, &v = m.v, &kpm = m.kpm, &assign = m.assign;
  const int64_t C = MixedCase::C;
  Generator none(0);
  for (int64_t topk : {0, 1, 4, 13}) {
    INFO("topk: ", topk);
    Grads fused = run([&](const Tensor& a, const Tensor& b, const Tensor& c) {
      Tensor out = nn::clustered_attention(a, b, c, assign, C, kpm, 0.4, topk, 0.0, false, none, false,
                                           nn::CentroidPath::kFused);
      CHECK(graph_has(out, "flash_attention"));
      return out;
    }, q, k, v, Tensor());
    Grads weights = run([&](const Tensor& a, const Tensor& b, const Tensor& c) {
      Tensor out = nn::clustered_attention(a, b, c, assign, C, kpm, 0.4, topk, 0.0, false, none, false,
                                           nn::CentroidPath::kDense);
      CHECK_FALSE(graph_has(out, "flash_attention"));
      return out;
    }, q, k, v, Tensor());
    check_same(fused, weights, 1e-12);
  }
  // With dropout in training: the flash kernel drops the entries of A^c that the dense path's
  // dropout(A^c) drops (generators of one seed give one mask), and improved clustered attention's
  // top-k terms leave A^c V with those drops; the exact top-k weights then draw alike on both paths.
  // Also with every key of batch 1 padded (its clusters see no key: lse = -inf, weights 0).
  std::vector<bool> every(size_t(2 * MixedCase::Nk), false);
  for (int64_t l = 0; l < MixedCase::Nk; ++l) every[size_t(MixedCase::Nk + l)] = true;
  const Tensor all_padded = bools(every, {2, MixedCase::Nk});
  for (const Tensor& mask : {kpm, all_padded})
  for (int64_t topk : {0, 1, 4, 13}) {
    INFO("topk with dropout: ", topk, mask.is_same(all_padded) ? ", batch 1 all padding" : "");
    auto with_path = [&](nn::CentroidPath path) {
      return run([&, path](const Tensor& a, const Tensor& b, const Tensor& c) {
        Generator g(57);
        g.reserve(999);  // mid-stream
        Tensor out = nn::clustered_attention(a, b, c, assign, C, mask, 0.4, topk, 0.3, true, g, false, path);
        CHECK(graph_has(out, "flash_attention") == (path == nn::CentroidPath::kFused));
        CHECK(g.offset() == 999 + uint64_t(q.shape()[0] * q.shape()[1]) *
                                      (uint64_t(C * k.shape()[2]) + uint64_t(q.shape()[2] * std::min(topk, k.shape()[2]))));
        return out;
      }, q, k, v, Tensor());
    };
    Grads fused_drop = with_path(nn::CentroidPath::kFused);
    check_same(fused_drop, with_path(nn::CentroidPath::kDense), 1e-12);
    Grads clean = run([&](const Tensor& a, const Tensor& b, const Tensor& c) {
      return nn::clustered_attention(a, b, c, assign, C, mask, 0.4, topk, 0.0, false, none);
    }, q, k, v, Tensor());
    double moved = 0;  // the rate takes effect
    for (size_t i = 0; i < clean.out.size(); ++i) moved = std::max(moved, std::abs(fused_drop.out[i] - clean.out[i]));
    CHECK(moved > 1e-3);
  }
}

TEST_CASE("kAuto: improved clustered attention forms the centroid weights while one (B H, C, Nk) matrix fits the bound") {
  // float64, B H = 2, C = 64: the bound (8 MiB) holds exactly 8192 keys.
  REQUIRE(nn::kClusteredDenseMaxBytes == int64_t(8) << 20);
  const int64_t B = 1, H = 2, C = 64, D = 2;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < B * H * C; ++i) ids.push_back(i % C);
  const Tensor assign = Tensor::from_vector(ids, {B, H, C});
  const Tensor q = leaf64({B, H, C, D}, 61);
  for (int64_t nk : {int64_t(8192), int64_t(8193)}) {
    const Tensor k = leaf64({B, H, nk, D}, 62), v = leaf64({B, H, nk, D}, 63);
    INFO("Nk: ", nk);
    CHECK(graph_has(nn::clustered_attention(q, k, v, assign, C, Tensor(), 0.5, 3), "flash_attention") == (nk > 8192));
    CHECK(graph_has(nn::clustered_attention(q, k, v, assign, C, Tensor(), 0.5, 0), "flash_attention"));  // plain: fused
  }
  // Dropout in training leaves the rule as it is: it drops inside either path.
  Generator g(66);
  for (int64_t nk : {int64_t(8192), int64_t(8193)}) {
    const Tensor k = leaf64({B, H, nk, D}, 62), v = leaf64({B, H, nk, D}, 63);
    INFO("Nk with dropout: ", nk);
    CHECK(graph_has(nn::clustered_attention(q, k, v, assign, C, Tensor(), 0.5, 3, 0.1, true, g), "flash_attention") ==
          (nk > 8192));
    CHECK(graph_has(nn::clustered_attention(q, k, v, assign, C, Tensor(), 0.5, 0, 0.1, true, g), "flash_attention"));
  }
}

TEST_CASE("the layers' centroid_path option picks the path, and each gives the same output") {
  const int64_t B = 1, H = 2, N = 9;
  Tensor q = leaf64({B, H, N, 3}, 71), k = leaf64({B, H, N, 3}, 72), v = leaf64({B, H, N, 2}, 73);
  for (const char* type : {"clustered", "improved-clustered"}) {
    INFO(type);
    std::vector<std::vector<double>> outs;
    for (const char* path : {"auto", "fused", "dense"}) {
      INFO(path);
      nlohmann::json options = {{"clusters", 3}, {"hash_seed", 5}, {"centroid_path", path}};
      if (std::string(type) == "improved-clustered") options["topk"] = 4;
      auto layer = make_layer(type, options);
      Tensor out = layer->forward(attention_args(q, k, v, Tensor()));
      // auto: plain clustered fused, improved dense at this size (clustered.h)
      const bool fused = std::string(path) == "fused" || (std::string(path) == "auto" && std::string(type) == "clustered");
      CHECK(graph_has(out, "flash_attention") == fused);
      outs.push_back(values(out));
    }
    for (size_t i = 1; i < outs.size(); ++i)
      for (size_t j = 0; j < outs[0].size(); ++j) CHECK(outs[i][j] == doctest::Approx(outs[0][j]).epsilon(1e-12));
  }
}

TEST_CASE("causal improved clustered attention: past top-k keys only, dense reference, full causal at top-k = N") {
  const int64_t B = 2, H = 2, N = 6;
  Tensor q = leaf64({B, H, N, 3}, 31, -2, 2), k = leaf64({B, H, N, 3}, 32, -2, 2), v = leaf64({B, H, N, 4}, 33);
  Tensor kpm = padding_2x6();
  Tensor valid = valid_rows(kpm);
  const double scale = 1.0 / std::sqrt(3.0);
  Tensor assign = where(expand(reshape(kpm, {B, 1, N}), {B, H, N}), Tensor::full({1}, -1.0, kInt64),
                        random_clusters(B, H, N, 3, 34));
  Generator none(0);
  for (int64_t topk : {2, 3}) {
    INFO("topk: ", topk);
    auto efficient = [&](const Tensor& a, const Tensor& b, const Tensor& c) {
      return nn::clustered_attention(a, b, c, assign, 3, kpm, scale, topk, 0.0, false, none, /*causal=*/true);
    };
    Grads got = run(efficient, q, k, v, Tensor());
    Grads want = run([&](const Tensor& a, const Tensor& b, const Tensor& c) {
      return matmul(nn::clustered_attention_weights(a, b, assign, 3, kpm, scale, topk, /*causal=*/true), c);
    }, q, k, v, Tensor());
    check_same(got, want, 1e-12);
    // Each row is a distribution over past, valid keys of the cluster's top-k, or
    // zero (no such key): never weight on a later key.
    Tensor w = nn::clustered_attention_weights(q, k, assign, 3, kpm, scale, topk, true);
    std::vector<double> wv = values(w), rows = values(sum(w, {-1}));
    int64_t empty = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      CHECK((std::abs(rows[r] - 1.0) < 1e-12 || rows[r] == 0.0));
      empty += rows[r] == 0.0;
      const int64_t i = int64_t(r) % N;
      for (int64_t l = i + 1; l < N; ++l) CHECK(wv[r * size_t(N) + size_t(l)] == 0.0);
    }
    MESSAGE("topk ", topk, ": ", empty, " of ", rows.size(), " rows see none of their cluster's top-k keys");
    // The output of query i reads no later key or value (gradients exactly zero).
    for (int64_t i = 0; i < N; ++i) {
      Tensor kk = k.detach().set_requires_grad(true), vv = v.detach().set_requires_grad(true);
      sum(slice(efficient(q, kk, vv), 2, i, i + 1)).backward();
      for (const Tensor& g : {kk.grad(), vv.grad()})
        for (double x : values(slice(g, 2, i + 1, N))) CHECK(x == 0.0);
    }
  }
  // Nq != Nk (queries aligned with the last keys, attention.h's rule): 4 queries,
  // 6 keys, query i sees keys up to i + 2.
  {
    Tensor q4 = leaf64({1, 1, 4, 3}, 35, -2, 2), k6 = leaf64({1, 1, 6, 3}, 36, -2, 2), v6 = leaf64({1, 1, 6, 2}, 37);
    Tensor a4 = ti64({0, 1, 0, 1}, {1, 1, 4});
    Grads got = run([&](const Tensor& a, const Tensor& b, const Tensor& c) {
      return nn::clustered_attention(a, b, c, a4, 2, Tensor(), scale, 3, 0.0, false, none, true);
    }, q4, k6, v6, Tensor());
    Grads want = run([&](const Tensor& a, const Tensor& b, const Tensor& c) {
      return matmul(nn::clustered_attention_weights(a, b, a4, 2, Tensor(), scale, 3, true), c);
    }, q4, k6, v6, Tensor());
    check_same(got, want, 1e-12);
    std::vector<double> w4 = values(nn::clustered_attention_weights(q4, k6, a4, 2, Tensor(), scale, 3, true));
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t l = i + 3; l < 6; ++l) CHECK(w4[size_t(i * 6 + l)] == 0.0);
  }
  // With top-k = N every key is in every cluster's set: full causal attention.
  for (int64_t C : {1, 3}) {
    INFO("clusters: ", C);
    auto layer = make_layer("improved-clustered", {{"topk", N}});
    layer->set_assignment(random_clusters(B, H, N, C, uint64_t(40 + C)));
    auto causal_args = [&](const Tensor& a, const Tensor& b, const Tensor& c) {
      nn::AttentionArgs x = attention_args(a, b, c, kpm);
      x.causal = true;
      return x;
    };
    Grads got = run([&](const Tensor& a, const Tensor& b, const Tensor& c) { return layer->forward(causal_args(a, b, c)); },
                    q, k, v, valid);
    Grads want = run([&](const Tensor& a, const Tensor& b, const Tensor& c) {
      return nn::dense_attention(a, b, c, nn::dense_block_mask(causal_args(a, b, c)), scale);
    }, q, k, v, valid);
    check_same(got, want, 1e-12);
  }
  // float64 gradcheck with the clustering held fixed.
  auto layer = make_layer("improved-clustered", {{"clusters", 2}, {"topk", 2}, {"hash_seed", 3}});
  nn::AttentionArgs a0 = attention_args(q, k, v, kpm);
  a0.causal = true;
  layer->forward(a0);
  layer->set_assignment(layer->last_assignment());
  auto f = [&](const std::vector<Tensor>& xs) {
    nn::AttentionArgs a = attention_args(xs[0], xs[1], xs[2], kpm);
    a.causal = true;
    return layer->forward(a);
  };
  GradcheckResult r = gradcheck(f, {q, k, v});
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("Proposition 2: improved clustered attention is never farther from full attention than clustered (L1)") {
  const int64_t B = 2, H = 3, N = 24, D = 4;
  int64_t rows_checked = 0, strictly_better = 0;
  for (uint64_t seed = 0; seed < 4; ++seed) {
    Tensor q = leaf64({B, H, N, D}, 100 + seed, -3, 3).detach(), k = leaf64({B, H, N, D}, 200 + seed, -3, 3).detach();
    std::vector<bool> pad(size_t(B * N), false);
    for (int64_t i = N - 1 - int64_t(seed); i < N; ++i) pad[size_t(N + i)] = true;  // batch 1 shorter
    Tensor kpm = bools(pad, {B, N});
    auto layer = make_layer("clustered", {{"clusters", 4}, {"hash_seed", int64_t(seed)}});
    Tensor assign = layer->cluster(q, kpm);
    const double scale = 1.0 / std::sqrt(double(D));
    Tensor full = softmax(masked_fill(matmul(q * scale, transpose(k, 2, 3)), reshape(kpm, {B, 1, 1, N}), -INFINITY), -1);
    Tensor ac = nn::clustered_attention_weights(q, k, assign, 4, kpm, scale, 0);
    Tensor at = nn::clustered_attention_weights(q, k, assign, 4, kpm, scale, 5);
    // The efficient path gives the same matrices: with V = I its output is the weights.
    std::vector<double> id(size_t(N * N), 0.0);
    for (int64_t i = 0; i < N; ++i) id[size_t(i * N + i)] = 1.0;
    Tensor eye = expand(Tensor::from_vector(id, {1, 1, N, N}), {B, H, N, N});
    check_same(values(nn::clustered_attention(q, k, eye, assign, 4, kpm, scale, 0)), values(ac), 1e-12,
               "efficient A^c");
    check_same(values(nn::clustered_attention(q, k, eye, assign, 4, kpm, scale, 5)), values(at), 1e-12,
               "efficient A^t");
    auto ec = values(sum(abs(ac - full), {-1})), et = values(sum(abs(at - full), {-1}));
    auto a = assign.to_vector<int64_t>();
    for (size_t i = 0; i < ec.size(); ++i) {
      if (a[i] < 0) continue;
      ++rows_checked;
      CHECK(et[i] <= ec[i] + 1e-12);
      strictly_better += et[i] < ec[i] - 1e-9;
    }
  }
  MESSAGE("Proposition 2: ", rows_checked, " rows, improved strictly better on ", strictly_better);
  CHECK(rows_checked > 500);
  CHECK(strictly_better > rows_checked / 2);  // the bound is not met trivially by equal rows
}

TEST_CASE("a fixed hash_seed gives the same clusters at every forward, the default draws new planes") {
  Tensor q = leaf64({1, 2, 16, 4}, 5).detach();
  auto fixed = make_layer("clustered", {{"clusters", 3}, {"hash_seed", 7}});
  CHECK(values(fixed->cluster(q)) == values(fixed->cluster(q)));
  auto fresh = make_layer("clustered", {{"clusters", 3}, {"bits", 4}});
  std::set<std::vector<double>> seen;
  for (int i = 0; i < 5; ++i) seen.insert(values(fresh->cluster(q)));
  CHECK(seen.size() > 1);
}


TEST_CASE("more clusters than queries and top-k larger than the keys work, with mixed lengths") {
  const int64_t B = 2, H = 2, N = 6;
  Tensor q = leaf64({B, H, N, 4}, 11, -2, 2), k = leaf64({B, H, N, 4}, 12, -2, 2), v = leaf64({B, H, N, 4}, 13);
  Tensor kpm = padding_2x6();
  Tensor valid = valid_rows(kpm);
  // Defaults: 100 clusters, top-32, on 6 queries: every valid query alone, and all keys in the top-k.
  // (The default layer draws its hyperplanes from the global generator: seeded, so the
  // case does not depend on the tests run before it.)
  manual_seed(5);
  for (const char* type : {"clustered", "improved-clustered"}) {
    INFO(type);
    auto layer = make_layer(type, {});
    Grads got = run([&](const Tensor& a, const Tensor& b, const Tensor& c) {
      return layer->forward(attention_args(a, b, c, kpm));
    }, q, k, v, valid);
    Grads want = run([&](const Tensor& a, const Tensor& b, const Tensor& c) { return full_reference(a, b, c, kpm); },
                     q, k, v, valid);
    check_same(got, want, 1e-12);
  }
  // Top-k above the valid keys of a short row but below Nk: padded keys in the top-k carry no weight.
  auto imp = make_layer("improved-clustered", {{"clusters", 2}, {"topk", 5}, {"hash_seed", 1}});
  Tensor y = imp->forward(attention_args(q, k, v, kpm));
  Tensor ref = matmul(nn::clustered_attention_weights(q, k, imp->last_assignment(), 2, kpm, 0.5, 5), v);
  check_same(values(y), values(ref), 1e-12, "top-k 5 over 4 valid keys");
  // A row of all padding outputs zeros and no NaN.
  Tensor allpad = bools({true, true, true, true, true, true, false, false, false, false, false, false}, {2, 6});
  for (const char* type : {"clustered", "improved-clustered"}) {
    nlohmann::json o = {{"clusters", 2}};
    if (std::string(type) == "improved-clustered") o["topk"] = 2;
    auto layer = make_layer(type, o);
    nn::AttentionArgs a = attention_args(q, k, v, allpad);
    for (double x : values(slice(layer->forward(a), 0, 0, 1))) CHECK(x == 0.0);
    for (double x : values(layer->forward(a))) CHECK(std::isfinite(x));
  }
}

TEST_CASE("float64 gradcheck of clustered and improved clustered attention with the clustering held fixed") {
  const int64_t B = 2, H = 1, N = 6;
  Tensor q = leaf64({B, H, N, 3}, 21, -2, 2), k = leaf64({B, H, N, 3}, 22, -2, 2), v = leaf64({B, H, N, 2}, 23);
  Tensor kpm = padding_2x6();
  for (const char* type : {"clustered", "improved-clustered"}) {
    INFO(type);
    nlohmann::json o = {{"clusters", 2}, {"hash_seed", 3}};
    if (std::string(type) == "improved-clustered") o["topk"] = 2;
    auto layer = make_layer(type, o);
    layer->forward(attention_args(q, k, v, kpm));
    layer->set_assignment(layer->last_assignment());  // held fixed under the perturbations
    auto f = [&](const std::vector<Tensor>& xs) { return layer->forward(attention_args(xs[0], xs[1], xs[2], kpm)); };
    GradcheckResult r = gradcheck(f, {q, k, v});
    CHECK_MESSAGE(r.ok, r.message);
    CHECK(r.entries_checked > 0);
    if (std::string(type) == "improved-clustered") {
      Tensor y = f({q, k, v});
      CHECK(graph_has(y, "cluster_topk_attention"));  // eqs. 10-11's exact part, one node
    }
  }
  // With attention-weight dropout, on both paths (a fresh generator per evaluation: one mask).
  const Tensor assign = ti64({0, 1, 1, 0, 0, 1, 1, 1, 0, -1, 0, 1}, {B, H, N});
  for (int64_t topk : {0, 2})
    for (nn::CentroidPath path : {nn::CentroidPath::kFused, nn::CentroidPath::kDense}) {
      INFO("dropout, topk ", topk, path == nn::CentroidPath::kFused ? " fused" : " dense");
      GradcheckResult r = gradcheck(
          [&](const std::vector<Tensor>& xs) {
            Generator g(9);
            return nn::clustered_attention(xs[0], xs[1], xs[2], assign, 2, kpm, 0.6, topk, 0.3, true, g, false, path);
          },
          {q, k, v});
      CHECK_MESSAGE(r.ok, r.message);
    }
  // Inside a MultiHeadAttention with its projections.
  Generator g(4);
  auto att = make_layer("improved-clustered", {{"clusters", 2}, {"topk", 2}, {"hash_seed", 3}});
  nn::MultiHeadAttention mha(8, 2, att, g);
  mha.to(kFloat64);
  Tensor x = leaf64({2, 6, 8}, 24);
  mha.forward(x, x, x, kpm);
  att->set_assignment(att->last_assignment());
  check_module_grad(mha, [&](const std::vector<Tensor>& xs) { return mha.forward(xs[0], xs[0], xs[0], kpm); }, {x});
}

TEST_CASE("clustered attention layers run in float32 through the registry and MultiHeadAttention") {
  for (const char* type : {"clustered", "improved-clustered"}) {
    INFO(type);
    nn::AttentionSpec spec;
    spec.type = type;
    spec.d_model = 16;
    spec.n_heads = 2;
    spec.options = nn::Config(nlohmann::json{{"clusters", 4}}, "attention");
    Generator g(1);
    nn::MultiHeadAttention mha(16, 2, nn::make_attention(spec), g);
    CHECK(mha.attention().type() == type);
    Tensor x = randn({3, 20, 16}, kFloat32, g).set_requires_grad(true);
    std::vector<bool> pad(60, false);
    for (int i = 45; i < 60; ++i) pad[size_t(i)] = true;
    Tensor y = mha(x, bools(pad, {3, 20}));
    CHECK(y.shape() == Shape{3, 20, 16});
    sum(y).backward();
    for (double d : values(x.grad())) CHECK(std::isfinite(d));
    auto a = dynamic_cast<nn::ClusteredAttention&>(mha.attention()).last_assignment().to_vector<int64_t>();
    std::set<int64_t> ids(a.begin(), a.end());
    CHECK(ids.count(-1) == 1);  // padded queries of the last sequence
    CHECK(*ids.rbegin() == 3);
  }
}

TEST_CASE("under autocast, clustered attention takes 16-bit q, k, v, computes in float32 and returns float32") {
  // Issue 26: the clustering (hashing, Hamming K-Means) and the sparse top-k products have no
  // 16-bit kernels yet, so under autocast the layer runs in float32 on float32 copies of 16-bit
  // q, k, v. Reference: the float32 layer on the same values widened (exact), with the same
  // fixed hash planes: the same clusters and the same float32 arithmetic, so the output is
  // equal and the gradients are the float32 ones rounded once to the 16-bit dtype (R1).
  const int64_t B = 2, H = 2, N = 24, D = 4;
  for (const char* type : {"clustered", "improved-clustered"}) {
    for (DType dt : {kBFloat16, kFloat16}) {
      const std::string what = std::string(type) + " " + dtype_name(dt);
      INFO(what);
      nlohmann::json o = {{"clusters", 5}, {"hash_seed", 7}};
      if (std::string(type) == "improved-clustered") o["topk"] = 6;
      Generator g(5);
      Tensor q = to(randn({B, H, N, D}, kFloat32, g), dt), k = to(randn({B, H, N, D}, kFloat32, g), dt),
             v = to(randn({B, H, N, D}, kFloat32, g), dt);
      Tensor w = randn({B, H, N, D}, kFloat32, g);
      // Without autocast a 16-bit input stays a clear dtype error.
      const std::string refused = std::string("ClusteredAttention] q, k, v are ") + dtype_name(dt);
      CHECK_THROWS_MSG(make_layer(type, o)->forward(attention_args(q, k, v, Tensor())), DTypeError,
                       refused.c_str(), "only under autocast");
      auto grads = [&](bool low) {
        Tensor qq = (low ? q : to(q, kFloat32)).detach().set_requires_grad(true),
               kk = (low ? k : to(k, kFloat32)).detach().set_requires_grad(true),
               vv = (low ? v : to(v, kFloat32)).detach().set_requires_grad(true);
        std::shared_ptr<nn::ClusteredAttention> att = make_layer(type, o);
        Tensor out;
        {
          AutocastGuard guard(low ? std::optional<DType>(dt) : std::nullopt);
          out = att->forward(attention_args(qq, kk, vv, Tensor()));
        }
        CHECK(out.dtype() == kFloat32);
        sum(out * w).backward();
        CHECK(qq.grad().dtype() == qq.dtype());
        return std::vector<Tensor>{out.detach(), qq.grad(), kk.grad(), vv.grad(), att->last_assignment()};
      };
      std::vector<Tensor> low = grads(true), ref = grads(false);
      check_close(low[4], ref[4], 0);  // the same clusters
      check_close(low[0], ref[0], 0);
      for (int i = 1; i < 4; ++i) check_close(low[size_t(i)], to(ref[size_t(i)], dt), 0);
    }
  }
}

TEST_CASE("clustered attention in a bfloat16 / float16 autocast MultiHeadAttention stays within 8u of float32") {
  // The model path: 16-bit projections around the float32 layer. The clusters are held fixed
  // (set_assignment: hashing the slightly different 16-bit queries could regroup a query near a
  // boundary, a different approximation rather than an error), and improved clustered takes
  // top-k = N (no near-tie among the selected keys can flip). The bound is R3's, the one full
  // attention under autocast meets (tests/nn/test_mixed_precision.cpp).
  const int64_t B = 2, N = 20, d = 16, H = 2;
  for (const char* type : {"clustered", "improved-clustered"}) {
    for (DType dt : {kBFloat16, kFloat16}) {
      const std::string what = std::string(type) + " " + dtype_name(dt);
      INFO(what);
      nn::AttentionSpec spec;
      spec.type = type;
      spec.d_model = d;
      spec.n_heads = H;
      nlohmann::json o = {{"clusters", 4}};
      if (std::string(type) == "improved-clustered") o["topk"] = N;
      spec.options = nn::Config(o, "attention");
      Generator g(3);
      nn::MultiHeadAttention mha(d, H, nn::make_attention(spec), g);
      dynamic_cast<nn::ClusteredAttention&>(mha.attention()).set_assignment(random_clusters(B, H, N, 4, 11));
      Tensor x = randn({B, N, d}, kFloat32, g);
      Tensor ref = mha(x), low;
      {
        AutocastGuard guard(dt);
        low = mha(x);
      }
      std::vector<double> l = values(low), r = values(ref);
      REQUIRE(l.size() == r.size());
      double m = 0, e = 0;
      for (size_t i = 0; i < l.size(); ++i) m = std::max(m, std::fabs(r[i])), e = std::max(e, std::fabs(l[i] - r[i]));
      const double u = dt == kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
      MESSAGE(what, ": max error ", e, " = ", e / (u * m), " u max|ref|");
      CHECK_MESSAGE(e <= 8 * u * m, "max error ", e, " vs bound ", 8 * u * m);
    }
  }
}

TEST_CASE("attention-weight dropout acts in training only and keeps the expected output") {
  const int64_t B = 1, H = 1, N = 8;
  Tensor q = leaf64({B, H, N, 4}, 41).detach(), k = leaf64({B, H, N, 4}, 42).detach(), v = leaf64({B, H, N, 3}, 43).detach();
  for (const char* type : {"clustered", "improved-clustered"}) {
    INFO(type);
    nlohmann::json o = {{"clusters", 3}, {"dropout", 0.5}, {"hash_seed", 2}};
    if (std::string(type) == "improved-clustered") o["topk"] = 3;
    auto layer = make_layer(type, o);
    layer->eval();
    auto clean = values(layer->forward(attention_args(q, k, v, Tensor())));
    layer->set_assignment(layer->last_assignment());
    layer->train();
    auto once = values(layer->forward(attention_args(q, k, v, Tensor())));
    CHECK(once != clean);
    // The mean over many draws is the clean output (inverted dropout): within 4.5
    // standard errors for every element.
    std::vector<double> mean(clean.size(), 0.0), sq(clean.size(), 0.0);
    const int draws = 400;
    for (int d = 0; d < draws; ++d) {
      auto y = values(layer->forward(attention_args(q, k, v, Tensor())));
      for (size_t i = 0; i < y.size(); ++i) {
        mean[i] += y[i] / draws;
        sq[i] += y[i] * y[i] / draws;
      }
    }
    int outside = 0;
    for (size_t i = 0; i < clean.size(); ++i) {
      const double se = std::sqrt(std::max(sq[i] - mean[i] * mean[i], 0.0) / draws);
      outside += std::abs(mean[i] - clean[i]) > 4.5 * se + 1e-12;
    }
    CHECK(outside == 0);
  }
  CHECK_THROWS_MSG(make_layer("clustered", {{"dropout", 1.0}}), ValueError, "[ClusteredAttention] dropout must be in [0, 1)");
}

TEST_CASE("clustered attention refuses bad input with messages naming the problem") {
  Tensor q = leaf64({1, 1, 4, 2}, 1), k = leaf64({1, 1, 4, 2}, 2), v = leaf64({1, 1, 4, 2}, 3);
  Tensor a = ti64({0, 1, 0, 1}, {1, 1, 4});
  CHECK_THROWS_MSG(nn::clustered_attention(q, k, v, ti64({0, 1, 0}, {1, 1, 3}), 2, Tensor(), 1.0), ShapeError,
                   "[clustered_attention] assignment must be (B, H, Nq) = (1, 1, 4)", "(1,1,3)");
  CHECK_THROWS_MSG(nn::clustered_attention(q, k, v, ti64({0, 2, 0, 1}, {1, 1, 4}), 2, Tensor(), 1.0), IndexError,
                   "[clustered_attention] cluster id 2", "[-1, 2)");
  CHECK_THROWS_MSG(nn::clustered_attention(q, k, v, ti64({0, 1, -2, 1}, {1, 1, 4}), 2, Tensor(), 1.0), IndexError,
                   "[clustered_attention] cluster id -2 at flat position 2", "[-1, 2)");
  CHECK_THROWS_MSG(nn::clustered_attention(q, k, v, to(a, kFloat64), 2, Tensor(), 1.0), DTypeError,
                   "[clustered_attention] assignment must be an int64");
  CHECK_THROWS_MSG(nn::clustered_attention(q, k, v, a, 2, Tensor(), 1.0, -1), ValueError, "topk must be >= 0");
  CHECK_THROWS_MSG(nn::clustered_attention(q, k, v, a, 0, Tensor(), 1.0), ValueError, "n_clusters must be >= 1");
  CHECK_THROWS_MSG(nn::clustered_attention(q, k, leaf64({1, 1, 3, 2}, 4), a, 2, Tensor(), 1.0), ShapeError,
                   "[clustered_attention] inconsistent shapes");
  CHECK_THROWS_MSG(make_layer("clustered", {{"bits", 64}}), ValueError, "[ClusteredAttention] bits must be in [1, 63]",
                   "64");
  CHECK_THROWS_MSG(make_layer("clustered", {{"clusters", 0}}), ValueError, "clusters must be >= 1");
  CHECK_THROWS_MSG(make_layer("improved-clustered", {{"topk", 0}}), ValueError,
                   "[ImprovedClusteredAttention] topk must be >= 1");
  CHECK_THROWS_MSG(make_layer("clustered", {{"topk", 4}}), ValueError, "attention.topk");
  CHECK_THROWS_MSG(make_layer("clustered", {{"hash_seed", -1}}), ValueError, "hash_seed must be >= 0");
  CHECK_THROWS_MSG(make_layer("improved-clustered", {{"centroid_path", "sparse"}}), ValueError,
                   "[ImprovedClusteredAttention] centroid_path must be \"auto\", \"fused\" or \"dense\"",
                   "got \"sparse\"");
  auto layer = make_layer("clustered", {});
  nn::AttentionArgs causal = attention_args(q, k, v, Tensor());
  causal.causal = true;
  CHECK_THROWS_MSG(layer->forward(causal), NotImplementedError, "[ClusteredAttention] causal masking is not supported",
                   "use improved-clustered");
  CHECK_THROWS_MSG(nn::clustered_attention(q, k, v, a, 2, Tensor(), 1.0, 0, 0.0, false, default_generator(), true),
                   NotImplementedError, "[clustered_attention] causal masking needs topk > 0");
  CHECK_THROWS_MSG(layer->set_assignment(to(a, kFloat64)), DTypeError, "set_assignment: expected int64 (B, H, Nq)");
  layer->set_assignment(ti64({0, 0, 0}, {1, 1, 3}));
  CHECK_THROWS_MSG(layer->forward(attention_args(q, k, v, Tensor())), ShapeError, "set_assignment is (1,1,3)",
                   "(B, H, Nq) = (1, 1, 4)");
  CHECK_THROWS_MSG(layer->cluster(ti64({1}, {1})), ShapeError, "cluster: expected float q (B, H, Nq, D)");
}

// The pattern corpus of every causal-LM test (nn/pattern_lm.h).
TEST_CASE("a causal LM with improved clustered attention learns the repeating-pattern corpus" * CF_SLOW) {
  Generator g(test_seed(9));
  manual_seed(test_seed(21));  // the hyperplanes come from the default generator: the same run whatever ran before
  // 4 clusters, each query sees at most 8 of the 24 keys (those in its past).
  models::CausalLM lm(pattern_lm_config("improved-clustered", {{"clusters", 4}, {"topk", 8}}), g);
  const PatternLMRun r = train_pattern_lm(lm, 300, nullptr, true);
  const double first = r.first, held_out = r.held_out, unigram = pattern_unigram_nats();
  MESSAGE("improved clustered causal LM: loss ", first, " -> held-out ", held_out, " nats/token (unigram ", unigram,
          ")");
  // Below what the current token alone allows (0.46, pattern_lm.h): the model reads
  // earlier tokens through the causal top-k products. With fresh hyperplanes at
  // every forward the last steps are noisy: at 150 or 300 steps of constant rate
  // 2 of 12 seeds ended at 0.34-0.54; with the rate decayed over 300 steps, seeds
  // 1-12 (CF_TEST_SEED, both generators) gave 0.03-0.26.
  CHECK(held_out < 0.3);
}

namespace {
// The small models the set_attention tests switch: vocabulary 6, d_model 8, 2 heads, no dropout.
models::TransformerConfig small_switch_config(int64_t n_layers) {
  models::TransformerConfig c;
  c.vocab_size = 6;
  c.max_len = 16;
  c.n_layers = n_layers;
  c.layer.d_model = 8;
  c.layer.n_heads = 2;
  c.layer.d_ff = 16;
  c.layer.dropout = 0.0;
  return c;
}
}  // namespace

TEST_CASE("a layer that always runs causally refuses clustered attention when built or switched to") {
  // Clustered attention cannot mask causally (every member takes its centroid's weights over all keys); a
  // decoder's self-attention found out at its first forward before.
  models::TransformerConfig c = small_switch_config(1);
  Generator g(1);
  models::TransformerConfig clustered = c;
  clustered.layer.attention.type = "clustered";
  clustered.layer.attention.options = nn::Config(nlohmann::json{{"clusters", 2}}, "attention");
  CHECK_THROWS_MSG(models::CausalLM(clustered, g), NotImplementedError,
                   "[CausalLM] attention 'clustered' cannot mask causally, which this model's decoder layers need; "
                   "use improved-clustered");
  CHECK_THROWS_MSG(models::EncoderDecoder(clustered, g), NotImplementedError,
                   "[TransformerDecoderLayer] attention 'clustered' cannot mask causally");
  models::EncoderClassifier encoder_only(clustered, g);  // not causal: fine
  models::CausalLM lm(c, g);
  CHECK_THROWS_MSG(models::set_attention(lm, nlohmann::json{{"type", "clustered"}}), NotImplementedError,
                   "[set_attention] 'clustered' cannot mask causally, and the model's decoder layers run causally; "
                   "use improved-clustered or another variant (nothing was switched)");
  CHECK(lm.decoder->layers[0]->self_attn->attention().type() == "full");
  CHECK_THROWS_MSG(lm.decoder->layers[0]->self_attn->set_attention(nn::make_attention(
                       nn::AttentionSpec{"clustered", 8, 2, nn::Config(nlohmann::json::object(), "attention"), nullptr})),
                   NotImplementedError,
                   "[MultiHeadAttention] set_attention: 'clustered' cannot mask causally, and this layer always runs "
                   "causally");
  CHECK(models::set_attention(lm, nlohmann::json{{"type", "improved-clustered"}, {"clusters", 2}}) == 1);
  Tensor logits = lm.forward(ti64({1, 2, 3, 4}, {1, 4}));  // and it runs causally
  CHECK(logits.shape() == Shape{1, 4, 6});
  models::EncoderDecoder ed(c, g);  // the encoder's layers may take clustered attention, the decoder's not
  CHECK_THROWS_MSG(models::set_attention(ed, nlohmann::json{{"type", "clustered"}}), NotImplementedError,
                   "(nothing was switched)");
  CHECK(ed.encoder->layers[0]->self_attn->attention().type() == "full");
}

TEST_CASE("set_attention switches every self-attention layer and refuses models without one") {
  models::TransformerConfig c = small_switch_config(2);
  Generator g(1);
  models::EncoderDecoder ed(c, g);
  auto before = ed.state_dict();
  CHECK(models::set_attention(ed, nlohmann::json{{"type", "improved-clustered"}, {"clusters", 3}}) == 4);
  CHECK(ed.encoder->layers[0]->self_attn->attention().type() == "improved-clustered");
  CHECK(ed.decoder_layers[1]->self_attn->attention().type() == "improved-clustered");
  CHECK(ed.decoder_layers[1]->cross_attn->attention().type() == "full");
  CHECK(ed.state_dict().size() == before.size());  // no parameters added or lost
  CHECK(models::set_attention(ed, nlohmann::json{{"type", "full"}}, true) == 6);
  CHECK(ed.decoder_layers[1]->cross_attn->attention().type() == "full");
  nn::Linear lin(2, 2, true, g);
  CHECK_THROWS_MSG(models::set_attention(lin, nlohmann::json{{"type", "full"}}), ValueError,
                   "[set_attention] the model has no self-attention layer");
  CHECK_THROWS_MSG(models::set_attention(ed, nlohmann::json{{"type", "clustered"}, {"clustres", 3}}), ValueError,
                   "attention.clustres");
  CHECK(ed.encoder->layers[0]->self_attn->attention().type() == "full");  // a failed switch changes nothing
  CHECK_THROWS_MSG(models::set_attention(ed, nlohmann::json::array()), ValueError, "[set_attention] expected an object");
  // The switched-in variant follows the model's mode.
  ed.eval();
  models::set_attention(ed, nlohmann::json{{"type", "improved-clustered"}});
  CHECK_FALSE(ed.encoder->layers[0]->self_attn->attention().is_training());
  // Neural clustering switched in is linked per stack as a model built with it: each stack's later layers
  // read the previous layer's centroids, and the state dict has a built model's keys.
  models::set_attention(ed, nlohmann::json{{"type", "neural-clustering"}, {"clusters", 2}});
  auto nc = [](const std::shared_ptr<nn::MultiHeadAttention>& m) {
    return dynamic_cast<nn::NeuralClusteringAttention*>(&m->attention());
  };
  REQUIRE(nc(ed.decoder_layers[1]->self_attn) != nullptr);
  CHECK(nc(ed.encoder->layers[0]->self_attn)->chain_index() == 0);
  CHECK(nc(ed.encoder->layers[1]->self_attn)->chain_index() == 1);
  CHECK(nc(ed.decoder_layers[0]->self_attn)->chain_index() == 0);
  CHECK(nc(ed.decoder_layers[1]->self_attn)->chain_index() == 1);
  CHECK_FALSE(nc(ed.encoder->layers[1]->self_attn)->centroids.defined());
  models::TransformerConfig cn = c;
  cn.layer.attention.type = "neural-clustering";
  cn.layer.attention.options = nn::Config(nlohmann::json{{"clusters", 2}}, "attention");
  Generator g2(2);
  models::EncoderDecoder built(cn, g2);
  std::set<std::string> switched_keys, built_keys;
  for (auto& [k, v] : ed.state_dict()) switched_keys.insert(k);
  for (auto& [k, v] : built.state_dict()) built_keys.insert(k);
  CHECK(switched_keys == built_keys);
  ed.load_state_dict(built.state_dict());
}

TEST_CASE("a classifier trained with clustered attention learns, and keeps working under full and improved" * CF_SLOW) {
  // The pattern task of test_transformer.cpp (does the bigram 3 5 occur?) on
  // sequences of 12 tokens, with 4 clusters per head: a real approximation.
  // Seeds 1-12 (CF_TEST_SEED) after 1500 steps with a decaying rate: clustered
  // 0.93-0.99, improved 0.94-0.99, full 0.94-0.99 (600 steps at a constant rate,
  // the old budget, left 6 of 12 seeds below 0.9).
  const int64_t V = 8, N = 12;
  Generator data(42);
  auto make_set = [&](int64_t count, std::vector<int64_t>& ids, std::vector<int64_t>& labels) {
    make_bigram_set(data, V, N, count, ids, labels);
  };
  std::vector<int64_t> te_ids, te_y;
  make_set(256, te_ids, te_y);
  Tensor Xte = ti64(te_ids, {256, N});

  models::TransformerConfig c;
  c.vocab_size = V;
  c.max_len = 32;
  c.n_layers = 2;
  c.layer.d_model = 32;
  c.layer.n_heads = 2;
  c.layer.d_ff = 64;
  c.layer.dropout = 0.0;
  c.layer.attention.type = "clustered";
  c.layer.attention.options = nn::Config(nlohmann::json{{"clusters", 4}, {"bits", 31}}, "attention");
  // Clustered attention draws fresh hyperplanes from the global generator on every
  // forward (Fast Transformers, section 3.2.1): seed it, or the result depends on
  // which tests ran before this one.
  manual_seed(test_seed(7));
  Generator g(test_seed(7));
  models::EncoderClassifier model(c, g);
  nn::AdamWOptions o;
  o.lr = 3e-3;
  o.weight_decay = 0.0;
  nn::AdamW opt(model.named_parameters(), o);
  auto accuracy = [&] {
    NoGradGuard ng;
    auto pred = argmax(model.forward(Xte), 1).to_vector<int64_t>();
    int64_t correct = 0;
    for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == te_y[i];
    return double(correct) / double(pred.size());
  };
  model.eval();
  const double acc_untrained = accuracy();
  model.train();
  double first_loss = 0, last_loss = 0;
  const int64_t B = 32;
  const int64_t steps = 1500;
  const nn::WarmupCosineLR schedule(o.lr, 0, steps);  // decay: a steadier end point across seeds
  for (int64_t step = 0; step < steps; ++step) {
    schedule.apply(opt);
    std::vector<int64_t> ids, y;
    make_set(B, ids, y);
    Tensor loss = cross_entropy(model.forward(ti64(ids, {B, N})), ti64(y, {B}));
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (step == 0) first_loss = loss.item<float>();
    last_loss = loss.item<float>();
  }
  model.eval();
  const double acc_clustered = accuracy();
  models::set_attention(model, nlohmann::json{{"type", "improved-clustered"}, {"clusters", 4}, {"bits", 31}, {"topk", 4}});
  const double acc_improved = accuracy();
  models::set_attention(model, nlohmann::json{{"type", "full"}});
  const double acc_full = accuracy();
  MESSAGE("trained with clustered-4: loss ", first_loss, " -> ", last_loss, "; held-out accuracy untrained ",
          acc_untrained, ", clustered ", acc_clustered, ", improved-clustered ", acc_improved, ", full ", acc_full);
  CHECK(last_loss < 0.5 * first_loss);
  CHECK(acc_clustered >= 0.9);
  CHECK(acc_improved >= 0.85);
  CHECK(acc_full >= 0.75);
}

}  // TEST_SUITE
