// Sparse top-k products (autograd/ops/sparse.h): float64 gradchecks with
// repeated indices, the gathered dense formula, errors, and CUDA parity.
#include <cmath>
#include <cstring>
#include <random>

#include "autograd/ops/sparse.h"
#include "cuda/cuda_test_util.h"
#include "kernels/common/cpu_isa.h"

using namespace cf;
using namespace cf::test;

TEST_SUITE("ops/sparse") {

namespace {
// Repeats within and across rows: the scatter of the backward adds several terms into one row.
Tensor repeated_idx() { return ti64({0, 4, 4, 4, 2, 1, 3, 3, 0, 2, 1, 0}, {2, 3, 2}); }
}  // namespace

GRADCHECK_CASE(sparse_dot) {
  Tensor q = leaf64({2, 3, 4}, 31), k = leaf64({2, 5, 4}, 32), idx = repeated_idx();
  auto dot = [&](const std::vector<Tensor>& xs) { return sparse_dot(xs[0], xs[1], idx); };
  check_grad("sparse_dot", dot, {q, k});
}

GRADCHECK_CASE(sparse_weighted_sum) {
  Tensor v = leaf64({2, 5, 3}, 33), w = leaf64({2, 3, 2}, 34), idx = repeated_idx();
  auto wsum = [&](const std::vector<Tensor>& xs) { return sparse_weighted_sum(xs[0], xs[1], idx); };
  check_grad("sparse_weighted_sum", wsum, {w, v});
  CHECK(sparse_weighted_sum(to(w.detach(), kFloat32), to(v.detach(), kFloat32), idx).dtype() == kFloat32);
}

TEST_CASE("sparse_dot equals the gathered dense formula") {
  Tensor q = leaf64({2, 3, 4}, 31), k = leaf64({2, 5, 4}, 32), idx = repeated_idx();
  auto qd = values(sparse_dot(q, k, idx)), qv = values(q), kv = values(k);
  auto iv = idx.to_vector<int64_t>();
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t n = 0; n < 3; ++n)
      for (int64_t t = 0; t < 2; ++t) {
        double s = 0;
        for (int64_t d = 0; d < 4; ++d)
          s += qv[size_t((g * 3 + n) * 4 + d)] * kv[size_t((g * 5 + iv[size_t((g * 3 + n) * 2 + t)]) * 4 + d)];
        CHECK(qd[size_t((g * 3 + n) * 2 + t)] == doctest::Approx(s).epsilon(1e-14));
      }
}

TEST_CASE("sparse_dot and sparse_weighted_sum refuse bad input with messages naming the problem") {
  Tensor sq = leaf64({1, 2, 3}, 1), sk = leaf64({1, 4, 3}, 2);
  CHECK_THROWS_MSG(sparse_dot(sq, sk, ti64({0, 4}, {1, 2, 1})), IndexError,
                   "[sparse_dot] idx value 4", "out of range for k with 4 rows");
  CHECK_THROWS_MSG(sparse_dot(sq, sk, ti64({0, 1}, {1, 1, 2})), ShapeError, "[sparse_dot] expected q (G, N, D)");
  CHECK_THROWS_MSG(sparse_weighted_sum(leaf64({1, 2, 2}, 1), sk, ti64({0, 1}, {1, 2, 1})), ShapeError,
                   "[sparse_weighted_sum] expected w (G, N, 1)");
  CHECK_THROWS_MSG(sparse_weighted_sum(to(sq.detach(), kFloat32), sk, ti64({0, 1}, {1, 2, 1})), DTypeError,
                   "[sparse_weighted_sum] w and v must share one float dtype");
  // Operands on two devices are refused by name before any kernel runs (fake_cuda
  // has no storage and is never read).
  CHECK_THROWS_MSG(sparse_dot(sq, fake_cuda({1, 4, 3}, kFloat64), ti64({0, 1}, {1, 2, 1})), DeviceError,
                   "[sparse_dot] q, k and idx must be on one device", "cuda:0");
}

namespace {
// Forward and gradients on CUDA against the CPU, float64 and float32, with keys
// drawn from [0, 5) of M = 7 rows: many repeats, so the scatter adds several
// terms into one row.
void sparse_parity(const char* op, const Shape& a, const Shape& b,
                   Tensor (*f)(const Tensor&, const Tensor&, const Tensor&)) {
  const Tensor idx = random_ints({3, 9, 4}, 0, 4, 17);
  for (bool f64 : {true, false}) {
    INFO((f64 ? "float64" : "float32"));
    auto leaf = [&](const Shape& s, uint64_t seed) { return f64 ? leaf64(s, seed) : leaf32(s, seed); };
    ParityOptions opt;
    if (!f64) opt.atol = 1e-5, opt.rtol = 1e-4;
    else opt.atol = 1e-12, opt.rtol = 1e-12;
    check_parity(op, [&](const std::vector<Tensor>& x) { return f(x[0], x[1], idx.to(x[0].device())); },
                 {leaf(a, 1), leaf(b, 2)}, opt);
  }
}
}  // namespace

