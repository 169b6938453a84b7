// The fused attention ops (autograd/ops/attention.h) against dense references
// written with primitive ops: forward and gradients, every mask, causal with
// Nq != Nk, sizes that are not multiples of the tiles (128 query rows, 512 keys
// on the CPU; 32 x 32 on CUDA), fully masked rows; float64 gradchecks; bad input.
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>

#include "autograd/ops/attention.h"
#include "core/allocator.h"
#include "core/cuda.h"
#include "kernels/attention/attention.h"
#include "nn/attention/routing.h"
#include "nn/attention/sparse.h"
#include "test_util.h"
#include "cuda/cuda_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

// softmax(scale q k^T, blocked -> -inf) v with the (Nq, Nk) scores materialised.
// With drop > 0, dropout(weights, drop, true, *gen) on the (B, H, Nq, Nk) weights.
Tensor dense_reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm, double scale,
                       bool causal, double drop = 0.0, Generator* gen = nullptr) {
  const int64_t B = q.shape()[0], Nq = q.shape()[2], Nk = k.shape()[2];
  Tensor s = matmul(q * scale, transpose(k, -2, -1));
  Tensor blocked;
  if (kpm.defined()) blocked = reshape(kpm, {B, 1, 1, Nk});
  if (causal) {
    Tensor keys = reshape(Tensor::arange(Nk, kInt64), {1, Nk});
    Tensor rows = reshape(Tensor::arange(Nq, kInt64), {Nq, 1}) + double(Nk - Nq);
    Tensor c = reshape(gt(keys, rows), {1, 1, Nq, Nk});
    blocked = blocked.defined() ? logical_or(blocked, c) : c;
  }
  if (blocked.defined()) s = masked_fill(s, blocked, -INFINITY);
  Tensor weights = softmax(s, -1);
  if (drop > 0) weights = dropout(weights, drop, true, *gen);
  return matmul(weights, v);
}

Tensor padding(int64_t B, int64_t N, const std::vector<std::pair<int64_t, int64_t>>& padded) {
  std::vector<bool> m(size_t(B * N), false);
  for (auto [b, j] : padded) m[size_t(b * N + j)] = true;
  return Tensor::from_vector(m, {B, N});
}

// Routed attention's lists (autograd/ops/attention.h): (B', H', C, w) lists, each w
// distinct positions drawn from [0, N) (w <= N; lists drawn independently, so a position
// may sit in several lists, or in none), each slot empty (-1) with probability `empty`.
inline Tensor random_lists(int64_t Bl, int64_t Hl, int64_t C, int64_t w, int64_t N, double empty, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int64_t> perm(static_cast<size_t>(N)), m;
  for (int64_t l = 0; l < Bl * Hl * C; ++l) {
    for (int64_t i = 0; i < N; ++i) perm[size_t(i)] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t s = 0; s < w; ++s) m.push_back(u(rng) < empty ? -1 : perm[size_t(s)]);
  }
  return Tensor::from_vector(m, {Bl, Hl, C, w});
}

// The fused op and the reference agree on the output and on the gradients of a
// random projection of it.
// With drop > 0 both draw their dropout from generators of one seed: the same weights must drop.
void check_flash(int64_t B, int64_t H, int64_t Nq, int64_t Nk, int64_t Dk, int64_t Dv, const Tensor& kpm,
                 bool causal, double scale, DType dt, double tol, double drop = 0.0) {
  CAPTURE(Nq);
  CAPTURE(Nk);
  CAPTURE(causal);
  CAPTURE(scale);
  CAPTURE(drop);
  auto leaf = [dt](const Shape& s, uint64_t seed) {
    Tensor t = to(leaf64(s, seed, -2.0, 2.0).detach(), dt);
    t.set_requires_grad(true);
    return t;
  };
  Tensor q = leaf({B, H, Nq, Dk}, 1), k = leaf({B, H, Nk, Dk}, 2), v = leaf({B, H, Nk, Dv}, 3);
  Tensor w = to(leaf64({B, H, Nq, Dv}, 4).detach(), dt);
  const double used = scale > 0 ? scale : 1.0 / std::sqrt(double(Dk));
  Generator gen_fast(91), gen_ref(91);
  gen_fast.reserve(12345);  // mid-stream: the kernel must start at the reserved counter
  gen_ref.reserve(12345);
  Tensor fast = flash_attention(q, k, v, kpm, scale, causal, drop, gen_fast);
  sum(fast * w).backward();
  std::vector<Tensor> g = {q.grad(), k.grad(), v.grad()};
  q.zero_grad();
  k.zero_grad();
  v.zero_grad();
  Tensor ref = dense_reference(q, k, v, kpm, used, causal, drop, &gen_ref);
  CHECK(gen_fast.offset() == gen_ref.offset());  // the same counters reserved
  sum(ref * w).backward();
  check_close(fast, ref, tol);
  check_close(g[0], q.grad(), tol);
  check_close(g[1], k.grad(), tol);
  check_close(g[2], v.grad(), tol);
}

// The gradchecks' loss through both outputs of flash_attention_with_lse (every row
// sees a key there, so lse is finite). With dropout: a fresh generator per evaluation,
// so every evaluation drops the same weights.
Tensor out_and_lse_loss(const std::vector<Tensor>& x, const Tensor& kpm, bool causal, double dropout = 0.0) {
  Generator g(19);
  FlashAttentionResult r = flash_attention_with_lse(x[0], x[1], x[2], kpm, 0.0, causal, dropout, g);
  return sum(r.out * r.out) + sum(r.lse * r.lse);
}

// flash_attention's GEMM path (kernels/attention/attention_gemm.cpp, CUDA's float32 and float64 path) against
// the fused kernels, called directly: chunks of query rows with a remainder, one chunk (auto), masks, causal
// with Nq > Nk (queries with no key), a batch with every key padded, the lse gradient, no keys at all.
struct KernelCase {
  int64_t B, H, Nq, Nk, Dk, Dv;
  bool pad, causal;
  int64_t chunk;
  DType dt;
  int64_t splits = 0;  // key parts of out = P v and dq = dS k; 0: the automatic rule (1 at these sizes)
};
// Rows of more than 256 keys (CUDA's row kernel strides over them), more than 65535 rows (its grid-stride
// loop), float32 causal chunks, causal chunks that see no key before one that sees them all.
const std::vector<KernelCase> kKernelCases = {
    {2, 2, 7, 7, 3, 4, true, false, 3, kFloat64},    {2, 2, 7, 7, 3, 4, true, true, 3, kFloat64},
    {1, 2, 11, 5, 4, 2, false, true, 4, kFloat64},   {2, 1, 9, 13, 5, 3, true, true, 0, kFloat64},
    {2, 3, 33, 40, 8, 8, true, false, 10, kFloat32}, {2, 1, 70, 45, 64, 64, true, true, 0, kFloat32},
    {2, 2, 20, 600, 16, 8, true, true, 7, kFloat32}, {1, 1, 70000, 3, 1, 1, false, false, 0, kFloat64},
    {1, 2, 9, 1, 3, 2, false, true, 4, kFloat64},    {1, 1, 5, 0, 3, 2, false, false, 2, kFloat64},
    // Keys split: a remainder, causal (chunks see 587-600 keys); a remainder, not causal; parts that divide the
    // keys, one chunk; causal chunks narrower than the parts (2 keys, then 5) and a single key (parts clamped).
    {2, 2, 20, 600, 16, 8, true, true, 7, kFloat32, 7}, {2, 3, 33, 40, 8, 8, true, false, 10, kFloat64, 3},
    {1, 2, 9, 16, 4, 5, false, false, 0, kFloat64, 4},  {1, 2, 11, 5, 4, 2, false, true, 4, kFloat64, 4},
    {1, 2, 9, 1, 3, 2, false, true, 4, kFloat64, 3}};

enum class FlashPath { kFusedCpu, kGemm, kFusedCuda, kMmaCuda };

// A loss that reads the lse of a row with nothing allowed (exp(-lse), say) gives that row dlse = -inf. The
// cases put it on every entry of batch 1 picked by `at` (the batch with every key padded), so every path must
// keep dS = P (dP - D) at 0 there (kernels/attention/softmax_grad.h) instead of 0 * inf = NaN.
Tensor infinite_on_batch1(const Tensor& t, const std::function<bool(int64_t)>& at) {
  std::vector<double> x = values(t);
  const int64_t per = t.numel() / t.shape()[0];
  for (int64_t e = 0; e < per; ++e)
    if (at(e)) x[size_t(per + e)] = -std::numeric_limits<double>::infinity();
  return to(Tensor::from_vector(x, t.shape()), t.dtype()).to(t.device());
}

// out, lse, dq, dk, dv of one path, on the CPU. gemm runs on `device`. With drop > 0, attention dropout
// at that rate from counter 12345 of seed 77 (mid-stream: a path that ignored counter0 would fail).
std::vector<Tensor> run_flash_path(const KernelCase& c, FlashPath path, Device device, double drop = 0.0) {
  auto rnd = [&](const Shape& s, uint64_t seed) { return to(leaf64(s, seed, -2.0, 2.0).detach(), c.dt).to(device); };
  Tensor q = rnd({c.B, c.H, c.Nq, c.Dk}, 1), k = rnd({c.B, c.H, c.Nk, c.Dk}, 2), v = rnd({c.B, c.H, c.Nk, c.Dv}, 3),
         dout = rnd({c.B, c.H, c.Nq, c.Dv}, 4), dlse = rnd({c.B, c.H, c.Nq}, 5);
  Tensor kpm;
  if (c.pad) {
    dlse = infinite_on_batch1(dlse.to(Device::cpu()), [](int64_t) { return true; }).to(device);
    std::vector<std::pair<int64_t, int64_t>> padded = {{0, 1}};
    for (int64_t j = 0; j < c.Nk; ++j) padded.push_back({1, j});  // batch 1: every key padded
    kpm = padding(c.B, c.Nk, padded).to(device);
  }
  kernels::FlashAttentionParams p;
  p.scale = c.dt == kFloat32 ? 1.0 / std::sqrt(double(c.Dk)) : 0.7;  // float32: softmax rows far from one-hot
  p.causal = c.causal;
  if (drop > 0) {
    p.dropout = drop;
    p.dropout_seed = 77;
    p.dropout_counter0 = 12345;
  }
  std::vector<Tensor> t = {Tensor::empty({c.B, c.H, c.Nq, c.Dv}, c.dt, device),
                           Tensor::empty({c.B, c.H, c.Nq}, c.dt, device), Tensor::empty(q.shape(), c.dt, device),
                           Tensor::empty(k.shape(), c.dt, device), Tensor::empty(v.shape(), c.dt, device)};
  if (path == FlashPath::kGemm) {
    kernels::flash_attention_forward_gemm(q, k, v, kpm, p, t[0], t[1], c.chunk, c.splits);
    kernels::flash_attention_backward_gemm(q, k, v, kpm, p, t[0], t[1], dout, dlse, t[2], t[3], t[4], c.chunk,
                                           c.splits);
  } else if (path == FlashPath::kFusedCpu) {
    kernels::flash_attention_forward_cpu(q, k, v, kpm, p, t[0], t[1]);
    kernels::flash_attention_backward_cpu(q, k, v, kpm, p, t[0], t[1], dout, dlse, t[2], t[3], t[4]);
  } else if (path == FlashPath::kMmaCuda) {
    kernels::flash_attention_forward_mma_cuda(q, k, v, kpm, p, t[0], t[1]);
    kernels::flash_attention_backward_mma_cuda(q, k, v, kpm, p, t[0], t[1], dout, dlse, t[2], t[3], t[4]);
  } else {
#ifdef CF_WITH_CUDA
    kernels::flash_attention_forward_cuda(q, k, v, kpm, p, t[0], t[1]);
    kernels::flash_attention_backward_cuda(q, k, v, kpm, p, t[0], t[1], dout, dlse, t[2], t[3], t[4]);
#endif
  }
  for (Tensor& x : t) x = x.to(Device::cpu());
  return t;
}

// dq, dk, dv (got[2..4]) of batch 1, the batch with every key padded: exactly zero.
void check_zero_batch1(const std::vector<Tensor>& got) {
  for (size_t i = 2; i < 5; ++i) {
    CAPTURE(i);
    const std::vector<double> g = values(got[i]);
    const size_t per = g.size() / size_t(got[i].shape()[0]);
    for (size_t e = per; e < 2 * per; ++e) CHECK(g[e] == 0.0);
  }
}

// tol 0: the dtype's (below).
void check_same_paths(const KernelCase& c, const std::vector<Tensor>& want, const std::vector<Tensor>& got,
                      double tol = 0.0) {
  // float32: the paths round differently (q scaled before or after the product, BLAS tiles): scores of
  // up to about 4 sqrt(Dk) with errors of a few ulps of that move exp() by about 1e-5 relative.
  if (tol == 0.0) tol = c.dt == kFloat64 ? 1e-12 : 1e-4;
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    std::vector<double> a = values(want[i]), b = values(got[i]);
    REQUIRE(a.size() == b.size());
    for (size_t e = 0; e < a.size(); ++e) {
      if (std::isinf(a[e])) {
        CHECK(b[e] == a[e]);  // lse of a row with nothing allowed: -inf on both paths
      } else {
        CHECK(std::abs(a[e] - b[e]) <= tol * (1.0 + std::abs(a[e])));
      }
    }
  }
  if (c.pad) {  // the fully padded batch: zero outputs, lse -inf, zero gradients though its dlse is -inf
    std::vector<double> o = values(got[0]), l = values(got[1]);
    for (int64_t e = c.H * c.Nq * c.Dv; e < 2 * c.H * c.Nq * c.Dv; ++e) CHECK(o[size_t(e)] == 0.0);
    for (int64_t e = c.H * c.Nq; e < 2 * c.H * c.Nq; ++e) CHECK(std::isinf(l[size_t(e)]));
    check_zero_batch1(got);
  }
}

// block_attention's GEMM path (attention_gemm.cpp, CUDA's float32 and float64 path for large calls) against
// the fused kernels, called directly. Tables with empty slots anywhere and tokens in no slot; look back and
// ahead with the wrap-around (a chunk seeing every other), one chunk of everything, rounds over one q, k, v,
// a table shared over the heads, padding with one batch fully padded, causal, self-masking, the lse gradient
// (and none), chunks of blocks with a remainder, one block per chunk, and the automatic size.
struct BlockCase {
  int64_t B, H, N, Dk, Dv, C, w, look_back, look_ahead, rounds;
  bool shared, pad, causal, self_mask, dlse;
  int64_t chunk;
  DType dt;
};
const std::vector<BlockCase> kBlockCases = {
    {2, 2, 23, 3, 4, 4, 6, 1, 0, 1, false, true, false, false, true, 3, kFloat64},
    {2, 2, 23, 3, 4, 4, 6, 1, 1, 1, false, true, true, false, true, 1, kFloat64},
    {1, 2, 17, 4, 3, 5, 4, 2, 0, 3, false, false, true, true, true, 2, kFloat64},
    {2, 3, 20, 5, 2, 3, 8, 2, 0, 2, true, true, true, true, false, 0, kFloat64},
    {1, 1, 9, 3, 3, 1, 9, 0, 0, 1, false, false, true, false, true, 0, kFloat64},
    {1, 2, 30, 4, 4, 6, 5, 0, 0, 1, true, false, false, false, true, 4, kFloat64},
    {2, 2, 300, 64, 64, 10, 32, 2, 1, 1, false, true, true, false, true, 4, kFloat32},
    {1, 4, 200, 16, 8, 7, 30, 1, 0, 2, false, false, false, true, true, 3, kFloat32}};

// The table (B, Hm, C, w): N - holes distinct positions at random slots of each (b, hm), the rest empty.
Tensor scattered_members(int64_t B, int64_t Hm, int64_t N, int64_t C, int64_t w, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t kept = std::min(N - N / 7, C * w);  // about one token in seven in no slot
  std::vector<int64_t> m;
  for (int64_t bh = 0; bh < B * Hm; ++bh) {
    std::vector<int64_t> perm(static_cast<size_t>(N)), slots(static_cast<size_t>(C * w), -1);
    for (int64_t i = 0; i < N; ++i) perm[size_t(i)] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t s = 0; s < kept; ++s) slots[size_t(s)] = perm[size_t(s)];
    std::shuffle(slots.begin(), slots.end(), rng);
    m.insert(m.end(), slots.begin(), slots.end());
  }
  return Tensor::from_vector(m, {B, Hm, C, w});
}

