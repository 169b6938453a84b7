// Clustering ops (autograd/ops/clustering.h): sign hashing of projections and
// Hamming K-Means, against hand-computed references, with their errors and CUDA
// parity (integers: the same on both devices, bit for bit).
#include <algorithm>
#include <limits>
#include <map>
#include <random>

#include "autograd/ops/clustering.h"
#include "kernels/kmeans/hamming.h"
#include "cuda/cuda_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

Tensor bools(const std::vector<bool>& v, const Shape& s) { return Tensor::from_vector(v, s); }

// Codes of `bits` bits around `groups` random centres per row, each bit flipped
// with probability 0.1: planted clusters for Hamming K-Means.
Tensor planted_codes(int64_t rows, int64_t n, int64_t groups, int64_t bits, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution flip(0.1);
  std::vector<int64_t> v;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<uint64_t> centre(static_cast<size_t>(groups));
    for (auto& c : centre) c = rng() & ((uint64_t(1) << bits) - 1);
    for (int64_t i = 0; i < n; ++i) {
      uint64_t c = centre[size_t(i % groups)];
      for (int64_t b = 0; b < bits; ++b)
        if (flip(rng)) c ^= uint64_t(1) << b;
      v.push_back(int64_t(c));
    }
  }
  return Tensor::from_vector(v, {rows, n});
}

// The neural clustering losses composed of tensor ops (what the fused ops replaced): the
// reference they must match, values and gradients.
Tensor unit_rows_ref(const Tensor& t) { return t / clamp(sqrt(sum(t * t, {-1}, true)), 1e-12, INFINITY); }

Tensor clustering_loss_ref(const Tensor& x, const Tensor& c_hat, const Tensor& index, const Tensor& mask,
                           ClusterLossForm form) {
  const int64_t B = x.shape()[0], N = x.shape()[1];
  Tensor idx = mask.defined() ? masked_fill(index, mask, 0.0) : index;
  Tensor own = take_along_dim(c_hat, unsqueeze(idx, 2), 1);
  if (form != ClusterLossForm::kInner) own = unit_rows_ref(own);
  Tensor phi = sum((form == ClusterLossForm::kCosine ? unit_rows_ref(x) : x) * own, {2});
  Tensor count;
  if (mask.defined()) {
    phi = masked_fill(phi, mask, 0.0);
    count = clamp(sum(to(logical_not(mask), x.dtype()), {1}), 1.0, INFINITY);
  } else {
    count = Tensor::full({B}, double(N > 0 ? N : 1), x.dtype(), x.device());
  }
  const Tensor per_row = sum(phi, {1}) / count;
  return B > 0 ? -mean(per_row) : -sum(per_row);
}

Tensor centroid_sorting_loss_ref(const Tensor& c_in, ClusterLossForm form) {
  const int64_t k = c_in.shape()[1];
  const Tensor c = form == ClusterLossForm::kInner ? c_in : unit_rows_ref(c_in);
  Tensor prev = k == 1 ? c : cat({narrow(c, 1, k - 1, 1), narrow(c, 1, 0, k - 1)}, 1);
  const Tensor per_row = sum(c * prev, {1, 2});
  return (c.shape()[0] > 0 ? -mean(per_row) : -sum(per_row)) / double(k);
}

const ClusterLossForm kForms[] = {ClusterLossForm::kInner, ClusterLossForm::kCosine, ClusterLossForm::kSphere};

}  // namespace

