// Sparse top-k products (autograd/ops/sparse.h): float64 gradchecks with
// repeated indices, the gathered dense formula, errors, and CUDA parity.
#include <cmath>
#include <cstring>
#include <random>

#include "autograd/autocast.h"
#include "autograd/ops/clustering.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/nn_functional.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/sort.h"
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

// ---------------------------------------------------------------- cluster_topk_attention

namespace {

// The composition cluster_topk_attention replaced in improved clustered attention: each query's
// key list gathered from its cluster's (G, Nq, kk), the sparse products, a masked softmax, dropout,
// then mass and rest gathered per query (a query without a cluster: all blocked, mass and rest 0).
Tensor cluster_topk_reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& top,
                              const Tensor& assign, const Tensor& mass, const Tensor& rest, const Tensor& kpm,
                              double scale, bool causal, double rate, Generator& gen) {
  const int64_t B = q.shape()[0], H = q.shape()[1], Nq = q.shape()[2], D = q.shape()[3];
  const int64_t Nk = k.shape()[2], Dv = v.shape()[3], C = top.shape()[2], kk = top.shape()[3], G = B * H;
  const Device dev = q.device();
  Tensor a = reshape(assign, {G, Nq});
  Tensor none = lt(a, 0.0);
  Tensor rows = where(none, Tensor::zeros({1}, kInt64, dev), a) +
                reshape(Tensor::arange(G, kInt64, dev) * double(C), {G, 1});
  Tensor per_q = reshape(index_select(reshape(top, {G * C, kk}), 0, reshape(rows, {G * Nq})), {G, Nq, kk});
  Tensor blocked = expand(reshape(none, {G, Nq, 1}), {G, Nq, kk});
  if (kpm.defined()) {
    Tensor pad = reshape(expand(reshape(to(kpm, kInt64), {B, 1, Nk}), {B, H, Nk}), {G, Nk});
    blocked = logical_or(blocked, gt(reshape(gather(pad, 1, reshape(per_q, {G, Nq * kk})), {G, Nq, kk}), 0.5));
  }
  if (causal)
    blocked = logical_or(blocked, gt(per_q, reshape(Tensor::arange(Nq, kInt64, dev), {1, Nq, 1}) + double(Nk - Nq)));
  Tensor w = softmax(masked_fill(sparse_dot(reshape(q * scale, {G, Nq, D}), reshape(k, {G, Nk, D}), per_q), blocked,
                                 -INFINITY),
                     -1);
  if (rate > 0) w = dropout(w, rate, true, gen);
  Tensor o = sparse_weighted_sum(w, reshape(v, {G, Nk, Dv}), per_q);
  Tensor slot = reshape(where(none, Tensor::full({1}, double(C), kInt64).to(dev), a), {G, Nq, 1});
  auto per_query = [&](const Tensor& x, int64_t d) {  // (G, C, d) -> (G, Nq, d), zeros for no cluster
    Tensor rows_c = cat({reshape(x, {G, C, d}), Tensor::zeros({G, 1, d}, x.dtype(), dev)}, 1);
    return take_along_dim(rows_c, slot, 1);
  };
  Tensor out = mass.defined() ? per_query(mass, 1) * o : o * to(logical_not(reshape(none, {G, Nq, 1})), o.dtype());
  if (rest.defined()) out = out + per_query(rest, Dv);
  return reshape(out, {B, H, Nq, Dv});
}

struct TopkCase {
  Tensor q, k, v, mass, rest, top, assign, kpm;
};

