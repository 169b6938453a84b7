// DistributedDataParallel: W processes on shards of a batch end with the
// parameters of one process on the combined batch. Every rank also runs the
// one-process reference itself (same seed), so one mpirun compares both.
#include <algorithm>
#include <cmath>

#include "test_util.h"

using namespace cf;
using namespace cf::test;
namespace d = cf::dist;

namespace {

class Mlp : public nn::Module {
 public:
  Mlp(DType dt, uint64_t seed) {
    Generator g(seed);
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(6, 16, true, g));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 16, true, g));
    head = register_module("head", std::make_shared<nn::Linear>(16, 3, true, g));
    to(dt);
  }
  Tensor forward(const Tensor& x) { return head->forward(tanh(fc2->forward(tanh(fc1->forward(x))))); }
  std::shared_ptr<nn::Linear> fc1, fc2, head;
};

// Largest |a - b| / max(|b|, floor) over all parameters.
double max_rel_diff(nn::Module& a, nn::Module& b, double floor) {
  auto pa = a.parameters(), pb = b.parameters();
  REQUIRE(pa.size() == pb.size());
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    std::vector<double> x = values(pa[i]), y = values(pb[i]);
    for (size_t j = 0; j < x.size(); ++j)
      worst = std::max(worst, std::abs(x[j] - y[j]) / std::max(std::abs(y[j]), floor));
  }
  return worst;
}

// 20 Adam steps of the MLP: the reference on the whole batch of B rows, the
// Largest ||a - b|| / ||b|| over the parameter tensors (float32: rounding of 1e-7
// per operation compounds over 20 steps on elements near zero, which the
// elementwise measure divides by the floor; the tensor norm is the usual measure).
double max_norm_rel_diff(nn::Module& a, nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    std::vector<double> x = values(pa[i]), y = values(pb[i]);
    double num = 0, den = 0;
    for (size_t j = 0; j < x.size(); ++j) {
      num += (x[j] - y[j]) * (x[j] - y[j]);
      den += y[j] * y[j];
    }
    worst = std::max(worst, std::sqrt(num / den));
  }
  return worst;
}

// Every rank holds the same parameters, bit for bit (the all-reduce gives all the same sum).
void check_replicas_agree(nn::Module& m) {
  for (const Tensor& p : m.parameters()) {
    Tensor flat = reshape(p.detach(), {1, p.numel()});
    std::vector<double> all = values(d::all_gather(contiguous(flat)));
    for (int r = 1; r < d::world_size(); ++r)
      for (int64_t j = 0; j < p.numel(); ++j) REQUIRE(all[size_t(r * p.numel() + j)] == all[size_t(j)]);
  }
}

// DDP model on this rank's B / W rows. Returns the largest relative difference
// (elementwise for float64, by tensor norm for float32).
double mlp_run(DType dt, int64_t bucket_bytes, int64_t* buckets) {
  const int R = d::rank(), W = d::world_size();
  const int64_t B = 4 * W;
  auto ref = std::make_shared<Mlp>(dt, 11);
  // Another seed on the DDP replicas: the construction broadcast must fix it.
  auto model = std::make_shared<Mlp>(dt, R == 0 ? 11 : 99);
  nn::DDPOptions o;
  o.bucket_bytes = bucket_bytes;
  nn::DistributedDataParallel ddp(model, o);
  *buckets = ddp.num_buckets();
  CHECK(max_rel_diff(*model, *ref, 1e-3) == 0.0);
  // SGD with momentum: the update is linear in the gradient, so the comparison sees
  // the all-reduce's rounding, not Adam's division by sqrt(v) + eps amplifying it
  // on near-zero gradients.
  nn::SGD opt_ref(ref->named_parameters(), {0.05, 0.9});
  nn::SGD opt(model->named_parameters(), {0.05, 0.9});
  Generator data(5);
  for (int step = 0; step < 20; ++step) {
    Tensor x = randn({B, 6}, dt, data);
    Tensor y = randint(0, 3, {B}, data);
    opt_ref.zero_grad();
    nn::cross_entropy(ref->forward(x), y).backward();
    opt_ref.step();
    opt.zero_grad();
    Tensor xs = narrow(x, 0, R * 4, 4), ys = narrow(y, 0, R * 4, 4);
    nn::cross_entropy(model->forward(xs), ys).backward();
    opt.step();
  }
  check_replicas_agree(*model);
  return dt == kFloat64 ? max_rel_diff(*model, *ref, 1e-3) : max_norm_rel_diff(*model, *ref);
}
}  // namespace

