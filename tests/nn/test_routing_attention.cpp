// Routing attention (Roy et al. 2021, nn/attention/routing.h): balanced routing, attention within clusters
// against explicit dense references, online k-means (EMA) centroids, the commitment loss, local heads.
#include <cmath>

#include "autograd/ops/attention.h"
#include "nn/attention/routing.h"
#include "nn/nn_test_util.h"
#include "nn/pattern_lm.h"
#include "nn/optim/adam.h"

using namespace cf;
using namespace cf::test;

namespace {

// Query lists with a position in two lists and empty slots; key lists differ from the query lists.
void example_members(Tensor& qm, Tensor& km) {
  // (B=2, H=1, C=3, w=3), N = 7
  qm = ti64({0, 3, 5, /**/ 1, 3, -1, /**/ 2, 4, 6, /**/ 6, 5, 4, /**/ 0, 1, -1, /**/ 2, 3, 0}, {2, 1, 3, 3});
  km = ti64({1, 3, 6, /**/ 0, 2, 4, /**/ 5, 6, -1, /**/ 3, 4, 5, /**/ 0, 6, 1, /**/ -1, 2, 3}, {2, 1, 3, 3});
}

}  // namespace

TEST_CASE("routing attention: the fused routed_attention op equals its dense reference, forward and backward") {
  Tensor qm, km;
  example_members(qm, km);
  Tensor kpm = pad_mask(2, 7, {{1, 6}});
  for (bool causal : {false, true})
    for (bool padded : {false, true}) {
      INFO("causal ", causal, " padded ", padded);
      Tensor m = padded ? kpm : Tensor();
      Tensor q = leaf64({2, 2, 7, 3}, 1), k = leaf64({2, 2, 7, 3}, 2), v = leaf64({2, 2, 7, 4}, 3);
      Tensor wo = leaf64({2, 2, 7, 4}, 4).detach();
      Tensor fast = routed_attention(q, k, v, qm, km, m, 0.0, causal);
      sum(fast * wo).backward();
      std::vector<Tensor> g = {q.grad(), k.grad(), v.grad()};
      q.zero_grad();
      k.zero_grad();
      v.zero_grad();
      Tensor dense = nn::routed_attention_dense_reference(q, k, v, qm, km, m, 0.0, causal);
      sum(dense * wo).backward();
      check_close(fast, dense, 1e-12);
      check_close(g[0], q.grad(), 1e-12);
      check_close(g[1], k.grad(), 1e-12);
      check_close(g[2], v.grad(), 1e-12);
      if (causal) check_close(narrow(narrow(fast, 0, 0, 1), 2, 0, 1), std::vector<double>(8, 0.0), 0.0);
      // Token 3 of batch 0 sits in query lists 0 and 1 (its output is the average of the two, computed list by
      // list in the reference); under causal, token 0 of batch 0 (list 0 only, keys 1, 3, 6) has no allowed key.
      GradcheckResult r = gradcheck(
          [&](const std::vector<Tensor>& xs) { return routed_attention(xs[0], xs[1], xs[2], qm, km, m, 0.0, causal); },
          {q, k, v});
      CHECK_MESSAGE(r.ok, r.message);
    }
}

TEST_CASE("routing attention: one cluster equals full attention (padding, causal)") {
  nn::RoutingAttention att(2, 4, /*n_clusters=*/1);
  att.to(kFloat64);
  att.eval();
  nn::FullAttention full;
  Tensor q = leaf64({2, 2, 7, 4}, 1), k = leaf64({2, 2, 7, 4}, 2), v = leaf64({2, 2, 7, 3}, 3);
  Tensor kpm = pad_mask(2, 7, {{1, 5}, {1, 6}});
  for (bool causal : {false, true})
    for (bool padded : {false, true}) {
      Tensor m = padded ? kpm : Tensor();
      Tensor got = att.forward(attention_args(q, k, v, m, causal));
      Tensor ref = full.forward(attention_args(q, k, v, m, causal));
      check_vec_close(real_rows(got, m), real_rows(ref, m), 1e-12);
      // local heads whose window holds every token are full attention too, whatever the window (one of 2^40
      // allocated that many slots before it was taken as N)
      for (int64_t window : {int64_t(7), int64_t(1) << 40}) {
        nn::RoutingAttention local(2, 4, 1, /*local_heads=*/2, window);
        local.to(kFloat64);
        local.eval();
        check_vec_close(real_rows(local.forward(attention_args(q, k, v, m, causal)), m), real_rows(ref, m), 1e-12);
      }
    }
}

