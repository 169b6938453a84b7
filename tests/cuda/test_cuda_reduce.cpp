// CUDA parity of the reductions (kernels/reduce/reduce_cuda.cu) and of the fused
// row ops softmax, log_softmax, layer_norm and cross_entropy against the CPU:
// contiguous and strided inputs (views made inside f, so both devices see the same
// strides), every axis choice, keepdim, long reductions (100000 elements, 1M,
// chunked multi-block paths) and many short rows, ties and NaN for max/min,
// int64 and bool where the CPU accepts them, empty reductions, float64 gradchecks
// on CUDA mirroring tests/ops, and the cross_entropy bad-target error.
//
// Tolerances: every kernel here accumulates float32 in double on both devices, so
// even the 1M-element sums round to within an ulp of each other and the default
// float32 tolerances (DESIGN.md section 4) hold; none is loosened.
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "cuda/cuda_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

using Inputs = std::vector<Tensor>;
using Fn = std::function<Tensor(const Tensor&)>;

// f on x of shape s in three layouts: contiguous, every axis reversed (a permuted
// view of a reversed-shape leaf) and a step-2 slice of the last axis.
void parity_layouts(const char* op, const Fn& f, const Shape& s, uint64_t seed, const ParityOptions& opt = {}) {
  check_parity(op, [f](const Inputs& x) { return f(x[0]); }, {leaf32(s, seed)}, opt);
  if (s.size() >= 2) {
    Shape r;
    std::vector<int64_t> perm;
    for (size_t i = s.size(); i-- > 0;) {
      r.push_back(s[i]);
      perm.push_back(int64_t(i));
    }
    check_parity(op, [f, perm](const Inputs& x) { return f(permute(x[0], perm)); }, {leaf32(r, seed + 1)}, opt);
  }
  if (!s.empty()) {
    Shape b = s;
    const int64_t last = int64_t(s.size()) - 1;
    b.back() *= 2;
    const int64_t len = b.back();
    check_parity(op, [f, last, len](const Inputs& x) { return f(slice(x[0], last, 0, len, 2)); },
                 {leaf32(b, seed + 2)}, opt);
  }
}

// The axis choices of the reduction cases on a 3-d input.
const std::vector<Axes>& axis_sets() {
  static const std::vector<Axes> a = {{}, {2}, {0}, {1}, {0, 2}, {-1, 0, 1}};
  return a;
}

// float32 values drawn from a few levels (many ties), shape s, requiring grad.
Tensor ties32(const Shape& s, uint32_t seed, int levels = 3) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, levels - 1);
  std::vector<float> v(size_t(numel_of(s)));
  for (float& e : v) e = float(d(rng)) - 1.0f;
  Tensor t = t32(v, s);
  t.set_requires_grad(true);
  return t;
}

// float32 with NaN at a few positions (two in the same row), no grad.
Tensor with_nan32(const Shape& s, uint64_t seed) {
  Tensor t = leaf32(s, seed).detach();
  std::vector<float> v = t.to_vector<float>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  v[1] = nan;
  v[3] = nan;
  if (v.size() > 10) v[v.size() - 2] = nan;
  return t32(v, s);
}

Tensor rand_targets(const Shape& s, int64_t classes, uint32_t seed, int64_t ignore = -100, double p_ignore = 0.2) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> d(0, classes - 1);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int64_t> v(size_t(numel_of(s)));
  for (int64_t& e : v) e = u(rng) < p_ignore ? ignore : d(rng);
  return Tensor::from_vector(v, s);
}