TEST_CASE("ddp: W processes on shards equal one process on the combined batch (MLP, 20 steps)") {
  int64_t buckets = 0;
  // float64: the sum over ranks of per-shard means differs from one mean only by rounding.
  double e64 = mlp_run(kFloat64, 25 << 20, &buckets);
  CHECK(buckets == 1);
  CHECK(e64 <= 1e-12);
  // Small buckets: several all-reduces in flight during backward, same result.
  double e64b = mlp_run(kFloat64, 600, &buckets);
  CHECK(buckets >= 3);
  CHECK(e64b <= 1e-12);
  double e32 = mlp_run(kFloat32, 600, &buckets);
  CHECK(e32 <= 1e-6);
  MESSAGE("DDP vs one process, max relative parameter difference after 20 steps: float64 ", e64, ", float32 ", e32);
}

TEST_CASE("ddp: each rank draws its share of one process's dropout masks (W processes equal one, dropout on)") {
  // Every rank's generator is in the same state; rank r's j-th example got rank 0's j-th mask, so W ranks
  // drew one rank's worth of masks. Now each dropout reserves its counters W times and rank r reads the r-th
  // block: the masks one process draws for the concatenated batch.
  const int R = d::rank(), W = d::world_size();
  CHECK(dropout_share().index == R);
  CHECK(dropout_share().count == W);
  const int64_t B = 4 * W;
  auto ref = std::make_shared<Mlp>(kFloat64, 11);
  auto model = std::make_shared<Mlp>(kFloat64, 11);
  nn::DistributedDataParallel ddp(model, nn::DDPOptions{});
  nn::SGD opt_ref(ref->named_parameters(), {0.05, 0.9});
  nn::SGD opt(model->named_parameters(), {0.05, 0.9});
  auto forward = [](Mlp& m, const Tensor& x, Generator& g) {
    return m.head->forward(tanh(dropout(m.fc2->forward(tanh(m.fc1->forward(x))), 0.4, true, g)));
  };
  Generator data(5), g_ref(8), g_ddp(8);
  for (int step = 0; step < 10; ++step) {
    Tensor x = randn({B, 6}, kFloat64, data);
    Tensor y = randint(0, 3, {B}, data);
    {
      const DropoutShare mine = dropout_share();
      set_dropout_share(0, 1);  // the reference is one process
      opt_ref.zero_grad();
      nn::cross_entropy(forward(*ref, x, g_ref), y).backward();
      opt_ref.step();
      set_dropout_share(mine.index, mine.count);
    }
    opt.zero_grad();
    nn::cross_entropy(forward(*model, narrow(x, 0, R * 4, 4), g_ddp), narrow(y, 0, R * 4, 4)).backward();
    opt.step();
    CHECK(g_ddp.offset() == g_ref.offset());  // the generators stay in step
  }
  check_replicas_agree(*model);
  CHECK(max_rel_diff(*model, *ref, 1e-3) <= 1e-12);
  CHECK_THROWS_MSG(set_dropout_share(2, 2), ValueError, "[set_dropout_share] index must be in [0, count)");
}

TEST_CASE("ddp: no_sync accumulates locally, the next backward averages the sums") {
  const int R = d::rank(), W = d::world_size();
  auto model = std::make_shared<Mlp>(kFloat64, 3);
  nn::DistributedDataParallel ddp(model);
  Generator data(8);
  Tensor x1 = randn({2 * W, 6}, kFloat64, data), x2 = randn({2 * W, 6}, kFloat64, data);
  // Reference: the gradient of one process summing both micro-batches' mean losses.
  auto ref = std::make_shared<Mlp>(kFloat64, 3);
  ref->zero_grad();
  (sum(ref->forward(x1)) / double(2 * W) + sum(ref->forward(x2)) / double(2 * W)).backward();
  model->zero_grad();
  {
    auto guard = ddp.no_sync();
    CHECK_FALSE(ddp.sync_enabled());
    (sum(model->forward(narrow(x1, 0, 2 * R, 2))) / 2.0).backward();
  }
  CHECK(ddp.sync_enabled());
  (sum(model->forward(narrow(x2, 0, 2 * R, 2))) / 2.0).backward();
  auto pr = ref->parameters(), pm = model->parameters();
  for (size_t i = 0; i < pr.size(); ++i) check_close(pm[i].grad(), pr[i].grad(), 1e-12);
}

