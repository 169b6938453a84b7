// Concurrency tests, the `tsan` CTest label (issue 27): they pass in every build
// and are what the ThreadSanitizer build (-DCF_SANITIZE=thread, README "Tests")
// runs. Each checks its threaded result against a serial reference, so a race
// shows as a wrong value here and as a report under TSan.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "kernels/common/parallel.h"
#include "nn/pattern_lm.h"
#include "test_util.h"

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace cf;
using namespace cf::test;

TEST_SUITE("tsan") {

TEST_CASE("threads: the DataLoader's prefetch thread delivers the serial batches") {
  Generator g(3);
  auto ds = std::make_shared<data::TensorDataset>(rand({64, 3}, kFloat32, g),
                                                  Tensor::arange(64, kInt64));
  data::DataLoaderOptions o;
  o.batch_size = 5;
  o.shuffle = true;
  o.seed = 11;
  std::vector<std::vector<int64_t>> serial;
  {
    data::DataLoader dl(ds, o);
    for (int epoch = 0; epoch < 2; ++epoch)
      for (const data::Batch& b : dl) serial.push_back(b.target.to_vector<int64_t>());
  }
  o.prefetch = 3;
  data::DataLoader dl(ds, o);
  std::vector<std::vector<int64_t>> got;
  for (int epoch = 0; epoch < 2; ++epoch)
    for (const data::Batch& b : dl) got.push_back(b.target.to_vector<int64_t>());
  CHECK(got == serial);
  // Moving while the worker runs ahead drops its batches and restarts it there.
  dl.set_state({0, 4});
  data::Batch b;
  REQUIRE(dl.next(b));
  CHECK(b.target.to_vector<int64_t>() == serial[4]);
  dl.stop();
  REQUIRE(dl.next(b));
  CHECK(b.target.to_vector<int64_t>() == serial[5]);
}

TEST_CASE("threads: OpenMP kernels agree with the one-thread results") {
  // Sizes above the kernels' parallel grain, so the OpenMP paths run.
  Generator g(5);
  Tensor a = rand({256, 300}, kFloat64, g), b = rand({300, 128}, kFloat64, g);
  Tensor x = rand({1 << 18}, kFloat32, g);
  auto run = [&] {
    return std::vector<double>{sum(matmul(a, b)).item(), sum(exp(x)).item(), amax(mul(x, 3.0)).item(),
                               sum(softmax(reshape(x, {512, 512}), -1)).item()};
  };
  std::vector<double> many = run();
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<double> one = run();
  omp_set_num_threads(threads);
  for (size_t i = 0; i < many.size(); ++i) CHECK(many[i] == doctest::Approx(one[i]).epsilon(1e-6));
#endif
  CHECK(many[3] == doctest::Approx(512.0));
}

TEST_CASE("threads: set_num_threads is one count for every calling thread, over OpenMP's per-thread count") {
  // The teams parallel_for starts: one chunk per thread of its team.
  auto chunks = [] {
    std::atomic<int> n{0};
    kernels::parallel_for(int64_t(1) << 20, kernels::kParallelGrain, [&](int64_t, int64_t) { ++n; });
    return n.load();
  };
  Generator g(9);
  const Tensor a = rand({96, 200}, kFloat64, g), b = rand({200, 3000}, kFloat64, g);
  const Tensor x = rand({1 << 18}, kFloat32, g);
  auto run = [&] { return std::vector<double>{sum(matmul(a, b)).item(), sum(softmax(reshape(x, {512, 512}), -1)).item()}; };
  {
    NumThreadsGuard one(1);
    CHECK(num_threads_is_set());
    CHECK(get_num_threads() == 1);
    CHECK(chunks() == 1);
    int seen = 0, seen_chunks = 0;
    std::thread t([&] { seen = get_num_threads(), seen_chunks = chunks(); });
    t.join();
    CHECK(seen == 1);  // a thread started later: the same count
    CHECK(seen_chunks == 1);
  }
#ifdef _OPENMP
  {
    // What importing PyTorch did to a Python process: the calling thread's OpenMP count set to 1. A set count
    // rules over it, so this thread and a new one (which keeps OpenMP's default) run the same teams and get the
    // same bits.
    const int before = omp_get_max_threads();
    NumThreadsGuard two(2);
    omp_set_num_threads(1);
    CHECK(get_num_threads() == 2);
    CHECK(chunks() == std::min(2, omp_get_thread_limit()));  // (OMP_THREAD_LIMIT caps every team)
    const std::vector<double> here = run();
    std::vector<double> there;
    std::thread t([&] { there = run(); });
    t.join();
    omp_set_num_threads(before);
    CHECK(here == there);
  }
#endif
  CHECK_FALSE(num_threads_is_set());  // (the guards put the default back)
  CHECK_THROWS_WITH_AS(set_num_threads(-1), "[set_num_threads] n must be in [1, 1024] (0: OpenMP's count of the calling thread), got -1", ValueError);
  CHECK_THROWS_WITH_AS(set_num_threads(1025), doctest::Contains("got 1025"), ValueError);
  CHECK_FALSE(num_threads_is_set());  // (a refused count changes nothing)
}

TEST_CASE("threads: allocator statistics stay exact under concurrent allocation") {
  const int64_t live0 = memory_stats().live_bytes;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> peak_below_live{0};
  std::thread reader([&] {  // reads the counters while they change, resetting the peak now and then
    for (int64_t i = 0; !stop.load(); ++i) {
      if (i % 16 == 0) reset_peak_memory();
      const MemoryStats s = memory_stats();
      // peak is the maximum of live since the reset: a reset that stored an older live, or a read
      // between an allocation's live and peak updates, showed peak < live
      if (s.peak_bytes < s.live_bytes) ++peak_below_live;
    }
  });
  auto work = [](int seed) {
    for (int i = 0; i < 300; ++i) {
      Tensor t = Tensor::zeros({int64_t(16 + (i * seed) % 200)});
      Tensor u = Tensor::ones({int64_t(1 + i % 7), 64});
      (void)t;
      (void)u;
    }
  };
  std::thread t1(work, 3), t2(work, 7);
  t1.join();
  t2.join();
  stop = true;
  reader.join();
  CHECK(memory_stats().live_bytes == live0);
  CHECK(peak_below_live.load() == 0);
}

TEST_CASE("threads: independent forward and backward passes in two threads") {
  // Each thread trains its own model on its own data; the gradients must equal
  // those of the same computation run alone (grad mode is per thread).
  auto grads = [](uint64_t seed) {
    Generator g(seed);
    nn::Linear l1(8, 16, true, g), l2(16, 1, true, g);
    Tensor x = rand({32, 8}, kFloat32, g), y = rand({32, 1}, kFloat32, g);
    for (int step = 0; step < 5; ++step) {
      l1.zero_grad();
      l2.zero_grad();
      Tensor loss = mean(square(sub(l2(relu(l1(x))), y)));
      loss.backward();
    }
    std::vector<double> out;
    for (auto* m : {&l1, &l2})
      for (auto& p : m->parameters())
        for (double v : values(p.grad())) out.push_back(v);
    return out;
  };
  const std::vector<double> want1 = grads(1), want2 = grads(2);
  std::vector<double> got1, got2;
  std::thread a([&] { got1 = grads(1); }), b([&] { got2 = grads(2); });
  // Meanwhile this thread computes without grad: its guard must not reach a or b.
  {
    NoGradGuard off;
    Generator g(4);
    for (int i = 0; i < 20; ++i) (void)sum(matmul(rand({16, 16}, kFloat32, g), rand({16, 16}, kFloat32, g)));
  }
  a.join();
  b.join();
  CHECK(got1 == want1);
  CHECK(got2 == want2);
}

TEST_CASE("threads: backward passes in two threads that share a leaf accumulate every gradient") {
  // The read-add-store of a leaf's .grad is one step: unlocked, the threads overwrote each
  // other's sums (w.grad came out 313..363 instead of 400, and a shared_ptr race could crash).
  Tensor w = t64({0.5}, {1}).set_requires_grad(true);
  auto work = [&w] {
    for (int i = 0; i < 200; ++i) sum(w * 1.0).backward();
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
  check_close(w.grad(), {400.0});
}

TEST_CASE("threads: a shared generator hands out disjoint counters and own generators are reproducible") {
  Generator shared(9);
  std::vector<double> r1, r2;
  auto draw = [&](std::vector<double>& out) {
    for (int i = 0; i < 200; ++i) out.push_back(rand({3}, kFloat64, shared).to_vector<double>()[0]);
  };
  std::atomic<bool> stop{false};
  std::thread watcher([&] {  // reads the state while counters are reserved
    uint64_t last = 0;
    while (!stop.load()) last = std::max(last, shared.offset());
    (void)last;
  });
  std::thread a(draw, std::ref(r1)), b(draw, std::ref(r2));
  a.join();
  b.join();
  stop = true;
  watcher.join();
  CHECK(shared.offset() == 2 * 200 * 3);
  // Own generators in two threads: the same streams as serially.
  auto stream = [](uint64_t seed) { Generator g(seed); return randn({1000}, kFloat32, g).to_vector<float>(); };
  std::vector<float> s1, s2;
  std::thread c([&] { s1 = stream(1); }), d([&] { s2 = stream(2); });
  c.join();
  d.join();
  CHECK(s1 == stream(1));
  CHECK(s2 == stream(2));
}

TEST_CASE("threads: inference on one shared model in several threads gives the serial outputs, every variant") {
  // Serving one model from several threads (eval, no grad), as PyTorch users do: clustered attention
  // kept its last assignment and lazily made planes in unguarded members (heap corruption, 3-7 runs
  // in 10 crashed), Cluster-Former its last ids, and a neural clustering stack handed each layer's
  // centroids to the next through one slot shared by every thread's pass.
  for (const std::string& type : nn::attention_types()) {
    INFO("attention ", type);
    nlohmann::json options = nlohmann::json::object();
    if (type == "neural-clustering") options = {{"clusters", 3}};
    if (type == "clustered" || type == "improved-clustered") options = {{"clusters", 3}, {"hash_seed", 5}};
    if (type == "lsh") options = {{"seed", 5}, {"bucket_size", 4}};  // fixed rotations: outputs depend on input only
    models::TransformerConfig c = pattern_lm_config(type, options);
    c.n_layers = 3;  // a stack of three: the neural clustering hand-over between layers is shared
    Generator g(7);
    models::EncoderClassifier model(c, g);
    model.eval();
    NoGradGuard no_grad;  // (per thread: each worker sets its own below)
    std::vector<Tensor> inputs;
    std::vector<std::vector<float>> serial;
    for (int i = 0; i < 4; ++i) {
      inputs.push_back(randint(1, 5, {2, 12}, g));
      serial.push_back(model.forward(inputs.back()).to_vector<float>());
    }
    std::vector<int> mismatches(4, 0);
    std::vector<std::string> errors(4);
    std::vector<std::thread> workers;
    for (int i = 0; i < 4; ++i)
      workers.emplace_back([&, i] {
        NoGradGuard off;
        try {
          for (int r = 0; r < 15; ++r)
            if (model.forward(inputs[size_t(i)]).to_vector<float>() != serial[size_t(i)]) ++mismatches[size_t(i)];
        } catch (const std::exception& e) {
          errors[size_t(i)] = e.what();
        }
      });
    for (std::thread& w : workers) w.join();
    CHECK(mismatches == std::vector<int>(4, 0));
    CHECK(errors == std::vector<std::string>(4));
  }
}

TEST_CASE("threads: two passes that free one graph: one runs it, the other is told it was freed") {
  // Both threads start backward (without retain_graph) from roots above one chain: the first to reach a
  // node takes its function; the other got a freed std::function called under it (SIGSEGV, heap corruption).
  for (int round = 0; round < 20; ++round) {
    Generator g{uint64_t(round)};
    Tensor w = rand({8, 8}, kFloat64, g).set_requires_grad(true);
    Tensor h = rand({4, 8}, kFloat64, g);
    for (int i = 0; i < 30; ++i) h = tanh(matmul(h, w));
    Tensor r1 = sum(h), r2 = sum(h * 2.0);
    std::atomic<int> ready{0};
    std::vector<std::string> outcome(2);
    auto pass = [&](Tensor root, size_t slot) {
      ++ready;
      while (ready.load() < 2) {
      }
      try {
        root.backward();
        outcome[slot] = "ok";
      } catch (const AutogradError& e) {
        outcome[slot] = std::string(e.what()).find("already freed") != std::string::npos ? "freed" : e.what();
      } catch (const std::exception& e) {
        outcome[slot] = std::string("other: ") + e.what();
      }
    };
    std::thread a(pass, r1, 0), b(pass, r2, 1);
    a.join();
    b.join();
    INFO("round ", round, ": ", outcome[0], " / ", outcome[1]);
    CHECK((outcome[0] == "ok" || outcome[0] == "freed"));
    CHECK((outcome[1] == "ok" || outcome[1] == "freed"));
    CHECK((outcome[0] == "freed" || outcome[1] == "freed"));  // the shared chain runs once
  }
}

}  // TEST_SUITE("tsan")
