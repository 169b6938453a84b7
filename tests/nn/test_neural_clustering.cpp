// Neural clustering attention (ClusterFormer): the clustering (eqs. 2-6, 11), the
// layer against a dense reference built from the same assignment and blocks,
// k = 1 against full attention, gradchecks with L1 and L2, permutation
// equivariance, the centroid hand-over between layers, and bad input.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "models/transformer.h"
#include "nn/attention/neural_clustering.h"
#include "nn/nn_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

nn::NeuralClusteringOptions nc_options(int64_t k, int64_t look_back = 1,
                                       nn::ClusterTieOrder tie = nn::ClusterTieOrder::kMembership) {
  nn::NeuralClusteringOptions o;
  o.clusters = k;
  o.look_back = look_back;
  o.tie_order = tie;
  return o;
}

std::shared_ptr<nn::NeuralClusteringAttention> make_nc64(int64_t d_model, const nn::NeuralClusteringOptions& o,
                                                         uint64_t seed) {
  Generator g(seed);
  auto a = std::make_shared<nn::NeuralClusteringAttention>(d_model, o, g);
  a->to(kFloat64);
  return a;
}

nn::AttentionArgs args_of(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& x, const Tensor& kpm,
                          bool causal, nn::AuxLosses* aux = nullptr) {
  nn::AttentionArgs a;
  a.q = q;
  a.k = k;
  a.v = v;
  a.query_input = x;
  a.key_padding_mask = kpm;
  a.causal = causal;
  a.aux = aux;
  return a;
}

Tensor bools(const std::vector<bool>& v, const Shape& s) { return Tensor::from_vector(v, s); }

// The N x N blocked mask written from the paper's description, independently of
// chunked.h: sort tokens by cluster index (ties by descending U_{I_j, j}, then
// position, or by position only), cut the sorted sequence of each row's n valid
// tokens into blocks of w = ceil(n / k), let each block see itself and look_back
// blocks before it (cyclic), never padded keys, never later positions when causal;
// a padded query sees nothing (zeros).
Tensor reference_blocked(const Tensor& index, const Tensor& u, int64_t k, int64_t look_back, const Tensor& kpm,
                         bool causal, nn::ClusterTieOrder tie) {
  const int64_t B = index.shape()[0], N = index.shape()[1];
  auto idx = index.to_vector<int64_t>();
  auto uv = values(u);  // (B, k, N)
  std::vector<bool> pad(size_t(B * N), false);
  if (kpm.defined()) {
    auto m = kpm.to_vector<bool>();
    for (size_t i = 0; i < m.size(); ++i) pad[i] = m[i];
  }
  const int64_t chunks = k;  // eq. 8: k blocks, trailing ones may be empty
  std::vector<bool> blocked(size_t(B * N * N), true);
  for (int64_t b = 0; b < B; ++b) {
    int64_t n = 0;
    for (int64_t j = 0; j < N; ++j) n += pad[size_t(b * N + j)] ? 0 : 1;
    const int64_t w = std::max<int64_t>(1, (n + k - 1) / k);  // the row's own length (padding sorts last)
    std::vector<double> own(static_cast<size_t>(N), 0.0);  // U_{I_j, j}
    for (int64_t j = 0; j < N; ++j)
      for (int64_t i = 0; i < k; ++i) own[size_t(j)] = std::max(own[size_t(j)], uv[size_t((b * k + i) * N + j)]);
    std::vector<int64_t> order(static_cast<size_t>(N));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
      int64_t ix = idx[size_t(b * N + x)], iy = idx[size_t(b * N + y)];
      if (ix != iy) return ix < iy;
      return tie == nn::ClusterTieOrder::kMembership && own[size_t(x)] > own[size_t(y)];
    });
    std::vector<int64_t> block(static_cast<size_t>(N));
    for (int64_t r = 0; r < N; ++r) block[size_t(order[size_t(r)])] = r / w;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < N; ++j) {
        bool seen = false;
        for (int64_t t = 0; t <= look_back; ++t)
          seen = seen || block[size_t(j)] == ((block[size_t(i)] - t) % chunks + chunks) % chunks;
        if (seen && !pad[size_t(b * N + i)] && !pad[size_t(b * N + j)] && !(causal && j > i))
          blocked[size_t((b * N + i) * N + j)] = false;
      }
  }
  return bools(blocked, {B, 1, N, N});
}

struct Run {
  Tensor out;
  std::vector<Tensor> grads;  // of q, k, v
};

// out = f(q, k, v) on fresh leaves, then backward of sum(out * weight).
template <class F>
Run run_qkv(F f, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& weight) {
  std::vector<Tensor> in;
  for (const Tensor& t : {q, k, v}) {
    Tensor l = t.detach();
    l.set_requires_grad(true);
    in.push_back(l);
  }
  Run r;
  r.out = f(in[0], in[1], in[2]);
  sum(r.out * weight).backward();
  for (auto& t : in) r.grads.push_back(t.grad());
  return r;
}