TEST_CASE("routing attention: balanced routing takes each cluster's top-w tokens by cosine similarity") {
  Generator g(5);
  Tensor xn = nn::l2_normalize(randn({1, 2, 6, 3}, kFloat64, g));
  Tensor mu = nn::l2_normalize(randn({2, 3, 3}, kFloat64, g));
  Tensor kpm = pad_mask(1, 6, {{0, 4}});
  Tensor m = nn::balanced_routing(xn, mu, kpm, 2);
  REQUIRE(m.shape() == Shape{1, 2, 3, 2});
  auto x = values(xn), c = values(mu);
  auto got = m.to_vector<int64_t>();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t cl = 0; cl < 3; ++cl) {
      std::vector<std::pair<double, int64_t>> s;
      for (int64_t i = 0; i < 6; ++i) {
        if (i == 4) continue;  // padding is never routed
        double d = 0;
        for (int64_t e = 0; e < 3; ++e) d += x[size_t((h * 6 + i) * 3 + e)] * c[size_t((h * 3 + cl) * 3 + e)];
        s.push_back({-d, i});
      }
      std::sort(s.begin(), s.end());
      CHECK(got[size_t((h * 3 + cl) * 2)] == s[0].second);
      CHECK(got[size_t((h * 3 + cl) * 2 + 1)] == s[1].second);
    }
  // With fewer real tokens than slots the rest is -1.
  Tensor all_but_one = pad_mask(1, 6, {{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}});
  auto few = nn::balanced_routing(xn, mu, all_but_one, 2).to_vector<int64_t>();
  for (size_t i = 0; i < few.size(); i += 2) {
    CHECK(few[i] == 5);
    CHECK(few[i + 1] == -1);
  }
}

TEST_CASE("routing attention: the module equals the dense reference of its own routing - causal sees no later key") {
  const int64_t B = 2, H = 3, N = 9, D = 4;
  nn::RoutingAttention att(H, D, /*n_clusters=*/3, /*local_heads=*/1, /*local_window=*/2);
  att.to(kFloat64);
  att.eval();
  Tensor q = leaf64({B, H, N, D}, 1), k = leaf64({B, H, N, D}, 2), v = leaf64({B, H, N, 2}, 3);
  Tensor kpm = pad_mask(B, N, {{1, 8}});
  for (bool causal : {false, true}) {
    INFO("causal ", causal);
    Tensor got = att.forward(attention_args(q, k, v, kpm, causal));
    // Routing heads 1, 2: the clusters from balanced_routing, attention from the dense reference.
    NoGradGuard ng;
    Tensor qr = narrow(q, 1, 1, 2), kr = narrow(k, 1, 1, 2), vr = narrow(v, 1, 1, 2);
    Tensor qm = nn::balanced_routing(nn::l2_normalize(qr), att.centroids(), kpm, 3);
    Tensor km = nn::balanced_routing(nn::l2_normalize(kr), att.centroids(), kpm, 3);
    Tensor ref_r = nn::routed_attention_dense_reference(qr, kr, vr, qm, km, kpm, 0.0, causal);
    check_vec_close(real_rows(narrow(got, 1, 1, 2), kpm), real_rows(ref_r, kpm), 1e-12);
    // Local head 0: blocks of 2, block b sees blocks b-1, b (, b+1 unless causal), written as a band mask.
    std::vector<bool> band(size_t(N * N));
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < N; ++j) {
        int64_t d = j / 2 - i / 2;
        band[size_t(i * N + j)] = !(d >= -1 && d <= (causal ? 0 : 1)) || (causal && j > i);
      }
    Tensor blocked = logical_or(reshape(Tensor::from_vector(band, {N, N}), {1, 1, N, N}), reshape(kpm, {B, 1, 1, N}));
    Tensor ref_l = nn::dense_attention(narrow(q, 1, 0, 1), narrow(k, 1, 0, 1), narrow(v, 1, 0, 1), blocked,
                                       1.0 / std::sqrt(double(D)));
    check_vec_close(real_rows(narrow(got, 1, 0, 1), kpm), real_rows(ref_l, kpm), 1e-12);
  }
  // Causal with the routing held fixed: changing the keys and values of positions >= 5 leaves outputs 0..4 alone.
  Tensor qm, km;
  example_members(qm, km);
  Tensor base = routed_attention(q.detach(), k.detach(), v.detach(), qm, km, Tensor(), 0.0, true);
  Tensor k2 = clone(k.detach()), v2 = clone(v.detach());
  {
    NoGradGuard ng;
    Tensor kr = narrow(k2, 2, 5, 4), vr = narrow(v2, 2, 5, 4);
    fill_(kr, 4.0);
    fill_(vr, -3.0);
  }
  Tensor moved = routed_attention(q.detach(), k2, v2, qm, km, Tensor(), 0.0, true);
  check_close(narrow(moved, 2, 0, 5), narrow(base, 2, 0, 5), 0.0);
  CHECK(values(narrow(moved, 2, 5, 4)) != values(narrow(base, 2, 5, 4)));
}