// B = 2, H = 2, Nq = 7, Nk = 9, D = 5, Dv = 3, C = 4 clusters (cluster 3 of head (1, 1) without
// members), kk = 4 distinct keys per cluster; queries without a cluster; a padded key, and in batch 1
// cluster 2's keys all padding (its members get rest alone).
TopkCase topk_case(DType dt, bool with_pad) {
  TopkCase c;
  auto leaf = [&](const Shape& s, uint64_t seed) {
    Tensor t = leaf64(s, seed, -1.5, 1.5);
    if (dt == kFloat64) return t;
    Tensor f = to(t.detach(), dt);
    f.set_requires_grad(true);
    return f;
  };
  const int64_t B = 2, H = 2, Nq = 7, Nk = 9, C = 4, kk = 4;
  c.q = leaf({B, H, Nq, 5}, 41);
  c.k = leaf({B, H, Nk, 5}, 42);
  c.v = leaf({B, H, Nk, 3}, 43);
  c.mass = leaf({B, H, C}, 44);
  c.rest = leaf({B, H, C, 3}, 45);
  Generator g(46);
  std::vector<int64_t> top = argsort(rand({B, H, C, Nk}, kFloat64, g), -1).to_vector<int64_t>();
  std::vector<int64_t> picked;
  for (int64_t r = 0; r < B * H * C; ++r)
    for (int64_t t = 0; t < kk; ++t) picked.push_back(top[size_t(r * Nk + t)]);
  if (with_pad)  // batch 1, both heads: cluster 2's keys are 5..8, all padding there
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < kk; ++t) picked[size_t(((1 * H + h) * C + 2) * kk + t)] = 5 + t;
  c.top = ti64(picked, {B, H, C, kk});
  std::vector<int64_t> as = {0, 1, -1, 2, 3, 1, 0,  2, 2, 0, 1, -1, 3, 0,
                             3, 2, 1, 0, -1, 2, 2,  0, 1, 2, 2, 1, -1, 0};
  c.assign = ti64(as, {B, H, Nq});
  if (with_pad) {
    std::vector<char> pad(size_t(B * Nk), 0);
    pad[3] = 1;                                                   // batch 0: key 3
    for (int64_t l = 5; l < Nk; ++l) pad[size_t(Nk + l)] = 1;  // batch 1: keys 5..8
    std::vector<bool> pb(pad.begin(), pad.end());
    c.kpm = Tensor::from_vector(pb, {B, Nk});
  }
  return c;
}

// dv of cluster_topk_attention with query 0 of head (0, 0) NaN and dropout 0.5 (sum of the output
// as the loss), on device d: a key that row dropped gets nothing from it (a dropped weight is an
// exact 0, as the CPU's dropout writes it; NaN * 0 would be NaN), a key it kept gets NaN.
std::vector<double> nan_row_dropout_dv(Device d) {
  const TopkCase c = topk_case(kFloat64, false);
  std::vector<double> qv = values(c.q);
  qv[0] = NAN;
  Tensor v = c.v.detach().to(d).set_requires_grad(true);
  Generator g(9);
  Tensor out = cluster_topk_attention(t64(qv, c.q.shape()).to(d), c.k.detach().to(d), v, c.top.to(d), c.assign.to(d),
                                      c.mass.detach().to(d), c.rest.detach().to(d), Tensor(), 1.0, false, 0.5, g);
  sum(out).backward();
  return values(v.grad().cpu());
}

}  // namespace

GRADCHECK_CASE(cluster_topk_attention) {
  for (bool with_pad : {false, true})
    for (bool causal : {false, true})
      for (double rate : {0.0, 0.4}) {
        CAPTURE(with_pad);
        CAPTURE(causal);
        CAPTURE(rate);
        const TopkCase c = topk_case(kFloat64, with_pad);
        check_grad("cluster_topk_attention",
                   [&](const std::vector<Tensor>& x) {
                     Generator g(17);  // every evaluation drops the same weights
                     return cluster_topk_attention(x[0], x[1], x[2], c.top, c.assign, x[3], x[4], c.kpm, 0.7, causal,
                                                   rate, g);
                   },
                   {c.q, c.k, c.v, c.mass, c.rest});
      }
  // Without mass and rest (the causal variant's form).
  const TopkCase c = topk_case(kFloat64, true);
  check_grad("cluster_topk_attention",
             [&](const std::vector<Tensor>& x) {
               return cluster_topk_attention(x[0], x[1], x[2], c.top, c.assign, Tensor(), Tensor(), c.kpm, 1.0, true);
             },
             {c.q, c.k, c.v});
}

