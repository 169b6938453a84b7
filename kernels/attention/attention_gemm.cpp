// flash_attention through GEMMs over chunks of query rows (attention.h says when and why). Device-generic:
// every step is a kernel of another family (matmul, elementwise, reduce) or the row kernel
// attention_rows_softmax, so the same code runs, and is tested, on the CPU.
#include <algorithm>
#include <limits>

#include "kernels/attention/attention.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/matmul/matmul.h"
#include "kernels/reduce/reduce.h"

namespace cf::kernels {

namespace {

// Rows [r0, r0 + n) of every (b, h) of a contiguous (B, H, N, D) tensor, as a view.
Tensor row_chunk(const Tensor& t, int64_t r0, int64_t n) {
  const Shape& s = t.shape();
  const int64_t H = s[1], N = s[2], D = s[3];
  return make_view(t, {s[0], H, n, D}, {H * N * D, N * D, D, 1}, t.offset() + r0 * D, "flash_attention");
}

// A contiguous (B, H, n, w) at the start of a contiguous (B, H, r, C) buffer, n w <= r C.
Tensor leading(const Tensor& buf, int64_t n, int64_t w) {
  const Shape& s = buf.shape();
  const Shape shape{s[0], s[1], n, w};
  return make_view(buf, shape, contiguous_strides(shape), buf.offset(), "flash_attention");
}

// lse rows [r0, r0 + n) of every (b, h) of a contiguous (B, H, N).
Tensor lse_rows(const Tensor& lse, int64_t r0, int64_t n) {
  const Shape& s = lse.shape();
  return make_view(lse, {s[0], s[1], n}, {s[1] * s[2], s[2], 1}, lse.offset() + r0, "flash_attention");
}

// Keys any query of rows [i0, i0 + n) may see: causal, the last row's prefix (query i sees j <= i + Nk - Nq),
// so a chunk of a causal attention computes about half the scores, not all of them.
int64_t key_width(bool causal, int64_t i0, int64_t n, int64_t Nq, int64_t Nk) {
  return causal ? std::clamp<int64_t>(i0 + n + Nk - Nq, 0, Nk) : Nk;
}

Tensor transposed(const Tensor& t) {
  const Shape &s = t.shape(), &st = t.strides();
  return make_view(t, {s[0], s[1], s[3], s[2]}, {st[0], st[1], st[3], st[2]}, t.offset(), "flash_attention");
}

// alpha as a (1, 1, 1, 1) tensor on t's device, broadcast by binary ops (written by a fill kernel: no copy).
Tensor scalar_like(const Tensor& t, double alpha) {
  Tensor a = Tensor::empty({1, 1, 1, 1}, t.dtype(), t.device());
  fill(a, alpha);
  return a;
}

// alpha t as a new contiguous tensor (the scale folded into q once: O(N d)).
Tensor scaled(const Tensor& t, const Tensor& alpha) {
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device());
  binary(BinaryOp::Mul, t, alpha, out);
  return out;
}

// Query rows per chunk: one (B, H, rows, Nk) score buffer holds at most clamp(4 x bytes of q, k, v,
// 16 MiB, 128 MiB), so the workspace grows with the inputs (O(N d)) up to a cap, never as N^2.
int64_t rows_per_chunk(const Tensor& q, const Tensor& k, const Tensor& v, int64_t fixed) {
  const int64_t Nq = q.shape()[2];
  if (fixed > 0) return std::min(fixed, Nq);
  const int64_t elem = int64_t(dtype_size(q.dtype()));
  const int64_t inputs = (q.numel() + k.numel() + v.numel()) * elem;
  const int64_t budget = std::clamp<int64_t>(4 * inputs, int64_t(16) << 20, int64_t(128) << 20);
  const int64_t row_bytes = q.shape()[0] * q.shape()[1] * k.shape()[2] * elem;
  return std::clamp<int64_t>(budget / std::max<int64_t>(row_bytes, 1), 1, Nq);
}

void check_dtype(const Tensor& q) {
  CF_CHECK(q.dtype() == kFloat32 || q.dtype() == kFloat64, DTypeError,
           "[flash_attention] expects float32 or float64, got ", q.dtype());
}

}  // namespace

void flash_attention_forward_gemm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                  const FlashAttentionParams& p, const Tensor& out, const Tensor& lse,
                                  int64_t chunk_rows) {
  check_dtype(q);
  const int64_t B = q.shape()[0], H = q.shape()[1], Nq = q.shape()[2], Nk = k.shape()[2], Dv = v.shape()[3];
  if (B == 0 || H == 0 || Nq == 0) return;
  if (Nk == 0) {  // nothing to attend to: the documented zeros and -inf
    fill(out, 0.0);
    fill(lse, -std::numeric_limits<double>::infinity());
    return;
  }
  const int64_t r = rows_per_chunk(q, k, v, chunk_rows);
  const Tensor qs = scaled(q, scalar_like(q, p.scale));
  const Tensor S = Tensor::empty({B, H, r, Nk}, q.dtype(), q.device());
  // One chunk (the usual case below the cap) writes out directly; more go through a buffer,
  // since a chunk's rows of out are not one contiguous block.
  const Tensor O = r < Nq ? Tensor::empty({B, H, r, Dv}, q.dtype(), q.device()) : out;
  for (int64_t i0 = 0; i0 < Nq; i0 += r) {
    const int64_t n = std::min(r, Nq - i0), W = key_width(p.causal, i0, n, Nq, Nk);
    if (W == 0) {  // causal rows before the first key: nothing allowed
      fill(row_chunk(out, i0, n), 0.0);
      fill(lse_rows(lse, i0, n), -std::numeric_limits<double>::infinity());
      continue;
    }
    const Tensor Sc = leading(S, n, W), Oc = leading(O, n, Dv);
    matmul(row_chunk(qs, i0, n), transposed(row_chunk(k, 0, W)), Sc);
    attention_rows_softmax(Sc, kpm, {i0, Nq, p.causal, false, Nk}, lse);
    matmul(Sc, row_chunk(v, 0, W), Oc);
    if (r < Nq) copy(Oc, row_chunk(out, i0, n));
  }
}

