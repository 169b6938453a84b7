// Cluster-Former layers (Wang et al. 2021): the memory bank (Algorithm 1), the
// Sliding-Window layer (section 3.1, eqs. 1-3) and the Cluster-Former layer and
// attention (section 3.2, eqs. 4-9).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "kernels/index/index.h"
#include "nn/attention/chunked.h"
#include "nn/attention/cluster_former.h"
#include "nn/clustering/kmeans.h"
#include "nn/clustering/memory_bank.h"
#include "nn/blocks/cluster_former_layers.h"
#include "nn/nn_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

nn::TransformerLayerOptions small_layer(int64_t d = 4, bool norm_first = true) {
  nn::TransformerLayerOptions o;
  o.d_model = d;
  o.n_heads = 2;
  o.d_ff = 6;
  o.dropout = 0.0;
  o.activation = "gelu";
  o.norm_first = norm_first;
  return o;
}

nn::TransformerLayerOptions cluster_layer_options(int64_t d, int64_t clusters, int64_t chunk, bool norm_first = true) {
  nn::TransformerLayerOptions o = small_layer(d, norm_first);
  o.attention.type = "cluster-former";
  o.attention.options = nn::Config(
      nlohmann::json{{"num_clusters", clusters}, {"chunk_size", chunk}, {"memory_size", 64}, {"update_every", 2}},
      "attention");
  return o;
}

Tensor bools(const std::vector<bool>& v, const Shape& s) { return Tensor::from_vector(v, s); }

// A small memory bank's options (the other fields keep their defaults).
nn::MemoryBankOptions bank_options(int64_t dim, int64_t clusters, int64_t capacity, int64_t update_every) {
  nn::MemoryBankOptions o;
  o.dim = dim;
  o.num_clusters = clusters;
  o.capacity = capacity;
  o.update_every = update_every;
  return o;
}

// Row r of a (N, D) tensor's values.
std::vector<double> row(const std::vector<double>& v, int64_t r, int64_t d) {
  return std::vector<double>(v.begin() + r * d, v.begin() + (r + 1) * d);
}

}  // namespace

// ---------------- Sliding-Window layer ----------------

// The reference runs the Transformer on every window on its own (B = 1, only the
// positions that exist) and averages, token by token, the outputs of the windows
// holding it: eqs. 1-3 with no batching and no index arithmetic shared with the layer.
TEST_CASE("sliding-window layer equals a naive per-window, per-token reference") {
  struct Case { int64_t x, l, m, q; bool padded; };
  for (Case cs : {Case{7, 4, 2, 0, false}, Case{7, 4, 2, 2, true}, Case{9, 5, 2, 1, true}, Case{5, 3, 2, 0, true},
                  Case{6, 8, 3, 1, false}}) {
    INFO("x=", cs.x, " l=", cs.l, " m=", cs.m, " q=", cs.q, " padded=", cs.padded);
    const int64_t B = 2, D = 4, X = cs.x, l = cs.l, m = cs.m, q = cs.q;
    Generator g(11);
    nn::SlidingWindowLayer sw(small_layer(D), l, m, g);
    sw.to(kFloat64);
    Tensor ctx = leaf64({B, X, D}, 3);
    Tensor qst = q > 0 ? leaf64({B, q, D}, 4) : Tensor();
    std::vector<bool> cm(size_t(B * X), false), qm(size_t(B * q), false);
    if (cs.padded) {
      cm[size_t(B * X - 1)] = cm[size_t(B * X - 2)] = true;  // the second sequence is 2 shorter
      if (q > 1) qm[size_t(q - 1)] = true;
    }
    Tensor cmask = cs.padded ? bools(cm, {B, X}) : Tensor();
    Tensor qmask = cs.padded && q > 0 ? bools(qm, {B, q}) : Tensor();
    nn::WindowedStates out = sw.forward(ctx, cmask, qst, qmask);
    const int64_t K = nn::num_windows(X, m);
    CHECK(K == (X + m - 1) / m);
    std::vector<double> got = values(out.context);
    std::vector<double> sums(size_t(B * X * D), 0.0), counts(size_t(B * X), 0.0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t start = m * k, len = std::min(l, X - start);
        std::vector<Tensor> parts;
        std::vector<bool> wm;
        // A window whose own slice X[mk : mk+m] is all padding has a padded question copy.
        bool empty = true;
        for (int64_t p = start; p < std::min(start + m, X); ++p) empty = empty && cm[size_t(b * X + p)];
        if (q > 0) {
          parts.push_back(narrow(narrow(qst, 0, b, 1), 1, 0, q));
          for (int64_t i = 0; i < q; ++i) wm.push_back(empty || qm[size_t(b * q + i)]);
        }
        parts.push_back(narrow(narrow(ctx, 0, b, 1), 1, start, len));
        for (int64_t j = 0; j < len; ++j) wm.push_back(cm[size_t(b * X + start + j)]);
        Tensor w = sw.layer->forward(cat(parts, 1), bools(wm, {1, q + len}));
        std::vector<double> wv = values(w);
        for (int64_t j = 0; j < len; ++j) {
          counts[size_t(b * X + start + j)] += 1;
          for (int64_t c = 0; c < D; ++c) sums[size_t((b * X + start + j) * D + c)] += wv[size_t((q + j) * D + c)];
        }
        if (q > 0) {  // the window's question copy is its own output (not merged)
          Tensor got_q = narrow(narrow(out.question, 0, b, 1), 1, k, 1);
          check_close(reshape(got_q, {q, D}), std::vector<double>(wv.begin(), wv.begin() + q * D), 1e-10);
        }
      }
    for (size_t i = 0; i < sums.size(); ++i) {
      const double expect = sums[i] / counts[i / size_t(D)];
      CHECK(std::abs(got[i] - expect) < 1e-10);
    }
  }
}

