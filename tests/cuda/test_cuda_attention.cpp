// The attention variants and clustering layers on CUDA: each either gives the
// CPU's result (forward and input gradients, with padding, causal where the
// variant supports it) or refuses with an error that says it runs on the CPU
// only. Never a crash, never a silent wrong answer.
#include "cuda/cuda_test_util.h"
#include "nn/attention/attention.h"
#include "nn/attention/centroid.h"
#include "nn/attention/routing.h"
#include "models/centroid_transformer.h"
#include "models/cluster_former.h"
#include "models/point_cloud_test_util.h"
#include "nn/clustering/memory_bank.h"
#include "nn/losses.h"

#include <functional>

using namespace cf;
using namespace cf::test;

namespace {

// An error that names the CPU-only piece ("runs on the CPU only").
void check_cpu_only_refusal(const std::string& what, const std::string& type) {
  INFO("attention ", type, " on CUDA threw: ", what);
  CHECK(what.find("CPU only") != std::string::npos);
  CHECK(what.find("[") == 0);  // names the op
}

// Issue 25's measured residency: the host round trips of `pass` (a forward and a
// backward) after one warm-up call of it (allocator blocks, cuBLAS handles, tables
// built once per size). Printed with the kernel launches, for the launch budget.
cuda::TransferStats round_trips(const std::string& what, const std::function<void()>& pass) {
  pass();
  cuda::synchronize();
  const cuda::TransferStats before = cuda::transfer_stats();
  pass();
  const cuda::TransferStats d = cuda::transfer_stats() - before;
  MESSAGE(what, ": ", d.device_to_host, " device-to-host copies (", d.device_to_host_bytes, " bytes), ",
          d.host_to_device, " host-to-device copies, ", d.synchronizations, " synchronizations, ", d.kernel_launches,
          " kernel launches per forward + backward");
  return d;
}

// The host neither reads nor waits (a pageable host-to-device copy waits for the stream too).
void check_no_round_trip(const cuda::TransferStats& d) {
  CHECK(d.device_to_host == 0);
  CHECK(d.host_to_device == 0);
  CHECK(d.synchronizations == 0);
}

// Leaves on the device (a moved CPU leaf would copy its gradient back to the host).
Tensor device_leaf(const Tensor& t) { return cuda0(t.detach()).set_requires_grad(true); }

}  // namespace

