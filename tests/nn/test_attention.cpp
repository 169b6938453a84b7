#include <cmath>

#include "models/transformer.h"
#include "nn/nn_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

// Softmax attention written out element by element: the reference of the reference.
std::vector<double> naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                    bool causal) {
  const Shape &sq = q.shape(), &sk = k.shape(), &sv = v.shape();
  const int64_t B = sq[0], H = sq[1], Nq = sq[2], D = sq[3], Nk = sk[2], Dv = sv[3];
  auto qv = values(q), kv = values(k), vv = values(v);
  std::vector<bool> pad(size_t(B * Nk), false);
  if (kpm.defined()) {
    auto m = kpm.to_vector<bool>();
    for (size_t i = 0; i < m.size(); ++i) pad[i] = m[i];
  }
  std::vector<double> out(size_t(B * H * Nq * Dv), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Nq; ++i) {
        std::vector<double> s(size_t(Nk), -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < Nk; ++j) {
          if (pad[size_t(b * Nk + j)] || (causal && j > i + (Nk - Nq))) continue;
          double acc = 0;
          for (int64_t d = 0; d < D; ++d)
            acc += qv[size_t(((b * H + h) * Nq + i) * D + d)] * kv[size_t(((b * H + h) * Nk + j) * D + d)];
          s[size_t(j)] = acc / std::sqrt(double(D));
          mx = std::max(mx, s[size_t(j)]);
        }
        if (mx == -INFINITY) continue;  // nothing to attend to: zeros
        double z = 0;
        for (auto& e : s) z += (e = std::exp(e - mx));
        for (int64_t j = 0; j < Nk; ++j)
          for (int64_t d = 0; d < Dv; ++d)
            out[size_t(((b * H + h) * Nq + i) * Dv + d)] +=
                s[size_t(j)] / z * vv[size_t(((b * H + h) * Nk + j) * Dv + d)];
      }
  return out;
}

nn::AttentionArgs args_of(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm, bool causal) {
  nn::AttentionArgs a;
  a.q = q;
  a.k = k;
  a.v = v;
  a.key_padding_mask = kpm;
  a.causal = causal;
  return a;
}

}  // namespace

TEST_CASE("full attention equals the element-wise reference with padding and causal masks") {
  nn::FullAttention att;
  Tensor q = leaf64({2, 2, 5, 3}, 1), k = leaf64({2, 2, 5, 3}, 2), v = leaf64({2, 2, 5, 4}, 3);
  // Batch 1 has its last two keys padded; in the causal case query 0 of batch... all queries see key 0.
  Tensor kpm = Tensor::from_vector(std::vector<bool>{false, false, false, false, false, false, false, false, true, true},
                                   {2, 5});
  for (bool causal : {false, true})
    for (bool masked : {false, true}) {
      Tensor m = masked ? kpm : Tensor();
      Tensor y = att.forward(args_of(q, k, v, m, causal));
      auto ref = naive_attention(q, k, v, m, causal);
      auto got = values(y);
      REQUIRE(got.size() == ref.size());
      for (size_t i = 0; i < ref.size(); ++i) CHECK(got[i] == doctest::Approx(ref[i]).epsilon(1e-12));
      GradcheckResult r = gradcheck(
          [&](const std::vector<Tensor>& xs) { return att.forward(args_of(xs[0], xs[1], xs[2], m, causal)); },
          {q, k, v});
      CHECK_MESSAGE(r.ok, r.message);
    }
  // Cross-attention with Nq != Nk under the causal rule: queries align with the last keys.
  Tensor q2 = leaf64({1, 1, 2, 3}, 4), k2 = leaf64({1, 1, 4, 3}, 5), v2 = leaf64({1, 1, 4, 2}, 6);
  auto got = values(att.forward(args_of(q2, k2, v2, Tensor(), true)));
  auto ref = naive_attention(q2, k2, v2, Tensor(), true);
  for (size_t i = 0; i < ref.size(); ++i) CHECK(got[i] == doctest::Approx(ref[i]).epsilon(1e-12));
}

