// Centroid attention (Centroid Transformers, section 2.2, eqs. 3-4, KNN approximation).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <set>

#include "cf.h"
#include "nn/attention/centroid.h"
#include "nn/cost.h"
#include "nn_test_util.h"
#include "test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

nn::CentroidAttentionOptions opts(int64_t d, int64_t h, const std::string& init = "mean") {
  nn::CentroidAttentionOptions o;
  o.d_model = d;
  o.n_heads = h;
  o.init = init;
  return o;
}

// Row-major element access of a contiguous float64 tensor.
std::vector<double> vals(const Tensor& t) { return contiguous(t).to_vector<double>(); }

// A (B, H, M, N) bool mask, true where input i is NOT among centroid j's neighbours.
Tensor knn_block_mask(const Tensor& nbr, int64_t h, int64_t n) {
  const int64_t b = nbr.shape()[0], m = nbr.shape()[1], k = nbr.shape()[2];
  std::vector<int64_t> nb = contiguous(nbr).to_vector<int64_t>();
  std::vector<bool> blocked(size_t(b * h * m * n), true);
  for (int64_t bb = 0; bb < b; ++bb)
    for (int64_t hh = 0; hh < h; ++hh)
      for (int64_t j = 0; j < m; ++j)
        for (int64_t e = 0; e < k; ++e) blocked[size_t(((bb * h + hh) * m + j) * n + nb[size_t((bb * m + j) * k + e)])] = false;
  return Tensor::from_vector(blocked, {b, h, m, n});
}

// Dense reference of the KNN layer: the full (B, H, M, N) score matrix with the
// non-neighbours masked, normalised over centroids (eq. 4) or inputs.
Tensor knn_dense_reference(const Tensor& q, const Tensor& kx, const Tensor& vx, const Tensor& nbr, double scale,
                           const std::string& normalize) {
  const int64_t b = q.shape()[0], h = q.shape()[1], dh = q.shape()[3], n = kx.shape()[1];
  auto heads = [&](const Tensor& t) { return transpose(reshape(t, {b, n, h, dh}), 1, 2); };
  Tensor s = matmul(q * scale, transpose(heads(kx), -2, -1));
  s = masked_fill(s, knn_block_mask(nbr, h, n), -INFINITY);
  return matmul(softmax(s, normalize == "centroids" ? -2 : -1), heads(vx));
}

}  // namespace

TEST_CASE("CentroidAttention: M = N, centroids = inputs, T = 1 is the paper's self-attention-like update") {
  const int64_t B = 2, N = 5, D = 8, H = 2, dh = D / H;
  for (const std::string norm : {"centroids", "inputs"}) {
    CAPTURE(norm);
    nn::CentroidAttentionOptions o = opts(D, H, "mean");
    o.norm = false;
    o.normalize = norm;
    o.downsample = 1;  // M = N: mean pooling over windows of one input is the identity
    Generator gen(3);
    nn::CentroidInit init(o, gen);
    nn::CentroidAttention att(o, gen);
    att.to(kFloat64);
    Tensor x = leaf64({B, N, D}, 11);
    nn::CentroidInitResult r = init.forward(x);
    check_close(r.u, x, 0);
    Tensor u = att.forward(x, r.u);
    // Direct formula: u_j = x_j + sum_l W_o^l sum_i sim_l(x_i, x_j) v_l(x_i) + b_o with
    // phi_l(x_i, x_j) = Q_l(x_j).K_l(x_i) / sqrt(dh), sim normalised over j (eq. 4) or i.
    NoGradGuard ng;
    std::vector<double> q = vals(att.w_q->forward(x)), k = vals(att.w_k->forward(x)), v = vals(att.w_v->forward(x));
    std::vector<double> wo = vals(att.w_o->weight), bo = vals(att.w_o->bias), xs = vals(x);
    std::vector<double> expect(xs);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t l = 0; l < H; ++l) {
        std::vector<double> phi(size_t(N * N));  // phi[i][j]
        for (int64_t i = 0; i < N; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double s = 0;
            for (int64_t a = 0; a < dh; ++a) s += q[size_t((b * N + j) * D + l * dh + a)] * k[size_t((b * N + i) * D + l * dh + a)];
            phi[size_t(i * N + j)] = s / std::sqrt(double(dh));
          }
        for (int64_t j = 0; j < N; ++j) {
          std::vector<double> agg(size_t(dh), 0.0);
          for (int64_t i = 0; i < N; ++i) {
            double den = 0;
            for (int64_t t = 0; t < N; ++t) den += std::exp(norm == "centroids" ? phi[size_t(i * N + t)] : phi[size_t(t * N + j)]);
            double sim = std::exp(phi[size_t(i * N + j)]) / den;
            for (int64_t a = 0; a < dh; ++a) agg[size_t(a)] += sim * v[size_t((b * N + i) * D + l * dh + a)];
          }
          for (int64_t r0 = 0; r0 < D; ++r0)
            for (int64_t a = 0; a < dh; ++a) expect[size_t((b * N + j) * D + r0)] += wo[size_t(r0 * D + l * dh + a)] * agg[size_t(a)];
        }
      }
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < N; ++j)
        for (int64_t r0 = 0; r0 < D; ++r0) expect[size_t((b * N + j) * D + r0)] += bo[size_t(r0)];
    check_close(u, expect, 1e-12);
    if (norm == "inputs") {
      // Normalised over the inputs it is exactly self-attention plus the skip link
      // ("our new module reduces to standard self-attention (except an extra skip connection)").
      nn::MultiHeadAttention mha(D, H, std::make_shared<nn::FullAttention>());
      mha.to(kFloat64);
      mha.load_state_dict(att.state_dict(), false);
      check_close(u, x + mha(x), 1e-12);
    }
  }
}

