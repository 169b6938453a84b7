// CUDA parity of the bfloat16 / float16 paths against the CPU (the reference), forward and
// backward. Both devices compute in float32 and round once per stored value (docs/design-notes.md,
// "Low-precision parity rules"), so a result may differ by one unit in the last place of the
// storage type where CUDA's float32 math library and glibc round a float32 value differently
// near a low-precision tie: rtol = 2u forward (u = 2^-8 bfloat16, 2^-11 float16). matmul sums
// in another order on tensor cores (R2) and backward passes chain roundings (R3): 8u.
// Skipped without a GPU. The block_attention and neural clustering cases (2026-11-27) were
// written without one and await their first GPU run; the others passed on an H200.
#include <cmath>
#include <functional>
#include <tuple>

#include "autograd/autocast.h"
#include "autograd/ops/attention.h"
#include "cuda/cuda_test_util.h"
#include "nn/attention/neural_clustering.h"

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

// Issue 26: under autocast on CUDA, 16-bit q, k, v (head size 64 or 128) take the tensor-core
// forward, and with head size 64 the tensor-core backward. Reference: the float32 kernel on float32 copies of the same 16-bit values (what
// autocast ran before), on the same device. The tensor-core kernel rounds P once to the
// 16-bit type before P V (FlashAttention's rounding), so out may differ by a few units of
// that type relative to its largest value; the backward rounds P, dS and dO the same way.
namespace {

// max |x| over the finite entries; a NaN anywhere gives NaN (which fails every bound).
double max_abs(const Tensor& t) {
  double m = 0;
  for (double x : values(t.cpu())) {
    if (std::isnan(x)) return x;
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  }
  return m;
}

// max |a - b| over max |b|, with infinities required to agree; a NaN in either gives NaN.
double rel_err(const Tensor& got, const Tensor& want) {
  const std::vector<double> a = values(cf::to(got, kFloat64).cpu()), b = values(cf::to(want, kFloat64).cpu());
  REQUIRE(a.size() == b.size());
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::nan("");
    if (std::isinf(b[i]) || std::isinf(a[i])) {
      CHECK(a[i] == b[i]);
      continue;
    }
    e = std::max(e, std::fabs(a[i] - b[i]));
  }
  return e / std::max(max_abs(want), 1e-30);
}

}  // namespace

TEST_CASE("cuda: flash_attention under autocast runs 16-bit q, k, v on tensor cores, within 16-bit rounding of float32") {
  if (!cuda_visible()) return;
  struct Case {
    int64_t nq, nk, d;
    bool causal, padded;
  };
  // Cross attention with Nq > Nk and causal: the first Nq - Nk rows see no key (out 0, lse -inf).
  // Head size 64 takes the tensor-core backward too, 128 the float32 one; several query and key tiles
  // (64 each) with causal masks of both signs of Nk - Nq.
  const std::vector<Case> cases = {{100, 100, 64, false, false}, {130, 77, 64, true, true}, {64, 200, 128, true, false},
                                   {70, 70, 128, false, true},   {1, 5, 64, false, false},  {300, 300, 64, true, false},
                                   {90, 260, 64, true, true}};
  for (DType dt : {kBFloat16, kFloat16}) {
    for (const Case& c : cases) {
      INFO(dtype_name(dt), " Nq ", c.nq, " Nk ", c.nk, " D ", c.d, c.causal ? " causal" : "", c.padded ? " padded" : "");
      const int64_t B = 2, H = 3;
      Tensor q = cuda0(low_leaf(dt, {B, H, c.nq, c.d}, 31, -2, 2, false)).set_requires_grad(true);
      Tensor k = cuda0(low_leaf(dt, {B, H, c.nk, c.d}, 32, -2, 2, false)).set_requires_grad(true);
      Tensor v = cuda0(low_leaf(dt, {B, H, c.nk, c.d}, 33, -2, 2, false)).set_requires_grad(true);
      Tensor pad;
      if (c.padded) {
        std::vector<bool> pv(size_t(B * c.nk), false);
        for (int64_t j = c.nk / 2; j < c.nk; ++j) pv[size_t(c.nk + j)] = true;  // row 1: the second half
        pad = cuda0(Tensor::from_vector(pv, {B, c.nk}));
      }
      Tensor q32 = cf::to(q.detach(), kFloat32).set_requires_grad(true);
      Tensor k32 = cf::to(k.detach(), kFloat32).set_requires_grad(true);
      Tensor v32 = cf::to(v.detach(), kFloat32).set_requires_grad(true);
      const Tensor w = cuda0(low_leaf(kFloat32, {B, H, c.nq, c.d}, 34, -1, 1, false));
      Tensor want = flash_attention(q32, k32, v32, pad, 0.0, c.causal);
      sum(want * w).backward();
      Tensor got;
      {
        AutocastGuard guard(dt);
        got = flash_attention(q, k, v, pad, 0.0, c.causal);
      }
      CHECK(got.dtype() == kFloat32);
      sum(got * w).backward();
      const double u = u_of(dt);
      const double e_out = rel_err(got, want);
      CHECK_MESSAGE(e_out <= 4 * u, "out: ", e_out, " of max |out|, bound ", 4 * u);
      REQUIRE(q.grad().defined());
      CHECK(q.grad().dtype() == dt);
      for (auto [name, g16, g32] : {std::tuple<const char*, Tensor, Tensor>{"dq", q.grad(), q32.grad()},
                                    {"dk", k.grad(), k32.grad()},
                                    {"dv", v.grad(), v32.grad()}}) {
        const double e = rel_err(cf::to(g16, kFloat32), g32);
        CHECK_MESSAGE(e <= 8 * u, name, ": ", e, " of max |grad|, bound ", 8 * u);
      }
      if (c.nq > c.nk && c.causal) {  // rows that see no key: exactly 0
        CHECK(max_abs(narrow(got, 2, 0, c.nq - c.nk)) == 0.0);
      }
    }
  }
  // Head sizes the kernel does not take (and float32 inputs) keep the float32 route: same bits.
  Tensor q = cuda0(low_leaf(kBFloat16, {1, 2, 40, 32}, 41, -2, 2, false));
  Tensor want = flash_attention(cf::to(q, kFloat32), cf::to(q, kFloat32), cf::to(q, kFloat32));
  AutocastGuard guard(kBFloat16);
  check_close(flash_attention(q, q, q).cpu(), want.cpu(), 0);
}