void check_runs_equal(const Run& a, const Run& b, double tol) {
  check_close(a.out, b.out, tol);
  for (size_t i = 0; i < 3; ++i) {
    INFO("gradient of input ", i);
    check_close(a.grads[i], b.grads[i], tol);
  }
}

// Self-attention through MultiHeadAttention with a neural clustering attention, float64.
std::shared_ptr<nn::MultiHeadAttention> make_mha64(int64_t d_model, int64_t heads, const nn::NeuralClusteringOptions& o,
                                                   uint64_t seed) {
  Generator g(seed);
  auto att = std::make_shared<nn::NeuralClusteringAttention>(d_model, o, g);
  auto m = std::make_shared<nn::MultiHeadAttention>(d_model, heads, att, g);
  m->to(kFloat64);
  return m;
}

}  // namespace

TEST_CASE("neural clustering: U, C^, I, I', L1 and L2 follow eqs. 2-6 and 11 element by element") {
  const int64_t B = 2, N = 5, D = 3, K = 3;
  Tensor x = leaf64({B, N, D}, 1), c = leaf64({K, D}, 2, -2, 2), wc = leaf64({D, D}, 3);
  Tensor mask = bools({false, false, false, false, false, false, false, false, true, true}, {B, N});
  for (auto tie : {nn::ClusterTieOrder::kMembership, nn::ClusterTieOrder::kPosition}) {
    nn::NeuralClusteringResult r = nn::neural_clustering(x, c, wc, mask, tie);
    auto xv = values(x), cv = values(c), wv = values(wc);
    auto m = mask.to_vector<bool>();
    std::vector<double> u_ref(size_t(B * K * N), 0.0), ch_ref(size_t(B * K * D), 0.0);
    std::vector<double> l1(size_t(B), 0.0), l2(size_t(B), 0.0);
    for (int64_t b = 0; b < B; ++b) {
      std::vector<double> xw(size_t(N * D), 0.0);
      for (int64_t j = 0; j < N; ++j)
        for (int64_t e = 0; e < D; ++e)
          for (int64_t f = 0; f < D; ++f)
            xw[size_t(j * D + e)] += xv[size_t((b * N + j) * D + f)] * wv[size_t(f * D + e)];
      for (int64_t i = 0; i < K; ++i) {  // eq. 2: softmax over the non-padded tokens
        double z = 0;
        std::vector<double> s(size_t(N), 0.0);
        for (int64_t j = 0; j < N; ++j) {
          if (m[size_t(b * N + j)]) continue;
          double phi = 0;
          for (int64_t e = 0; e < D; ++e) phi += cv[size_t(i * D + e)] * xw[size_t(j * D + e)];
          z += (s[size_t(j)] = std::exp(phi));
        }
        for (int64_t j = 0; j < N; ++j) u_ref[size_t((b * K + i) * N + j)] = s[size_t(j)] / z;
        for (int64_t j = 0; j < N; ++j)  // eq. 3
          for (int64_t e = 0; e < D; ++e)
            ch_ref[size_t((b * K + i) * D + e)] += u_ref[size_t((b * K + i) * N + j)] * xw[size_t(j * D + e)];
      }
      int64_t n_real = 0;
      for (int64_t j = 0; j < N; ++j) {
        if (m[size_t(b * N + j)]) {
          CHECK(r.index.to_vector<int64_t>()[size_t(b * N + j)] == K);  // padding sorts after every cluster
          continue;
        }
        ++n_real;
        int64_t best = 0;  // eq. 4
        for (int64_t i = 1; i < K; ++i)
          if (u_ref[size_t((b * K + i) * N + j)] > u_ref[size_t((b * K + best) * N + j)]) best = i;
        CHECK(r.index.to_vector<int64_t>()[size_t(b * N + j)] == best);
        double phi = 0;  // eq. 6
        for (int64_t e = 0; e < D; ++e) phi += xv[size_t((b * N + j) * D + e)] * ch_ref[size_t((b * K + best) * D + e)];
        l1[size_t(b)] -= phi;
      }
      l1[size_t(b)] /= double(n_real);
      for (int64_t i = 0; i < K; ++i) {  // eq. 11: i-1 of i = 1 is k (the cyclic term)
        const int64_t p = (i + K - 1) % K;
        for (int64_t e = 0; e < D; ++e)
          l2[size_t(b)] -= ch_ref[size_t((b * K + i) * D + e)] * ch_ref[size_t((b * K + p) * D + e)] / double(K);
      }
    }
    check_close(r.u, u_ref, 1e-12);
    check_close(r.c_hat, ch_ref, 1e-12);
    check_close(nn::clustering_loss(x, r.c_hat, r.index, mask), {(l1[0] + l1[1]) / 2}, 1e-12);
    check_close(nn::centroid_sorting_loss(r.c_hat), {(l2[0] + l2[1]) / 2}, 1e-12);
    // eq. 5: I' lists the positions by ascending cluster index; within a cluster by
    // descending U_{I_j, j} (membership) or by position.
    auto order = r.order.to_vector<int64_t>(), idx = r.index.to_vector<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      std::vector<int64_t> seen(static_cast<size_t>(N), 0);
      for (int64_t s = 0; s < N; ++s) ++seen[size_t(order[size_t(b * N + s)])];
      CHECK(std::all_of(seen.begin(), seen.end(), [](int64_t n) { return n == 1; }));
      for (int64_t s = 0; s + 1 < N; ++s) {
        const int64_t p = order[size_t(b * N + s)], q = order[size_t(b * N + s + 1)];
        const int64_t ip = idx[size_t(b * N + p)], iq = idx[size_t(b * N + q)];
        CHECK(ip <= iq);
        if (ip == iq && ip < K) {
          if (tie == nn::ClusterTieOrder::kPosition) CHECK(p < q);
          else CHECK(u_ref[size_t((b * K + ip) * N + p)] >= u_ref[size_t((b * K + iq) * N + q)]);
        }
      }
    }
  }
  // k = 1: L2 = -phi(C^_1, C^_1) (the cyclic term alone).
  Tensor c1 = leaf64({1, 1, 3}, 4);
  check_close(nn::centroid_sorting_loss(c1), {-values(sum(c1 * c1)).front()}, 1e-12);
}