// eqs. 2-3 as the paper writes them, in place on the per-window outputs (from
// the values before merging), for l <= 2m where a token lies in at most two
// windows: the merged window states must be those of the layer.
TEST_CASE("sliding-window merge equals the paper's pairwise in-place merge (eqs. 2-3) when l <= 2m") {
  for (auto lm : {std::pair<int64_t, int64_t>{4, 2}, {3, 2}, {6, 4}}) {
    const int64_t l = lm.first, m = lm.second, X = 11, D = 4, q = 1;
    INFO("l=", l, " m=", m);
    Generator g(5);
    nn::SlidingWindowLayer sw(small_layer(D), l, m, g);
    sw.to(kFloat64);
    Tensor ctx = leaf64({1, X, D}, 8), qst = leaf64({1, q, D}, 9);
    nn::WindowedStates out = sw.forward(ctx, {}, qst);
    const int64_t K = nn::num_windows(X, m);
    // H_k^{n+1} = Transformer(H_k^n) per window, padded past x (masked keys).
    std::vector<std::vector<double>> H, orig;
    for (int64_t k = 0; k < K; ++k) {
      Tensor win = Tensor::zeros({1, l, D}, kFloat64);
      std::vector<bool> wm(size_t(q + l), false);
      const int64_t len = std::min(l, X - m * k);
      win = cat({narrow(ctx, 1, m * k, len), Tensor::zeros({1, l - len, D}, kFloat64)}, 1);
      for (int64_t j = len; j < l; ++j) wm[size_t(q + j)] = true;
      H.push_back(values(sw.layer->forward(cat({qst, win}, 1), bools(wm, {1, q + l}))));
    }
    orig = H;
    auto rows_op = [&](std::vector<double>& dst, int64_t dst_row, const std::vector<double>& src, int64_t src_row,
                       int64_t n) {
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < D; ++c) {
          double& v = dst[size_t((dst_row + r) * D + c)];
          v = (v + src[size_t((src_row + r) * D + c)]) / 2;  // += then /= 2
        }
    };
    for (int64_t k = 0; k < K; ++k) {
      if (k > 0) rows_op(H[size_t(k)], q, orig[size_t(k - 1)], q + m, l - m);          // eq. 2
      if (k + 1 < K) rows_op(H[size_t(k)], q + m, orig[size_t(k + 1)], q, l - m);      // eq. 3
    }
    std::vector<double> got = values(out.context);
    for (int64_t p = 0; p < X; ++p) {  // token p in window k = p / m, slot q + p - m k
      const int64_t k = p / m;
      for (int64_t c = 0; c < D; ++c)
        CHECK(std::abs(got[size_t(p * D + c)] - H[size_t(k)][size_t((q + p - m * k) * D + c)]) < 1e-10);
    }
  }
}

TEST_CASE("sliding-window layer passes float64 gradcheck (question, padding, causal)") {
  Generator g(21);
  nn::SlidingWindowLayer sw(small_layer(4), 3, 2, g);
  sw.to(kFloat64);
  sw.eval();
  Tensor cmask = bools({false, false, false, false, true}, {1, 5});
  check_module_grad(sw,
                    [&](const std::vector<Tensor>& xs) {
                      nn::WindowedStates s = sw.forward(xs[0], cmask, xs[1]);
                      return cat({reshape(s.context, {1, 20}), reshape(s.question, {1, 12})}, 1);
                    },
                    {leaf64({1, 5, 4}, 1), leaf64({1, 1, 4}, 2)});
  check_module_grad(sw, [&](const std::vector<Tensor>& xs) { return sw.forward(xs[0], {}, {}, {}, true).context; },
                    {leaf64({1, 5, 4}, 3)});
}

TEST_CASE("causal sliding-window layer: no token sees a later position") {
  Generator g(2);
  nn::SlidingWindowLayer sw(small_layer(4), 4, 2, g);
  sw.to(kFloat64);
  Tensor x = leaf64({1, 9, 4}, 5);
  Tensor y0 = sw.forward(x, {}, {}, {}, true).context;
  Tensor x2 = clone(x.detach());
  // Change the last 3 tokens: outputs 0..5 must stay.
  x2 = cat({narrow(x2, 1, 0, 6), narrow(x2, 1, 6, 3) + 1.0}, 1);
  Tensor y1 = sw.forward(x2, {}, {}, {}, true).context;
  check_close(narrow(y1, 1, 0, 6), narrow(y0, 1, 0, 6), 1e-12);
  CHECK(values(narrow(y1, 1, 6, 3)) != values(narrow(y0, 1, 6, 3)));
}

TEST_CASE("sliding-window layer bad inputs name the layer and the shapes") {
  Generator g(1);
  CHECK_THROWS_MSG(nn::SlidingWindowLayer(small_layer(4), 2, 2, g), ValueError, "[SlidingWindowLayer]", "l=2 m=2");
  CHECK_THROWS_MSG(nn::SlidingWindowLayer(small_layer(4), 3, 0, g), ValueError, "[SlidingWindowLayer]", "m=0");
  nn::SlidingWindowLayer sw(small_layer(4), 3, 2, g);
  CHECK_THROWS_MSG(sw.forward(Tensor::zeros({1, 5, 3})), ShapeError, "[SlidingWindowLayer] context", "(1,5,3)");
  CHECK_THROWS_MSG(sw.forward(Tensor::zeros({1, 0, 4})), ShapeError, "[SlidingWindowLayer] context", "x > 0");
  CHECK_THROWS_MSG(sw.forward(Tensor::zeros({1, 5, 4}), Tensor::zeros({1, 4}, kBool)), ShapeError,
                   "[SlidingWindowLayer] context_mask", "(1, 5)");
  CHECK_THROWS_MSG(sw.forward(Tensor::zeros({1, 5, 4}), {}, Tensor::zeros({1, 2, 1, 4})), ShapeError,
                   "[SlidingWindowLayer] question", "(1, 3, q, 4)", "(1,2,1,4)");
  CHECK_THROWS_MSG(sw.forward(Tensor::zeros({1, 5, 4}), {}, Tensor::zeros({1, 2, 4}), Tensor::zeros({1, 3}, kBool)),
                   ShapeError, "[SlidingWindowLayer] question_mask", "(1, 2)");
  CHECK_THROWS_MSG(sw.forward(Tensor::zeros({1, 5, 4}), {}, {}, Tensor::zeros({1, 3}, kBool)), ValueError,
                   "[SlidingWindowLayer] question_mask given without a question");
  CHECK_THROWS_MSG(sw.forward(Tensor::zeros({1, 5, 4}), {}, Tensor::zeros({1, 2, 4}, kFloat64)), DTypeError,
                   "[SlidingWindowLayer] question float64");
}

