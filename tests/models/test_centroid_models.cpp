// Centroid Transformer models (Centroid Transformers, sections 3.1, 3.2, 3.4).
#include <doctest/doctest.h>

#include <cmath>

#include "cf.h"
#include "models/centroid_transformer.h"
#include "models/point_cloud_test_util.h"
#include "nn/nn_test_util.h"
#include "test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

// ---- a small generated set of 3-d shapes: sphere, cube surface, cylinder, torus ----
// Each cloud is randomly rotated, scaled to unit size and jittered, so the class is
// the shape, not its pose.
struct ShapeSet {
  Tensor points;  // (S, N, 3) float32
  std::vector<int64_t> labels;
};

ShapeSet make_shapes(int64_t count, int64_t n, Generator& gen) {
  const double kPi = 3.14159265358979323846;
  std::vector<float> pts;
  std::vector<int64_t> labels;
  for (int64_t s = 0; s < count; ++s) {
    const int64_t cls = s % 4;
    std::vector<double> u = rand({n, 3}, kFloat64, gen).to_vector<double>();
    std::vector<double> noise = randn({n, 3}, kFloat64, gen).to_vector<double>();
    std::vector<double> ang = rand({4}, kFloat64, gen).to_vector<double>();
    // Random rotation: Rz(a) Ry(b) Rx(c).
    double a = 2 * kPi * ang[0], b = 2 * kPi * ang[1], c = 2 * kPi * ang[2];
    double R[3][3] = {{std::cos(a) * std::cos(b), std::cos(a) * std::sin(b) * std::sin(c) - std::sin(a) * std::cos(c),
                       std::cos(a) * std::sin(b) * std::cos(c) + std::sin(a) * std::sin(c)},
                      {std::sin(a) * std::cos(b), std::sin(a) * std::sin(b) * std::sin(c) + std::cos(a) * std::cos(c),
                       std::sin(a) * std::sin(b) * std::cos(c) - std::cos(a) * std::sin(c)},
                      {-std::sin(b), std::cos(b) * std::sin(c), std::cos(b) * std::cos(c)}};
    const double scale = 0.8 + 0.4 * ang[3];
    for (int64_t i = 0; i < n; ++i) {
      double u0 = u[size_t(i * 3)], u1 = u[size_t(i * 3 + 1)], u2 = u[size_t(i * 3 + 2)], p[3];
      if (cls == 0) {  // sphere
        double z = 2 * u0 - 1, t = 2 * kPi * u1, r = std::sqrt(1 - z * z);
        p[0] = r * std::cos(t), p[1] = r * std::sin(t), p[2] = z;
      } else if (cls == 1) {  // cube surface
        int64_t face = std::min<int64_t>(5, int64_t(u2 * 6));
        double v[3];
        v[face / 2] = face % 2 ? 1.0 : -1.0;
        v[(face / 2 + 1) % 3] = 2 * u0 - 1;
        v[(face / 2 + 2) % 3] = 2 * u1 - 1;
        p[0] = v[0] * 0.7, p[1] = v[1] * 0.7, p[2] = v[2] * 0.7;
      } else if (cls == 2) {  // cylinder side, radius 0.35, height 2 (a rod)
        double t = 2 * kPi * u0;
        p[0] = 0.35 * std::cos(t), p[1] = 0.35 * std::sin(t), p[2] = 2 * u1 - 1;
      } else {  // torus R = 0.8, r = 0.2 (a ring)
        double t = 2 * kPi * u0, f = 2 * kPi * u1;
        p[0] = (0.8 + 0.2 * std::cos(f)) * std::cos(t), p[1] = (0.8 + 0.2 * std::cos(f)) * std::sin(t),
        p[2] = 0.2 * std::sin(f);
      }
      for (int r = 0; r < 3; ++r) {
        double q = R[r][0] * p[0] + R[r][1] * p[1] + R[r][2] * p[2];
        pts.push_back(float(scale * q + 0.02 * noise[size_t(i * 3 + r)]));
      }
    }
    // Centre and scale to the unit ball, the usual point-cloud preprocessing.
    const size_t base = size_t(s * n * 3);
    double cen[3] = {0, 0, 0}, rmax = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int r = 0; r < 3; ++r) cen[r] += pts[base + size_t(i * 3 + r)] / double(n);
    for (int64_t i = 0; i < n; ++i) {
      double rr = 0;
      for (int r = 0; r < 3; ++r) rr += std::pow(pts[base + size_t(i * 3 + r)] - cen[r], 2);
      rmax = std::max(rmax, std::sqrt(rr));
    }
    for (int64_t i = 0; i < n; ++i)
      for (int r = 0; r < 3; ++r) pts[base + size_t(i * 3 + r)] = float((pts[base + size_t(i * 3 + r)] - cen[r]) / rmax);
    labels.push_back(cls);
  }
  return {Tensor::from_vector(pts, {count, n, 3}), labels};
}