TEST_CASE("neural clustering: the bounded loss forms (cosine, sphere) follow their formulas and pass gradcheck") {
  const int64_t B = 2, N = 5, K = 3, D = 4;
  Tensor x = leaf64({B, N, D}, 81), c_hat = leaf64({B, K, D}, 82);
  Tensor index = ti64({0, 2, 1, 0, 2, 1, 1, 0, 2, 2}, {B, N});
  Tensor mask = bools({false, false, false, false, false, false, false, false, true, true}, {B, N});
  const std::vector<double> xv = values(x), cv = values(c_hat);
  const std::vector<int64_t> iv = index.to_vector<int64_t>();
  auto norm = [&](const std::vector<double>& v, size_t off) {
    double s = 0;
    for (int64_t e = 0; e < D; ++e) s += v[off + size_t(e)] * v[off + size_t(e)];
    return std::sqrt(s);
  };
  auto dot = [&](const std::vector<double>& a, size_t oa, const std::vector<double>& b, size_t ob) {
    double s = 0;
    for (int64_t e = 0; e < D; ++e) s += a[oa + size_t(e)] * b[ob + size_t(e)];
    return s;
  };
  const bool pad[] = {false, false, false, false, false, false, false, false, true, true};
  for (nn::ClusterLossForm form : {nn::ClusterLossForm::kCosine, nn::ClusterLossForm::kSphere}) {
    INFO("form ", nn::to_string(form));
    for (bool padded : {false, true}) {
      double l1 = 0;  // eq. 6 with phi normalised: the mean over the batch of -(1/N_b) sum_j phi
      for (int64_t b = 0; b < B; ++b) {
        double s = 0;
        int64_t n = 0;
        for (int64_t j = 0; j < N; ++j) {
          if (padded && pad[b * N + j]) continue;
          const size_t ox = size_t((b * N + j) * D), oc = size_t((b * K + iv[size_t(b * N + j)]) * D);
          const double phi = dot(xv, ox, cv, oc) / norm(cv, oc);
          s += form == nn::ClusterLossForm::kCosine ? phi / norm(xv, ox) : phi;
          ++n;
        }
        l1 -= s / double(n) / double(B);
      }
      check_close(nn::clustering_loss(x, c_hat, index, padded ? mask : Tensor(), form), {l1}, 1e-12);
    }
    double l2 = 0;  // eq. 11 with the cosine, cyclic term included
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < K; ++i) {
        const size_t oi = size_t((b * K + i) * D), op = size_t((b * K + (i + K - 1) % K) * D);
        l2 -= dot(cv, oi, cv, op) / (norm(cv, oi) * norm(cv, op)) / double(K) / double(B);
      }
    check_close(nn::centroid_sorting_loss(c_hat, form), {l2}, 1e-12);
    // Bounded: scaling the centroids (what descending the inner-product losses
    // does without limit) changes neither loss, and L2 stays in [-1, 1].
    check_close(nn::clustering_loss(x, c_hat * 1000.0, index, mask, form),
                values(nn::clustering_loss(x, c_hat, index, mask, form)), 1e-12);
    check_close(nn::centroid_sorting_loss(c_hat * 1000.0, form), {l2}, 1e-12);
    check_grad("clustering_loss",
               [&](const std::vector<Tensor>& in) {
                 return cat({reshape(nn::clustering_loss(in[0], in[1], index, mask, form), {1}),
                             reshape(nn::centroid_sorting_loss(in[1], form), {1})},
                            0);
               },
               {leaf64({B, N, D}, 83), leaf64({B, K, D}, 84)});
  }
  // The inner product is not bounded: the same scaling scales both losses.
  check_close(nn::centroid_sorting_loss(c_hat * 10.0), values(nn::centroid_sorting_loss(c_hat) * 100.0), 1e-12);
  // A zero centroid gives zero terms, not NaN.
  Tensor zero = Tensor::zeros({1, 2, D}, kFloat64);
  check_close(nn::centroid_sorting_loss(zero, nn::ClusterLossForm::kCosine), {0.0}, 0);
  CHECK(nn::to_string(nn::cluster_loss_form_from_string("sphere", "t")) == "sphere");
  CHECK_THROWS_MSG(nn::cluster_loss_form_from_string("unit", "cf-textcls"), ValueError,
                   "[cf-textcls] loss_form must be \"inner\", \"cosine\" or \"sphere\"", "\"unit\"");
}