enum class BlockPath { kFusedCpu, kGemm, kFusedCuda, kMmaCuda };

// out, lse, dq, dk, dv of one path, on the CPU; out and lse are views of one packed (B, Ho, N, Dv + 1) tensor
// (as the op hands them to the kernels), and so are dout and dlse. With drop > 0, attention dropout at that
// rate from counter 12345 of seed 77 (mid-stream). With backward_path, the backward runs on that path over the
// forward's out and lse (kAuto picks the two directions separately).
std::vector<Tensor> run_block_path(const BlockCase& c, BlockPath path, Device device, double drop = 0.0,
                                   std::optional<BlockPath> backward_path = std::nullopt) {
  auto rnd = [&](const Shape& s, uint64_t seed) { return to(leaf64(s, seed, -2.0, 2.0).detach(), c.dt).to(device); };
  const int64_t Ho = c.H * c.rounds;
  Tensor q = rnd({c.B, c.H, c.N, c.Dk}, 1), k = rnd({c.B, c.H, c.N, c.Dk}, 2), v = rnd({c.B, c.H, c.N, c.Dv}, 3),
         grad = rnd({c.B, Ho, c.N, c.Dv + 1}, 4);
  Tensor members = scattered_members(c.B, c.shared ? 1 : Ho, c.N, c.C, c.w, 11).to(device);
  Tensor kpm;
  if (c.pad && c.dlse)  // the lse column of every row of batch 1
    grad = infinite_on_batch1(grad.to(Device::cpu()), [&](int64_t e) { return e % (c.Dv + 1) == c.Dv; }).to(device);
  if (c.pad) {
    std::vector<std::pair<int64_t, int64_t>> padded = {{0, 1}, {0, c.N - 1}};
    for (int64_t j = 0; j < c.N; ++j) padded.push_back({1, j});  // batch 1: every key padded
    kpm = padding(c.B, c.N, padded).to(device);
  }
  kernels::BlockAttentionParams p;
  p.offsets = ops::block_window_offsets(c.C, c.look_back, c.look_ahead);
  p.scale = c.dt == kFloat32 ? 1.0 / std::sqrt(double(c.Dk)) : 0.7;
  p.causal = c.causal;
  p.self_mask = c.self_mask;
  p.rounds = c.rounds;
  if (drop > 0) {
    p.dropout = drop;
    p.dropout_seed = 77;
    p.dropout_counter0 = 12345;
  }
  const Tensor packed = Tensor::empty({c.B, Ho, c.N, c.Dv + 1}, c.dt, device);
  const int64_t E = c.Dv + 1;
  auto out_of = [&](const Tensor& t) {
    return make_view(t, {c.B, Ho, c.N, c.Dv}, {Ho * c.N * E, c.N * E, E, 1}, t.offset());
  };
  auto lse_of = [&](const Tensor& t) {
    return make_view(t, {c.B, Ho, c.N}, {Ho * c.N * E, c.N * E, E}, t.offset() + c.Dv);
  };
  const Tensor dout = out_of(grad), dlse = c.dlse ? lse_of(grad) : Tensor();
  std::vector<Tensor> t = {out_of(packed), lse_of(packed), Tensor::empty(q.shape(), c.dt, device),
                           Tensor::empty(k.shape(), c.dt, device), Tensor::empty(v.shape(), c.dt, device)};
  if (path == BlockPath::kGemm) {
    kernels::block_attention_forward_gemm(q, k, v, members, kpm, p, t[0], t[1], c.chunk);
  } else if (path == BlockPath::kFusedCpu) {
    kernels::block_attention_forward_cpu(q, k, v, members, kpm, p, t[0], t[1]);
  } else if (path == BlockPath::kMmaCuda) {
    kernels::block_attention_forward_mma_cuda(q, k, v, members, kpm, p, t[0], t[1]);
  } else {
#ifdef CF_WITH_CUDA
    kernels::block_attention_forward_cuda(q, k, v, members, kpm, p, t[0], t[1]);
#endif
  }
  const BlockPath back = backward_path.value_or(path);
  if (back == BlockPath::kGemm) {
    kernels::block_attention_backward_gemm(q, k, v, members, kpm, p, t[0], t[1], dout, dlse, t[2], t[3], t[4],
                                           c.chunk);
  } else if (back == BlockPath::kFusedCpu) {
    kernels::block_attention_backward_cpu(q, k, v, members, kpm, p, t[0], t[1], dout, dlse, t[2], t[3], t[4]);
  } else if (back == BlockPath::kMmaCuda) {
    kernels::block_attention_backward_mma_cuda(q, k, v, members, kpm, p, t[0], t[1], dout, dlse, t[2], t[3], t[4]);
  } else {
#ifdef CF_WITH_CUDA
    kernels::block_attention_backward_cuda(q, k, v, members, kpm, p, t[0], t[1], dout, dlse, t[2], t[3], t[4]);
#endif
  }
  for (Tensor& x : t) x = contiguous(x).to(Device::cpu());
  return t;
}

void check_same_block_paths(const BlockCase& c, const std::vector<Tensor>& want, const std::vector<Tensor>& got,
                            double tol = 0.0) {
  if (tol == 0.0) tol = c.dt == kFloat64 ? 1e-12 : 1e-4;  // float32: as check_same_paths
  int64_t no_key = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    std::vector<double> a = values(want[i]), b = values(got[i]);
    REQUIRE(a.size() == b.size());
    for (size_t e = 0; e < a.size(); ++e) {
      if (std::isinf(a[e])) {
        CHECK(b[e] == a[e]);  // lse of a token in no slot or with nothing allowed: -inf on both paths
        ++no_key;
      } else {
        CHECK(std::abs(a[e] - b[e]) <= tol * (1.0 + std::abs(a[e])));
      }
    }
  }
  CHECK(no_key > 0);  // every table leaves tokens in no slot
  if (c.pad) check_zero_batch1(got);  // every key of batch 1 padded (its dlse -inf where given)
}

}  // namespace

// Which (b, h, i) rows of a (B, H, N, Dv) output hold a NaN (any element), as 0/1 per row.
std::vector<int> nan_rows(const Tensor& out) {
  const std::vector<double> o = values(out);
  const size_t Dv = size_t(out.shape()[3]);
  std::vector<int> rows(o.size() / Dv, 0);
  for (size_t e = 0; e < o.size(); ++e)
    if (std::isnan(o[e])) rows[e / Dv] = 1;
  return rows;
}

// The paths a NaN-row check runs: each writes (out, lse) of (q, k, v) on q's device.
enum class NanPath { kFlashFusedCpu, kFlashGemm, kBlockOp, kBlockGemm, kFlashFusedCuda, kFlashMmaCuda, kBlockFusedCuda,
                     kBlockMmaCuda };

// A NaN score makes its attention row NaN (out and lse), as in the dense softmax, while a NaN in a padded key
// is masked out. Before: the fused CPU kernel took a row whose sum was NaN for one with nothing allowed and
// wrote zeros and lse -inf, so a NaN in one token's features vanished from full attention's output. One chunk
// per (b, h) holding the whole sequence gives block attention the same rows. Batch 1 has every key but key 0
// padded, so a NaN in key 0 sits beside -inf scores only (a row maximum of -inf).
void check_nan_rows(const std::vector<NanPath>& paths, Device dev, DType dt, int64_t D) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const int64_t B = 2, H = 2, N = 150;  // N spans several key tiles of the fused kernels
  auto with_nan = [&](const Tensor& t, std::vector<int64_t> at) {
    std::vector<double> x = values(t);
    const Shape& s = t.shape();
    x[size_t(((at[0] * s[1] + at[1]) * s[2] + at[2]) * s[3] + at[3])] = nan;
    return to(Tensor::from_vector(x, s), dt).to(dev);
  };
  const Tensor q = leaf64({B, H, N, D}, 1).detach(), k = leaf64({B, H, N, D}, 2).detach(),
               v = to(leaf64({B, H, N, D}, 3).detach(), dt).to(dev);
  std::vector<std::pair<int64_t, int64_t>> padded;
  for (int64_t j = 1; j < N; ++j) padded.push_back({1, j});
  const Tensor kpm = padding(B, N, padded).to(dev);
  std::vector<int64_t> all;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < N; ++j) all.push_back(j);
  const Tensor members = Tensor::from_vector(all, {B, 1, 1, N}).to(dev);
  struct Case {
    const char* what;
    Tensor q, k;
    bool causal;
    std::function<bool(int64_t b, int64_t h, int64_t i)> nan_row;
  };
  const Tensor qd = to(q, dt).to(dev), kd = to(k, dt).to(dev);
  const std::vector<Case> cases = {
      {"a NaN key: every row of its head", qd, with_nan(k, {0, 1, 100, 2}), false,
       [](int64_t b, int64_t h, int64_t) { return b == 0 && h == 1; }},
      {"causal: the rows that see the NaN key", qd, with_nan(k, {0, 1, 100, 2}), true,
       [](int64_t b, int64_t h, int64_t i) { return b == 0 && h == 1 && i >= 100; }},
      {"a NaN query: its row", with_nan(q, {1, 0, 7, 0}), kd, false,
       [](int64_t b, int64_t h, int64_t i) { return b == 1 && h == 0 && i == 7; }},
      {"a NaN beside padded keys only", qd, with_nan(k, {1, 0, 0, 3}), false,
       [](int64_t b, int64_t h, int64_t) { return b == 1 && h == 0; }},
      {"a NaN in a padded key: masked", qd, with_nan(k, {1, 0, 5, 3}), false,
       [](int64_t, int64_t, int64_t) { return false; }},
  };
  for (const Case& c : cases) {
    const std::string what = c.what;
    CAPTURE(what);
    std::vector<int> want(size_t(B * H * N));
    for (int64_t r = 0; r < B * H * N; ++r) want[size_t(r)] = c.nan_row(r / (H * N), (r / N) % H, r % N) ? 1 : 0;
    kernels::FlashAttentionParams p;
    p.scale = 0.5;
    p.causal = c.causal;
    kernels::BlockAttentionParams bp;
    bp.offsets = {0};
    bp.scale = 0.5;
    bp.causal = c.causal;
    for (NanPath path : paths) {
      CAPTURE(int(path));
      Tensor out = Tensor::empty({B, H, N, D}, dt, dev), lse = Tensor::empty({B, H, N}, dt, dev);
      switch (path) {
        case NanPath::kFlashFusedCpu: kernels::flash_attention_forward_cpu(c.q, c.k, v, kpm, p, out, lse); break;
        case NanPath::kFlashGemm:  // chunks of 64 rows
          kernels::flash_attention_forward_gemm(c.q, c.k, v, kpm, p, out, lse, 64);
          break;
        case NanPath::kBlockOp: {
          BlockAttentionOptions o;
          o.causal = c.causal;
          o.scale = 0.5;
          BlockAttentionResult r = block_attention(c.q, c.k, v, members, kpm, o);
          out = r.out;
          lse = r.lse;
          break;
        }
        case NanPath::kBlockGemm:
          kernels::block_attention_forward_gemm(c.q, c.k, v, members, kpm, bp, out, lse);
          break;
#ifdef CF_WITH_CUDA
        case NanPath::kFlashFusedCuda: kernels::flash_attention_forward_cuda(c.q, c.k, v, kpm, p, out, lse); break;
        case NanPath::kBlockFusedCuda:
          kernels::block_attention_forward_cuda(c.q, c.k, v, members, kpm, bp, out, lse);
          break;
#else
        case NanPath::kFlashFusedCuda:
        case NanPath::kBlockFusedCuda: FAIL("a CUDA path in a CPU-only build"); break;
#endif
        case NanPath::kFlashMmaCuda: kernels::flash_attention_forward_mma_cuda(c.q, c.k, v, kpm, p, out, lse); break;
        case NanPath::kBlockMmaCuda:
          kernels::block_attention_forward_mma_cuda(c.q, c.k, v, members, kpm, bp, out, lse);
          break;
      }
      CHECK(nan_rows(out.to(Device::cpu())) == want);
      CHECK(nan_rows(reshape(lse.to(Device::cpu()), {B, H, N, 1})) == want);
    }
  }
}

