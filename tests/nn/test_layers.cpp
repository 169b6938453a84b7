#include <cmath>

#include "nn/nn_test_util.h"

using namespace cf;
using namespace cf::test;

TEST_CASE("Linear computes x W^T + b and passes gradcheck") {
  Generator g(1);
  nn::Linear lin(3, 2, true, g);
  Tensor x = rand({4, 3}, kFloat32, g);
  auto w = values(lin.weight), b = values(lin.bias), xv = values(x);
  auto y = values(lin.forward(x));
  for (int i = 0; i < 4; ++i)
    for (int o = 0; o < 2; ++o) {
      double acc = b[size_t(o)];
      for (int k = 0; k < 3; ++k) acc += xv[size_t(i * 3 + k)] * w[size_t(o * 3 + k)];
      CHECK(y[size_t(i * 2 + o)] == doctest::Approx(acc).epsilon(1e-6));
    }
  double bound = 1 / std::sqrt(3.0);
  for (double v : w) CHECK(std::abs(v) <= bound);
  CHECK(lin.forward(rand({2, 5, 3}, kFloat32, g)).shape() == Shape{2, 5, 2});
  lin.to(kFloat64);
  check_module_grad(lin, [&](const std::vector<Tensor>& xs) { return lin.forward(xs[0]); }, {leaf64({2, 2, 3}, 2)});
  nn::Linear nobias(3, 2, false, g);
  CHECK(nobias.named_parameters().size() == 1);
  CHECK_THROWS_MSG(lin.forward(leaf64({4, 5})), ShapeError, "[Linear] expected input (..., 3), got (4,5)");
  CHECK_THROWS_MSG(lin.forward(rand({4, 3}, kFloat32, g)), DTypeError, "[Linear] input is float32");
  CHECK_THROWS_MSG(nn::Linear(0, 2), ValueError, "[Linear] features must be positive");
}

TEST_CASE("Embedding looks up rows - the padding row is zero and gets no gradient") {
  Generator g(2);
  nn::Embedding emb(5, 3, /*padding_idx=*/0, g);
  CHECK(values(narrow(emb.weight, 0, 0, 1)) == std::vector<double>{0, 0, 0});
  Tensor ids = ti64({1, 0, 4, 1, 2, 0}, {2, 3});
  Tensor y = emb.forward(ids);
  CHECK(y.shape() == Shape{2, 3, 3});
  CHECK(values(narrow(reshape(y, {6, 3}), 0, 2, 1)) == values(narrow(emb.weight, 0, 4, 1)));
  sum(y * 2.0).backward();
  auto gw = values(emb.weight.grad());
  CHECK(gw[0] == 0);                  // padding row
  CHECK(gw[3] == doctest::Approx(4));  // id 1 appears twice, weight 2 each
  CHECK(gw[9] == 0);                   // id 3 unused
  emb.to(kFloat64);
  check_module_grad(emb, [&](const std::vector<Tensor>&) { return emb.forward(ids); }, {});
  CHECK_THROWS_MSG(emb.forward(ti64({5}, {1})), IndexError, "[Embedding] ids (1) for 5 embeddings", "index 5 is out of range");
  CHECK_THROWS_MSG(emb.forward(t64({1}, {1})), DTypeError, "[Embedding] ids must be int64");
  CHECK_THROWS_MSG(nn::Embedding(5, 3, 5), ValueError, "[Embedding] padding_idx 5 out of range");
  CHECK_THROWS_MSG(nn::Embedding(5, 3, -2), ValueError, "[Embedding] padding_idx -2 out of range");
  CHECK_THROWS_MSG(emb.forward(ti64({-1}, {1})), IndexError, "[Embedding]", "-1");
}