TEST_CASE("knn_indices over many query chunks equals it over few (the 64 MiB blocks are stitched in order)") {
  // N = 32768 inputs: a (1, rows, N) float32 block of 64 MiB holds 512 queries, so 1500 queries take 3
  // chunks; the same queries 100 at a time take one chunk each.
  Generator g(9);
  const Tensor x = randn({1, 32768, 3}, kFloat32, g), u = randn({1, 1500, 3}, kFloat32, g);
  std::vector<bool> pad(32768, false);
  for (size_t i = 0; i < pad.size(); i += 7) pad[i] = true;
  const Tensor mask = Tensor::from_vector(pad, {1, 32768});
  const Tensor all = nn::knn_indices(u, x, 5, mask);
  std::vector<Tensor> parts;
  for (int64_t r0 = 0; r0 < 1500; r0 += 100) parts.push_back(nn::knn_indices(narrow(u, 1, r0, 100), x, 5, mask));
  CHECK(all.shape() == Shape({1, 1500, 5}));
  CHECK(all.to_vector<int64_t>() == cat(parts, 1).to_vector<int64_t>());
  for (int64_t i : all.to_vector<int64_t>()) CHECK_FALSE(pad[size_t(i)]);
  // no queries: no indices (B, 0, k), not an error of the chunks' concatenation
  CHECK(nn::knn_indices(Tensor::zeros({2, 0, 3}), randn({2, 10, 3}, kFloat32, g), 4).shape() == Shape({2, 0, 4}));
}

TEST_CASE("knn_indices selects in float32 under 16-bit autocast and for 16-bit points") {
  // 512 points on a sphere and 128 of them as queries: bfloat16 distances (8 bits) reorder neighbours
  // that float32 tells apart; the selection must not depend on the training's precision.
  Generator g(3);
  Tensor x = randn({1, 512, 3}, kFloat32, g);
  x = x / sqrt(sum(square(x), {2}, true));
  const Tensor u = narrow(x, 1, 0, 128);
  const std::vector<int64_t> want = nn::knn_indices(u, x, 8).to_vector<int64_t>();
  for (DType dt : {kBFloat16, kFloat16}) {
    INFO(dtype_name(dt));
    {
      AutocastGuard guard(dt);
      CHECK(nn::knn_indices(u, x, 8).to_vector<int64_t>() == want);
    }
    // 16-bit points themselves: distances of their (exact) float32 values
    const Tensor u16 = to(u, dt), x16 = to(x, dt);
    CHECK(nn::knn_indices(u16, x16, 8).to_vector<int64_t>() ==
          nn::knn_indices(to(u16, kFloat32), to(x16, kFloat32), 8).to_vector<int64_t>());
  }
}

