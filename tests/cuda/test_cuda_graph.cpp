// CUDA graphs (core/cuda_graph.h): a captured training step replays as the eager steps it stands
// for, bit for bit, random draws included; what a capture cannot hold is refused by name; the
// graph's memory and data checks behave as eager ones do.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/attention_bench.h"
#include "cuda/cuda_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

cf::apps::EncoderBenchConfig graph_encoder(const std::string& variant) {
  cf::apps::EncoderBenchConfig c;
  c.variant = variant;
  c.n = 64;
  c.batch = 2;
  c.d_model = 32;
  c.heads = 2;
  c.d_ff = 64;
  c.vocab = 50;
  c.seed = 11;
  c.device = Device::cuda(0);
  return c;
}

// Every parameter's float32 words after each of steps 2-5 of a run: eager steps, or one eager step,
// a capture and replays. Each run starts from the same default generator state (the variants'
// random planes and rotations and dropout draw from it), so the two draw alike when the graph does.
using Snapshots = std::vector<std::vector<std::vector<float>>>;
Snapshots train_run(const cf::apps::EncoderBenchConfig& cfg, bool graphed, int64_t* parts) {
  manual_seed(123);
  cf::apps::EncoderBench bench(cfg);
  bench.train_step();  // warm-up (graphed): AdamW's moments exist before the capture
  cuda::Graph g;
  if (graphed) {
    g.capture([&] { bench.train_step(); });
    *parts = g.parts();
  }
  Snapshots out;
  for (int step = 2; step <= 5; ++step) {
    if (step == 4) bench.optimizer()->set_lr(3e-4);  // reaches a replay through the refreshed part
    if (step == 5) {  // a new batch: written into the input the capture read
      Generator gen(99);
      copy_(bench.ids(), cf::randint(0, cfg.vocab, {cfg.batch, cfg.n}, gen).cuda());
    }
    if (graphed) {
      cuda::synchronize();
      cuda::reset_transfer_stats();
      g.replay();
      const cuda::TransferStats t = cuda::transfer_stats();
      CHECK(t.device_to_host == 0);
      CHECK(t.synchronizations == 0);
      CHECK(t.host_to_device == 0);
    } else {
      bench.train_step();
    }
    std::vector<std::vector<float>> params;
    for (const auto& np : bench.model().named_parameters())
      params.push_back(to(np.second, kFloat32).to_vector<float>());
    out.push_back(params);
  }
  CHECK(bench.optimizer()->step_count() == 5);
  return out;
}

// A train_loop run over graph_encoder(variant)'s model: 6 steps of 2 micro-batches (token ids drawn
// on the CPU, written by load_batch into one device tensor per micro-batch), gradient clipping, a
// warmup-cosine schedule; what each step reported, its round trips, and the parameters at the end.
struct LoopRun {
  std::vector<double> loss, norm, lr;
  std::vector<cuda::TransferStats> trips;  // each step's, from the end of the step before
  std::vector<std::vector<float>> params;
};
LoopRun loop_run(const cf::apps::EncoderBenchConfig& cfg, bool graphed) {
  manual_seed(123);
  cf::apps::EncoderBench bench(cfg);
  nn::AdamW opt(bench.model().named_parameters(), nn::AdamWOptions{});
  nn::WarmupCosineLR schedule(1e-3, 2, 6);
  std::vector<Tensor> ids{clone(bench.ids()), clone(bench.ids())};
  Generator data(77);
  nn::TrainLoopOptions o;
  o.max_steps = 6;
  o.grad_accum = 2;
  o.clip_norm = 0.5;
  o.progress = false;
  o.cuda_graph = graphed;
  nn::TrainLoopHooks h;
  h.model = &bench.model();
  h.schedule = &schedule;
  h.load_batch = [&](int64_t, int64_t micro) {
    copy_(ids[size_t(micro)], cf::randint(0, cfg.vocab, {cfg.batch, cfg.n}, data).cuda());
  };
  LoopRun run;
  cuda::synchronize();
  cuda::TransferStats last = cuda::transfer_stats();
  h.on_step_end = [&](const nn::TrainStepInfo& info) {
    const cuda::TransferStats now = cuda::transfer_stats();
    run.trips.push_back(now - last);
    last = now;
    run.loss.push_back(info.loss);
    run.norm.push_back(info.grad_norm);
    run.lr.push_back(info.lr);
  };
  nn::train_loop(
      opt, [&](int64_t, int64_t micro) { return bench.loss(ids[size_t(micro)]); }, o, h);
  for (const auto& np : bench.model().named_parameters()) run.params.push_back(np.second.to_vector<float>());
  return run;
}

}  // namespace