TEST_CASE("neural clustering attention equals its dense reference with padding and causal masks, fwd and bwd") {
  const int64_t B = 2, H = 2, N = 11, D = 8, Dh = 4;
  Tensor q = leaf64({B, H, N, Dh}, 11), k = leaf64({B, H, N, Dh}, 12), v = leaf64({B, H, N, Dh}, 13);
  Tensor x = leaf64({B, N, D}, 14), weight = leaf64({B, H, N, Dh}, 15);
  Tensor mask = bools({false, false, false, false, false, false, false, false, false, false, false,  //
                       false, false, false, false, false, false, false, false, true, true, true},
                      {B, N});
  struct Case {
    int64_t k, look_back;
    nn::ClusterTieOrder tie;
  };
  for (Case cs : {Case{3, 1, nn::ClusterTieOrder::kMembership}, Case{4, 1, nn::ClusterTieOrder::kPosition},
                  Case{5, 2, nn::ClusterTieOrder::kMembership}, Case{4, 0, nn::ClusterTieOrder::kMembership},
                  Case{6, 2, nn::ClusterTieOrder::kPosition}})
    for (bool causal : {false, true})
      for (bool padded : {false, true}) {
        INFO("k ", cs.k, " look_back ", cs.look_back, " causal ", causal, " padded ", padded);
        auto att = make_nc64(D, nc_options(cs.k, cs.look_back, cs.tie), 20 + uint64_t(cs.k));
        const Tensor kpm = padded ? mask : Tensor();
        nn::NeuralClusteringResult cl = nn::neural_clustering(x, att->centroids, att->w_c, kpm, cs.tie);
        Tensor blocked = reference_blocked(cl.index, cl.u, cs.k, cs.look_back, kpm, causal, cs.tie);
        // The reference must restrict something, or it proves nothing beyond full attention.
        CHECK(values(sum(cf::to(blocked, kInt64))).front() > double(causal ? B * N * (N - 1) / 2 : 0));
        Run eff = run_qkv(
            [&](const Tensor& qq, const Tensor& kk, const Tensor& vv) {
              return att->forward(args_of(qq, kk, vv, x, kpm, causal));
            },
            q, k, v, weight);
        Run ref = run_qkv(
            [&](const Tensor& qq, const Tensor& kk, const Tensor& vv) {
              return nn::dense_attention(qq, kk, vv, blocked, 1.0 / std::sqrt(double(Dh)));
            },
            q, k, v, weight);
        check_runs_equal(eff, ref, 1e-12);
      }
}

TEST_CASE("a text's neural clustering output does not depend on the padding its batch adds") {
  // Eq. 8's N is the sequence's length: blocks of ceil(8 / 3) = 3 for these 8 tokens alone and
  // padded to 10, 11 or 12 (the padded length's ceil(10 / 3) = 4 changed the blocks, the output by 1.56).
  const int64_t n = 8, D = 8, Dh = 4, H = 2;
  for (bool causal : {false, true})
    for (int64_t N : {11, 10, 12}) {
      INFO("padded to ", N, " causal ", causal);
      auto att = make_nc64(D, nc_options(3, 1, nn::ClusterTieOrder::kMembership), 31);
      Tensor x = leaf64({1, N, D}, 32), q = leaf64({1, H, N, Dh}, 33), k = leaf64({1, H, N, Dh}, 34),
             v = leaf64({1, H, N, Dh}, 35);
      std::vector<bool> m(size_t(N), false);
      for (int64_t j = n; j < N; ++j) m[size_t(j)] = true;
      Tensor padded = att->forward(args_of(q, k, v, x, bools(m, {1, N}), causal));
      Tensor alone = att->forward(args_of(narrow(q, 2, 0, n), narrow(k, 2, 0, n), narrow(v, 2, 0, n),
                                          narrow(x, 1, 0, n), Tensor(), causal));
      check_close(narrow(padded, 2, 0, n), alone, 1e-13);
      check_close(narrow(padded, 2, n, N - n), Tensor::zeros({1, H, N - n, Dh}, kFloat64), 0);  // padded queries
    }
}