TEST_CASE("CentroidAttention: KNN layer equals its dense masked reference, and the dense layer at K = N") {
  const int64_t B = 2, N = 7, M = 3, D = 8, H = 2;
  for (const std::string norm : {"centroids", "inputs"}) {
    CAPTURE(norm);
    // Kernel level: centroid_attention_knn vs the explicit (B, H, M, N) masked reference, forward and backward.
    Tensor q = leaf64({B, H, M, D / H}, 1), kx = leaf64({B, N, D}, 2), vx = leaf64({B, N, D}, 3);
    Tensor nbr = nn::knn_indices(leaf64({B, M, 3}, 4), leaf64({B, N, 3}, 5), 4);
    Tensor a = nn::centroid_attention_knn(q, kx, vx, nbr, 0.7, norm);
    Tensor r = knn_dense_reference(q, kx, vx, nbr, 0.7, norm);
    check_close(a, r, 1e-12);
    Tensor w = leaf64(a.shape(), 9);
    sum(a * w).backward();
    std::vector<Tensor> ga = {q.grad(), kx.grad(), vx.grad()};
    q.zero_grad();
    kx.zero_grad();
    vx.zero_grad();
    sum(r * w).backward();
    check_close(ga[0], q.grad(), 1e-12);
    check_close(ga[1], kx.grad(), 1e-12);
    check_close(ga[2], vx.grad(), 1e-12);

    // Layer level: K = N gives the dense layer, forward and every gradient, with padding.
    nn::CentroidAttentionOptions o = opts(D, H, "fps");
    o.normalize = norm;
    o.num_centroids = M;
    o.iterations = 2;
    Generator g1(7), g2(7);
    nn::CentroidAttentionBlock dense(o, 16, "relu", 0.0, g1);
    o.knn = N;
    nn::CentroidAttentionBlock knn(o, 16, "relu", 0.0, g2);
    dense.to(kFloat64);
    knn.to(kFloat64);
    Tensor x1 = leaf64({B, N, D}, 6), x2 = x1.detach().set_requires_grad(true);
    Tensor mask = Tensor::from_vector(std::vector<bool>{false, false, false, false, false, false, false, false, false,
                                                        false, false, false, true, true},
                                      {B, N});
    Tensor y1 = dense.forward(x1, mask).u, y2 = knn.forward(x2, mask).u;
    check_close(y2, y1, 1e-12);
    Tensor wy = leaf64(y1.shape(), 8);
    sum(y1 * wy).backward();
    sum(y2 * wy).backward();
    check_close(x2.grad(), x1.grad(), 1e-12);
    std::vector<Tensor> p1 = dense.parameters(), p2 = knn.parameters();
    REQUIRE(p1.size() == p2.size());
    for (size_t i = 0; i < p1.size(); ++i) check_close(p2[i].grad(), p1[i].grad(), 1e-12);
  }
}

TEST_CASE("CentroidAttention: KNN with K < N sums each centroid over its K nearest inputs only") {
  // Moving an input that is no centroid's neighbour leaves the output unchanged.
  const int64_t N = 9, D = 4;
  nn::CentroidAttentionOptions o = opts(D, 1, "fps");
  o.num_centroids = 2;
  o.knn = 2;
  o.norm = false;
  Generator gen(5);
  nn::CentroidAttention att(o, gen);
  att.to(kFloat64);
  Tensor x = leaf64({1, N, D}, 3);
  Tensor u0 = nn::gather_rows(x, farthest_point_sampling(x, 2)).detach();
  Tensor nbr = nn::knn_indices(u0, x, 2);
  std::set<int64_t> used;
  for (int64_t i : nbr.to_vector<int64_t>()) used.insert(i);
  int64_t outside = -1;
  for (int64_t i = 0; i < N && outside < 0; ++i)
    if (!used.count(i)) outside = i;
  REQUIRE(outside >= 0);
  Tensor y = att.forward(x, u0);
  std::vector<double> xv = vals(x);
  for (int64_t a = 0; a < D; ++a) xv[size_t(outside * D + a)] += 1e-3 * double(a + 1);  // still not a neighbour
  Tensor x2 = Tensor::from_vector(xv, {1, N, D});
  REQUIRE(nn::knn_indices(u0, x2, 2).to_vector<int64_t>() == nbr.to_vector<int64_t>());
  check_close(att.forward(x2, u0), y, 1e-14);
}

TEST_CASE("knn_indices matches brute force, nearest first") {
  // knn_indices: nearest first, against sorted brute-force distances.
  Tensor qs = leaf64({2, 4, 3}, 5).detach(), xs = leaf64({2, 11, 3}, 6).detach();
  std::vector<int64_t> nb = nn::knn_indices(qs, xs, 5).to_vector<int64_t>();
  std::vector<double> qv = vals(qs), xv = vals(xs);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < 4; ++j) {
      std::vector<std::pair<double, int64_t>> d;
      for (int64_t i = 0; i < 11; ++i) {
        double s = 0;
        for (int64_t a = 0; a < 3; ++a) s += std::pow(qv[size_t((b * 4 + j) * 3 + a)] - xv[size_t((b * 11 + i) * 3 + a)], 2);
        d.push_back({s, i});
      }
      std::sort(d.begin(), d.end());
      for (int64_t e = 0; e < 5; ++e) CHECK(nb[size_t((b * 4 + j) * 5 + e)] == d[size_t(e)].second);
    }
}

