// Fused attention ops: flash_attention, block_attention and routed_attention
// (kernels/attention).
// Each validates its inputs, runs one forward kernel and records one node whose
// backward is one kernel too (recomputing the probabilities from the saved
// log-sum-exp). Backward runs under no-grad: no double backward through them.
#include "autograd/dropout_share.h"
#include "autograd/ops/attention.h"

#include <cmath>
#include <cstdint>

#include "autograd/autocast.h"
#include "autograd/op_names.h"

#include "autograd/grad_mode.h"
#include "autograd/ops/common.h"
#include "core/cuda_graph.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/shape.h"
#include "kernels/attention/attention.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/index/index.h"

namespace cf {

using autograd::SavedTensor;

namespace {

using ops::dense_data;

// t itself when its data is 16-byte aligned, else an aligned copy: the tensor-core kernels read
// 16-byte vectors, and a contiguous view at an odd offset is not aligned.
Tensor aligned16(const Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  kernels::copy(t, c);
  return c;
}

double default_scale(double scale, int64_t dk) { return scale > 0 ? scale : 1.0 / std::sqrt(double(dk)); }

void check_scale(double scale, const char* who) {
  CF_CHECK(scale >= 0 && std::isfinite(scale), ValueError, "[", who,
           "] scale must be finite and >= 0 (0: 1/sqrt(d_k)), got ", scale);
}

}  // namespace

// ---------------------------------------------------------------- flash_attention

namespace {

// flash_attention and flash_attention_with_lse: one node either way. Without lse the
// node's output is out itself; with it, out and lse side by side (B, H, Nq, Dv + 1)
// as block_attention packs them, so both carry gradients into the one backward
// (lse's joins through D_i = dO_i . O_i - dlse_i).
FlashAttentionResult flash_attention_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                          double scale, bool causal, bool with_lse, double dropout = 0.0,
                                          Generator* gen = nullptr) {
  const char* op = opname::flash_attention;
  ops::check_defined(q, op, "q");
  ops::check_defined(k, op, "k");
  ops::check_defined(v, op, "v");
  // Autocast (issue 26): on CUDA, 16-bit q, k, v of one dtype go through the tensor-core
  // forward (float32 out and lse) and the float32 backward on float32 copies made when it
  // runs; on a CPU with AMX or (AMD's) vdpbf16ps, bfloat16 q, k, v go through the bfloat16 arm, forward and
  // backward (float32 out, lse and gradients); anything else runs the float32 kernels on float32 copies,
  // as softmax does. The projections around them stay 16-bit either way.
  const bool low_precision =
      autocast_dtype() && (is_low_precision(q.dtype()) || is_low_precision(k.dtype()) || is_low_precision(v.dtype()));
  // (The tensor-core kernels and the bfloat16 arm have no attention dropout: a rate takes the float32 copies.)
  const bool tensor_cores = low_precision && dropout == 0 && kernels::flash_attention_mma_supported(q, k, v);
  const bool bf16_arm = low_precision && dropout == 0 && kernels::flash_attention_bf16_supported(q, k, v);
  if (low_precision && !tensor_cores && !bf16_arm)
    return flash_attention_impl(autocast::to_float32(q), autocast::to_float32(k), autocast::to_float32(v), kpm,
                                scale, causal, with_lse, dropout, gen);
  ops::check_same_device(op, {&q, &k, &v, &kpm});
  CF_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, ShapeError, "[", op,
           "] expected q (B, H, Nq, Dk), k (B, H, Nk, Dk), v (B, H, Nk, Dv); got q ", shape_str(q.shape()),
           ", k ", shape_str(k.shape()), ", v ", shape_str(v.shape()));
  const Shape &sq = q.shape(), &sk = k.shape(), &sv = v.shape();
  CF_CHECK(sq[0] == sk[0] && sk[0] == sv[0] && sq[1] == sk[1] && sk[1] == sv[1] && sq[3] == sk[3] &&
               sk[2] == sv[2],
           ShapeError, "[", op, "] inconsistent shapes: q ", shape_str(sq), ", k ", shape_str(sk), ", v ",
           shape_str(sv));
  CF_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype() && is_floating(q.dtype()), DTypeError, "[", op,
           "] q, k, v must share one float dtype, got ", q.dtype(), ", ", k.dtype(), ", ", v.dtype());
  if (kpm.defined())
    CF_CHECK(kpm.dtype() == kBool && kpm.dim() == 2 && kpm.shape()[0] == sq[0] && kpm.shape()[1] == sk[2],
             ShapeError, "[", op, "] key_padding_mask must be bool (B, Nk) = (", sq[0], ", ", sk[2], "), got ",
             kpm.describe());
  check_scale(scale, op);
  CF_CHECK(dropout >= 0 && dropout < 1, ValueError, "[", op, "] dropout must be in [0, 1), got ", dropout);
  kernels::FlashAttentionParams p;
  p.scale = default_scale(scale, sq[3]);
  p.causal = causal;
  const int64_t B = sq[0], H = sq[1], Nq = sq[2], Dv = sv[3];
  if (dropout > 0) {  // the counters dropout() would reserve for the dense (B, H, Nq, Nk) weights
    p.dropout = dropout;
    p.dropout_rebase = cuda::philox_rebase_for(*gen, q.device(), op);  // (before the reservation)
    p.dropout_seed = gen->seed();
    p.dropout_counter0 = reserve_dropout_counters(*gen, uint64_t(B * H * Nq * sk[2]));  // (dropout_share.h)
  }
  Tensor qc = dense_data(q), kc = dense_data(k), vc = dense_data(v), mc = dense_data(kpm);
  const DType out_dtype = tensor_cores || bf16_arm ? kFloat32 : q.dtype();
  Tensor out = Tensor::empty({B, H, Nq, Dv}, out_dtype, q.device());
  Tensor lse = Tensor::empty({B, H, Nq}, out_dtype, q.device());
  if (tensor_cores) {
    qc = aligned16(qc);
    kc = aligned16(kc);
    vc = aligned16(vc);
    kernels::flash_attention_forward_mma_cuda(qc, kc, vc, mc, p, out, lse);
  } else if (bf16_arm) {
    kernels::flash_attention_forward_bf16_cpu(qc, kc, vc, mc, p, out, lse);
  } else {
    kernels::flash_attention_forward(qc, kc, vc, mc, p, out, lse);
  }
  auto out_of = [B, H, Nq, Dv](const Tensor& t) {
    return make_view(t, {B, H, Nq, Dv}, {H * Nq * (Dv + 1), Nq * (Dv + 1), Dv + 1, 1}, t.offset());
  };
  auto lse_of = [B, H, Nq, Dv](const Tensor& t) {
    return make_view(t, {B, H, Nq}, {H * Nq * (Dv + 1), Nq * (Dv + 1), Dv + 1}, t.offset() + Dv);
  };
  Tensor result = out;
  if (with_lse) {  // the kernels write contiguous rows; the pair is copied side by side (O(Nq Dv))
    result = Tensor::empty({B, H, Nq, Dv + 1}, out_dtype, q.device());
    kernels::copy(out, out_of(result));
    kernels::copy(lse, lse_of(result));
  }
  if (autograd::any_requires_grad({&q, &k, &v})) {
    SavedTensor s_q(qc), s_k(kc), s_v(vc), s_m(mc), s_o(out), s_l(lse);
    const DType tq = q.dtype(), tk = k.dtype(), tv = v.dtype();
    autograd::record(op, {q, k, v}, result, [=](const Tensor& g) -> std::vector<Tensor> {
      Tensor qv = s_q.unpack(op), kv = s_k.unpack(op), vv = s_v.unpack(op), ov = s_o.unpack(op),
             lv = s_l.unpack(op), mv = s_m.defined() ? s_m.unpack(op) : Tensor();
      const Tensor gd = dense_data(g);  // the views below assume the packed layout
      const Tensor go = with_lse ? dense_data(out_of(gd)) : gd;
      const Tensor gl = with_lse ? dense_data(lse_of(gd)) : Tensor();
      if (bf16_arm) {  // bfloat16 dout for the products, float32 gradients returned in the 16-bit dtype
        Tensor dq = Tensor::empty(qv.shape(), kFloat32, qv.device());
        Tensor dk = Tensor::empty(kv.shape(), kFloat32, kv.device());
        Tensor dv = Tensor::empty(vv.shape(), kFloat32, vv.device());
        kernels::flash_attention_backward_bf16_cpu(qv, kv, vv, mv, p, ov, lv, cf::to(go, kBFloat16), gl, dq, dk, dv);
        return {cf::to(dq, tq), cf::to(dk, tk), cf::to(dv, tv)};
      }
      if (tensor_cores && kernels::flash_attention_backward_mma_supported(qv, kv, vv)) {
        // Tensor cores too (head size 64): float32 gradients, returned in the 16-bit dtype.
        Tensor dq = Tensor::empty(qv.shape(), kFloat32, qv.device());
        Tensor dk = Tensor::empty(kv.shape(), kFloat32, kv.device());
        Tensor dv = Tensor::empty(vv.shape(), kFloat32, vv.device());
        kernels::flash_attention_backward_mma_cuda(qv, kv, vv, mv, p, ov, lv, go, gl, dq, dk, dv);
        return {cf::to(dq, tq), cf::to(dk, tk), cf::to(dv, tv)};
      }
      if (tensor_cores) {  // the float32 backward on float32 copies; the gradients go back to the 16-bit dtype
        qv = cf::to(qv, kFloat32);
        kv = cf::to(kv, kFloat32);
        vv = cf::to(vv, kFloat32);
      }
      Tensor dq = Tensor::empty(qv.shape(), qv.dtype(), qv.device());
      Tensor dk = Tensor::empty(kv.shape(), kv.dtype(), kv.device());
      Tensor dv = Tensor::empty(vv.shape(), vv.dtype(), vv.device());
      kernels::flash_attention_backward(qv, kv, vv, mv, p, ov, lv, go, gl, dq, dk, dv);
      if (tensor_cores) return {cf::to(dq, tq), cf::to(dk, tk), cf::to(dv, tv)};
      return {dq, dk, dv};
    });
    // What the dense form's two matmuls count (q k^T and weights v), masks or not.
    result.grad_fn()->forward_macs = sq[0] * sq[1] * sq[2] * sk[2] * (sq[3] + sv[3]);
  }
  if (!with_lse) return {out, Tensor(), p.dropout_seed, p.dropout_counter0, p.dropout_rebase};
  return {slice(result, 3, 0, Dv), squeeze(slice(result, 3, Dv, Dv + 1), 3), p.dropout_seed, p.dropout_counter0,
          p.dropout_rebase};
}

}  // namespace

Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm, double scale,
                       bool causal, double dropout, Generator& gen) {
  return flash_attention_impl(q, k, v, kpm, scale, causal, false, dropout, &gen).out;
}