TEST_CASE("LayerNorm, activations, Sequential and FeedForward pass gradcheck") {
  Generator g(3);
  nn::LayerNorm ln(4);
  CHECK(ln.named_parameters().size() == 2);
  ln.to(kFloat64);
  {
    NoGradGuard ng;  // non-trivial affine parameters
    copy_(ln.weight, t64({0.5, 1.5, -1, 2}, {4}));
    copy_(ln.bias, t64({0.1, 0.2, 0.3, -0.4}, {4}));
  }
  check_module_grad(ln, [&](const std::vector<Tensor>& xs) { return ln.forward(xs[0]); }, {leaf64({3, 4}, 4)});
  CHECK_THROWS_MSG(ln.forward(leaf64({3, 5})), ShapeError, "[LayerNorm] expected input (..., 4), got (3,5)");

  for (const char* name : {"relu", "gelu", "leaky_relu:0.2", "tanh", "sigmoid", "identity"}) {
    auto act = nn::make_activation(name);
    Tensor x = leaf64({7}, 5, 0.1, 1.0);  // away from ReLU's kink
    GradcheckResult r = gradcheck([&](const std::vector<Tensor>& xs) { return act->forward(xs[0] - 0.5); }, {x});
    CHECK_MESSAGE(r.ok, name, ": ", r.message);
  }
  CHECK(values(nn::make_activation("leaky_relu:0.2")->forward(t64({-1, 2}, {2}))) == std::vector<double>{-0.2, 2});
  CHECK_THROWS_MSG(nn::make_activation("swish"), ValueError, "[make_activation] unknown activation 'swish'");
  CHECK_THROWS_MSG(nn::make_activation("leaky_relu:x"), ValueError, "bad slope");
  CHECK_THROWS_MSG(nn::make_activation("leaky_relu:nan"), ValueError, "bad slope in 'leaky_relu:nan'");
  CHECK_THROWS_MSG(nn::make_activation("leaky_relu:inf"), ValueError, "bad slope in 'leaky_relu:inf'");
  CHECK_THROWS_MSG(nn::LeakyReLU(std::nan("")).forward(Tensor::ones({2})), ValueError,
                   "[leaky_relu] the negative slope must be finite, got nan");

  nn::Sequential seq;
  seq.push_back(std::make_shared<nn::Linear>(4, 6, true, g)).push_back(std::make_shared<nn::Tanh>());
  seq.push_back(std::make_shared<nn::Linear>(6, 2, true, g));
  CHECK(seq.named_parameters()[2].first == "2.weight");
  CHECK_THROWS_MSG(seq[3], IndexError, "[Sequential] layer 3 out of range for 3 layers");
  seq.to(kFloat64);
  check_module_grad(seq, [&](const std::vector<Tensor>& xs) { return seq.forward(xs[0]); }, {leaf64({3, 4}, 6)});

  nn::FeedForward ff(4, 8, "gelu", 0.5, g);
  ff.to(kFloat64);
  ff.eval();  // dropout off: deterministic
  check_module_grad(ff, [&](const std::vector<Tensor>& xs) { return ff.forward(xs[0]); }, {leaf64({2, 4}, 7)});
}

TEST_CASE("Dropout: identity in eval, inverted scaling in training, seeded") {
  Generator g(11);
  nn::Dropout d(0.25, g);
  Tensor x = Tensor::ones({4000});
  Tensor y = d.forward(x);
  auto v = values(y);
  int zeros = 0;
  for (double e : v) {
    if (e == 0) ++zeros;
    else CHECK(e == doctest::Approx(1 / 0.75));
  }
  CHECK(zeros > 900);
  CHECK(zeros < 1100);
  Generator g2(11);
  nn::Dropout same(0.25, g2);
  CHECK(values(same.forward(x)) == v);  // same seed, same mask
  CHECK(values(d.forward(x)) != v);     // the generator moved on
  d.eval();
  CHECK(d.forward(x).is_same(x));
  CHECK_THROWS_MSG(nn::Dropout(1.0), ValueError, "[Dropout] p must be in [0, 1), got 1");
}