TEST_CASE("CentroidInit: mean windows, random sampling order and padding, K-Means means") {
  // Mean pooling with N not a multiple of M: windows [floor(jN/M), floor((j+1)N/M)).
  nn::CentroidAttentionOptions o = opts(2, 1, "mean");
  o.num_centroids = 3;
  nn::CentroidInit mean_init(o);
  Tensor x = Tensor::from_vector(std::vector<double>{0, 0, 1, 10, 2, 20, 3, 30, 4, 40, 5, 50, 6, 60, 7, 70}, {1, 8, 2});
  check_close(mean_init.forward(x).u, {0.5, 5, 3, 30, 6, 60}, 1e-12);
  // A window of padding only is a padded centroid; padding is left out of the means.
  Tensor mask = Tensor::from_vector(std::vector<bool>{false, true, false, false, false, true, true, true}, {1, 8});
  nn::CentroidInitResult r = mean_init.forward(x, mask);
  check_close(r.u, {0, 0, 3, 30, 0, 0}, 1e-12);
  CHECK(r.mask.to_vector<bool>() == std::vector<bool>{false, false, true});
  // Random sampling: M distinct inputs in sequence order, real inputs before padding.
  o.init = "random";
  o.num_centroids = 4;
  nn::CentroidInit rnd(o);
  Generator g(9);
  nn::CentroidInitResult rr = rnd.forward(x, mask, Tensor(), &g);
  std::vector<int64_t> idx = rr.indices.to_vector<int64_t>();
  CHECK(std::is_sorted(idx.begin(), idx.end()));
  CHECK(std::set<int64_t>(idx.begin(), idx.end()) == std::set<int64_t>{0, 2, 3, 4});
  CHECK(rr.mask.to_vector<bool>() == std::vector<bool>(4, false));  // every sampled input is real
  o.num_centroids = 5;  // one more than the real inputs: a padded centroid
  nn::CentroidInit rnd5(o);
  Generator g5(9);
  std::vector<bool> m5 = rnd5.forward(x, mask, Tensor(), &g5).mask.to_vector<bool>();
  CHECK(std::count(m5.begin(), m5.end(), true) == 1);
  // K-Means: every centroid is the mean of the inputs nearest to it (a fixed point
  // after enough Lloyd steps on two well separated blobs).
  o.init = "kmeans";
  o.num_centroids = 2;
  o.kmeans_iters = 4;
  nn::CentroidInit km(o);
  Tensor blobs = Tensor::from_vector(std::vector<double>{0, 0, 0.2, 0, 0, 0.2, 5, 5, 5.2, 5, 5, 5.4}, {1, 6, 2});
  std::vector<double> c = vals(km.forward(blobs).u);
  std::multiset<double> got{c[0], c[2]};
  CHECK(std::abs(*got.begin() - 0.2 / 3) < 1e-12);
  CHECK(std::abs(*got.rbegin() - 15.2 / 3) < 1e-12);
  CHECK_FALSE(km.forward(blobs).positions.defined());  // no sample space given
  // Clustering in a sample space (the blobs) while averaging other features: u is
  // the mean of the features, positions the cluster means in the sample space.
  Tensor feats = Tensor::from_vector(std::vector<double>{1, 0, 2, 0, 3, 0, 10, 1, 20, 1, 30, 4}, {1, 6, 2});
  nn::CentroidInitResult kr = km.forward(feats, Tensor(), blobs);
  std::vector<double> u = vals(kr.u), pos = vals(kr.positions);
  CHECK(kr.positions.shape() == Shape({1, 2, 2}));
  const size_t near = pos[0] < 1 ? 0 : 1, far = 1 - near;  // FPS picks the seeds' order
  check_close(Tensor::from_vector(std::vector<double>{pos[2 * near], pos[2 * near + 1], pos[2 * far], pos[2 * far + 1]}, {4}),
              {0.2 / 3, 0.2 / 3, 15.2 / 3, 15.4 / 3}, 1e-12);
  check_close(Tensor::from_vector(std::vector<double>{u[2 * near], u[2 * near + 1], u[2 * far], u[2 * far + 1]}, {4}),
              {2, 0, 20, 2}, 1e-12);
  // FPS: each centroid sits at its seed point.
  o.init = "fps";
  nn::CentroidInit fps(o);
  nn::CentroidInitResult fr = fps.forward(feats, Tensor(), blobs);
  check_close(fr.positions, vals(nn::gather_rows(blobs, fr.indices)), 0.0);
  check_close(fr.u, vals(nn::gather_rows(feats, fr.indices)), 0.0);
}