TEST_CASE("cluster_topk_attention equals the composition it replaced, values and gradients") {
  for (DType dt : {kFloat64, kFloat32})
    for (bool with_pad : {false, true})
      for (bool causal : {false, true})
        for (bool with_mass : {true, false})
          for (double rate : {0.0, 0.3}) {
            CAPTURE(dt);
            CAPTURE(with_pad);
            CAPTURE(causal);
            CAPTURE(with_mass);
            CAPTURE(rate);
            const double tol = dt == kFloat64 ? 1e-12 : 2e-6;
            TopkCase a = topk_case(dt, with_pad), b = topk_case(dt, with_pad);
            const Tensor m_a = with_mass ? a.mass : Tensor(), r_a = with_mass ? a.rest : Tensor();
            const Tensor m_b = with_mass ? b.mass : Tensor(), r_b = with_mass ? b.rest : Tensor();
            Generator ga(5), gb(5);
            Tensor got = cluster_topk_attention(a.q, a.k, a.v, a.top, a.assign, m_a, r_a, a.kpm, 0.7, causal, rate, ga);
            Tensor want = cluster_topk_reference(b.q, b.k, b.v, b.top, b.assign, m_b, r_b, b.kpm, 0.7, causal, rate, gb);
            CHECK(got.dtype() == dt);
            check_close(got, want, tol);
            // Both drew the same counters from their generators.
            CHECK(ga.offset() == gb.offset());
            Generator gw(6);
            Tensor w = randn(got.shape(), dt, gw);
            sum(got * w).backward();
            sum(want * w).backward();
            check_close(a.q.grad(), b.q.grad(), tol);
            check_close(a.k.grad(), b.k.grad(), tol);
            check_close(a.v.grad(), b.v.grad(), tol);
            if (with_mass) {
              check_close(a.mass.grad(), b.mass.grad(), tol);
              check_close(a.rest.grad(), b.rest.grad(), tol);
            }
          }
}

TEST_CASE("cluster_topk_attention: queries without a cluster get 0, a cluster whose keys are all blocked its rest") {
  const TopkCase c = topk_case(kFloat64, true);
  NoGradGuard ng;
  Tensor out = cluster_topk_attention(c.q, c.k, c.v, c.top, c.assign, c.mass, c.rest, c.kpm);
  const std::vector<double> o = values(out), rest = values(c.rest);
  const std::vector<int64_t> as = c.assign.to_vector<int64_t>();
  for (int64_t g = 0; g < 4; ++g)
    for (int64_t i = 0; i < 7; ++i) {
      const int64_t a = as[size_t(g * 7 + i)];
      for (int64_t j = 0; j < 3; ++j) {
        const double x = o[size_t((g * 7 + i) * 3 + j)];
        if (a < 0) CHECK(x == 0.0);
        if (g >= 2 && a == 2) CHECK(x == rest[size_t((g * 4 + 2) * 3 + j)]);  // batch 1, cluster 2
      }
    }
}