TEST_SUITE("ops/attention") {

TEST_CASE("flash attention equals dense attention: masks, causal, Nq != Nk, sizes off the tile") {
  for (bool causal : {false, true}) {
    // Batch 1 has padded keys; Nq > Nk with causal leaves the first queries no key (zeros).
    check_flash(2, 2, 7, 7, 3, 4, padding(2, 7, {{1, 0}, {1, 5}}), causal, 0.0, kFloat64, 1e-12);
    check_flash(2, 1, 130, 150, 5, 3, padding(2, 150, {{1, 3}, {1, 149}, {0, 64}}), causal, 0.0, kFloat64, 1e-12);
    check_flash(1, 2, 150, 70, 4, 4, Tensor(), causal, 0.3, kFloat64, 1e-12);
    check_flash(1, 2, 20, 300, 4, 6, Tensor(), causal, 0.0, kFloat64, 1e-12);
    check_flash(2, 3, 65, 129, 8, 8, padding(2, 129, {{0, 128}, {1, 127}}), causal, 0.0, kFloat32, 2e-5);
    // One (batch, head) and several key tiles: large enough to run on the OpenMP
    // team, where the backward splits the keys and sums per-slice dQ buffers.
    check_flash(1, 1, 130, 1100, 8, 8, padding(1, 1100, {{0, 7}, {0, 600}}), causal, 0.0, kFloat64, 1e-12);
  }
}

TEST_CASE("flash attention with dropout drops the weights the dense path drops: forward, gradients, tiles, masks") {
  for (bool causal : {false, true}) {
    check_flash(2, 2, 7, 7, 3, 4, padding(2, 7, {{1, 0}, {1, 5}}), causal, 0.0, kFloat64, 1e-12, 0.3);
    // Several query tiles (128 rows) and key tiles (512 keys): the counters of each tile's rows
    // and columns; Nq != Nk; on the OpenMP team with the backward's key slices.
    check_flash(1, 2, 150, 600, 4, 3, padding(1, 600, {{0, 3}, {0, 530}}), causal, 0.0, kFloat64, 1e-12, 0.5);
    check_flash(1, 1, 130, 1100, 8, 8, Tensor(), causal, 0.0, kFloat64, 1e-12, 0.1);
    check_flash(2, 3, 65, 129, 8, 8, padding(2, 129, {{0, 128}, {1, 127}}), causal, 0.0, kFloat32, 2e-5, 0.2);
    check_flash(1, 2, 150, 600, 4, 3, Tensor(), causal, 0.0, kFloat32, 2e-5, 0.3);
    // Nq > Nk: causal leaves the first queries no key (zeros, no draw needed).
    check_flash(2, 1, 200, 130, 4, 4, padding(2, 130, {{1, 7}}), causal, 0.0, kFloat64, 1e-12, 0.4);
  }
  // The rate takes effect: some weights drop (the output moves), and none at rate 0 draws a counter.
  Tensor q = leaf64({1, 2, 9, 4}, 1), k = leaf64({1, 2, 9, 4}, 2), v = leaf64({1, 2, 9, 3}, 3);
  Generator g(5);
  CHECK(max_abs_diff(flash_attention(q, k, v, Tensor(), 0.0, false, 0.5, g), flash_attention(q, k, v)) > 0.01);
  CHECK(g.offset() == 2 * 9 * 9);
  CHECK(max_abs_diff(flash_attention(q, k, v, Tensor(), 0.0, false, 0.0, g), flash_attention(q, k, v)) == 0.0);
  CHECK(g.offset() == 2 * 9 * 9);
  // Successive calls (training steps) draw fresh counters: other weights drop.
  Tensor first = flash_attention(q, k, v, Tensor(), 0.0, false, 0.5, g);
  CHECK(max_abs_diff(flash_attention(q, k, v, Tensor(), 0.0, false, 0.5, g), first) > 0.01);
}

TEST_CASE("flash attention's GEMM path equals the fused kernel: chunks, masks, causal, empty rows, lse gradient, dropout") {
  for (const KernelCase& c : kKernelCases) {
    CAPTURE(c.Nq);
    CAPTURE(c.Nk);
    CAPTURE(c.causal);
    CAPTURE(c.chunk);
    CAPTURE(c.splits);
    for (double drop : {0.0, 0.3, 0.7}) {  // with a rate: the weights the fused kernel drops
      if (drop > 0 && c.Nq * c.Nk > 100000) continue;  // the 70000-row case adds nothing there
      CAPTURE(drop);
      const std::vector<Tensor> want = run_flash_path(c, FlashPath::kFusedCpu, Device::cpu(), drop);
      check_same_paths(c, want, run_flash_path(c, FlashPath::kGemm, Device::cpu(), drop));
      // The rate took effect: the output moved from the run without dropout (a case with any key at all).
      if (drop > 0 && c.Nk > 1)
        CHECK(max_abs_diff(want[0], run_flash_path(c, FlashPath::kFusedCpu, Device::cpu())[0]) > 1e-3);
    }
  }
}

TEST_CASE("flash attention's GEMM path splits the keys of a thin product only") {
  // N = 65536, 4 heads, 128-row chunks: 8 output tiles of 64 x 64, so 64 parts of 1024 keys.
  CHECK(kernels::flash_gemm_key_splits(4, 128, 64, 65536) == 64);
  // N = 16384 in 512-row chunks: 32 tiles, 16 parts.
  CHECK(kernels::flash_gemm_key_splits(4, 512, 64, 16384) == 16);
  // Parts of at least kFlashGemmMinSplitKeys keys: 2048 keys give 4 at most, fewer than 2 x 512 none.
  CHECK(kernels::flash_gemm_key_splits(1, 1, 64, 2048) == 4);
  CHECK(kernels::flash_gemm_key_splits(1, 1, 64, 1023) == 1);
  // Wide enough already: 8 x 16 heads of 256 rows are 512 tiles.
  CHECK(kernels::flash_gemm_key_splits(128, 256, 64, 65536) == 1);
  CHECK(kernels::flash_gemm_key_splits(4, 65536, 64, 65536) == 1);
  CHECK(kernels::flash_gemm_key_splits(4, 128, 0, 65536) == 1);  // an empty head: no tiles, no split
}

TEST_CASE("block attention's GEMM path equals the fused kernel: windows, rounds, shared tables, masks, chunks, dropout") {
  for (const BlockCase& c : kBlockCases) {
    CAPTURE(c.N);
    CAPTURE(c.C);
    CAPTURE(c.rounds);
    CAPTURE(c.causal);
    CAPTURE(c.chunk);
    const std::vector<Tensor> kept = run_block_path(c, BlockPath::kFusedCpu, Device::cpu());
    check_same_block_paths(c, kept, run_block_path(c, BlockPath::kGemm, Device::cpu()));
    for (double drop : {0.3, 0.7}) {  // the weights the fused kernel drops
      CAPTURE(drop);
      const std::vector<Tensor> want = run_block_path(c, BlockPath::kFusedCpu, Device::cpu(), drop);
      check_same_block_paths(c, want, run_block_path(c, BlockPath::kGemm, Device::cpu(), drop));
      // The rate took effect; lse is that of the weights before dropout, so it did not move.
      CHECK(max_abs_diff(want[0], kept[0]) > 1e-3);
      CHECK(max_abs_diff(want[1], kept[1]) == 0.0);
    }
  }
}

TEST_CASE("block attention's GEMM path: its backward holds the capped workspace, window table included, nothing of out's size") {
  // 32 rounds over one head (LSH's form): out is 32 times q, 33.5 MB, while the workspace cap is its
  // 16 MiB floor, the window table's 8.4 MB within it. A dO . O product of out's size (the first version
  // computed D that way) takes the peak past the bound, and so did chunks sized without the table.
  const int64_t B = 1, H = 1, R = 32, N = 16384, D = 16, w = 64, C = N / w;
  Generator g(3);
  const Tensor q = randn({B, H, N, D}, kFloat32, g), k = randn({B, H, N, D}, kFloat32, g),
               v = randn({B, H, N, D}, kFloat32, g), dout = randn({B, H * R, N, D}, kFloat32, g),
               dlse = randn({B, H * R, N}, kFloat32, g);
  const Tensor members = scattered_members(B, H * R, N, C, w, 4);
  kernels::BlockAttentionParams p;
  p.offsets = ops::block_window_offsets(C, 1, 0);
  p.scale = 0.25;
  p.rounds = R;
  const Tensor out = Tensor::empty({B, H * R, N, D}, kFloat32), lse = Tensor::empty({B, H * R, N}, kFloat32),
               dq = Tensor::empty(q.shape(), kFloat32), dk = Tensor::empty(k.shape(), kFloat32),
               dv = Tensor::empty(v.shape(), kFloat32);
  kernels::block_attention_forward_gemm(q, k, v, members, Tensor(), p, out, lse);
  reset_peak_memory();
  const int64_t before = memory_stats().live_bytes;
  kernels::block_attention_backward_gemm(q, k, v, members, Tensor(), p, out, lse, dout, dlse, dq, dk, dv);
  const int64_t peak = memory_stats().peak_bytes - before;
  const int64_t cap = int64_t(16) << 20, table = B * H * R * C * 2 * w * 8, out_bytes = out.numel() * 4;
  CAPTURE(peak);
  CHECK(peak <= cap + (int64_t(1) << 20));
  CHECK(out_bytes > cap + table + (int64_t(1) << 20));  // what the bound rules out
}

TEST_CASE("block attention's path setting: the environment's values, a bad one named, the size rule") {
  CHECK(kernels::parse_block_attention_path("auto") == kernels::BlockAttentionPath::kAuto);
  CHECK(kernels::parse_block_attention_path("fused") == kernels::BlockAttentionPath::kFused);
  CHECK(kernels::parse_block_attention_path("gemm") == kernels::BlockAttentionPath::kGemm);
  CHECK(kernels::parse_block_attention_path("mma") == kernels::BlockAttentionPath::kMma);
  CHECK_THROWS_MSG(kernels::parse_block_attention_path("cublas"), ValueError,
                   "[block_attention] CF_BLOCK_ATTENTION_PATH must be auto, fused, gemm or mma, got 'cublas'");
  const kernels::BlockAttentionPath before = kernels::block_attention_path();
  kernels::BlockAttentionParams p;
  p.offsets = {0, -1};
  // 4 heads, 128 blocks of 128 (N = 16384, look back 1): 16.8 M scored entries; 32 of 64 (N = 2048): 1.05 M;
  // 32 of 32: 0.26 M.
  const Tensor q = fake_cuda({1, 4, 16384, 64}), big = fake_cuda({1, 4, 128, 128}, kInt64),
               edge = fake_cuda({1, 4, 32, 64}, kInt64), small = fake_cuda({1, 4, 32, 32}, kInt64);
  kernels::set_block_attention_path(kernels::BlockAttentionPath::kAuto);
  CHECK(kernels::block_attention_takes_gemm(q, big, p));
  CHECK(kernels::block_attention_takes_gemm(q, edge, p));
  CHECK_FALSE(kernels::block_attention_takes_gemm(q, small, p));
  // Counted per round: LSH-8 at N = 1024 (16 buckets of 64) scores 4.2 M entries, 0.52 M a round: fused.
  {
    kernels::BlockAttentionParams r = p;
    r.rounds = 8;
    CHECK_FALSE(kernels::block_attention_takes_gemm(fake_cuda({1, 4, 1024, 64}), fake_cuda({1, 32, 16, 64}, kInt64), r));
    CHECK(kernels::block_attention_takes_gemm(fake_cuda({1, 4, 4096, 64}), fake_cuda({1, 32, 64, 64}, kInt64), r));
  }
  // Past the fused kernel's grid (65535 blocks, 65535 batch*heads): the GEMM path at any size (0.5 M entries
  // here, fused below the grid).
  CHECK(kernels::block_attention_takes_gemm(q, fake_cuda({1, 4, 65536, 1}, kInt64), p));
  CHECK(kernels::block_attention_takes_gemm(fake_cuda({16384, 4, 2, 8}), fake_cuda({16384, 4, 1, 2}, kInt64), p));
  CHECK_FALSE(kernels::block_attention_takes_gemm(fake_cuda({16383, 4, 2, 8}), fake_cuda({16383, 4, 1, 2}, kInt64), p));
  kernels::set_block_attention_path(kernels::BlockAttentionPath::kFused);
  CHECK_FALSE(kernels::block_attention_takes_gemm(q, big, p));
  kernels::set_block_attention_path(kernels::BlockAttentionPath::kGemm);
  CHECK(kernels::block_attention_takes_gemm(q, small, p));
  // mma: the tensor-core kernels where they take the call, else the automatic rule; never float64 or the CPU
  // (kAuto's choice of them, and rounds under kMma, are CUDA tests: they read the device).
  kernels::set_block_attention_path(kernels::BlockAttentionPath::kMma);
  CHECK(kernels::block_attention_takes_gemm(q, big, p));
  CHECK_FALSE(kernels::block_attention_takes_gemm(q, small, p));
  {
    const Tensor q64 = fake_cuda({1, 4, 16384, 64}, kFloat64);
    CHECK_FALSE(kernels::block_attention_takes_mma(q64, q64, q64, small, p));
    const Tensor c = Tensor::zeros({1, 4, 1024, 64}), mc = Tensor::zeros({1, 4, 32, 32}, kInt64);
    CHECK_FALSE(kernels::block_attention_takes_mma(c, c, c, mc, p));
  }
  kernels::set_block_attention_path(kernels::BlockAttentionPath::kAuto);
  {
    const Tensor c = Tensor::zeros({1, 4, 1024, 64}), mc = Tensor::zeros({1, 4, 32, 32}, kInt64);
    CHECK_FALSE(kernels::block_attention_takes_mma(c, c, c, mc, p));
    CHECK_FALSE(kernels::block_attention_takes_mma(c, c, c, mc, p, /*backward=*/true));
    // Rounds: kAuto keeps them off the tensor-core kernels (not yet timed there), decided before q's data is read
    // (a storage-less tensor here).
    kernels::BlockAttentionParams r = p;
    r.rounds = 2;
    const Tensor m2 = fake_cuda({1, 8, 32, 32}, kInt64);
    CHECK_FALSE(kernels::block_attention_takes_mma(q, q, q, m2, r));
    CHECK_FALSE(kernels::block_attention_takes_mma(q, q, q, m2, r, /*backward=*/true));
  }
  kernels::set_block_attention_path(before);
}

TEST_CASE("flash attention's path setting: the environment's values, a bad one named, tensor cores only when asked") {
  CHECK(kernels::parse_flash_attention_path("auto") == kernels::FlashAttentionPath::kAuto);
  CHECK(kernels::parse_flash_attention_path("gemm") == kernels::FlashAttentionPath::kGemm);
  CHECK(kernels::parse_flash_attention_path("mma") == kernels::FlashAttentionPath::kMma);
  CHECK_THROWS_MSG(kernels::parse_flash_attention_path("fused"), ValueError,
                   "[flash_attention] CF_FLASH_ATTENTION_PATH must be auto, gemm or mma, got 'fused'");
  const kernels::FlashAttentionPath before = kernels::flash_attention_path();
  const Tensor q = fake_cuda({1, 4, 4096, 64}), q64 = fake_cuda({1, 4, 4096, 64}, kFloat64),
               q32 = fake_cuda({1, 4, 4096, 32}), c = Tensor::zeros({1, 4, 128, 64});
  kernels::set_flash_attention_path(kernels::FlashAttentionPath::kAuto);
  CHECK_FALSE(kernels::flash_attention_takes_mma(q, q, q));
  kernels::set_flash_attention_path(kernels::FlashAttentionPath::kMma);
  CHECK_FALSE(kernels::flash_attention_takes_mma(q64, q64, q64));  // float32 only
  CHECK_FALSE(kernels::flash_attention_takes_mma(q32, q32, q32));  // head size 64 only (said on a GPU machine)
  CHECK_FALSE(kernels::flash_attention_takes_mma(c, c, c));        // CUDA only
  kernels::set_flash_attention_path(before);
  // routed_attention's setting: the same rules.
  CHECK(kernels::parse_routed_attention_path("auto") == kernels::RoutedAttentionPath::kAuto);
  CHECK(kernels::parse_routed_attention_path("fused") == kernels::RoutedAttentionPath::kFused);
  CHECK(kernels::parse_routed_attention_path("mma") == kernels::RoutedAttentionPath::kMma);
  CHECK_THROWS_MSG(kernels::parse_routed_attention_path("gemm"), ValueError,
                   "[routed_attention] CF_ROUTED_ATTENTION_PATH must be auto, fused or mma, got 'gemm'");
  const kernels::RoutedAttentionPath routed_before = kernels::routed_attention_path();
  const Tensor lists = fake_cuda({1, 4, 8, 16}, kInt64), cl = Tensor::zeros({1, 4, 8, 16}, kInt64);
  kernels::set_routed_attention_path(kernels::RoutedAttentionPath::kAuto);
  CHECK_FALSE(kernels::routed_attention_takes_mma(q64, q64, q64, lists, lists));  // float32 only
  CHECK_FALSE(kernels::routed_attention_takes_mma(c, c, c, cl, cl));              // CUDA only
  kernels::set_routed_attention_path(kernels::RoutedAttentionPath::kMma);
  CHECK_FALSE(kernels::routed_attention_takes_mma(q64, q64, q64, lists, lists));
  CHECK_FALSE(kernels::routed_attention_takes_mma(q32, q32, q32, lists, lists));
  CHECK_FALSE(kernels::routed_attention_takes_mma(c, c, c, cl, cl));
  kernels::set_routed_attention_path(routed_before);
}

TEST_CASE("flash attention: a query with every key blocked outputs zeros and passes a zero gradient") {
  std::vector<std::pair<int64_t, int64_t>> all;
  for (int64_t j = 0; j < 9; ++j) all.push_back({1, j});  // batch 1: every key padded
  Tensor q = leaf64({2, 2, 5, 3}, 1), k = leaf64({2, 2, 9, 3}, 2), v = leaf64({2, 2, 9, 2}, 3);
  Tensor out = flash_attention(q, k, v, padding(2, 9, all));
  std::vector<double> o = values(out);
  for (size_t i = 20; i < 40; ++i) CHECK(o[i] == 0.0);
  sum(out * out + out).backward();
  std::vector<double> gq = values(q.grad()), gk = values(k.grad()), gv = values(v.grad());
  for (size_t i = 30; i < 60; ++i) CHECK(gq[i] == 0.0);
  for (size_t i = 54; i < 108; ++i) CHECK(gk[i] == 0.0);
  for (size_t i = 36; i < 72; ++i) CHECK(gv[i] == 0.0);
  for (double x : gq) CHECK(std::isfinite(x));
  // Causal with Nq > Nk: queries 0..Nq-Nk-1 see nothing.
  Tensor c = flash_attention(q, slice(k, 2, 0, 3), slice(v, 2, 0, 3), Tensor(), 0.0, true);
  std::vector<double> co = values(c);
  for (int64_t bh = 0; bh < 4; ++bh)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t d = 0; d < 2; ++d) CHECK(co[size_t((bh * 5 + i) * 2 + d)] == 0.0);
}

TEST_CASE("flash and block attention: a NaN score makes its row NaN as in the dense softmax, a masked one does not") {
  check_nan_rows({NanPath::kFlashFusedCpu, NanPath::kFlashGemm, NanPath::kBlockOp, NanPath::kBlockGemm}, Device::cpu(),
                 kFloat64, 4);
  check_nan_rows({NanPath::kFlashFusedCpu, NanPath::kFlashGemm, NanPath::kBlockOp}, Device::cpu(), kFloat32, 64);
  // LSH's rounds: a row whose every round's lse is NaN combines to NaN (the rounds' maximum skipped NaN).
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor per_round = Tensor::from_vector(std::vector<double>{1, 2, nan, 3, 4, nan}, {1, 2, 1, 3});
  Tensor combined = Tensor::empty({1, 1, 1, 3}, kFloat64);
  kernels::rounds_combine_cpu(per_round, 2, combined);
  for (double x : values(combined)) CHECK(std::isnan(x));
}