TEST_CASE("ddp: every attention variant with its auxiliary losses and key padding (float64, 3 steps)") {
  const int R = d::rank(), W = d::world_size();
  for (const std::string& type : nn::attention_types()) {
    CAPTURE(type);
    nlohmann::json j = {{"vocab_size", 12}, {"d_model", 8},    {"n_heads", 2},      {"d_ff", 16},
                        {"n_layers", 1},    {"num_classes", 3}, {"dropout", 0.0},    {"max_len", 16},
                        {"attention", {{"type", type}}}};
    if (type == "neural-clustering") j["attention"]["clusters"] = 2;
    models::TransformerConfig c = models::TransformerConfig::from_json(j);
    auto make = [&](uint64_t seed) {
      Generator g(seed);
      auto m = std::make_shared<models::EncoderClassifier>(c, g);
      m->to(kFloat64);
      return m;
    };
    auto ref = make(4), model = make(4);
    nn::DistributedDataParallel ddp(model);
    nn::SGD opt_ref(ref->named_parameters(), {0.05, 0.9});
    nn::SGD opt(model->named_parameters(), {0.05, 0.9});
    Generator data(6);
    auto loss_of = [](models::EncoderClassifier& m, const Tensor& ids, const Tensor& pad, const Tensor& y) {
      nn::AuxLosses aux;
      Tensor loss = nn::cross_entropy(m.forward(ids, pad, &aux), y);
      std::map<std::string, double> w;
      for (const std::string& n : aux.names()) w[n] = 0.1;
      return aux.empty() ? loss : loss + aux.total(w);
    };
    for (int step = 0; step < 3; ++step) {
      Tensor ids = randint(1, 12, {2 * W, 8}, data);
      Tensor y = randint(0, 3, {2 * W}, data);
      // Key padding of 0-5 positions per example: the ranks' shards hold different numbers of real tokens
      // (routing's commitment loss divided by each rank's own count: another model under DDP)
      Tensor pad = ge(reshape(Tensor::arange(8, kInt64), {1, 8}), reshape(randint(3, 9, {2 * W}, data), {2 * W, 1}));
      // The same random stream for the variants that draw (LSH rotations, ...): each
      // forward starts from one seed, the reference's and every replica's.
      default_generator().manual_seed(100 + uint64_t(step));
      opt_ref.zero_grad();
      loss_of(*ref, ids, pad, y).backward();
      opt_ref.step();
      default_generator().manual_seed(100 + uint64_t(step));
      opt.zero_grad();
      loss_of(*model, narrow(ids, 0, 2 * R, 2), narrow(pad, 0, 2 * R, 2), narrow(y, 0, 2 * R, 2)).backward();
      opt.step();
    }
    check_replicas_agree(*model);
    double e = max_rel_diff(*model, *ref, 1e-3);
    MESSAGE(type, ": max relative parameter difference ", e);
    CHECK(e <= 1e-12);
    // Buffers learned from the data (routing's online K-Means centroids) follow the whole batch
    // too (Module::set_distributed): every rank's equal the one process's. Before, each replica
    // moved them with its own shard, and a rank-0 checkpoint resumed another run.
    // (Memory banks hold each rank's own states by design: their test is in test_data_kmeans.cpp.)
    if (type != "routing") continue;
    nn::StateDict bm = model->named_buffers(), br = ref->named_buffers();
    REQUIRE(bm.size() == br.size());
    int checked = 0;
    for (size_t i = 0; i < bm.size(); ++i)
      if (bm[i].first.find("centroids") != std::string::npos) {
        CAPTURE(bm[i].first);
        check_close(bm[i].second, br[i].second, 1e-12);
        ++checked;
      }
    CHECK(checked == 1);
  }
}

namespace {
// An MLP with a layer its forward never uses, and fc1 frozen when asked.
class MlpWithSpare : public Mlp {
 public:
  MlpWithSpare(uint64_t seed, bool freeze_fc1) : Mlp(kFloat64, seed) {
    Generator g(seed + 1);
    spare = register_module("spare", std::make_shared<nn::Linear>(6, 4, true, g));
    to(kFloat64);
    if (freeze_fc1) {
      fc1->weight.set_requires_grad(false);
      fc1->bias.set_requires_grad(false);
    }
  }
  std::shared_ptr<nn::Linear> spare;
};
}  // namespace