TEST_CASE("neural clustering attention where every block sees all keys equals full attention, each key once") {
  // k = 1, or look_back >= k - 1: every block reaches every block (k = 1 reaches
  // itself again through the cyclic look-back, k = 2 with look_back 3 reaches each
  // block twice); each key still counts once, so this is full attention.
  const int64_t B = 2, H = 2, N = 7, D = 6, Dh = 3;
  Tensor q = leaf64({B, H, N, Dh}, 31), k = leaf64({B, H, N, Dh}, 32), v = leaf64({B, H, N, Dh}, 33);
  Tensor x = leaf64({B, N, D}, 34), weight = leaf64({B, H, N, Dh}, 35);
  Tensor mask = bools({false, false, false, false, false, false, false, false, false, false, false, true, true, true},
                      {B, N});
  nn::FullAttention full;
  for (auto kl : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 3}, {2, 1}, {2, 3}, {3, 2}, {3, 5}})
  for (bool causal : {false, true})
    for (const Tensor& kpm : {Tensor(), mask}) {
      INFO("k ", kl.first, " look_back ", kl.second, " causal ", causal, " padded ", kpm.defined());
      auto att = make_nc64(D, nc_options(kl.first, kl.second), 36);
      // Compared on the valid queries: padded ones sit in no block (zeros), full attention gives them a row.
      const Tensor valid = kpm.defined() ? reshape(cf::to(logical_not(kpm), kFloat64), {B, 1, N, 1})
                                         : Tensor::ones({1}, kFloat64);
      Run eff = run_qkv(
          [&](const Tensor& qq, const Tensor& kk, const Tensor& vv) {
            return att->forward(args_of(qq, kk, vv, x, kpm, causal)) * valid;
          },
          q, k, v, weight);
      Run ref = run_qkv(
          [&](const Tensor& qq, const Tensor& kk, const Tensor& vv) {
            return full.forward(args_of(qq, kk, vv, x, kpm, causal)) * valid;
          },
          q, k, v, weight);
      check_runs_equal(eff, ref, 1e-12);
      if (kpm.defined())
        check_close(att->forward(args_of(q, k, v, x, kpm, causal)) * (1.0 - valid), Tensor::zeros({B, H, N, Dh}, kFloat64),
                    0);
    }
}

TEST_CASE("neural clustering layer passes float64 gradcheck with L1 and L2 (C, W^C, projections, input)") {
  const int64_t B = 2, N = 7, D = 4, H = 2;
  // The whole layer as the paper differentiates it (eq. 18): the clustering and
  // L1, L2 depend on the input too. (The default, losses_reach_input = false,
  // treats the input of U and C^ as a constant: see the last part of this case.)
  nn::NeuralClusteringOptions o = nc_options(3);
  o.losses_reach_input = true;
  auto mha = make_mha64(D, H, o, 41);
  auto& att = static_cast<nn::NeuralClusteringAttention&>(mha->attention());
  Tensor mask = bools({false, false, false, false, false, false, false, false, false, false, false, false, true, true},
                      {B, N});
  for (const Tensor& kpm : {Tensor(), mask})
    for (bool causal : {false, true}) {
      INFO("padded ", kpm.defined(), " causal ", causal);
      auto f = [&](const std::vector<Tensor>& xs) {
        nn::AuxLosses aux;
        Tensor out = mha->forward(xs[0], xs[0], xs[0], kpm, causal, &aux);
        REQUIRE(aux.get(nn::kClusteringLossName).size() == 1);
        REQUIRE(aux.get(nn::kCentroidSortingLossName).size() == 1);
        return cat({reshape(out, {-1}), reshape(aux.get(nn::kClusteringLossName)[0], {1}),
                    reshape(aux.get(nn::kCentroidSortingLossName)[0], {1})},
                   0);
      };
      check_module_grad(*mha, f, {leaf64({B, N, D}, 42)});
    }
  // The losses alone reach C, W^C and the input (through U and C^): nonzero gradients.
  Tensor x = leaf64({B, N, D}, 43);
  nn::AuxLosses aux;
  mha->zero_grad();
  mha->forward(x, x, x, mask, false, &aux);
  aux.total({{nn::kClusteringLossName, 1.0}, {nn::kCentroidSortingLossName, 1.0}}).backward();
  for (const Tensor& t : {att.centroids, att.w_c, x}) {
    REQUIRE(t.grad().defined());
    CHECK(values(sum(abs(t.grad()))).front() > 1e-6);
  }
  // The output reaches the projections through the gathered blocks, but not C: the
  // assignment (argmax, sort) has no gradient.
  mha->zero_grad();
  Tensor x2 = leaf64({B, N, D}, 44);
  sum(mha->forward(x2, x2, x2) * leaf64({B, N, D}, 45)).backward();
  CHECK(values(sum(abs(mha->w_v->weight.grad()))).front() > 1e-6);
  CHECK(!att.centroids.grad().defined());

  // The default: L1 and L2 move C and W^C but not the input (x enters the
  // clustering detached); the output alone still passes gradcheck.
  auto mha0 = make_mha64(D, H, nc_options(3), 41);
  auto& att0 = static_cast<nn::NeuralClusteringAttention&>(mha0->attention());
  Tensor x3 = leaf64({B, N, D}, 46);
  nn::AuxLosses aux0;
  mha0->forward(x3, x3, x3, mask, false, &aux0);
  aux0.total({{nn::kClusteringLossName, 1.0}, {nn::kCentroidSortingLossName, 1.0}}).backward();
  CHECK(values(sum(abs(att0.centroids.grad()))).front() > 1e-6);
  CHECK(values(sum(abs(att0.w_c.grad()))).front() > 1e-6);
  CHECK_FALSE(x3.grad().defined());
  check_module_grad(*mha0, [&](const std::vector<Tensor>& xs) { return mha0->forward(xs[0], xs[0], xs[0], mask, true); },
                    {leaf64({B, N, D}, 47)});
}