TEST_CASE("flash attention with lse: out is flash_attention's, lse the dense log-sum-exp, gradients through both") {
  struct Case {
    int64_t B, H, Nq, Nk, D;
    bool padded;
    double scale;
  };
  // Sizes off the tiles, Nq < Nk and Nq == Nk, a (batch, head) with several key tiles
  // (the backward's per-slice dQ sums). In the first case batch 1 pads key 0, so under
  // causal its query 0 sees no key: lse -inf on both sides, and its gradient 0 (the
  // fused backward's P = 0; the reference's NaN from logsumexp is cut by masked_fill).
  for (const Case& c : {Case{2, 2, 7, 7, 3, true, 0.0}, Case{2, 1, 130, 150, 5, true, 0.3},
                        Case{1, 1, 130, 1100, 8, false, 0.0}})
    for (bool causal : {false, true}) {
      CAPTURE(c.Nk);
      CAPTURE(causal);
      Tensor q = leaf64({c.B, c.H, c.Nq, c.D}, 1, -2, 2), k = leaf64({c.B, c.H, c.Nk, c.D}, 2, -2, 2),
             v = leaf64({c.B, c.H, c.Nk, 4}, 3);
      Tensor kpm = c.padded ? padding(c.B, c.Nk, {{1, 0}, {1, c.Nk - 2}}) : Tensor();
      Tensor w = leaf64({c.B, c.H, c.Nq, 4}, 4).detach(), u = leaf64({c.B, c.H, c.Nq}, 5).detach();
      const double used = c.scale > 0 ? c.scale : 1.0 / std::sqrt(double(c.D));
      FlashAttentionResult r = flash_attention_with_lse(q, k, v, kpm, c.scale, causal);
      check_close(r.out, flash_attention(q, k, v, kpm, c.scale, causal), 0.0);
      sum(r.out * w + unsqueeze(r.lse * u, 3)).backward();
      std::vector<Tensor> got = {q.grad(), k.grad(), v.grad()};
      q.zero_grad();
      k.zero_grad();
      v.zero_grad();
      Tensor scores = matmul(q * used, transpose(k, -2, -1));
      Tensor blocked = kpm.defined() ? reshape(kpm, {c.B, 1, 1, c.Nk}) : Tensor();
      if (causal) {
        Tensor future = reshape(gt(reshape(Tensor::arange(c.Nk, kInt64), {1, c.Nk}),
                                   reshape(Tensor::arange(c.Nq, kInt64), {c.Nq, 1}) + double(c.Nk - c.Nq)),
                                {1, 1, c.Nq, c.Nk});
        blocked = blocked.defined() ? logical_or(blocked, future) : future;
      }
      if (blocked.defined()) scores = masked_fill(scores, blocked, -INFINITY);
      Tensor lse = logsumexp(scores, {-1});
      check_close(r.lse, lse, 1e-12);
      sum(dense_reference(q, k, v, kpm, used, causal) * w + unsqueeze(lse * u, 3)).backward();
      check_close(got[0], q.grad(), 1e-12);
      check_close(got[1], k.grad(), 1e-12);
      check_close(got[2], v.grad(), 1e-12);
    }
  // Every key of batch 1 padded: lse -inf, out 0, and zero gradients from both.
  std::vector<std::pair<int64_t, int64_t>> all;
  for (int64_t j = 0; j < 9; ++j) all.push_back({1, j});
  Tensor q = leaf64({2, 2, 5, 3}, 1), k = leaf64({2, 2, 9, 3}, 2), v = leaf64({2, 2, 9, 2}, 3);
  FlashAttentionResult r = flash_attention_with_lse(q, k, v, padding(2, 9, all));
  std::vector<double> l = values(r.lse);
  for (size_t i = 0; i < 10; ++i) CHECK(std::isfinite(l[i]));
  for (size_t i = 10; i < 20; ++i) CHECK(l[i] == -INFINITY);
  sum(r.out + unsqueeze(masked_fill(r.lse, eq(r.lse, -INFINITY), 0.0), 3)).backward();
  std::vector<double> gq = values(q.grad()), gk = values(k.grad());
  for (size_t i = 30; i < 60; ++i) CHECK(gq[i] == 0.0);
  for (size_t i = 54; i < 108; ++i) CHECK(gk[i] == 0.0);
  for (double x : gq) CHECK(std::isfinite(x));
}

TEST_CASE("flash attention: strided inputs, zero grad_output, repeatable backward") {
  Tensor base = leaf64({1, 6, 2, 4}, 5);  // (B, N, H, D) viewed as (B, H, N, D)
  auto q = [&] { return transpose(base, 1, 2); };
  Tensor k = leaf64({1, 2, 6, 4}, 6), v = leaf64({1, 2, 6, 3}, 7);
  check_close(flash_attention(q(), k, v), dense_reference(q(), k, v, Tensor(), 0.5, false), 1e-12);
  Tensor out = flash_attention(q(), k, v);
  sum(out * 0.0).backward();
  for (double x : values(base.grad())) CHECK(x == 0.0);
  base.zero_grad();
  Tensor w = leaf64({1, 2, 6, 3}, 8).detach();
  sum(flash_attention(q(), k, v, Tensor(), 0.0, true) * w).backward();
  std::vector<double> first = values(base.grad());
  base.zero_grad();
  sum(flash_attention(q(), k, v, Tensor(), 0.0, true) * w).backward();
  CHECK(values(base.grad()) == first);
}

GRADCHECK_CASE(flash_attention) {
  Tensor kpm = padding(2, 6, {{1, 1}, {1, 4}});
  for (bool causal : {false, true})
    for (double scale : {0.0, 0.7})
      check_grad("flash_attention",
                 [&](const std::vector<Tensor>& x) { return flash_attention(x[0], x[1], x[2], kpm, scale, causal); },
                 {leaf64({2, 2, 5, 3}, 1), leaf64({2, 2, 6, 3}, 2), leaf64({2, 2, 6, 2}, 3)});
  // With dropout: a fresh generator per evaluation, so every evaluation drops the same weights.
  for (bool causal : {false, true})
    check_grad("flash_attention",
               [&](const std::vector<Tensor>& x) {
                 Generator g(17);
                 return flash_attention(x[0], x[1], x[2], kpm, 0.0, causal, 0.4, g);
               },
               {leaf64({2, 2, 5, 3}, 1), leaf64({2, 2, 6, 3}, 2), leaf64({2, 2, 6, 2}, 3)});
  // Through out and lse (flash_attention_with_lse: lse's gradient joins the same backward),
  // with dropout too (lse is that of the weights before dropout).
  for (double rate : {0.0, 0.4})
    for (bool causal : {false, true})
      check_grad("flash_attention",
                 [&](const std::vector<Tensor>& x) { return out_and_lse_loss(x, kpm, causal, rate); },
                 {leaf64({2, 2, 5, 3}, 1), leaf64({2, 2, 6, 3}, 2), leaf64({2, 2, 6, 2}, 3)});
}

TEST_CASE("flash_attention_with_lse with dropout: flash_attention's output, lse before dropout, its counters") {
  Tensor q = leaf64({2, 2, 7, 3}, 31), k = leaf64({2, 2, 9, 3}, 32), v = leaf64({2, 2, 9, 4}, 33);
  const Tensor kpm = padding(2, 9, {{1, 0}, {1, 8}});
  Generator g1(23), g2(23);
  g1.reserve(500);  // mid-stream
  g2.reserve(500);
  FlashAttentionResult r = flash_attention_with_lse(q, k, v, kpm, 0.0, true, 0.3, g1);
  CHECK(r.dropout_seed == 23);
  CHECK(r.dropout_counter0 == 500);
  CHECK(g1.offset() == 500 + 2 * 2 * 7 * 9);
  CHECK(max_abs_diff(r.out, flash_attention(q, k, v, kpm, 0.0, true, 0.3, g2)) == 0.0);
  const FlashAttentionResult clean = flash_attention_with_lse(q, k, v, kpm, 0.0, true);
  CHECK(max_abs_diff(r.lse, clean.lse) == 0.0);
  CHECK(max_abs_diff(r.out, clean.out) > 1e-3);
  CHECK(clean.dropout_seed == 0);
  CHECK(clean.dropout_counter0 == 0);
}

TEST_CASE("flash attention rejects bad input with the shapes in the message") {
  Tensor q = leaf64({1, 2, 4, 3}), k = leaf64({1, 2, 5, 3}), v = leaf64({1, 2, 5, 2});
  CHECK_THROWS_MSG(flash_attention(q, leaf64({1, 2, 5, 4}), v), ShapeError, "[flash_attention] inconsistent shapes",
                   "(1,2,5,4)");
  CHECK_THROWS_MSG(flash_attention(reshape(q, {2, 4, 3}), k, v), ShapeError, "[flash_attention] expected q (B, H, Nq, Dk)");
  CHECK_THROWS_MSG(flash_attention(q, k, to(v, kFloat32)), DTypeError, "[flash_attention] q, k, v must share one float dtype");
  CHECK_THROWS_MSG(flash_attention(q, k, v, Tensor::zeros({1, 4}, kBool)), ShapeError,
                   "[flash_attention] key_padding_mask must be bool (B, Nk) = (1, 5), got bool (1,4)");
  CHECK_THROWS_MSG(flash_attention(q, k, v, Tensor(), -1.0), ValueError, "[flash_attention] scale must be finite and >= 0");
  CHECK_THROWS_MSG(flash_attention(q, k, v, Tensor(), std::nan("")), ValueError, "scale must be finite");
  CHECK_THROWS_MSG(flash_attention(q, k, fake_cuda({1, 2, 5, 2}, kFloat64)), DeviceError,
                   "[flash_attention] tensors are on different devices");
  CHECK_THROWS_MSG(flash_attention(Tensor(), k, v), ValueError, "[flash_attention] argument 'q' is an undefined tensor");
  for (double rate : {1.0, -0.1, std::nan("")})
    CHECK_THROWS_MSG(flash_attention(q, k, v, Tensor(), 0.0, false, rate), ValueError,
                     "[flash_attention] dropout must be in [0, 1), got");
  {  // the kernels without dropout (the CUDA scalar and tensor-core ones) refuse a rate rather than ignore it
    kernels::FlashAttentionParams p;
    p.dropout = 0.25;
    CHECK_THROWS_MSG(kernels::check_flash_no_dropout(p, "tensor-core kernel"), ValueError,
                     "[flash_attention] the tensor-core kernel has no attention dropout", "0.25");
  }
  // flash_attention_with_lse shares the checks and names the same op.
  CHECK_THROWS_MSG(flash_attention_with_lse(q, k, v, Tensor::zeros({1, 4}, kBool)), ShapeError,
                   "[flash_attention] key_padding_mask must be bool (B, Nk) = (1, 5), got bool (1,4)");
  CHECK_THROWS_MSG(flash_attention_with_lse(q, k, to(v, kFloat32)), DTypeError,
                   "[flash_attention] q, k, v must share one float dtype");
}

GRADCHECK_CASE(block_attention) {
  // Chunks of 3 over 7 tokens (the last chunk has 2 empty slots; token 5 is in no
  // slot), per-head tables, look-back 1, causal, self mask, padding: out and lse.
  Tensor members = ti64({4, 0, 2, 6, 1, 3, -1, -1, -1,  //
                         1, 2, 3, 0, 4, 6, -1, -1, -1,  //
                         6, 5, 4, 3, 2, 1, 0, -1, -1,  //
                         0, 1, 2, 3, 4, 5, 6, -1, -1},
                        {2, 2, 3, 3});
  Tensor kpm = padding(2, 7, {{1, 2}});
  BlockAttentionOptions o;
  o.look_back = 1;
  for (bool causal : {false, true}) {
    o.causal = causal;
    o.self_mask = causal;
    check_grad("block_attention",
               [&](const std::vector<Tensor>& x) {
                 BlockAttentionResult r = block_attention(x[0], x[1], x[2], members, kpm, o);
                 // lse is -inf for tokens with nothing to attend to, and the
                 // self-only queries' lse (about -1e5) loses the digits a
                 // finite difference measures: leave both out.
                 return sum(r.out * r.out) + sum(masked_fill(r.lse, lt(r.lse, -1e4), 0.0));
               },
               {leaf64({2, 2, 7, 3}, 1), leaf64({2, 2, 7, 3}, 2), leaf64({2, 2, 7, 2}, 3)});
    // With attention dropout: a fresh generator per evaluation, so every evaluation drops the same weights.
    check_grad("block_attention",
               [&](const std::vector<Tensor>& x) {
                 Generator g(23);
                 BlockAttentionOptions d = o;
                 d.dropout = 0.4;
                 d.generator = &g;
                 BlockAttentionResult r = block_attention(x[0], x[1], x[2], members, kpm, d);
                 return sum(r.out * r.out) + sum(masked_fill(r.lse, lt(r.lse, -1e4), 0.0));
               },
               {leaf64({2, 2, 7, 3}, 1), leaf64({2, 2, 7, 3}, 2), leaf64({2, 2, 7, 2}, 3)});
  }
  // The other options: look-ahead with one table shared by the heads and an explicit scale; rounds
  // (the table has H * R heads over q, k, v's H), their outputs apart or combined by their lse.
  {
    BlockAttentionOptions a;
    a.look_back = 0;
    a.look_ahead = 1;
    a.scale = 0.7;
    Tensor shared = slice(members, 1, 0, 1);  // (B, 1, 3, 3)
    check_grad("block_attention",
               [&](const std::vector<Tensor>& x) {
                 BlockAttentionResult r = block_attention(x[0], x[1], x[2], shared, kpm, a);
                 return sum(r.out * r.out) + sum(masked_fill(r.lse, lt(r.lse, -1e4), 0.0));
               },
               {leaf64({2, 2, 7, 3}, 1), leaf64({2, 2, 7, 3}, 2), leaf64({2, 2, 7, 2}, 3)});
  }
  // Rounds: q, k, v with one head, the four tables above as its R = 2 rounds per batch row.
  Tensor rounds_members = reshape(members, {2, 2, 3, 3});
  for (bool combine : {false, true}) {
    BlockAttentionOptions r2;
    r2.look_back = 1;
    r2.rounds = 2;
    r2.combine_rounds = combine;
    r2.causal = combine;
    check_grad("block_attention",
               [&](const std::vector<Tensor>& x) {
                 BlockAttentionResult r = block_attention(x[0], x[1], x[2], rounds_members, kpm, r2);
                 return sum(r.out * r.out) + sum(masked_fill(r.lse, lt(r.lse, -1e4), 0.0));
               },
               {leaf64({2, 1, 7, 3}, 4), leaf64({2, 1, 7, 3}, 5), leaf64({2, 1, 7, 2}, 6)});
  }
}

TEST_CASE("block attention rejects bad input with the shapes in the message") {
  Tensor q = leaf64({1, 2, 4, 3}), k = leaf64({1, 2, 4, 3}), v = leaf64({1, 2, 4, 2});
  Tensor members = ti64({0, 1, 2, 3}, {1, 1, 2, 2});
  CHECK_THROWS_MSG(block_attention(q, k, v, ti64({0, 1, 1, 3}, {1, 1, 2, 2})), ValueError,
                   "[block_attention] position 1 appears twice in members[0, 0]");
  CHECK_THROWS_MSG(block_attention(q, k, v, Tensor::full({1, 3, 2, 2}, -1.0, kInt64)), ShapeError,
                   "[block_attention] members (1,3,2,2) does not fit q (1,2,4,3)");
  CHECK_THROWS_MSG(block_attention(q, k, v, members, Tensor::zeros({1, 5}, kBool)), ShapeError,
                   "[block_attention] key_padding_mask must be bool (B, N) = (1, 4), got bool (1,5)");
  BlockAttentionOptions bad;
  bad.look_ahead = -2;
  CHECK_THROWS_MSG(block_attention(q, k, v, members, Tensor(), bad), ValueError, "[block_attention] look_back and look_ahead",
                   "look_ahead=-2");
  for (double rate : {1.0, -0.5, std::nan("")}) {
    BlockAttentionOptions drop;
    drop.dropout = rate;
    CHECK_THROWS_MSG(block_attention(q, k, v, members, Tensor(), drop), ValueError,
                     "[block_attention] dropout must be in [0, 1), got");
  }
  {  // the kernels without dropout (the fused CUDA and tensor-core ones) refuse a rate rather than ignore it
    kernels::BlockAttentionParams p;
    p.dropout = 0.25;
    CHECK_THROWS_MSG(kernels::check_no_attention_dropout(p.dropout, "block_attention", "fused CUDA kernel"),
                     ValueError, "[block_attention] the fused CUDA kernel has no attention dropout", "0.25");
    // The dispatch sends a rate to the GEMM path (no GPU needed to ask).
    const Tensor t = Tensor::zeros({1, 1, 4, 2}), m = Tensor::zeros({1, 1, 2, 2}, kInt64);
    p.offsets = {0};
    CHECK(kernels::block_attention_takes_gemm(t, m, p));
  }
  CHECK_THROWS_MSG(block_attention(q, k, v, fake_cuda({1, 1, 2, 2}, kInt64)), DeviceError,
                   "[block_attention] tensors are on different devices");
}