TEST_CASE("CentroidAttentionBlock: float64 gradcheck under every differentiable initialisation") {
  const int64_t B = 2, N = 9, D = 4, H = 2;
  struct Case {
    std::string init;
    int64_t knn, iterations;
    std::string normalize;
  };
  for (const Case& c : {Case{"mean", 0, 1, "centroids"}, Case{"mean", 0, 2, "inputs"}, Case{"random", 0, 1, "centroids"},
                        Case{"fps", 0, 1, "centroids"}, Case{"fps", 4, 2, "centroids"}, Case{"fps", 4, 1, "inputs"},
                        Case{"kmeans", 0, 1, "centroids"}, Case{"linear", 0, 1, "centroids"},
                        Case{"conv", 0, 1, "centroids"}, Case{"conv2d", 0, 1, "centroids"}}) {
    CAPTURE(c.init);
    CAPTURE(c.knn);
    nn::CentroidAttentionOptions o = opts(D, H, c.init);
    o.knn = c.knn;
    o.iterations = c.iterations;
    o.normalize = c.normalize;
    o.num_centroids = c.init == "conv" || c.init == "conv2d" ? 0 : 4;
    o.seq_len = N;
    Generator gen(17);
    nn::CentroidAttentionBlock blk(o, 8, "gelu", 0.0, gen);
    blk.to(kFloat64);
    // Random sampling draws from a generator restarted at each evaluation: the same
    // centroids every time (selection held fixed, as for every clustering).
    check_module_grad(
        blk,
        [&](const std::vector<Tensor>& xs) {
          Generator sampler(4);
          return blk.forward(xs[0], Tensor(), Tensor(), &sampler).u;
        },
        {leaf64({B, N, D}, 31)});
  }
}

TEST_CASE("CentroidAttentionBlock with key padding: float64 gradcheck, and padded tokens get no gradient") {
  const int64_t B = 2, N = 9, D = 4, H = 2;
  std::vector<bool> pad(size_t(B * N), false);
  pad[size_t(N + 7)] = pad[size_t(N + 8)] = true;  // the last 2 tokens of batch 1
  const Tensor mask = Tensor::from_vector(pad, {B, N});
  struct Case {
    std::string init;
    int64_t knn;
    std::string normalize;
  };
  for (const Case& c : {Case{"mean", 0, "centroids"}, Case{"mean", 0, "inputs"}, Case{"fps", 0, "centroids"},
                        Case{"fps", 4, "inputs"}, Case{"random", 0, "centroids"}}) {  // (the inits that take padding)
    CAPTURE(c.init);
    CAPTURE(c.knn);
    CAPTURE(c.normalize);
    nn::CentroidAttentionOptions o = opts(D, H, c.init);
    o.knn = c.knn;
    o.normalize = c.normalize;
    o.num_centroids = 4;
    o.seq_len = N;
    Generator gen(23);
    nn::CentroidAttentionBlock blk(o, 8, "gelu", 0.0, gen);
    blk.to(kFloat64);
    // Only the centroids that are not padding are read (a padded centroid's row is a placeholder).
    auto real_rows = [&](const nn::CentroidBlockOutput& out) {
      return out.mask.defined() ? masked_fill(out.u, unsqueeze(out.mask, -1), 0.0) : out.u;
    };
    // ("random" draws from a generator restarted at each evaluation: the same centroids every time)
    auto run = [&](const Tensor& x) {
      Generator sampler(4);
      return real_rows(blk.forward(x, mask, Tensor(), &sampler));
    };
    check_module_grad(blk, [&](const std::vector<Tensor>& xs) { return run(xs[0]); }, {leaf64({B, N, D}, 37)});
    Tensor x = leaf64({B, N, D}, 37);
    sum(mul(run(x), leaf64({B, blk.init->num_centroids(N), D}, 5).detach())).backward();
    const std::vector<double> gx = x.grad().to_vector<double>();
    for (int64_t t : {N + 7, N + 8})
      for (int64_t d = 0; d < D; ++d) CHECK(gx[size_t(t * D + d)] == 0.0);
    double real = 0;
    for (int64_t d = 0; d < D; ++d) real += std::abs(gx[size_t((N + 6) * D + d)]);
    CHECK(real > 0);
  }
}