// Reduction cases shared by sum / mean / var / logsumexp / amax / amin.
void reduce_cases(const char* op, const std::function<Tensor(const Tensor&, const Axes&, bool)>& r) {
  uint64_t seed = 10;
  for (const Axes& axes : axis_sets())
    for (bool keep : {false, true})
      parity_layouts(op, [r, axes, keep](const Tensor& x) { return r(x, axes, keep); }, {4, 5, 6}, seed += 3);
  // Long rows: one block per output (100000 contiguous), chunked over several
  // blocks (one output), strided reduced axis with few outputs (column kernel, chunked).
  check_parity(op, [r](const Inputs& x) { return r(x[0], {}, false); }, {leaf32({100000}, 1)});
  check_parity(op, [r](const Inputs& x) { return r(x[0], {1}, false); }, {leaf32({3, 100000}, 2)});
  check_parity(op, [r](const Inputs& x) { return r(x[0], {0}, true); }, {leaf32({100000, 3}, 3)});
  check_parity(op, [r](const Inputs& x) { return r(x[0], {}, false); }, {leaf32({1 << 20}, 4)});
  // Many short rows (thread per output), and rows of 33..1023 (warp per output).
  check_parity(op, [r](const Inputs& x) { return r(x[0], {1}, false); }, {leaf32({20000, 5}, 5)});
  check_parity(op, [r](const Inputs& x) { return r(x[0], {1}, false); }, {leaf32({3000, 300}, 6)});
  check_parity(op, [r](const Inputs& x) { return r(x[0], {0, 2}, false); }, {leaf32({7, 3000, 9}, 7)});
  // A scalar (var of one element needs correction 0: the var cases pass it separately).
  if (std::string(op) != "var")
    check_parity(op, [r](const Inputs& x) { return r(x[0], {}, false); }, {leaf32({}, 8)});
}

}  // namespace