TEST_SUITE("cuda") {

TEST_CASE("cuda::Graph without a CUDA device: capture and replay fail with the reason, replayable just runs") {
  cuda::Graph g;
  CHECK_FALSE(g.captured());
  CHECK_FALSE(cuda::capturing());
  CHECK_THROWS_MSG(g.capture([] {}, Device::cpu()), ValueError, "[cuda::Graph]", "cpu is not a CUDA device");
  CHECK_THROWS_MSG(g.replay(), DeviceError, "[cuda::Graph] replay before a successful capture");
  if (!cuda::is_available()) {
    CHECK_THROWS_MSG(g.capture([] {}, Device::cuda(0)), DeviceError, "[cuda::Graph]", "cuda:0 is not available");
    CHECK_FALSE(g.captured());
  }
  int calls = 0;
  cuda::replayable([&] { ++calls; });
  CHECK(calls == 1);
  CHECK(g.parts() == 0);
}

CUDA_TEST_CASE("a training step captured in a cuda::Graph gives the eager steps' bits, variant by variant") {
  // The optimizer's step is a replayable part (step counts, bias corrections, lr refreshed before
  // each replay but the first); the random draws (dropout, LSH's rotations, clustered attention's
  // planes) are rebased on their generator's state at the replay; the rest reads the tensors the
  // capture used.
  for (const std::string variant : {"full", "neural-clustering", "clustered", "improved-clustered", "lsh", "routing",
                                    "sparse", "cluster-former"}) {
    for (const double dropout : {0.0, 0.1}) {
      INFO(variant, ", dropout ", dropout);
      cf::apps::EncoderBenchConfig cfg = graph_encoder(variant);
      cfg.dropout = dropout;
      int64_t parts = 0;
      const Snapshots eager = train_run(cfg, false, nullptr), graphed = train_run(cfg, true, &parts);
      CHECK(parts >= 2);  // the step before the optimizer, and the optimizer's own part
      REQUIRE(eager.size() == graphed.size());
      for (size_t step = 0; step < eager.size(); ++step)
        for (size_t i = 0; i < eager[step].size(); ++i) {
          INFO("step ", step + 2, ", parameter ", i);
          REQUIRE(eager[step][i].size() == graphed[step][i].size());
          CHECK(std::memcmp(eager[step][i].data(), graphed[step][i].data(), eager[step][i].size() * sizeof(float)) ==
                0);
        }
    }
  }
}

CUDA_TEST_CASE(
    "a training step of bfloat16 and float16 parameters captured in a cuda::Graph gives the eager steps' bits") {
  // AdamW steps the parameters' float32 masters in its multi-tensor kernel (the 16-bit gradient
  // widened and the master rounded back in the same pass), so its part allocates nothing and the
  // refresh before each replay takes it.
  for (const DType dt : {kBFloat16, kFloat16})
    for (const std::string variant : {"full", "neural-clustering"}) {
      INFO(variant, ", ", dt);
      cf::apps::EncoderBenchConfig cfg = graph_encoder(variant);
      cfg.param_dtype = dt;
      int64_t parts = 0;
      const Snapshots eager = train_run(cfg, false, nullptr), graphed = train_run(cfg, true, &parts);
      CHECK(parts >= 2);
      REQUIRE(eager.size() == graphed.size());
      for (size_t step = 0; step < eager.size(); ++step)
        for (size_t i = 0; i < eager[step].size(); ++i) {
          INFO("step ", step + 2, ", parameter ", i);
          CHECK(eager[step][i] == graphed[step][i]);
        }
      CHECK(eager.front() != eager.back());  // the parameters moved
    }
}

CUDA_TEST_CASE("train_loop with cuda_graph: the eager loop's losses, norms and parameters, one read a step") {
  // Step 1 eager, step 2 captured and every later step replayed: each with its micro-batches
  // loaded, its learning rate from the schedule, its clipping and its draws (dropout) as the eager
  // loop's, reading the device once (the losses and the norm together) and waiting for nothing else.
  for (const std::string variant : {"full", "neural-clustering", "lsh"}) {
    INFO(variant);
    cf::apps::EncoderBenchConfig cfg = graph_encoder(variant);
    cfg.dropout = 0.1;
    const LoopRun eager = loop_run(cfg, false), graphed = loop_run(cfg, true);
    CHECK(graphed.loss == eager.loss);
    CHECK(graphed.norm == eager.norm);
    CHECK(graphed.lr == eager.lr);
    REQUIRE(graphed.params.size() == eager.params.size());
    for (size_t i = 0; i < eager.params.size(); ++i) {
      INFO("parameter ", i);
      CHECK(std::memcmp(graphed.params[i].data(), eager.params[i].data(), eager.params[i].size() * sizeof(float)) == 0);
    }
    CHECK(eager.loss.front() != eager.loss.back());
    REQUIRE(graphed.trips.size() == 6);
    CHECK(graphed.trips[1].device_to_host == 1);  // the captured step
    for (size_t s = 2; s < 6; ++s) {              // replays
      INFO("step ", s + 1);
      CHECK(graphed.trips[s].device_to_host == 1);
      CHECK(graphed.trips[s].synchronizations == 0);
      CHECK(graphed.trips[s].host_to_device == 2);  // the two micro-batches
    }
    for (size_t s = 1; s < 6; ++s) CHECK(eager.trips[s].device_to_host == 1);  // the eager loop reads once too
  }
}

CUDA_TEST_CASE("clip_grad_norm_tensor on CUDA: clip_grad_norm's bits without a copy to the host or a wait") {
  Generator gen(3);
  std::vector<Tensor> a, b;
  for (int i = 0; i < 4; ++i) {
    const Tensor g = rand({1000 + 37 * i}, kFloat32, gen, -1, 1).cuda();
    for (auto* ps : {&a, &b}) {
      Tensor p = Tensor::zeros(g.shape(), kFloat32, Device::cuda(0));
      p.set_requires_grad(true);
      p.set_grad(clone(g));
      ps->push_back(p);
    }
  }
  cuda::synchronize();
  const cuda::TransferStats before = cuda::transfer_stats();
  const Tensor n = nn::clip_grad_norm_tensor(a, 0.5);
  const cuda::TransferStats trips = cuda::transfer_stats() - before;
  CHECK(trips.device_to_host == 0);
  CHECK(trips.synchronizations == 0);
  CHECK(n.device() == Device::cuda(0));
  const double nd = nn::clip_grad_norm(b, 0.5);
  CHECK(n.item() == nd);
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].grad().to_vector<float>() == b[i].grad().to_vector<float>());
}