models::TransformerConfig tiny_text_config(int64_t vocab) {
  models::TransformerConfig c;
  c.vocab_size = vocab;
  c.max_len = 64;
  c.n_layers = 4;  // "4 layers in both encoder and decoder"
  c.n_decoder_layers = 2;
  c.layer.d_model = 32;
  c.layer.n_heads = 4;
  c.layer.d_ff = 64;
  c.layer.dropout = 0.0;
  return c;
}

}  // namespace

TEST_CASE("PointCloudClassifier learns generated shapes (sphere/cube/cylinder/torus) well above chance" * CF_SLOW) {
  const int64_t N = 48, B = 16, STEPS = 400;
  Generator data(123), g(test_seed(5));
  ShapeSet test = make_shapes(64, N, data);
  models::PointCloudClassifier model(tiny_point_options(), g);
  nn::AdamOptions o;
  o.lr = 3e-3;
  nn::Adam opt(model.named_parameters(), o);
  double first = 0, last = 0;
  for (int64_t step = 0; step < STEPS; ++step) {
    ShapeSet batch = make_shapes(B, N, data);  // fresh shapes every step
    Tensor loss = cross_entropy(model.forward(batch.points), ti64(batch.labels, {B}));
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (step == 0) first = loss.item<float>();
    last = loss.item<float>();
  }
  model.eval();
  NoGradGuard ng;
  std::vector<int64_t> pred = argmax(model.forward(test.points), 1).to_vector<int64_t>();
  int64_t correct = 0;
  for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == test.labels[i];
  double acc = double(correct) / double(pred.size());
  MESSAGE("point clouds: loss ", first, " -> ", last, ", held-out accuracy ", acc, " (chance 0.25)");
  CHECK(last < first);
  CHECK(acc >= 0.6);  // chance 0.25; seeds 1-12 gave 0.73-0.91 after 400 steps (0.63-0.91 after 200)
}

TEST_CASE("PointCloudClassifier: the section 3.2 architecture, shapes and costs") {
  Generator g(1);
  models::PointCloudClassifier model(tiny_point_options(), g);
  // Widths 16-32-32-64: projections only where the width changes (16 -> 32, 32 -> 64).
  CHECK(model.width_proj[0] == nullptr);
  CHECK(model.width_proj[1] != nullptr);
  CHECK(model.width_proj[2] == nullptr);
  CHECK(model.width_proj[3] != nullptr);
  CHECK(model.forward(randn({3, 40, 3})).shape() == Shape({3, 4}));
  // The parameter count is the module's, and the MACs grow with the number of
  // points and shrink when the centroid blocks compress harder.
  nn::Cost c40 = model.cost(1, 40), c80 = model.cost(1, 80);
  CHECK(c40.params == model.num_parameters());
  CHECK(c80.macs > c40.macs);
  models::PointCloudOptions harder = tiny_point_options();
  harder.downsample = {1, 4, 1, 4};
  Generator g2(1);
  models::PointCloudClassifier model2(harder, g2);
  CHECK(model2.cost(1, 80).macs < c80.macs);
  CHECK(model2.num_parameters() == model.num_parameters());
  // Switched to neural clustering, blocks of different widths are not linked into a centroid chain (each
  // clusters on its own, as none is linked at construction); the switch failed after switching every block.
  Generator g5(1);
  models::PointCloudClassifier switched(tiny_point_options(), g5);
  CHECK(models::set_attention(switched, nlohmann::json{{"type", "neural-clustering"}, {"clusters", 2}}) > 0);
  CHECK(switched.forward(randn({2, 40, 3})).shape() == Shape({2, 4}));
  // Every LeakyReLU takes the configured slope at full precision (a slope of 1e-7 was written with six
  // decimals into the activation's name, and became 0).
  models::PointCloudOptions tiny_slope = tiny_point_options();
  tiny_slope.negative_slope = 1e-7;
  Generator g4(1);
  models::PointCloudClassifier sloped(tiny_slope, g4);
  int64_t leaky = 0;
  for (auto& [name, m] : sloped.named_modules())
    if (auto* act = dynamic_cast<nn::LeakyReLU*>(m)) {
      ++leaky;
      CHECK_MESSAGE(act->forward(Tensor::scalar(-1.0, kFloat64)).item() == doctest::Approx(-1e-7).epsilon(1e-12), name);
    }
  CHECK(leaky > 0);
  // The paper's configuration (widths 64-128-128-512, K = 40) on 1024 points.
  Generator g3(1);
  models::PointCloudOptions paper;
  models::PointCloudClassifier full(paper, g3);
  nn::Cost cp = full.cost(1, 1024);
  MESSAGE("paper-size point-cloud model at N = 1024: ", double(cp.params) / 1e6, " M params, ", double(cp.macs) / 1e9,
          " G MACs");
  CHECK(cp.macs > 0);
}

