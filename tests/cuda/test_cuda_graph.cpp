// CUDA graphs (core/cuda_graph.h): a captured training step replays as the eager steps it stands
// for, bit for bit; what a capture cannot hold is refused by name; the graph's memory and data
// checks behave as eager ones do.
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

// Every parameter of a and b holds the same bits (float32: compared as int32 words).
void check_same_parameters(const cf::apps::EncoderBench& a, const cf::apps::EncoderBench& b, const std::string& when) {
  const auto pa = a.model().named_parameters(), pb = b.model().named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    const std::vector<float> x = pa[i].second.to_vector<float>(), y = pb[i].second.to_vector<float>();
    INFO(when, ": ", pa[i].first);
    REQUIRE(x.size() == y.size());
    CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  }
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
  // each replay but the first); the rest reads the tensors the capture used. LSH draws its
  // rotations every forward and is refused (next case).
  for (const std::string variant :
       {"full", "neural-clustering", "clustered", "improved-clustered", "routing", "sparse", "cluster-former"}) {
    INFO(variant);
    cf::apps::EncoderBench eager(graph_encoder(variant)), graphed(graph_encoder(variant));
    eager.train_step();
    graphed.train_step();  // warm-up: AdamW's moments exist before the capture
    cuda::Graph g;
    g.capture([&] { graphed.train_step(); });
    REQUIRE(g.captured());
    CHECK(g.parts() >= 2);  // the step before the optimizer, and the optimizer's own part
    for (int step = 2; step <= 5; ++step) {
      if (step == 4) {  // a new learning rate reaches the replay through the refreshed part
        eager.optimizer()->set_lr(3e-4);
        graphed.optimizer()->set_lr(3e-4);
      }
      if (step == 5) {  // a new batch: written into the input the capture read
        Generator gen(99);
        const Tensor ids = cf::randint(0, 50, {2, 64}, gen).cuda();
        copy_(eager.ids(), ids);
        copy_(graphed.ids(), ids);
      }
      eager.train_step();
      cuda::synchronize();
      cuda::reset_transfer_stats();
      g.replay();
      const cuda::TransferStats t = cuda::transfer_stats();
      CHECK(t.device_to_host == 0);
      CHECK(t.synchronizations == 0);
      CHECK(t.kernel_launches == g.parts());
      check_same_parameters(eager, graphed, "step " + std::to_string(step));
    }
    CHECK(eager.optimizer()->step_count() == graphed.optimizer()->step_count());
  }
}

CUDA_TEST_CASE("cuda::Graph refuses random draws, host reads and waits by name, and eager work goes on after") {
  cf::apps::EncoderBench lsh(graph_encoder("lsh"));
  lsh.train_step();
  cuda::Graph g;
  CHECK_THROWS_MSG(g.capture([&] { lsh.train_step(); }), DeviceError, "draws random numbers",
                   "captures a CUDA graph");
  CHECK_FALSE(g.captured());
  CHECK_FALSE(cuda::capturing());
  lsh.train_step();  // the eager step still runs: the capture stream and scope were let go

  Tensor x = Tensor::arange(8, kFloat32).cuda();
  CHECK_THROWS_MSG(g.capture([&] { (void)sum(x).item<float>(); }), DeviceError, "captures a CUDA graph",
                   "cannot read or write host memory");
  CHECK_THROWS_MSG(g.capture([&] { (void)Tensor::arange(4, kFloat32).cuda(); }), DeviceError, "cannot read or write host memory");
  CHECK_THROWS_MSG(g.capture([&] { cuda::synchronize(); }), DeviceError, "[synchronize]", "captures a CUDA graph");
  CHECK_THROWS_MSG(g.capture([&] { (void)dropout(x, 0.5, true); }), DeviceError, "[dropout] draws random numbers");
  CHECK_THROWS_MSG(g.capture([&] { (void)randn({4}, kFloat32, default_generator(), 0.0, 1.0, Device::cuda(0)); }), DeviceError,
                   "[random] draws random numbers");
  CHECK_THROWS_MSG(g.capture([&] { g.capture([] {}); }), DeviceError, "already captures a graph");
  CHECK_FALSE(g.captured());
  CHECK(sum(x).item<float>() == 28.0f);
}

CUDA_TEST_CASE("cuda::Graph replays read the captured inputs, and eager tensors never get the graph's memory") {
  Tensor x = Tensor::arange(1024, kFloat32).cuda(), y;
  cuda::Graph g;
  g.capture([&] {
    Tensor twice = x * 2.0;  // a temporary freed inside the capture: the graph's pool keeps it
    y = twice + 1.0;
  });
  // A capture records and runs nothing: y's memory is the graph's until a replay writes it.
  Tensor eager = Tensor::full({1024}, 7.0, kFloat32, Device::cuda(0));  // the temporary's size
  g.replay();
  CHECK(y.to_vector<float>()[5] == 11.0f);
  CHECK(eager.to_vector<float>() == std::vector<float>(1024, 7.0f));  // not overwritten by the replay
  copy_(x, Tensor::full({1024}, 3.0, kFloat32));
  g.replay();
  CHECK(y.to_vector<float>() == std::vector<float>(1024, 7.0f));
  g.reset();
  CHECK_FALSE(g.captured());
  CHECK_THROWS_MSG(g.replay(), DeviceError, "replay before a successful capture");
}

CUDA_TEST_CASE("a deferred check captured in a cuda::Graph fails at the next host read after a bad replay") {
  Tensor logits = Tensor::zeros({3, 4}, kFloat32, Device::cuda(0));
  Tensor target = Tensor::from_vector(std::vector<int64_t>{0, 1, 3}, {3}).cuda(), loss;
  cuda::Graph g;
  g.capture([&] { loss = cross_entropy(logits, target); });
  g.replay();
  CHECK(std::abs(loss.item<float>() - std::log(4.0f)) < 1e-6f);
  copy_(target, Tensor::from_vector(std::vector<int64_t>{0, 9, 3}, {3}));
  g.replay();
  g.replay();  // a second replay before the read: still one report
  CHECK_THROWS_MSG(loss.item<float>(), IndexError, "[cross_entropy] target 9");
  copy_(target, Tensor::from_vector(std::vector<int64_t>{2, 1, 0}, {3}));
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
  g.replay();
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