TEST_CASE("cluster_topk_attention refuses bad input with messages naming the problem") {
  const TopkCase c = topk_case(kFloat64, true);
  const char* op = "[cluster_topk_attention]";
  auto call = [&](const Tensor& q, const Tensor& top, const Tensor& assign, const Tensor& mass, const Tensor& rest,
                  const Tensor& kpm, double rate = 0.0) {
    return cluster_topk_attention(q, c.k, c.v, top, assign, mass, rest, kpm, 1.0, false, rate);
  };
  CHECK_THROWS_MSG(call(reshape(c.q.detach(), {4, 7, 5}), c.top, c.assign, c.mass, c.rest, c.kpm), ShapeError, op,
                   "expected q (B, H, Nq, D)", "got q float64 (4,7,5)");
  CHECK_THROWS_MSG(call(c.q, c.top, reshape(c.assign, {2, 14}), c.mass, c.rest, c.kpm), ShapeError, op,
                   "assignment (B, H, Nq)");
  CHECK_THROWS_MSG(call(c.q, c.top, c.assign, Tensor::zeros({2, 2, 3}, kFloat64), c.rest, c.kpm), ShapeError, op,
                   "mass must be (B, H, C) = (2, 2, 4)");
  CHECK_THROWS_MSG(call(c.q, c.top, c.assign, c.mass, Tensor::zeros({2, 2, 4, 2}, kFloat64), c.kpm), ShapeError, op,
                   "rest must be (B, H, C, Dv) = (2, 2, 4, 3)");
  CHECK_THROWS_MSG(call(c.q, c.top, c.assign, c.mass, c.rest, Tensor::zeros({2, 8}, kBool)), ShapeError, op,
                   "key_padding_mask must be bool (B, Nk) = (2, 9)");
  CHECK_THROWS_MSG(call(c.q, c.top, c.assign, to(c.mass.detach(), kFloat32), c.rest, c.kpm), DTypeError, op,
                   "must share one dtype");
  CHECK_THROWS_MSG(call(c.q, to(c.top, kFloat64), c.assign, c.mass, c.rest, c.kpm), DTypeError, op,
                   "top and assignment must be int64");
  CHECK_THROWS_MSG(call(c.q, c.top + 9.0, c.assign, c.mass, c.rest, c.kpm), IndexError, op, "top key",
                   "out of range for 9 keys");
  CHECK_THROWS_MSG(call(c.q, c.top, c.assign + 1.0, c.mass, c.rest, c.kpm), IndexError, op, "cluster id 4",
                   "out of range [-1, 4)");
  CHECK_THROWS_MSG(call(c.q, c.top, c.assign, c.mass, c.rest, c.kpm, 1.0), ValueError, op,
                   "dropout must be in [0, 1)");
  CHECK_THROWS_MSG(cluster_topk_attention(c.q, c.k, c.v, c.top, c.assign, c.mass, c.rest, c.kpm, 0.0), ValueError,
                   op, "scale must be finite and > 0, got 0");
  CHECK_THROWS_MSG(call(c.q, c.top, c.assign, fake_cuda({2, 2, 4}, kFloat64), c.rest, c.kpm), DeviceError, op);
  CHECK_THROWS_MSG(cluster_topk_attention(c.q, c.k, c.v, Tensor(), c.assign), ValueError, op, "must be defined");
}

TEST_CASE("cluster_topk_attention and cluster_means under autocast: 16-bit inputs run in float32") {
  const TopkCase c = topk_case(kFloat32, true);
  NoGradGuard ng;
  const Tensor qb = to(c.q, kBFloat16), kb = to(c.k, kBFloat16), vb = to(c.v, kBFloat16);
  CHECK_THROWS_MSG(cluster_topk_attention(qb, kb, vb, c.top, c.assign), DTypeError, "[cluster_topk_attention]",
                   "float32 or float64");
  CHECK_THROWS_MSG(cluster_means(qb, c.assign, 4), DTypeError, "[cluster_means] x must be float32 or float64");
  AutocastGuard guard(kBFloat16);
  Tensor out = cluster_topk_attention(qb, kb, vb, c.top, c.assign, c.mass, c.rest, c.kpm);
  CHECK(out.dtype() == kFloat32);
  AutocastGuard off(std::nullopt);
  check_close(out, cluster_topk_attention(to(qb, kFloat32), to(kb, kFloat32), to(vb, kFloat32), c.top, c.assign,
                                          c.mass, c.rest, c.kpm),
              0.0);
  AutocastGuard on(kBFloat16);
  CHECK(cluster_means(qb, c.assign, 4).dtype() == kFloat32);
}