// Routed attention: query lists of 3 and key lists of 4 slots, lists shared over the
// batch but not the heads (key lists) or over the heads but not the batch (query
// lists); token 3 sits in two query lists of batch 0 and token 5 in none; padding.
GRADCHECK_CASE(routed_attention) {
  Tensor qm = ti64({0, 3, 6, /**/ 3, -1, 1, /**/ 2, 4, -1,  //
                    6, 5, 4, /**/ 0, 1, -1, /**/ 2, 3, 0},
                   {2, 1, 3, 3});
  Tensor km = ti64({1, 3, 6, 0, /**/ 0, 2, 4, -1, /**/ 5, 6, -1, 2,  //
                    3, 4, 5, 6, /**/ -1, 6, 1, 0, /**/ -1, 2, 3, 5},
                   {1, 2, 3, 4});
  Tensor kpm = padding(2, 7, {{1, 6}});
  for (bool causal : {false, true})
    check_grad("routed_attention",
               [&](const std::vector<Tensor>& x) {
                 Tensor out = routed_attention(x[0], x[1], x[2], qm, km, kpm, causal ? 0.7 : 0.0, causal);
                 return sum(out * out);
               },
               {leaf64({2, 2, 7, 3}, 1), leaf64({2, 2, 7, 3}, 2), leaf64({2, 2, 7, 2}, 3)});
  // With attention dropout: a fresh generator per evaluation, so every evaluation drops the same weights.
  for (bool causal : {false, true})
    check_grad("routed_attention",
               [&](const std::vector<Tensor>& x) {
                 Generator g(19);
                 Tensor out = routed_attention(x[0], x[1], x[2], qm, km, kpm, 0.0, causal, 0.4, g);
                 return sum(out * out);
               },
               {leaf64({2, 2, 7, 3}, 1), leaf64({2, 2, 7, 3}, 2), leaf64({2, 2, 7, 2}, 3)});
}

TEST_CASE("routed_attention equals its dense reference: random lists with repeats and empty slots, every broadcast, dropout") {
  const int64_t B = 2, H = 3, N = 41;
  Tensor kpm = padding_mask(B, N, 5);
  uint32_t seed = 1;
  // (B', H') of the query and the key lists.
  const std::vector<std::pair<int64_t, int64_t>> forms = {{B, H}, {1, 1}, {1, H}, {B, 1}};
  for (size_t f = 0; f < forms.size(); ++f)
    for (bool causal : {false, true})
      for (double drop : {0.0, 0.3}) {  // with a rate: the weights the reference drops, list after list
      INFO("lists ", forms[f].first, " x ", forms[f].second, " causal ", causal, " dropout ", drop);
      // Both generators mid-stream at one state (a kernel ignoring the reserved counter0 would fail).
      Generator g_fast(41), g_ref(41);
      g_fast.reserve(999);
      g_ref.reserve(999);
      Tensor qm = random_lists(forms[f].first, forms[f].second, 5, 9, N, 0.15, seed++);
      Tensor km = random_lists(forms[(f + 1) % forms.size()].first, forms[(f + 1) % forms.size()].second, 5, 13, N,
                               0.15, seed++);
      // Half the cases pad the key lists with empty slots to 2100 a list: the backward then runs its lists in
      // chunks of max(N, 2048) / wk = 1 (list c's dropout counters from chunk c; the slot gradients added
      // into dq, dk, dv chunk after chunk); with 13 slots the 5 lists are one chunk.
      if (f % 2 == 1) {
        const Shape ks = km.shape();
        km = cat({km, Tensor::full({ks[0], ks[1], ks[2], 2100 - ks[3]}, -1.0, kInt64)}, 3);
      }
      Tensor q = leaf64({B, H, N, 6}, seed), k = leaf64({B, H, N, 6}, seed + 1), v = leaf64({B, H, N, 5}, seed + 2);
      Tensor w = leaf64({B, H, N, 5}, seed + 3).detach();
      seed += 4;
      Tensor fast = routed_attention(q, k, v, qm, km, kpm, 0.3, causal, drop, g_fast);
      sum(fast * w).backward();
      const std::vector<Tensor> g = {q.grad(), k.grad(), v.grad()};
      q.zero_grad();
      k.zero_grad();
      v.zero_grad();
      Tensor ref = nn::routed_attention_dense_reference(q, k, v, qm, km, kpm, 0.3, causal, drop, g_ref);
      CHECK(g_fast.offset() == g_ref.offset());
      sum(ref * w).backward();
      check_close(fast, ref, 1e-12);
      check_close(g[0], q.grad(), 1e-12);
      check_close(g[1], k.grad(), 1e-12);
      check_close(g[2], v.grad(), 1e-12);
      if (drop > 0) CHECK(max_abs_diff(fast, routed_attention(q, k, v, qm, km, kpm, 0.3, causal)) > 1e-3);
    }
}

TEST_CASE("routed_attention averages a query's outputs over the lists where it sees a key") {
  // Query 2 sits in two lists: list 0 with keys 0 and 1, list 1 with key 3 alone, which the causal
  // mask hides. List 1 gives it no output, so its output is list 0's, not half of it (the count took
  // every list holding the query: routing's causal queries read 1/k of their attention).
  const int64_t N = 4;
  Tensor q = leaf64({1, 1, N, 3}, 7), k = leaf64({1, 1, N, 3}, 8), v = leaf64({1, 1, N, 2}, 9);
  Tensor qm = Tensor::from_vector(std::vector<int64_t>{2, 2}, {1, 1, 2, 1});
  Tensor km = Tensor::from_vector(std::vector<int64_t>{0, 1, 3, -1}, {1, 1, 2, 2});
  Generator g(1);
  Tensor out = routed_attention(q, k, v, qm, km, Tensor(), 0.0, /*causal=*/true, 0.0, g);
  Tensor want = flash_attention(narrow(q, 2, 2, 1), narrow(k, 2, 0, 2), narrow(v, 2, 0, 2));
  check_close(narrow(out, 2, 2, 1), want, 1e-14);
  check_close(narrow(out, 2, 0, 2), Tensor::zeros({1, 1, 2, 2}, kFloat64), 0);  // in no list
  // Non-causal the key of list 1 counts: the mean of the two lists' outputs.
  Tensor both = routed_attention(q, k, v, qm, km, Tensor(), 0.0, /*causal=*/false, 0.0, g);
  Tensor alone = flash_attention(narrow(q, 2, 2, 1), narrow(k, 2, 3, 1), narrow(v, 2, 3, 1));
  check_close(narrow(both, 2, 2, 1), (want + alone) * 0.5, 1e-14);
  // The dense reference follows the same rule.
  check_close(nn::routed_attention_dense_reference(q, k, v, qm, km, Tensor(), 0.0, true, 0.0, g), out, 1e-14);
}

TEST_CASE("nn::routed_lists_attention reads a position outside 0 .. N - 1 as an empty slot, values and gradients") {
  // Its lists are not range-checked (no pass over them): positions N and beyond must act as -1,
  // never index past the token axis (they did, in the slot index's scatters, from 9f3b2f3 until its review).
  const int64_t N = 5;
  const Tensor lists_out = Tensor::from_vector(std::vector<int64_t>{0, 1, 7, 2, 3, 5, 4, 9}, {1, 1, 2, 4});
  const Tensor lists_in = Tensor::from_vector(std::vector<int64_t>{0, 1, -1, 2, 3, -1, 4, -1}, {1, 1, 2, 4});
  auto run = [&](const Tensor& lists) {
    Tensor q = leaf64({1, 2, N, 3}, 17), k = leaf64({1, 2, N, 3}, 18), v = leaf64({1, 2, N, 2}, 19);
    Tensor out = nn::routed_lists_attention(q, k, v, lists, lists, Tensor(), 0.0, false, 0.0);
    Generator gw(3);
    sum(out * rand(out.shape(), kFloat64, gw, -1, 1)).backward();
    return std::vector<Tensor>{out, q.grad(), k.grad(), v.grad()};
  };
  const std::vector<Tensor> got = run(lists_out), want = run(lists_in);
  for (size_t i = 0; i < got.size(); ++i) check_close(got[i], want[i], 0);
}

TEST_CASE("routed_attention keeps no per-list scores: its forward peak stays near full attention's") {
  // N = 1024 in 32 lists of 32 queries and 64 keys: dense gathered scores, weights and
  // masks would add 3 x (32 x 32 x 64) per head beyond q, k, v; the op keeps each slot's
  // output and log-sum-exp, and the count of lists per position.
  const int64_t B = 1, H = 4, N = 1024, D = 64;
  Generator g(3);
  Tensor q = randn({B, H, N, D}, kFloat32, g), k = randn({B, H, N, D}, kFloat32, g), v = randn({B, H, N, D}, kFloat32, g);
  Tensor qm = random_lists(1, H, 32, 32, N, 0.0, 11), km = random_lists(1, H, 32, 64, N, 0.0, 12);
  q.set_requires_grad(true);
  reset_peak_memory();
  const int64_t before = memory_stats().live_bytes;
  Tensor out = routed_attention(q, k, v, qm, km);
  const int64_t routed = memory_stats().peak_bytes - before;
  out = Tensor();
  reset_peak_memory();
  Tensor full = flash_attention(q, k, v);
  const int64_t flash = memory_stats().peak_bytes - before;
  CAPTURE(routed);
  CAPTURE(flash);
  // The slot outputs (the size of out), the output, the counts and the slot index: about
  // twice flash attention's out and lse. Gathered copies of q, k, v alone would add 3x.
  CHECK(routed < 5 * flash / 2);
}

TEST_CASE("routed_attention's backward holds its key-slot gradients a chunk of lists at a time") {
  // The fixed sparse pattern at N = 2048 (blocks of 32, summaries of 8, the defaults): every key
  // list repeats the other blocks' summaries, 64 lists of 536 key slots, 16.75 N slot rows. Whole,
  // their dk, dv rows (2 x 16.75 N x 64 per head) would dominate the backward's peak (at N = 1024,
  // 8.75 N rows whole made 5.1x flash attention's); in chunks of N / wk lists it is 1.57x (16.5 MB
  // against 10.5). Below N = 2048 a chunk holds up to 2048 rows (kernel calls): at N = 1024 that
  // is 2.1x (11.1 MB against 5.3), where chunks of N rows made 1.6x: held under 2.5x there.
  for (const auto& [N, bound] : {std::pair<int64_t, double>{2048, 2.0}, {1024, 2.5}}) {
    CAPTURE(N);
    const int64_t B = 1, H = 4, D = 64;
    Generator g(5);
    Tensor q = randn({B, H, N, D}, kFloat32, g), k = randn({B, H, N, D}, kFloat32, g),
           v = randn({B, H, N, D}, kFloat32, g);
    Tensor qm, km;
    nn::fixed_sparse_members(N, 32, 8, false, qm, km);
    for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
    auto peak_of = [&](const std::function<Tensor()>& f) {
      reset_peak_memory();
      const int64_t before = memory_stats().live_bytes;
      sum(f()).backward();
      const int64_t peak = memory_stats().peak_bytes - before;
      for (Tensor* t : {&q, &k, &v}) t->zero_grad();
      return peak;
    };
    const int64_t routed = peak_of([&] { return routed_attention(q, k, v, qm, km); });
    const int64_t flash = peak_of([&] { return flash_attention(q, k, v); });
    CAPTURE(routed);
    CAPTURE(flash);
    CHECK(double(routed) < bound * double(flash));
  }
}

TEST_CASE("routed attention rejects bad input with the shapes in the message") {
  Tensor q = leaf64({1, 2, 4, 3}), k = leaf64({1, 2, 4, 3}), v = leaf64({1, 2, 4, 2});
  Tensor qm = ti64({0, 1, 2, 3}, {1, 1, 2, 2}), km = ti64({0, 1, 2, -1, 3, 3}, {1, 1, 2, 3});
  CHECK_THROWS_MSG(routed_attention(q, leaf64({1, 2, 5, 3}), leaf64({1, 2, 5, 2}), qm, km), ShapeError,
                   "[routed_attention] self-attention only: q has 4 positions, k 5");
  CHECK_THROWS_MSG(routed_attention(q, k, leaf64({1, 2, 3, 2}), qm, km), ShapeError,
                   "[routed_attention] inconsistent shapes: q (1,2,4,3), k (1,2,4,3), v (1,2,3,2)");
  CHECK_THROWS_MSG(routed_attention(q, k, v, qm, km, Tensor::zeros({1, 5}, kBool)), ShapeError,
                   "[routed_attention] key_padding_mask must be bool (B, N) = (1, 4), got bool (1,5)");
  CHECK_THROWS_MSG(routed_attention(q, k, v, qm, km, Tensor(), -1.0), ValueError,
                   "[routed_attention] scale must be finite and >= 0");
  CHECK_THROWS_MSG(routed_attention(q, k, v, ti64({0, 1, 2}, {1, 1, 3, 1}), km), ShapeError,
                   "[routed_attention] query_members (1,1,3,1) and key_members (1,1,2,3) must have the same number "
                   "of lists C");
  CHECK_THROWS_MSG(routed_attention(q, k, v, qm, ti64({0, 4, 2, -1, 3, 3}, {1, 1, 2, 3})), IndexError,
                   "[routed_attention] member position 4 at flat position 1 of key_members is out of range [-1, 4)");
  CHECK_THROWS_MSG(routed_attention(q, k, v, qm, fake_cuda({1, 1, 2, 3}, kInt64)), DeviceError,
                   "[routed_attention] tensors are on different devices");
  CHECK_THROWS_MSG(routed_attention(Tensor(), k, v, qm, km), ValueError, "[routed_attention]", "q");
  CHECK_THROWS_MSG(routed_attention(q, k, v, qm, Tensor::zeros({1, 1, 2, 0}, kInt64)), ShapeError,
                   "[routed_attention] key_members (1,1,2,0) has lists of no slot (w = 0)");
  for (double rate : {1.0, -0.1, std::nan("")})
    CHECK_THROWS_MSG(routed_attention(q, k, v, qm, km, Tensor(), 0.0, false, rate), ValueError,
                     "[routed_attention] dropout must be in [0, 1), got");
  // An empty sequence: an empty output that still carries gradients (zeros) to q, k, v.
  Tensor e = leaf64({1, 2, 0, 3});
  Tensor out = routed_attention(e, e, leaf64({1, 2, 0, 2}), Tensor::full({1, 1, 2, 2}, -1.0, kInt64),
                                Tensor::full({1, 1, 2, 2}, -1.0, kInt64));
  CHECK(out.shape() == Shape{1, 2, 0, 2});
  sum(out).backward();
  CHECK(e.grad().shape() == e.shape());
}

}  // TEST_SUITE

// ---------------------------------------------------------------- CUDA parity
// The fused attention kernels (kernels/attention/attention_cuda.cu) against the
// CPU: flash_attention and block_attention, forward and input gradients, with
// padding, causal, Nq != Nk, sizes off the 32 x 32 CUDA tiles (and off the CPU's
// 64 x 128), fully masked rows, empty slots, tokens in no slot, look_back 0/1/2
// with look_ahead, self mask, shared and per-head member tables, head sizes that
// need more than 48 KiB of shared memory; float64 gradchecks on the GPU.
//
// Tolerances: both devices accumulate the dot products in float32 in a different
// order (BLAS tiles on the CPU, per-thread loops on the GPU), over Dk <= 128 and
// windows of up to a few hundred keys: atol 1e-5, rtol 1e-4 (the default) hold
// for the forward; gradients sum over every query, so they get rtol 1e-3.

namespace {

// lse with its -inf entries (tokens with nothing to attend to) as 0, so a
// projection of it has finite gradients.
Tensor finite_lse(const Tensor& lse) { return masked_fill(lse, eq(lse, -INFINITY), 0.0); }

ParityOptions grad_tolerance() {
  ParityOptions o;
  o.rtol = 1e-3;
  return o;
}

}  // namespace