TEST_SUITE("ops/clustering") {

TEST_CASE("clustering_loss and centroid_sorting_loss equal their tensor-op composition, values and gradients") {
  for (DType dt : {kFloat64, kFloat32}) {
    const double tol = dt == kFloat64 ? 1e-12 : 2e-5;
    for (ClusterLossForm form : kForms) {
      INFO("dtype ", dt, ", form ", int(form));
      // B = 3: row 1 padded at its tail, row 2 all padding under the mask; cluster 3 has no member.
      const int64_t B = 3, N = 37, K = 4, D = 19;
      Generator g(7);
      const Tensor x0 = rand({B, N, D}, dt, g, -1, 1), c0 = rand({B, K, D}, dt, g, -1, 1);
      const Tensor index = random_ints({B, N}, 0, K - 2, 11);
      std::vector<bool> m(size_t(B * N), false);
      for (int64_t j = 25; j < N; ++j) m[size_t(N + j)] = true;
      for (int64_t j = 0; j < N; ++j) m[size_t(2 * N + j)] = true;
      const Tensor mask = Tensor::from_vector(m, {B, N});
      for (bool padded : {false, true}) {
        INFO("padded ", padded);
        auto run = [&](bool fused) {
          Tensor x = x0.detach(), c = c0.detach();
          x.set_requires_grad(true);
          c.set_requires_grad(true);
          const Tensor kpm = padded ? mask : Tensor();
          // padding carries index k, as the layer's eq. 4 gives it
          const Tensor idx = padded ? masked_fill(index, mask, double(K)) : index;
          Tensor l1 = fused ? clustering_loss(x, c, idx, kpm, form) : clustering_loss_ref(x, c, idx, kpm, form);
          Tensor l2 = fused ? centroid_sorting_loss(c, form) : centroid_sorting_loss_ref(c, form);
          (l1 * 0.7 + l2 * -1.3).backward();
          return std::vector<Tensor>{l1, l2, x.grad(), c.grad()};
        };
        const std::vector<Tensor> f = run(true), r = run(false);
        CHECK(f[0].dim() == 0);
        CHECK(f[0].dtype() == dt);
        for (size_t e = 0; e < f.size(); ++e) {
          INFO("result ", e);
          check_close(f[e], r[e], tol);
        }
      }
    }
  }
}

TEST_CASE("clustering losses: edge shapes, zero rows, x without gradient, 16-bit inputs") {
  for (ClusterLossForm form : kForms) {
    INFO("form ", int(form));
    // An empty batch, and sequences without tokens: both losses 0, gradients of the right shapes.
    Tensor x = leaf64({0, 5, 3}), c = leaf64({0, 2, 3});
    Tensor l = clustering_loss(x, c, Tensor::zeros({0, 5}, kInt64), Tensor(), form) + centroid_sorting_loss(c, form);
    check_close(l, {0.0}, 0);
    l.backward();
    CHECK(c.grad().shape() == Shape({0, 2, 3}));
    Tensor xe = leaf64({2, 0, 3}, 3), ce = leaf64({2, 2, 3}, 4);
    check_close(clustering_loss(xe, ce, Tensor::zeros({2, 0}, kInt64), Tensor(), form), {0.0}, 0);
    // A zero centroid and a zero token: finite values and gradients (the composition's sqrt gave NaN there).
    Tensor xz = t64({0, 0, 0, 1, 2, 3}, {1, 2, 3}), cz = t64({0, 0, 0, 1, -1, 2}, {1, 2, 3});
    xz.set_requires_grad(true);
    cz.set_requires_grad(true);
    (clustering_loss(xz, cz, ti64({0, 1}, {1, 2}), Tensor(), form) + centroid_sorting_loss(cz, form)).backward();
    for (double v : values(xz.grad())) CHECK(std::isfinite(v));
    for (double v : values(cz.grad())) CHECK(std::isfinite(v));
    // x without gradient (the layer's default: the input detached): c_hat's alone, the same.
    Tensor xd = leaf64({2, 6, 4}, 5).detach(), c1 = leaf64({2, 3, 4}, 6), c2 = leaf64({2, 3, 4}, 6);
    Tensor xg = xd.detach();
    xg.set_requires_grad(true);
    const Tensor idx = random_ints({2, 6}, 0, 2, 7);
    clustering_loss(xd, c1, idx, Tensor(), form).backward();
    clustering_loss(xg, c2, idx, Tensor(), form).backward();
    check_close(c1.grad(), c2.grad(), 0);
    // 16-bit pairs: computed in float32, returned in their dtype, gradients in their dtype.
    for (DType low : {kBFloat16, kFloat16}) {
      Tensor xl = to(leaf64({2, 6, 4}, 8), low).detach(), cl = to(leaf64({2, 3, 4}, 9), low).detach();
      cl.set_requires_grad(true);
      Tensor ll = clustering_loss(xl, cl, idx, Tensor(), form) + centroid_sorting_loss(cl, form);
      CHECK(ll.dtype() == low);
      const double ref = values(clustering_loss_ref(to(xl, kFloat64), to(cl, kFloat64), idx, Tensor(), form) +
                                centroid_sorting_loss_ref(to(cl, kFloat64), form))
                             .front();
      check_close(ll, {ref}, 0.02 * std::max(1.0, std::fabs(ref)));
      ll.backward();
      CHECK(cl.grad().dtype() == low);
      // Under autocast: a 16-bit C^ beside a float32 x gives a float32 loss (losses stay float32).
      AutocastGuard guard(low);
      Tensor xf = to(xl, kFloat32);
      Tensor la = clustering_loss(xf, cl, idx, Tensor(), form);
      CHECK(la.dtype() == kFloat32);
      check_close(la, values(clustering_loss(xf, to(cl, kFloat32), idx, Tensor(), form)), 0);
      CHECK(centroid_sorting_loss(cl, form).dtype() == kFloat32);
    }
  }
}

TEST_CASE("clustering losses refuse bad input with messages naming the problem") {
  const Tensor x = leaf64({1, 5, 3}), c = leaf64({1, 2, 3});
  const Tensor idx = ti64({0, 1, 0, 1, 0}, {1, 5});
  CHECK_THROWS_MSG(clustering_loss(x, c, ti64({0, 1}, {1, 2})), ShapeError,
                   "[clustering_loss] expected x (B, N, D), c_hat (B, k, D) and int64 index (B, N)", "(1,2)");
  CHECK_THROWS_MSG(clustering_loss(x, to(c, kFloat32), idx), DTypeError,
                   "[clustering_loss] x and c_hat must share one float dtype", "float64", "float32");
  CHECK_THROWS_MSG(clustering_loss(x, c, idx, ti64({0, 0, 0, 0, 0}, {1, 5})), ShapeError,
                   "[clustering_loss] key_padding_mask must be bool (B, N) = (1, 5)");
  CHECK_THROWS_MSG(clustering_loss(x, c, ti64({0, 1, 7, 0, 1}, {1, 5})), IndexError,
                   "[clustering_loss] cluster index 7 at flat position 2 is out of range [0, 2) for k = 2 centroids");
  CHECK_THROWS_MSG(clustering_loss(x, c, idx, fake_cuda({1, 5}, kBool)), DeviceError, "[clustering_loss]",
                   "different devices", "cuda:0");
  CHECK_THROWS_MSG(clustering_loss(x, leaf64({1, 0, 3}), idx), ShapeError,
                   "[clustering_loss] c_hat must hold k >= 1 centroids", "(1,0,3)");
  CHECK_THROWS_MSG(centroid_sorting_loss(leaf64({1, 0, 3})), ShapeError,
                   "[centroid_sorting_loss] c_hat must be float (B, k, D) with k >= 1", "(1,0,3)");
  CHECK_THROWS_MSG(centroid_sorting_loss(ti64({1, 2}, {1, 1, 2})), ShapeError, "[centroid_sorting_loss]", "int64");
}

TEST_CASE("clustering losses: one kernel call each way (the composition made about 20)") {
  const Tensor x = leaf64({2, 9, 4}), c = leaf64({2, 3, 4}, 2);
  const Tensor idx = random_ints({2, 9}, 0, 2, 3);
  for (ClusterLossForm form : kForms) {
    KernelCalls before = kernel_calls();
    Tensor l1 = clustering_loss(x, c, idx, Tensor(), form);
    CHECK((kernel_calls() - before).cpu == 2);  // the range check and the loss
    before = kernel_calls();
    Tensor l2 = centroid_sorting_loss(c, form);
    CHECK((kernel_calls() - before).cpu == 1);
    const std::vector<Tensor> g = autograd::grad({l1, l2}, {x, c});
    // the two backward kernels, and the gradients of c_hat's two uses added (the seeds are fills)
    CHECK((kernel_calls() - before).cpu <= 2 + 4);
    CHECK(g[1].shape() == c.shape());
  }
}

GRADCHECK_CASE(clustering_loss) {
  const int64_t B = 2, N = 7, K = 3, D = 4;
  // duplicate ids, an empty cluster (2 in row 0), padding in row 1 (carrying index k)
  const Tensor index = ti64({0, 1, 1, 0, 1, 0, 0, 2, 2, 0, 1, 3, 3, 3}, {B, N});
  const Tensor mask = Tensor::from_vector(
      std::vector<bool>{false, false, false, false, false, false, false, false, false, false, false, true, true, true},
      {B, N});
  for (ClusterLossForm form : kForms)
    check_grad("clustering_loss",
               [&](const std::vector<Tensor>& in) {
                 return stack({clustering_loss(in[0], in[1], index, mask, form),
                               clustering_loss(in[0], in[1], masked_fill(index, mask, 0.0), Tensor(), form)},
                              0);
               },
               {leaf64({B, N, D}, 21), leaf64({B, K, D}, 22)});
}

GRADCHECK_CASE(centroid_sorting_loss) {
  for (ClusterLossForm form : kForms)
    for (int64_t k : {1, 2, 5})
      check_grad("centroid_sorting_loss",
                 [form](const std::vector<Tensor>& in) { return centroid_sorting_loss(in[0], form); },
                 {leaf64({2, k, 3}, uint64_t(30 + k))});
}

PARITY_CASE(clustering_loss) {
  // (B, N, D) with N across several of the forward's 64-token blocks and D over a warp.
  const int64_t B = 3, N = 300, K = 17, D = 40;
  std::vector<bool> m(size_t(B * N), false);
  for (int64_t j = 200; j < N; ++j) m[size_t(N + j)] = true;
  for (int64_t j = 0; j < N; ++j) m[size_t(2 * N + j)] = true;
  const Tensor mask = Tensor::from_vector(m, {B, N});
  const Tensor index = masked_fill(random_ints({B, N}, 0, K - 2, 61), mask, double(K));
  for (ClusterLossForm form : kForms) {
    check_parity("clustering_loss", [&](const Inputs& in) { return clustering_loss(in[0], in[1], in[2], in[3], form); },
                 {leaf32({B, N, D}, 62), leaf32({B, K, D}, 63), index, mask});
    check_parity("clustering_loss", [&](const Inputs& in) { return clustering_loss(in[0], in[1], in[2], Tensor(), form); },
                 {leaf32({B, N, D}, 64), leaf32({B, K, D}, 65), masked_fill(index, mask, 0.0)});
    // D above a block (the member sums loop over chunks of D), and x without gradient
    check_parity("clustering_loss", [&](const Inputs& in) { return clustering_loss(in[0], in[1], in[2], Tensor(), form); },
                 {leaf32({2, 70, 300}, 66).detach(), leaf32({2, 5, 300}, 67), random_ints({2, 70}, 0, 4, 68)});
    check_grad_cuda("clustering_loss",
                    [&](const std::vector<Tensor>& in) { return clustering_loss(in[0], in[1], in[2], in[3], form); },
                    {leaf64({2, 7, 4}, 69), leaf64({2, 3, 4}, 70), ti64({0, 1, 1, 0, 1, 0, 0, 2, 2, 0, 1, 3, 3, 3}, {2, 7}),
                     Tensor::from_vector(std::vector<bool>{false, false, false, false, false, false, false, false, false,
                                                           false, false, true, true, true},
                                         {2, 7})});
  }
}

CUDA_TEST_CASE("clustering losses on CUDA: zero rows, empty batches and sequences, a bad id deferred") {
  for (ClusterLossForm form : kForms) {
    Tensor xz = to(t64({0, 0, 0, 1, 2, 3}, {1, 2, 3}), kFloat32), cz = to(t64({0, 0, 0, 1, -1, 2}, {1, 2, 3}), kFloat32);
    xz.set_requires_grad(true);
    cz.set_requires_grad(true);
    check_parity("clustering_loss",
                 [form](const Inputs& in) {
                   return clustering_loss(in[0], in[1], in[2], Tensor(), form) + centroid_sorting_loss(in[1], form);
                 },
                 {xz, cz, ti64({0, 1}, {1, 2})});
    check_close(clustering_loss(cuda0(Tensor::zeros({0, 5, 3})), cuda0(Tensor::zeros({0, 2, 3})),
                                cuda0(Tensor::zeros({0, 5}, kInt64)), Tensor(), form).cpu(), {0.0}, 0);
    check_close(clustering_loss(cuda0(Tensor::zeros({2, 0, 3})), cuda0(Tensor::ones({2, 2, 3})),
                                cuda0(Tensor::zeros({2, 0}, kInt64)), Tensor(), form).cpu(), {0.0}, 0);
    check_close(centroid_sorting_loss(cuda0(Tensor::zeros({0, 2, 3})), form).cpu(), {0.0}, 0);
  }
  // A bad id reads no memory past c_hat (clamped) and is the CPU's IndexError at the next read.
  const Tensor l = clustering_loss(cuda0(leaf64({1, 5, 3})), cuda0(leaf64({1, 2, 3}, 2)), cuda0(ti64({0, 1, 7, 0, 1}, {1, 5})));
  CHECK_THROWS_MSG(l.item<double>(), IndexError, "[clustering_loss] cluster index 7 at flat position 2");
}

PARITY_CASE(centroid_sorting_loss) {
  for (ClusterLossForm form : kForms)
    for (int64_t k : {1, 2, 23}) {
      check_parity("centroid_sorting_loss", [form](const Inputs& in) { return centroid_sorting_loss(in[0], form); },
                   {leaf32({4, k, 300}, uint64_t(80 + k))});
      check_grad_cuda("centroid_sorting_loss",
                      [form](const std::vector<Tensor>& in) { return centroid_sorting_loss(in[0], form); },
                      {leaf64({2, k, 3}, uint64_t(90 + k))});
    }
}

// Routing's commitment term composed of tensor ops (what commitment_loss replaced): the reference.
Tensor commitment_ref(const Tensor& x, const Tensor& mu, const Tensor& assign, const Tensor& mask, double scale) {
  const int64_t B = x.shape()[0], H = x.shape()[1], N = x.shape()[2], D = x.shape()[3], C = mu.shape()[1];
  const Tensor target = take_along_dim(reshape(mu, {1, H, C, D}), reshape(assign, {B, H, N, 1}), 2);
  Tensor e2 = square(x - target);
  if (mask.defined()) e2 = e2 * to(reshape(logical_not(mask), {B, 1, N, 1}), x.dtype());
  return sum(e2) * scale;
}

TEST_CASE("commitment_loss equals its composition of tensor ops, values and gradients, and refuses bad input") {
  const int64_t B = 2, H = 3, N = 70, D = 9, C = 5;
  const Tensor assign = random_ints({B, H, N}, 0, C - 1, 5);
  std::vector<bool> m(size_t(B * N), false);
  for (int64_t n = 50; n < N; ++n) m[size_t(N + n)] = true;
  const Tensor mask = bools(m, {B, N});
  for (DType dt : {kFloat64, kFloat32}) {
    for (bool masked : {false, true}) {
      INFO(dt, masked);
      const double tol = dt == kFloat64 ? 1e-12 : 1e-5;  // (the loss's, about 500, relative to it)
      Generator gen(7);
      const Tensor x0 = rand({B, H, N, D}, dt, gen, -1, 1), mu = rand({H, C, D}, dt, gen, -1, 1);
      auto run = [&](bool fused) {
        Tensor x = x0.detach();
        x.set_requires_grad(true);
        const Tensor pad = masked ? mask : Tensor();
        Tensor l = fused ? commitment_loss(x, mu, assign, pad, 0.25) : commitment_ref(x, mu, assign, pad, 0.25);
        (l * 3.0).backward();
        return std::vector<Tensor>{l, x.grad()};
      };
      const std::vector<Tensor> f = run(true), r = run(false);
      check_close(f[0], r[0], tol * std::abs(r[0].item()));
      check_close(f[1], r[1], tol);
    }
  }
  // Padded tokens may carry any id, and a non-finite value there stays out of the sum.
  Tensor x = leaf64({1, 1, 3, 2}, 3);
  Tensor xn = cat({narrow(x, 2, 0, 2), Tensor::full({1, 1, 1, 2}, INFINITY, kFloat64)}, 2).detach();
  const Tensor mu = leaf64({1, 2, 2}, 4).detach();
  check_close(commitment_loss(xn, mu, ti64({1, 0, 99}, {1, 1, 3}), bools({false, false, true}, {1, 3})),
              commitment_ref(narrow(xn, 2, 0, 2), mu, ti64({1, 0}, {1, 1, 2}), Tensor(), 1.0), 1e-14);
  // One kernel call each way, and the ids' scan (none for ids cf built: ops::KnownGoodIndices); empty
  // batches and sequences give 0.
  Tensor xl = leaf64({2, 3, 4, 5}, 8);
  const Tensor m2 = leaf64({3, 2, 5}, 9).detach(), a2 = random_ints({2, 3, 4}, 0, 1, 10);
  KernelCalls before = kernel_calls();
  commitment_loss(xl, m2, a2);
  CHECK((kernel_calls() - before).cpu == 2);
  Tensor l;
  before = kernel_calls();
  {
    ops::KnownGoodIndices built_here;
    l = commitment_loss(xl, m2, a2);
  }
  CHECK((kernel_calls() - before).cpu == 1);
  const Tensor g = ones_like(l);
  before = kernel_calls();
  l.backward(g);
  CHECK((kernel_calls() - before).cpu == 1);
  check_close(commitment_loss(leaf64({0, 3, 4, 5}, 1), m2, Tensor::zeros({0, 3, 4}, kInt64)), {0.0}, 0);
  check_close(commitment_loss(leaf64({2, 3, 0, 5}, 1), m2, Tensor::zeros({2, 3, 0}, kInt64)), {0.0}, 0);
  // Autocast: a 16-bit x gives a float32 loss
  {
    AutocastGuard guard(kBFloat16);
    CHECK(commitment_loss(to(xl.detach(), kBFloat16), to(m2, kFloat32), a2).dtype() == kFloat32);
  }
  CHECK_THROWS_MSG(commitment_loss(leaf64({2, 3, 4}, 1), m2, a2), ShapeError,
                   "[commitment_loss] expected x (B, H, N, D), centroids (H, C, D) with C >= 1 and int64 assign");
  CHECK_THROWS_MSG(commitment_loss(xl, leaf64({2, 2, 5}, 1).detach(), a2), ShapeError, "[commitment_loss]",
                   "centroids float64 (2,2,5)");
  CHECK_THROWS_MSG(commitment_loss(xl, m2, to(a2, kFloat64)), ShapeError, "[commitment_loss]", "assign float64");
  CHECK_THROWS_MSG(commitment_loss(xl, to(m2, kFloat32), a2), DTypeError,
                   "[commitment_loss] x and centroids must share one dtype, float32 or float64; got float64 and float32");
  CHECK_THROWS_MSG(commitment_loss(xl, leaf64({3, 2, 5}, 9), a2), AutogradError,
                   "[commitment_loss] the centroids are sg(mu)");
  CHECK_THROWS_MSG(commitment_loss(xl, m2, a2, Tensor(), INFINITY), ValueError, "[commitment_loss] scale must be finite");
  CHECK_THROWS_MSG(commitment_loss(xl, m2, a2, bools({false, true}, {1, 2})), ShapeError,
                   "[commitment_loss] key_padding_mask must be bool (B, N) = (2, 4), got bool (1,2)");
  CHECK_THROWS_MSG(commitment_loss(xl, m2, a2 + 1.0), IndexError,
                   "[commitment_loss] centroid index 2 at flat position");
  CHECK_THROWS_MSG(commitment_loss(xl, m2, fake_cuda({2, 3, 4}, kInt64)), DeviceError, "[commitment_loss]");
}

GRADCHECK_CASE(commitment_loss) {
  const Tensor mask = bools({false, false, false, false, false, true, true}, {1, 7});
  const Tensor mu = leaf64({2, 3, 4}, 12).detach(), assign = random_ints({1, 2, 7}, 0, 2, 13);
  check_grad("commitment_loss",
             [&](const std::vector<Tensor>& in) {
               return stack({commitment_loss(in[0], mu, assign, mask, 0.5), commitment_loss(in[0], mu, assign)}, 0);
             },
             {leaf64({1, 2, 7, 4}, 11)});
}

PARITY_CASE(commitment_loss) {
  // N across several of the forward's 64-token blocks, D over a warp, padding in one sequence
  const int64_t B = 3, H = 2, N = 150, D = 40, C = 7;
  std::vector<bool> m(size_t(B * N), false);
  for (int64_t n = 100; n < N; ++n) m[size_t(N + n)] = true;
  const Tensor mask = bools(m, {B, N}), assign = random_ints({B, H, N}, 0, C - 1, 71);
  const Tensor mu = leaf32({H, C, D}, 72).detach();
  check_parity("commitment_loss", [&](const Inputs& in) { return commitment_loss(in[0], in[1], in[2], in[3], 0.5); },
               {leaf32({B, H, N, D}, 73), mu, assign, mask});
  check_parity("commitment_loss", [&](const Inputs& in) { return commitment_loss(in[0], in[1], in[2]); },
               {leaf32({B, H, N, D}, 74), mu, assign});
  check_parity("commitment_loss", [&](const Inputs& in) { return commitment_loss(in[0], in[1], in[2]); },
               {leaf32({0, H, N, D}, 75), mu, Tensor::zeros({0, H, N}, kInt64)});
  check_grad_cuda("commitment_loss",
                  [&](const std::vector<Tensor>& in) { return commitment_loss(in[0], in[1], in[2], in[3], 0.5); },
                  {leaf64({1, 2, 7, 4}, 78), leaf64({2, 3, 4}, 76).detach(), random_ints({1, 2, 7}, 0, 2, 77),
                   bools({false, false, false, false, true, true, true}, {1, 7})});
}

// Routing's centroid EMA stats as a direct loop: (2, R, C, D + 1) sums and counts of the assigned rows.
std::vector<double> ema_stats_ref(const Tensor& xq, const Tensor& aq, const Tensor& mq, const Tensor& xk,
                                  const Tensor& ak, const Tensor& mk, int64_t C) {
  const int64_t B = xq.shape()[0], R = xq.shape()[1], N = xq.shape()[2], D = xq.shape()[3];
  std::vector<double> out(size_t(2 * R * C * (D + 1)), 0.0);
  for (int64_t s = 0; s < 2; ++s) {
    const std::vector<double> x = to(s == 0 ? xq : xk, kFloat64).to_vector<double>();
    const std::vector<int64_t> a = (s == 0 ? aq : ak).to_vector<int64_t>();
    const Tensor& m = s == 0 ? mq : mk;
    const std::vector<bool> pad = m.defined() ? m.to_vector<bool>() : std::vector<bool>(size_t(B * N), false);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t n = 0; n < N; ++n) {
          if (pad[size_t(b * N + n)]) continue;
          const int64_t t = (b * R + r) * N + n, c = a[size_t(t)];
          double* o = out.data() + ((s * R + r) * C + c) * (D + 1);
          for (int64_t d = 0; d < D; ++d) o[d] += x[size_t(t * D + d)];
          o[D] += 1;
        }
  }
  return out;
}