TEST_CASE("PointCloudClassifier with K-Means centroids (Table 3's baseline): same weights as FPS, own centroids") {
  models::PointCloudOptions o = tiny_point_options();
  Generator g1(1), g2(1);
  models::PointCloudClassifier fps(o, g1);
  o.init = "kmeans";
  models::PointCloudClassifier km(o, g2);
  CHECK(km.num_parameters() == fps.num_parameters());
  Tensor pts = randn({2, 40, 3});
  Tensor yk = km.forward(pts), yf = fps.forward(pts);
  CHECK(yk.shape() == Shape({2, 4}));
  // Identical weights: only the centroids' initialisation (and the xyz that the next
  // block and the up-sampling read) differ.
  CHECK(amax(abs(yk - yf)).item<float>() > 1e-6f);
  // The first centroid block alone: 40 points -> 20 centroids, each at its cluster's
  // mean in xyz, so inside the cloud's bounding box.
  nn::CentroidBlockOutput c = km.centroid_blocks[1]->forward(randn({2, 40, 32}), Tensor(), pts);
  CHECK(c.u.shape() == Shape({2, 20, 32}));
  CHECK(c.positions.shape() == Shape({2, 20, 3}));
  CHECK(amax(c.positions).item<float>() <= amax(pts).item<float>());
  CHECK(amin(c.positions).item<float>() >= amin(pts).item<float>());
  // Gradients reach the embedding through the K-Means means of the features.
  sum(yk).backward();
  CHECK(km.embed->weight.grad().defined());
  CHECK(amax(abs(km.embed->weight.grad())).item<float>() > 0);
  // The Lloyd steps cost selection MACs on top of FPS's.
  CHECK(km.cost(1, 40).selection_macs > fps.cost(1, 40).selection_macs);
}

TEST_CASE("CentroidTransformerEncoder: the sequence shortens at each centroid block, masks follow") {
  models::CentroidTransformerOptions o;
  o.layer.d_model = 16;
  o.layer.n_heads = 2;
  o.layer.d_ff = 32;
  o.layer.dropout = 0.0;
  o.blocks = {"self", "centroid", "self", "centroid"};
  o.centroid.init = "mean";
  o.centroid.downsample = 2;
  Generator g(3);
  models::CentroidTransformerEncoder enc(o, g);
  Tensor x = randn({2, 12, 16});
  // The last four inputs of row 1 are padding: its windows of padding only become
  // padded centroids (12 -> 6, the last two padded; 6 -> 3, the last one padded).
  std::vector<bool> m(24, false);
  for (int i = 20; i < 24; ++i) m[size_t(i)] = true;
  models::EncoderOutput out = enc.forward(x, Tensor::from_vector(m, {2, 12}));
  CHECK(out.h.shape() == Shape({2, 3, 16}));
  REQUIRE(out.mask.defined());
  CHECK(out.mask.to_vector<bool>() == std::vector<bool>{false, false, false, false, false, true});
  // Padding does not leak: changing padded inputs changes nothing.
  std::vector<float> xv = x.to_vector<float>();
  for (int i = 20; i < 24; ++i)
    for (int d = 0; d < 16; ++d) xv[size_t(i * 16 + d)] = 100.0f;
  models::EncoderOutput out2 = enc.forward(Tensor::from_vector(xv, {2, 12, 16}), Tensor::from_vector(m, {2, 12}));
  check_close(narrow(out2.h, 1, 0, 2), narrow(out.h, 1, 0, 2), 1e-5);
  CHECK_THROWS_MSG(models::CentroidTransformerEncoder([] {
                     models::CentroidTransformerOptions b;
                     b.blocks = {"self", "pool"};
                     return b;
                   }()),
                   ValueError, "[CentroidTransformerEncoder] blocks are \"self\" or \"centroid\", got \"pool\"");
}