TEST_SUITE("ops/attention") {

PARITY_CASE(flash_attention) {
  struct Case {
    int64_t B, H, Nq, Nk, Dk, Dv, padded;
    double scale;
  };
  // Off-tile sizes, Nq > Nk (causal: early queries see nothing), Nq < Nk, one
  // row, head sizes 64 and 128 (over 48 KiB of shared memory in the backward).
  const std::vector<Case> cases = {{2, 2, 70, 45, 16, 24, 5, 0.0}, {1, 3, 45, 70, 8, 8, 0, 0.7},
                                   {2, 1, 100, 100, 64, 64, 31, 0.0}, {1, 1, 1, 33, 4, 4, 0, 0.0},
                                   {1, 2, 40, 40, 128, 128, 3, 0.0}};
  uint64_t seed = 100;
  for (const Case& c : cases)
    for (bool causal : {false, true}) {
      INFO("Nq ", c.Nq, " Nk ", c.Nk, " Dk ", c.Dk, " causal ", causal);
      Tensor kpm = c.padded ? padding_mask(c.B, c.Nk, c.padded) : Tensor();
      check_parity(
          "flash_attention",
          [&](const std::vector<Tensor>& x) {
            return flash_attention(x[0], x[1], x[2], kpm.defined() ? kpm.to(x[0].device()) : Tensor(), c.scale,
                                   causal);
          },
          {leaf32({c.B, c.H, c.Nq, c.Dk}, seed++), leaf32({c.B, c.H, c.Nk, c.Dk}, seed++),
           leaf32({c.B, c.H, c.Nk, c.Dv}, seed++)},
          grad_tolerance());
    }
  // Through lse too (flash_attention_with_lse: the kernels' dlse), one case each way.
  for (bool causal : {false, true})
    check_parity(
        "flash_attention",
        [&](const std::vector<Tensor>& x) {
          FlashAttentionResult r =
              flash_attention_with_lse(x[0], x[1], x[2], padding_mask(2, 45, 6).to(x[0].device()), 0.0, causal);
          return cat({reshape(r.out, {2 * 2 * 45 * 24}), reshape(finite_lse(r.lse), {2 * 2 * 45})}, 0);
        },
        {leaf32({2, 2, 45, 16}, seed++), leaf32({2, 2, 45, 16}, seed++), leaf32({2, 2, 45, 24}, seed++)},
        grad_tolerance());
  // Every key of batch 1 padded: zeros and zero gradients on both devices.
  Tensor all = padding_mask(2, 20, 20);
  check_parity("flash_attention",
               [&](const std::vector<Tensor>& x) { return flash_attention(x[0], x[1], x[2], all.to(x[0].device())); },
               {leaf32({2, 2, 9, 8}, 7), leaf32({2, 2, 20, 8}, 8), leaf32({2, 2, 20, 8}, 9)}, grad_tolerance());
}

// On CUDA the op takes the GEMM path; the fused CUDA kernel (the one block_attention and routed_attention run
// through their maps) is checked here on its own, both against the CPU's fused kernel.
CUDA_TEST_CASE("flash attention's fused kernel and GEMM path on CUDA equal the CPU's fused kernel") {
  for (const KernelCase& c : kKernelCases) {
    CAPTURE(c.Nq);
    CAPTURE(c.Nk);
    CAPTURE(c.causal);
    CAPTURE(c.chunk);
    CAPTURE(c.splits);
    const std::vector<Tensor> want = run_flash_path(c, FlashPath::kFusedCpu, Device::cpu());
    check_same_paths(c, want, run_flash_path(c, FlashPath::kGemm, Device::cuda(0)));
    check_same_paths(c, want, run_flash_path(c, FlashPath::kFusedCuda, Device::cuda(0)));
    // Attention dropout: the CUDA row kernels draw the CPU's weights (the 70000-row case too: its grid stride).
    const std::vector<Tensor> dropped = run_flash_path(c, FlashPath::kFusedCpu, Device::cpu(), 0.3);
    check_same_paths(c, dropped, run_flash_path(c, FlashPath::kGemm, Device::cuda(0), 0.3));
  }
}

// The NaN rule on CUDA: the scalar kernels' warp maxima and the tensor-core kernels' fmaxf dropped a NaN, and
// their last step wrote a row with a NaN sum as one with nothing allowed; LSH's rounds combine the same way.
CUDA_TEST_CASE("flash and block attention on CUDA: a NaN score makes its row NaN, a masked one does not") {
  check_nan_rows({NanPath::kFlashFusedCuda, NanPath::kFlashGemm, NanPath::kBlockFusedCuda, NanPath::kBlockGemm},
                 Device::cuda(0), kFloat64, 4);
  check_nan_rows({NanPath::kFlashFusedCuda, NanPath::kFlashGemm, NanPath::kFlashMmaCuda, NanPath::kBlockFusedCuda,
                  NanPath::kBlockMmaCuda, NanPath::kBlockOp},
                 Device::cuda(0), kFloat32, 64);
#ifdef CF_WITH_CUDA
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor per_round = Tensor::from_vector(std::vector<double>{1, 2, nan, 3, 4, nan}, {1, 2, 1, 3}).to(Device::cuda(0));
  Tensor combined = Tensor::empty({1, 1, 1, 3}, kFloat64, Device::cuda(0));
  kernels::rounds_combine_cuda(per_round, 2, combined);
  for (double x : values(combined.to(Device::cpu()))) CHECK(std::isnan(x));
#endif
}

// block_attention on CUDA takes the GEMM path for large calls and the fused kernel below: both against the CPU.
CUDA_TEST_CASE("block attention's fused kernel and GEMM path on CUDA equal the CPU's fused kernel") {
  const bool tf32 = cf::cuda::allow_tf32();
  cf::cuda::set_allow_tf32(false);  // the GEMMs in full float32, whatever an earlier test left
  for (const BlockCase& c : kBlockCases) {
    CAPTURE(c.N);
    CAPTURE(c.C);
    CAPTURE(c.rounds);
    CAPTURE(c.chunk);
    const std::vector<Tensor> want = run_block_path(c, BlockPath::kFusedCpu, Device::cpu());
    check_same_block_paths(c, want, run_block_path(c, BlockPath::kGemm, Device::cuda(0)));
    check_same_block_paths(c, want, run_block_path(c, BlockPath::kFusedCuda, Device::cuda(0)));
    // Attention dropout: the CUDA block row kernels draw the CPU's weights.
    check_same_block_paths(c, run_block_path(c, BlockPath::kFusedCpu, Device::cpu(), 0.3),
                           run_block_path(c, BlockPath::kGemm, Device::cuda(0), 0.3));
  }
  cf::cuda::set_allow_tf32(tf32);
}

// The float32 tensor-core kernels (attention_mma_cuda.cu, head size 64) against the CPU's fused kernel: several
// query and key tiles with remainders, padding with a fully padded batch and its dlse -inf, causal with
// Nq > Nk (rows with no key) and Nq < Nk, one row, one exact tile. 3xTF32 keeps the float32 tolerance; plain
// TF32 (the user's opt-in) rounds every operand to 11 bits: scores of a few units off by about 1e-3, so 1e-2.
const std::vector<KernelCase> kMmaCases = {
    {2, 2, 130, 200, 64, 64, true, false, 0, kFloat32}, {2, 1, 70, 45, 64, 64, true, true, 0, kFloat32},
    {1, 3, 45, 150, 64, 64, false, true, 0, kFloat32},  {1, 1, 1, 33, 64, 64, false, false, 0, kFloat32},
    {1, 2, 64, 64, 64, 64, false, false, 0, kFloat32}};

CUDA_TEST_CASE("flash attention's float32 tensor-core kernels on CUDA equal the CPU's fused kernel, in 3xTF32 and in TF32") {
  const bool tf32 = cf::cuda::allow_tf32();
  for (const KernelCase& c : kMmaCases) {
    CAPTURE(c.Nq);
    CAPTURE(c.Nk);
    CAPTURE(c.causal);
    const std::vector<Tensor> want = run_flash_path(c, FlashPath::kFusedCpu, Device::cpu());
    cf::cuda::set_allow_tf32(false);
    const std::vector<Tensor> three = run_flash_path(c, FlashPath::kMmaCuda, Device::cuda(0));
    check_same_paths(c, want, three);
    cf::cuda::set_allow_tf32(true);
    const std::vector<Tensor> one = run_flash_path(c, FlashPath::kMmaCuda, Device::cuda(0));
    check_same_paths(c, want, one, 1e-2);
    CHECK(max_abs_diff(three[0], one[0]) > 1e-6);  // plain TF32 did run: it rounds differently
  }
  cf::cuda::set_allow_tf32(tf32);
}

// Block tables for the tensor-core kernels (float32, head size 64): causal with look-ahead and padding, blocks
// wider than a 64-row tile with a shared table and the self mask, look back 0 without dlse; rounds (LSH: a
// table per output head, causal, self mask, padding; and one table shared by every round), whose backward adds
// round after round into one dq, dk, dv.
const std::vector<BlockCase> kMmaBlockCases = {
    {2, 2, 300, 64, 64, 10, 32, 2, 1, 1, false, true, true, false, true, 4, kFloat32},
    {1, 2, 500, 64, 64, 5, 100, 1, 0, 1, true, false, false, true, true, 0, kFloat32},
    {2, 1, 256, 64, 64, 4, 64, 0, 0, 1, false, true, false, false, false, 0, kFloat32},
    {2, 2, 200, 64, 64, 4, 64, 1, 0, 3, false, true, true, true, true, 2, kFloat32},
    {1, 3, 130, 64, 64, 3, 50, 1, 0, 2, true, false, false, false, true, 0, kFloat32}};

CUDA_TEST_CASE("block attention's float32 tensor-core kernels on CUDA equal the CPU's fused kernel, in 3xTF32 and in TF32") {
  const bool tf32 = cf::cuda::allow_tf32();
  for (const BlockCase& c : kMmaBlockCases) {
    CAPTURE(c.N);
    CAPTURE(c.w);
    const std::vector<Tensor> want = run_block_path(c, BlockPath::kFusedCpu, Device::cpu());
    cf::cuda::set_allow_tf32(false);
    const std::vector<Tensor> three = run_block_path(c, BlockPath::kMmaCuda, Device::cuda(0));
    check_same_block_paths(c, want, three);
    cf::cuda::set_allow_tf32(true);
    const std::vector<Tensor> one = run_block_path(c, BlockPath::kMmaCuda, Device::cuda(0));
    check_same_block_paths(c, want, one, 1e-2);
    CHECK(max_abs_diff(three[0], one[0]) > 1e-6);  // plain TF32 did run
  }
  cf::cuda::set_allow_tf32(tf32);
}

// kAuto chooses the forward's and the backward's path separately (block_attention_mma_preferred: wide blocks run
// the tensor-core forward and the GEMM or fused backward), so each backward must take any forward's out and lse:
// every mix of the CUDA paths equals the CPU.
CUDA_TEST_CASE("block attention on CUDA: a backward on another path than its forward's equals the CPU") {
  const bool tf32 = cf::cuda::allow_tf32();
  cf::cuda::set_allow_tf32(false);
  const std::vector<BlockPath> cuda_paths = {BlockPath::kMmaCuda, BlockPath::kGemm, BlockPath::kFusedCuda};
  for (const BlockCase& c : kMmaBlockCases) {
    CAPTURE(c.N);
    CAPTURE(c.w);
    const std::vector<Tensor> want = run_block_path(c, BlockPath::kFusedCpu, Device::cpu());
    for (BlockPath forward : cuda_paths)
      for (BlockPath backward : cuda_paths) {
        if (forward == backward) continue;  // each path alone: the tests above
        CAPTURE(int(forward));
        CAPTURE(int(backward));
        check_same_block_paths(c, want, run_block_path(c, forward, Device::cuda(0), 0.0, backward));
      }
  }
  cf::cuda::set_allow_tf32(tf32);
}

// routed_attention's float32 tensor-core kernels (slot-order outputs and gradients through the map's orow and
// krow) against the CPU's kernel: lists with repeats and empty slots, per (b, h) and broadcast over batch or
// heads, query and key lists longer than one 64-row tile (slots 64 on come from a second tile), padding,
// causal and not; 3xTF32 at the float32 tolerance, plain TF32 at 1e-2 (and not equal to 3xTF32).
CUDA_TEST_CASE("routed attention's float32 tensor-core kernels on CUDA equal the CPU's kernel, in 3xTF32 and in TF32") {
  const bool tf32 = cf::cuda::allow_tf32();
  const int64_t B = 2, H = 2, N = 150, D = 64, C = 5, wq = 100, wk = 90;
  // (B', H') of the query lists and of the key lists.
  const std::vector<std::array<int64_t, 4>> forms = {{B, H, 1, 1}, {1, 1, B, H}, {1, H, B, 1}};
  uint32_t seed = 40;
  for (const std::array<int64_t, 4>& form : forms)
    for (bool causal : {false, true}) {
      CAPTURE(form[0]);
      CAPTURE(form[1]);
      CAPTURE(causal);
      const Tensor qm = random_lists(form[0], form[1], C, wq, N, 0.15, seed++);
      const Tensor km = random_lists(form[2], form[3], C, wk, N, 0.15, seed++);
      const Tensor kpm = padding_mask(B, N, 7);
      auto rnd = [&](const Shape& sh) { return to(leaf64(sh, seed++, -2.0, 2.0).detach(), kFloat32); };
      const Tensor q = rnd({B, H, N, D}), k = rnd({B, H, N, D}), v = rnd({B, H, N, D}), dout = rnd({B, H, C * wq, D});
      kernels::RoutedAttentionParams p;
      p.scale = 0.125;
      p.causal = causal;
      auto run = [&](bool cuda) {
        const Device d = cuda ? Device::cuda(0) : Device::cpu();
        std::vector<Tensor> t = {Tensor::empty({B, H, C * wq, D}, kFloat32, d), Tensor::empty({B, H, C * wq}, kFloat32, d),
                                 Tensor::empty({B, H, C * wq, D}, kFloat32, d), Tensor::empty({B, H, C * wk, D}, kFloat32, d),
                                 Tensor::empty({B, H, C * wk, D}, kFloat32, d)};
        const Tensor qd = q.to(d), kd = k.to(d), vd = v.to(d), qmd = qm.to(d), kmd = km.to(d), md = kpm.to(d),
                     gd = dout.to(d);
        if (cuda) {
          kernels::routed_attention_forward_mma_cuda(qd, kd, vd, qmd, kmd, md, p, t[0], t[1]);
          kernels::routed_attention_backward_mma_cuda(qd, kd, vd, qmd, kmd, md, p, t[0], t[1], gd, t[2], t[3], t[4]);
        } else {
          kernels::routed_attention_forward_cpu(qd, kd, vd, qmd, kmd, md, p, t[0], t[1]);
          kernels::routed_attention_backward_cpu(qd, kd, vd, qmd, kmd, md, p, t[0], t[1], gd, t[2], t[3], t[4]);
        }
        for (Tensor& x : t) x = x.to(Device::cpu());
        return t;
      };
      const std::vector<Tensor> want = run(false);
      std::vector<Tensor> three;
      for (bool allow : {false, true}) {
        CAPTURE(allow);
        cf::cuda::set_allow_tf32(allow);
        const std::vector<Tensor> got = run(true);
        const double tol = allow ? 1e-2 : 1e-4;
        int64_t empty = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          CAPTURE(i);
          const std::vector<double> a = values(want[i]), b = values(got[i]);
          REQUIRE(a.size() == b.size());
          int64_t bad = 0;  // counted, so a failure reports once per tensor
          double worst = 0.0;
          for (size_t e = 0; e < a.size(); ++e) {
            if (std::isinf(a[e])) {  // an empty query slot, or one with nothing allowed: -inf on both
              bad += b[e] != a[e];
              ++empty;
            } else {
              const double err = std::abs(a[e] - b[e]) / (1.0 + std::abs(a[e]));
              worst = std::max(worst, err);
              bad += !(err <= tol);
            }
          }
          CAPTURE(worst);
          CHECK(bad == 0);
        }
        CHECK(empty > 0);
        if (!allow) three = got;
        else CHECK(max_abs_diff(three[0], got[0]) > 1e-6);  // plain TF32 did run
      }
    }
  cf::cuda::set_allow_tf32(tf32);
}