// ---------------- memory bank ----------------

TEST_CASE("memory bank with save_memory false: a resumed bank restarts its FIFO empty and keeps clustering") {
  // Its counters were loaded while its memory was not: it claimed 30 zero rows, and the next
  // update's cosine K-Means refused them.
  nn::MemoryBankOptions o = bank_options(8, 4, 100, 2);
  o.save_memory = false;
  Generator g(0);
  nn::MemoryBank bank(o, g);
  bank.add(randn({30, 8}, kFloat32, g));
  bank.step();
  CHECK(bank.step());
  const nn::StateDict saved = bank.state_dict();
  for (auto& e : saved) CHECK(e.first != "memory");
  nn::MemoryBank fresh(o, g);
  fresh.load_state_dict(saved);
  CHECK(fresh.size() == 0);
  CHECK(fresh.steps() == 2);
  CHECK(fresh.updates() == 1);
  CHECK(values(fresh.centroids) == values(bank.centroids));
  fresh.add(randn({6, 8}, kFloat32, g));
  CHECK(fresh.size() == 6);
  fresh.step();
  CHECK(fresh.step());  // K-Means on the 6 rows gathered since the resume
  // A non-strict load that wrote no counters leaves a live FIFO alone; counters without the
  // memory reset it in a bank that saves its memory too.
  fresh.load_state_dict({{"centroids", clone(fresh.centroids)}}, /*strict=*/false);
  CHECK(fresh.size() == 6);
  nn::MemoryBank keeps(bank_options(8, 4, 100, 2), g);
  keeps.add(randn({5, 8}, kFloat32, g));
  keeps.load_state_dict(saved, /*strict=*/false);
  CHECK(keeps.size() == 0);
  nn::MemoryBank full(bank_options(8, 4, 100, 2), g);
  full.add(randn({7, 8}, kFloat32, g));
  keeps.load_state_dict(full.state_dict());
  CHECK(keeps.size() == 7);
  CHECK(values(keeps.contents()) == values(full.contents()));
}

TEST_CASE("memory bank: FIFO keeps the newest capacity vectors in order and skips padding") {
  nn::MemoryBank bank(bank_options(2, 2, 5, 100));
  auto rows = [](double start, int64_t n) {
    std::vector<double> v;
    for (int64_t i = 0; i < n; ++i) {  // (two push_backs: gcc 12 -O3 misreads insert of a list here)
      v.push_back(start + double(i));
      v.push_back(-(start + double(i)));
    }
    return Tensor::from_vector(v, {n, 2});
  };
  auto firsts = [](const Tensor& t) {
    std::vector<double> v = values(t), out;
    for (size_t i = 0; i < v.size(); i += 2) out.push_back(v[i]);
    return out;
  };
  CHECK(bank.size() == 0);
  // (1, 3, 2) states with the middle one padding: stores 1 and 3.
  bank.add(reshape(rows(1, 3), {1, 3, 2}), bools({false, true, false}, {1, 3}));
  CHECK(bank.size() == 2);
  CHECK(firsts(bank.contents()) == std::vector<double>{1, 3});
  bank.add(rows(10, 4));  // 6 vectors offered to a 5-slot bank: the oldest (1) pops
  CHECK(bank.size() == 5);
  CHECK(firsts(bank.contents()) == std::vector<double>{3, 10, 11, 12, 13});
  bank.add(rows(20, 2));
  CHECK(firsts(bank.contents()) == std::vector<double>{11, 12, 13, 20, 21});
  bank.add(rows(30, 7));  // more than the capacity at once: the last 5 of them
  CHECK(firsts(bank.contents()) == std::vector<double>{32, 33, 34, 35, 36});
  CHECK(bank.size() == 5);
  // Gradients never reach the bank: it stores detached copies.
  Tensor x = leaf64({1, 2}, 3);
  bank.add(x);
  CHECK_FALSE(bank.memory.requires_grad());
  // A zero state has no direction to cluster by: skipped like padding (0 is dropped, 40 kept).
  bank.add(Tensor::from_vector(std::vector<double>{0, 0, 40, -40}, {2, 2}));
  std::vector<double> now = firsts(bank.contents());  // 34 35 36 x 40: one row pushed out, not two
  CHECK(now.front() == 34);
  CHECK(now.back() == 40);
  CHECK(bank.size() == 5);
  // A non-finite state is an error naming it, and nothing of that call is stored.
  const std::vector<double> before = values(bank.contents());
  CHECK_THROWS_MSG(bank.add(Tensor::from_vector(std::vector<double>{50, -50, NAN, 1}, {1, 2, 2})), ValueError,
                   "[MemoryBank] add: state 1 of", "(1,2,2)", "non-finite");
  CHECK_THROWS_MSG(bank.add(Tensor::from_vector(std::vector<double>{INFINITY, 1}, {1, 2})), ValueError,
                   "[MemoryBank] add: state 0");
  CHECK(values(bank.contents()) == before);
  // ... unless it is padding.
  bank.add(Tensor::from_vector(std::vector<double>{NAN, 1, 60, -60}, {2, 2}), bools({true, false}, {2}));
  CHECK(firsts(bank.contents()).back() == 60);
}