TEST_CASE("routing's centroid EMA: the stats and the update equal a direct computation, one call each") {
  const int64_t B = 2, R = 3, N = 150, D = 5, C = 4;
  Generator gen(3);
  const Tensor xq = rand({B, R, N, D}, kFloat64, gen, -1, 1), xk = rand({B, R, N, D}, kFloat64, gen, -1, 1);
  // cluster 3 of head 0 gets no query: its query mean is the centroid itself
  Tensor aq = random_ints({B, R, N}, 0, C - 1, 4), ak = random_ints({B, R, N}, 0, C - 1, 5);
  aq = where(logical_and(eq(aq, 3.0), reshape(eq(Tensor::arange(R, kInt64), 0.0), {1, R, 1})),
             Tensor::zeros({1}, kInt64), aq);
  std::vector<bool> m(size_t(B * N), false);
  for (int64_t n = 120; n < N; ++n) m[size_t(N + n)] = true;
  const Tensor mk = bools(m, {B, N});
  // NaN and inf at padded keys reach no centroid
  const Tensor xk_pad = where(reshape(mk, {B, 1, N, 1}), Tensor::full({1}, NAN, kFloat64), xk);
  for (DType dt : {kFloat64, kFloat32}) {
    INFO(dt);
    Tensor stats = Tensor::empty({2, R, C, D + 1}, dt);
    const Tensor xq_dt = to(xq, dt), xk_dt = to(xk_pad, dt);
    const KernelCalls before = kernel_calls();
    ops::centroid_ema_stats_into(xq_dt, aq, Tensor(), xk_dt, ak, mk, stats);
    CHECK((kernel_calls() - before).cpu == 1);
    const std::vector<double> want = ema_stats_ref(xq_dt, aq, Tensor(), to(xk, dt), ak, mk, C);
    check_close(stats, want, dt == kFloat64 ? 1e-12 : 1e-5);
    CHECK(to(stats, kFloat64).to_vector<double>()[size_t(3 * (D + 1) + D)] == 0.0);  // head 0, cluster 3: no query
    // The update against the formula, with an empty side keeping mu for its mean.
    Tensor mu = to(rand({R, C, D}, kFloat64, gen, -1, 1), dt);
    const std::vector<double> mu0 = to(mu, kFloat64).to_vector<double>();
    const std::vector<double> st = to(stats, kFloat64).to_vector<double>();
    const double decay = 0.9;
    std::vector<double> expected(mu0.size());
    for (int64_t rc = 0; rc < R * C; ++rc)
      for (int64_t d = 0; d < D; ++d) {
        const double* q = st.data() + rc * (D + 1);
        const double* k = st.data() + (R * C + rc) * (D + 1);
        const double m0 = mu0[size_t(rc * D + d)];
        const double mq = q[D] > 0 ? q[d] / q[D] : m0, mkm = k[D] > 0 ? k[d] / k[D] : m0;
        expected[size_t(rc * D + d)] = decay * m0 + (1 - decay) / 2 * (mq + mkm);
      }
    const int64_t version = mu.version();
    const KernelCalls b2 = kernel_calls();
    ops::centroid_ema_update_(mu, stats, decay);
    CHECK((kernel_calls() - b2).cpu == 1);
    CHECK(mu.version() > version);
    check_close(mu, expected, dt == kFloat64 ? 1e-14 : 1e-6);
  }
  // A padding mask of any layout (a view of a wider one) gives the same sums.
  {
    std::vector<bool> wide(size_t(B * (N + 3)), false);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n) wide[size_t(b * (N + 3) + n)] = m[size_t(b * N + n)];
    const Tensor view = narrow(bools(wide, {B, N + 3}), 1, 0, N);
    REQUIRE_FALSE(view.is_contiguous());
    Tensor s1 = Tensor::empty({2, R, C, D + 1}, kFloat64), s2 = Tensor::empty({2, R, C, D + 1}, kFloat64);
    ops::centroid_ema_stats_into(xq, aq, Tensor(), xk, ak, mk, s1);
    ops::centroid_ema_stats_into(xq, aq, Tensor(), xk, ak, view, s2);
    check_close(s2, s1, 0);
  }
  CHECK_THROWS_MSG(ops::centroid_ema_stats_into(to(xq, kBFloat16), aq, Tensor(), to(xk, kBFloat16), ak, Tensor(),
                                                Tensor::empty({2, R, C, D + 1}, kBFloat16)),
                   DTypeError, "[centroid_ema_stats] runs on float32 or float64, got bfloat16");
  // No token: zero sums and counts, and the centroids stay.
  Tensor none = Tensor::empty({2, R, C, D + 1});
  ops::centroid_ema_stats_into(Tensor::zeros({B, R, 0, D}), Tensor::zeros({B, R, 0}, kInt64), Tensor(),
                               Tensor::zeros({B, R, 0, D}), Tensor::zeros({B, R, 0}, kInt64), Tensor(), none);
  check_close(none, Tensor::zeros({2, R, C, D + 1}), 0);
  CHECK_THROWS_MSG(ops::centroid_ema_stats_into(xq, aq, Tensor(), xk, ak, Tensor(), Tensor::empty({2, R, C, D}, kFloat64)),
                   ShapeError, "[centroid_ema_stats] expected xq, xk (B, R, N, D) of one float dtype and stats (2, R, C, D + 1)");
  CHECK_THROWS_MSG(ops::centroid_ema_stats_into(xq, to(aq, kFloat64), Tensor(), xk, ak, Tensor(),
                                                Tensor::empty({2, R, C, D + 1}, kFloat64)),
                   ShapeError, "[centroid_ema_stats] ids must be int64 (2,3,150)");
  CHECK_THROWS_MSG(ops::centroid_ema_stats_into(xq, aq, bools({true}, {1, 1}), xk, ak, Tensor(),
                                                Tensor::empty({2, R, C, D + 1}, kFloat64)),
                   ShapeError, "[centroid_ema_stats] padding masks must be bool (2,150)");
  Tensor mu = Tensor::zeros({R, C, D}, kFloat64);
  CHECK_THROWS_MSG(ops::centroid_ema_update_(mu, Tensor::zeros({2, R, C, D}, kFloat64), 0.9), ShapeError,
                   "[centroid_ema_update] expected mu (R, C, D) and stats (2, R, C, D + 1)");
  CHECK_THROWS_MSG(ops::centroid_ema_update_(mu, Tensor::zeros({2, R, C, D + 1}, kFloat64), 1.0), ValueError,
                   "[centroid_ema_update] decay must be in [0, 1), got 1");
}