FlashAttentionResult flash_attention_with_lse(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                              double scale, bool causal, double dropout, Generator& gen) {
  return flash_attention_impl(q, k, v, kpm, scale, causal, true, dropout, &gen);
}

// ---------------------------------------------------------------- block_attention

namespace ops {

std::vector<int64_t> block_window_offsets(int64_t C, int64_t look_back, int64_t look_ahead) {
  std::vector<int64_t> offs;
  std::vector<char> used(size_t(std::max<int64_t>(C, 1)), 0);
  auto add = [&](int64_t off) {
    const int64_t r = ((off % C) + C) % C;
    if (!used[size_t(r)]) {
      used[size_t(r)] = 1;
      offs.push_back(off);
    }
  };
  add(0);
  // A window wider than C reaches every chunk; stop once all are in.
  for (int64_t i = 1; i <= look_back && int64_t(offs.size()) < C; ++i) add(-i);
  for (int64_t i = 1; i <= look_ahead && int64_t(offs.size()) < C; ++i) add(i);
  return offs;
}

void check_block_attention_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                const Tensor& kpm, const BlockAttentionOptions& o, const char* who) {
  for (auto* t : {&q, &k, &v}) check_defined(*t, who, t == &q ? "q" : t == &k ? "k" : "v");
  check_defined(members, who, "members");
  CF_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, ShapeError, "[", who,
           "] expected q, k (B, H, N, Dk) and v (B, H, N, Dv); got q ", shape_str(q.shape()), ", k ",
           shape_str(k.shape()), ", v ", shape_str(v.shape()));
  const Shape &sq = q.shape(), &sk = k.shape(), &sv = v.shape();
  CF_CHECK(sq == sk && sv[0] == sq[0] && sv[1] == sq[1] && sv[2] == sq[2], ShapeError, "[", who,
           "] q and k must have one shape and v the same (B, H, N): q ", shape_str(sq), ", k ", shape_str(sk),
           ", v ", shape_str(sv));
  CF_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype() && is_floating(q.dtype()), DTypeError, "[", who,
           "] q, k, v must share one float dtype, got ", q.dtype(), ", ", k.dtype(), ", ", v.dtype());
  check_same_device(who, {&q, &k, &v, &members, &kpm});
  CF_CHECK(o.rounds >= 1, ValueError, "[", who, "] rounds must be >= 1, got ", o.rounds);
  CF_CHECK(members.dtype() == kInt64 && members.dim() == 4, ShapeError, "[", who,
           "] members must be int64 (B, H * rounds or 1, C, w), got ", members.describe());
  const Shape& sm = members.shape();
  // (H = 4, rounds = 2^62 wrapped to 0 heads: empty outputs and no error)
  const int64_t B = sq[0], H = checked_mul(sq[1], o.rounds, who, "heads x rounds"), N = sq[2], Hm = sm[1],
                C = sm[2], w = sm[3];
  CF_CHECK(sm[0] == B && (Hm == H || Hm == 1) && C >= 1 && w >= 1, ShapeError, "[", who, "] members ",
           shape_str(sm), " does not fit q ", shape_str(sq), " and rounds=", o.rounds, " (want (", B, ", ", H,
           " or 1, C >= 1, w >= 1))");
  if (kpm.defined()) {
    CF_CHECK(kpm.dtype() == kBool && kpm.dim() == 2 && kpm.shape()[0] == B && kpm.shape()[1] == N, ShapeError,
             "[", who, "] key_padding_mask must be bool (B, N) = (", B, ", ", N, "), got ", kpm.describe());
  }
  CF_CHECK(o.look_back >= 0 && o.look_ahead >= 0 && o.scale >= 0 && std::isfinite(o.scale) &&
               std::isfinite(o.self_score),
           ValueError, "[", who,
           "] look_back and look_ahead must be >= 0, scale >= 0 (0: 1/sqrt(d_k)) and self_score finite, got "
           "look_back=",
           o.look_back, " look_ahead=", o.look_ahead, " scale=", o.scale, " self_score=", o.self_score);
  CF_CHECK(o.dropout >= 0 && o.dropout < 1, ValueError, "[", who, "] dropout must be in [0, 1), got ", o.dropout);
  // Positions in [-1, N), none twice per (b, h): two data checks on members' device
  // (deferred on CUDA, so the forward does not wait for them; the kernels treat a bad
  // position as an empty slot meanwhile). The second counts each (b, h) row's
  // positions (a per-row histogram; -1 and out-of-range values are not counted):
  // 4 small launches, no sort.
  if (members.numel() == 0 || indices_known_good()) return;  // (a table the caller built: ops::KnownGoodIndices)
  const int64_t rows = B * Hm, per_head = C * w;
  const std::string name = who;
  NoGradGuard ng;
  const Tensor m = reshape(contiguous(members), {rows, per_head});
  check_indices(
      who, m, N,
      [=](int64_t at, int64_t p) {
        const int64_t bh = at / per_head;
        throw IndexError(str("[", name, "] members[", bh / Hm, ", ", bh % Hm, "] holds position ", p,
                             ", outside [-1, ", N, ")"));
      },
      -1);
  const Tensor count = Tensor::zeros({rows, N}, kInt64, m.device());
  kernels::bincount_rows(m, N, count);
  check_indices(who, count, 2, [=](int64_t at, int64_t) {
    const int64_t bh = at / N;
    throw ValueError(str("[", name, "] position ", at % N, " appears twice in members[", bh / Hm, ", ", bh % Hm,
                         "]"));
  });
}