TEST_CASE("a neural clustering stack hands C^ from layer to layer and passes gradcheck through the chain") {
  models::TransformerConfig c;
  c.vocab_size = 7;
  c.max_len = 16;
  c.n_layers = 3;
  c.layer.d_model = 4;
  c.layer.n_heads = 2;
  c.layer.d_ff = 6;
  c.layer.dropout = 0.0;
  c.layer.attention.type = "neural-clustering";
  c.layer.attention.options = nn::Config(nlohmann::json{{"clusters", 2}, {"losses_reach_input", true}}, "attention");
  Generator g(51);
  models::TransformerEncoder enc(c, c.vocab_size, c.n_layers, g);
  enc.to(kFloat64);
  std::vector<nn::NeuralClusteringAttention*> att;
  for (auto& l : enc.layers) att.push_back(&static_cast<nn::NeuralClusteringAttention&>(l->self_attn->attention()));
  // Only the first layer owns C; the others own W^C.
  auto names = enc.named_parameters();
  std::vector<std::string> keys;
  for (auto& e : names) keys.push_back(e.first);
  auto has = [&](const std::string& n) { return std::find(keys.begin(), keys.end(), n) != keys.end(); };
  CHECK(has("layers.0.self_attn.attention.centroids"));
  CHECK_FALSE(has("layers.1.self_attn.attention.centroids"));
  CHECK_FALSE(has("layers.2.self_attn.attention.centroids"));
  CHECK(has("layers.2.self_attn.attention.w_c"));
  for (int64_t i = 0; i < 3; ++i) CHECK(att[size_t(i)]->chain_index() == i);

  // Layer by layer: layer i clusters with layer i-1's C^ (eq. 3), computed here independently.
  Tensor ids = ti64({1, 2, 3, 4, 5, 6, 2, 3, 4, 5}, {2, 5});
  Tensor h = enc.embed(ids);
  Tensor expect_c = att[0]->centroids;
  for (size_t i = 0; i < 3; ++i) {
    INFO("layer ", i);
    check_close(att[i]->current_centroids(), expect_c, 1e-12);
    Tensor xin = enc.layers[i]->norm1->forward(h);  // pre-LN: attention sees norm1(h)
    expect_c = nn::neural_clustering(xin, att[i]->current_centroids(), att[i]->w_c, Tensor()).c_hat;
    h = enc.layers[i]->forward(h);
  }
  CHECK_FALSE(att[1]->current_centroids().defined());  // the last layer cleared the chain
  // A later layer cannot run without its predecessors in the same pass.
  CHECK_THROWS_MSG(enc.layers[1]->forward(h), ValueError, "[NeuralClusteringAttention] layer 1",
                   "ran before layer 0");

  // Gradients of the last layer's losses reach layer 0's C through the chain.
  enc.zero_grad();
  nn::AuxLosses aux;
  enc.forward(ids, {}, false, &aux);
  REQUIRE(aux.get(nn::kClusteringLossName).size() == 3);
  aux.get(nn::kCentroidSortingLossName)[2].backward();
  REQUIRE(att[0]->centroids.grad().defined());
  CHECK(values(sum(abs(att[0]->centroids.grad()))).front() > 1e-8);

  Tensor mask = bools({false, false, false, false, false, false, false, false, true, true}, {2, 5});
  check_module_grad(enc,
                    [&](const std::vector<Tensor>&) {
                      nn::AuxLosses a;
                      Tensor out = enc.forward(ids, mask, false, &a);
                      return cat({reshape(out, {-1}),
                                  reshape(a.total({{nn::kClusteringLossName, 1.0}, {nn::kCentroidSortingLossName, 1.0}}),
                                          {1})},
                                 0);
                    },
                    {});
}