CUDA_TEST_CASE("routing's centroid EMA on CUDA gives the CPU's bits") {
  // Several chunks of tokens (B N = 2 * 700), padding; the shared-memory kernel (C (D + 1) = 9 * 41 slots)
  // and the one for slots beyond it (200 * 41 = 8200), float32 and float64.
  for (const auto& [C, dt] : {std::pair<int64_t, DType>{9, kFloat32}, {9, kFloat64}, {200, kFloat32}}) {
    CAPTURE(C);
    const int64_t B = 2, R = 2, N = 700, D = 40;
    Generator gen(8);
    const Tensor xq = rand({B, R, N, D}, dt, gen, -1, 1), xk = rand({B, R, N, D}, dt, gen, -1, 1);
    const Tensor aq = random_ints({B, R, N}, 0, C - 1, 9), ak = random_ints({B, R, N}, 0, C - 1, 10);
    std::vector<bool> m(size_t(B * N), false);
    for (int64_t n = 500; n < N; ++n) m[size_t(n)] = true;
    const Tensor mk = bools(m, {B, N});
    Tensor s_cpu = Tensor::empty({2, R, C, D + 1}, dt), s_gpu = cuda0(Tensor::empty({2, R, C, D + 1}, dt));
    ops::centroid_ema_stats_into(xq, aq, Tensor(), xk, ak, mk, s_cpu);
    ops::centroid_ema_stats_into(cuda0(xq), cuda0(aq), Tensor(), cuda0(xk), cuda0(ak), cuda0(mk), s_gpu);
    check_close(s_gpu.cpu(), s_cpu, 0);
    Tensor mu_cpu = rand({R, C, D}, dt, gen, -1, 1), mu_gpu = cuda0(mu_cpu);
    ops::centroid_ema_update_(mu_cpu, s_cpu, 0.99);
    ops::centroid_ema_update_(mu_gpu, s_gpu, 0.99);
    check_close(mu_gpu.cpu(), mu_cpu, 0);
  }
}