TEST_SUITE("cuda/reduce") {

PARITY_CASE("sum") {
  reduce_cases("sum", [](const Tensor& x, const Axes& a, bool k) { return sum(x, a, k); });
  // int64 (the CPU accumulates in int64) and bool (counted as int64).
  Tensor xi = ti64({3, -7, 12, 5, 0, 9, -2, 4, 8, 1, 1, 6}, {3, 4});
  for (const Axes& a : std::vector<Axes>{{}, {0}, {1}})
    check_parity("sum", [a](const Inputs& x) { return sum(x[0], a); }, {xi});
  check_parity("sum", [](const Inputs& x) { return sum(gt(x[0], 0.0), {1}); }, {leaf32({50, 7000}, 9)});
  check_parity("sum", [](const Inputs& x) { return sum(transpose(x[0], 0, 1), {0}); },
               {Tensor::full({1000, 300}, 3.0, kInt64)});
  // Empty reductions: an empty reduced axis gives zeros; an empty kept axis nothing.
  check_parity("sum", [](const Inputs& x) { return sum(x[0], {1}); }, {leaf32({3, 0}, 10)});
  check_parity("sum", [](const Inputs& x) { return sum(x[0], {0}); }, {leaf32({0, 3}, 11)});
  check_parity("sum", [](const Inputs& x) { return sum(x[0], {1}); }, {leaf32({0, 3}, 12)});
  check_parity("sum", [](const Inputs& x) { return sum(x[0]); }, {leaf32({0}, 13)});
  check_grad_cuda("sum", [](auto& x) { return sum(x[0], {0, 2}); }, {leaf64({2, 3, 2})});
  check_grad_cuda("sum", [](auto& x) { return sum(x[0], {1}, true); }, {leaf64({2, 3})});
}

PARITY_CASE("mean") {
  reduce_cases("mean", [](const Tensor& x, const Axes& a, bool k) { return mean(x, a, k); });
  check_grad_cuda("mean", [](auto& x) { return mean(x[0], {1}); }, {leaf64({2, 3})});
}

PARITY_CASE("var") {
  reduce_cases("var", [](const Tensor& x, const Axes& a, bool k) { return var(x, a, 1, k); });
  reduce_cases("var", [](const Tensor& x, const Axes& a, bool k) { return var(x, a, 0, k); });
  // Large mean against a small spread (where a one-pass E[x^2] - E[x]^2 would cancel).
  check_parity("var", [](const Inputs& x) { return var(add(x[0], 1000.0), {1}); }, {leaf32({4, 5000}, 14)});
  check_parity("var", [](const Inputs& x) { return var(x[0], {}, 0); }, {leaf32({}, 23)});
  check_grad_cuda("var", [](auto& x) { return var(x[0], {1}); }, {leaf64({2, 4})});
  check_grad_cuda("var", [](auto& x) { return var(x[0], {}, 0); }, {leaf64({2, 4})});
}

PARITY_CASE("logsumexp") {
  reduce_cases("logsumexp", [](const Tensor& x, const Axes& a, bool k) { return logsumexp(x, a, k); });
  // Large values (stability), -inf rows / entries, +inf and NaN (forward: the CPU's rules).
  check_parity("logsumexp", [](const Inputs& x) { return logsumexp(mul(x[0], 500.0), {1}); },
               {leaf32({6, 2000}, 15)});
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  Tensor special = t32({-inf, -inf, -inf, -inf, 1, 2, -inf, 0, inf, 1, nan, 2, nan, nan, nan, 3, 4, 5, 6, nan},
                       {5, 4});
  ParityOptions fwd;
  fwd.backward = false;
  check_parity("logsumexp", [](const Inputs& x) { return logsumexp(x[0], {1}); }, {special}, fwd);
  check_parity("logsumexp", [](const Inputs& x) { return logsumexp(x[0], {0}); }, {special}, fwd);
  check_grad_cuda("logsumexp", [](auto& x) { return logsumexp(x[0], {0}); }, {leaf64({3, 2})});
}

PARITY_CASE("amax") {
  reduce_cases("amax", [](const Tensor& x, const Axes& a, bool k) { return amax(x, a, k); });
  // Ties (the gradient is shared between them) and NaN.
  check_parity("amax", [](const Inputs& x) { return amax(x[0], {1}); }, {ties32({40, 30}, 16)});
  check_parity("amax", [](const Inputs& x) { return amax(x[0], {0, 1}); }, {ties32({40, 30}, 17)});
  ParityOptions fwd;
  fwd.backward = false;
  check_parity("amax", [](const Inputs& x) { return amax(x[0], {1}); }, {with_nan32({4, 3000}, 18)}, fwd);
  check_parity("amax", [](const Inputs& x) { return amax(x[0], {0}); }, {with_nan32({4, 30}, 19)}, fwd);
  check_parity("amax", [](const Inputs& x) { return amax(x[0], {0}); },
               {ti64({3, -7, 12, 5, 0, 9, -2, 4, 8, 1, 1, 6}, {3, 4})});
  Tensor x = t64({1, 5, 3, -2, 4, 0}, {2, 3}).set_requires_grad(true);
  check_grad_cuda("amax", [](auto& v) { return amax(v[0], {1}); }, {x});
}

PARITY_CASE("amin") {
  reduce_cases("amin", [](const Tensor& x, const Axes& a, bool k) { return amin(x, a, k); });
  check_parity("amin", [](const Inputs& x) { return amin(x[0], {1}); }, {ties32({40, 30}, 20)});
  ParityOptions fwd;
  fwd.backward = false;
  check_parity("amin", [](const Inputs& x) { return amin(x[0], {1}); }, {with_nan32({4, 3000}, 21)}, fwd);
  check_parity("amin", [](const Inputs& x) { return amin(x[0], {}); }, {with_nan32({300, 30}, 22)}, fwd);
  Tensor x = t64({1, 5, 3, -2, 4, 0}, {2, 3}).set_requires_grad(true);
  check_grad_cuda("amin", [](auto& v) { return amin(v[0], {0, 1}); }, {x});
}

}  // TEST_SUITE