TEST_CASE("permuting the tokens permutes the neural clustering attention output") {
  const int64_t N = 13, D = 8, H = 2;
  auto mha = make_mha64(D, H, nc_options(4), 61);
  Tensor x = leaf64({1, N, D}, 62);
  std::vector<int64_t> perm = {5, 0, 12, 3, 7, 1, 9, 11, 2, 10, 4, 8, 6};
  Tensor p = ti64(perm, {N});
  nn::AuxLosses a1, a2;
  Tensor y = mha->forward(x, x, x, {}, false, &a1);
  Tensor xp = index_select(x, 1, p);
  Tensor yp = mha->forward(xp, xp, xp, {}, false, &a2);
  check_close(yp, index_select(y, 1, p), 1e-12);
  check_close(a2.get(nn::kClusteringLossName)[0], a1.get(nn::kClusteringLossName)[0], 1e-12);
  // The clusters are not trivial: with k = 4 and look_back 1 some keys are out of reach.
  auto& att = static_cast<nn::NeuralClusteringAttention&>(mha->attention());
  nn::NeuralClusteringResult r = nn::neural_clustering(x, att.centroids, att.w_c, Tensor());
  Tensor blocked = reference_blocked(r.index, r.u, 4, 1, Tensor(), false, nn::ClusterTieOrder::kMembership);
  CHECK(values(sum(cf::to(blocked, kInt64))).front() > 0);
}