TEST_CASE("measure_cost: MACs of a centroid attention block match a hand count") {
  const int64_t B = 2, N = 12, M = 4, D = 8, H = 2, F = 16, T = 2, K = 5;
  for (int64_t knn : {int64_t(0), K}) {
    CAPTURE(knn);
    nn::CentroidAttentionOptions o = opts(D, H, "fps");
    o.num_centroids = M;
    o.iterations = T;
    o.knn = knn;
    nn::CentroidAttentionBlock blk(o, F);
    Tensor x = randn({B, N, D});
    nn::Cost c = nn::measure_cost(blk, [&] { return std::vector<Tensor>{blk.forward(x).u}; });
    const int64_t dh = D / H, keys = knn ? K : N;
    const int64_t kv = 2 * N * D * D;                                         // K and V projections, once
    const int64_t step = M * D * D + 2 * H * M * keys * dh + M * D * D;       // Q, scores, weighted sum, W_o
    const int64_t mlp = M * D * F + M * F * D;                                // FF on the centroids
    // Selection outside the graph: FPS (M steps over N points of width D) and, with
    // KNN, one (M x D) @ (D x N) distance GEMM per step.
    const int64_t selection = M * N * D + (knn ? T * M * N * D : 0);
    CHECK(c.selection_macs == B * selection);
    CHECK(c.macs == B * (kv + T * step + mlp + selection));
    // 4 projections (D*D + D) + 2 LayerNorms in the attention and 1 before the MLP (2D each) + MLP.
    CHECK(c.params == 4 * (D * D + D) + 3 * 2 * D + (D * F + F) + (F * D + D));
  }
  // Frozen parameters are still counted, and the flags come back unchanged.
  nn::Linear lin(3, 5);
  lin.weight.set_requires_grad(false);
  nn::Cost c = nn::measure_cost(lin, [&] { return std::vector<Tensor>{lin.forward(randn({7, 3}))}; });
  CHECK(c.macs == 7 * 3 * 5);
  CHECK_FALSE(lin.weight.requires_grad());
  CHECK(nn::graph_macs({randn({2, 2})}) == 0);
  nn::report_macs(5);  // outside measure_cost: ignored
  CHECK(nn::measure_cost(lin, [&] { return std::vector<Tensor>{lin.forward(randn({1, 3}))}; }).selection_macs == 0);
}

TEST_CASE("centroid attention with T = 0: the sampled centroids pass through, only the MLP acts") {
  const int64_t B = 2, N = 12, M = 4, D = 8, H = 2, F = 16;
  for (int64_t knn : {int64_t(0), int64_t(5)}) {
    CAPTURE(knn);
    nn::CentroidAttentionOptions o = opts(D, H, "fps");
    o.num_centroids = M;
    o.iterations = 0;
    o.knn = knn;
    nn::CentroidAttentionBlock blk(o, F);
    Tensor x = randn({B, N, D});
    nn::CentroidBlockOutput out = blk.forward(x);
    // u = I(x) (FPS picks the same points again), then u + FF(LN(u)).
    Tensor u0 = blk.init->forward(x).u;
    cf::test::check_close(blk.attn->forward(x, u0), u0, 0);
    cf::test::check_close(out.u, u0 + blk.ff->forward(blk.norm_ff->forward(u0)), 1e-6);
    nn::Cost c = nn::measure_cost(blk, [&] { return std::vector<Tensor>{blk.forward(x).u}; });
    CHECK(c.macs == B * (M * D * F + M * F * D + M * N * D));  // the MLP and FPS: no projection, no KNN
  }
}