TEST_CASE("positional encodings") {
  nn::SinusoidalPositionalEncoding pe(16, 6);
  CHECK(pe.state_dict().empty());  // the table is not persistent
  {  // x + table: the gradient with respect to x is the identity
    nn::SinusoidalPositionalEncoding pe64(16, 6);
    pe64.to(kFloat64);
    check_module_grad(pe64, [&](const std::vector<Tensor>& xs) { return pe64.forward(xs[0]); }, {leaf64({2, 5, 6}, 3)});
  }
  Tensor x = Tensor::zeros({1, 5, 6}, kFloat64);
  auto v = values(pe.forward(x));
  for (int pos : {0, 3, 4})
    for (int i = 0; i < 6; ++i) {
      double a = pos / std::pow(10000.0, double(i - i % 2) / 6);
      CHECK(v[size_t(pos * 6 + i)] == doctest::Approx(i % 2 ? std::cos(a) : std::sin(a)).epsilon(1e-6));
    }
  // A float64 module has the float64 sinusoids, not the float32 table widened (3e-8 off before), and
  // keeps them through a round trip to float32 and back.
  for (int round = 0; round < 2; ++round) {
    pe.to(kFloat64);
    auto w = values(pe.forward(x));
    for (int pos = 0; pos < 5; ++pos)
      for (int i = 0; i < 6; ++i) {
        double a = pos / std::pow(10000.0, double(i - i % 2) / 6);
        CHECK(std::abs(w[size_t(pos * 6 + i)] - (i % 2 ? std::cos(a) : std::sin(a))) < 1e-15);
      }
    pe.to(kFloat32);
  }
  // to(bfloat16) keeps the table float32 (it is in no state dict, so a rounded table stayed rounded after
  // to(float32): 1.9e-3 off); the forward casts its rows to the input's dtype
  const auto exact = values(pe.forward(Tensor::zeros({1, 5, 6})));
  pe.to(kBFloat16);
  CHECK(pe.table.dtype() == kFloat32);
  CHECK(pe.forward(Tensor::zeros({1, 5, 6}, kBFloat16)).dtype() == kBFloat16);
  pe.to(kFloat32);
  CHECK(values(pe.forward(Tensor::zeros({1, 5, 6}))) == exact);
  CHECK_THROWS_MSG(pe.forward(Tensor::zeros({1, 17, 6})), ShapeError, "sequence length 17 exceeds max_len 16");
  CHECK_THROWS_MSG(pe.forward(Tensor::zeros({5, 6})), ShapeError, "expected input (B, N, 6), got (5,6)");
  Generator g(4);
  nn::LearnedPositionalEncoding lpe(8, 3, g);
  lpe.to(kFloat64);
  check_module_grad(lpe, [&](const std::vector<Tensor>& xs) { return lpe.forward(xs[0]); }, {leaf64({2, 5, 3}, 8)});

  // forward_at: each token its own position's row; arange positions equal forward.
  Tensor pos = ti64({0, 1, 2, 3, 4, 3, 0, 7, 7, 1}, {2, 5});
  Tensor arange_pos = reshape(Tensor::arange(10, kInt64), {2, 5}) - ti64({0, 5}, {2, 1});
  pe.to(kFloat64);
  for (auto [m, table, D] : {std::tuple<nn::PositionalEncoding*, Tensor, int64_t>{&pe, pe.forward(Tensor::zeros({1, 16, 6}, kFloat64)), 6},
                             {&lpe, reshape(lpe.weight, {1, 8, 3}), 3}}) {
    Tensor xs = leaf64({2, 5, D}, 9);
    auto tv = values(table), xv = values(xs), gv = values(m->forward_at(xs, pos));
    auto pv = pos.to_vector<int64_t>();
    for (int64_t t = 0; t < 10; ++t)
      for (int64_t d = 0; d < D; ++d)
        CHECK(gv[size_t(t * D + d)] == xv[size_t(t * D + d)] + tv[size_t(pv[size_t(t)] * D + d)]);
    check_close(m->forward_at(xs, arange_pos), m->forward(xs), 0);
  }
  check_module_grad(lpe, [&](const std::vector<Tensor>& xs) { return lpe.forward_at(xs[0], pos); },
                    {leaf64({2, 5, 3}, 8)});
  CHECK_THROWS_MSG(lpe.forward_at(leaf64({2, 5, 3}, 8), ti64({0, 1}, {1, 2})), ShapeError,
                   "[LearnedPositionalEncoding] positions must be int64 (B, N) = (2, 5)", "(1,2)");
  CHECK_THROWS_MSG(pe.forward_at(Tensor::zeros({2, 5, 6}, kFloat64), to(pos, kFloat32)), ShapeError,
                   "[SinusoidalPositionalEncoding] positions must be int64");
  CHECK_THROWS_MSG(lpe.forward_at(leaf64({2, 5, 3}, 8), ti64({0, 1, 2, 3, 8, 0, 0, 0, 0, 0}, {2, 5})), IndexError,
                   "[LearnedPositionalEncoding] positions (2,5) for max_len 8:", "index 8");
}

TEST_CASE("DepthwiseConv1d matches a direct loop and passes gradcheck") {
  Generator g(5);
  for (auto cfg : std::vector<std::array<int64_t, 3>>{{3, 1, 0}, {2, 2, 0}, {3, 2, 1}, {1, 1, 0}}) {
    const int64_t k = cfg[0], s = cfg[1], p = cfg[2];
    nn::DepthwiseConv1d conv(4, k, s, p, true, g);
    conv.to(kFloat64);
    Tensor x = leaf64({2, 7, 4}, 9);
    Tensor y = conv.forward(x);
    const int64_t n_out = (7 + 2 * p - k) / s + 1;
    REQUIRE(y.shape() == Shape{2, n_out, 4});
    auto xv = values(x), wv = values(conv.weight), bv = values(conv.bias), yv = values(y);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = 0; t < n_out; ++t)
        for (int64_t c = 0; c < 4; ++c) {
          double acc = bv[size_t(c)];
          for (int64_t j = 0; j < k; ++j) {
            int64_t src = t * s + j - p;
            if (src >= 0 && src < 7) acc += wv[size_t(c * k + j)] * xv[size_t((b * 7 + src) * 4 + c)];
          }
          CHECK(yv[size_t((b * n_out + t) * 4 + c)] == doctest::Approx(acc).epsilon(1e-12));
        }
    check_module_grad(conv, [&](const std::vector<Tensor>& xs) { return conv.forward(xs[0]); }, {x});
  }
  nn::DepthwiseConv1d conv(4, 5, 1, 0);
  CHECK_THROWS_MSG(conv.forward(Tensor::zeros({1, 3, 4})), ShapeError, "[DepthwiseConv1d] sequence of length 3");
  CHECK_THROWS_MSG(conv.forward(Tensor::zeros({1, 8, 3})), ShapeError, "expected input (B, N, 4)");
  CHECK_THROWS_MSG(nn::DepthwiseConv1d(4, 3, 0), ValueError, "stride=0");
}