TEST_CASE("full attention with dropout in training runs the fused kernel and drops the dense path's weights") {
  nn::FullAttention att(0.3);
  att.train();
  Tensor q = leaf64({2, 2, 6, 3}, 1), k = leaf64({2, 2, 7, 3}, 2), v = leaf64({2, 2, 7, 4}, 3);
  Tensor kpm = Tensor::from_vector(std::vector<bool>{false, false, false, false, false, false, false,  //
                                                     false, false, false, false, false, true, true},
                                   {2, 7});
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    default_generator().set_state(123, 777);  // mid-stream, as in training
    Tensor y = att.forward(args_of(q, k, v, kpm, causal));
    CHECK(graph_has(y, "flash_attention"));
    sum(y * y).backward();
    std::vector<double> dq = values(q.grad()), dk = values(k.grad()), dv = values(v.grad());
    q.zero_grad();
    v.zero_grad();
    k.zero_grad();
    default_generator().set_state(123, 777);
    nn::AttentionArgs a = args_of(q, k, v, kpm, causal);
    Tensor ref = nn::dense_attention(q, k, v, nn::dense_block_mask(a), 1.0 / std::sqrt(3.0), 0.3, true);
    sum(ref * ref).backward();
    const std::vector<double> got = values(y), want = values(ref), rq = values(q.grad()), rk = values(k.grad()),
                              rv = values(v.grad());
    for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-12));
    for (size_t i = 0; i < dq.size(); ++i) CHECK(dq[i] == doctest::Approx(rq[i]).epsilon(1e-12));
    for (size_t i = 0; i < dk.size(); ++i) CHECK(dk[i] == doctest::Approx(rk[i]).epsilon(1e-12));
    for (size_t i = 0; i < dv.size(); ++i) CHECK(dv[i] == doctest::Approx(rv[i]).epsilon(1e-12));
    q.zero_grad();
    v.zero_grad();
    k.zero_grad();
  }
  att.eval();  // out of training: no dropout, the plain kernel
  const std::vector<double> ev = values(att.forward(args_of(q, k, v, kpm, false))),
                            plain = values(flash_attention(q, k, v, kpm));
  CHECK(ev == plain);
}

TEST_CASE("a query with every key masked outputs zeros and passes a zero gradient") {
  nn::FullAttention att;
  Tensor q = leaf64({1, 1, 2, 3}, 1), k = leaf64({1, 1, 2, 3}, 2), v = leaf64({1, 1, 2, 3}, 3);
  Tensor all = Tensor::from_vector(std::vector<bool>{true, true}, {1, 2});
  Tensor y = att.forward(args_of(q, k, v, all, false));
  CHECK(values(y) == std::vector<double>(6, 0.0));
  sum(y).backward();
  CHECK(values(v.grad()) == std::vector<double>(6, 0.0));
  CHECK(values(q.grad()) == std::vector<double>(6, 0.0));
  // softmax itself: an all -inf row is zeros, a NaN still propagates.
  CHECK(values(softmax(t64({-INFINITY, -INFINITY}, {2}))) == std::vector<double>{0, 0});
  CHECK(std::isnan(values(softmax(t64({-INFINITY, NAN}, {2})))[0]));
}

TEST_CASE("causal attention: no query sees a later position") {
  nn::FullAttention att;
  Tensor q = leaf64({1, 1, 6, 4}, 1), k = leaf64({1, 1, 6, 4}, 2), v = leaf64({1, 1, 6, 4}, 3);
  auto base = values(att.forward(args_of(q, k, v, Tensor(), true)));
  // Change key and value 4: outputs 0..3 must not move, output 4 must.
  Tensor k2 = clone(k.detach()), v2 = clone(v.detach());
  {
    NoGradGuard ng;
    Tensor kr = narrow(k2, 2, 4, 1), vr = narrow(v2, 2, 4, 1);
    fill_(kr, 3.0);
    fill_(vr, -2.0);
  }
  auto moved = values(att.forward(args_of(q, k2, v2, Tensor(), true)));
  for (size_t i = 0; i < 16; ++i) CHECK(moved[i] == base[i]);
  CHECK(moved[16] != base[16]);
}