TEST_CASE("CentroidAttention: bad inputs") {
  nn::CentroidAttentionOptions o = opts(8, 3);
  CHECK_THROWS_MSG(nn::CentroidAttention{o}, ValueError, "[CentroidAttention] d_model (8) must be a positive multiple of n_heads (3)");
  o = opts(8, 2);
  o.normalize = "keys";
  CHECK_THROWS_MSG(nn::CentroidAttention{o}, ValueError, "[CentroidAttention] normalize must be \"centroids\" (eq. 4) or \"inputs\", got \"keys\"");
  o = opts(8, 2, "median");
  CHECK_THROWS_MSG(nn::CentroidInit{o}, ValueError, "[CentroidInit] unknown init \"median\"");
  o = opts(8, 2);
  o.iterations = -1;
  CHECK_THROWS_MSG(nn::CentroidAttentionBlock(o, 16), ValueError, "[CentroidAttentionBlock] iterations (T) must be >= 0 (0: the initial centroids pass through unchanged), got -1");
  o = opts(8, 2, "linear");
  CHECK_THROWS_MSG(nn::CentroidInit{o}, ValueError, "init \"linear\" needs seq_len > 0 and 0 < num_centroids <= seq_len");
  o.seq_len = 6;
  o.num_centroids = 2;
  nn::CentroidInit lin(o);
  CHECK_THROWS_MSG(lin.forward(randn({1, 5, 8})), ShapeError, "seq_len = 6, got N = 5");
  // A mask with nothing padded (what text models pass for unpadded ids) is no mask; one that pads is refused.
  Tensor x6 = randn({1, 6, 8});
  check_close(lin.forward(x6, Tensor::zeros({1, 6}, kBool)).u, lin.forward(x6).u, 0.0);
  nn::CentroidInit km(opts(8, 2, "kmeans"));
  Tensor x5 = randn({2, 5, 8});
  check_close(km.forward(x5, Tensor::zeros({2, 5}, kBool)).u, km.forward(x5).u, 0.0);
  CHECK_THROWS_MSG(lin.forward(x6, pad_mask(1, 6, {{0, 5}})), ValueError,
                   "[CentroidInit] init \"linear\" does not support padded inputs (use random, mean or fps");
  nn::CentroidAttentionBlock blk(opts(8, 2, "mean"), 16);
  CHECK_THROWS_MSG(blk.forward(randn({2, 5, 6})), ShapeError, "[CentroidInit] expected float input (B, N, 8), got float32 (2,5,6)");
  CHECK_THROWS_MSG(blk.forward(randn({2, 5, 8}), Tensor::zeros({2, 4}, kBool)), ShapeError,
                   "[CentroidInit] key_padding_mask must be (B, N) = (2, 5), got (2,4)");
  CHECK_THROWS_MSG(blk.forward(randn({2, 5, 8}), Tensor::zeros({2, 5})), DTypeError,
                   "[CentroidInit] key_padding_mask must be bool");
  nn::CentroidAttentionOptions big = opts(8, 2, "mean");
  big.num_centroids = 9;
  nn::CentroidInit too_many(big);
  CHECK_THROWS_MSG(too_many.forward(randn({1, 5, 8})), ShapeError, "[CentroidInit] M = 9 centroids for N = 5 inputs");
  nn::CentroidAttention att(opts(8, 2));
  CHECK_THROWS_MSG(att.forward(randn({2, 5, 8}), randn({3, 2, 8})), ShapeError,
                   "[CentroidAttention] expected x (B, N, 8) and u0 (B, M, 8)", "u0 float32 (3,2,8)");
  CHECK_THROWS_MSG(att.forward(randn({2, 5, 8}), randn({2, 2, 8}, kFloat64)), DTypeError,
                   "[CentroidAttention] x and u0 must share one float dtype");
  // The centroids' mask is named by its own axis (it said (B, N) and printed M).
  CHECK_THROWS_MSG(att.forward(randn({2, 5, 8}), randn({2, 3, 8}), Tensor(), Tensor::zeros({2, 5}, kBool)), ShapeError,
                   "[CentroidAttention] centroid_mask must be (B, M) = (2, 3), got (2,5)");
  // No input: refused by the layer on both paths (dense added the output bias alone, KNN failed in knn_indices).
  nn::CentroidAttentionOptions with_knn = opts(8, 2);
  with_knn.knn = 3;
  nn::CentroidAttention knn_att(with_knn);
  for (nn::CentroidAttention* a : {&att, &knn_att})
    CHECK_THROWS_MSG(a->forward(randn({2, 0, 8}), randn({2, 2, 8})), ShapeError,
                     "[CentroidAttention] needs at least one input (N >= 1), got x float32 (2,0,8)");
  // The convolution inits set M themselves: a num_centroids or downsample beside them is refused.
  for (const char* init : {"conv", "conv2d"}) {
    nn::CentroidAttentionOptions c = opts(8, 2, init);
    c.conv_kernel = 3;
    c.conv_stride = 2;
    c.conv_padding = 1;
    c.num_centroids = 2;
    CHECK_THROWS_MSG(nn::CentroidInit{c}, ValueError, "takes M from conv_kernel, conv_stride and conv_padding",
                     "num_centroids (2)");
    c.num_centroids = 0;
    c.downsample = 8;
    CHECK_THROWS_MSG(nn::CentroidInit{c}, ValueError, "downsample (8) must stay at their defaults");
  }
  CHECK_THROWS_MSG(nn::knn_indices(randn({1, 2, 3}), randn({1, 4, 2}), 2), ShapeError, "[knn_indices] queries");
  CHECK_THROWS_MSG(nn::knn_indices(randn({1, 2, 3}), randn({1, 4, 3}), 0), ValueError,
                   "[knn_indices] k must be in [1, N] = [1, 4], got 0");
  CHECK_THROWS_MSG(nn::gather_rows(randn({1, 4, 3}), Tensor::from_vector(std::vector<int64_t>{4}, {1, 1})), IndexError,
                   "[gather_rows] index 4 out of range for 4 rows");
  nn::DepthwiseConv2d conv(8, 3, 2, 1);
  CHECK_THROWS_MSG(conv.forward(randn({1, 10, 8})), ShapeError, "[DepthwiseConv2d] N = 10 tokens is not a square grid");
  CHECK_THROWS_MSG(nn::centroid_attention_dense(randn({1, 1, 2, 4}), randn({1, 1, 3, 4}), randn({1, 1, 3, 4}), 1.0, "rows"),
                   ValueError, "[centroid_attention_dense] normalize must be");
  CHECK_THROWS_MSG(nn::centroid_attention_knn(randn({1, 1, 2, 4}), randn({1, 3, 4}), randn({1, 3, 4}),
                                              Tensor::zeros({1, 3, 2}, kInt64), 1.0, "centroids"),
                   ShapeError, "[centroid_attention_knn] nbr must be int64 (B, M, K) = (1, 2, K), got int64 (1,3,2)");
  CHECK_THROWS_MSG(nn::centroid_attention_knn(randn({1, 1, 2, 4}), randn({1, 3, 4}), randn({1, 3, 4}),
                                              Tensor::full({1, 2, 2}, 3, kInt64), 1.0, "centroids"),
                   IndexError, "[centroid_attention_knn] index 3 out of range for 3 rows");
  CHECK_THROWS_MSG(nn::measure_cost(blk, nullptr), ValueError, "[measure_cost] forward is empty");
}