TEST_CASE("cluster_topk_attention: empty query and key sets, a NaN query row") {
  const TopkCase c = topk_case(kFloat64, true);
  // No query: an empty output and empty gradients, mass and rest's gradients 0.
  Tensor q0 = leaf64({2, 2, 0, 5}, 3), mass = leaf64({2, 2, 4}, 4), rest = leaf64({2, 2, 4, 3}, 5);
  Tensor out0 = cluster_topk_attention(q0, c.k, c.v, c.top, Tensor::zeros({2, 2, 0}, kInt64), mass, rest);
  CHECK(out0.shape() == Shape({2, 2, 0, 3}));
  sum(out0).backward();
  for (double x : values(mass.grad())) CHECK(x == 0.0);
  for (double x : values(rest.grad())) CHECK(x == 0.0);
  CHECK(c.k.grad().defined());
  for (double x : values(c.k.grad())) CHECK(x == 0.0);
  // No top key (kk = 0): every clustered query gets its cluster's rest.
  NoGradGuard ng;
  Tensor out_rest = cluster_topk_attention(c.q, c.k, c.v, Tensor::zeros({2, 2, 4, 0}, kInt64), c.assign, c.mass,
                                           c.rest);
  check_close(out_rest, cluster_topk_reference(c.q, c.k, c.v, Tensor::zeros({2, 2, 4, 0}, kInt64), c.assign, c.mass,
                                               c.rest, Tensor(), 1.0, false, 0.0, default_generator()),
              1e-15);
  // A NaN in a query makes its row NaN (not a finite rest), as a dense softmax would.
  std::vector<double> qv = values(c.q);
  qv[0] = NAN;  // query 0 of head (0, 0), cluster 0
  Tensor out_nan = cluster_topk_attention(t64(qv, {2, 2, 7, 5}), c.k, c.v, c.top, c.assign, c.mass, c.rest, c.kpm);
  for (double x : values(slice(slice(slice(out_nan, 0, 0, 1), 1, 0, 1), 2, 0, 1))) CHECK(std::isnan(x));
  CHECK(std::isfinite(values(out_nan)[3]));  // query 1 is not touched
  // cluster_means of no row: every centroid 0 (written, not left as allocated).
  Tensor none = cluster_means(Tensor::full({2, 0, 3}, 7.0, kFloat64), Tensor::zeros({2, 0}, kInt64), 3);
  CHECK(none.shape() == Shape({2, 3, 3}));
  for (double x : values(none)) CHECK(x == 0.0);
}

TEST_CASE(
    "cluster_topk_attention: a NaN row with dropout gives NaN to the keys it kept and nothing to those it dropped") {
  const std::vector<double> dv = nan_row_dropout_dv(Device::cpu());
  const TopkCase c = topk_case(kFloat64, false);
  // Row 0's keys (head (0, 0), cluster 0): those its dropout kept are NaN in every column; the rest finite.
  const std::vector<int64_t> top = c.top.to_vector<int64_t>();
  const int64_t kk = c.top.shape()[3], Dv = c.v.shape()[3];
  std::set<int64_t> listed(top.begin(), top.begin() + kk);
  int64_t nan_keys = 0;
  for (int64_t key = 0; key < c.v.shape()[2]; ++key) {
    INFO("key ", key);
    const bool nan = std::isnan(dv[size_t(key * Dv)]);
    for (int64_t j = 1; j < Dv; ++j) CHECK(std::isnan(dv[size_t(key * Dv + j)]) == nan);
    if (nan) CHECK(listed.count(key) == 1);
    nan_keys += nan;
  }
  CHECK(nan_keys > 0);
  CHECK(nan_keys < kk);  // (Generator 9 at rate 0.5 drops some of the row's keys and keeps some)
  for (size_t i = size_t(c.v.shape()[2] * Dv); i < dv.size(); ++i) CHECK(std::isfinite(dv[i]));  // other heads
}