TEST_CASE("attention argument checks name the variant and the shapes") {
  nn::FullAttention att;
  Tensor q = leaf64({1, 2, 3, 4}), k = leaf64({1, 2, 5, 4}), v = leaf64({1, 2, 5, 2});
  CHECK_THROWS_MSG(att.forward(args_of(q, leaf64({1, 2, 5, 3}), v, Tensor(), false)), ShapeError,
                   "[FullAttention] inconsistent shapes: q (1,2,3,4), k (1,2,5,3)");
  CHECK_THROWS_MSG(att.forward(args_of(reshape(q, {2, 3, 4}), k, v, Tensor(), false)), ShapeError,
                   "[FullAttention] expected q (B, H, Nq, Dk)");
  CHECK_THROWS_MSG(att.forward(args_of(q, k, v, Tensor::zeros({1, 5}), false)), DTypeError,
                   "key_padding_mask must be bool");
  CHECK_THROWS_MSG(att.forward(args_of(q, k, v, Tensor::from_vector(std::vector<bool>{true}, {1, 1}), false)),
                   ShapeError, "key_padding_mask must be (B, N) = (1, 5), got (1,1)");
  CHECK_THROWS_MSG(att.forward(args_of(q, k, to(v, kFloat32), Tensor(), false)), DTypeError,
                   "must share one float dtype");
  // dense_attention's blocked mask: named by the op, against the scores' shape (it failed inside [masked_fill])
  CHECK_THROWS_MSG(nn::dense_attention(q, k, v, Tensor::zeros({3, 3}, kBool), 0.5), ShapeError,
                   "[dense_attention] blocked must be bool broadcastable to the scores (B, H, Nq, Nk) = (1,2,3,5)",
                   "got bool (3,3)");
  CHECK_THROWS_MSG(nn::dense_attention(q, k, v, Tensor::zeros({3, 5}), 0.5), ShapeError, "blocked must be bool");
  check_close(nn::dense_attention(q, k, v, Tensor::zeros({1, 1, 3, 5}, kBool), 0.5),
              nn::dense_attention(q, k, v, Tensor(), 0.5), 0);
}

TEST_CASE("make_attention builds by name and checks options") {
  nn::AttentionSpec spec;
  spec.d_model = 8;
  spec.n_heads = 2;
  CHECK(nn::make_attention(spec)->type() == "full");
  spec.options = nn::Config(nlohmann::json{{"dropout", 0.1}}, "attention");
  CHECK(nn::make_attention(spec)->type() == "full");
  spec.options = nn::Config(nlohmann::json{{"dropuot", 0.1}}, "attention");
  CHECK_THROWS_MSG(nn::make_attention(spec), ValueError, "unknown key", "attention.dropuot");
  spec.options = nn::Config(nlohmann::json{{"dropout", "high"}}, "attention");
  CHECK_THROWS_MSG(nn::make_attention(spec), ValueError, "attention.dropout");
  spec.options = nn::Config(nlohmann::json::object(), "attention");
  spec.type = "fancy";
  CHECK_THROWS_MSG(nn::make_attention(spec), ValueError, "[make_attention] unknown attention type 'fancy'", "full");
  spec.type = "full";
  spec.n_heads = 3;
  CHECK_THROWS_MSG(nn::make_attention(spec), ValueError, "d_model (8) must be a positive multiple of n_heads (3)");
  CHECK_THROWS_MSG(nn::FullAttention(1.0), ValueError, "[FullAttention] dropout must be in [0, 1)");
}

// models::padding_mask hands every layer a mask even when no id is padding (deciding to drop it would read the ids
// back from a GPU on every forward, issue 25), so every variant must treat an all-false mask as no mask.
TEST_CASE("every registered attention variant: a padding mask with nothing padded is no mask") {
  const int64_t B = 2, H = 2, N = 16, D = 4;
  int compared = 0;
  for (const std::string& type : nn::attention_types())
    for (bool causal : {false, true}) {
      if (type == "clustered" && causal) continue;  // refuses causal masks
      INFO(type, causal ? " (causal)" : "");
      nn::AttentionSpec spec = small_attention_spec(type, H * D, H);
      std::shared_ptr<nn::Attention> att = nn::make_attention(spec);
      att->to(kFloat64);
      att->eval();
      nn::AttentionArgs a;
      a.q = leaf64({B, H, N, D}, 1);
      a.k = att->shares_qk() ? a.q : leaf64({B, H, N, D}, 2);
      a.v = leaf64({B, H, N, D}, 3);
      a.query_input = leaf64({B, N, H * D}, 4);
      a.causal = causal;
      Tensor plain = att->forward(a);
      a.key_padding_mask = a.query_padding_mask = Tensor::zeros({B, N}, kBool);
      check_close(att->forward(a), plain, 1e-12);
      ++compared;
    }
  CHECK(compared == 2 * int(nn::attention_types().size()) - 1);
  CHECK(models::padding_mask(ti64({1, 2, 3}, {1, 3}), 0).to_vector<bool>() == std::vector<bool>{false, false, false});
  CHECK_FALSE(models::padding_mask(ti64({1, 0, 3}, {1, 3}), -1).defined());
}