CUDA_TEST_CASE("random draws in a cuda::Graph replay the draws the eager calls would make, generator by generator") {
  Generator ga(5), gb(7), ea(5), eb(7);
  const Tensor x = Tensor::ones({4096}, kFloat32, Device::cuda(0));
  Tensor u, d;
  auto draws = [&](Generator& a, Generator& b, Tensor& u_out, Tensor& d_out) {
    u_out = randn({300}, kFloat32, a, 0.0, 1.0, Device::cuda(0));
    d_out = dropout(x, 0.3, true, b);
  };
  Tensor eu, ed;
  cuda::Graph g;
  g.capture([&] { draws(ga, gb, u, d); });
  for (int r = 0; r < 3; ++r) {
    if (r == 2) (void)rand({10}, kFloat32, ga);  // an eager draw between replays moves the next replay's too
    if (r == 2) (void)rand({10}, kFloat32, ea);
    draws(ea, eb, eu, ed);
    g.replay();
    INFO("replay ", r + 1);
    CHECK(u.to_vector<float>() == eu.to_vector<float>());
    CHECK(d.to_vector<float>() == ed.to_vector<float>());
    CHECK(ga.offset() == ea.offset());
    CHECK(gb.offset() == eb.offset());
  }
  CHECK_THROWS_MSG(g.capture([&] { cuda::replayable([&] { (void)dropout(x, 0.5, true, ga); }); }), DeviceError,
                   "[dropout] draws random numbers inside a replayable part");
}

CUDA_TEST_CASE("cuda::Graph refuses host reads, waits and stale gradients by name, and eager work goes on after") {
  cf::apps::EncoderBench bench(graph_encoder("full"));
  bench.train_step();
  Tensor x = Tensor::arange(8, kFloat32).cuda();
  cuda::Graph g;
  CHECK_THROWS_MSG(g.capture([&] { (void)sum(x).item<float>(); }), DeviceError, "captures a CUDA graph",
                   "cannot read or write host memory");
  CHECK_FALSE(g.captured());
  CHECK_FALSE(cuda::capturing());
  bench.train_step();  // the eager step still runs: the capture stream and scope were let go
  CHECK_THROWS_MSG(g.capture([&] { (void)Tensor::arange(4, kFloat32).cuda(); }), DeviceError,
                   "cannot read or write host memory");
  CHECK_THROWS_MSG(g.capture([&] { cuda::synchronize(); }), DeviceError, "[synchronize]", "captures a CUDA graph");
  CHECK_THROWS_MSG(g.capture([&] { g.capture([] {}); }), DeviceError, "already captures a graph");
  // A .grad from before the capture: a replay would add to it as it was then, not as the last step left it.
  Tensor w = Tensor::ones({4}, kFloat32, Device::cuda(0));
  w.set_requires_grad(true);
  sum(w * 2.0).backward();
  CHECK_THROWS_MSG(g.capture([&] { sum(w * 3.0).backward(); }), DeviceError,
                   "[backward] accumulates into a .grad made before this CUDA graph capture", "zero_grad");
  w.zero_grad();
  g.capture([&] {  // accumulating inside the capture is the graph's own
    sum(w * 2.0).backward();
    sum(w * 3.0).backward();
  });
  g.replay();
  CHECK(w.grad().to_vector<float>() == std::vector<float>(4, 5.0f));
  g.reset();
  CHECK_FALSE(g.captured());
  CHECK(sum(x).item<float>() == 28.0f);
}