BlockAttentionResult block_attention_unchecked(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& members, const Tensor& kpm,
                                               const BlockAttentionOptions& o) {
  const char* op = opname::block_attention;
  const Shape& sq = q.shape();
  const int64_t B = sq[0], H = sq[1] * o.rounds, N = sq[2], Dv = v.shape()[3];  // H: output heads
  kernels::BlockAttentionParams p;
  p.offsets = block_window_offsets(members.shape()[2], o.look_back, o.look_ahead);
  p.scale = default_scale(o.scale, sq[3]);
  p.causal = o.causal;
  p.self_mask = o.self_mask;
  p.self_score = o.self_score;
  p.rounds = o.rounds;
  if (o.dropout > 0) {  // the counters dropout() would reserve for the dense (B, H * rounds, N, N) weights
    Generator& gen = o.generator ? *o.generator : default_generator();
    p.dropout = o.dropout;
    p.dropout_rebase = cuda::philox_rebase_for(gen, q.device(), opname::block_attention);
    p.dropout_seed = gen.seed();
    p.dropout_counter0 = reserve_dropout_counters(gen, uint64_t(B * H) * uint64_t(N) * uint64_t(N));
  }
  Tensor qc = dense_data(q), kc = dense_data(k), vc = dense_data(v), mc = dense_data(members), pc = dense_data(kpm);
  // Autocast (issue 26): 16-bit q, k, v the tensor-core kernels take (the callers sent the others
  // to float32 copies) give float32 out and lse, as flash_attention's do.
  const bool tensor_cores = autocast_dtype() && is_low_precision(q.dtype()) && o.rounds == 1 && o.dropout == 0 &&
                            kernels::block_attention_mma_supported(q, k, v, members);
  // ... and on a CPU with AMX or (AMD's) vdpbf16ps, bfloat16 q, k, v take the bfloat16 arm of the CPU kernel
  // (float32 out, lse, gradients; any number of rounds)
  const bool bf16_arm = autocast_dtype() && o.dropout == 0 && kernels::block_attention_bf16_supported(q, k, v);
  if (tensor_cores) {
    qc = aligned16(qc);
    kc = aligned16(kc);
    vc = aligned16(vc);
  }
  // One output for the one node: out and lse side by side, (B, H, N, Dv + 1); with
  // combine_rounds the kernel's rounds (per_round) are combined into one row per head.
  const bool combine = o.combine_rounds && o.rounds > 1;
  Tensor per_round = Tensor::empty({B, H, N, Dv + 1}, tensor_cores || bf16_arm ? kFloat32 : q.dtype(), q.device());
  auto out_of = [B, H, N, Dv](const Tensor& t) {
    return make_view(t, {B, H, N, Dv}, {H * N * (Dv + 1), N * (Dv + 1), Dv + 1, 1}, t.offset());
  };
  auto lse_of = [B, H, N, Dv](const Tensor& t) {
    return make_view(t, {B, H, N}, {H * N * (Dv + 1), N * (Dv + 1), Dv + 1}, t.offset() + Dv);
  };
  if (tensor_cores)
    kernels::block_attention_forward_mma_cuda(qc, kc, vc, mc, pc, p, out_of(per_round), lse_of(per_round));
  else if (bf16_arm)
    kernels::block_attention_forward_bf16_cpu(qc, kc, vc, mc, pc, p, out_of(per_round), lse_of(per_round));
  else
    kernels::block_attention_forward(qc, kc, vc, mc, pc, p, out_of(per_round), lse_of(per_round));
  Tensor packed = per_round;
  if (combine) {
    packed = Tensor::empty({B, sq[1], N, Dv + 1}, per_round.dtype(), q.device());
    kernels::rounds_combine(per_round, o.rounds, packed);
  }
  if (autograd::any_requires_grad({&q, &k, &v})) {
    SavedTensor s_q(qc), s_k(kc), s_v(vc), s_m(mc), s_p(pc), s_o(per_round), s_c(combine ? packed : Tensor());
    const DType tq = q.dtype(), tk = k.dtype(), tv = v.dtype();
    const int64_t rounds = o.rounds;
    autograd::record(op, {q, k, v}, packed, [=](const Tensor& g) -> std::vector<Tensor> {
      Tensor qv = s_q.unpack(op), kv = s_k.unpack(op), vv = s_v.unpack(op), mv = s_m.unpack(op),
             ov = s_o.unpack(op), pv = s_p.defined() ? s_p.unpack(op) : Tensor();
      Tensor gd = dense_data(g);
      if (combine) {  // the combined rows' gradient, handed to each round (the kernels' dout and dlse)
        Tensor per_round_grad = Tensor::empty(ov.shape(), ov.dtype(), ov.device());
        kernels::rounds_split(ov, s_c.unpack(op), gd, rounds, per_round_grad);
        gd = per_round_grad;
      }
      if (bf16_arm) {  // bfloat16 dout for the products; float32 gradients, returned in the 16-bit dtype
        Tensor dq = Tensor::empty(qv.shape(), kFloat32, qv.device());
        Tensor dk = Tensor::empty(kv.shape(), kFloat32, kv.device());
        Tensor dv = Tensor::empty(vv.shape(), kFloat32, vv.device());
        kernels::block_attention_backward_bf16_cpu(qv, kv, vv, mv, pv, p, out_of(ov), lse_of(ov),
                                                  cf::to(out_of(gd), kBFloat16), lse_of(gd), dq, dk, dv);
        return {cf::to(dq, tq), cf::to(dk, tk), cf::to(dv, tv)};
      }
      if (tensor_cores) {  // float32 gradients, returned in the 16-bit dtype
        Tensor dq = Tensor::empty(qv.shape(), kFloat32, qv.device());
        Tensor dk = Tensor::empty(kv.shape(), kFloat32, kv.device());
        Tensor dv = Tensor::empty(vv.shape(), kFloat32, vv.device());
        kernels::block_attention_backward_mma_cuda(qv, kv, vv, mv, pv, p, out_of(ov), lse_of(ov), out_of(gd),
                                                     lse_of(gd), dq, dk, dv);
        return {cf::to(dq, tq), cf::to(dk, tk), cf::to(dv, tv)};
      }
      Tensor dq = Tensor::empty(qv.shape(), qv.dtype(), qv.device());
      Tensor dk = Tensor::empty(kv.shape(), kv.dtype(), kv.device());
      Tensor dv = Tensor::empty(vv.shape(), vv.dtype(), vv.device());
      kernels::block_attention_backward(qv, kv, vv, mv, pv, p, out_of(ov), lse_of(ov), out_of(gd), lse_of(gd), dq,
                                        dk, dv);
      return {dq, dk, dv};
    });
    // The gathered form's two batched matmuls: each of C chunks' w query slots
    // against the w key slots of every chunk it sees, empty slots included.
    const int64_t C = members.shape()[2], w = members.shape()[3];
    packed.grad_fn()->forward_macs = B * H * C * w * int64_t(p.offsets.size()) * w * (sq[3] + Dv);
  }
  return {slice(packed, 3, 0, Dv), squeeze(slice(packed, 3, Dv, Dv + 1), 3)};
}

}  // namespace ops