TEST_CASE("memory bank: fewer distinct directions than clusters give that many centroids, the rest repeated") {
  // A layer fed by a 2-symbol vocabulary without positions holds only 2 directions
  // (at many norms); 4 centroids are asked for. K-Means cannot find 4 distinct ones,
  // so it clusters into 2 and the other 2 repeat one of them: training goes on.
  nn::MemoryBank bank(bank_options(3, 4, 50, 2));
  std::vector<float> v;
  for (int64_t i = 0; i < 20; ++i) {
    const float s = float(1 + i % 7);
    if (i % 2 == 0)
      v.insert(v.end(), {s, 0.f, 0.f});
    else
      v.insert(v.end(), {0.f, s, s});
  }
  bank.add(Tensor::from_vector(v, {20, 3}));
  CHECK_FALSE(bank.step());
  CHECK(bank.step());  // step 2: recomputed without an error
  CHECK(bank.updates() == 1);
  std::vector<double> c = values(bank.centroids);
  int64_t near_x = 0, near_yz = 0;
  for (int64_t j = 0; j < 4; ++j) {
    std::vector<double> r = row(c, j, 3);
    const double n = std::sqrt(r[0] * r[0] + r[1] * r[1] + r[2] * r[2]);
    near_x += r[0] / n > 0.999;
    near_yz += (r[1] + r[2]) / (n * std::sqrt(2.0)) > 0.999;
  }
  CHECK(near_x >= 1);
  CHECK(near_yz >= 1);
  CHECK(near_x + near_yz == 4);
  // The cluster layer's eq. 5 then uses only the lowest id of each repeated direction.
  nn::KMeansOptions four;
  four.k = 4;
  four.metric = nn::KMeansMetric::cosine;
  CHECK_THROWS_MSG(nn::kmeans(bank.contents(), four), nn::KMeansTooFewPointsError, "only 2 distinct points");
  // Two random directions at random norms: their unit rows differ in the last bits, so K-Means saw 40
  // distinct points it could not tell apart, left clusters empty and failed with a plain Error (every
  // trial of a hunt's six); now that is a KMeansTooFewPointsError and the bank falls back as above.
  for (uint64_t trial = 0; trial < 4; ++trial) {
    Generator g(100 + trial);
    Tensor dirs = randn({2, 8}, kFloat32, g), scales = rand({40, 1}, kFloat32, g) * 3.5 + 0.5;
    std::vector<int64_t> which;
    for (int64_t i = 0; i < 40; ++i) which.push_back(i % 2);
    Tensor states = index_select(dirs, 0, Tensor::from_vector(which, {40})) * scales;
    nn::MemoryBank scaled(bank_options(8, 4, 100, 1));
    scaled.add(states);
    CHECK(scaled.step());
    std::vector<double> cs = values(scaled.centroids), ds = values(dirs);
    for (int64_t j = 0; j < 4; ++j) {
      std::vector<double> r = row(cs, j, 8);
      double best = 0;
      for (int64_t q = 0; q < 2; ++q) {
        std::vector<double> u = row(ds, q, 8);
        double dot = 0, nr = 0, nu = 0;
        for (size_t t = 0; t < 8; ++t) dot += r[t] * u[t], nr += r[t] * r[t], nu += u[t] * u[t];
        best = std::max(best, dot / std::sqrt(nr * nu));
      }
      CHECK(best > 0.9999);  // each centroid is one of the two directions
    }
  }
}

TEST_CASE("GetCentroids order: each next centroid is the nearest (cosine) unpicked one") {
  // Unit vectors at angles 0, 90, 10, 80, 45 degrees (and 170: the farthest, last).
  std::vector<double> deg = {0, 90, 10, 80, 45, 170}, v;
  for (double a : deg) v.insert(v.end(), {std::cos(a * M_PI / 180), std::sin(a * M_PI / 180)});
  Tensor c = Tensor::from_vector(v, {6, 2});
  Tensor o = nn::order_centroids_greedy(c * 3.0);  // scale does not matter: cosine
  std::vector<double> got = values(o);
  const std::vector<int64_t> expect = {0, 2, 4, 3, 1, 5};
  for (size_t i = 0; i < expect.size(); ++i) {
    CHECK(std::abs(got[2 * i] - 3 * v[size_t(2 * expect[i])]) < 1e-12);
    CHECK(std::abs(got[2 * i + 1] - 3 * v[size_t(2 * expect[i] + 1)]) < 1e-12);
  }
  CHECK_THROWS_MSG(nn::order_centroids_greedy(Tensor::zeros({0, 2})), ValueError, "[order_centroids_greedy]",
                   "(0,2)");
}