TEST_CASE("CentroidSummarizer: decoder cross-attends to N/3 centroids - learns a compression task - half the encoder MACs" * CF_SLOW) {
  const int64_t V = 12, Ns = 18, Nt = 6, B = 16;
  models::CentroidSummarizerConfig c;
  c.base = tiny_text_config(V);
  Generator g(test_seed(11)), data(4);
  models::CentroidSummarizer model(c, g);
  // M = N / 3 centroids, mean-pooled (section 3.1).
  CHECK(model.encode(randint(1, V, {2, Ns}, data)).h.shape() == Shape({2, Ns / 3, 32}));
  // Task: the source spells each summary token three times in a row (with a
  // random filler token in one of the three places); the model must read the
  // summary back from the centroids (teacher forcing, BOS = 1).
  auto batch = [&](Tensor& src, Tensor& tin, Tensor& tout) {
    std::vector<int64_t> sum_tok = randint(3, V, {B, Nt}, data).to_vector<int64_t>();
    std::vector<int64_t> noise_at = randint(0, 3, {B, Nt}, data).to_vector<int64_t>(), in, out, s;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < Nt; ++t) {
        for (int64_t r = 0; r < 3; ++r) s.push_back(r == noise_at[size_t(b * Nt + t)] ? 2 : sum_tok[size_t(b * Nt + t)]);
        in.push_back(t == 0 ? 1 : sum_tok[size_t(b * Nt + t - 1)]);
        out.push_back(sum_tok[size_t(b * Nt + t)]);
      }
    src = ti64(s, {B, Ns});
    tin = ti64(in, {B, Nt});
    tout = ti64(out, {B * Nt});
  };
  nn::AdamOptions ao;
  ao.lr = 3e-3;
  nn::Adam opt(model.named_parameters(), ao);
  double first = 0, last = 0;
  for (int step = 0; step < 120; ++step) {
    Tensor src, tin, tout;
    batch(src, tin, tout);
    Tensor loss = cross_entropy(reshape(model.forward(src, Tensor(), tin), {B * Nt, V}), tout);
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (step == 0) first = loss.item<float>();
    last = loss.item<float>();
  }
  MESSAGE("summariser: loss ", first, " -> ", last, " (uniform: ", std::log(double(V)), ")");
  CHECK(last < 0.5 * first);
  // Cost: the baseline encoder (same sizes, full attention throughout) against the
  // centroid encoder, both counted from their layers at the paper's length 45.
  models::TransformerConfig base = tiny_text_config(V);
  Generator g2(11);
  models::EncoderDecoder baseline(base, g2);
  Tensor src45 = randint(1, V, {1, 45}, data);
  nn::Cost full = nn::measure_cost(baseline, [&] { return std::vector<Tensor>{baseline.encode(src45, Tensor())}; });
  nn::Cost ours = model.encoder_cost(1, 45);
  MESSAGE("encoder MACs at N = 45: baseline ", full.macs, ", centroid ", ours.macs, " (ratio ",
          double(ours.macs) / double(full.macs), ")");
  CHECK(ours.macs < full.macs);
  CHECK(model.cost(1, 45, 10).macs > ours.macs);
  CHECK_THROWS_MSG(model.encode(randn({2, 5})), ValueError, "[CentroidSummarizer] src must be int64 (B, N)");
  CHECK_THROWS_MSG(model.forward(ti64({1, 2, 3}, {1, 3}), Tensor(), randn({1, 2})), ValueError,
                   "[CentroidSummarizer] tgt must be int64 (B, N)");
  CHECK_THROWS_MSG(model.encode(ti64({1, 2, 3}, {1, 3}), Tensor::zeros({1, 2}, kBool)), ShapeError,
                   "[CentroidSummarizer] src_mask must be bool (1,3)");
  models::CentroidSummarizerConfig bad = c;
  bad.centroid_layers = {5};
  CHECK_THROWS_MSG(models::CentroidSummarizer{bad}, ValueError,
                   "[CentroidSummarizer] centroid layer 5 out of range for n_layers = 4");
  // Random-sampling centroids: a sampler makes an eval forward repeatable (the global generator made two
  // calls differ), and another sampler state another draw.
  models::CentroidSummarizerConfig rnd = c;
  rnd.centroid.init = "random";
  models::CentroidSummarizer sampled(rnd, g);
  sampled.eval();
  Tensor src = randint(1, V, {2, Ns}, data), tgt = randint(1, V, {2, Nt}, data);
  Generator s1(5), s2(5), s3(6);
  Tensor a = sampled.forward(src, Tensor(), tgt, Tensor(), &s1), b = sampled.forward(src, Tensor(), tgt, Tensor(), &s2);
  check_close(a, b, 0);
  CHECK(max_abs_diff(sampled.forward(src, Tensor(), tgt, Tensor(), &s3), a) > 0);
}