TEST_CASE("hash_codes: sign bits of random projections, packed in int64") {
  Tensor x = leaf64({2, 5, 4}, 3).detach();
  Generator g(1);
  Tensor planes = random_hyperplanes(7, 4, kFloat64, g);
  auto codes = hash_codes(x, planes).to_vector<int64_t>();
  auto xv = values(x), pv = values(planes);
  for (int64_t r = 0; r < 10; ++r) {
    int64_t want = 0;
    for (int64_t b = 0; b < 7; ++b) {
      double s = 0;
      for (int64_t d = 0; d < 4; ++d) s += xv[size_t(r * 4 + d)] * pv[size_t(b * 4 + d)];
      if (s > 0) want |= int64_t(1) << b;
    }
    CHECK(codes[size_t(r)] == want);
  }
  // 63 bits fit in a non-negative int64.
  Generator g2(2);
  for (int64_t c : hash_codes(x, random_hyperplanes(63, 4, kFloat64, g2)).to_vector<int64_t>()) CHECK(c >= 0);
}

TEST_CASE("Hamming K-Means recovers planted clusters exactly, excludes padding, and clamps the cluster count") {
  const int64_t C = 5, per = 9, N = C * per, bits = 63;
  Generator g(3);
  // Centers 63 random bits apart by ~31; members flip at most 3 bits, so every
  // member is far nearer its own center than any other.
  std::vector<int64_t> centers;
  for (int64_t j = 0; j < C; ++j) centers.push_back(randint(0, int64_t(1) << 62, {1}, g).item<int64_t>());
  std::vector<int64_t> codes, truth;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t j = (i * 7) % C;  // interleaved, so no cluster is contiguous
    int64_t c = centers[size_t(j)];
    auto flips = randint(0, bits, {3}, g).to_vector<int64_t>();
    for (int64_t f : flips) c ^= int64_t(1) << f;
    codes.push_back(c);
    truth.push_back(j);
  }
  // Two rows: the planted data, and the same with the last 4 entries excluded.
  std::vector<int64_t> both = codes;
  both.insert(both.end(), codes.begin(), codes.end());
  std::vector<bool> excl(size_t(2 * N), false);
  for (int64_t i = N - 4; i < N; ++i) excl[size_t(N + i)] = true;
  auto got = hamming_kmeans(ti64(both, {2, N}), C, 10, bits, bools(excl, {2, N})).to_vector<int64_t>();
  for (int row = 0; row < 2; ++row) {
    std::map<int64_t, int64_t> to_truth, from_truth;
    bool consistent = true;
    for (int64_t i = 0; i < N; ++i) {
      int64_t id = got[size_t(row * N + i)];
      if (row == 1 && i >= N - 4) {
        CHECK(id == -1);
        continue;
      }
      auto [it, fresh] = to_truth.emplace(id, truth[size_t(i)]);
      auto [jt, fresh2] = from_truth.emplace(truth[size_t(i)], id);
      consistent = consistent && it->second == truth[size_t(i)] && jt->second == id;
      (void)fresh;
      (void)fresh2;
    }
    CHECK_MESSAGE(consistent, "row ", row, ": the partition differs from the planted one");
    CHECK(to_truth.size() == size_t(C));
  }
  // More clusters than entries: each valid entry alone, ids in [0, n).
  auto few = hamming_kmeans(ti64({1, 2, 4, 8, 16}, {1, 5}), 100, 10, 8, bools({false, false, false, true, true}, {1, 5}))
                 .to_vector<int64_t>();
  CHECK(few == std::vector<int64_t>{0, 1, 2, -1, -1});
  // Duplicate codes only: fewer distinct codes than clusters is no error.
  auto dup = hamming_kmeans(ti64({5, 5, 5, 5}, {1, 4}), 3, 10, 8).to_vector<int64_t>();
  CHECK(dup == std::vector<int64_t>{0, 0, 0, 0});
  // Everything excluded.
  auto none = hamming_kmeans(ti64({1, 2}, {1, 2}), 2, 10, 8, bools({true, true}, {1, 2})).to_vector<int64_t>();
  CHECK(none == std::vector<int64_t>{-1, -1});
}

