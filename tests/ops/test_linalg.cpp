#include "test_util.h"
#include "kernels/matmul/matmul.h"
#include "cuda/cuda_test_util.h"
#include <random>
#include <strings.h>
#include <cstdlib>

using namespace cf;
using namespace cf::test;

TEST_SUITE("ops/linalg") {

// Naive batched matmul on contiguous host data: (B, M, K) @ (B, K, N).
static std::vector<double> naive_mm(const std::vector<double>& a, const std::vector<double>& b,
                                    int64_t B, int64_t M, int64_t K, int64_t N, bool bcast_b = false) {
  std::vector<double> c(size_t(B * M * N), 0.0);
  for (int64_t p = 0; p < B; ++p)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += a[size_t(p * M * K + i * K + k)] * b[size_t((bcast_b ? 0 : p) * K * N + k * N + j)];
        c[size_t(p * M * N + i * N + j)] = s;
      }
  return c;
}

TEST_CASE("matmul matches naive loops for 2-d, batched, broadcast and transposed operands") {
  Generator g(11);
  Tensor a = randn({5, 7}, kFloat64, g), b = randn({7, 3}, kFloat64, g);
  check_close(matmul(a, b), naive_mm(a.to_vector<double>(), b.to_vector<double>(), 1, 5, 7, 3), 1e-12);
  Tensor A = randn({4, 5, 7}, kFloat64, g), Bm = randn({4, 7, 3}, kFloat64, g);
  check_close(matmul(A, Bm), naive_mm(A.to_vector<double>(), Bm.to_vector<double>(), 4, 5, 7, 3), 1e-12);
  // Broadcast batch: (4,5,7) @ (7,3).
  check_close(matmul(A, b), naive_mm(A.to_vector<double>(), b.to_vector<double>(), 4, 5, 7, 3, true), 1e-12);
  // A batch against one shared right operand runs as one folded GEMM: 4-d with a
  // (1, 1, K, N) right operand, and a non-contiguous batch (a per-entry GEMM).
  Tensor A4 = randn({2, 3, 5, 7}, kFloat64, g);
  check_close(matmul(A4, reshape(b, {1, 1, 7, 3})),
              naive_mm(A4.to_vector<double>(), b.to_vector<double>(), 6, 5, 7, 3, true), 1e-12);
  Tensor A4t = transpose(A4, 0, 1);
  check_close(matmul(A4t, b), naive_mm(contiguous(A4t).to_vector<double>(), b.to_vector<double>(), 6, 5, 7, 3, true),
              1e-12);
  // Transposed operands go to BLAS without copies; a sliced column stride needs one.
  Tensor at = transpose(randn({7, 5}, kFloat64, g), 0, 1);
  check_close(matmul(at, b), naive_mm(contiguous(at).to_vector<double>(), b.to_vector<double>(), 1, 5, 7, 3), 1e-12);
  Tensor wide = randn({5, 14}, kFloat64, g);
  Tensor strided = slice(wide, 1, 0, 14, 2);
  check_close(matmul(strided, b),
              naive_mm(contiguous(strided).to_vector<double>(), b.to_vector<double>(), 1, 5, 7, 3), 1e-12);
  // float32.
  Tensor a32 = to(a, kFloat32), b32 = to(b, kFloat32);
  check_close(matmul(a32, b32), naive_mm(a.to_vector<double>(), b.to_vector<double>(), 1, 5, 7, 3), 1e-4);
  // 1-d operands.
  Tensor v = randn({7}, kFloat64, g);
  CHECK(matmul(a, v).shape() == Shape{5});
  CHECK(matmul(v, b).shape() == Shape{3});
  CHECK(matmul(v, v).dim() == 0);
  double dot = 0;
  auto vv = v.to_vector<double>();
  for (double x : vv) dot += x * x;
  CHECK(std::fabs(matmul(v, v).item() - dot) < 1e-12);
  // Empty inner dimension gives zeros.
  check_close(matmul(Tensor::zeros({2, 0}, kFloat64), Tensor::zeros({0, 2}, kFloat64)), {0, 0, 0, 0});
}