TEST_CASE("routing attention: the EMA centroid update and the commitment loss match a direct computation") {
  // Head 0 is local: the routing heads are heads 1 and 2, with centroid sets 0 and 1.
  const int64_t B = 2, H = 3, L = 1, R = H - L, N = 6, D = 3, C = 2;
  const double lambda = 0.9;
  nn::RoutingAttention att(H, D, C, /*local_heads=*/L, 0, lambda, 0.0, /*seed=*/3);
  att.to(kFloat64);
  Tensor q = leaf64({B, H, N, D}, 1), k = leaf64({B, H, N, D}, 2), v = leaf64({B, H, N, 2}, 3);
  Tensor kpm = pad_mask(B, N, {{1, 4}, {1, 5}});
  std::vector<double> mu = values(att.centroids());
  auto unit = [&](const std::vector<double>& x, int64_t row) {
    std::vector<double> u(static_cast<size_t>(D), 0.0);
    double n2 = 1e-12;
    for (int64_t d = 0; d < D; ++d) n2 += x[size_t(row * D + d)] * x[size_t(row * D + d)];
    for (int64_t d = 0; d < D; ++d) u[size_t(d)] = x[size_t(row * D + d)] / std::sqrt(n2);
    return u;
  };
  auto qv = values(q), kv = values(k);
  auto pad = kpm.to_vector<bool>();
  std::vector<double> expected = mu;
  double commit = 0;
  for (int64_t h = 0; h < R; ++h) {
    std::vector<double> sum_q(size_t(C * D), 0), sum_k(size_t(C * D), 0), cnt_q(size_t(C), 0), cnt_k(size_t(C), 0);
    for (const std::vector<double>* x : {&qv, &kv}) {
      double se = 0, count = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < N; ++i) {
          if (pad[size_t(b * N + i)]) continue;
          auto u = unit(*x, (b * H + L + h) * N + i);
          int64_t best = 0;
          double best_d = INFINITY;
          for (int64_t c = 0; c < C; ++c) {
            double d2 = 0;
            for (int64_t d = 0; d < D; ++d) d2 += std::pow(u[size_t(d)] - mu[size_t((h * C + c) * D + d)], 2);
            if (d2 < best_d) best_d = d2, best = c;
          }
          se += best_d;
          count += 1;
          auto& s = x == &qv ? sum_q : sum_k;
          auto& n = x == &qv ? cnt_q : cnt_k;
          for (int64_t d = 0; d < D; ++d) s[size_t(best * D + d)] += u[size_t(d)];
          n[size_t(best)] += 1;
        }
      commit += 0.5 * se / (count * double(D)) / double(R);
    }
    for (int64_t c = 0; c < C; ++c)
      for (int64_t d = 0; d < D; ++d) {
        size_t at = size_t((h * C + c) * D + d);
        double mq = cnt_q[size_t(c)] > 0 ? sum_q[size_t(c * D + d)] / cnt_q[size_t(c)] : mu[at];
        double mk = cnt_k[size_t(c)] > 0 ? sum_k[size_t(c * D + d)] / cnt_k[size_t(c)] : mu[at];
        expected[at] = lambda * mu[at] + (1 - lambda) / 2 * (mq + mk);
      }
  }
  // Eval mode: the loss is reported, the centroids stay.
  nn::AuxLosses aux;
  att.eval();
  att.forward(attention_args(q, k, v, kpm, false, &aux));
  REQUIRE(aux.get("routing_commitment").size() == 1);
  CHECK(aux.get("routing_commitment")[0].item<double>() == doctest::Approx(commit).epsilon(1e-12));
  check_close(att.centroids(), mu, 0.0);
  // Training mode: mu <- lambda mu + (1 - lambda)/2 (mean assigned Q + mean assigned K). A NaN at a
  // padded query and an inf at a padded key change nothing: padded tokens never reach the centroids.
  att.train();
  const Tensor real = logical_not(reshape(kpm, {B, 1, N, 1}));
  att.forward(attention_args(where(real, q.detach(), NAN), where(real, k.detach(), INFINITY), v, kpm, false));
  check_close(att.centroids(), expected, 1e-12);
  // The centroids live in the state dict as a buffer, not a parameter (no gradient).
  auto sd = att.state_dict();
  REQUIRE(nn::find_entry(sd, "centroids") != nullptr);
  CHECK(att.parameters().empty());
  // The commitment loss sends gradient to q and k (through the normalisation), none to the centroids.
  att.eval();
  GradcheckResult r = gradcheck(
      [&](const std::vector<Tensor>& xs) {
        nn::AuxLosses a2;
        att.forward(attention_args(xs[0], xs[1], v.detach(), kpm, false, &a2));
        return a2.get("routing_commitment")[0];
      },
      {q, k});
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("routing attention: the commitment loss without padding, and its backward after the centroids moved") {
  const int64_t B = 2, H = 2, N = 5, D = 3, C = 2;
  nn::RoutingAttention att(H, D, C, /*local_heads=*/0, 0, 0.9, 0.0, /*seed=*/3);
  att.to(kFloat64);
  Tensor q = leaf64({B, H, N, D}, 4), k = leaf64({B, H, N, D}, 5), v = leaf64({B, H, N, 2}, 6);
  const Tensor mu = clone(att.centroids());
  // The composition on the module's own assignments: sum |xn - mu_assigned|^2 / (B N H D), the two sides' mean.
  auto side = [&](const Tensor& x) {
    const Tensor xn = l2_normalize(x);
    const Tensor a = nn::nearest_centroid(xn.detach(), mu);
    const Tensor target = take_along_dim(reshape(mu, {1, H, C, D}), reshape(a, {B, H, N, 1}), 2);
    return sum(square(xn - target)) / double(B * N * H * D);
  };
  nn::AuxLosses aux;
  att.eval();
  att.forward(attention_args(q, k, v, Tensor(), false, &aux));
  REQUIRE(aux.get("routing_commitment").size() == 1);
  Tensor loss = aux.get("routing_commitment")[0];
  Tensor want = (side(q) + side(k)) * 0.5;
  check_close(loss, want, 1e-12);
  // A training forward moves the centroids (the EMA writes the buffer) before the first loss's backward,
  // which reads the centroids its own forward saw.
  att.train();
  att.forward(attention_args(q.detach(), k.detach(), v, Tensor(), false));
  CHECK(amax(abs(att.centroids() - mu)).item<double>() > 0);
  REQUIRE_NOTHROW(loss.backward());
  const Tensor gq = clone(q.grad()), gk = clone(k.grad());
  q.zero_grad();
  k.zero_grad();
  want.backward();
  check_close(gq, q.grad(), 1e-12);
  check_close(gk, k.grad(), 1e-12);
}