TEST_CASE("neural clustering: options and bad input name the problem") {
  nn::AttentionSpec spec;
  spec.type = "neural-clustering";
  spec.d_model = 8;
  spec.n_heads = 2;
  auto build = [&](const nlohmann::json& j) {
    spec.options = nn::Config(j, "attention");
    return nn::make_attention(spec);
  };
  auto a = build({{"clusters", 3}, {"look_back", 2}, {"tie_order", "position"}, {"scale", 0.5}});
  CHECK(a->type() == "neural-clustering");
  auto& nc = static_cast<nn::NeuralClusteringAttention&>(*a);
  CHECK(nc.options().clusters == 3);
  CHECK(nc.options().look_back == 2);
  CHECK(nc.options().tie_order == nn::ClusterTieOrder::kPosition);
  CHECK(nc.centroids.shape() == Shape{3, 8});
  CHECK(nc.w_c.shape() == Shape{8, 8});
  CHECK_THROWS_MSG(build(nlohmann::json::object()), ValueError, "attention.clusters");
  CHECK_THROWS_MSG(build({{"clusters", 0}}), ValueError, "[NeuralClusteringAttention] clusters (k) must be >= 1",
                   "got 0");
  CHECK_THROWS_MSG(build({{"clusters", 2}, {"look_back", -1}}), ValueError, "look_back must be >= 0", "-1");
  CHECK_THROWS_MSG(build({{"clusters", 2}, {"tie_order", "random"}}), ValueError, "attention.tie_order", "random");
  CHECK_THROWS_MSG(build({{"clusters", 2}, {"clustres", 2}}), ValueError, "attention.clustres");
  CHECK(static_cast<nn::NeuralClusteringAttention&>(*build({{"clusters", 2}, {"loss_form", "cosine"}}))
            .options()
            .loss_form == nn::ClusterLossForm::kCosine);
  CHECK_THROWS_MSG(build({{"clusters", 2}, {"loss_form", "l2"}}), ValueError,
                   "[NeuralClusteringAttention] loss_form must be", "\"l2\"");

  // forward: query_input, self-attention only, dtype
  auto att = make_nc64(8, nc_options(2), 71);
  Tensor q = leaf64({1, 2, 5, 4}, 1), x = leaf64({1, 5, 8}, 2);
  CHECK_THROWS_MSG(att->forward(args_of(q, q, q, Tensor(), {}, false)), ShapeError,
                   "[NeuralClusteringAttention] clusters the layer input", "got undefined");
  CHECK_THROWS_MSG(att->forward(args_of(q, q, q, leaf64({1, 5, 6}, 3), {}, false)), ShapeError,
                   "query_input must be (B, N, d_model) = (1, 5, 8)", "(1,5,6)");
  Tensor k3 = leaf64({1, 2, 4, 4}, 4);
  CHECK_THROWS_MSG(att->forward(args_of(q, k3, k3, x, {}, false)), ShapeError, "self-attention only",
                   "Nq (5) != Nk (4)");
  CHECK_THROWS_MSG(att->forward(args_of(q, q, q, cf::to(x, kFloat32), {}, false)), DTypeError,
                   "query_input is float32");
  CHECK_THROWS_MSG(att->forward(args_of(q, q, q, x, bools({true}, {1, 1}), false)), ShapeError,
                   "[NeuralClusteringAttention] key_padding_mask must be (B, N) = (1, 5)");
  // An empty sequence gives an empty output.
  Tensor e = Tensor::zeros({1, 2, 0, 4}, kFloat64);
  CHECK(att->forward(args_of(e, e, e, Tensor::zeros({1, 0, 8}, kFloat64), {}, false)).shape() == Shape{1, 2, 0, 4});

  // the free functions
  Tensor c = leaf64({2, 8}, 5), wc = leaf64({8, 8}, 6);
  CHECK_THROWS_MSG(nn::neural_clustering(leaf64({5, 8}, 7), c, wc, {}), ShapeError,
                   "[neural_clustering] x must be float (B, N, D)", "(5,8)");
  CHECK_THROWS_MSG(nn::neural_clustering(x, leaf64({2, 7}, 8), wc, {}), ShapeError,
                   "[neural_clustering] centroids must be (k, D) or (B, k, D)", "(2,7)");
  CHECK_THROWS_MSG(nn::neural_clustering(x, leaf64({3, 2, 8}, 8), wc, {}), ShapeError, "[neural_clustering] centroids");
  CHECK_THROWS_MSG(nn::neural_clustering(x, c, leaf64({8, 4}, 9), {}), ShapeError,
                   "[neural_clustering] W^C must be (D, D) = (8, 8)", "(8,4)");
  CHECK_THROWS_MSG(nn::neural_clustering(x, cf::to(c, kFloat32), wc, {}), DTypeError,
                   "[neural_clustering] x, centroids and W^C must share one dtype");
  CHECK_THROWS_MSG(nn::neural_clustering(x, c, wc, bools({true, false}, {1, 2})), ShapeError,
                   "[neural_clustering] key_padding_mask must be bool (B, N) = (1, 5)");
  nn::NeuralClusteringResult r = nn::neural_clustering(x, c, wc, {});
  CHECK_THROWS_MSG(nn::clustering_loss(x, r.c_hat, ti64({0, 1}, {1, 2}), {}), ShapeError,
                   "[clustering_loss] expected x (B, N, D), c_hat (B, k, D) and int64 index (B, N)", "(1,2)");
  CHECK_THROWS_MSG(nn::centroid_sorting_loss(c), ShapeError, "[centroid_sorting_loss] c_hat must be float (B, k, D)",
                   "(2,8)");
  // A cluster index beyond the centroids (a bare [take_along_dim] error before); k itself only marks padding.
  CHECK_THROWS_MSG(nn::clustering_loss(x, r.c_hat, ti64({0, 1, 7, 0, 1}, {1, 5}), {}), IndexError,
                   "[clustering_loss] cluster index 7 at flat position 2 is out of range [0, 2) for k = 2 centroids");
  CHECK_THROWS_MSG(nn::clustering_loss(x, r.c_hat, ti64({0, 1, 2, 0, 1}, {1, 5}), {}), IndexError, "index 2");
  CHECK_NOTHROW(nn::clustering_loss(x, r.c_hat, ti64({0, 1, 0, 1, 2}, {1, 5}), bools({false, false, false, false, true}, {1, 5})));
  CHECK_THROWS_MSG(nn::clustering_loss(x, r.c_hat, ti64({0, 1, 2, 1, 2}, {1, 5}), bools({false, false, false, false, true}, {1, 5})),
                   IndexError, "cluster index 2 at flat position 2");  // k at a token that is not padding
  // A module of another dtype than its input: a dtype error (it was a ShapeError about the batch)
  auto f32 = make_nc64(8, nc_options(2), 75);
  f32->to(kFloat32);
  CHECK_THROWS_MSG(f32->forward(args_of(q, q, q, x, {}, false)), DTypeError,
                   "[NeuralClusteringAttention] q is float64 but the centroids are float32");

  // chains: mismatched k, or a later layer reused as a first one
  auto l0 = make_nc64(8, nc_options(2), 72), l1 = make_nc64(8, nc_options(3), 73), l2 = make_nc64(8, nc_options(2), 74);
  CHECK_THROWS_MSG(nn::link_centroid_chain({l0.get(), l1.get()}), ValueError, "[link_centroid_chain] layer 1 has k = 3",
                   "layer 0 has k = 2");
  CHECK(l1->centroids.defined());  // a failed link changes nothing
  nn::link_centroid_chain({l0.get(), l2.get()});
  CHECK_FALSE(l2->centroids.defined());
  CHECK_THROWS_MSG(nn::link_centroid_chain({l2.get(), l0.get()}), ValueError,
                   "[link_centroid_chain] the first layer of the stack has no centroids");
}