TEST_CASE("Hamming K-Means: the AVX-512 VPOPCNTDQ form of the loops gives the scalar form's ids") {
  // Few bits make many equal distances, so the tie rules (lower id when assigning,
  // first farthest code when seeding) decide most choices; rows with padding, the
  // planted codes, more clusters than distinct codes, and 1, 3 and 10 Lloyd steps.
  if (!kernels::hamming_kmeans_vectorised())
    MESSAGE("this CPU has no AVX-512 VPOPCNTDQ: both calls run the scalar form");
  std::mt19937_64 rng(11);
  for (int64_t bits : {int64_t(4), int64_t(8), int64_t(63)}) {
    const int64_t G = 6, N = 300;
    std::vector<int64_t> v(size_t(G * N));
    for (auto& e : v) e = int64_t(rng() & ((uint64_t(1) << bits) - 1));
    std::vector<bool> excl(v.size());
    for (size_t i = 0; i < excl.size(); ++i) excl[i] = (i / N) % 2 == 1 && i % 7 == 0;
    for (const Tensor& codes : {ti64(v, {G, N}), planted_codes(G, N, 12, bits, 5)})
      for (int64_t clusters : {int64_t(1), int64_t(12), int64_t(100), int64_t(400)})
        for (int64_t iterations : {int64_t(1), int64_t(3), int64_t(10)}) {
          CAPTURE(bits);
          CAPTURE(clusters);
          CAPTURE(iterations);
          Tensor scalar = Tensor::empty({G, N}, kInt64), vec = Tensor::empty({G, N}, kInt64);
          kernels::hamming_kmeans_cpu(codes, bools(excl, {G, N}), clusters, iterations, bits, scalar, false);
          kernels::hamming_kmeans_cpu(codes, bools(excl, {G, N}), clusters, iterations, bits, vec, true);
          CHECK(scalar.to_vector<int64_t>() == vec.to_vector<int64_t>());
          CHECK(hamming_kmeans(codes, clusters, iterations, bits, bools(excl, {G, N})).to_vector<int64_t>() ==
                scalar.to_vector<int64_t>());
        }
  }
}