TEST_CASE("cuda: flash_attention_with_lse under autocast: lse's gradient through the tensor-core backward") {
  if (!cuda_visible()) return;
  // Head size 64: the 16-bit backward, which takes the lse gradient in D_i = dO_i . O_i - dlse_i.
  const int64_t B = 2, H = 3, Nq = 100, Nk = 130, D = 64;
  for (DType dt : {kBFloat16, kFloat16}) {
    INFO(dtype_name(dt));
    Tensor q = cuda0(low_leaf(dt, {B, H, Nq, D}, 51, -2, 2, false)).set_requires_grad(true);
    Tensor k = cuda0(low_leaf(dt, {B, H, Nk, D}, 52, -2, 2, false)).set_requires_grad(true);
    Tensor v = cuda0(low_leaf(dt, {B, H, Nk, D}, 53, -2, 2, false)).set_requires_grad(true);
    std::vector<bool> pv(size_t(B * Nk), false);
    for (int64_t j = 90; j < Nk; ++j) pv[size_t(Nk + j)] = true;
    const Tensor pad = cuda0(Tensor::from_vector(pv, {B, Nk}));
    Tensor q32 = cf::to(q.detach(), kFloat32).set_requires_grad(true);
    Tensor k32 = cf::to(k.detach(), kFloat32).set_requires_grad(true);
    Tensor v32 = cf::to(v.detach(), kFloat32).set_requires_grad(true);
    const Tensor w = cuda0(low_leaf(kFloat32, {B, H, Nq, D}, 54, -1, 1, false));
    const Tensor u = cuda0(low_leaf(kFloat32, {B, H, Nq}, 55, -1, 1, false));
    FlashAttentionResult want = flash_attention_with_lse(q32, k32, v32, pad, 0.0, true);
    sum(want.out * w + unsqueeze(want.lse * u, 3)).backward();
    FlashAttentionResult got;
    {
      AutocastGuard guard(dt);
      got = flash_attention_with_lse(q, k, v, pad, 0.0, true);
    }
    sum(got.out * w + unsqueeze(got.lse * u, 3)).backward();
    const double un = u_of(dt);
    CHECK(rel_err(got.lse, want.lse) <= 4 * un);
    for (auto [name, g16, g32] : {std::tuple<const char*, Tensor, Tensor>{"dq", q.grad(), q32.grad()},
                                  {"dk", k.grad(), k32.grad()},
                                  {"dv", v.grad(), v32.grad()}}) {
      const double e = rel_err(cf::to(g16, kFloat32), g32);
      CHECK_MESSAGE(e <= 8 * un, name, ": ", e, " of max |grad|, bound ", 8 * un);
    }
  }
}