TEST_CASE("ddp: a parameter no rank uses keeps no gradient, a frozen one is left out (AdamW, weight decay)") {
  const int R = d::rank(), W = d::world_size();
  for (bool freeze : {false, true}) {
    CAPTURE(freeze);
    auto ref = std::make_shared<MlpWithSpare>(21, freeze);
    auto model = std::make_shared<MlpWithSpare>(R == 0 ? 21 : 77, freeze);  // the broadcast fixes rank 1's
    nn::DistributedDataParallel ddp(model);
    nn::AdamWOptions ao;
    ao.lr = 0.01;
    ao.weight_decay = 0.1;
    nn::AdamW opt_ref(ref->named_parameters(), ao), opt(model->named_parameters(), ao);
    Generator data(9);
    for (int step = 0; step < 5; ++step) {
      Tensor x = randn({2 * W, 6}, kFloat64, data);
      Tensor y = randint(0, 3, {2 * W}, data);
      opt_ref.zero_grad();
      nn::cross_entropy(ref->forward(x), y).backward();
      opt_ref.step();
      opt.zero_grad();
      nn::cross_entropy(model->forward(narrow(x, 0, 2 * R, 2)), narrow(y, 0, 2 * R, 2)).backward();
      // Unused everywhere: no gradient, as in one process (it was a zero one, which AdamW's decay
      // and moments then moved).
      CHECK_FALSE(model->spare->weight.grad().defined());
      CHECK_FALSE(model->spare->bias.grad().defined());
      if (freeze) CHECK_FALSE(model->fc1->weight.grad().defined());
      opt.step();
    }
    check_replicas_agree(*model);
    CHECK(max_rel_diff(*model, *ref, 1e-3) <= 1e-12);  // spare and frozen fc1 included
  }
}

TEST_CASE("ddp: bad input") {
  CHECK_THROWS_MSG(nn::DistributedDataParallel(nullptr), ValueError, "[DistributedDataParallel] null module");
  nn::DDPOptions o;
  o.bucket_bytes = 0;
  CHECK_THROWS_MSG(nn::DistributedDataParallel(std::make_shared<Mlp>(kFloat32, 1), o), ValueError,
                   "bucket_bytes must be positive");
  if (d::world_size() > 1) {
    // Different models on different ranks: caught before any gradient moves.
    std::shared_ptr<nn::Module> m;
    if (d::rank() == 0)
      m = std::make_shared<Mlp>(kFloat32, 1);
    else
      m = std::make_shared<nn::Linear>(6, 16);
    CHECK_THROWS_MSG(nn::DistributedDataParallel(m), d::DistError, "ranks hold different models");
    // The same model with a parameter frozen on one rank only: its buckets would not match.
    auto mlp = std::make_shared<Mlp>(kFloat32, 1);
    if (d::rank() == 1) mlp->fc1->weight.set_requires_grad(false);
    CHECK_THROWS_MSG(nn::DistributedDataParallel(mlp), d::DistError, "ranks hold different models");
  }
}

// A rank whose shard has no token (N = 0) returned before the centroid update: the other ranks' all-reduces
// waited for it (a hang), and its centroids stayed behind. It now adds zero sums and counts, so every rank keeps
// the centroids of one process that saw only the tokens there were.
TEST_CASE("routing: a rank with no token joins the distributed centroid update") {
  const int R = d::rank();
  nn::RoutingAttention ref(2, 4, 3, /*local_heads=*/0, 0, /*decay=*/0.9, 0.0, /*seed=*/5);
  nn::RoutingAttention mine(2, 4, 3, 0, 0, 0.9, 0.0, 5);
  ref.to(kFloat64);
  mine.to(kFloat64);
  mine.set_distributed(true);
  const Tensor before = clone(mine.centroids());
  for (int step = 0; step < 2; ++step) {
    const Tensor x = leaf64({1, 2, 6, 4}, 30 + uint64_t(step)).detach();  // rank 0's shard: every token
    nn::AttentionArgs a;
    a.q = a.k = a.v = x;
    ref.forward(a);
    nn::AttentionArgs e = a;
    if (R != 0) e.q = e.k = e.v = Tensor::zeros({1, 2, 0, 4}, kFloat64);
    CHECK(mine.forward(e).shape() == (R == 0 ? Shape{1, 2, 6, 4} : Shape{1, 2, 0, 4}));
  }
  check_close(mine.centroids(), ref.centroids(), 1e-12);
  CHECK(max_abs_diff(mine.centroids(), before) > 1e-3);  // they did move
}