// Algorithm 1: "if i % ClusterUpdateFrequency == 0: Centroids = GetCentroids(Memory)".
TEST_CASE("memory bank recomputes centroids every update_every steps from the memory") {
  // capacity 30: the 30 planted vectors below push out the two first ones
  nn::MemoryBankOptions o = bank_options(3, 3, 30, 3);
  o.kmeans_iters = 20;
  Generator g(4);
  nn::MemoryBank bank(o, g);
  // Three planted directions (cosine clusters), with small noise.
  const std::vector<std::vector<double>> dirs = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
  auto batch = [&](int64_t n) {
    Tensor noise = rand({n, 3}, kFloat32, g, -0.01, 0.01);
    std::vector<float> v;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < 3; ++c) v.push_back(float(dirs[size_t(i % 3)][size_t(c)] * (1 + i % 5)));
    return Tensor::from_vector(v, {n, 3}) + noise;
  };
  const std::vector<double> initial = values(bank.centroids);
  bank.add(Tensor::ones({2, 3}));  // fewer vectors than clusters:
  CHECK_FALSE(bank.step());
  CHECK_FALSE(bank.step());
  CHECK_FALSE(bank.step());  // step 3 is due, but K-Means needs >= 3 vectors: centroids kept
  CHECK(bank.updates() == 0);
  CHECK(values(bank.centroids) == initial);
  CHECK_THROWS_MSG(bank.update_centroids(), ValueError, "[MemoryBank] cannot compute 3 centroids from 2");
  bank.add(batch(30));
  CHECK_FALSE(bank.step());  // step 4
  CHECK_FALSE(bank.step());  // step 5
  CHECK(values(bank.centroids) == initial);
  CHECK(bank.step());  // step 6: recomputed
  CHECK(bank.steps() == 6);
  CHECK(bank.updates() == 1);
  // Each planted direction is one centroid (cosine > 0.99), the greedy order kept.
  std::vector<double> c = values(bank.centroids);
  for (auto& d : dirs) {
    double best = -1;
    for (int64_t k = 0; k < 3; ++k) {
      std::vector<double> r = row(c, k, 3);
      double dot = 0, n = 0;
      for (int j = 0; j < 3; ++j) dot += r[size_t(j)] * d[size_t(j)], n += r[size_t(j)] * r[size_t(j)];
      best = std::max(best, dot / std::sqrt(n));
    }
    CHECK(best > 0.99);
  }
  CHECK(values(nn::order_centroids_greedy(bank.centroids)) == c);
  for (int i = 0; i < 2; ++i) CHECK_FALSE(bank.step());
  CHECK(bank.step());  // step 9
  CHECK(bank.updates() == 2);
}

// step() keeps the step count on the host between its own writes (no device read per
// step on CUDA); a load or any other write of the counters must be seen.
TEST_CASE("memory bank steps count on from a loaded or overwritten counter") {
  nn::MemoryBankOptions o = bank_options(3, 2, 10, 4);
  Generator g(4);
  nn::MemoryBank a(o, g), b(o, g);
  a.add(Tensor::ones({1, 3}));
  for (int i = 0; i < 3; ++i) CHECK_FALSE(a.step());
  for (int i = 0; i < 5; ++i) b.step();
  CHECK(b.steps() == 5);
  b.load_state_dict(a.state_dict());
  CHECK_FALSE(b.step());
  CHECK(b.steps() == 4);  // 3 loaded + 1, not 5 + 1
  Tensor at = narrow(b.counters, 0, 2, 1);
  fill_(at, 6.0);
  b.add(Tensor::ones({1, 3}));  // the bank's own write between: still sees the user's
  CHECK_FALSE(b.step());
  CHECK(b.steps() == 7);
  b.add(Tensor::ones({2, 3}));
  CHECK(b.step());  // step 8: due, 4 vectors held, 2 clusters
  CHECK(b.updates() == 1);
  CHECK(b.steps() == 8);
}

// Counters from a damaged or edited state (size or next write row outside the bank): the next add() wrote
// outside the memory (a segfault at next row 10^9, a corrupted heap at 6). The load is refused by name and the
// bank emptied; the ring kernel wraps a bad row into the ring whatever reaches it.
TEST_CASE("memory bank refuses loaded counters that do not fit it, and empties itself") {
  nn::MemoryBankOptions o = bank_options(3, 2, 5, 1);
  Generator g(4);
  nn::MemoryBank b(o, g);
  b.add(Tensor::ones({2, 3}));
  for (const std::vector<int64_t>& bad : std::vector<std::vector<int64_t>>{
           {0, 1000000000, 0, 0}, {0, 5, 0, 0}, {6, 0, 0, 0}, {-3, 0, 0, 0}, {0, -1, 0, 0}, {0, 0, -1, 0}}) {
    nn::StateDict sd = b.state_dict();
    for (auto& [name, t] : sd)
      if (name == "counters") t = Tensor::from_vector(bad, {4});
    const std::vector<int64_t> before = b.counters.to_vector<int64_t>();
    CHECK_THROWS_MSG(b.load_state_dict(sd), ValueError, "[MemoryBank] loaded counters [",
                     "do not fit a bank of capacity 5", "nothing was loaded");
    CHECK(b.counters.to_vector<int64_t>() == before);  // refused before any copy
    b.add(Tensor::ones({7, 3}));  // wraps around the ring, within it
    CHECK(b.size() == 5);
  }
  // Without the memory (save_memory false, a non-strict load) size and row are reset, so a bank of another
  // capacity takes them (as before); steps and updates are still checked.
  nn::MemoryBank small(bank_options(3, 2, 2, 1), g);
  nn::StateDict counters_only;
  for (auto& [name, t] : b.state_dict())
    if (name == "counters") counters_only.emplace_back(name, Tensor::from_vector(std::vector<int64_t>{5, 4, 3, 1}, {4}));
  small.load_state_dict(counters_only, /*strict=*/false);
  CHECK(small.size() == 0);
  CHECK(small.steps() == 3);
  counters_only[0].second = Tensor::from_vector(std::vector<int64_t>{0, 0, -2, 0}, {4});
  CHECK_THROWS_MSG(small.load_state_dict(counters_only, false), ValueError, "steps and updates >= 0",
                   "nothing was loaded");
  // a loader that wrote the counters itself (cf.torch) is checked after: the bank is emptied, and says so
  fill_(b.counters, 9.0);
  CHECK_THROWS_MSG(b.notify_state_loaded({"counters", "memory"}), ValueError, "do not fit a bank of capacity 5",
                   "the bank was emptied (the rest of the state was loaded)");
  CHECK(b.size() == 0);
  // a kernel given a bad row directly wraps it into the ring (no write outside the memory)
  Tensor counters = Tensor::from_vector(std::vector<int64_t>{0, -7, 0, 0}, {4});
  Tensor memory = Tensor::zeros({5, 3});
  kernels::ring_append_cpu(memory, counters, Tensor::ones({2, 3}), Tensor::ones({2}, kInt64), kernels::RingSlots{0, 1});
  CHECK(counters.to_vector<int64_t>() == std::vector<int64_t>{2, 0, 0, 0});  // rows 3 and 4 written: -7 is 3 mod 5
  CHECK(values(sum(memory, {1})) == std::vector<double>{0, 0, 0, 3, 3});
}