TEST_CASE("DepthwiseConv2d: a 3x3 stride-2 depthwise convolution on the token grid") {
  // Against a direct loop over the padded grid.
  const int64_t B = 1, S = 5, C = 2;
  Generator gen(2);
  nn::DepthwiseConv2d conv(C, 3, 2, 1, true, gen);
  conv.to(kFloat64);
  Tensor x = leaf64({B, S * S, C}, 4);
  Tensor y = conv.forward(x);
  REQUIRE(y.shape() == Shape({B, 9, C}));
  std::vector<double> xv = vals(x), w = vals(conv.weight), bv = vals(conv.bias), expect;
  for (int64_t oy = 0; oy < 3; ++oy)
    for (int64_t ox = 0; ox < 3; ++ox)
      for (int64_t c = 0; c < C; ++c) {
        double s = bv[size_t(c)];
        for (int64_t a = 0; a < 3; ++a)
          for (int64_t bb = 0; bb < 3; ++bb) {
            int64_t iy = oy * 2 + a - 1, ix = ox * 2 + bb - 1;
            if (iy < 0 || ix < 0 || iy >= S || ix >= S) continue;
            s += w[size_t(c * 9 + a * 3 + bb)] * xv[size_t((iy * S + ix) * C + c)];
          }
        expect.push_back(s);
      }
  check_close(y, expect, 1e-12);
  // gradients of x, weight and bias, the padded border included (S = 5: the last window reads row 5)
  check_module_grad(conv, [&](const std::vector<Tensor>& xs) { return conv.forward(xs[0]); }, {leaf64({2, S * S, C}, 6)});
  nn::DepthwiseConv2d wide(C, 2, 1, 0, false, gen);  // kernel 2, stride 1, no padding, no bias: S' = 4
  wide.to(kFloat64);
  check_module_grad(wide, [&](const std::vector<Tensor>& xs) { return wide.forward(xs[0]); }, {leaf64({1, S * S, C}, 7)});
}