namespace {

// max/min/argmax/argmin along one axis: values (with gradient) and indices, every
// layout and axis, ties (first index wins), NaN (first NaN wins), int64, long rows.
void extremum_cases(const char* op, bool values, bool is_max) {
  auto run = [values, is_max](const Tensor& x, int64_t axis, bool keep) {
    if (values) return is_max ? max(x, axis, keep).values : min(x, axis, keep).values;
    return is_max ? argmax(x, axis, keep) : argmin(x, axis, keep);
  };
  auto idx = [is_max](const Tensor& x, int64_t axis, bool keep) {
    return is_max ? max(x, axis, keep).indices : min(x, axis, keep).indices;
  };
  uint64_t seed = 40;
  for (int64_t axis : {0, 1, 2, -1})
    for (bool keep : {false, true}) {
      parity_layouts(op, [run, axis, keep](const Tensor& x) { return run(x, axis, keep); }, {4, 5, 6}, seed += 3);
      if (values)  // the index output of the same call
        parity_layouts(op, [idx, axis, keep](const Tensor& x) { return idx(x, axis, keep); }, {4, 5, 6}, seed += 3);
    }
  ParityOptions fwd;
  fwd.backward = false;
  for (int64_t axis : {0, 1}) {
    check_parity(op, [run, axis](const Inputs& x) { return run(x[0], axis, false); }, {ties32({64, 50}, 60)});
    check_parity(op, [idx, axis](const Inputs& x) { return idx(x[0], axis, false); }, {ties32({64, 50}, 61)});
    check_parity(op, [run, axis](const Inputs& x) { return run(x[0], axis, false); }, {with_nan32({5, 2000}, 62)},
                 fwd);
    check_parity(op, [idx, axis](const Inputs& x) { return idx(x[0], axis, false); }, {with_nan32({5, 2000}, 63)},
                 fwd);
    check_parity(op, [run, axis](const Inputs& x) { return run(x[0], axis, false); },
                 {ti64({3, -7, 12, 5, 12, 9, -7, 4, 8, 1, 1, 6}, {3, 4})});
  }
  // Long rows (block per output, chunked) and many short ones.
  check_parity(op, [run](const Inputs& x) { return run(x[0], 0, false); }, {leaf32({100000}, 64)});
  check_parity(op, [idx](const Inputs& x) { return idx(x[0], 1, false); }, {leaf32({2, 100000}, 65)});
  check_parity(op, [idx](const Inputs& x) { return idx(x[0], 0, false); }, {ties32({100000, 2}, 66, 50)});
  check_parity(op, [run](const Inputs& x) { return run(x[0], 1, true); }, {leaf32({30000, 3}, 67)});
}

}  // namespace

TEST_SUITE("cuda/reduce") {

PARITY_CASE("max") {
  extremum_cases("max", true, true);
  Tensor x = t64({1, 5, 3, -2, 4, 0}, {2, 3}).set_requires_grad(true);
  check_grad_cuda("max", [](auto& v) { return max(v[0], 1).values; }, {x});
}
PARITY_CASE("min") {
  extremum_cases("min", true, false);
  Tensor x = t64({1, 5, 3, -2, 4, 0}, {2, 3}).set_requires_grad(true);
  check_grad_cuda("min", [](auto& v) { return min(v[0], 0, true).values; }, {x});
}
PARITY_CASE("argmax") { extremum_cases("argmax", false, true); }
PARITY_CASE("argmin") { extremum_cases("argmin", false, false); }

}  // TEST_SUITE