TEST_SUITE("cuda/attention") {

CUDA_TEST_CASE("every attention variant of the registry runs on CUDA like on the CPU, or refuses by name") {
  const int64_t B = 2, H = 2, N = 24, Dh = 8, D = H * Dh;
  // Every variant with its defaults (neural clustering requires k: 4 clusters, so
  // 4 blocks of 6 and the look-back gather), plus LSH with buckets of 4 (6 chunks)
  // so its chunked path runs too.
  std::vector<std::pair<std::string, nlohmann::json>> variants;
  for (const std::string& type : nn::attention_types())
    variants.push_back({type, type == "neural-clustering" ? nlohmann::json{{"clusters", 4}} : nlohmann::json::object()});
  variants.push_back({"lsh", {{"bucket_size", 4}}});
  int matched = 0;
  for (const auto& [type, options] : variants) {
    for (bool causal : {false, true}) {
      INFO("attention ", type, " ", options.dump(), causal ? " (causal)" : "");
      Generator g1(3), g2(3);
      auto build = [&](Generator& g) {  // a fresh spec (and Config) per build
        nn::AttentionSpec spec;
        spec.type = type;
        spec.d_model = D;
        spec.n_heads = H;
        spec.options = nn::Config(options, "attention");
        spec.gen = &g;
        return nn::make_attention(spec);
      };
      std::shared_ptr<nn::Attention> on_cpu = build(g1);
      std::shared_ptr<nn::Attention> on_gpu = build(g2);
      on_cpu->eval();  // no EMA/memory updates: both copies keep the same state
      on_gpu->eval();
      on_gpu->to(Device::cuda(0));
      const bool shared = on_cpu->shares_qk();
      std::vector<bool> pv(size_t(B * N), false);
      for (int64_t j = N - 5; j < N; ++j) pv[size_t(N + j)] = true;  // batch row 1: 5 padded keys
      const Tensor pad = Tensor::from_vector(pv, {B, N});
      auto run = [&](const std::vector<Tensor>& x) {
        const bool gpu = x[0].device().is_cuda();
        nn::AttentionArgs a;
        a.q = x[0];
        a.k = shared ? x[0] : x[1];
        a.v = x[2];
        a.query_input = x[3];
        a.key_padding_mask = pad.to(x[0].device());
        a.query_padding_mask = a.key_padding_mask;
        a.causal = causal;
        manual_seed(11);  // LSH draws its rotations per forward
        return (gpu ? on_gpu : on_cpu)->forward(a);
      };
      std::vector<Tensor> in = {leaf32({B, H, N, Dh}, 1), leaf32({B, H, N, Dh}, 2), leaf32({B, H, N, Dh}, 3),
                                leaf32({B, N, D}, 4)};
      std::string cpu_error;
      try {
        std::vector<Tensor> probe;
        for (const Tensor& t : in) probe.push_back(t.detach());
        (void)run(probe);
      } catch (const Error& e) {
        cpu_error = e.what();
      }
      if (!cpu_error.empty()) {  // e.g. clustered attention refuses causal masks: the same on CUDA
        std::vector<Tensor> probe;
        for (const Tensor& t : in) probe.push_back(cuda0(t.detach()));
        const std::string gpu_error = error_of([&] { (void)run(probe); });
        CHECK_MESSAGE(!gpu_error.empty(), "the CPU refused (", cpu_error, ") but CUDA did not");
        continue;
      }
      std::vector<Tensor> probe;
      for (const Tensor& t : in) probe.push_back(cuda0(t.detach()));
      const std::string gpu_error = error_of([&] { (void)run(probe); });
      if (!gpu_error.empty()) {
        check_cpu_only_refusal(gpu_error, type);
        continue;
      }
      ParityOptions opt;
      opt.atol = 1e-4;  // several chained GEMMs and softmaxes in float32
      opt.rtol = 1e-3;
      check_parity(type.c_str(), run, in, opt);
      ++matched;
    }
  }
  // full, lsh (twice), routing, neural-clustering and improved clustered run on
  // CUDA with both masks, clustered without the causal mask it refuses: 13 runs.
  CHECK(matched >= 13);
}

// Issue 25's measured residency: the host round trips of one forward + backward of
// each registry variant after a warm-up pass (cuda::transfer_stats). None may make
// any; the counts and kernel launches are printed (MESSAGE) for the launch budget.
CUDA_TEST_CASE("host round trips of each attention variant's forward and backward on CUDA") {
  const int64_t B = 2, H = 2, N = 24, Dh = 8, D = H * Dh;
  for (const std::string& type : nn::attention_types()) {
    INFO("attention ", type);
    Generator g(3);
    nn::AttentionSpec spec;
    spec.type = type;
    spec.d_model = D;
    spec.n_heads = H;
    spec.options = nn::Config(type == "neural-clustering" ? nlohmann::json{{"clusters", 4}} : nlohmann::json::object(),
                              "attention");
    spec.gen = &g;
    std::shared_ptr<nn::Attention> att = nn::make_attention(spec);
    att->to(Device::cuda(0));
    std::vector<Tensor> in = {device_leaf(leaf32({B, H, N, Dh}, 1)), device_leaf(leaf32({B, H, N, Dh}, 2)),
                              device_leaf(leaf32({B, H, N, Dh}, 3)), device_leaf(leaf32({B, N, D}, 4))};
    Tensor weight = cuda0(leaf32({B, H, N, Dh}, 5).detach());
    check_no_round_trip(round_trips(type, [&] {
      nn::AttentionArgs a;
      a.q = in[0];
      a.k = att->shares_qk() ? in[0] : in[1];
      a.v = in[2];
      a.query_input = in[3];
      sum(att->forward(a) * weight).backward();
    }));
  }
}

// The same for the centroid layers under every initialisation (with padding where
// the init takes it; "mean" with uneven windows), the point-cloud classifier and the
// Cluster-Former stacks with their memory banks, in training mode.
CUDA_TEST_CASE("host round trips of the centroid layers and models on CUDA") {
  const int64_t B = 2, N = 20, D = 16;
  std::vector<bool> pv(size_t(B * N), false);
  for (int64_t j = N - 4; j < N; ++j) pv[size_t(N + j)] = true;
  const Tensor pad = cuda0(Tensor::from_vector(pv, {B, N}));
  for (const char* init : {"mean", "random", "fps", "kmeans", "conv"}) {
    for (int64_t knn : {int64_t(0), int64_t(6)}) {
      nn::CentroidAttentionOptions o;
      o.d_model = D;
      o.n_heads = 2;
      o.init = init;
      o.knn = knn;
      Generator g(5), sampler(9);
      nn::CentroidAttentionBlock block(o, 32, "relu", 0.0, g);
      block.to(Device::cuda(0));
      const bool masked = std::string(init) == "mean" || std::string(init) == "random" || std::string(init) == "fps";
      const Tensor x = device_leaf(leaf32({B, N, D}, 21));
      check_no_round_trip(round_trips(str("centroid block, init ", init, ", knn ", knn), [&] {
        nn::CentroidBlockOutput out = block.forward(x, masked ? pad : Tensor(), Tensor(), &sampler);
        sum(square(out.u)).backward();
      }));
    }
  }
  for (const char* init : {"fps", "kmeans"}) {
    models::PointCloudOptions o = tiny_point_options();
    o.init = init;
    Generator g(3);
    models::PointCloudClassifier model(o, g);
    model.to(Device::cuda(0));
    const Tensor points = cuda0(leaf32({2, 40, 3}, 4).detach());
    const Tensor labels = cuda0(Tensor::from_vector(std::vector<int64_t>{1, 3}, {2}));
    check_no_round_trip(round_trips(str("point-cloud classifier, init ", init),
                                    [&] { cross_entropy(model.forward(points), labels).backward(); }));
  }
}

namespace {

models::ClusterFormerConfig tiny_cluster_former() {
  models::ClusterFormerConfig c;
  c.vocab_size = 14;
  c.max_len = 64;
  c.n_layers = 3;
  c.window = 8;
  c.stride = 4;
  c.cluster_layers = {1};
  c.layer.d_model = 32;
  c.layer.n_heads = 2;
  c.layer.d_ff = 64;
  c.layer.dropout = 0.0;
  c.cluster_attention = {{"num_clusters", 4}, {"chunk_size", 8}, {"memory_size", 256}, {"update_every", 2},
                         {"kmeans_iters", 5}};
  return c;
}

}  // namespace

// Question answering: both masks, and batch row 1's context padded from position 13
// on, so its windows 4 and 5 (positions 16-19, 20-21) hold padding only and their
// question copies become padding (empty_windows).
CUDA_TEST_CASE("the Cluster-Former QA and LM stacks run on CUDA like on the CPU, with no host round trip") {
  const int64_t B = 2, X = 22, Q = 3;
  std::vector<int64_t> ctx(size_t(B * X)), qst(size_t(B * Q));
  for (int64_t i = 0; i < B * X; ++i) ctx[size_t(i)] = 2 + (i * 7) % 12;
  for (int64_t i = X + 13; i < 2 * X; ++i) ctx[size_t(i)] = 0;  // pad_id
  for (int64_t i = 0; i < B * Q; ++i) qst[size_t(i)] = 2 + (i * 5) % 12;
  qst[size_t(B * Q - 1)] = 0;
  const Tensor context = Tensor::from_vector(ctx, {B, X}), question = Tensor::from_vector(qst, {B, Q});
  Generator g1(7), g2(7);
  models::ClusterFormerQA on_cpu(tiny_cluster_former(), g1), on_gpu(tiny_cluster_former(), g2);
  on_gpu.to(Device::cuda(0));
  auto logits = [](models::ClusterFormerQA& m, const Tensor& qn, const Tensor& cx) {
    models::QAOutput o = m.forward(qn, Tensor(), cx, Tensor());
    return cat({o.start_logits, o.end_logits, unsqueeze(o.answerable_logits, 1)}, 1);
  };
  const Tensor want = logits(on_cpu, question, context);
  const Tensor got = logits(on_gpu, cuda0(question), cuda0(context));
  check_close(got.cpu(), want, 1e-4);
  const Tensor qd = cuda0(question), cd = cuda0(context);
  check_no_round_trip(round_trips("Cluster-Former QA", [&] { sum(square(logits(on_gpu, qd, cd))).backward(); }));
  // The memory bank's step reads the device only when its update is due (every 2nd step here).
  on_gpu.on_train_step();  // step 1 (the warm-up state: read the counters once)
  cuda::synchronize();
  cuda::TransferStats before = cuda::transfer_stats();
  on_gpu.on_train_step();  // step 2: the update, K-Means on the bank
  CHECK((cuda::transfer_stats() - before).device_to_host > 0);
  before = cuda::transfer_stats();
  on_gpu.on_train_step();  // step 3: no update
  const cuda::TransferStats d = cuda::transfer_stats() - before;
  check_no_round_trip(d);

  models::ClusterFormerLM lm(tiny_cluster_former(), g1);
  lm.to(Device::cuda(0));
  check_no_round_trip(round_trips("Cluster-Former LM", [&] { sum(square(lm.forward(cd))).backward(); }));
}
CUDA_TEST_CASE("centroid attention blocks run on CUDA like on the CPU under every initialisation") {
  const int64_t B = 2, N = 20, D = 16;
  for (const char* init : {"mean", "random", "fps", "kmeans", "conv"}) {
    for (int64_t knn : {int64_t(0), int64_t(6)}) {
      INFO("init ", init, ", knn ", knn);
      nn::CentroidAttentionOptions o;
      o.d_model = D;
      o.n_heads = 2;
      o.init = init;
      o.knn = knn;
      Generator g1(5), g2(5);
      nn::CentroidAttentionBlock on_cpu(o, 32, "relu", 0.0, g1);
      nn::CentroidAttentionBlock on_gpu(o, 32, "relu", 0.0, g2);
      on_gpu.to(Device::cuda(0));
      // Padding masks are for the sampling and pooling inits (the learned and
      // K-Means inits refuse them, as on the CPU).
      const bool masked = std::string(init) == "mean" || std::string(init) == "random" || std::string(init) == "fps";
      std::vector<bool> pv(size_t(B * N), false);
      for (int64_t j = N - 4; j < N; ++j) pv[size_t(N + j)] = masked;
      const Tensor pad = masked ? Tensor::from_vector(pv, {B, N}) : Tensor();
      auto run = [&](const std::vector<Tensor>& x) {
        const bool gpu = x[0].device().is_cuda();
        Generator sampler(9);  // "random" draws on the host: the same sample on both devices
        return (gpu ? on_gpu : on_cpu).forward(x[0], pad.defined() ? pad.to(x[0].device()) : Tensor(), Tensor(), &sampler).u;
      };
      ParityOptions opt;
      opt.atol = 1e-4;
      opt.rtol = 1e-3;
      check_parity("centroid attention", run, {leaf32({B, N, D}, 21)}, opt);
    }
  }
}

CUDA_TEST_CASE("the point-cloud classifier runs on CUDA like on the CPU (FPS and K-Means centroids), cost() too") {
  for (const char* init : {"fps", "kmeans"}) {
    INFO("init ", init);
    models::PointCloudOptions o = tiny_point_options();
    o.init = init;
    Generator g1(3), g2(3);
    models::PointCloudClassifier on_cpu(o, g1), on_gpu(o, g2);
    on_gpu.to(Device::cuda(0));
    auto run = [&](const std::vector<Tensor>& x) { return (x[0].device().is_cuda() ? on_gpu : on_cpu).forward(x[0]); };
    ParityOptions opt;
    opt.atol = 1e-4;
    opt.rtol = 1e-3;
    check_parity("point-cloud classifier", run, {leaf32({2, 40, 3}, 4)}, opt);
    // cost() draws its sample cloud on the model's device.
    const nn::Cost c_cpu = on_cpu.cost(1, 40), c_gpu = on_gpu.cost(1, 40);
    CHECK(c_gpu.macs == c_cpu.macs);
    CHECK(c_gpu.params == c_cpu.params);
  }
}

// Routing's EMA (ops::centroid_ema_stats_into and _update_, the same sums in the same order on both devices):
// one training forward must move the centroids alike, padding excluded, beside a local head.
CUDA_TEST_CASE("routing attention's EMA update on CUDA equals the CPU's") {
  const int64_t B = 2, H = 3, N = 20, Dh = 8;
  nn::RoutingAttention on_cpu(H, Dh, 4, /*local_heads=*/1, 0, 0.9, 0.0, /*seed=*/5);
  nn::RoutingAttention on_gpu(H, Dh, 4, 1, 0, 0.9, 0.0, 5);
  on_gpu.to(Device::cuda(0));
  std::vector<bool> pv(size_t(B * N), false), qv(size_t(B * N), false);
  for (int64_t j = N - 6; j < N; ++j) pv[size_t(N + j)] = true;  // keys: batch row 1's last 6 padded
  for (int64_t j = 0; j < 3; ++j) qv[size_t(j)] = true;           // queries: batch row 0's first 3 (a swap shows)
  const Tensor pad = Tensor::from_vector(pv, {B, N}), qpad = Tensor::from_vector(qv, {B, N});
  // A NaN at a padded query and an inf at a padded key must not reach the centroids (on CUDA the
  // one-hot product weights padded rows by 0, and 0 * inf is NaN).
  std::vector<float> qs = leaf32({B, H, N, Dh}, 1).to_vector<float>(), ks = leaf32({B, H, N, Dh}, 2).to_vector<float>();
  for (int64_t h = 0; h < H; ++h)
    for (int64_t d = 0; d < Dh; ++d) {
      qs[size_t(((0 * H + h) * N + 1) * Dh + d)] = NAN;                    // batch row 0, query 1: padded
      ks[size_t(((1 * H + h) * N + N - 1) * Dh + d)] = float(INFINITY);  // batch row 1, key N - 1: padded
    }
  const Tensor q = Tensor::from_vector(qs, {B, H, N, Dh}), k = Tensor::from_vector(ks, {B, H, N, Dh}),
               v = leaf32({B, H, N, Dh}, 3).detach();
  for (nn::RoutingAttention* m : {&on_cpu, &on_gpu}) {
    const Device d = m == &on_gpu ? Device::cuda(0) : Device::cpu();
    nn::AttentionArgs a;
    a.q = q.to(d);
    a.k = k.to(d);
    a.v = v.to(d);
    a.key_padding_mask = pad.to(d);
    a.query_padding_mask = qpad.to(d);
    m->train();
    (void)m->forward(a);
  }
  CHECK(values(sum(abs(on_cpu.centroids() - on_gpu.centroids().cpu())))[0] < 1e-5);  // NaN fails too
  nn::RoutingAttention untouched(H, Dh, 4, 1, 0, 0.9, 0.0, 5);
  CHECK(values(sum(abs(on_cpu.centroids() - untouched.centroids())))[0] > 1e-3);  // the update moved them
}

CUDA_TEST_CASE("a memory bank on CUDA keeps the CPU's FIFO and recomputes the same centroids") {
  nn::MemoryBankOptions o;
  o.dim = 8;
  o.num_clusters = 4;
  o.capacity = 45;  // 10 rows per add: the fifth add splits 5 + 5 at the ring's end
  o.update_every = 3;
  o.kmeans_iters = 20;
  Generator g1(4), g2(4);
  nn::MemoryBank on_cpu(o, g1), on_gpu(o, g2);
  on_gpu.to(Device::cuda(0));
  // States around 4 well-separated directions, so K-Means finds the same clusters
  // on both devices whatever the rounding.
  Generator data(9);
  const Tensor dirs = randn({4, 8}, kFloat32, data) * 10.0;
  for (int step = 0; step < 6; ++step) {
    const Tensor idx = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 1, 2, 3, 0, 2, 3, 0, 1}, {12});
    const Tensor states = reshape(index_select(dirs, 0, idx) + randn({12, 8}, kFloat32, data) * 0.1, {2, 6, 8});
    std::vector<bool> pv(12, false);
    pv[5] = pv[11] = true;  // one padded position per row: never stored
    const Tensor pad = Tensor::from_vector(pv, {2, 6});
    on_cpu.add(states, pad);
    on_gpu.add(states.to(Device::cuda(0)), pad.to(Device::cuda(0)));
    CHECK(on_gpu.step() == on_cpu.step());
  }
  CHECK(on_gpu.size() == on_cpu.size());
  CHECK(on_gpu.updates() == 2);
  CHECK(on_gpu.updates() == on_cpu.updates());
  CHECK(values(on_gpu.contents().cpu()) == values(on_cpu.contents()));
  CHECK(values(on_gpu.counters.cpu()) == values(on_cpu.counters));
  CHECK(on_gpu.centroids.device() == Device::cuda(0));
  check_close(on_gpu.centroids.cpu(), on_cpu.centroids, 1e-4);
  CHECK_THROWS_MSG(on_gpu.add(Tensor::zeros({3, 8})), DeviceError, "[MemoryBank] states on cpu", "cuda:0");
}

}  // TEST_SUITE