// ---------------------------------------------------------------- routed_attention

namespace {

// lists (B', H', C, w) int64 with B' in {1, B}, H' in {1, H}.
void check_lists(const Tensor& m, int64_t B, int64_t H, const char* name, const char* who) {
  CF_CHECK(m.defined() && m.dtype() == kInt64 && m.dim() == 4, ShapeError, "[", who, "] ", name,
           " must be int64 (B, H, C, w), got ", m.defined() ? m.describe() : std::string("undefined"));
  CF_CHECK((m.shape()[0] == B || m.shape()[0] == 1) && (m.shape()[1] == H || m.shape()[1] == 1), ShapeError, "[",
           who, "] ", name, " ", shape_str(m.shape()), " does not broadcast to (B, H) = (", B, ", ", H, ")");
  CF_CHECK(m.shape()[3] >= 1, ShapeError, "[", who, "] ", name, " ", shape_str(m.shape()),
           " has lists of no slot (w = 0)");
}

}  // namespace

void ops::check_routed_attention_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qm,
                                      const Tensor& km, const Tensor& kpm, double scale, const char* who,
                                      bool check_range) {
  for (auto* t : {&q, &k, &v}) check_defined(*t, who, t == &q ? "q" : t == &k ? "k" : "v");
  CF_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, ShapeError, "[", who,
           "] expected q, k (B, H, N, Dk) and v (B, H, N, Dv); got q ", shape_str(q.shape()), ", k ",
           shape_str(k.shape()), ", v ", shape_str(v.shape()));
  const Shape &sq = q.shape(), &sk = k.shape(), &sv = v.shape();
  CF_CHECK(sq[0] == sk[0] && sk[0] == sv[0] && sq[1] == sk[1] && sk[1] == sv[1] && sq[3] == sk[3] &&
               sk[2] == sv[2],
           ShapeError, "[", who, "] inconsistent shapes: q ", shape_str(sq), ", k ", shape_str(sk), ", v ",
           shape_str(sv));
  CF_CHECK(sq[2] == sk[2], ShapeError, "[", who, "] self-attention only: q has ", sq[2], " positions, k ", sk[2]);
  CF_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype() && is_floating(q.dtype()), DTypeError, "[", who,
           "] q, k, v must share one float dtype, got ", q.dtype(), ", ", k.dtype(), ", ", v.dtype());
  const int64_t B = sq[0], H = sq[1], N = sq[2];
  check_lists(qm, B, H, "query_members", who);
  check_lists(km, B, H, "key_members", who);
  CF_CHECK(qm.shape()[2] == km.shape()[2], ShapeError, "[", who, "] query_members ", shape_str(qm.shape()),
           " and key_members ", shape_str(km.shape()), " must have the same number of lists C");
  check_same_device(who, {&q, &k, &v, &qm, &km, &kpm});
  if (kpm.defined())
    CF_CHECK(kpm.dtype() == kBool && kpm.dim() == 2 && kpm.shape()[0] == B && kpm.shape()[1] == N, ShapeError,
             "[", who, "] key_padding_mask must be bool (B, N) = (", B, ", ", N, "), got ", kpm.describe());
  check_scale(scale, who);
  if (!check_range) return;
  // Data checks: on CUDA deferred to the next host read (no wait here).
  for (const auto& [m, name] : {std::pair<const Tensor*, const char*>{&qm, "query_members"}, {&km, "key_members"}})
    check_indices(
        who, *m, N,
        [who = std::string(who), name = std::string(name), N](int64_t at, int64_t p) {
          throw IndexError(str("[", who, "] member position ", p, " at flat position ", at, " of ", name,
                               " is out of range [-1, ", N, ")"));
        },
        -1);
}