TEST_CASE("matmul bad input") {
  CHECK_THROWS_MSG(matmul(Tensor::zeros({2, 3}), Tensor::zeros({4, 5})), ShapeError,
                   "[matmul] shape mismatch: (2,3) @ (4,5)");
  CHECK_THROWS_MSG(matmul(Tensor::zeros({2, 3}), Tensor::zeros({3, 2}, kFloat64)), DTypeError, "[matmul]",
                   "float32", "float64");
  CHECK_THROWS_MSG(matmul(Tensor::zeros({2, 2}, kInt64), Tensor::zeros({2, 2}, kInt64)), DTypeError,
                   "[matmul]", "int64");
  CHECK_THROWS_MSG(matmul(Tensor::scalar(1.0), Tensor::zeros({2})), ShapeError, "[matmul]", "()");
  CHECK_THROWS_MSG(matmul(Tensor::zeros({2, 2, 3}), Tensor::zeros({3, 3, 2})), ShapeError, "[matmul]", "(2)",
                   "(3)");
  CHECK_THROWS_MSG(matmul(Tensor::zeros({2, 2}), fake_cuda({2, 2})), DeviceError, "[matmul]", "cuda:0");
}

TEST_CASE("linear equals matmul(x, W^T) + b, its weight's gradient comes contiguous, and bad input is named") {
  for (DType dt : {kFloat64, kFloat32}) {
    INFO(dt);
    const double tol = dt == kFloat64 ? 1e-13 : 1e-5;
    Generator gen(4);
    const Tensor x0 = rand({2, 3, 5}, dt, gen, -1, 1), w0 = rand({4, 5}, dt, gen, -1, 1), b0 = rand({4}, dt, gen, -1, 1);
    for (bool strided : {false, true}) {
      for (bool with_bias : {true, false}) {
        auto run = [&](bool fused) {
          // strided: x a (3, 2, 5) leaf seen transposed
          Tensor x = strided ? contiguous(transpose(x0, 0, 1)) : x0.detach(), w = w0.detach(), b = b0.detach();
          for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
          const Tensor xin = strided ? transpose(x, 0, 1) : x;
          Tensor y = fused ? linear(xin, w, with_bias ? b : Tensor()) : matmul(xin, transpose(w, 0, 1));
          if (!fused && with_bias) y = y + b;
          Generator gw(9);
          sum(y * rand(y.shape(), dt, gw, -1, 1)).backward();
          return std::vector<Tensor>{y, x.grad(), w.grad(), with_bias ? b.grad() : Tensor()};
        };
        const std::vector<Tensor> f = run(true), r = run(false);
        for (size_t i = 0; i < 3; ++i) check_close(f[i], r[i], tol);
        if (with_bias) check_close(f[3], r[3], tol);
        CHECK(f[2].is_contiguous());
      }
    }
  }
  // 1-d input, empty rows, in_features 0 (zeros plus the bias)
  Tensor w = leaf64({3, 2}, 1), b = leaf64({3}, 2);
  check_close(linear(t64({1, 2}, {2}), w, b), matmul(t64({1, 2}, {2}), transpose(w, 0, 1)) + b, 1e-15);
  CHECK(linear(Tensor::zeros({0, 2}, kFloat64), w, b).shape() == Shape{0, 3});
  check_close(linear(Tensor::zeros({2, 0}, kFloat64), Tensor::zeros({3, 0}, kFloat64), b), expand(b, {2, 3}), 0);
  // The step's kernel calls: the product and the bias each way, no copy of W's gradient into .grad.
  Tensor x = leaf64({4, 2}, 3);
  KernelCalls before = kernel_calls();
  Tensor y = linear(x, w, b);
  CHECK((kernel_calls() - before).cpu == 2);
  const Tensor g = leaf64({4, 3}, 4).detach();
  before = kernel_calls();
  y.backward(g);
  CHECK((kernel_calls() - before).cpu == 3);  // g W, g^T x, the bias's sum
  // Autocast: the product and the bias in the low dtype
  {
    AutocastGuard guard(kBFloat16);
    CHECK(linear(to(x, kFloat32), to(w, kFloat32), to(b, kFloat32)).dtype() == kBFloat16);
  }
  CHECK_THROWS_MSG(linear(x, leaf64({3}, 1)), ShapeError, "[linear] weight must be 2-d (out_features, in_features), got (3)");
  CHECK_THROWS_MSG(linear(x, leaf64({3, 5}, 1)), ShapeError, "[linear] x (4,2) does not end in weight (3,5)'s in_features 5");
  CHECK_THROWS_MSG(linear(x, w, leaf64({2}, 1)), ShapeError, "[linear] bias must be (3) for weight (3,2), got (2)");
  CHECK_THROWS_MSG(linear(x, to(w, kFloat32)), DTypeError, "[linear]", "float64", "float32");
  CHECK_THROWS_MSG(linear(ti64({1, 2}, {1, 2}), to(w, kInt64)), DTypeError, "[linear]", "int64");
  CHECK_THROWS_MSG(linear(x, fake_cuda({3, 2})), DeviceError, "[linear]", "cuda:0");
  CHECK_THROWS_MSG(linear(Tensor(), w), ValueError, "[linear]", "x");
}