namespace {

// True at the tokens that no slot of members (B, Hm, C, w) holds, as (B, H, N, 1).
Tensor holes_of(const Tensor& members, int64_t H, int64_t N) {
  const int64_t B = members.shape()[0], Hm = members.shape()[1], slots = members.shape()[2] * members.shape()[3];
  const std::vector<int64_t> m = members.to_vector<int64_t>();
  std::vector<bool> hole(size_t(B * H * N), true);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < slots; ++s) {
        const int64_t p = m[size_t((b * Hm + (Hm == 1 ? 0 : h)) * slots + s)];
        if (p >= 0) hole[size_t((b * H + h) * N + p)] = false;
      }
  return Tensor::from_vector(hole, {B, H, N, 1});
}

}  // namespace

// Issue 26: block_attention (the gathered block kernel of neural clustering, LSH, Cluster-Former,
// sliding windows) under autocast on CUDA takes 16-bit q, k, v of head size 64 on the same
// tensor-core kernels, rows gathered through the member table. Reference and bounds as above:
// the float32 kernel on float32 copies of the same values. Cases: a shared table (Hm = 1) with
// holes and padding, blocks of exactly one 64-row tile, blocks that span two tiles (w = 100)
// with look-ahead, small blocks (w = 16), causal by position with the self mask; the loss reaches
// both out and lse.
TEST_CASE("cuda: block_attention under autocast runs 16-bit q, k, v on tensor cores, within 16-bit rounding of float32") {
  if (!cuda_visible()) return;
  struct Case {
    int64_t H, Hm, N, w, holes, padded, back, ahead;
    bool causal, self_mask;
  };
  const std::vector<Case> cases = {{3, 1, 100, 40, 7, 9, 1, 0, false, false},
                                   {2, 2, 256, 64, 0, 0, 1, 1, true, true},
                                   {2, 1, 300, 100, 10, 20, 2, 1, false, false},
                                   {1, 1, 130, 16, 2, 0, 0, 0, true, false},
                                   {2, 2, 70, 16, 0, 5, 3, 0, true, true}};
  const int64_t B = 2, D = 64;
  uint32_t mseed = 50;
  for (DType dt : {kBFloat16, kFloat16}) {
    for (const Case& c : cases) {
      INFO(dtype_name(dt), " N ", c.N, " w ", c.w, " Hm ", c.Hm, " back ", c.back, " ahead ", c.ahead,
           c.causal ? " causal" : "", c.self_mask ? " self-mask" : "");
      const Tensor members = cuda0(random_members(B, c.Hm, c.N, c.w, c.holes, mseed++));
      const Tensor pad = c.padded ? cuda0(padding_mask(B, c.N, c.padded)) : Tensor();
      BlockAttentionOptions o;
      o.look_back = c.back;
      o.look_ahead = c.ahead;
      o.causal = c.causal;
      o.self_mask = c.self_mask;
      Tensor q = cuda0(low_leaf(dt, {B, c.H, c.N, D}, 61, -2, 2, false)).set_requires_grad(true);
      Tensor k = cuda0(low_leaf(dt, {B, c.H, c.N, D}, 62, -2, 2, false)).set_requires_grad(true);
      Tensor v = cuda0(low_leaf(dt, {B, c.H, c.N, D}, 63, -2, 2, false)).set_requires_grad(true);
      Tensor q32 = cf::to(q.detach(), kFloat32).set_requires_grad(true);
      Tensor k32 = cf::to(k.detach(), kFloat32).set_requires_grad(true);
      Tensor v32 = cf::to(v.detach(), kFloat32).set_requires_grad(true);
      const Tensor w = cuda0(low_leaf(kFloat32, {B, c.H, c.N, D}, 64, -1, 1, false));
      const Tensor wl = cuda0(low_leaf(kFloat32, {B, c.H, c.N}, 65, -1, 1, false));
      auto loss = [&](const BlockAttentionResult& r) {
        return sum(r.out * w) + sum(masked_fill(r.lse, eq(r.lse, -INFINITY), 0.0) * wl);
      };
      BlockAttentionResult want = block_attention(q32, k32, v32, members, pad, o);
      loss(want).backward();
      BlockAttentionResult got;
      {
        AutocastGuard guard(dt);
        got = block_attention(q, k, v, members, pad, o);
      }
      CHECK(got.out.dtype() == kFloat32);
      CHECK(got.lse.dtype() == kFloat32);
      loss(got).backward();
      const double u = u_of(dt);
      const double e_out = rel_err(got.out, want.out);
      CHECK_MESSAGE(e_out <= 4 * u, "out: ", e_out, " of max |out|, bound ", 4 * u);
      CHECK_MESSAGE(e_out > 0, "the float32 route ran (it gives the same bits): the tensor-core arm was not taken");
      // lse has no 16-bit rounding on its path (S and the row sums are float32): an absolute bound,
      // over the rows that saw a key other than themselves (lse -inf, or self_score alone, -1e5).
      const Tensor lone = ge(abs(want.lse), 1e4);
      check_close(cf::to(eq(got.lse, -INFINITY), kFloat32).cpu(), cf::to(eq(want.lse, -INFINITY), kFloat32).cpu(),
                  0);
      const double e_lse = max_abs(masked_fill(sub(got.lse, want.lse), lone, 0.0));
      CHECK_MESSAGE(e_lse <= 1e-4, "lse: max |difference| ", e_lse);
      REQUIRE(q.grad().defined());
      CHECK(q.grad().dtype() == dt);
      for (auto [name, g16, g32] : {std::tuple<const char*, Tensor, Tensor>{"dq", q.grad(), q32.grad()},
                                    {"dk", k.grad(), k32.grad()},
                                    {"dv", v.grad(), v32.grad()}}) {
        const double e = rel_err(cf::to(g16, kFloat32), g32);
        CHECK_MESSAGE(e <= 8 * u, name, ": ", e, " of max |grad|, bound ", 8 * u);
      }
      // Tokens in no slot: out 0 and no gradient, as the float32 kernel gives.
      const Tensor kept = cuda0(logical_not(holes_of(members.cpu(), c.H, c.N)));
      CHECK(max_abs(masked_fill(got.out, kept, 0.0)) == 0.0);
      for (const Tensor& g16 : {q.grad(), k.grad(), v.grad()})
        CHECK(max_abs(masked_fill(cf::to(g16, kFloat32), kept, 0.0)) == 0.0);
    }
  }
  // Head sizes the kernel does not take keep the float32 route: the same bits.
  const Tensor members = cuda0(random_members(1, 1, 40, 8, 0, 3));
  Tensor q = cuda0(low_leaf(kBFloat16, {1, 2, 40, 32}, 66, -2, 2, false));
  Tensor want = block_attention(cf::to(q, kFloat32), cf::to(q, kFloat32), cf::to(q, kFloat32), members).out;
  AutocastGuard guard(kBFloat16);
  check_close(block_attention(q, q, q, members).out.cpu(), want.cpu(), 0);
}