// empty_windows: the windows of eq. 4 whose own slice is padding only.
TEST_CASE("empty_windows marks the windows whose slice X[mk : mk + m] is padding only") {
  std::vector<bool> m = {false, false, false, false, false, false, false,  // row 0: nothing padded
                         false, true,  true,  true,  true,  true,  true};  // row 1: from position 1 on
  const Tensor cmask = Tensor::from_vector(m, {2, 7});
  // m = 3: windows [0, 3), [3, 6), [6, 7): the last is short.
  CHECK(values(cf::to(nn::empty_windows(cmask, 3), kInt64)) == std::vector<double>{0, 0, 0, 0, 1, 1});
  CHECK(values(cf::to(nn::empty_windows(cmask, 7), kInt64)) == std::vector<double>{0, 0});
  CHECK(values(cf::to(nn::empty_windows(cmask, 1), kInt64)) ==
        std::vector<double>{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1});
  CHECK_THROWS_MSG(nn::empty_windows(Tensor::zeros({2, 7}), 3), ShapeError, "[empty_windows] context_mask",
                   "float32");
  CHECK_THROWS_MSG(nn::empty_windows(cmask, 0), ValueError, "[num_windows]", "stride > 0");
  CHECK_THROWS_MSG(nn::empty_windows(Tensor(), 3), ShapeError, "[empty_windows]", "undefined");
}

TEST_CASE("memory bank bad inputs name the bank and the shapes") {
  nn::MemoryBankOptions o = bank_options(3, 4, 8, 1000);
  nn::MemoryBank bank(o);
  CHECK_THROWS_MSG(bank.add(Tensor::zeros({2, 4})), ShapeError, "[MemoryBank] add expects float states (..., 3)",
                   "(2,4)");
  CHECK_THROWS_MSG(bank.add(Tensor::zeros({2, 3}, kInt64)), DTypeError, "[MemoryBank] add expects float states",
                   "int64");
  CHECK_THROWS_MSG(bank.add(Tensor::zeros({2, 3}), Tensor::zeros({3}, kBool)), ShapeError,
                   "[MemoryBank] padding_mask must be bool (2)");
  o.num_clusters = 9;
  CHECK_THROWS_MSG(nn::MemoryBank{o}, ValueError, "[MemoryBank] num_clusters (9) exceeds the capacity (8)");
  o.num_clusters = 2;
  o.update_every = 0;
  CHECK_THROWS_MSG(nn::MemoryBank{o}, ValueError, "[MemoryBank]", "update_every=0");
  o.update_every = 1;
  for (int64_t* field : {&o.dim, &o.capacity, &o.kmeans_iters, &o.num_clusters}) {
    const int64_t keep = *field;
    *field = 0;
    CHECK_THROWS_MSG(nn::MemoryBank{o}, ValueError, "[MemoryBank] dim, num_clusters, capacity, update_every and "
                     "kmeans_iters must be positive");
    *field = keep;
  }
}

// ---------------- Cluster-Former attention and layer ----------------

// One cluster and a chunk as long as the sequence: eqs. 5-9 reduce to full attention.
TEST_CASE("a Cluster-Former layer with one cluster and one chunk equals a full-attention Transformer layer") {
  for (bool pre : {true, false})
    for (bool causal : {false, true}) {
      INFO("norm_first ", pre, " causal ", causal);
      Generator g1(7), g2(7);
      nn::TransformerEncoderLayer full(small_layer(8, pre), g1);
      nn::TransformerEncoderLayer clus(cluster_layer_options(8, 1, 6, pre), g2);
      full.to(kFloat64);
      clus.to(kFloat64);
      clus.load_state_dict(full.state_dict(), false);  // same weights; the bank is extra
      clus.eval();
      Tensor x1 = leaf64({2, 6, 8}, 1), x2 = leaf64({2, 6, 8}, 1);
      Tensor mask = bools({false, false, false, false, false, false, false, false, false, false, true, true}, {2, 6});
      Tensor a = full.forward(x1, mask, causal), b = clus.forward(x2, mask, causal);
      check_close(b, a, 1e-12);
      Tensor w = leaf64({2, 6, 8}, 9).detach();
      sum(a * w).backward();
      sum(b * w).backward();
      check_close(x2.grad(), x1.grad(), 1e-12);
      check_close(clus.self_attn->w_q->weight.grad(), full.self_attn->w_q->weight.grad(), 1e-12);
    }
}