Tensor ops::routed_attention_unchecked(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_members,
                                       const Tensor& key_members, const Tensor& kpm, double scale, bool causal,
                                       double dropout, Generator* gen) {
  const char* op = opname::routed_attention;
  const Shape& sq = q.shape();
  const int64_t B = sq[0], H = sq[1], N = sq[2], Dk = sq[3], Dv = v.shape()[3];
  const int64_t C = query_members.shape()[2], wq = query_members.shape()[3], wk = key_members.shape()[3];
  CF_CHECK(dropout >= 0 && dropout < 1, ValueError, "[", op, "] dropout must be in [0, 1), got ", dropout);
  if (N == 0) {  // nothing to attend: an empty output, still on the graph
    Tensor out = Tensor::zeros({B, H, 0, Dv}, v.dtype(), v.device());
    if (autograd::any_requires_grad({&q, &k, &v}))
      autograd::record(op, {q, k, v}, out,
                       [sq = q.shape(), sk = k.shape(), sv = v.shape(), dt = v.dtype(),
                        dev = v.device()](const Tensor&) -> std::vector<Tensor> {
                         return {Tensor::zeros(sq, dt, dev), Tensor::zeros(sk, dt, dev), Tensor::zeros(sv, dt, dev)};
                       });
    return out;
  }
  kernels::RoutedAttentionParams p;
  p.scale = default_scale(scale, Dk);
  p.causal = causal;
  if (dropout > 0) {  // the counters dropout() would reserve for C dense (B, H, N, N) weight tensors
    Generator& g = gen ? *gen : default_generator();
    p.dropout = dropout;
    p.dropout_rebase = cuda::philox_rebase_for(g, q.device(), opname::routed_attention);
    p.dropout_seed = g.seed();
    p.dropout_counter0 = reserve_dropout_counters(g, uint64_t(C) * uint64_t(B * H) * uint64_t(N) * uint64_t(N));
  }
  Tensor qc = dense_data(q), kc = dense_data(k), vc = dense_data(v), pc = dense_data(kpm);
  Tensor qm = dense_data(query_members), km = dense_data(key_members);
  // The kernel's outputs in slot order: row c * wq + r of each (b, h) is slot r of list c.
  Tensor slots = Tensor::empty({B, H, C * wq, Dv}, q.dtype(), q.device());
  Tensor lse = Tensor::empty({B, H, C * wq}, q.dtype(), q.device());
  kernels::routed_attention_forward(qc, kc, vc, qm, km, pc, p, slots, lse);
  // Token order: each position's slot outputs summed and divided by the number of
  // query slots holding it that see a key (the reference code's scatter_mean over the
  // lists that give the query an output; at least 1, so a position in no list, or
  // seeing no key in any, outputs zeros). A slot that sees no key (causal: every key
  // of its list is later; padding) has out 0 and lse -inf: counted, it shrank the
  // query's real outputs (1/2 of them for a query in one such list of two). One kernel
  // call (routed_slots_to_tokens), where the slot index, the held mask, two scatters,
  // a clamp and a division took eight.
  Tensor out = Tensor::empty({B, H, N, Dv}, q.dtype(), q.device());
  Tensor count = Tensor::empty({B, H, N}, q.dtype(), q.device());
  kernels::routed_slots_to_tokens(slots, lse, qm, out, count);
  if (autograd::any_requires_grad({&q, &k, &v})) {
    SavedTensor s_q(qc), s_k(kc), s_v(vc), s_qm(qm), s_km(km), s_p(pc);
    autograd::record(op, {q, k, v}, out, [=](const Tensor& g) -> std::vector<Tensor> {
      Tensor qv = s_q.unpack(op), kv = s_k.unpack(op), vv = s_v.unpack(op), qmv = s_qm.unpack(op),
             kmv = s_km.unpack(op), pv = s_p.defined() ? s_p.unpack(op) : Tensor();
      const Tensor gd = dense_data(g);
      // Written by the first chunk's slot sums (from 0), added to by the next: no fill (zeros without a list).
      auto grad_of = [C](const Tensor& x) {
        return C > 0 ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor::zeros(x.shape(), x.dtype(), x.device());
      };
      Tensor dq = grad_of(qv), dk = grad_of(kv), dv = grad_of(vv);
      // The lists in chunks whose key slots hold about N rows, so the slot gradients stay
      // the size of k and v: the fixed sparse pattern's key lists repeat every block's
      // summaries (C wk ~ N + (N / l)^2 c), and whole they were most of its backward's peak.
      // At least kMinChunkRows rows a chunk whatever N: each chunk is 4 kernel calls (more
      // launches on CUDA), and at N = 512 chunks of N rows cut routing's local lists (3 N key
      // slots) and the sparse pattern's (4.75 N) into 3 and 5 chunks a layer for a few MB.
      constexpr int64_t kMinChunkRows = 2048;
      const int64_t per = std::max<int64_t>(1, std::max(N, kMinChunkRows) / wk);
      for (int64_t c0 = 0; c0 < C; c0 += per) {
        const int64_t n = std::min(per, C - c0);
        // Slot-order rows of lists c0 .. c0 + n - 1, one (b, h) after another.
        auto rows = [&](const Tensor& t, int64_t w) { return dense_data(slice(t, 2, c0 * w, (c0 + n) * w)); };
        const Tensor qmc = dense_data(slice(qmv, 2, c0, c0 + n)), kmc = dense_data(slice(kmv, 2, c0, c0 + n));
        // Each slot's share of its position's gradient (rows of empty slots are ignored).
        Tensor gs = Tensor::empty({B, H, n * wq, Dv}, g.dtype(), g.device());
        kernels::routed_tokens_to_slots(gd, count, qmc, gs);
        Tensor dqs = Tensor::empty({B, H, n * wq, Dk}, qv.dtype(), qv.device());
        Tensor dks = Tensor::empty({B, H, n * wk, Dk}, kv.dtype(), kv.device());
        Tensor dvs = Tensor::empty({B, H, n * wk, Dv}, vv.dtype(), vv.device());
        kernels::RoutedAttentionParams pc0 = p;
        pc0.list0 = c0;  // the dropout counters of lists c0 ..
        kernels::routed_attention_backward(qv, kv, vv, qmc, kmc, pv, pc0, rows(slots, wq),
                                           dense_data(slice(lse, 2, c0 * wq, (c0 + n) * wq)), gs, dqs, dks, dvs);
        // The slot gradients back to the positions the slots hold.
        kernels::routed_slots_add(dqs, qmc, dq, Tensor(), Tensor(), c0 > 0);
        kernels::routed_slots_add(dks, kmc, dk, dvs, dv, c0 > 0);
      }
      return {dq, dk, dv};
    });
    // The gathered form's two batched matmuls: each list's wq query slots against its wk key slots.
    out.grad_fn()->forward_macs = B * H * C * wq * wk * (Dk + Dv);
  }
  return out;
}