// Every registered variant, built small (small_attention_spec) in float64, handed to run(attention) in eval and then
// in training mode.
template <class F>
void each_variant_in_both_modes(int64_t heads, int64_t head_dim, F&& run) {
  for (const std::string& type : nn::attention_types()) {
    INFO(type);
    std::shared_ptr<nn::Attention> att = nn::make_attention(small_attention_spec(type, heads * head_dim, heads));
    att->to(kFloat64);
    for (bool training : {false, true}) {
      INFO((training ? "training" : "eval"));
      att->train(training);
      run(*att);
    }
  }
}

TEST_CASE("every registered attention variant and a 2-layer model of each take an empty sequence") {
  // Cluster-Former refused N = 0 ("[kmeans_assign] empty input"); a neural-clustering stack failed
  // at its second layer ("ran before layer 0"): the first returned before handing C^ on.
  const int64_t B = 2, H = 2, D = 4;
  each_variant_in_both_modes(H, D, [&](nn::Attention& att) {
    nn::AttentionArgs a;
    a.q = a.k = a.v = Tensor::zeros({B, H, 0, D}, kFloat64);
    a.query_input = Tensor::zeros({B, 0, H * D}, kFloat64);
    CHECK(att.forward(a).shape() == Shape{B, H, 0, D});
  });
  for (const std::string& type : nn::attention_types()) {
    INFO(type);
    nlohmann::json j = {{"vocab_size", 12}, {"d_model", 8},     {"n_heads", 2},   {"d_ff", 16},
                        {"n_layers", 2},    {"num_classes", 3}, {"dropout", 0.0}, {"max_len", 16},
                        {"attention", {{"type", type}}}};
    if (type == "neural-clustering") j["attention"]["clusters"] = 2;
    Generator g(1);
    models::EncoderClassifier model(models::TransformerConfig::from_json(j), g);
    for (bool training : {false, true}) {
      model.train(training);
      Tensor logits = model.forward(Tensor::zeros({2, 0}, kInt64));
      CHECK(logits.shape() == Shape{2, 3});
    }
  }
}

TEST_CASE("every registered attention variant takes an empty batch, its auxiliary losses too") {
  // Neural clustering's losses took the mean over no row ("[mean] cannot reduce an empty axis", under aux).
  const int64_t H = 2, N = 6, D = 4;
  each_variant_in_both_modes(H, D, [&](nn::Attention& att) {
    nn::AuxLosses aux;
    nn::AttentionArgs a;
    a.q = a.k = a.v = Tensor::zeros({0, H, N, D}, kFloat64);
    a.query_input = Tensor::zeros({0, N, H * D}, kFloat64);
    a.aux = &aux;
    CHECK(att.forward(a).shape() == Shape{0, H, N, D});
    for (const std::string& name : aux.names())
      for (const Tensor& l : aux.get(name)) CHECK(std::isfinite(values(l)[0]));
    // no features is refused by name (the default scale 1/sqrt(0) was refused by a kernel as "scale ... inf")
    nn::AttentionArgs none;
    none.q = none.k = none.v = Tensor::zeros({1, H, N, 0}, kFloat64);
    none.query_input = Tensor::zeros({1, N, H * D}, kFloat64);
    CHECK_THROWS_MSG(att.forward(none), ShapeError, "no features (Dk = 0");
  });
}

TEST_CASE("the block and routed attention variants take attention dropout: in training only, inside the kernel, bad rates named") {
  const int64_t B = 2, H = 2, N = 16, D = 4;
  for (const std::string type : {"neural-clustering", "lsh", "cluster-former", "routing", "sparse"}) {
    INFO(type);
    const bool routed = type == "routing" || type == "sparse";
    auto build = [&](const nlohmann::json& rate) {
      nn::AttentionSpec spec = small_attention_spec(type, H * D, H);
      nlohmann::json o = spec.options.raw();
      o["dropout"] = rate;
      spec.options = nn::Config(o, "attention");
      Generator g(3);  // the same initial state (centroids, memory bank) for every rate
      spec.gen = &g;
      std::shared_ptr<nn::Attention> att = nn::make_attention(spec);
      att->to(kFloat64);
      return att;
    };
    nn::AttentionArgs a;
    a.q = leaf64({B, H, N, D}, 1);
    a.k = type == "lsh" ? a.q : leaf64({B, H, N, D}, 2);
    a.v = leaf64({B, H, N, D}, 3);
    a.query_input = leaf64({B, N, H * D}, 4);
    auto none = build(0.0), half = build(0.5);
    none->eval();
    half->eval();
    const Tensor plain = none->forward(a);
    check_close(half->forward(a), plain, 1e-12);  // out of training the rate plays no part
    none->train();
    half->train();
    const Tensor kept = none->forward(a), dropped = half->forward(a);
    CHECK(graph_has(dropped, routed ? "routed_attention" : "block_attention"));  // inside the kernel: no dense weights
    CHECK_FALSE(graph_has(dropped, "softmax"));
    CHECK_FALSE(graph_has(dropped, "dropout"));
    CHECK(max_abs_diff(dropped, kept) > 0.01);
    CHECK_THROWS_MSG(build(1.0), ValueError, "dropout must be in [0, 1), got 1");
  }
}