// The dense reference: eq. 5 by explicit cosine argmax, eq. 6 by std::stable_sort,
// eq. 8 by rank / m, and an explicit N x N mask "same chunk (and not padding,
// not later when causal)" for dense softmax attention. Forward and backward.
TEST_CASE("Cluster-Former attention equals its dense reference, forward and backward") {
  const int64_t B = 2, H = 2, N = 11, D = 6, p = 3, m = 3;
  for (bool causal : {false, true}) {
    INFO("causal ", causal);
    nn::ClusterFormerAttentionOptions o;
    o.chunk_size = m;
    o.bank.num_clusters = p;
    o.bank.capacity = 16;
    Generator g(3);
    nn::ClusterFormerAttention att(D, o, g);
    att.eval();
    Tensor xin = leaf64({B, N, D}, 2).detach();
    std::vector<bool> pad(size_t(B * N), false);
    pad[size_t(B * N - 1)] = pad[size_t(B * N - 3)] = true;
    nn::AttentionArgs a;
    a.q = leaf64({B, H, N, D / H}, 4);
    a.k = leaf64({B, H, N, D / H}, 5);
    a.v = leaf64({B, H, N, D / H}, 6);
    a.key_padding_mask = bools(pad, {B, N});
    a.query_padding_mask = a.key_padding_mask;
    a.causal = causal;
    a.query_input = xin;
    Tensor out = att.forward(a);
    // eq. 5 by hand.
    std::vector<double> xv = values(xin), cv = values(att.bank->centroids);
    std::vector<int64_t> ids(size_t(B * N));
    for (int64_t i = 0; i < B * N; ++i) {
      double best = -2;
      for (int64_t c = 0; c < p; ++c) {
        double dot = 0, nx = 0, nc = 0;
        for (int64_t j = 0; j < D; ++j) {
          dot += xv[size_t(i * D + j)] * cv[size_t(c * D + j)];
          nx += xv[size_t(i * D + j)] * xv[size_t(i * D + j)];
          nc += cv[size_t(c * D + j)] * cv[size_t(c * D + j)];
        }
        const double cs = dot / std::sqrt(nx * nc);
        if (cs > best) best = cs, ids[size_t(i)] = c;
      }
      if (pad[size_t(i)]) ids[size_t(i)] = p;
    }
    CHECK(att.last_assignments().to_vector<int64_t>() == ids);
    std::set<int64_t> used(ids.begin(), ids.end());
    CHECK(used.size() >= 3);  // more than one real cluster, so the test means something
    std::vector<bool> blocked(size_t(B * N * N));
    for (int64_t b = 0; b < B; ++b) {
      std::vector<int64_t> order(static_cast<size_t>(N));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t i, int64_t j) { return ids[size_t(b * N + i)] < ids[size_t(b * N + j)]; });
      std::vector<int64_t> chunk(static_cast<size_t>(N));
      for (int64_t r = 0; r < N; ++r) chunk[size_t(order[size_t(r)])] = r / m;
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < N; ++j)
          blocked[size_t((b * N + i) * N + j)] =
              chunk[size_t(i)] != chunk[size_t(j)] || pad[size_t(b * N + j)] || (causal && j > i);
    }
    Tensor qq = leaf64({B, H, N, D / H}, 4), kk = leaf64({B, H, N, D / H}, 5), vv = leaf64({B, H, N, D / H}, 6);
    Tensor ref = nn::dense_attention(qq, kk, vv, reshape(bools(blocked, {B, N, N}), {B, 1, N, N}),
                                     1.0 / std::sqrt(double(D / H)));
    check_close(out, ref, 1e-12);
    Tensor w = leaf64({B, H, N, D / H}, 10).detach();
    sum(out * w).backward();
    sum(ref * w).backward();
    check_close(a.q.grad(), qq.grad(), 1e-12);
    check_close(a.k.grad(), kk.grad(), 1e-12);
    check_close(a.v.grad(), vv.grad(), 1e-12);
  }
}

TEST_CASE("Cluster-Former layer passes float64 gradcheck with the assignments held fixed") {
  for (int64_t q : {0, 1}) {
    INFO("question tokens ", q);
    Generator g(8);
    nn::ClusterFormerLayer layer(cluster_layer_options(4, 2, 3), 2, g);
    layer.to(kFloat64);
    layer.eval();
    const int64_t X = 5, K = nn::num_windows(X, 2), n = K * q + X;
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < n; ++i) ids.push_back((i * 7) % 3 == 0 ? 1 : 0);
    layer.attention().set_fixed_assignments(ti64(ids, {1, n}));
    Tensor cmask = bools({false, false, false, true, false}, {1, X});
    if (q == 0) ids[3] = 2;  // the padded token: id p
    layer.attention().set_fixed_assignments(ti64(ids, {1, n}));
    std::vector<Tensor> xs;  // (push_back, not a one-element list: gcc 13 -O3 warns falsely on that)
    xs.push_back(leaf64({1, X, 4}, 1));
    if (q > 0) xs.push_back(leaf64({1, q, 4}, 2));
    check_module_grad(layer,
                      [&](const std::vector<Tensor>& in) {
                        nn::WindowedStates s = layer.forward(in[0], cmask, q > 0 ? in[1] : Tensor());
                        return q > 0 ? cat({reshape(s.context, {1, X * 4}), reshape(s.question, {1, K * q * 4})}, 1)
                                     : s.context;
                      },
                      xs);
    CHECK(layer.attention().last_assignments().to_vector<int64_t>() == ids);
  }
}

// eq. 4: the states clustered are [Q_0; X[0:m]; Q_1; X[m:2m]; ...], in that order.
TEST_CASE("Cluster-Former layer lays out question copies and context as eq. 4 and maps back (eqs. 8-9)") {
  Generator g(9);
  nn::ClusterFormerLayer layer(cluster_layer_options(4, 1, 100), 2, g);
  layer.to(kFloat64);
  layer.eval();
  const int64_t X = 5, q = 2, K = 3;
  Tensor ctx = leaf64({1, X, 4}, 1), qst = leaf64({1, K, q, 4}, 2);
  nn::WindowedStates s = layer.forward(ctx, {}, qst);
  // One cluster, one chunk: the layer is a plain Transformer layer over eq. 4's sequence.
  std::vector<Tensor> parts;
  for (int64_t k = 0; k < K; ++k) {
    parts.push_back(reshape(narrow(qst, 1, k, 1), {1, q, 4}));
    parts.push_back(narrow(ctx, 1, 2 * k, std::min<int64_t>(2, X - 2 * k)));
  }
  Tensor ref = layer.layer->forward(cat(parts, 1));
  int64_t at = 0;
  for (int64_t k = 0; k < K; ++k) {
    check_close(reshape(narrow(s.question, 1, k, 1), {1, q, 4}), narrow(ref, 1, at, q), 1e-12);
    at += q;
    const int64_t len = std::min<int64_t>(2, X - 2 * k);
    check_close(narrow(s.context, 1, 2 * k, len), narrow(ref, 1, at, len), 1e-12);
    at += len;
  }
  CHECK(layer.attention().last_assignments().shape() == Shape{1, K * q + X});
}