// The ops take the tensor-core kernels under the mma setting exactly where they can read q, k, v as they are.
CUDA_TEST_CASE("flash, block and routed attention take the float32 tensor-core kernels under the mma setting") {
  const kernels::FlashAttentionPath flash_before = kernels::flash_attention_path();
  const kernels::BlockAttentionPath block_before = kernels::block_attention_path();
  const Device d = Device::cuda(0);
  const Tensor q = Tensor::zeros({1, 2, 100, 64}, kFloat32, d), q32 = Tensor::zeros({1, 2, 100, 32}, kFloat32, d);
  const Tensor wide = Tensor::zeros({1, 2, 100, 65}, kFloat32, d);
  const Tensor odd = slice(wide, 3, 1, 65);  // head size 64, not contiguous
  const Tensor members = Tensor::zeros({1, 2, 4, 25}, kInt64, d);
  kernels::BlockAttentionParams p;
  p.offsets = {0, -1};
  const kernels::RoutedAttentionPath routed_before = kernels::routed_attention_path();
  const Tensor lists = Tensor::zeros({1, 2, 4, 25}, kInt64, d);
  kernels::set_routed_attention_path(kernels::RoutedAttentionPath::kMma);
  CHECK(kernels::routed_attention_takes_mma(q, q, q, lists, lists));
  CHECK_FALSE(kernels::routed_attention_takes_mma(q, q, q, lists, lists, 0.1));  // dropout: the fused kernel
  CHECK_FALSE(kernels::routed_attention_takes_mma(odd, q, q, lists, lists));
  kernels::set_routed_attention_path(kernels::RoutedAttentionPath::kAuto);
  CHECK(kernels::routed_attention_takes_mma(q, q, q, lists, lists));
  CHECK_FALSE(kernels::routed_attention_takes_mma(q, q, q, lists, lists, 0.1));
  kernels::set_routed_attention_path(kernels::RoutedAttentionPath::kFused);
  CHECK_FALSE(kernels::routed_attention_takes_mma(q, q, q, lists, lists));
  kernels::set_routed_attention_path(routed_before);
  kernels::set_flash_attention_path(kernels::FlashAttentionPath::kMma);
  kernels::set_block_attention_path(kernels::BlockAttentionPath::kMma);
  CHECK(kernels::flash_attention_takes_mma(q, q, q));
  CHECK_FALSE(kernels::flash_attention_takes_mma(q, q, q, 0.1));  // dropout: the GEMM path
  CHECK(kernels::block_attention_takes_mma(q, q, q, members, p));
  {
    kernels::BlockAttentionParams dropping = p;
    dropping.dropout = 0.1;
    CHECK_FALSE(kernels::block_attention_takes_mma(q, q, q, members, dropping));
  }
  CHECK_FALSE(kernels::flash_attention_takes_mma(q32, q32, q32));
  CHECK_FALSE(kernels::flash_attention_takes_mma(odd, q, q));
  CHECK_FALSE(kernels::block_attention_takes_mma(odd, q, q, members, p));
  {
    // Rounds (LSH): a table per output head h * R + r, or one shared; a table with q's heads is no round table.
    kernels::BlockAttentionParams r = p;
    r.rounds = 3;
    CHECK(kernels::block_attention_takes_mma(q, q, q, Tensor::zeros({1, 6, 4, 25}, kInt64, d), r));
    CHECK(kernels::block_attention_takes_mma(q, q, q, Tensor::zeros({1, 1, 4, 25}, kInt64, d), r));
    CHECK_FALSE(kernels::block_attention_takes_mma(q, q, q, members, r));
    // kAuto takes rounds too (measured faster on an H200, attention.h); a wide table's blocks count every
    // round: 2 heads x 3 rounds x 25 blocks of 200 rows is at least one per multiprocessor (forward only),
    // the same table of one round is not.
    kernels::set_block_attention_path(kernels::BlockAttentionPath::kAuto);
    CHECK(kernels::block_attention_takes_mma(q, q, q, Tensor::zeros({1, 6, 4, 25}, kInt64, d), r));
    CHECK(kernels::block_attention_takes_mma(q, q, q, Tensor::zeros({1, 6, 25, 200}, kInt64, d), r));
    CHECK_FALSE(kernels::block_attention_takes_mma(q, q, q, Tensor::zeros({1, 6, 25, 200}, kInt64, d), r, true));
    CHECK_FALSE(kernels::block_attention_takes_mma(q, q, q, Tensor::zeros({1, 2, 25, 200}, kInt64, d), p));
    kernels::set_block_attention_path(kernels::BlockAttentionPath::kMma);
  }
  kernels::set_flash_attention_path(kernels::FlashAttentionPath::kAuto);
  kernels::set_block_attention_path(kernels::BlockAttentionPath::kAuto);
  CHECK_FALSE(kernels::flash_attention_takes_mma(q, q, q));
  // kAuto (block_attention_mma_preferred): blocks of at most 128 rows both ways; wider ones forward only, and
  // only with at least one block per multiprocessor.
  CHECK(kernels::block_attention_takes_mma(q, q, q, members, p));
  CHECK(kernels::block_attention_takes_mma(q, q, q, members, p, /*backward=*/true));
  CHECK_FALSE(kernels::block_attention_takes_mma(odd, q, q, members, p));
  const Tensor wide_few = Tensor::zeros({1, 2, 4, 200}, kInt64, d), wide_many = Tensor::zeros({1, 2, 200, 200}, kInt64, d);
  CHECK_FALSE(kernels::block_attention_takes_mma(q, q, q, wide_few, p));
  CHECK(kernels::block_attention_takes_mma(q, q, q, wide_many, p));
  CHECK_FALSE(kernels::block_attention_takes_mma(q, q, q, wide_many, p, /*backward=*/true));
  kernels::set_block_attention_path(kernels::BlockAttentionPath::kGemm);
  CHECK_FALSE(kernels::block_attention_takes_mma(q, q, q, members, p));
  kernels::set_flash_attention_path(flash_before);
  kernels::set_block_attention_path(block_before);
}

// Past the launch caps, so the slot and row kernels' grid-stride loops run their remainders: 1 M score rows
// (the row kernels' grid holds 65535 x 8 warps) and 33 M gathered elements (65536 x 256 threads), in one
// chunk. (Kept out of gpu_check.sh's sanitizer runs by its name: too slow under them.)
CUDA_TEST_CASE("block attention on CUDA past the launch caps: 1 M rows of scores equal the CPU's") {
  const bool tf32 = cf::cuda::allow_tf32();
  cf::cuda::set_allow_tf32(false);
  const BlockCase big{1, 16, 65536, 32, 32, 1024, 64, 0, 0, 1, false, false, false, false, true, 1024, kFloat32};
  check_same_block_paths(big, run_block_path(big, BlockPath::kFusedCpu, Device::cpu()),
                         run_block_path(big, BlockPath::kGemm, Device::cuda(0)));
  cf::cuda::set_allow_tf32(tf32);
}

CUDA_TEST_CASE("flash_attention float64 gradcheck on CUDA") {
  Tensor kpm = padding_mask(2, 6, 2).to(Device::cuda(0));
  for (bool causal : {false, true})
    check_grad_cuda("flash_attention",
                    [&](const std::vector<Tensor>& x) { return flash_attention(x[0], x[1], x[2], kpm, 0.0, causal); },
                    {leaf64({2, 2, 5, 3}, 1), leaf64({2, 2, 6, 3}, 2), leaf64({2, 2, 6, 2}, 3)});
  for (double rate : {0.0, 0.4})
    for (bool causal : {false, true})
      check_grad_cuda("flash_attention",
                      [&](const std::vector<Tensor>& x) { return out_and_lse_loss(x, kpm, causal, rate); },
                      {leaf64({2, 2, 5, 3}, 1), leaf64({2, 2, 6, 3}, 2), leaf64({2, 2, 6, 2}, 3)});
  // With dropout (the GEMM path's row kernels): a fresh generator per evaluation.
  for (bool causal : {false, true})
    check_grad_cuda("flash_attention",
                    [&](const std::vector<Tensor>& x) {
                      Generator g(17);
                      return flash_attention(x[0], x[1], x[2], kpm, 0.0, causal, 0.4, g);
                    },
                    {leaf64({2, 2, 5, 3}, 1), leaf64({2, 2, 6, 3}, 2), leaf64({2, 2, 6, 2}, 3)});
}

CUDA_TEST_CASE("flash_attention with dropout on CUDA drops the CPU's weights, under the mma setting too") {
  const kernels::FlashAttentionPath before = kernels::flash_attention_path();
  for (auto path : {kernels::FlashAttentionPath::kAuto, kernels::FlashAttentionPath::kMma}) {
    kernels::set_flash_attention_path(path);  // a rate takes the GEMM path either way
    for (bool causal : {false, true}) {
      CAPTURE(causal);
      const Tensor kpm = padding(2, 300, {{1, 4}, {1, 250}});
      auto leaf = [](const Shape& s, uint64_t seed) {
        Tensor t = to(leaf64(s, seed, -2.0, 2.0).detach(), kFloat32);
        t.set_requires_grad(true);
        return t;
      };
      Tensor q = leaf({2, 2, 200, 64}, 1), k = leaf({2, 2, 300, 64}, 2), v = leaf({2, 2, 300, 64}, 3);
      const Tensor w = to(leaf64({2, 2, 200, 64}, 4).detach(), kFloat32);
      Generator gc(5), gg(5);
      gc.reserve(999);
      gg.reserve(999);
      Tensor cpu = flash_attention(q, k, v, kpm, 0.0, causal, 0.2, gc);
      sum(cpu * w).backward();
      const std::vector<Tensor> want = {cpu, q.grad(), k.grad(), v.grad()};
      Tensor qg = q.detach().to(Device::cuda(0)), kg = k.detach().to(Device::cuda(0)),
             vg = v.detach().to(Device::cuda(0));
      for (Tensor* t : {&qg, &kg, &vg}) t->set_requires_grad(true);
      Tensor gpu = flash_attention(qg, kg, vg, kpm.to(Device::cuda(0)), 0.0, causal, 0.2, gg);
      sum(gpu * w.to(Device::cuda(0))).backward();
      CHECK(gc.offset() == gg.offset());
      const std::vector<Tensor> got = {gpu, qg.grad(), kg.grad(), vg.grad()};
      for (size_t i = 0; i < want.size(); ++i) {
        CAPTURE(i);
        CHECK(max_abs_diff(want[i], got[i].to(Device::cpu())) <= 1e-4 * (1.0 + max_abs_diff(want[i], want[i] * 0.0)));
      }
    }
  }
  kernels::set_flash_attention_path(before);
}

PARITY_CASE(block_attention) {
  struct Case {
    int64_t B, H, Hm, N, w, holes, Dk, padded;
  };
  // w = 40 crosses the 32-row tiles; holes leave tokens in no slot; w = 5 gives
  // many small chunks; Dk 128 needs the shared-memory opt-in.
  const std::vector<Case> cases = {{2, 2, 1, 100, 40, 7, 16, 9}, {1, 2, 2, 50, 5, 0, 8, 0},
                                   {2, 1, 1, 64, 16, 3, 128, 4}};
  uint64_t seed = 200;
  uint32_t mseed = 1;
  for (const Case& c : cases) {
    Tensor members = random_members(c.B, c.Hm, c.N, c.w, c.holes, mseed++);
    Tensor kpm = c.padded ? padding_mask(c.B, c.N, c.padded) : Tensor();
    for (int64_t back : {0, 1, 2})
      for (bool causal : {false, true}) {
        BlockAttentionOptions o;
        o.look_back = back;
        o.look_ahead = back == 2 ? 1 : 0;
        o.causal = causal;
        o.self_mask = causal && back == 1;
        INFO("N ", c.N, " w ", c.w, " Hm ", c.Hm, " look_back ", back, " causal ", causal);
        std::vector<Tensor> in = {leaf32({c.B, c.H, c.N, c.Dk}, seed), leaf32({c.B, c.H, c.N, c.Dk}, seed + 1),
                                  leaf32({c.B, c.H, c.N, 12}, seed + 2)};
        seed += 3;
        auto run = [&](const std::vector<Tensor>& x) {
          const Device d = x[0].device();
          return block_attention(x[0], x[1], x[2], members.to(d), kpm.defined() ? kpm.to(d) : Tensor(), o);
        };
        check_parity("block_attention", [&](const std::vector<Tensor>& x) { return run(x).out; }, in,
                     grad_tolerance());
        // lse's own gradient path (LSH combines hashing rounds through it).
        check_parity("block_attention", [&](const std::vector<Tensor>& x) { return finite_lse(run(x).lse); }, in,
                     grad_tolerance());
      }
  }  // Rounds (LSH): a table per head and round over one q, k, v (or one shared); the backward adds
  // the rounds' gradients launch by launch. Holes: a token in no slot of one round
  // still gets the others' gradients.
  for (int64_t rounds : {int64_t(2), int64_t(3)}) {
    // rounds 3: one table shared by every head and round.
    Tensor members = random_members(2, rounds == 3 ? 1 : 2 * rounds, 70, 33, 4, mseed++);
    Tensor kpm = padding_mask(2, 70, 6);
    BlockAttentionOptions o;
    o.look_back = 1;
    o.causal = rounds == 3;
    o.self_mask = true;
    o.rounds = rounds;
    o.combine_rounds = rounds == 3;
    INFO("rounds ", rounds);
    std::vector<Tensor> in = {leaf32({2, 2, 70, 16}, seed), leaf32({2, 2, 70, 16}, seed + 1),
                              leaf32({2, 2, 70, 8}, seed + 2)};
    seed += 3;
    auto run = [&](const std::vector<Tensor>& x) {
      const Device d = x[0].device();
      return block_attention(x[0], x[1], x[2], members.to(d), kpm.to(d), o);
    };
    check_parity("block_attention", [&](const std::vector<Tensor>& x) { return run(x).out; }, in, grad_tolerance());
    check_parity("block_attention", [&](const std::vector<Tensor>& x) { return finite_lse(run(x).lse); }, in,
                 grad_tolerance());
  }
}

// Lists of 40 query slots (two 32-row tiles) and 70 key slots (three 32-key tiles),
// repeats, empty slots, padding, causal; shared, per-head and per-(b, h) lists; a head
// size that needs the shared-memory opt-in.
PARITY_CASE(routed_attention) {
  struct Case {
    int64_t Bq, Hq, Bk, Hk, N, C, wq, wk, Dk, Dv, padded;
  };
  // The last: head size 64 (the tensor-core kernels under CF_ROUTED_ATTENTION_PATH=mma), lists wider than a
  // 64-row tile, and key lists of more than N / 2 slots, so the backward takes one list at a time.
  const std::vector<Case> cases = {{2, 2, 2, 2, 100, 3, 40, 70, 16, 12, 9}, {1, 1, 1, 2, 60, 5, 12, 20, 8, 12, 0},
                                   {2, 1, 1, 1, 64, 2, 33, 40, 128, 12, 4}, {2, 2, 1, 2, 100, 3, 70, 70, 64, 64, 5}};
  uint64_t seed = 400;
  uint32_t lseed = 40;
  for (const Case& c : cases)
    for (bool causal : {false, true}) {
      INFO("N ", c.N, " C ", c.C, " wq ", c.wq, " wk ", c.wk, " causal ", causal);
      Tensor qm = random_lists(c.Bq, c.Hq, c.C, c.wq, c.N, 0.1, lseed++);
      Tensor km = random_lists(c.Bk, c.Hk, c.C, c.wk, c.N, 0.1, lseed++);
      Tensor kpm = c.padded ? padding_mask(2, c.N, c.padded) : Tensor();
      std::vector<Tensor> in = {leaf32({2, 2, c.N, c.Dk}, seed), leaf32({2, 2, c.N, c.Dk}, seed + 1),
                                leaf32({2, 2, c.N, c.Dv}, seed + 2)};
      seed += 3;
      check_parity("routed_attention",
                   [&](const std::vector<Tensor>& x) {
                     const Device d = x[0].device();
                     return routed_attention(x[0], x[1], x[2], qm.to(d), km.to(d),
                                             kpm.defined() ? kpm.to(d) : Tensor(), 0.0, causal);
                   },
                   in, grad_tolerance());
    }
}

CUDA_TEST_CASE("routed_attention float64 gradcheck on CUDA") {
  const Device d = Device::cuda(0);
  Tensor qm = random_lists(2, 1, 3, 4, 9, 0.2, 5).to(d), km = random_lists(1, 2, 3, 5, 9, 0.2, 6).to(d);
  Tensor kpm = padding_mask(2, 9, 2).to(d);
  for (bool causal : {false, true})
    check_grad_cuda("routed_attention",
                    [&](const std::vector<Tensor>& x) {
                      Tensor out = routed_attention(x[0], x[1], x[2], qm, km, kpm, 0.0, causal);
                      return sum(out * out);
                    },
                    {leaf64({2, 2, 9, 3}, 1), leaf64({2, 2, 9, 3}, 2), leaf64({2, 2, 9, 2}, 3)});
  // With attention dropout (the fused kernel's dropped weights): a fresh generator per evaluation.
  for (bool causal : {false, true})
    check_grad_cuda("routed_attention",
                    [&](const std::vector<Tensor>& x) {
                      Generator g(19);
                      Tensor out = routed_attention(x[0], x[1], x[2], qm, km, kpm, 0.0, causal, 0.4, g);
                      return sum(out * out);
                    },
                    {leaf64({2, 2, 9, 3}, 1), leaf64({2, 2, 9, 3}, 2), leaf64({2, 2, 9, 2}, 3)});
}

