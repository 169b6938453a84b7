// CUDA parity of the bfloat16 / float16 paths against the CPU (the reference), forward and
// backward. Both devices compute in float32 and round once per stored value (docs/design-notes.md,
// "Low-precision parity rules"), so a result may differ by one unit in the last place of the
// storage type where CUDA's float32 math library and glibc round a float32 value differently
// near a low-precision tie: rtol = 2u forward (u = 2^-8 bfloat16, 2^-11 float16). matmul sums
// in another order on tensor cores (R2) and backward passes chain roundings (R3): 8u.
// Written without a GPU (compiled here, skipped by name without one): awaits a GPU run.
#include <cmath>
#include <functional>

#include "cuda/cuda_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

double u_of(DType dt) { return dt == kBFloat16 ? 1.0 / 256 : 1.0 / 2048; }

Tensor low_leaf(DType dt, const Shape& s, uint64_t seed, double lo = -2, double hi = 2, bool grad = true) {
  Generator g(seed);
  Tensor t = to(rand(s, kFloat32, g, lo, hi), dt);
  if (grad) t.set_requires_grad(true);
  return t;
}

ParityOptions fwd(DType dt, double k = 2) {
  ParityOptions o;
  o.atol = k * u_of(dt) * 1e-3;
  o.rtol = k * u_of(dt);
  o.backward = false;
  return o;
}
ParityOptions bwd(DType dt) {
  ParityOptions o;
  o.atol = 8 * u_of(dt);
  o.rtol = 8 * u_of(dt);
  return o;
}

}  // namespace

TEST_CASE("cuda: low precision casts, fill and elementwise match the CPU") {
  if (!cuda_visible()) return;
  for (DType dt : {kBFloat16, kFloat16}) {
    Tensor x = low_leaf(dt, {33, 17}, 1), y = low_leaf(dt, {33, 17}, 2), p = low_leaf(dt, {33, 17}, 3, 0.1, 3);
    check_parity("to", [](const std::vector<Tensor>& v) { return to(v[0], kFloat32); }, {x}, fwd(dt, 0));
    check_parity("to", [dt](const std::vector<Tensor>& v) { return to(to(v[0], kFloat32), dt); }, {x}, fwd(dt, 0));
    check_parity("full", [](const std::vector<Tensor>& v) { return add(v[0], full_like(v[0], 0.1)); }, {x},
                 fwd(dt));
    using U = Tensor (*)(const Tensor&);
    for (U f : {U(exp), U(tanh), U(sigmoid), U(gelu), U(relu), U(neg), U(square), U(erf), U(sin)})
      check_parity("unary", [f](const std::vector<Tensor>& v) { return f(v[0]); }, {x}, bwd(dt));
    check_parity("log", [](const std::vector<Tensor>& v) { return log(v[0]); }, {p}, bwd(dt));
    check_parity("add", [](const std::vector<Tensor>& v) { return add(v[0], v[1]); }, {x, y}, bwd(dt));
    check_parity("mul", [](const std::vector<Tensor>& v) { return mul(v[0], transpose(v[1], 0, 1)); },
                 {x, low_leaf(dt, {17, 33}, 4)}, bwd(dt));
    check_parity("div", [](const std::vector<Tensor>& v) { return div(v[0], v[1]); }, {x, p}, bwd(dt));
    check_parity("maximum", [](const std::vector<Tensor>& v) { return maximum(v[0], v[1]); }, {x, y}, bwd(dt));
    check_parity("lt", [](const std::vector<Tensor>& v) { return lt(v[0], v[1]); }, {x, y}, fwd(dt, 0));
    check_parity("dropout", [](const std::vector<Tensor>& v) {
      Generator g(7);  // the same Philox mask on both devices
      return dropout(v[0], 0.3, true, g);
    }, {x}, bwd(dt));
    check_parity("where", [](const std::vector<Tensor>& v) { return where(gt(v[0], 0.0), v[0], v[1]); }, {x, y},
                 bwd(dt));
  }
}

TEST_CASE("cuda: low precision reductions, softmax, layer_norm, cross_entropy, index and sort match the CPU") {
  if (!cuda_visible()) return;
  for (DType dt : {kBFloat16, kFloat16}) {
    Tensor x = low_leaf(dt, {8, 50, 12}, 11);
    check_parity("sum", [](const std::vector<Tensor>& v) { return sum(v[0], {1}); }, {x}, bwd(dt));
    check_parity("mean", [](const std::vector<Tensor>& v) { return mean(v[0]); }, {x}, bwd(dt));
    check_parity("amax", [](const std::vector<Tensor>& v) { return amax(v[0], {2}); }, {x}, bwd(dt));
    check_parity("logsumexp", [](const std::vector<Tensor>& v) { return logsumexp(v[0], {1}); }, {x}, bwd(dt));
    check_parity("var", [](const std::vector<Tensor>& v) { return var(v[0], {2}); }, {x}, bwd(dt));
    check_parity("softmax", [](const std::vector<Tensor>& v) { return softmax(v[0], -1); }, {x}, bwd(dt));
    check_parity("log_softmax", [](const std::vector<Tensor>& v) { return log_softmax(v[0], 1); }, {x}, bwd(dt));
    Tensor w = low_leaf(dt, {12}, 12, 0.5, 1.5), b = low_leaf(dt, {12}, 13);
    check_parity("layer_norm", [](const std::vector<Tensor>& v) { return layer_norm(v[0], {12}, v[1], v[2]); },
                 {x, w, b}, bwd(dt));
    Tensor logits = low_leaf(dt, {40, 7}, 14), tgt = random_ints({40}, 0, 6, 15);
    check_parity("cross_entropy", [tgt](const std::vector<Tensor>& v) { return cross_entropy(v[0], tgt.to(v[0].device())); },
                 {logits}, bwd(dt));
    Tensor idx = random_ints({8, 50, 3}, 0, 11, 16);
    check_parity("gather", [idx](const std::vector<Tensor>& v) { return gather(v[0], 2, idx.to(v[0].device())); },
                 {x}, bwd(dt));
    check_parity("sort", [](const std::vector<Tensor>& v) { return sort(v[0], 1).values; }, {x}, bwd(dt));
    check_parity("masked_fill", [](const std::vector<Tensor>& v) { return masked_fill(v[0], gt(v[0], 0.5), -3.0); },
                 {x}, bwd(dt));
  }
}

TEST_CASE("cuda: low precision matmul runs on cuBLAS with float32 accumulation, batched and broadcast") {
  if (!cuda_visible()) return;
  for (DType dt : {kBFloat16, kFloat16}) {
    ParityOptions o = bwd(dt);
    Tensor a = low_leaf(dt, {3, 40, 64}, 21), b = low_leaf(dt, {3, 64, 24}, 22);
    check_parity("matmul", [](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); }, {a, b}, o);
    Tensor bb = low_leaf(dt, {64, 24}, 23);
    check_parity("matmul", [](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); }, {a, bb}, o);
    check_parity("matmul", [](const std::vector<Tensor>& v) { return matmul(transpose(v[0], 1, 2), v[0]); }, {a}, o);
    Tensor c = low_leaf(dt, {4, 1, 8, 16}, 24), d = low_leaf(dt, {1, 5, 16, 8}, 25);  // pointer-array batch
    check_parity("matmul", [](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); }, {c, d}, o);
  }
}