TEST_CASE("Hamming K-Means: the Lloyd iterations move a wrong farthest-point split to the right one") {
  // Thermometer codes (value v -> its lowest v bits set) make Hamming distance |v - w|
  // and the majority-vote centroid the median, so the run can be followed by hand.
  // Values 0..9 (one wide group) and 14, 15 (a narrow one), the first entry 0.
  // Farthest-point seeds: 0 and 15 (ids 0 and 1). Assignment: 8 and 9 are nearer 15,
  // so the split is {0..7} | {8, 9, 14, 15}. Iteration 1: medians 3 and 14 (tied
  // bits keep the old ones), 8 moves back: {0..8} | {9, 14, 15}. Iteration 2:
  // medians 4 and 14, 9 is 5 from both and goes to the lower id: {0..9} | {14, 15},
  // the planted split, a fixed point.
  const std::vector<int64_t> value = {0, 14, 1, 8, 2, 15, 3, 9, 4, 5, 6, 7};
  std::vector<int64_t> codes;
  for (int64_t v : value) codes.push_back((int64_t(1) << v) - 1);
  auto split = [&](int64_t iterations) {
    auto ids = hamming_kmeans(ti64(codes, {1, int64_t(codes.size())}), 2, iterations, 16).to_vector<int64_t>();
    std::vector<int64_t> second;  // the values put in cluster 1
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == 1) second.push_back(value[i]);
    std::sort(second.begin(), second.end());
    return second;
  };
  CHECK(split(0) == std::vector<int64_t>{8, 9, 14, 15});
  CHECK(split(1) == std::vector<int64_t>{9, 14, 15});
  CHECK(split(2) == std::vector<int64_t>{14, 15});
  CHECK(split(10) == std::vector<int64_t>{14, 15});
}

TEST_CASE("hash_codes and hamming_kmeans refuse bad input with messages naming the problem") {
  CHECK_THROWS_MSG(hamming_kmeans(ti64({1, 300}, {1, 2}), 2, 10, 8), ValueError,
                   "[hamming_kmeans] code 300", "beyond the 8 given");
  CHECK_THROWS_MSG(hamming_kmeans(ti64({1, -5}, {1, 2}), 2, 10, 63), ValueError,
                   "[hamming_kmeans] code -5 at position 1", "beyond the 63 given");
  // 63 bits take every non-negative int64, the largest too.
  CHECK(hamming_kmeans(ti64({1, std::numeric_limits<int64_t>::max()}, {1, 2}), 2, 10, 63).numel() == 2);
  CHECK_THROWS_MSG(hamming_kmeans(ti64({1, 3}, {1, 2}), 0, 10, 8), ValueError, "clusters must be >= 1");
  CHECK_THROWS_MSG(hamming_kmeans(t64({1, 3}, {1, 2}), 2, 10, 8), DTypeError, "codes must be int64 (G, N)");
  CHECK_THROWS_MSG(hamming_kmeans(ti64({1, 3}, {1, 2}), 2, 10, 8, bools({true}, {1, 1})), ShapeError,
                   "exclude must be bool of the codes' shape (1,2)");
  CHECK_THROWS_MSG(hash_codes(leaf64({2, 3}, 1), leaf64({2, 4}, 2)), ShapeError,
                   "[hash_codes] expected x (..., D) and planes (bits, D)");
  CHECK_THROWS_MSG(random_hyperplanes(0, 4, kFloat32, default_generator()), ValueError, "bits must be in [1, 63]");
  // Operands on two devices are refused by name before any kernel runs (any
  // build: fake_cuda has no storage and is never read).
  CHECK_THROWS_MSG(hash_codes(leaf64({2, 4}, 1), fake_cuda({3, 4}, kFloat64)), DeviceError, "[hash_codes]",
                   "one device", "cuda:0");
  CHECK_THROWS_MSG(hamming_kmeans(ti64({1, 2, 3}, {1, 3}), 2, 10, 8, fake_cuda({1, 3}, kBool)), DeviceError,
                   "[hamming_kmeans] exclude is on cuda:0");
}

PARITY_CASE(hash_codes) {
  Generator g(3);
  const Tensor x = rand({2, 3, 40, 16}, kFloat64, g, -1, 1);
  const Tensor planes = random_hyperplanes(63, 16, kFloat64, g);
  const Tensor c = hash_codes(x, planes), gc = hash_codes(cuda0(x), cuda0(planes));
  CHECK(gc.device().is_cuda());
  CHECK(gc.shape() == c.shape());
  CHECK(gc.cpu().to_vector<int64_t>() == c.to_vector<int64_t>());
}

CUDA_TEST_CASE("a hamming_kmeans code beyond its bits is a deferred check with the CPU's message") {
  const Tensor codes = cuda0(ti64({1, 2, 3, 300, 4, 1000}, {2, 3}));
  cuda::synchronize();
  const cuda::TransferStats before = cuda::transfer_stats();
  const Tensor ids = hamming_kmeans(codes, 2, 10, 8);  // returns without reading the codes back
  const cuda::TransferStats d = cuda::transfer_stats() - before;
  CHECK(d.device_to_host == 0);
  CHECK(d.synchronizations == 0);
  CHECK_THROWS_MSG(ids.to_vector<int64_t>(), ValueError, "[hamming_kmeans] code 300 at position 3",
                   "beyond the 8 given");
  CHECK(hamming_kmeans(codes, 2, 10, 10).cpu().to_vector<int64_t>() ==
        hamming_kmeans(codes.cpu(), 2, 10, 10).to_vector<int64_t>());
}