PARITY_CASE(sparse_dot) { sparse_parity("sparse_dot", {3, 9, 5}, {3, 7, 5}, sparse_dot); }

PARITY_CASE(sparse_weighted_sum) { sparse_parity("sparse_weighted_sum", {3, 9, 4}, {3, 7, 6}, sparse_weighted_sum); }

TEST_CASE("sparse products in float32: every CPU tier gives the baseline tier's bits, forward and backward") {
  // Head sizes with and without a multiple of 16 (the AVX-512 dot products' blocked path and
  // dot()'s tail), key lists with and without whole groups of 16, repeated keys, zero weights.
  struct Restore {
    kernels::CpuIsa before = kernels::cpu_isa();
    ~Restore() { kernels::set_cpu_isa(before); }
  } restore;
  std::vector<kernels::CpuIsa> tiers;
  for (kernels::CpuIsa isa : {kernels::CpuIsa::kBaseline, kernels::CpuIsa::kAvx2, kernels::CpuIsa::kAvx512})
    if (kernels::cpu_isa_runs(isa)) tiers.push_back(isa);
  for (int64_t d : {1, 7, 8, 16, 20, 24, 32, 40, 48}) {
    for (int64_t kk : {1, 15, 16, 17, 33}) {
      CAPTURE(d);
      CAPTURE(kk);
      const int64_t G = 3, N = 5, M = 40;
      Generator g(uint64_t(d * 100 + kk));
      Tensor q = randn({G, N, d}, kFloat32, g), k = randn({G, M, d}, kFloat32, g);
      Tensor w = randn({G, N, kk}, kFloat32, g) * to(gt(rand({G, N, kk}, kFloat32, g, 0, 1), 0.2), kFloat32);  // some 0
      Tensor idx = randint(0, M, {G, N, kk}, g);
      // A query row of zeros (group 1, query 2) against negative keys: every product is -0, and
      // the sum must come out +0 in every tier, as dot()'s + 0 for its empty tail makes it.
      std::vector<float> qv = q.to_vector<float>(), kv = k.to_vector<float>();
      for (int64_t j = 0; j < d; ++j) qv[size_t((1 * N + 2) * d + j)] = 0.0f;
      for (float& x : kv) x = -std::fabs(x) - 0.5f;
      q = Tensor::from_vector(qv, {G, N, d});
      k = Tensor::from_vector(kv, {G, M, d});
      q.set_requires_grad(true);
      k.set_requires_grad(true);
      w.set_requires_grad(true);
      auto run = [&](kernels::CpuIsa isa) {
        kernels::set_cpu_isa(isa);
        for (const Tensor* t : {&q, &k, &w}) t->zero_grad();
        Tensor s = sparse_dot(q, k, idx), o = sparse_weighted_sum(w, k, idx);
        (sum(s * s) + sum(o * o)).backward();  // dq, dk, dw: weighted sums, dot products and scatters
        std::vector<std::vector<float>> all;
        for (const Tensor& t : {s, o, q.grad(), k.grad(), w.grad()}) all.push_back(t.to_vector<float>());
        return all;
      };
      const auto base = run(kernels::CpuIsa::kBaseline);
      for (kernels::CpuIsa isa : tiers) {
        CAPTURE(kernels::cpu_isa_name(isa));
        const auto got = run(isa);
        for (size_t i = 0; i < got.size(); ++i) {
          CAPTURE(i);
          REQUIRE(got[i].size() == base[i].size());
          CHECK(std::memcmp(got[i].data(), base[i].data(), got[i].size() * sizeof(float)) == 0);
        }
      }
      // and the float32 products are the float64 ones to float32 rounding
      Tensor s64 = sparse_dot(to(q.detach(), kFloat64), to(k.detach(), kFloat64), idx);
      check_close(to(sparse_dot(q.detach(), k.detach(), idx), kFloat64), s64, 1e-5);
      for (float x : sparse_dot(q.detach(), k.detach(), idx).to_vector<float>())
        CHECK_FALSE((x == 0.0f && std::signbit(x)));  // the zero row's sums are +0
    }
  }
}

}  // TEST_SUITE
