// CUDA parity of matmul (cuBLAS, kernels/matmul/matmul_cuda.cu) and of
// sort / argsort / topk (CUB radix sort, kernels/sort/sort_cuda.cu) against the CPU.
#include <random>

#include "cuda/cuda_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

using Inputs = std::vector<Tensor>;

Tensor mm(const Inputs& x) { return matmul(x[0], x[1]); }

// float32 values in [lo, hi] as small integers (many ties), with NaN, -0.0 and
// +0.0 sprinkled in at fixed positions.
Tensor tied(const Shape& s, int lo, int hi, uint32_t seed, bool nan = true) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<float> v(size_t(numel_of(s)));
  for (float& e : v) e = float(d(rng));
  for (size_t i = 0; i < v.size(); ++i) {
    if (nan && i % 7 == 3) v[i] = NAN;
    if (i % 11 == 5) v[i] = -0.0f;
    if (i % 13 == 6) v[i] = 0.0f;
  }
  return Tensor::from_vector(v, s);
}

// Exact equality of the indices of f on both devices (ties must resolve alike),
// and of the values where f returns them (NaN == NaN).
void check_same_order(const std::function<ValuesIndices(const Tensor&)>& f, const Tensor& x) {
  ValuesIndices c = f(x), g = f(x.to(Device::cuda(0)));
  REQUIRE(g.indices.device().is_cuda());
  CHECK(g.indices.shape() == c.indices.shape());
  CHECK(values(g.indices) == values(c.indices));
  if (c.values.defined()) {
    std::vector<double> gv = values(g.values), cv = values(c.values);
    REQUIRE(gv.size() == cv.size());
    size_t bad = 0;
    for (size_t i = 0; i < gv.size(); ++i)
      if (!(gv[i] == cv[i] || (std::isnan(gv[i]) && std::isnan(cv[i])))) ++bad;
    CHECK(bad == 0);
  }
}

}  // namespace