TEST_CASE("routing attention: float64 gradcheck through MultiHeadAttention with the routing fixed") {
  Generator g(2);
  // Chosen by config in a model: the encoder classifier and the encoder-decoder (decoder self-attention).
  {
    nlohmann::json j = {{"vocab_size", 10}, {"d_model", 8}, {"n_heads", 2}, {"d_ff", 16},
                        {"attention", {{"type", "routing"}, {"n_clusters", 2}, {"local_heads", 1}}}};
    models::TransformerConfig c = models::TransformerConfig::from_json(j);
    models::EncoderClassifier clf(c);
    CHECK(clf.forward(ti64({1, 2, 3, 0, 0, 4, 5, 6, 7, 8}, {2, 5})).shape() == Shape{2, 2});
    models::EncoderDecoder s2s(c);
    CHECK(s2s.forward(ti64({1, 2, 3, 4}, {1, 4}), Tensor(), ti64({1, 2, 3}, {1, 3})).shape() == Shape{1, 3, 10});
  }
  nn::AttentionSpec spec;
  spec.type = "routing";
  spec.d_model = 8;
  spec.n_heads = 2;
  spec.options = nn::Config(nlohmann::json{{"n_clusters", 2}, {"local_heads", 1}, {"local_window", 2}}, "attention");
  nn::MultiHeadAttention mha(8, 2, nn::make_attention(spec), g);
  CHECK(mha.attention().type() == "routing");
  mha.to(kFloat64);
  mha.eval();  // no EMA update: the centroids, hence the routing, stay fixed between evaluations
  Tensor mask = pad_mask(1, 5, {{0, 4}});
  check_module_grad(mha, [&](const std::vector<Tensor>& xs) { return mha(xs[0], mask, true); },
                    {leaf64({1, 5, 8}, 4)});
  // Every head routed, and every head local (q, k, v taken whole, not narrowed), without padding (balanced
  // routing then takes topk's lists as they are), causal and not.
  for (int64_t local_heads : {0, 2})
    for (bool causal : {false, true}) {
      CAPTURE(local_heads);
      CAPTURE(causal);
      spec.options = nn::Config(nlohmann::json{{"n_clusters", 2}, {"local_heads", local_heads}, {"local_window", 2}},
                                "attention");
      nn::MultiHeadAttention all(8, 2, nn::make_attention(spec), g);
      all.to(kFloat64);
      all.eval();
      check_module_grad(all, [&](const std::vector<Tensor>& xs) { return all(xs[0], Tensor(), causal); },
                        {leaf64({2, 5, 8}, 5)});
    }
}

