// The CUDA device model: moves between devices, factories, the caching
// allocator's counters, transfer paths and errors.
#include <cmath>

#include "cuda/cuda_test_util.h"

using namespace cf;
using namespace cf::test;

TEST_SUITE("cuda") {

TEST_CASE("device availability is reported and a missing device is a clear error") {
  CHECK(cuda::device_count() >= 0);
  if (!cuda_built()) CHECK(cuda::device_count() == 0);
  CHECK_THROWS_MSG(Tensor::zeros({2}, kFloat32, Device::cuda(63)), DeviceError, "cuda:63", "not available");
  CHECK_THROWS_MSG(cuda::check_device(Device::cuda(-1), "myop"), DeviceError, "[myop]", "cuda:-1");
  cuda::check_device(Device::cpu(), "myop");  // the CPU is always there
  const bool tf32 = cuda::allow_tf32();
  CHECK_FALSE(tf32);  // off by default
  cuda::set_allow_tf32(true);
  CHECK(cuda::allow_tf32());
  cuda::set_allow_tf32(tf32);
}

TEST_CASE("the transfer counters start at 0, count nothing for CPU work and reset") {
  cuda::reset_transfer_stats();
  Tensor x = Tensor::arange(10, kFloat32);
  CHECK(sum(x * x).item<float>() == 285.0f);
  CHECK(x.to(Device::cpu()).numel() == 10);
  const cuda::TransferStats s = cuda::transfer_stats();
  CHECK(s.device_to_host == 0);
  CHECK(s.host_to_device == 0);
  CHECK(s.synchronizations == 0);
  cuda::synchronize();  // counted only where there is a device to wait for
  CHECK(cuda::transfer_stats().synchronizations == (cuda::device_count() > 0 ? 1 : 0));
  cuda::reset_transfer_stats();
  CHECK(cuda::transfer_stats().synchronizations == 0);
}

CUDA_TEST_CASE("the transfer counters count every host round trip: item, to_vector, cpu, synchronize") {
  Tensor g = Tensor::arange(6, kFloat32).cuda();  // one host-to-device copy (before the reset)
  cuda::synchronize();
  cuda::reset_transfer_stats();
  Tensor s = sum(g);  // stays on the device
  CHECK(cuda::transfer_stats().device_to_host == 0);
  CHECK(s.item<float>() == 15.0f);
  CHECK(g.to_vector<float>().size() == 6);
  Tensor back = g.cpu();
  cuda::TransferStats t = cuda::transfer_stats();
  CHECK(t.device_to_host == 3);
  CHECK(t.device_to_host_bytes == 4 + 24 + 24);
  CHECK(t.host_to_device == 0);
  Tensor up = back.cuda();
  cuda::synchronize();
  const cuda::TransferStats d = cuda::transfer_stats() - t;
  CHECK(d.host_to_device == 1);
  CHECK(d.host_to_device_bytes == 24);
  CHECK(d.synchronizations == 1);
  CHECK(d.device_to_host == 0);
}

TEST_CASE("without a pending deferred check check_errors does nothing, and CPU work launches no kernel") {
  cuda::check_errors();  // reads what earlier tests of this process left (passing checks)
  CHECK(cuda::pending_checks() == 0);
  cuda::check_errors();  // nothing queued: returns at once (on every build)
  const cuda::TransferStats before = cuda::transfer_stats();
  Tensor x = Tensor::arange(10, kFloat32);
  CHECK(gather(x, 0, Tensor::from_vector(std::vector<int64_t>{3, 1}, {2})).to_vector<float>() ==
        std::vector<float>{3.0f, 1.0f});
  CHECK_THROWS_MSG(gather(x, 0, Tensor::from_vector(std::vector<int64_t>{3, 10}, {2})), IndexError,
                   "[gather] index 10 is out of range");  // the CPU checks at once
  CHECK(cuda::pending_checks() == 0);
  CHECK((cuda::transfer_stats() - before).kernel_launches == 0);
}

CUDA_TEST_CASE("the launch counter counts cf's kernels and cuBLAS calls") {
  Tensor a = cuda0(Tensor::ones({4, 4})), b = cuda0(Tensor::ones({4, 4}));
  cuda::synchronize();
  cuda::TransferStats t = cuda::transfer_stats();
  Tensor c = add(a, b);
  CHECK((cuda::transfer_stats() - t).kernel_launches == 1);
  t = cuda::transfer_stats();
  Tensor m = matmul(a, b);
  CHECK((cuda::transfer_stats() - t).kernel_launches == 1);
  CHECK(m.to_vector<float>()[0] == 4.0f);
}

// Issue 25's checks without a sync: an out-of-range index on CUDA neither throws
// in the op nor makes the host wait; the next host read throws the CPU's error.
CUDA_TEST_CASE("deferred checks: a bad index is reported at the next host read, in queue order") {
  if (cuda::sync_debug()) return;  // CF_CUDA_SYNC_DEBUG checks at once (the test below)
  const Tensor x = cuda0(reshape(Tensor::arange(12, kFloat32), {3, 4}));
  const Tensor good = cuda0(Tensor::from_vector(std::vector<int64_t>{0, 2}, {2}));
  const Tensor bad = cuda0(Tensor::from_vector(std::vector<int64_t>{1, 5}, {2}));
  const Tensor worse = cuda0(Tensor::from_vector(std::vector<int64_t>{-7, 0}, {2}));
  cuda::synchronize();
  const cuda::TransferStats before = cuda::transfer_stats();
  Tensor y = index_select(x, 1, good);
  Tensor z = index_select(x, 0, bad);   // fails: 5 is not a row of 3
  Tensor w = index_select(x, 1, worse);  // fails too, later
  const cuda::TransferStats d = cuda::transfer_stats() - before;
  CHECK(d.device_to_host == 0);
  CHECK(d.synchronizations == 0);
  CHECK(cuda::pending_checks() == 3);
  CHECK(z.shape() == Shape{2, 4});  // ran, on clamped indices
  // The read of a value queued after the failures throws the first failure's error.
  CHECK_THROWS_MSG(y.to_vector<float>(), IndexError, "[index_select] index 5 is out of range for axis 0 of length 3");
  CHECK(cuda::pending_checks() == 0);  // read once: the later failure went with it
  CHECK(y.to_vector<float>() == std::vector<float>{0, 2, 4, 6, 8, 10});
  // synchronize() and check_errors() read the checks too.
  (void)index_select(x, 0, bad);
  CHECK_THROWS_AS(cuda::synchronize(), IndexError);
  (void)one_hot(bad, 3);
  CHECK_THROWS_MSG(cuda::check_errors(), IndexError, "[one_hot] label 5 at (1) of labels (2)");
  // More checks than slots: the record is read when it fills, nothing is lost.
  for (int i = 0; i < 5000; ++i) (void)index_select(x, 1, good);
  CHECK(cuda::pending_checks() < 4096);
  (void)index_select(x, 1, worse);
  CHECK_THROWS_MSG(cuda::check_errors(), IndexError, "index -7");
  CHECK(cuda::pending_checks() == 0);
}

CUDA_TEST_CASE("deferred checks: CF_CUDA_SYNC_DEBUG reports the failing op itself") {
  const bool was = cuda::sync_debug();
  cuda::set_sync_debug(true);
  const Tensor x = cuda0(Tensor::arange(6, kFloat32));
  const Tensor bad = cuda0(Tensor::from_vector(std::vector<int64_t>{2, 6}, {2}));
  CHECK_THROWS_MSG(gather(x, 0, bad), IndexError, "[gather] index 6 is out of range");
  CHECK(cuda::pending_checks() == 0);
  cuda::set_sync_debug(was);
}

CUDA_TEST_CASE("to(cuda) and back keeps values and dtype and views come back in logical order") {
  for (DType dt : {kFloat32, kFloat64, kInt64, kBool}) {
    Tensor x = make(dt == kBool ? kInt64 : dt, {1, 0, 3, 4, 0, 6}, {2, 3});
    if (dt == kBool) x = ne(x, 0.0);
    Tensor g = x.cuda();
    CHECK(g.device() == Device::cuda(0));
    CHECK(g.dtype() == dt);
    CHECK(values(g) == values(x));  // to_vector reads device memory
    Tensor back = g.cpu();
    CHECK(back.device().is_cpu());
    CHECK(values(back) == values(x));
  }
  Tensor x = Tensor::arange(24, kFloat32).cuda();
  Tensor v = slice(transpose(reshape(x, {2, 3, 4}), 0, 2), 1, 1, 3);  // a strided view on the GPU
  CHECK_FALSE(v.is_contiguous());
  Tensor ref = slice(transpose(reshape(Tensor::arange(24, kFloat32), {2, 3, 4}), 0, 2), 1, 1, 3);
  CHECK(values(v) == values(ref));
  CHECK(values(v.cpu()) == values(ref));
  CHECK(x.cuda().is_same(x));  // already there: the same tensor
}

CUDA_TEST_CASE("factories on cuda") {
  CHECK(values(Tensor::full({3}, 2.5, kFloat64, Device::cuda(0))) == std::vector<double>{2.5, 2.5, 2.5});
  CHECK(values(Tensor::arange(4, kInt64, Device::cuda(0))) == std::vector<double>{0, 1, 2, 3});
  Tensor f = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2}, Device::cuda(0));
  CHECK(f.device().is_cuda());
  CHECK_THROWS_MSG(f.item<float>(), ShapeError, "[item]");  // item needs one element
  CHECK(sum(f).item<float>() == 10.0f);
  CHECK(Tensor::scalar(7, kInt64, Device::cuda(0)).item<int64_t>() == 7);
  CHECK(Tensor::zeros({0, 3}, kFloat32, Device::cuda(0)).numel() == 0);
  // full, zeros and ones fill on the device: every dtype, values whose bytes differ
  // (1.0f is 00 00 80 3f) or agree (0, -1 as int64), an odd count; the host copies
  // nothing and waits for nothing.
  for (DType dt : {kFloat32, kFloat64, kInt64, kBool, kBFloat16, kFloat16})
    for (double v : {0.0, 1.0, -1.0, 3.0, -2.5, 65504.0}) {
      if (dt == kBool && v != 0.0 && v != 1.0) continue;
      if (dt == kInt64 && v != std::floor(v)) continue;
      INFO(dt, " ", v);
      cuda::synchronize();
      const cuda::TransferStats before = cuda::transfer_stats();
      const Tensor g = Tensor::full({3, 37}, v, dt, Device::cuda(0));
      const cuda::TransferStats d = cuda::transfer_stats() - before;
      CHECK(d.host_to_device == 0);
      CHECK(d.device_to_host == 0);
      CHECK(d.synchronizations == 0);
      CHECK(values(g) == values(Tensor::full({3, 37}, v, dt)));
    }
  for (DType dt : {kFloat32, kFloat64, kInt64, kBFloat16, kFloat16}) {
    INFO(dt);
    cuda::synchronize();
    const cuda::TransferStats before = cuda::transfer_stats();
    const Tensor g = Tensor::arange(3000, dt, Device::cuda(0));  // past 256 (bf16) and 2048 (f16): rounding
    const cuda::TransferStats d = cuda::transfer_stats() - before;
    CHECK(d.host_to_device == 0);
    CHECK(d.device_to_host == 0);
    CHECK(values(g) == values(Tensor::arange(3000, dt)));
  }
  CHECK(Tensor::arange(0, kInt64, Device::cuda(0)).numel() == 0);
  CHECK(values(Tensor::ones({5}, kBFloat16, Device::cuda(0))) == std::vector<double>(5, 1.0));
  CHECK(values(Tensor::zeros({5}, kInt64, Device::cuda(0))) == std::vector<double>(5, 0.0));
  std::ostringstream os;
  os << transpose(Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {2, 2}, Device::cuda(0)), 0, 1);
  CHECK(os.str() == "tensor([[1, 3],\n [2, 4]], shape=(2,2), dtype=int64, device=cuda:0)");
}