TEST_SUITE("cuda/linalg_sort") {

PARITY_CASE("matmul") {
  check_parity("matmul", mm, {leaf32({5, 7}, 1), leaf32({7, 3}, 2)});
  check_parity("matmul", mm, {leaf32({4, 5, 7}, 3), leaf32({4, 7, 3}, 4)});
  // Broadcast batch: one operand shared by the whole batch (stride 0: one
  // strided-batched call) and batch axes broadcast both ways (pointer-array call).
  check_parity("matmul", mm, {leaf32({4, 5, 7}, 5), leaf32({7, 3}, 6)});
  check_parity("matmul", mm, {leaf32({2, 1, 5, 7}, 7), leaf32({3, 7, 4}, 8)});
  // Transposed views (CUBLAS_OP_T) and a sliced operand that needs a copy.
  check_parity("matmul", [](const Inputs& x) { return matmul(transpose(x[0], 0, 1), x[1]); },
               {leaf32({7, 5}, 9), leaf32({7, 3}, 10)});
  check_parity("matmul", [](const Inputs& x) { return matmul(x[0], transpose(x[1], -1, -2)); },
               {leaf32({2, 5, 7}, 11), leaf32({2, 3, 7}, 12)});
  check_parity("matmul", [](const Inputs& x) { return matmul(slice(x[0], 1, 0, 14, 2), x[1]); },
               {leaf32({5, 14}, 13), leaf32({7, 3}, 14)});
  // 1-d operands.
  check_parity("matmul", mm, {leaf32({7}, 15), leaf32({7, 3}, 16)});
  check_parity("matmul", mm, {leaf32({5, 7}, 17), leaf32({7}, 18)});
  check_parity("matmul", mm, {leaf32({7}, 19), leaf32({7}, 20)});
  check_parity("matmul", mm, {leaf32({3, 1, 7}, 21), leaf32({7}, 22)});
  // Empty: K = 0 gives zeros; M = 0 or N = 0 gives an empty result.
  check_parity("matmul", mm, {leaf32({2, 0}, 23), leaf32({0, 3}, 24)});
  check_parity("matmul", mm, {leaf32({0, 4}, 25), leaf32({4, 3}, 26)});
  check_parity("matmul", mm, {leaf32({2, 4}, 27), leaf32({4, 0}, 28)});
  // 512^3: sums of 512 products of float32 values of size ~1 come out ~10 in
  // size, and the CPU's BLAS and cuBLAS add them in different orders (blocking,
  // FMA), so results differ by a few float32 ulps of the sum times sqrt(512):
  // ~1e-4 absolute, beyond the default atol 1e-5. The backward has the same sums.
  ParityOptions big;
  big.atol = 1e-3;
  big.rtol = 1e-3;
  check_parity("matmul", mm, {leaf32({512, 512}, 29), leaf32({512, 512}, 30)}, big);
  check_parity("matmul", mm, {leaf32({8, 64, 128}, 31), leaf32({128, 96}, 32)}, big);

  check_grad_cuda("matmul", mm, {leaf64({3, 4}, 1), leaf64({4, 2}, 2)});
  check_grad_cuda("matmul", mm, {leaf64({2, 3, 4}, 1), leaf64({4, 2}, 2)});
  check_grad_cuda("matmul", mm, {leaf64({2, 1, 3, 4}, 1), leaf64({3, 4, 2}, 2)});
  check_grad_cuda("matmul", mm, {leaf64({4}, 1), leaf64({4, 2}, 2)});
  check_grad_cuda("matmul", mm, {leaf64({3, 4}, 1), leaf64({4}, 2)});
  check_grad_cuda("matmul", [](const Inputs& x) { return matmul(transpose(x[0], 0, 1), x[1]); },
                  {leaf64({4, 3}, 1), leaf64({4, 2}, 2)});
}

CUDA_TEST_CASE("matmul with TF32 allowed stays close and is off again afterwards") {
  const bool was = cuda::allow_tf32();
  cuda::set_allow_tf32(true);
  // TF32 rounds inputs to 10 mantissa bits (relative error ~5e-4 a product).
  ParityOptions loose;
  loose.atol = 5e-2;
  loose.rtol = 1e-2;
  loose.backward = false;
  check_parity("matmul", mm, {leaf32({256, 256}, 1), leaf32({256, 256}, 2)}, loose);
  cuda::set_allow_tf32(was);
  CHECK_FALSE(cuda::allow_tf32());
  // Switched off again: float32 is back to full precision (default tolerances).
  check_parity("matmul", mm, {leaf32({64, 64}, 3), leaf32({64, 64}, 4)});
}

PARITY_CASE("sort") {
  auto s1 = [](const Inputs& x) { return sort(x[0], 1).values; };
  check_parity("sort", s1, {leaf32({3, 5})});
  check_parity("sort", [](const Inputs& x) { return sort(x[0], 0, true).values; }, {leaf32({4, 3}, 2)});
  // Non-contiguous input along a strided axis.
  check_parity("sort", [](const Inputs& x) { return sort(transpose(x[0], 0, 1), 1, true).values; },
               {leaf32({6, 4}, 3)});
  check_parity("sort", [](const Inputs& x) { return sort(slice(x[0], 1, 0, 10, 2), -1).values; },
               {leaf32({3, 10}, 4)});
  // int64 and float64 forward.
  check_parity("sort", [](const Inputs& x) { return sort(x[0], 1).values; },
               {Tensor::from_vector(std::vector<int64_t>{5, -3, 5, 0, INT64_MIN, INT64_MAX, -3, 2}, {2, 4})});
  check_parity("sort", s1, {to(leaf32({3, 5}, 5), kFloat64)});
  // Empty: no lines, and zero-length lines.
  check_parity("sort", s1, {leaf32({0, 5}, 6)});
  check_parity("sort", s1, {leaf32({3, 0}, 7)});
  // One line longer than 4096 (device-wide sort), several long lines, many short lines.
  check_parity("sort", [](const Inputs& x) { return sort(x[0], 0).values; }, {leaf32({10000}, 8)});
  check_parity("sort", s1, {leaf32({3, 5000}, 9)});
  check_parity("sort", s1, {leaf32({20000, 7}, 10)});
  // Ties, NaN and signed zeros: indices and values exactly as on the CPU.
  for (bool desc : {false, true}) {
    for (const Shape& s : {Shape{4, 37}, Shape{2, 6000}, Shape{30000, 5}}) {
      check_same_order([desc](const Tensor& t) { return sort(t, -1, desc); }, tied(s, -3, 3, 1));
      check_same_order([desc](const Tensor& t) { return sort(t, 0, desc); }, tied(s, -3, 3, 2));
    }
    check_same_order([desc](const Tensor& t) { return sort(t, -1, desc); }, to(tied({5, 40}, -2, 2, 3), kFloat64));
    check_same_order([desc](const Tensor& t) { return sort(t, 1, desc); }, to(tied({5, 40}, -2, 2, 4, false), kInt64));
  }
  check_grad_cuda("sort", s1, {leaf64({3, 5})});
  check_grad_cuda("sort", [](const Inputs& x) { return sort(x[0], 0, true).values; }, {leaf64({4, 3}, 2)});
}

PARITY_CASE("topk") {
  auto t2 = [](const Inputs& x) { return topk(x[0], 2, 1).values; };
  check_parity("topk", t2, {leaf32({3, 5})});
  check_parity("topk", [](const Inputs& x) { return topk(x[0], 3, 0, false).values; }, {leaf32({4, 3}, 2)});
  check_parity("topk", [](const Inputs& x) { return topk(transpose(x[0], 0, 1), 2, 0).values; },
               {leaf32({5, 3}, 3)});
  check_parity("topk", [](const Inputs& x) { return topk(x[0], 2, 1).indices; },
               {Tensor::from_vector(std::vector<int64_t>{1, 9, 9, -4, 0, 0, 7, 7}, {2, 4})});
  check_parity("topk", [](const Inputs& x) { return topk(x[0], 0, 1).values; }, {leaf32({3, 5}, 4)});
  check_parity("topk", t2, {leaf32({0, 5}, 5)});
  check_parity("topk", [](const Inputs& x) { return topk(x[0], 10, 1).values; }, {leaf32({4, 8192}, 6)});
  check_parity("topk", [](const Inputs& x) { return topk(x[0], 3, 1, false).values; }, {leaf32({50000, 9}, 7)});
  for (bool largest : {true, false}) {
    for (const Shape& s : {Shape{4, 37}, Shape{2, 6000}, Shape{30000, 5}}) {
      check_same_order([largest](const Tensor& t) { return topk(t, 3, -1, largest); }, tied(s, -3, 3, 5));
      check_same_order([largest](const Tensor& t) { return topk(t, 2, 0, largest); }, tied(s, -3, 3, 6));
    }
  }
  check_grad_cuda("topk", t2, {leaf64({3, 5})});
  check_grad_cuda("topk", [](const Inputs& x) { return topk(x[0], 3, 0, false).values; }, {leaf64({4, 3}, 2)});
}

PARITY_CASE("argsort") {
  check_parity("argsort", [](const Inputs& x) { return argsort(x[0]); }, {leaf32({3, 5})});
  check_parity("argsort", [](const Inputs& x) { return argsort(x[0], 0, true); }, {tied({6, 4}, -2, 2, 7)});
  check_parity("argsort", [](const Inputs& x) { return argsort(transpose(x[0], 0, 1), 1); }, {tied({9, 3}, -2, 2, 8)});
  check_parity("argsort", [](const Inputs& x) { return argsort(x[0]); },
               {Tensor::from_vector(std::vector<int64_t>{3, 1, 3, 1, 2, 2}, {6})});
  check_parity("argsort", [](const Inputs& x) { return argsort(x[0]); }, {leaf32({2, 0}, 9)});
  for (bool desc : {false, true}) {
    for (const Shape& s : {Shape{4, 37}, Shape{1, 9000}, Shape{30000, 5}}) {
      check_same_order([desc](const Tensor& t) { return ValuesIndices{Tensor(), argsort(t, -1, desc)}; },
                       tied(s, -3, 3, 9));
    }
  }
}

}