PARITY_CASE(cluster_topk_attention) {
  for (DType dt : {kFloat64, kFloat32})
    for (bool causal : {false, true})
      for (double rate : {0.0, 0.3}) {
        CAPTURE(dt);
        CAPTURE(causal);
        CAPTURE(rate);
        const TopkCase c = topk_case(dt, true);
        ParityOptions opt;
        if (dt == kFloat32) opt.atol = 1e-5, opt.rtol = 1e-4;
        else opt.atol = 1e-12, opt.rtol = 1e-12;
        check_parity("cluster_topk_attention",
                     [&](const std::vector<Tensor>& x) {
                       const Device d = x[0].device();
                       Generator g(9);  // the same counters on both devices
                       return cluster_topk_attention(x[0], x[1], x[2], c.top.to(d), c.assign.to(d), x[3], x[4],
                                                     c.kpm.to(d), 0.7, causal, rate, g);
                     },
                     {c.q, c.k, c.v, c.mass, c.rest}, opt);
      }
  // The other arms of the kernels: no padding mask; no mass and rest (the causal layer's form); only rest
  // requiring a gradient (dmass not asked for); no query; a NaN query row.
  ParityOptions opt64;
  opt64.atol = 1e-12, opt64.rtol = 1e-12;
  const TopkCase c = topk_case(kFloat64, false);
  check_parity("cluster_topk_attention",
               [&](const std::vector<Tensor>& x) {
                 const Device d = x[0].device();
                 return cluster_topk_attention(x[0], x[1], x[2], c.top.to(d), c.assign.to(d), Tensor(), Tensor(),
                                               Tensor(), 0.7, true);
               },
               {c.q, c.k, c.v}, opt64);
  check_parity("cluster_topk_attention",
               [&](const std::vector<Tensor>& x) {
                 const Device d = x[0].device();
                 return cluster_topk_attention(x[0], x[1], x[2], c.top.to(d), c.assign.to(d), c.mass.detach().to(d),
                                               x[3]);
               },
               {c.q, c.k, c.v, c.rest}, opt64);
  check_parity("cluster_topk_attention",
               [&](const std::vector<Tensor>& x) {
                 const Device d = x[0].device();
                 return cluster_topk_attention(x[0], x[1], x[2], c.top.to(d), Tensor::zeros({2, 2, 0}, kInt64, d),
                                               x[3], x[4]);
               },
               {leaf64({2, 2, 0, 5}, 3), c.k, c.v, c.mass, c.rest}, opt64);
  std::vector<double> qv = values(c.q);
  qv[0] = NAN;
  ParityOptions forward_only = opt64;
  forward_only.backward = false;
  check_parity("cluster_topk_attention",
               [&](const std::vector<Tensor>& x) {
                 const Device d = x[0].device();
                 return cluster_topk_attention(x[0], x[1], x[2], c.top.to(d), c.assign.to(d), x[3], x[4]);
               },
               {t64(qv, {2, 2, 7, 5}), c.k, c.v, c.mass, c.rest}, forward_only);
  // The NaN row with dropout: the same NaN keys in dv on both devices (nan_row_dropout_dv).
  const std::vector<double> dv_cpu = nan_row_dropout_dv(Device::cpu()), dv_gpu = nan_row_dropout_dv(Device::cuda(0));
  REQUIRE(dv_cpu.size() == dv_gpu.size());
  for (size_t i = 0; i < dv_cpu.size(); ++i) {
    INFO(i);
    CHECK(std::isnan(dv_cpu[i]) == std::isnan(dv_gpu[i]));
    if (!std::isnan(dv_cpu[i])) CHECK(std::fabs(dv_cpu[i] - dv_gpu[i]) <= 1e-12 * (1 + std::fabs(dv_cpu[i])));
  }
}

}  // TEST_SUITE