CUDA_TEST_CASE("large transfers go through the pinned staging buffers intact") {
  // 4 MiB chunks: 9 MiB + 3 floats crosses two chunk boundaries and ends mid-chunk.
  const int64_t n = (9 << 20) / 4 + 3;
  Generator g(3);
  Tensor x = rand({n}, kFloat32, g);
  Tensor d = x.cuda();
  Tensor back = d.cpu();
  CHECK(std::memcmp(back.raw_data(), x.raw_data(), size_t(n) * 4) == 0);
  // A device-side computation on it agrees with the CPU.
  CHECK(std::fabs(sum(d).item() - sum(x).item()) <= 1e-3 * std::fabs(sum(x).item()));
}

CUDA_TEST_CASE("the caching allocator reuses blocks and counts live and peak bytes") {
  const Device dev = Device::cuda(0);
  empty_cache(dev);
  MemoryStats s0 = memory_stats(dev);
  CHECK(s0.cached_bytes == 0);
  reset_peak_memory(dev);
  {
    Tensor a = Tensor::empty({1000}, kFloat32, dev);
    MemoryStats s1 = memory_stats(dev);
    CHECK(s1.live_bytes == s0.live_bytes + 4000);
    CHECK(s1.peak_bytes >= s1.live_bytes);
  }
  MemoryStats s2 = memory_stats(dev);
  CHECK(s2.live_bytes == s0.live_bytes);
  CHECK(s2.cached_bytes > 0);  // the block was kept, not freed
  const void* first = nullptr;
  {
    Tensor b = Tensor::empty({1000}, kFloat32, dev);
    first = b.raw_data();
    CHECK(memory_stats(dev).cached_bytes == s2.cached_bytes - 4096);  // served from the cache
  }
  {
    Tensor c = Tensor::empty({990}, kFloat32, dev);  // the same 512-byte size class
    CHECK(c.raw_data() == first);
  }
  empty_cache(dev);
  CHECK(memory_stats(dev).cached_bytes == 0);
  CHECK(memory_stats(dev).peak_bytes >= s0.live_bytes + 4000);
  // CPU counters are separate.
  CHECK(memory_stats(Device::cpu()).live_bytes >= 0);
}