TEST_CASE("MultiHeadAttention: names, reference, padding, gradcheck") {
  Generator g(7);
  nn::MultiHeadAttention mha(8, 2, std::make_shared<nn::FullAttention>(), g);
  std::vector<std::string> names;
  for (auto& e : mha.named_parameters()) names.push_back(e.first);
  CHECK(names == std::vector<std::string>{"w_q.weight", "w_q.bias", "w_k.weight", "w_k.bias", "w_v.weight",
                                          "w_v.bias", "w_o.weight", "w_o.bias"});
  mha.to(kFloat64);
  Tensor x = leaf64({2, 4, 8}, 3);
  // Against the plain formula: concat_h softmax(Q_h K_h^T / sqrt(4)) V_h, then W_o.
  {
    Tensor q = mha.w_q->forward(x), k = mha.w_k->forward(x), v = mha.w_v->forward(x);
    auto heads = [](const Tensor& t) { return permute(reshape(t, {2, 4, 2, 4}), {0, 2, 1, 3}); };
    auto ref = naive_attention(heads(q), heads(k), heads(v), Tensor(), false);
    Tensor merged = reshape(permute(t64(ref, {2, 2, 4, 4}), {0, 2, 1, 3}), {2, 4, 8});
    check_close(mha(x), mha.w_o->forward(merged), 1e-12);
  }
  // Padding: a padded token changes nothing for the others.
  Tensor mask = Tensor::from_vector(std::vector<bool>{false, false, false, true, false, false, false, false}, {2, 4});
  Tensor y = mha(x, mask);
  Tensor x2 = clone(x.detach());
  {
    NoGradGuard ng;
    Tensor row = narrow(narrow(x2, 0, 0, 1), 1, 3, 1);
    fill_(row, 5.0);
  }
  Tensor y2 = mha(x2, mask);
  check_close(narrow(narrow(y2, 0, 0, 1), 1, 0, 3), narrow(narrow(y, 0, 0, 1), 1, 0, 3), 1e-12);
  check_module_grad(mha, [&](const std::vector<Tensor>& xs) { return mha(xs[0], mask, true); }, {leaf64({2, 4, 8}, 4)});
  // Cross-attention with a different key length.
  check_module_grad(
      mha, [&](const std::vector<Tensor>& xs) { return mha.forward(xs[0], xs[1], xs[1]); },
      {leaf64({1, 2, 8}, 5), leaf64({1, 3, 8}, 6)});
  CHECK_THROWS_MSG(mha(leaf64({2, 4, 6})), ShapeError, "[MultiHeadAttention] expected query (B, Nq, 8)");
  CHECK_THROWS_MSG(nn::MultiHeadAttention(8, 3, std::make_shared<nn::FullAttention>()), ValueError,
                   "d_model (8) must be a positive multiple of n_heads (3)");
  CHECK_THROWS_MSG(nn::MultiHeadAttention(8, 2, nullptr), ValueError, "attention is null");
}