void flash_attention_backward_gemm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                   const FlashAttentionParams& p, const Tensor& out, const Tensor& lse,
                                   const Tensor& dout, const Tensor& dlse, const Tensor& dq, const Tensor& dk,
                                   const Tensor& dv, int64_t chunk_rows) {
  check_dtype(q);
  const int64_t B = q.shape()[0], H = q.shape()[1], Nq = q.shape()[2], Dk = q.shape()[3], Nk = k.shape()[2];
  if (B == 0 || H == 0 || Nq == 0 || Nk == 0) {
    fill(dq, 0.0);
    fill(dk, 0.0);
    fill(dv, 0.0);
    return;
  }
  // D_i = dO_i . O_i - dlse_i (FlashAttention-2 Alg. 2 line 4, plus the lse gradient: d lse_i / d S_ij = P_ij).
  const Tensor D4 = Tensor::empty({B, H, Nq, 1}, out.dtype(), out.device());
  {
    const Tensor prod = Tensor::empty(out.shape(), out.dtype(), out.device());
    binary(BinaryOp::Mul, dout, out, prod);
    reduce(ReduceOp::Sum, prod, {3}, D4);
  }
  if (dlse.defined()) {
    const Tensor D3 = make_view(D4, {B, H, Nq}, {H * Nq, Nq, 1}, D4.offset(), "flash_attention");
    binary(BinaryOp::Sub, D3, dlse, D3);
  }
  const int64_t r = rows_per_chunk(q, k, v, chunk_rows);
  const Tensor scale = scalar_like(q, p.scale);
  const Tensor qs = scaled(q, scale);
  const Tensor P = Tensor::empty({B, H, r, Nk}, q.dtype(), q.device());
  const Tensor dS = Tensor::empty({B, H, r, Nk}, q.dtype(), q.device());
  const Tensor dQc = Tensor::empty({B, H, r, Dk}, q.dtype(), q.device());
  // A chunk seeing every key while dk, dv are still unwritten (the first, unless causal) writes
  // them; the others add theirs, over their key prefix, through these.
  Tensor dKc, dVc;
  bool fresh = true;
  for (int64_t i0 = 0; i0 < Nq; i0 += r) {
    const int64_t n = std::min(r, Nq - i0), W = key_width(p.causal, i0, n, Nq, Nk);
    if (W == 0) {  // rows with nothing allowed: no gradient
      fill(row_chunk(dq, i0, n), 0.0);
      continue;
    }
    const bool direct = fresh && W == Nk;
    if (fresh && !direct) {
      fill(dk, 0.0);
      fill(dv, 0.0);
    }
    if (!direct && !dKc.defined()) {
      dKc = Tensor::empty(k.shape(), k.dtype(), k.device());
      dVc = Tensor::empty(v.shape(), v.dtype(), v.device());
    }
    fresh = false;
    const Tensor kw = row_chunk(k, 0, W), vw = row_chunk(v, 0, W), dkw = row_chunk(dk, 0, W),
                 dvw = row_chunk(dv, 0, W);
    const Tensor Pc = leading(P, n, W), dSc = leading(dS, n, W), qc = row_chunk(qs, i0, n),
                 dOc = row_chunk(dout, i0, n);
    matmul(qc, transposed(kw), Pc);
    attention_rows_softmax(Pc, kpm, {i0, Nq, p.causal, true, Nk}, lse);  // P = exp(S - lse)
    if (direct) {
      matmul(transposed(Pc), dOc, dv);
    } else {
      const Tensor t = leading(dVc, W, v.shape()[3]);
      matmul(transposed(Pc), dOc, t);
      add_scaled(dvw, t, 1.0, dvw);
    }
    matmul(dOc, transposed(vw), dSc);  // dP
    // dS = P (dP - D_i): D broadcast along the keys (stride 0).
    binary(BinaryOp::Sub, dSc, make_view(D4, {B, H, n, W}, {H * Nq, Nq, 1, 0}, D4.offset() + i0, "flash_attention"),
           dSc);
    binary(BinaryOp::Mul, dSc, Pc, dSc);
    const Tensor dQn = leading(dQc, n, Dk);
    matmul(dSc, kw, dQn);
    binary(BinaryOp::Mul, dQn, scale, row_chunk(dq, i0, n));  // dq = scale dS k
    if (direct) {                                              // dk = scale dS^T q, q scaled already
      matmul(transposed(dSc), qc, dk);
    } else {
      const Tensor t = leading(dKc, W, Dk);
      matmul(transposed(dSc), qc, t);
      add_scaled(dkw, t, 1.0, dkw);
    }
  }
  // The last chunk sees every key (W = Nk > 0), so dk and dv are always written by here.
}

}  // namespace cf::kernels