CUDA_TEST_CASE("ops refuse operands on different devices and name both") {
  Tensor a = Tensor::ones({2}, kFloat32);
  Tensor b = Tensor::ones({2}, kFloat32, Device::cuda(0));
  CHECK_THROWS_MSG(add(a, b), DeviceError, "[add]", "cpu", "cuda:0");
  CHECK_THROWS_MSG(matmul(reshape(a, {1, 2}), reshape(b, {2, 1})), DeviceError, "[matmul]", "cuda:0");
}

CUDA_TEST_CASE("the device move is differentiable both ways") {
  Tensor x = leaf64({3, 2});
  check_grad("to", [](const std::vector<Tensor>& in) { return mul(in[0].cuda(), 2.0); }, {x});
  Tensor y = leaf_on(leaf64({3, 2}), Device::cuda(0));
  check_grad("to", [](const std::vector<Tensor>& in) { return mul(in[0].cpu(), 3.0); }, {y});
}

CUDA_TEST_CASE("parity inputs keep their layout on both devices") {
  for (const Tensor& v : layouts(leaf64({3, 4}).detach())) {
    Tensor x = v.detach();
    x.set_requires_grad(true);
    for (Device d : {Device::cpu(), Device::cuda(0)}) {
      Tensor c = leaf_on(x, d);
      CHECK(c.device() == d);
      CHECK(c.strides() == x.strides());
      CHECK(c.requires_grad());
      CHECK(c.is_leaf());
      CHECK_FALSE(c.shares_storage(x));
      CHECK(values(c) == values(x));
    }
  }
}