TEST_CASE("routing attention: bad arguments and options are errors naming the values") {
  CHECK_THROWS_MSG(nn::RoutingAttention(2, 4, 0), ValueError, "[RoutingAttention] n_clusters must be positive, got 0");
  CHECK_THROWS_MSG(nn::RoutingAttention(2, 4, 2, 3), ValueError, "local_heads must be in [0, 2] (n_heads), got 3");
  CHECK_THROWS_MSG(nn::RoutingAttention(2, 4, 2, 0, -1), ValueError, "local_window must be >= 0");
  CHECK_THROWS_MSG(nn::RoutingAttention(2, 4, 2, 0, 0, 1.0), ValueError, "decay must be in [0, 1), got 1");
  CHECK_THROWS_MSG(nn::RoutingAttention(2, 4, 2, 0, 0, 0.9, -1.0), ValueError, "scale must be >= 0");
  CHECK_THROWS_MSG(nn::RoutingAttention(2, 4, 2, 0, 0, 0.9, 0.0, -2), ValueError,
                   "[RoutingAttention] seed must be -1 (default generator) or >= 0, got -2");
  nn::RoutingAttention att(2, 4, 2);
  Tensor q = leaf64({1, 2, 5, 4});
  CHECK_THROWS_MSG(att.forward(attention_args(q, q, q, Tensor(), false)), DTypeError,
                   "[RoutingAttention] q is float64 but the centroids are float32");
  att.to(kFloat64);
  CHECK_THROWS_MSG(att.forward(attention_args(leaf64({1, 3, 5, 4}), leaf64({1, 3, 5, 4}), leaf64({1, 3, 5, 4}), Tensor(), false)),
                   ShapeError, "[RoutingAttention] built for 2 heads of size 4, got q (1,3,5,4)");
  CHECK_THROWS_MSG(att.forward(attention_args(q, leaf64({1, 2, 6, 4}), leaf64({1, 2, 6, 4}), Tensor(), false)), ShapeError,
                   "[RoutingAttention] routing attention is self-attention: q has 5 positions, k 6");
  CHECK_THROWS_MSG(att.forward(attention_args(q, leaf64({1, 2, 5, 3}), q, Tensor(), false)), ShapeError,
                   "[RoutingAttention] inconsistent shapes");
  // The public routing helpers check their arguments (a w above N failed inside [topk]).
  Tensor xn = leaf64({1, 2, 4, 4}, 5), mu = leaf64({2, 3, 4}, 6);
  CHECK_THROWS_MSG(nn::balanced_routing(xn, mu, Tensor(), 10), ValueError, "[balanced_routing] w (10) must be in [1, N = 4]");
  CHECK_THROWS_MSG(nn::balanced_routing(xn, leaf64({3, 3, 4}, 6), Tensor(), 2), ShapeError,
                   "[balanced_routing] expected xn (B, H, N, D) and centroids (H, C, D)", "centroids float64 (3,3,4)");
  CHECK_THROWS_MSG(nn::balanced_routing(xn, mu, Tensor::zeros({1, 5}, kBool), 2), ShapeError,
                   "[balanced_routing] key_padding_mask must be bool (B, N) = (1, 4)");
  CHECK_THROWS_MSG(nn::nearest_centroid(xn, to(mu, kFloat32)), DTypeError,
                   "[nearest_centroid] xn and centroids must share one float dtype, got float64 and float32");
  Tensor qm, km;
  example_members(qm, km);
  Tensor q7 = leaf64({2, 1, 7, 3});
  CHECK_THROWS_MSG(routed_attention(q7, q7, q7, ti64({0, 9}, {1, 1, 1, 2}), ti64({0, 1}, {1, 1, 1, 2})),
                   IndexError, "[routed_attention] member position 9 at flat position 1 of query_members is out of range [-1, 7)");
  CHECK_THROWS_MSG(routed_attention(q7, q7, q7, ti64({0, 1}, {1, 1, 1, 2}), ti64({-1, -2}, {1, 1, 1, 2})),
                   IndexError, "[routed_attention] member position -2 at flat position 1 of key_members");
  CHECK_THROWS_MSG(routed_attention(q7, q7, q7, qm, narrow(km, 2, 0, 2)), ShapeError,
                   "must have the same number of lists C");
  CHECK_THROWS_MSG(routed_attention(q7, q7, q7, to(qm, kFloat64), km), ShapeError,
                   "query_members must be int64 (B, H, C, w)");
  CHECK_THROWS_MSG(routed_attention(q7, q7, q7, ti64({0, 0, 0}, {3, 1, 1, 1}), km), ShapeError,
                   "query_members (3,1,1,1) does not broadcast to (B, H) = (2, 1)");
  CHECK_THROWS_MSG(nn::local_members(4, 0, false, qm, km), ValueError, "[local_members] need n > 0 and window > 0");
  {  // An empty sequence gives an empty output.
    nn::RoutingAttention e(2, 4, 2, 1);
    e.to(kFloat64);
    Tensor z = leaf64({1, 2, 0, 4});
    CHECK(e.forward(attention_args(z, z, z, Tensor(), true)).shape() == Shape{1, 2, 0, 4});
  }
  nn::AttentionSpec spec;
  spec.type = "routing";
  spec.d_model = 8;
  spec.n_heads = 2;
  spec.options = nn::Config(nlohmann::json{{"n_cluster", 2}}, "attention");
  CHECK_THROWS_MSG(nn::make_attention(spec), ValueError, "unknown key", "attention.n_cluster");
  spec.options = nn::Config(nlohmann::json{{"local_heads", 3}}, "attention");
  CHECK_THROWS_MSG(nn::make_attention(spec), ValueError, "local_heads must be in [0, 2]");
}

// The repeating-pattern corpus of the Transformer tests (period 6: the next token depends on the last two).
TEST_CASE("routing attention: a causal LM with routing and local heads learns the pattern corpus" * CF_SLOW) {
  Generator g(test_seed(9));
  manual_seed(test_seed(21));  // the centroids are drawn from the default generator: the same run whatever ran before
  models::CausalLM lm(pattern_lm_config("routing", {{"n_clusters", 3}, {"local_heads", 1}, {"local_window", 4},
                                                     {"decay", 0.99}}),
                      g);
  const PatternLMRun r = train_pattern_lm(
      lm, 150, [](const Tensor& task, nn::AuxLosses& aux) { return task + aux.total({{"routing_commitment", 1e-4}}); });
  const double first = r.first, last = r.last, held_out = r.held_out;
  MESSAGE("routing causal LM: loss ", first, " -> ", last, ", held-out ", held_out, " nats/token");
  CHECK(held_out < 0.1);
}