CUDA_TEST_CASE("cuda::Graph replays read the captured inputs, and eager tensors never get the graph's memory") {
  Tensor x = Tensor::arange(1024, kFloat32).cuda(), y;
  cuda::synchronize();
  empty_cache(Device::cuda(0));  // (no other block of the temporary's size to hand out instead)
  const void* temporary = nullptr;
  cuda::Graph g;
  g.capture([&] {
    Tensor twice = x * 2.0;  // a temporary freed inside the capture: the graph's pool keeps it
    temporary = twice.raw_data();
    y = twice + 1.0;
  });
  // A capture records and runs nothing: y's memory is the graph's until a replay writes it.
  Tensor eager = Tensor::full({1024}, 7.0, kFloat32, Device::cuda(0));  // the temporary's size
  CHECK(eager.raw_data() != temporary);
  g.replay();
  CHECK(y.to_vector<float>()[5] == 11.0f);
  CHECK(eager.to_vector<float>() == std::vector<float>(1024, 7.0f));  // not overwritten by the replay
  copy_(x, Tensor::full({1024}, 3.0, kFloat32, Device::cuda(0)));
  g.replay();
  CHECK(y.to_vector<float>() == std::vector<float>(1024, 7.0f));
  g.reset();
  CHECK_FALSE(g.captured());
  CHECK_THROWS_MSG(g.replay(), DeviceError, "replay before a successful capture");
}

CUDA_TEST_CASE("cf's caches may drop a tensor a cuda::Graph reads: the graph keeps it (number constants)") {
  Tensor x = Tensor::full({256}, 2.0, kFloat32, Device::cuda(0)), y;
  (void)(x * 0.375);  // 0.375 becomes a shared 0-d constant (ops::scalar_like) before the capture
  cuda::Graph g;
  g.capture([&] { y = x * 0.375; });  // reads that constant: made eagerly, not the graph's own block
  for (int i = 0; i < 40; ++i) {
    Tensor z = x * (1000.0 + i);  // more numbers than the constants' cache holds: 0.375's is dropped
    (void)z;
  }
  g.replay();
  CHECK(y.to_vector<float>() == std::vector<float>(256, 0.75f));
}

CUDA_TEST_CASE("a deferred check captured in a cuda::Graph fails at the next host read after a bad replay") {
  Tensor logits = Tensor::zeros({3, 4}, kFloat32, Device::cuda(0));
  Tensor target = Tensor::from_vector(std::vector<int64_t>{0, 1, 3}, {3}).cuda(), loss;
  cuda::Graph g;
  g.capture([&] { loss = cross_entropy(logits, target); });
  g.replay();
  CHECK(std::abs(loss.item<float>() - std::log(4.0f)) < 1e-6f);
  copy_(target, Tensor::from_vector(std::vector<int64_t>{0, 9, 3}, {3}).cuda());
  g.replay();
  g.replay();  // a second replay before the read: the failure stays until read, and is read once
  CHECK_THROWS_MSG(loss.item<float>(), IndexError, "[cross_entropy] target 9");
  CHECK(cuda::pending_checks() == 0);
  (void)loss.item<float>();  // nothing left to report
  copy_(target, Tensor::from_vector(std::vector<int64_t>{2, 1, 0}, {3}).cuda());
  g.replay();
  CHECK(std::abs(loss.item<float>() - std::log(4.0f)) < 1e-6f);  // the slots were reset by the read
}

CUDA_TEST_CASE("a replayable part is called again before every replay but the first, and may not allocate") {
  Tensor t = Tensor::zeros({16}, kFloat32, Device::cuda(0));
  int k = 0;
  cuda::Graph g;
  g.capture([&] {
    mul_(t, 2.0);
    cuda::replayable([&] { fill_(t, double(++k)); });  // a host value as a kernel argument
    mul_(t, 3.0);
  });
  CHECK(g.parts() == 3);
  CHECK(k == 1);  // the capture's own call: the first replay's argument
  cuda::reset_transfer_stats();
  g.replay();
  CHECK(cuda::transfer_stats().kernel_launches == 3);  // one graph launch per part
  CHECK(t.to_vector<float>()[0] == 3.0f);
  g.replay();
  CHECK(k == 2);
  CHECK(t.to_vector<float>()[3] == 6.0f);

  Tensor s;
  cuda::Graph h;
  h.capture([&] { cuda::replayable([&] { s = t + 1.0; }); });
  h.replay();
  CHECK_THROWS_MSG(h.replay(), DeviceError, "allocated device memory");
}

}  // TEST_SUITE