PARITY_CASE(hamming_kmeans) {
  for (int64_t bits : {8, 31, 63}) {
    INFO("bits ", bits);
    const int64_t rows = 5, n = 70;
    const Tensor codes = planted_codes(rows, n, 6, bits, uint32_t(bits));
    // Row 1: padded tail; row 2: all padding; row 3: only 3 valid entries (fewer
    // than the clusters); rows 0 and 4: everything valid.
    std::vector<bool> ex(size_t(rows * n), false);
    for (int64_t i = 50; i < n; ++i) ex[size_t(1 * n + i)] = true;
    for (int64_t i = 0; i < n; ++i) ex[size_t(2 * n + i)] = true;
    for (int64_t i = 3; i < n; ++i) ex[size_t(3 * n + i)] = true;
    const Tensor excl = Tensor::from_vector(ex, {rows, n});
    for (int64_t clusters : {1, 6, 20, 100}) {
      INFO("clusters ", clusters);
      for (int64_t iterations : {0, 1, 10}) {
        const Tensor c = hamming_kmeans(codes, clusters, iterations, bits, excl);
        const Tensor gc = hamming_kmeans(cuda0(codes), clusters, iterations, bits, cuda0(excl));
        CHECK(gc.device().is_cuda());
        CHECK(gc.cpu().to_vector<int64_t>() == c.to_vector<int64_t>());
      }
    }
    // Without an exclusion mask, and with duplicate codes (re-seeding stops).
    const Tensor dup = Tensor::from_vector(std::vector<int64_t>(40, 5), {1, 40});
    CHECK(hamming_kmeans(cuda0(dup), 4, 10, bits).cpu().to_vector<int64_t>() ==
          hamming_kmeans(dup, 4, 10, bits).to_vector<int64_t>());
    CHECK(hamming_kmeans(cuda0(codes), 6, 10, bits).cpu().to_vector<int64_t>() ==
          hamming_kmeans(codes, 6, 10, bits).to_vector<int64_t>());
  }
}

// ---------------------------------------------------------------- cluster_means (eq. 3)

namespace {
// (2, 2, 7) ids in [-1, 4): queries without a cluster, and cluster 3 empty in head (0, 1).
Tensor means_ids() {
  return ti64({0, 1, -1, 2, 3, 1, 0,  2, 2, 0, 1, -1, 1, 0,
               3, 2, 1, 0, -1, 2, 2,  0, 1, 2, 2, 1, -1, 3},
              {2, 2, 7});
}
// The composition cluster_means replaced: a one-hot membership S (slot C for no cluster, dropped),
// S^T (scale x) over the member counts.
Tensor means_reference(const Tensor& x, const Tensor& ids, int64_t C, double scale) {
  Tensor member = slice(one_hot(where(ge(ids, 0.0), ids, double(C)), C + 1, x.dtype()), -1, 0, C);
  Tensor count = clamp(sum(member, {-2}, true), 1.0, INFINITY);  // (..., 1, C)
  return matmul(transpose(member, -1, -2), x * scale) / transpose(count, -1, -2);
}
}  // namespace

GRADCHECK_CASE(cluster_means) {
  const Tensor ids = means_ids();
  for (double scale : {1.0, 0.6})
    check_grad("cluster_means", [&](const std::vector<Tensor>& x) { return cluster_means(x[0], ids, 4, scale); },
               {leaf64({2, 2, 7, 3}, 51)});
  check_grad("cluster_means", [&](const std::vector<Tensor>& x) { return cluster_means(x[0], ids, 6); },
             {leaf64({2, 2, 7, 3}, 52)});  // clusters beyond the ids: empty
}

TEST_CASE("cluster_means equals the one-hot membership composition, and its gradient") {
  const Tensor ids = means_ids();
  for (DType dt : {kFloat64, kFloat32}) {
    CAPTURE(dt);
    Tensor x = leaf64({2, 2, 7, 5}, 53), y = leaf64({2, 2, 7, 5}, 53);
    if (dt == kFloat32) {
      x = to(x.detach(), dt);
      y = to(y.detach(), dt);
      x.set_requires_grad(true);
      y.set_requires_grad(true);
    }
    Tensor got = cluster_means(x, ids, 4, 0.6), want = means_reference(y, ids, 4, 0.6);
    CHECK(got.shape() == Shape({2, 2, 4, 5}));
    check_close(got, want, dt == kFloat64 ? 1e-14 : 1e-6);
    // the empty cluster (head (0, 1), cluster 3) is exactly 0
    for (double v : values(slice(slice(slice(got, 0, 0, 1), 1, 1, 2), 2, 3, 4))) CHECK(v == 0.0);
    Generator g(4);
    Tensor w = randn(got.shape(), dt, g);
    sum(got * w).backward();
    sum(want * w).backward();
    check_close(x.grad(), y.grad(), dt == kFloat64 ? 1e-14 : 1e-6);
  }
  // Any rank >= 2: (N, D) with (N,) ids.
  Tensor x2 = leaf64({7, 3}, 54);
  Tensor ids2 = ti64({0, 1, -1, 1, 0, 2, 2}, {7});
  check_close(cluster_means(x2, ids2, 3), means_reference(x2, ids2, 3, 1.0), 1e-14);
}

TEST_CASE("cluster_means refuses bad input with messages naming the problem") {
  const Tensor x = leaf64({2, 2, 7, 3}, 55), ids = means_ids();
  CHECK_THROWS_MSG(cluster_means(x, reshape(ids, {4, 7}), 4), ShapeError, "[cluster_means] expected x (..., N, D)",
                   "assignment int64 (4,7)");
  CHECK_THROWS_MSG(cluster_means(x, ids, 3), IndexError, "[cluster_means] cluster id 3", "out of range [-1, 3)");
  CHECK_THROWS_MSG(cluster_means(x, ids - 1.0, 4), IndexError, "[cluster_means] cluster id -2");
  CHECK_THROWS_MSG(cluster_means(x, ids, 0), ValueError, "[cluster_means] clusters must be >= 1, got 0");
  CHECK_THROWS_MSG(cluster_means(x, to(ids, kFloat64), 4), DTypeError, "[cluster_means] assignment must be int64");
  CHECK_THROWS_MSG(cluster_means(reshape(ids, {2, 2, 7, 1}), ids, 4), DTypeError,
                   "[cluster_means] x must be float32 or float64");
  CHECK_THROWS_MSG(cluster_means(x, ids, 4, INFINITY), ValueError, "[cluster_means] scale must be finite");
  CHECK_THROWS_MSG(cluster_means(fake_cuda({2, 2, 7, 3}, kFloat64), ids, 4), DeviceError, "[cluster_means]");
}

PARITY_CASE(cluster_means) {
  // The same sums in the same order on both devices: the same bits (tolerance 0), values and gradients.
  const Tensor ids = means_ids();
  ParityOptions exact;
  exact.atol = 0;
  exact.rtol = 0;
  for (bool f64 : {true, false})
    check_parity("cluster_means",
                 [&](const std::vector<Tensor>& x) { return cluster_means(x[0], ids.to(x[0].device()), 4, 0.6); },
                 {f64 ? leaf64({2, 2, 7, 5}, 56) : leaf32({2, 2, 7, 5}, 56)}, exact);
  check_parity("cluster_means",  // no row: every centroid 0
               [&](const std::vector<Tensor>& x) {
                 return cluster_means(x[0], Tensor::zeros({2, 0}, kInt64, x[0].device()), 3);
               },
               {leaf64({2, 0, 4}, 57)}, exact);
}

}  // TEST_SUITE