CUDA_TEST_CASE("routed attention's slot <-> token steps on CUDA give the CPU's bits and write every row") {
  // Positions from -3 to N + 2 (outside [0, N): empty slots), repeats, every list broadcast form, slots that see
  // no key (lse -inf, and NaN: not counted), lists of no slot and rows of no column; the outputs start as NaN
  // on both devices, so a row left unwritten fails.
  const Device gpu = Device::cuda(0);
  const int64_t B = 2, H = 3, N = 11;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int64_t> pos(-3, N + 2);
  const std::vector<std::pair<int64_t, int64_t>> forms = {{B, H}, {1, 1}, {1, H}, {B, 1}};
  for (const auto& [Bl, Hl] : forms)
    for (int64_t C : {0, 3})
      for (int64_t D : {0, 5}) {
        CAPTURE(Bl);
        CAPTURE(Hl);
        CAPTURE(C);
        CAPTURE(D);
        const int64_t w = 4, S = C * w;
        std::vector<int64_t> lv(size_t(Bl * Hl * S));
        for (int64_t& x : lv) x = pos(rng);
        const Tensor lists = Tensor::from_vector(lv, {Bl, Hl, C, w});
        Generator g(uint64_t(C * 10 + D + Bl * 100 + Hl));
        const Tensor slots = randn({B, H, S, D}, kFloat64, g), src = randn({B, H, S, D}, kFloat64, g);
        std::vector<double> lse = randn({B, H, S}, kFloat64, g).to_vector<double>();
        for (size_t i = 0; i < lse.size(); i += 3) lse[i] = -INFINITY;
        for (size_t i = 1; i < lse.size(); i += 7) lse[i] = NAN;
        const Tensor lse_t = Tensor::from_vector(lse, {B, H, S});
        const Tensor gtok = randn({B, H, N, D}, kFloat64, g), base = randn({B, H, N, D}, kFloat64, g);
        std::vector<std::vector<double>> results[2];
        for (int dev = 0; dev < 2; ++dev) {
          const Device d = dev ? gpu : Device::cpu();
          Tensor out = Tensor::full({B, H, N, D}, NAN, kFloat64).to(d), count = Tensor::full({B, H, N}, NAN, kFloat64).to(d);
          kernels::routed_slots_to_tokens(slots.to(d), lse_t.to(d), lists.to(d), out, count);
          Tensor gs = Tensor::full({B, H, S, D}, NAN, kFloat64).to(d);
          kernels::routed_tokens_to_slots(gtok.to(d), count, lists.to(d), gs);
          Tensor fresh = Tensor::full({B, H, N, D}, NAN, kFloat64).to(d), added = clone(base).to(d);
          kernels::routed_slots_add(src.to(d), lists.to(d), fresh, Tensor(), Tensor(), false);
          kernels::routed_slots_add(src.to(d), lists.to(d), added, slots.to(d), fresh, true);
          for (const Tensor& t : {out, count, gs, fresh, added}) results[dev].push_back(t.to(Device::cpu()).to_vector<double>());
        }
        for (size_t r = 0; r < results[0].size(); ++r) {
          CAPTURE(r);
          REQUIRE(results[0][r].size() == results[1][r].size());
          for (size_t i = 0; i < results[0][r].size(); ++i) {
            CHECK_FALSE(std::isnan(results[0][r][i]));
            CHECK(std::memcmp(&results[0][r][i], &results[1][r][i], sizeof(double)) == 0);
          }
        }
      }
}

CUDA_TEST_CASE("routed_attention with dropout on CUDA drops the CPU's weights, under the mma setting too") {
  // Lists of 40 queries and 70 keys (past the 32 x 32 tiles), C = 6 lists of N = 300, shared and per-head lists,
  // padding, causal; float32 and float64. The key lists padded with empty slots to 700 a list, so the backward
  // runs them in chunks of max(N, 2048) / 700 = 2 lists (chunks past list 0: their counters and their sums).
  const Device gpu = Device::cuda(0);
  const kernels::RoutedAttentionPath before = kernels::routed_attention_path();
  const Tensor kpm = padding_mask(2, 300, 9);
  for (auto path : {kernels::RoutedAttentionPath::kAuto, kernels::RoutedAttentionPath::kMma}) {
    kernels::set_routed_attention_path(path);  // a rate takes the fused kernel either way
    for (DType dt : {kFloat32, kFloat64})
      for (bool causal : {false, true}) {
        CAPTURE(causal);
        CAPTURE(dt);
        const Tensor qm = random_lists(2, 2, 6, 40, 300, 0.1, 21);
        const Tensor km = cat({random_lists(1, 1, 6, 70, 300, 0.1, 22), Tensor::full({1, 1, 6, 630}, -1.0, kInt64)}, 3);
        std::vector<Tensor> want, got;
        for (Device d : {Device::cpu(), gpu}) {
          auto leaf = [&](const Shape& s, uint64_t seed) {
            Tensor t = to(leaf64(s, seed, -2.0, 2.0).detach(), dt).to(d);
            t.set_requires_grad(true);
            return t;
          };
          Tensor q = leaf({2, 2, 300, 64}, 1), k = leaf({2, 2, 300, 64}, 2), v = leaf({2, 2, 300, 64}, 3);
          Generator g(7);
          g.reserve(555);
          Tensor out = routed_attention(q, k, v, qm.to(d), km.to(d), kpm.to(d), 0.0, causal, 0.3, g);
          sum(out * to(leaf64({2, 2, 300, 64}, 4).detach(), dt).to(d)).backward();
          CHECK(g.offset() == 555 + uint64_t(6 * 2 * 2 * 300 * 300));
          std::vector<Tensor>& into = d.is_cpu() ? want : got;
          for (const Tensor& t : {out, q.grad(), k.grad(), v.grad()}) into.push_back(t.detach().to(Device::cpu()));
          if (!d.is_cpu() && kernels::routed_attention_mma_supported(q, k, v, qm.to(d), km.to(d))) {
            // The tensor-core kernel, called with a rate, refuses it by name (the dispatch never sends one).
            kernels::RoutedAttentionParams p;
            p.dropout = 0.3;
            const Tensor o = Tensor::empty({2, 2, 6 * 40, 64}, dt, d), l = Tensor::empty({2, 2, 6 * 40}, dt, d);
            CHECK_THROWS_MSG(kernels::routed_attention_forward_mma_cuda(q.detach(), k.detach(), v.detach(), qm.to(d),
                                                                        km.to(d), Tensor(), p, o, l),
                             ValueError, "[routed_attention] the tensor-core kernel has no attention dropout", "0.3");
          }
        }
        const double tol = dt == kFloat64 ? 1e-12 : 1e-4;
        for (size_t i = 0; i < want.size(); ++i) {
          CAPTURE(i);
          CHECK(max_abs_diff(want[i], got[i]) <= tol * (1.0 + max_abs_diff(want[i], zeros_like(want[i]))));
        }
      }
  }
  kernels::set_routed_attention_path(before);
}

CUDA_TEST_CASE("block_attention float64 gradcheck on CUDA, fused kernel and GEMM path") {
  Tensor members = random_members(2, 1, 9, 3, 1, 5).to(Device::cuda(0));
  Tensor kpm = padding_mask(2, 9, 2).to(Device::cuda(0));
  BlockAttentionOptions o;
  o.look_back = 1;
  o.causal = true;
  o.self_mask = true;
  const kernels::BlockAttentionPath before = kernels::block_attention_path();
  for (auto path : {kernels::BlockAttentionPath::kFused, kernels::BlockAttentionPath::kGemm}) {
    kernels::set_block_attention_path(path);
    check_grad_cuda("block_attention",
                    [&](const std::vector<Tensor>& x) {
                      BlockAttentionResult r = block_attention(x[0], x[1], x[2], members, kpm, o);
                      return sum(r.out * r.out) + sum(masked_fill(r.lse, lt(r.lse, -1e4), 0.0));
                    },
                    {leaf64({2, 2, 9, 3}, 1), leaf64({2, 2, 9, 3}, 2), leaf64({2, 2, 9, 2}, 3)});
    // With attention dropout (the GEMM path's row kernels, whatever the setting): a fresh generator per evaluation.
    check_grad_cuda("block_attention",
                    [&](const std::vector<Tensor>& x) {
                      Generator g(29);
                      BlockAttentionOptions d = o;
                      d.dropout = 0.4;
                      d.generator = &g;
                      BlockAttentionResult r = block_attention(x[0], x[1], x[2], members, kpm, d);
                      return sum(r.out * r.out) + sum(masked_fill(r.lse, lt(r.lse, -1e4), 0.0));
                    },
                    {leaf64({2, 2, 9, 3}, 1), leaf64({2, 2, 9, 3}, 2), leaf64({2, 2, 9, 2}, 3)});
  }
  kernels::set_block_attention_path(before);
}

CUDA_TEST_CASE("block_attention with dropout on CUDA drops the CPU's weights under every path setting, and the kernels without dropout refuse a rate") {
  const kernels::BlockAttentionPath before = kernels::block_attention_path();
  const Device gpu = Device::cuda(0);
  const Tensor members = random_members(2, 1, 300, 20, 17, 9), kpm = padding_mask(2, 300, 7);
  for (auto path : {kernels::BlockAttentionPath::kAuto, kernels::BlockAttentionPath::kFused,
                    kernels::BlockAttentionPath::kMma}) {
    kernels::set_block_attention_path(path);  // a rate takes the GEMM path whatever the setting
    for (bool causal : {false, true}) {
      CAPTURE(causal);
      BlockAttentionOptions o;
      o.look_back = 1;
      o.causal = causal;
      o.dropout = 0.2;
      auto leaf = [](const Shape& s, uint64_t seed, Device d) {
        Tensor t = to(leaf64(s, seed, -2.0, 2.0).detach(), kFloat32).to(d);
        t.set_requires_grad(true);
        return t;
      };
      std::vector<Tensor> want, got;
      for (Device d : {Device::cpu(), gpu}) {
        Tensor q = leaf({2, 2, 300, 64}, 1, d), k = leaf({2, 2, 300, 64}, 2, d), v = leaf({2, 2, 300, 64}, 3, d);
        Generator g(5);
        g.reserve(777);
        o.generator = &g;
        BlockAttentionResult r = block_attention(q, k, v, members.to(d), kpm.to(d), o);
        sum(r.out * to(leaf64({2, 2, 300, 64}, 4).detach(), kFloat32).to(d)).backward();
        CHECK(g.offset() == 777 + uint64_t(2 * 2 * 300 * 300));
        std::vector<Tensor>& into = d.is_cpu() ? want : got;
        for (const Tensor& t : {r.out, r.lse, q.grad(), k.grad(), v.grad()}) into.push_back(t.detach().to(Device::cpu()));
      }
      for (size_t i = 0; i < want.size(); ++i) {
        CAPTURE(i);
        const double scale = 1.0 + max_abs_diff(masked_fill(want[i], eq(want[i], -INFINITY), 0.0),
                                                zeros_like(want[i]));
        CHECK(max_abs_diff(want[i], got[i]) <= 1e-4 * scale);
      }
    }
  }
  kernels::set_block_attention_path(before);
#ifdef CF_WITH_CUDA
  // The fused and tensor-core CUDA kernels, called with a rate, refuse it by name.
  kernels::BlockAttentionParams p;
  p.offsets = {0, -1};
  p.dropout = 0.1;
  const Tensor q = Tensor::zeros({1, 2, 64, 64}, kFloat32, gpu), m = random_members(1, 1, 64, 16, 0, 3).to(gpu);
  const Tensor out = Tensor::empty({1, 2, 64, 64}, kFloat32, gpu), lse = Tensor::empty({1, 2, 64}, kFloat32, gpu);
  CHECK_THROWS_MSG(kernels::block_attention_forward_cuda(q, q, q, m, Tensor(), p, out, lse), ValueError,
                   "[block_attention] the fused CUDA kernel has no attention dropout", "0.1");
  if (kernels::block_attention_mma_supported(q, q, q, m))
    CHECK_THROWS_MSG(kernels::block_attention_forward_mma_cuda(q, q, q, m, Tensor(), p, out, lse), ValueError,
                     "[block_attention] the tensor-core kernel has no attention dropout", "0.1");
  kernels::FlashAttentionParams fp;
  fp.dropout = 0.1;
  CHECK_THROWS_MSG(kernels::flash_attention_forward_cuda(q, q, q, Tensor(), fp, out, lse), ValueError,
                   "[flash_attention] the CUDA kernel has no attention dropout", "0.1");
#endif
}

CUDA_TEST_CASE("block_attention over rounds, apart and combined: float64 gradcheck on CUDA") {
  Tensor members = random_members(2, 6, 9, 3, 1, 6).to(Device::cuda(0));
  BlockAttentionOptions o;
  o.look_back = 1;
  o.rounds = 3;
  for (bool combine : {false, true}) {
    o.combine_rounds = combine;
    check_grad_cuda("block_attention",
                    [&](const std::vector<Tensor>& x) {
                      BlockAttentionResult r = block_attention(x[0], x[1], x[2], members, Tensor(), o);
                      return sum(r.out * r.out) + sum(masked_fill(r.lse, lt(r.lse, -1e4), 0.0));
                    },
                    {leaf64({2, 2, 9, 3}, 1), leaf64({2, 2, 9, 3}, 2), leaf64({2, 2, 9, 2}, 3)});
  }
}

CUDA_TEST_CASE("block_attention's member checks on CUDA read nothing back and give the CPU's errors at the next read") {
  const Device gpu = Device::cuda(0);
  Tensor q = leaf64({1, 2, 4, 3}, 1), k = leaf64({1, 2, 4, 3}, 2), v = leaf64({1, 2, 4, 2}, 3);
  // Leaves on the device (a moved CPU leaf would copy its gradient back to the host).
  auto device_leaf = [&](const Tensor& t) { return t.detach().to(gpu).set_requires_grad(true); };
  Tensor qg = device_leaf(q), kg = device_leaf(k), vg = device_leaf(v);
  const Tensor good = ti64({0, 1, 2, 3}, {1, 1, 2, 2}).to(gpu);
  cuda::synchronize();
  const cuda::TransferStats before = cuda::transfer_stats();
  BlockAttentionResult r = block_attention(qg, kg, vg, good);
  sum(r.out * r.out).backward();
  const cuda::TransferStats d = cuda::transfer_stats() - before;
  CHECK(d.device_to_host == 0);
  CHECK(d.host_to_device == 0);
  CHECK(d.synchronizations == 0);
  check_close(r.out.cpu(), block_attention(q, k, v, good.cpu()).out, 1e-12);  // a read: no failed check pending
  // A position past N (the kernels treat it as an empty slot meanwhile: nothing out
  // of bounds, under compute-sanitizer too), forward and backward, then a duplicate.
  BlockAttentionResult bad = block_attention(qg, kg, vg, ti64({0, 1, 9, 3}, {1, 1, 2, 2}).to(gpu));
  sum(bad.out * bad.out).backward();
  CHECK_THROWS_MSG(bad.out.cpu(), IndexError, "[block_attention] members[0, 0] holds position 9, outside [-1, 4)");
  CHECK_THROWS_MSG(block_attention(q, k, v, ti64({0, 1, 9, 3}, {1, 1, 2, 2})), IndexError,
                   "[block_attention] members[0, 0] holds position 9, outside [-1, 4)");
  (void)block_attention(qg, kg, vg, ti64({0, 2, -1, 2, 1, 3, 3, 0}, {1, 2, 2, 2}).to(gpu));
  CHECK_THROWS_MSG(cuda::check_errors(), ValueError, "[block_attention] position 2 appears twice in members[0, 0]");
  CHECK_THROWS_MSG(block_attention(q, k, v, ti64({0, 2, -1, 2, 1, 3, 3, 0}, {1, 2, 2, 2})), ValueError,
                   "[block_attention] position 2 appears twice in members[0, 0]");
}

}  // TEST_SUITE