GRADCHECK_CASE(linear) {
  check_grad("linear", [](auto& x) { return linear(x[0], x[1], x[2]); },
             {leaf64({2, 3, 4}, 1), leaf64({5, 4}, 2), leaf64({5}, 3)});
  check_grad("linear", [](auto& x) { return linear(transpose(x[0], 0, 1), x[1]); }, {leaf64({4, 3}, 4), leaf64({2, 4}, 5)});
  check_grad("linear", [](auto& x) { return linear(x[0], x[1], x[2]); }, {leaf64({4}, 6), leaf64({3, 4}, 7), leaf64({3}, 8)});
}

GRADCHECK_CASE(matmul) {
  check_grad("matmul", [](auto& x) { return matmul(x[0], x[1]); }, {leaf64({3, 4}, 1), leaf64({4, 2}, 2)});
  check_grad("matmul", [](auto& x) { return matmul(x[0], x[1]); }, {leaf64({2, 3, 4}, 1), leaf64({4, 2}, 2)});
  check_grad("matmul", [](auto& x) { return matmul(x[0], x[1]); },
             {leaf64({2, 1, 3, 4}, 1), leaf64({3, 4, 2}, 2)});
  // The folded forms: a shared (1, K, N) right operand; a non-contiguous batch.
  check_grad("matmul", [](auto& x) { return matmul(x[0], x[1]); }, {leaf64({2, 3, 4}, 1), leaf64({1, 4, 2}, 2)});
  check_grad("matmul", [](auto& x) { return matmul(transpose(x[0], 0, 1), x[1]); },
             {leaf64({3, 2, 4}, 1), leaf64({4, 2}, 2)});
  check_grad("matmul", [](auto& x) { return matmul(x[0], x[1]); }, {leaf64({4}, 1), leaf64({4, 2}, 2)});
  check_grad("matmul", [](auto& x) { return matmul(x[0], x[1]); }, {leaf64({3, 4}, 1), leaf64({4}, 2)});
  check_grad("matmul", [](auto& x) { return matmul(transpose(x[0], 0, 1), x[1]); },
             {leaf64({4, 3}, 1), leaf64({4, 2}, 2)});
}

}

// ---------------------------------------------------------------- CUDA parity
// CUDA parity of matmul (cuBLAS, kernels/matmul/matmul_cuda.cu) against the CPU.

namespace {
Tensor mm(const Inputs& x) { return matmul(x[0], x[1]); }
}  // namespace

TEST_SUITE("ops/linalg") {

PARITY_CASE(linear) {
  check_parity("linear", [](const Inputs& x) { return linear(x[0], x[1], x[2]); },
               {leaf32({3, 5, 7}, 31), leaf32({4, 7}, 32), leaf32({4}, 33)});
  check_parity("linear", [](const Inputs& x) { return linear(transpose(x[0], 0, 1), x[1]); },
               {leaf32({7, 5}, 34), leaf32({3, 7}, 35)});
  check_parity("linear", [](const Inputs& x) { return linear(x[0], x[1], x[2]); },
               {leaf32({0, 7}, 36), leaf32({4, 7}, 37), leaf32({4}, 38)});
}

PARITY_CASE(matmul) {
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

}  // TEST_SUITE

TEST_SUITE("ops/linalg") {
TEST_CASE("blas_kernels names the OpenBLAS kernel family in use: the one OPENBLAS_CORETYPE chose, when set") {
  const kernels::BlasKernels k = kernels::blas_kernels();
  CHECK_FALSE(k.family.empty());
  // scripts/test.sh sets OPENBLAS_CORETYPE from the CPU's flags (scripts/openblas-env.sh);
  // then the family is that one, and never older than the CPU
  // (only an OpenBLAS built with DYNAMIC_ARCH reads it)
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced && k.config.find("DYNAMIC_ARCH") != std::string::npos) {
    CHECK(strcasecmp(forced, k.family.c_str()) == 0);
    if (strcasecmp(forced, "SkylakeX") == 0 || strcasecmp(forced, "Haswell") == 0) CHECK_FALSE(k.older_than_cpu);
  }
}
}  // TEST_SUITE