// Neural clustering under autocast on CUDA: the clustering in float32 on the widened layer input
// (the same clusters as the float32 layer), the attention on tensor cores with the 16-bit q, k, v.
TEST_CASE("cuda: neural clustering under autocast attends on tensor cores, clusters in float32") {
  if (!cuda_visible()) return;
  const int64_t B = 2, H = 2, N = 96, D = 64;
  nn::NeuralClusteringOptions opt;
  opt.clusters = 4;
  Generator gen(5);
  nn::NeuralClusteringAttention att(H * D, opt, gen);
  att.to(Device::cuda(0));
  for (DType dt : {kBFloat16, kFloat16}) {
    INFO(dtype_name(dt));
    nn::AttentionArgs a;
    a.q = cuda0(low_leaf(dt, {B, H, N, D}, 71, -2, 2, false));
    a.k = cuda0(low_leaf(dt, {B, H, N, D}, 72, -2, 2, false));
    a.v = cuda0(low_leaf(dt, {B, H, N, D}, 73, -2, 2, false));
    a.query_input = cuda0(low_leaf(kFloat32, {B, N, H * D}, 74, -1, 1, false));
    nn::AttentionArgs r = a;
    r.q = cf::to(a.q, kFloat32);
    r.k = cf::to(a.k, kFloat32);
    r.v = cf::to(a.v, kFloat32);
    const Tensor want = att.forward(r);
    Tensor got;
    {
      AutocastGuard guard(dt);
      got = att.forward(a);
    }
    CHECK(got.dtype() == kFloat32);
    const double e = rel_err(got, want);
    CHECK_MESSAGE(e <= 4 * u_of(dt), "out: ", e, " of max |out|, bound ", 4 * u_of(dt));
    CHECK_MESSAGE(e > 0, "the float32 route ran (it gives the same bits): the tensor-core arm was not taken");
  }
}