TEST_CASE("CentroidViT: one centroid block quarters the tokens and the MACs drop") {
  models::CentroidViTOptions o;
  o.image_size = 16;
  o.in_channels = 1;
  o.patch_kernel = 4;
  o.patch_stride = 4;
  o.d_model = 16;
  o.n_heads = 2;
  o.d_ff = 32;
  o.n_layers = 4;
  o.centroid_at = 2;
  o.num_classes = 2;
  Generator g(2);
  models::CentroidViT vit(o, g);
  CHECK(vit.num_tokens() == 16);
  CHECK(vit.forward(randn({3, 1, 16, 16})).shape() == Shape({3, 2}));
  models::CentroidViTOptions deit = o;
  deit.centroid_at = 0;
  Generator g2(2);
  models::CentroidViT base(deit, g2);
  nn::Cost cv = vit.cost(1), cb = base.cost(1);
  MESSAGE("ViT MACs: DeiT-like ", cb.macs, ", centroid @2 ", cv.macs);
  CHECK(cv.macs < cb.macs);
  // The overlapping patches of section 3.4 (kernel 4, stride 3, padding 1 here) give more tokens.
  models::CentroidViTOptions ov = o;
  ov.patch_stride = 3;
  ov.patch_padding = 1;
  Generator g3(2);
  models::CentroidViT over(ov, g3);
  CHECK(over.num_tokens() == 25);
  CHECK(over.forward(randn({1, 1, 16, 16})).shape() == Shape({1, 2}));
  // Learns vertical vs horizontal stripes.
  Generator data(8);
  auto batch = [&](int64_t n, Tensor& x, std::vector<int64_t>& y) {
    std::vector<float> px;
    y.clear();
    std::vector<double> ph = rand({n}, kFloat64, data).to_vector<double>();
    std::vector<double> nz = randn({n * 256}, kFloat64, data).to_vector<double>();
    for (int64_t s = 0; s < n; ++s) {
      const bool vertical = s % 2 == 0;
      for (int64_t r = 0; r < 16; ++r)
        for (int64_t c = 0; c < 16; ++c) {
          double t = double(vertical ? c : r);
          px.push_back(float(std::sin(t * 1.3 + 6.0 * ph[size_t(s)]) + 0.3 * nz[size_t(s * 256 + r * 16 + c)]));
        }
      y.push_back(vertical ? 1 : 0);
    }
    x = Tensor::from_vector(px, {n, 1, 16, 16});
  };
  nn::AdamOptions ao;
  ao.lr = 3e-3;
  nn::Adam opt(vit.named_parameters(), ao);
  Tensor x;
  std::vector<int64_t> y;
  for (int step = 0; step < 40; ++step) {
    batch(16, x, y);
    Tensor loss = cross_entropy(vit.forward(x), ti64(y, {16}));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  vit.eval();
  NoGradGuard ng;
  batch(64, x, y);
  std::vector<int64_t> pred = argmax(vit.forward(x), 1).to_vector<int64_t>();
  int64_t correct = 0;
  for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == y[i];
  MESSAGE("ViT stripes: held-out accuracy ", double(correct) / 64.0);
  CHECK(correct >= 56);
  CHECK_THROWS_MSG(vit.forward(randn({1, 3, 16, 16})), ShapeError, "[CentroidViT] expected float images (B, 1, 16, 16)");
  models::CentroidViTOptions bad = o;
  bad.centroid_at = 9;
  CHECK_THROWS_MSG(models::CentroidViT{bad}, ValueError, "[CentroidViT] centroid_at 9 out of range [0, n_layers = 4]");
}

TEST_CASE("PointCloudClassifier and CentroidViT: float64 gradcheck of every parameter (sampling held fixed)") {
  // Their layers are checked one by one; this covers the glue: the KNN mask built from the sampled
  // points, the carried coordinates, the concatenation of every block's features, the patch embedding,
  // the class head. FPS is deterministic, so every evaluation samples the same centroids.
  models::PointCloudOptions po;
  po.num_classes = 3;
  po.widths = {4, 6, 6, 8};
  po.n_heads = 2;
  po.knn = 3;
  po.fuse_dim = 6;
  po.head = {5, 4};
  po.dropout = 0.0;
  Generator g(3);
  models::PointCloudClassifier pc(po, g);
  pc.to(kFloat64);
  pc.eval();
  const Tensor points = leaf64({1, 16, 3}, 9).detach();
  check_module_grad(pc, [&](const std::vector<Tensor>&) { return pc.forward(points); }, {});
  models::CentroidViTOptions vo;
  vo.image_size = 8;
  vo.in_channels = 1;
  vo.patch_kernel = 2;
  vo.patch_stride = 2;
  vo.d_model = 4;
  vo.n_heads = 2;
  vo.d_ff = 6;
  vo.n_layers = 2;
  vo.centroid_at = 1;
  vo.num_classes = 2;
  models::CentroidViT vit(vo, g);
  vit.to(kFloat64);
  vit.eval();
  check_module_grad(vit, [&](const std::vector<Tensor>& xs) { return vit.forward(xs[0]); }, {leaf64({1, 1, 8, 8}, 10)});
}

TEST_CASE("a model's cost leaves the default generator where it was (random centroid draws undone)") {
  models::PointCloudOptions po = tiny_point_options();
  po.init = "random";
  Generator g(4);
  models::PointCloudClassifier pc(po, g);
  manual_seed(11);
  const uint64_t offset = default_generator().offset();
  pc.cost(1, 40);
  CHECK(default_generator().offset() == offset);
  CHECK(default_generator().seed() == 11);
}

TEST_CASE("PointCloudClassifier: bad inputs") {
  Generator g(1);
  models::PointCloudClassifier model(tiny_point_options(), g);
  CHECK_THROWS_MSG(model.forward(randn({2, 10, 2})), ShapeError,
                   "[PointCloudClassifier] expected float points (B, N, 3), got float32 (2,10,2)");
  models::PointCloudOptions o = tiny_point_options();
  o.widths = {16, 32};
  CHECK_THROWS_MSG(models::PointCloudClassifier{o}, ValueError,
                   "[PointCloudClassifier] widths, blocks and downsample need one entry per block, got 2, 4 and 4");
  o = tiny_point_options();
  o.init = "mean";
  CHECK_THROWS_MSG(models::PointCloudClassifier{o}, ValueError,
                   "[PointCloudClassifier] init must be \"fps\", \"random\" or \"kmeans\" (inits that place each "
                   "centroid in xyz), got \"mean\"");
  o = tiny_point_options();
  o.init = "kmeans";
  o.kmeans_iters = 0;
  CHECK_THROWS_MSG(models::PointCloudClassifier{o}, ValueError, "[PointCloudClassifier] kmeans_iters must be >= 1, got 0");
  o = tiny_point_options();
  o.widths = {16, 31, 32, 64};
  CHECK_THROWS_MSG(models::PointCloudClassifier{o}, ValueError, "width 31 of block 2 (1-based) must be a positive multiple of n_heads (2)");
}