TEST_SUITE("cuda/nn_functional") {

namespace {
void softmax_cases(const char* op, bool log) {
  auto f = [log](const Tensor& x, int64_t axis) { return log ? log_softmax(x, axis) : softmax(x, axis); };
  uint64_t seed = 70;
  for (int64_t axis : {0, 1, 2, -1})
    parity_layouts(op, [f, axis](const Tensor& x) { return f(x, axis); }, {3, 4, 5}, seed += 3);
  // Strided gradient too: the output is transposed back, so the incoming g is a view.
  check_parity(op, [f](const Inputs& x) { return transpose(f(transpose(x[0], 0, 1), 1), 0, 1); },
               {leaf32({50, 30}, 80)});
  // Every row-length regime: warp kernels (VPT 1..32), block kernels cached
  // (<= 4096, the attention range) and uncached (5000), many short rows; large logits.
  // Contiguous float rows with n % 4 == 0 take the float4 slots (100, 132, 500 and
  // 1500 with a partly filled last slot group), the others the scalar slots.
  for (int64_t n : {1, 7, 32, 64, 100, 128, 130, 132, 256, 500, 1024, 1026, 1500, 2048, 4096, 5000})
    check_parity(op, [f](const Inputs& x) { return f(mul(x[0], 4.0), -1); }, {leaf32({16, n}, 81 + uint64_t(n))});
  // A contiguous view at an odd element offset: rows not 16-byte aligned, scalar slots.
  check_parity(op, [f](const Inputs& x) { return f(reshape(slice(x[0], 0, 1, 1 + 16 * 128), {16, 128}), -1); },
               {leaf32({1 + 16 * 128}, 79)});
  check_parity(op, [f](const Inputs& x) { return f(x[0], 0); }, {leaf32({4096, 8}, 82)});  // strided rows
  check_parity(op, [f](const Inputs& x) { return f(x[0], -1); }, {leaf32({20000, 7}, 83)});
  check_parity(op, [f](const Inputs& x) { return f(x[0], 1); }, {leaf32({8, 3000, 4}, 84)});
  // Masked rows (all -inf: zeros for softmax), partly masked rows, NaN; forward only.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  Tensor special = t32({-inf, -inf, -inf, -inf, 1, -inf, 2, 0, 1, nan, 2, 3, -inf, nan, -inf, -inf}, {4, 4});
  ParityOptions fwd;
  fwd.backward = false;
  check_parity(op, [f](const Inputs& x) { return f(x[0], 1); }, {special}, fwd);
  check_parity(op, [f](const Inputs& x) { return f(x[0], 0); }, {special}, fwd);
  for (int64_t n : {256, 3000}) {  // fully masked rows in the float4 warp and block kernels
    Tensor masked = Tensor::full({2, n}, -double(inf), kFloat32);
    check_parity(op, [f](const Inputs& x) { return f(x[0], 1); }, {masked}, fwd);
  }
  // A scalar and an empty tensor.
  check_parity(op, [f](const Inputs& x) { return f(x[0], 0); }, {leaf32({}, 85)});
  check_parity(op, [f](const Inputs& x) { return f(x[0], 1); }, {leaf32({0, 5}, 86)});
}
}  // namespace

PARITY_CASE("softmax") {
  softmax_cases("softmax", false);
  for (int64_t axis : {0, 1, -1})
    check_grad_cuda("softmax", [axis](const std::vector<Tensor>& x) { return softmax(x[0], axis); },
                    {leaf64({3, 4, 2}, 11, -2, 2)});
  check_grad_cuda("softmax",
                  [](const std::vector<Tensor>& x) { return transpose(softmax(transpose(x[0], 0, 1), 1), 0, 1); },
                  {leaf64({5, 3}, 12, -2, 2)});
}

PARITY_CASE("log_softmax") {
  softmax_cases("log_softmax", true);
  for (int64_t axis : {0, 1})
    check_grad_cuda("log_softmax", [axis](const std::vector<Tensor>& x) { return log_softmax(x[0], axis); },
                    {leaf64({4, 3}, 13, -2, 2)});
  check_grad_cuda("log_softmax",
                  [](const std::vector<Tensor>& x) { return log_softmax(transpose(x[0], 0, 1), 0); },
                  {leaf64({3, 5}, 14, -2, 2)});
}

PARITY_CASE("layer_norm") {
  using V = std::vector<Tensor>;
  // Row lengths across the warp / block / uncached regimes; every weight/bias combination.
  uint64_t seed = 100;
  // (100, 768, 1024, 3000: float4 slots; 4, 32, 130: scalar; 5000: uncached rows.)
  for (int64_t n : {4, 32, 100, 130, 768, 1024, 3000, 5000}) {
    const int64_t rows = n >= 1000 ? 6 : 37;
    check_parity("layer_norm", [n](const V& x) { return layer_norm(x[0], {n}, x[1], x[2]); },
                 {leaf32({rows, n}, seed), leaf32({n}, seed + 1), leaf32({n}, seed + 2)});
    check_parity("layer_norm", [n](const V& x) { return layer_norm(x[0], {n}, x[1]); },
                 {leaf32({rows, n}, seed + 3), leaf32({n}, seed + 4)});
    check_parity("layer_norm", [n](const V& x) { return layer_norm(x[0], {n}, Tensor(), x[1]); },
                 {leaf32({rows, n}, seed + 5), leaf32({n}, seed + 6)});
    check_parity("layer_norm", [n](const V& x) { return layer_norm(x[0], {n}); }, {leaf32({rows, n}, seed + 7)});
    seed += 10;
  }
  // Two normalised axes; non-contiguous x (copied by the op); offset mean.
  check_parity("layer_norm", [](const V& x) { return layer_norm(x[0], {3, 5}, x[1], x[2], 1e-3); },
               {leaf32({4, 3, 5}, 200), leaf32({3, 5}, 201), leaf32({3, 5}, 202)});
  check_parity("layer_norm", [](const V& x) { return layer_norm(transpose(x[0], 0, 1), {7}, x[1], x[2]); },
               {leaf32({7, 9}, 203), leaf32({7}, 204), leaf32({7}, 205)});
  check_parity("layer_norm", [](const V& x) { return layer_norm(add(x[0], 100.0), {64}, x[1]); },
               {leaf32({9, 64}, 206), leaf32({64}, 207)});
  // A contiguous x at an odd element offset: unaligned rows take the scalar slots.
  check_parity("layer_norm",
               [](const V& x) { return layer_norm(reshape(slice(x[0], 0, 1, 1 + 9 * 128), {9, 128}), {128}, x[1]); },
               {leaf32({1 + 9 * 128}, 220), leaf32({128}, 221)});
  // Many rows: the weight/bias column sums split into row chunks (two-stage), and
  // many columns with few rows (one stage).
  check_parity("layer_norm", [](const V& x) { return layer_norm(x[0], {64}, x[1], x[2]); },
               {leaf32({20000, 64}, 208), leaf32({64}, 209), leaf32({64}, 210)});
  check_parity("layer_norm", [](const V& x) { return layer_norm(x[0], {256}, x[1], x[2]); },
               {leaf32({4096, 256}, 211), leaf32({256}, 212), leaf32({256}, 213)});
  // Only the affine parameters require grad; an empty batch.
  Tensor xc = leaf32({50, 3}, 214).detach();
  check_parity("layer_norm", [xc](const V& x) { return layer_norm(xc.to(x[0].device()), {3}, x[0], x[1]); },
               {leaf32({3}, 215), leaf32({3}, 216)});
  check_parity("layer_norm", [](const V& x) { return layer_norm(x[0], {5}, x[1], x[2]); },
               {leaf32({0, 5}, 217), leaf32({5}, 218), leaf32({5}, 219)});
  // float64 gradchecks of tests/ops/test_nn_functional.cpp.
  check_grad_cuda("layer_norm", [](const V& x) { return layer_norm(x[0], {4}, x[1], x[2]); },
                  {leaf64({3, 4}, 31), leaf64({4}, 32), leaf64({4}, 33)});
  check_grad_cuda("layer_norm", [](const V& x) { return layer_norm(x[0], {2, 3}, x[1], Tensor(), 1e-3); },
                  {leaf64({2, 2, 3}, 34), leaf64({2, 3}, 35)});
  check_grad_cuda("layer_norm", [](const V& x) { return layer_norm(transpose(x[0], 0, 1), {3}); },
                  {leaf64({3, 4}, 36)});
  Tensor x64 = leaf64({5, 3}, 37).detach().to(Device::cuda(0));
  check_grad_cuda("layer_norm", [x64](const V& x) { return layer_norm(x64, {3}, x[0], x[1]); },
                  {leaf64({3}, 38), leaf64({3}, 39)});
}

PARITY_CASE("cross_entropy") {
  using V = std::vector<Tensor>;
  // Every reduction with and without label smoothing, (N, C) warp-per-sample path.
  const Tensor t = rand_targets({300}, 10, 1);
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None})
    for (double ls : {0.0, 0.15}) {
      CrossEntropyOptions o;
      o.reduction = r;
      o.label_smoothing = ls;
      check_parity("cross_entropy", [o](const V& x) { return cross_entropy(x[0], x[1], o); },
                   {leaf32({300, 10}, 300, -3, 3), t});
    }
  // (N, C, d1, d2) with a custom ignore_index and smoothing (thread-per-sample path),
  // through a permuted view (copied by the op).
  CrossEntropyOptions o3;
  o3.ignore_index = 3;
  o3.label_smoothing = 0.25;
  const Tensor t3 = rand_targets({4, 6, 5}, 7, 2, 3);
  check_parity("cross_entropy", [o3](const V& x) { return cross_entropy(x[0], x[1], o3); },
               {leaf32({4, 7, 6, 5}, 301, -3, 3), t3});
  check_parity("cross_entropy", [o3](const V& x) { return cross_entropy(permute(x[0], {0, 3, 1, 2}), x[1], o3); },
               {leaf32({4, 6, 5, 7}, 302, -3, 3), t3});
  o3.reduction = Reduction::None;
  check_parity("cross_entropy", [o3](const V& x) { return cross_entropy(x[0], x[1], o3); },
               {leaf32({4, 7, 6, 5}, 303, -3, 3), t3});
  // Large C (block per sample), many samples, one sample, an empty batch, all ignored.
  check_parity("cross_entropy", [](const V& x) { return cross_entropy(x[0], x[1]); },
               {leaf32({6, 30000}, 304, -5, 5), rand_targets({6}, 30000, 3)});
  CrossEntropyOptions ls;
  ls.label_smoothing = 0.1;
  check_parity("cross_entropy", [ls](const V& x) { return cross_entropy(x[0], x[1], ls); },
               {leaf32({50000, 10}, 305, -3, 3), rand_targets({50000}, 10, 4)});
  check_parity("cross_entropy", [](const V& x) { return cross_entropy(x[0], x[1]); },
               {leaf32({1, 5}, 306), ti64({4}, {1})});
  check_parity("cross_entropy", [](const V& x) { return cross_entropy(x[0], x[1]); },
               {leaf32({0, 5}, 307), Tensor::zeros({0}, kInt64)});
  check_parity("cross_entropy", [](const V& x) { return cross_entropy(x[0], x[1]); },
               {leaf32({3, 5}, 308), ti64({-100, -100, -100}, {3})});
  // A bad target: the CPU's IndexError, same message (first bad position).
  for (const Tensor& bad : {ti64({1, 7, -100, -3}, {4}), ti64({-100, -100, 0, 5}, {4})}) {
    Tensor x = leaf32({4, 5}, 309).detach();
    const std::string cpu = error_of([&] { cross_entropy(x, bad); });
    const std::string gpu = error_of([&] { cross_entropy(cuda0(x), cuda0(bad)); });
    CHECK(cpu.find("out of range") != std::string::npos);
    CHECK(gpu == cpu);
    CHECK_THROWS_AS(cross_entropy(cuda0(x), cuda0(bad)), IndexError);
  }
  // float64 gradchecks of tests/ops/test_nn_functional.cpp.
  const Tensor tg = cuda0(ti64({2, 0, -100, 4, 1}, {5}));
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None})
    for (double s : {0.0, 0.15}) {
      CrossEntropyOptions o;
      o.reduction = r;
      o.label_smoothing = s;
      check_grad_cuda("cross_entropy", [tg, o](const V& x) { return cross_entropy(x[0], tg, o); },
                      {leaf64({5, 5}, 51, -2, 2)});
    }
  const Tensor tg3 = cuda0(ti64({0, 3, 2, 1, 3, 0}, {2, 3}));
  CrossEntropyOptions og;
  og.ignore_index = 3;
  og.label_smoothing = 0.25;
  check_grad_cuda("cross_entropy",
                  [tg3, og](const V& x) { return cross_entropy(permute(x[0], {0, 2, 1}), tg3, og); },
                  {leaf64({2, 3, 4}, 52, -2, 2)});
}

}  // TEST_SUITE