Tensor routed_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_members,
                        const Tensor& key_members, const Tensor& kpm, double scale, bool causal, double dropout,
                        Generator& gen) {
  const char* op = opname::routed_attention;
  for (auto* t : {&q, &k, &v}) ops::check_defined(*t, op, t == &q ? "q" : t == &k ? "k" : "v");
  // Autocast (issue 26): no 16-bit kernel yet; 16-bit q, k, v run on float32 copies.
  if (autocast_dtype() && (is_low_precision(q.dtype()) || is_low_precision(k.dtype()) || is_low_precision(v.dtype())))
    return routed_attention(autocast::to_float32(q), autocast::to_float32(k), autocast::to_float32(v), query_members,
                            key_members, kpm, scale, causal, dropout, gen);
  ops::check_routed_attention_args(q, k, v, query_members, key_members, kpm, scale, op);
  return ops::routed_attention_unchecked(q, k, v, query_members, key_members, kpm, scale, causal, dropout, &gen);
}

bool ops::block_attention_on_float32_copies(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& members, int64_t rounds, double dropout) {
  if (!autocast_dtype() || !q.defined() || !k.defined() || !v.defined()) return false;
  if (!is_low_precision(q.dtype()) && !is_low_precision(k.dtype()) && !is_low_precision(v.dtype())) return false;
  return !(dropout == 0 && members.defined() &&
           ((rounds == 1 && kernels::block_attention_mma_supported(q, k, v, members)) ||
            kernels::block_attention_bf16_supported(q, k, v)));
}

BlockAttentionResult block_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                     const Tensor& kpm, const BlockAttentionOptions& o) {
  if (ops::block_attention_on_float32_copies(q, k, v, members, o.rounds, o.dropout))
    return block_attention(autocast::to_float32(q), autocast::to_float32(k), autocast::to_float32(v), members, kpm,
                           o);
  ops::check_block_attention_args(q, k, v, members, kpm, o, opname::block_attention);
  return ops::block_attention_unchecked(q, k, v, members, kpm, o);
}

}  // namespace cf