CUDA_TEST_CASE("a Module moves to cuda and trains there") {
  Generator g(1);
  nn::Linear lin(4, 3, true, g);
  lin.to(Device::cuda(0));
  for (auto& [name, p] : lin.named_parameters()) {
    CHECK_MESSAGE(p.device().is_cuda(), name);
    CHECK_MESSAGE(p.requires_grad(), name);
    CHECK_MESSAGE(p.is_leaf(), name);
  }
  Tensor x = rand({8, 4}, kFloat32, g).cuda();
  Tensor t = rand({8, 3}, kFloat32, g).cuda();
  nn::SGD opt(lin.named_parameters(), nn::SGDOptions{0.1});
  double first = 0, last = 0;
  for (int s = 0; s < 50; ++s) {
    Tensor loss = mean(square(sub(lin.forward(x), t)));
    opt.zero_grad();
    loss.backward();
    opt.step();
    (s == 0 ? first : last) = loss.item();
  }
  CHECK(last < 0.5 * first);
}

// A CPU checkpoint resumes a CUDA run: the module's and the optimizer's load_state_dict copy each entry to
// its parameter's device (before 2026-11-28 copy_ and the optimizer's device check refused them).
CUDA_TEST_CASE("a CUDA module and optimizer load a CPU state dict") {
  Generator g(2);
  nn::Linear lin(4, 3, true, g);
  lin.to(Device::cuda(0));
  nn::AdamW opt(lin.named_parameters(), nn::AdamWOptions{});
  Tensor x = rand({8, 4}, kFloat32, g).cuda();
  for (int s = 0; s < 3; ++s) {
    Tensor loss = mean(square(lin.forward(x)));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  const nn::StateDict model_cpu = nn::state_on_cpu(lin.state_dict()), opt_cpu = nn::state_on_cpu(opt.state_dict());
  for (const auto& e : opt_cpu) CHECK_MESSAGE(e.second.device().is_cpu(), e.first);
  Generator g2(9);
  nn::Linear other(4, 3, true, g2);
  other.to(Device::cuda(0));
  nn::AdamW other_opt(other.named_parameters(), nn::AdamWOptions{});
  other.load_state_dict(model_cpu);
  other_opt.load_state_dict(opt_cpu);
  for (const auto& [name, p] : other.named_parameters()) CHECK_MESSAGE(p.device().is_cuda(), name);
  const nn::StateDict back = nn::state_on_cpu(other_opt.state_dict());
  REQUIRE(back.size() == opt_cpu.size());
  for (size_t i = 0; i < back.size(); ++i) CHECK_MESSAGE(values(back[i].second) == values(opt_cpu[i].second), back[i].first);
  const nn::StateDict mine = nn::state_on_cpu(other.state_dict());
  for (size_t i = 0; i < mine.size(); ++i) CHECK_MESSAGE(values(mine[i].second) == values(model_cpu[i].second), mine[i].first);
}

CUDA_TEST_CASE("sync debug mode still runs kernels and reports nothing for correct ones") {
  const bool before = cuda::sync_debug();
  cuda::set_sync_debug(true);
  Tensor x = Tensor::ones({1000}, kFloat32, Device::cuda(0));
  CHECK(sum(mul(x, 2.0)).item<float>() == 2000.0f);
  cuda::set_sync_debug(before);
}

}