TEST_CASE("shared_qk: any variant reads its keys from the queries' projection, and MultiHeadAttention drops w_k") {
  Generator g(7);
  nn::AttentionSpec spec;
  spec.d_model = 8;
  spec.n_heads = 2;
  spec.options = nn::Config(nlohmann::json{{"shared_qk", true}}, "attention");
  std::shared_ptr<nn::Attention> shared = nn::make_attention(spec);
  CHECK(shared->type() == "full");
  CHECK(shared->shares_qk());
  nn::MultiHeadAttention mha(8, 2, shared, g);
  std::vector<std::string> names;
  for (auto& e : mha.named_parameters()) names.push_back(e.first);
  CHECK(names == std::vector<std::string>{"w_q.weight", "w_q.bias", "w_v.weight", "w_v.bias", "w_o.weight",
                                          "w_o.bias"});
  mha.to(kFloat64);
  Tensor x = leaf64({2, 4, 8}, 3);
  {  // softmax(Q_h Q_h^T / sqrt(4)) V_h: the keys are the queries
    Tensor q = mha.w_q->forward(x), v = mha.w_v->forward(x);
    auto heads = [](const Tensor& t) { return permute(reshape(t, {2, 4, 2, 4}), {0, 2, 1, 3}); };
    auto ref = naive_attention(heads(q), heads(q), heads(v), Tensor(), false);
    Tensor merged = reshape(permute(t64(ref, {2, 2, 4, 4}), {0, 2, 1, 3}), {2, 4, 8});
    check_close(mha(x), mha.w_o->forward(merged), 1e-12);
  }
  // Another variant told to share takes its place (clustered attention standing in for a shared-full model);
  // one that does not share cannot, and LSH shares whatever the option says.
  spec.type = "clustered";
  spec.options = nn::Config(nlohmann::json{{"shared_qk", true}, {"clusters", 2}}, "attention");
  mha.set_attention(nn::make_attention(spec));
  CHECK(mha(x).shape() == Shape{2, 4, 8});
  spec.options = nn::Config(nlohmann::json{{"clusters", 2}}, "attention");
  CHECK_THROWS_MSG(mha.set_attention(nn::make_attention(spec)), ValueError,
                   "[MultiHeadAttention] set_attention: 'clustered' and 'clustered' disagree on sharing queries and keys");
  spec.type = "lsh";
  spec.options = nn::Config(nlohmann::json{{"shared_qk", false}}, "attention");
  CHECK(nn::make_attention(spec)->shares_qk());
  spec.options = nn::Config(nlohmann::json{{"shared_qk", "yes"}}, "attention");
  CHECK_THROWS_MSG(nn::make_attention(spec), ValueError, "attention.shared_qk");
  CHECK_THROWS_MSG(mha.forward(x, leaf64({2, 4, 8}, 5), leaf64({2, 4, 8}, 5)), ValueError,
                   "[MultiHeadAttention] attention 'clustered' shares queries and keys, so it only supports "
                   "self-attention");
}

TEST_CASE("measure_cost: the fused attention kernels count the MACs of the matmuls they replace") {
  // flash_attention and block_attention are one node each, not matmuls; a model's
  // MAC count (Centroid Transformers' tables) must not change with the path.
  const int64_t B = 2, H = 3, Nq = 5, Nk = 7, Dk = 4, Dv = 6;
  Tensor q = leaf64({B, H, Nq, Dk}, 1), k = leaf64({B, H, Nk, Dk}, 2), v = leaf64({B, H, Nk, Dv}, 3);
  nn::Linear unused(1, 1);
  auto macs = [&](const std::function<Tensor()>& f) {
    return nn::measure_cost(unused, [&] { return std::vector<Tensor>{f()}; }).macs;
  };
  const int64_t dense = macs([&] { return matmul(softmax(matmul(q, transpose(k, -2, -1))), v); });
  CHECK(dense == B * H * Nq * Nk * (Dk + Dv));
  CHECK(macs([&] { return flash_attention(q, k, v); }) == dense);
  CHECK(macs([&] { return flash_attention(q, k, v, Tensor(), 0.0, true); }) == dense);
  // Gathered blocks: C = 2 chunks of w = 4 slots (two empty), each chunk seeing
  // itself and the one before: every query slot against 2 w key slots.
  const int64_t N = 6, C = 2, w = 4;
  Tensor qb = leaf64({B, H, N, Dk}, 4), kb = leaf64({B, H, N, Dk}, 5), vb = leaf64({B, H, N, Dv}, 6);
  Tensor members = ti64({0, 2, 4, -1, 1, 3, 5, -1, 5, 4, 3, 2, 1, 0, -1, -1}, {B, 1, C, w});
  BlockAttentionOptions o;
  o.look_back = 1;
  CHECK(macs([&] { return block_attention(qb, kb, vb, members, Tensor(), o).out; }) ==
        B * H * C * w * (2 * w) * (Dk + Dv));
  // A whole MultiHeadAttention over FullAttention: 4 projections and the two products.
  const int64_t D = 8, heads = 2, L = 5;
  Generator g(3);
  nn::MultiHeadAttention mha(D, heads, std::make_shared<nn::FullAttention>(), g);
  Tensor x = randn({B, L, D});
  CHECK(nn::measure_cost(mha, [&] { return std::vector<Tensor>{mha(x)}; }).macs ==
        B * (4 * L * D * D + 2 * heads * L * L * (D / heads)));
}