TEST_CASE("Cluster-Former attention fills its bank in training mode only, padding excluded") {
  Generator g(1);
  nn::TransformerEncoderLayer layer(cluster_layer_options(4, 2, 3), g);
  auto& att = dynamic_cast<nn::ClusterFormerAttention&>(layer.self_attn->attention());
  Tensor x = rand({2, 5, 4}, kFloat32, g);
  Tensor mask = bools({false, false, false, false, false, false, false, false, true, true}, {2, 5});
  layer.train();
  layer.forward(x, mask);
  CHECK(att.bank->size() == 8);
  layer.eval();
  layer.forward(x, mask);
  CHECK(att.bank->size() == 8);
  // The stored vectors are what eq. 5 clusters: the attention's query_input (pre-LN: LayerNorm(x)).
  Tensor normed = layer.norm1->forward(x);
  check_close(narrow(att.bank->contents(), 0, 0, 5), reshape(narrow(normed, 0, 0, 1), {5, 4}), 1e-6);
}

TEST_CASE("Cluster-Former attention: a zero hidden state joins cluster 0 and is not stored, padding gets id p") {
  // An embedding's padding row and a LayerNorm of a constant row at init are zero:
  // eq. 5's cosine has no value there, and neither the forward nor the bank may fail.
  Generator g(2);
  nn::ClusterFormerAttentionOptions o;
  o.bank.num_clusters = 3;
  o.bank.capacity = 16;
  nn::ClusterFormerAttention att(4, o, g);
  Tensor x = rand({1, 5, 4}, kFloat32, g, -1, 1);
  Tensor zero_at_1_and_4 = Tensor::from_vector(std::vector<float>{1, 0, 1, 1, 0}, {1, 5, 1});
  Tensor xz = x * zero_at_1_and_4;
  Tensor pad = bools({false, false, false, false, true}, {1, 5});
  std::vector<int64_t> ids = att.assign(xz, pad).to_vector<int64_t>();
  std::vector<int64_t> plain = att.assign(x).to_vector<int64_t>();
  CHECK(ids[1] == 0);  // zero state: cluster 0
  CHECK(ids[4] == 3);  // padding: p
  for (size_t i : {size_t(0), size_t(2), size_t(3)}) CHECK(ids[i] == plain[i]);  // the others as before
  nn::AttentionArgs a;
  a.q = a.k = a.v = rand({1, 2, 5, 2}, kFloat32, g);
  a.query_input = xz;
  a.key_padding_mask = pad;
  att.train();
  Tensor y = att.forward(a);
  for (float v : y.to_vector<float>()) CHECK(std::isfinite(v));
  CHECK(att.bank->size() == 3);  // rows 0, 2, 3: the zero row and the padding are not stored
}

TEST_CASE("Cluster-Former attention and layer bad inputs name the class and the values") {
  Generator g(1);
  nn::TransformerLayerOptions bad = small_layer(4);
  // Another attention makes a whole-sequence layer (the paper's Table 5
  // baselines); asking it for its Cluster-Former attention is the error.
  nn::ClusterFormerLayer other(bad, 2, g);
  CHECK_FALSE(other.has_memory_bank());
  CHECK_THROWS_MSG(other.attention(), ValueError, "[ClusterFormerLayer]", "\"cluster-former\"", "\"full\"");
  nn::AttentionSpec spec{"cluster-former", 4, 2, nn::Config(nlohmann::json{{"num_cluster", 3}}, "attention")};
  CHECK_THROWS_MSG(nn::make_attention(spec), ValueError, "attention.num_cluster");
  spec.options = nn::Config(nlohmann::json{{"chunk_size", 0}}, "attention");
  CHECK_THROWS_MSG(nn::make_attention(spec), ValueError, "[ClusterFormerAttention]", "chunk_size", "got 0");
  spec.options = nn::Config(nlohmann::json{{"memory_size", 10}, {"num_clusters", 20}}, "attention");
  CHECK_THROWS_MSG(nn::make_attention(spec), ValueError, "[MemoryBank] num_clusters (20) exceeds the capacity (10)");

  nn::ClusterFormerAttentionOptions o;
  o.bank.num_clusters = 2;
  o.bank.capacity = 8;
  nn::ClusterFormerAttention att(4, o, g);
  nn::AttentionArgs a;
  a.q = a.k = a.v = Tensor::zeros({1, 2, 3, 2});
  CHECK_THROWS_MSG(att.forward(a), ValueError, "[ClusterFormerAttention] needs the layer input as query_input");
  a.query_input = Tensor::zeros({1, 3, 5});
  CHECK_THROWS_MSG(att.forward(a), ValueError, "[ClusterFormerAttention] needs the layer input as query_input (1, 3, 4)",
                   "(1,3,5)");
  CHECK_THROWS_MSG(att.assign(Tensor::zeros({1, 3, 5})), ShapeError,
                   "[ClusterFormerAttention] hidden states must be float (B, N, 4)", "(1,3,5)");
  a.query_input = Tensor::zeros({1, 3, 4});
  a.k = a.v = Tensor::zeros({1, 2, 4, 2});
  CHECK_THROWS_MSG(att.forward(a), ShapeError, "[ClusterFormerAttention] self-attention only: 3 queries but 4 keys");
  CHECK_THROWS_MSG(att.set_fixed_assignments(ti64({0, 3}, {1, 2})), IndexError, "fixed cluster id 3",
                   "[0, 2]");
  CHECK_THROWS_MSG(att.set_fixed_assignments(Tensor::zeros({2})), ValueError, "int64 (B, N)");
  a.k = a.v = Tensor::zeros({1, 2, 3, 2});
  att.set_fixed_assignments(ti64({0, 1}, {1, 2}));
  CHECK_THROWS_MSG(att.forward(a), ShapeError, "fixed assignments are (1,2) but the input is (1, 3)");
}
