// CPU fused attention: tiles multiplied by single-threaded BLAS inside one
// OpenMP team (kernels/matmul/matmul.h says why cf never nests BLAS threads).
//
// flash_attention forward (FlashAttention-2, Alg. 1): work item = (batch*head,
// query tile). For each key tile: S = scale Q K^T, masked entries -inf, running
// max m and sum l per row, O <- O exp(m_old - m_new) + exp(S - m_new) V; at the
// end O / l and lse = m + log l.
// Backward (Alg. 2): P = exp(S - lse) recomputed per tile, D_i = dO_i . O_i,
// dV += P^T dO, dP = dO V^T, dS = P (dP - D), dQ += scale dS K, dK += scale dS^T Q.
// The bfloat16 arm (flash_attention_*_bf16_cpu) is the same code with bfloat16 q, k, v (and dO) read by
// AMX tiles (kernels/matmul/bf16_amx.h), or by vdpbf16ps on an AMD CPU without AMX (bf16_dot.h): every
// product in float32, softmax statistics, out, lse and the
// gradients in float32; the probabilities and dS are rounded to bfloat16 for the products with V, dO, K
// and Q (each value to the same bfloat16 in every product it enters), as FlashAttention's 16-bit kernels do.
// Work item = (batch*head, slice of key tiles): each owns its dK, dV rows; when
// there are fewer (batch*head) than threads the key range is split and each
// slice adds its dQ into a private buffer, summed at the end (O(N d) memory).
//
// block_attention: work item = (batch*head, chunk). Forward gathers the chunk's
// query rows and its window's key/value rows (w x D, W x D tiles), one softmax
// per row, and writes rows straight to token order. Backward: pass A per
// (batch*head, chunk) writes dQ rows and the window's dK/dV contributions into a
// buffer; pass B per (batch*head, key chunk) sums, for each key row, the
// contributions of the (distinct) windows that contain it. No atomics, no races,
// deterministic.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/attention/attention.h"
#include "kernels/attention/softmax_grad.h"
#include "kernels/common/parallel.h"
#include "kernels/common/row_math.h"
#include "kernels/common/scratch.h"
#include "kernels/matmul/bf16_amx.h"
#include "kernels/matmul/bf16_dot.h"
#include "kernels/matmul/matmul.h"

namespace cf::kernels {

namespace {

// Tiles: 128 query rows x 512 keys. The (128 x 512) score tile (256 KiB in
// float32) stays in L2, and the GEMMs are large enough for BLAS to run near its
// peak: on the 2-core dev machine 64 x 128 tiles were 1.3-1.5x slower
// (cf-bench attention --threads 1, N = 2048), 256 x 1024 no faster.
constexpr int64_t kBr = 128;
constexpr int64_t kBc = 512;

// Row-major C = alpha op(A) op(B) + beta C.
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N),
              int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
                 const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N),
              int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

// bfloat16 A and B (the bfloat16 arm): products in float32 on AMX tiles, or with vdpbf16ps where AMX is missing or
// switched off (bf16_products_available), into a float32 C; beta is 0 or 1. (A backward that runs after a switch
// was turned off still finds a kernel the CPU runs: the switches choose between kernels.)
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const BFloat16* A, int64_t lda,
                 const BFloat16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const bool amx = bf16_amx_available() || (bf16_amx_supported() && !bf16_dot_supported());
  (amx ? bf16_amx_gemm_f32 : bf16_dot_gemm_f32)(A, ta ? 1 : lda, ta ? lda : 1, B, tb ? 1 : ldb, tb ? ldb : 1, C, ldc,
                                                M, N, K, alpha, beta != 0);
}
// A float32 A (probabilities, dS) times a bfloat16 B: A rounded to bfloat16 first, once per element.
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const BFloat16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const int64_t rows = ta ? K : M, cols = ta ? M : K;  // A as stored
  thread_local std::vector<uint16_t> rounded;
  const ScratchTrim trim(rounded);
  scratch_resize(rounded, size_t(rows * cols));
  const RowMath& rm = row_math();  // (the kernels took it before their parallel loops: no bad CF_CPU_ISA here)
  for (int64_t r = 0; r < rows; ++r) rm.to_bf16(A + r * lda, rounded.data() + r * cols, cols);
  gemm(ta, tb, M, N, K, alpha, reinterpret_cast<const BFloat16*>(rounded.data()), cols, B, ldb, beta, C, ldc);
}

// A float32 operand (dS) used by two products, as those products take it: itself for the float kernels, rounded
// to bfloat16 once for the bfloat16 arm (the float-A overload above would round it again for the second product).
template <typename In, typename T>
const In* as_operand(const RowMath& rm, const T* A, int64_t n) {
  if constexpr (std::is_same_v<In, T>) {
    return A;
  } else {
    static_assert(std::is_same_v<In, BFloat16> && std::is_same_v<T, float>, "the bfloat16 arm rounds float32 to bfloat16");
    thread_local std::vector<uint16_t> rounded;
    rounded.resize(size_t(n));
    rm.to_bf16(A, rounded.data(), n);
    return reinterpret_cast<const In*>(rounded.data());
  }
}

// Runs body(item, thread) over [0, items) on the OpenMP team (dynamic schedule:
// causal tiles differ in cost), serially when the work is small. `per_thread`
// is called once per thread before its items, to allocate its scratch.
// An exception (the scratch's bad_alloc) is raised after the region (ParallelErrors).
template <typename Init, typename Body>
void run_items(int64_t items, double flops, Init&& per_thread, Body&& body) {
  const int nt = max_threads();
  const bool par = nt > 1 && items > 1 && flops >= 2e6;
  ParallelErrors errors;
#pragma omp parallel num_threads(nt) if (par)
  {
    std::optional<decltype(per_thread())> scratch;
    errors.run([&] { scratch.emplace(per_thread()); });
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it)
      if (scratch) errors.run([&] { body(it, *scratch); });
  }
  errors.rethrow();
}

// ------------------------------------------------------------- flash attention

struct FlashDims {
  int64_t B, H, Nq, Nk, Dk, Dv;
};

FlashDims flash_dims(const Tensor& q, const Tensor& v) {
  return {q.shape()[0], q.shape()[1], q.shape()[2], v.shape()[2], q.shape()[3], v.shape()[3]};
}

// Attention-weight dropout of the fused kernels and the GEMM path's row steps (FlashAttentionParams and
// BlockAttentionParams say which weights drop): apply() writes to out (may be x) the run x of weights of
// query row i of batch*head bh, dropped or scaled, each counter the index of that weight in the dense
// (B, H, Nq, Nk) weights: keys j0 .. j0 + n - 1, or (block attention, Nq = Nk = N) the key positions
// cols[0 .. n) (an empty slot's -1 meets a weight that is 0 anyway). Only called when on.
struct AttentionDropout {
  bool on;
  uint64_t seed, counter0, threshold, Nq, Nk;
  double scale;
  AttentionDropout(double rate, uint64_t seed_, uint64_t counter0_, int64_t Nq_, int64_t Nk_)
      : on(rate > 0),
        seed(seed_),
        counter0(counter0_),
        threshold(dropout_threshold(rate)),
        Nq(uint64_t(Nq_)),
        Nk(uint64_t(Nk_)),
        scale(1.0 / (1.0 - rate)) {}
  AttentionDropout(const FlashAttentionParams& p, const FlashDims& d)
      : AttentionDropout(p.dropout, p.dropout_seed, p.dropout_counter0, d.Nq, d.Nk) {}
  AttentionDropout(const RowDropout& r, int64_t Nq_, int64_t Nk_)
      : AttentionDropout(r.rate, r.seed, r.counter0, Nq_, Nk_) {}
  template <typename T>
  void apply(const RowMath& rm, const T* x, T* out, int64_t n, int64_t bh, int64_t i, int64_t j0,
             const int64_t* cols = nullptr) const {
    dropout_row(rm, x, out, n, seed, counter0 + (uint64_t(bh) * Nq + uint64_t(i)) * Nk + uint64_t(j0), threshold,
                T(scale), cols);
  }
  // The backward's step for one row: Z = the dropped, scaled P (to out); dP' = dP / (1 - rate) where Z is not 0
  // (dropped, or P = 0: then dS = P (dP' - D) is 0 either way), in place in dp.
  template <typename T>
  void backward_row(const RowMath& rm, const T* P, T* Z, T* dp, int64_t n, int64_t bh, int64_t i, int64_t j0,
                    const int64_t* cols = nullptr) const {
    apply(rm, P, Z, n, bh, i, j0, cols);
    const T keep = T(scale);
    for (int64_t c = 0; c < n; ++c) dp[c] = Z[c] != T(0) ? dp[c] * keep : T(0);
  }
  // backward_row over a gathered (nr x nc) tile: query rows at positions qpos (-1: an empty slot, whose P and
  // dO rows are 0, so its Z row is 0), keys at positions kpos. Returns the weights that met V: Z, or P when off.
  template <typename T>
  const T* gathered_backward(const RowMath& rm, const T* P, T* Z, T* dp, int64_t nr, int64_t nc, int64_t bh,
                             const int64_t* qpos, const int64_t* kpos) const {
    if (!on) return P;
    for (int64_t r = 0; r < nr; ++r) {
      if (qpos[r] < 0)
        std::fill(Z + r * nc, Z + (r + 1) * nc, T(0));
      else
        backward_row(rm, P + r * nc, Z + r * nc, dp + r * nc, nc, bh, qpos[r], 0, kpos);
    }
    return Z;
  }
};

// A row whose maximum is -inf holds nothing allowed, or NaN scores beside -inf ones (the row
// maximum skips NaN): only the first is the masked-row rule (zeros, lse -inf). A NaN must come
// out as NaN, as from the dense softmax, or a diverging run would look finite.
template <typename T>
bool has_nan(const T* x, int64_t n) {
  for (int64_t c = 0; c < n; ++c)
    if (std::isnan(x[c])) return true;
  return false;
}

// Scores of one tile with the masks applied: S[r, c] = -inf where key j0 + c is
// padding or (causal) after query i0 + r.
template <typename T>
void mask_tile(T* S, int64_t nr, int64_t nc, int64_t i0, int64_t j0, const bool* pad, bool causal,
               int64_t shift) {
  const T ninf = -std::numeric_limits<T>::infinity();
  if (pad) {
    for (int64_t c = 0; c < nc; ++c)
      if (pad[j0 + c])
        for (int64_t r = 0; r < nr; ++r) S[r * nc + c] = ninf;
  }
  if (causal && j0 + nc - 1 > i0 + shift) {  // the tile crosses the diagonal
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t first_blocked = std::max<int64_t>(0, i0 + r + shift + 1 - j0);
      for (int64_t c = first_blocked; c < nc; ++c) S[r * nc + c] = ninf;
    }
  }
}

// T: the arithmetic, out and lse; In: q, k, v (T, or bfloat16 with T = float: the bfloat16 arm).
template <typename T, typename In = T>
void flash_forward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                         const FlashAttentionParams& p, const Tensor& out, const Tensor& lse) {
  const FlashDims d = flash_dims(q, v);
  if (d.B * d.H * d.Nq == 0) return;
  use_single_threaded_blas();
  const In* Q = q.data<In>();
  const In* K = k.data<In>();
  const In* V = v.data<In>();
  const bool* pad = kpm.defined() ? kpm.data<bool>() : nullptr;
  T* O = out.data<T>();
  T* L = lse.data<T>();
  const T scale = T(p.scale);
  const int64_t shift = d.Nk - d.Nq, nqt = (d.Nq + kBr - 1) / kBr;
  const T ninf = -std::numeric_limits<T>::infinity();
  const RowMath& rm = row_math();
  const AttentionDropout drop(p, d);
  struct Scratch {
    std::vector<T> S, acc;
    std::vector<T> m;
    std::vector<double> l;
  };
  run_items(
      d.B * d.H * nqt, 2.0 * double(d.B * d.H) * double(d.Nq) * double(d.Nk) * double(d.Dk + d.Dv),
      [&] {
        return Scratch{std::vector<T>(size_t(kBr * kBc)), std::vector<T>(size_t(kBr * d.Dv)),
                       std::vector<T>(size_t(kBr)), std::vector<double>(size_t(kBr))};
      },
      [&](int64_t it, Scratch& s) {
        const int64_t bh = it / nqt, i0 = (it % nqt) * kBr, nr = std::min(kBr, d.Nq - i0), b = bh / d.H;
        const In* Qt = Q + (bh * d.Nq + i0) * d.Dk;
        const In* Kb = K + bh * d.Nk * d.Dk;
        const In* Vb = V + bh * d.Nk * d.Dv;
        const bool* pb = pad ? pad + b * d.Nk : nullptr;
        std::fill(s.acc.begin(), s.acc.begin() + nr * d.Dv, T(0));
        std::fill(s.m.begin(), s.m.end(), ninf);
        std::fill(s.l.begin(), s.l.end(), 0.0);
        // Causal: keys after the tile's last query are blocked for every row.
        const int64_t j_end = p.causal ? std::min(d.Nk, std::max<int64_t>(0, i0 + nr + shift)) : d.Nk;
        for (int64_t j0 = 0; j0 < j_end; j0 += kBc) {
          const int64_t nc = std::min(kBc, j_end - j0);
          T* S = s.S.data();
          gemm(false, true, nr, nc, d.Dk, scale, Qt, d.Dk, Kb + j0 * d.Dk, d.Dk, T(0), S, nc);
          mask_tile(S, nr, nc, i0, j0, pb, p.causal, shift);
          for (int64_t r = 0; r < nr; ++r) {
            T* Sr = S + r * nc;
            const T m_new = std::max(s.m[size_t(r)], max_row(rm, Sr, nc, ninf));
            if (m_new == ninf) {  // nothing allowed in this row yet: P = 0
              if (has_nan(Sr, nc)) s.l[size_t(r)] = std::numeric_limits<double>::quiet_NaN();  // stays NaN
              std::fill(Sr, Sr + nc, T(0));
              continue;
            }
            exp_shifted(rm, Sr, Sr, nc, m_new);
            const T alpha = s.m[size_t(r)] == ninf ? T(0) : T(std::exp(s.m[size_t(r)] - m_new));
            s.l[size_t(r)] = s.l[size_t(r)] * double(alpha) + sum_row(rm, Sr, nc);
            s.m[size_t(r)] = m_new;
            if (drop.on) drop.apply(rm, Sr, Sr, nc, bh, i0 + r, j0);  // after the sum: l normalises before dropout
            if (alpha != T(1)) {
              T* a = s.acc.data() + r * d.Dv;
              for (int64_t c = 0; c < d.Dv; ++c) a[c] *= alpha;
            }
          }
          gemm(false, false, nr, d.Dv, nc, T(1), S, nc, Vb + j0 * d.Dv, d.Dv, T(1), s.acc.data(), d.Dv);
        }
        T* Ot = O + (bh * d.Nq + i0) * d.Dv;
        for (int64_t r = 0; r < nr; ++r) {
          const double l = s.l[size_t(r)];
          T* o = Ot + r * d.Dv;
          const T* a = s.acc.data() + r * d.Dv;
          if (l != 0) {  // NaN too: a NaN score makes the row's out and lse NaN
            const T inv = T(1.0 / l);
            for (int64_t c = 0; c < d.Dv; ++c) o[c] = a[c] * inv;
            L[bh * d.Nq + i0 + r] = T(double(s.m[size_t(r)]) + std::log(l));
          } else {  // every key blocked: zeros (the documented rule), lse -inf
            std::fill(o, o + d.Dv, T(0));
            L[bh * d.Nq + i0 + r] = ninf;
          }
        }
      });
}

// P = exp(S - lse_row) over a tile, in place; rows with lse = -inf (nothing
// allowed) and masked entries (-inf scores) give 0.
template <typename T>
void probs_from_lse(const RowMath& rm, T* S, int64_t nr, int64_t nc, const T* lse) {
  const T ninf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < nr; ++r) {
    T* Sr = S + r * nc;
    if (lse[r] == ninf)
      std::fill(Sr, Sr + nc, T(0));
    else
      exp_shifted(rm, Sr, Sr, nc, lse[r]);
  }
}

// D_i = dO_i . O_i (FlashAttention-2 Alg. 2 line 4), for rows [0, n), minus the
// incoming lse gradient where there is one (d lse_i / d S_ij = P_ij, so that
// term joins dS = P (dP - D + dlse)).
template <typename T, typename In = T>
void row_dots(const In* dO, int64_t ldo_d, const T* O, int64_t ldo, int64_t n, int64_t Dv, const T* dlse,
              int64_t ld_lse, T* D) {
  for (int64_t r = 0; r < n; ++r) {
    double acc = 0;
    const In* a = dO + r * ldo_d;
    const T* o = O + r * ldo;
    for (int64_t c = 0; c < Dv; ++c) acc += double(a[c]) * double(o[c]);
    if (dlse) acc -= double(dlse[r * ld_lse]);
    D[r] = T(acc);
  }
}

// T: the arithmetic, out, lse and the gradients; In: q, k, v and dout (as flash_forward_typed).
template <typename T, typename In = T>
void flash_backward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                          const FlashAttentionParams& p, const Tensor& out, const Tensor& lse, const Tensor& dout,
                          const Tensor& dlse, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const RowMath& rm = row_math();
  const FlashDims d = flash_dims(q, v);
  const int64_t BH = d.B * d.H;
  std::fill(dq.data<T>(), dq.data<T>() + dq.numel(), T(0));
  std::fill(dk.data<T>(), dk.data<T>() + dk.numel(), T(0));
  std::fill(dv.data<T>(), dv.data<T>() + dv.numel(), T(0));
  if (BH * d.Nq * d.Nk == 0) return;
  use_single_threaded_blas();
  const In* Q = q.data<In>();
  const In* K = k.data<In>();
  const In* V = v.data<In>();
  const T* O = out.data<T>();
  const T* L = lse.data<T>();
  const In* dO = dout.data<In>();
  const T* dL = dlse.defined() ? dlse.data<T>() : nullptr;
  const bool* pad = kpm.defined() ? kpm.data<bool>() : nullptr;
  const T scale = T(p.scale);
  const int64_t shift = d.Nk - d.Nq, nkt = (d.Nk + kBc - 1) / kBc;
  const double flops = 2.0 * double(BH) * double(d.Nq) * double(d.Nk) * double(3 * d.Dk + 2 * d.Dv);
  const AttentionDropout drop(p, d);

  std::vector<T> D(size_t(BH * d.Nq));
  parallel_for(BH * d.Nq, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(d.Dv, 1)),
               [&](int64_t a, int64_t e) {
                 row_dots<T, In>(dO + a * d.Dv, d.Dv, O + a * d.Dv, d.Dv, e - a, d.Dv, dL ? dL + a : nullptr, 1,
                             D.data() + a);
               });

  // Key slices per batch*head: enough items for every thread.
  const int nt = max_threads();
  const int64_t parts = std::min<int64_t>(nkt, std::max<int64_t>(1, (nt + BH - 1) / BH));
  std::vector<T> dq_part(parts > 1 ? size_t(BH * parts * d.Nq * d.Dk) : 0, T(0));
  struct Scratch {
    std::vector<T> S, dP, Z;
  };
  run_items(
      BH * parts, flops,
      [&] {
        return Scratch{std::vector<T>(size_t(kBr * kBc)), std::vector<T>(size_t(kBr * kBc)),
                       std::vector<T>(drop.on ? size_t(kBr * kBc) : 0)};
      },
      [&](int64_t it, Scratch& s) {
        const int64_t bh = it / parts, part = it % parts, b = bh / d.H;
        const int64_t t_begin = part * nkt / parts, t_end = (part + 1) * nkt / parts;
        const In* Qb = Q + bh * d.Nq * d.Dk;
        const In* Kb = K + bh * d.Nk * d.Dk;
        const In* Vb = V + bh * d.Nk * d.Dv;
        const In* dOb = dO + bh * d.Nq * d.Dv;
        const T* Lb = L + bh * d.Nq;
        const T* Db = D.data() + bh * d.Nq;
        T* dQb = parts > 1 ? dq_part.data() + it * d.Nq * d.Dk : dq.data<T>() + bh * d.Nq * d.Dk;
        T* dKb = dk.data<T>() + bh * d.Nk * d.Dk;
        T* dVb = dv.data<T>() + bh * d.Nk * d.Dv;
        const bool* pb = pad ? pad + b * d.Nk : nullptr;
        for (int64_t t = t_begin; t < t_end; ++t) {
          const int64_t j0 = t * kBc, nc = std::min(kBc, d.Nk - j0);
          // Causal: query i sees key j0 only when i >= j0 - shift.
          const int64_t i_first = p.causal ? std::max<int64_t>(0, j0 - shift) : 0;
          for (int64_t i0 = (i_first / kBr) * kBr; i0 < d.Nq; i0 += kBr) {
            const int64_t nr = std::min(kBr, d.Nq - i0);
            T* S = s.S.data();
            T* dP = s.dP.data();
            gemm(false, true, nr, nc, d.Dk, scale, Qb + i0 * d.Dk, d.Dk, Kb + j0 * d.Dk, d.Dk, T(0), S, nc);
            mask_tile(S, nr, nc, i0, j0, pb, p.causal, shift);
            probs_from_lse(rm, S, nr, nc, Lb + i0);
            // dP = dO V^T, then dS = P (dP - D) in place. With dropout the weights that meet V are
            // Z = mask P / (1 - rate), so dP = mask (dO V^T) / (1 - rate), and D = dO . O is still
            // rowsum(P dP). The mask is drawn once per entry, into Z: where Z is 0 either the entry
            // dropped or P is 0, and in both cases dS = P (dP - D) takes dP = 0 correctly.
            gemm(false, true, nr, nc, d.Dv, T(1), dOb + i0 * d.Dv, d.Dv, Vb + j0 * d.Dv, d.Dv, T(0), dP, nc);
            const T* W = S;  // the weights that met V in the forward
            if (drop.on) {
              T* Z = s.Z.data();
              for (int64_t r = 0; r < nr; ++r)
                drop.backward_row(rm, S + r * nc, Z + r * nc, dP + r * nc, nc, bh, i0 + r, j0);
              W = Z;
            }
            for (int64_t r = 0; r < nr; ++r) softmax_grad_row(rm, S + r * nc, dP + r * nc, nc, Db[i0 + r]);
            // dV += W^T dO (W = P, or Z with dropout)
            gemm(true, false, nc, d.Dv, nr, T(1), W, nc, dOb + i0 * d.Dv, d.Dv, T(1), dVb + j0 * d.Dv, d.Dv);
            // dQ += scale dS K, dK += scale dS^T Q
            const In* dS = as_operand<In>(rm, dP, nr * nc);
            gemm(false, false, nr, d.Dk, nc, scale, dS, nc, Kb + j0 * d.Dk, d.Dk, T(1), dQb + i0 * d.Dk, d.Dk);
            gemm(true, false, nc, d.Dk, nr, scale, dS, nc, Qb + i0 * d.Dk, d.Dk, T(1), dKb + j0 * d.Dk, d.Dk);
          }
        }
      });
  if (parts > 1) {
    T* dQ = dq.data<T>();
    const int64_t per = d.Nq * d.Dk;
    parallel_for(BH * per, kParallelGrain, [&](int64_t a, int64_t e) {
      for (int64_t x = a; x < e; ++x) {
        const int64_t bh = x / per, r = x % per;
        T acc = T(0);
        for (int64_t pt = 0; pt < parts; ++pt) acc += dq_part[size_t((bh * parts + pt) * per + r)];
        dQ[x] = acc;
      }
    });
  }
}

// ------------------------------------------------------------- block attention

// H: heads of q, k, v; R rounds over them; Ho = H * R output heads (out, lse and
// their gradients), table head h * R + r for output head h * R + r.
struct BlockDims {
  int64_t B, H, N, Dk, Dv, Hm, C, w, nb, W, R, Ho;
  const int64_t* table(const int64_t* M, int64_t b, int64_t ho) const {
    return M + (b * Hm + (Hm == 1 ? 0 : ho)) * C * w;
  }
};

BlockDims block_dims(const Tensor& q, const Tensor& v, const Tensor& members, const BlockAttentionParams& p) {
  BlockDims d{q.shape()[0],       q.shape()[1],       q.shape()[2], q.shape()[3], v.shape()[3],
              members.shape()[1], members.shape()[2], members.shape()[3], int64_t(p.offsets.size()),
              0,                  p.rounds,           0};
  d.W = d.nb * d.w;
  d.Ho = d.H * d.R;
  return d;
}

// The window of chunk c: key position of each of the W window slots (-1 empty).
inline void window_positions(const int64_t* mh, int64_t c, const BlockDims& d, const BlockAttentionParams& p,
                             int64_t* jpos) {
  for (int64_t t = 0; t < d.nb; ++t) {
    const int64_t cc = (((c + p.offsets[size_t(t)]) % d.C) + d.C) % d.C;
    for (int64_t u = 0; u < d.w; ++u) jpos[t * d.w + u] = mh[cc * d.w + u];
  }
}

// Copies rows pos[i] of X (row length D) into G (n x D); empty positions give zero rows.
template <typename T>
void gather_rows(const T* X, int64_t D, const int64_t* pos, int64_t n, T* G) {
  for (int64_t i = 0; i < n; ++i) {
    if (pos[i] < 0)
      std::fill(G + i * D, G + (i + 1) * D, T(0));
    else
      std::copy(X + pos[i] * D, X + (pos[i] + 1) * D, G + i * D);
  }
}

// Masks an (nr x nc) score tile whose rows are the query positions qpos and
// columns the key positions jpos: blocked -> -inf (an empty query or key slot, a
// padded key, causal by original position), own score -> self_score under
// self_mask (the Reformer rule: weight 0 beside any allowed key, 1 alone). Sets
// self[r * nc + c] for the entries that got self_score (their score has no gradient).
// What a column allows is worked out once per tile (lim, own: mask_row in row_math.h), so
// each row is two compares and two selects per entry, in the CPU tier in use.
template <typename T>
void mask_scores(const RowMath& rm, T* S, const int64_t* qpos, int64_t nr, const int64_t* jpos, int64_t nc,
                 const bool* pad, bool causal, bool self_mask, double self_score, char* self) {
  const T ninf = -std::numeric_limits<T>::infinity();
  thread_local std::vector<int64_t> cols;
  cols.resize(size_t(2 * nc));
  int64_t* lim = cols.data();  // a query at i sees key column c iff lim[c] <= i
  int64_t* own = lim + nc;     // the query at own[c] gets self_score there (-1: nobody)
  for (int64_t c = 0; c < nc; ++c) {
    const int64_t j = jpos[c];
    const bool blocked = j < 0 || (pad && pad[j]);
    lim[c] = blocked ? std::numeric_limits<int64_t>::max() : causal ? j : std::numeric_limits<int64_t>::min();
    own[c] = !blocked && self_mask ? j : -1;
  }
  for (int64_t r = 0; r < nr; ++r) {
    T* Sr = S + r * nc;
    char* selfr = self ? self + r * nc : nullptr;
    if (qpos[r] < 0) {  // an empty query slot sees nothing
      std::fill(Sr, Sr + nc, ninf);
      if (selfr) std::fill(selfr, selfr + nc, char(0));
      continue;
    }
    mask_row(rm, Sr, lim, own, nc, qpos[r], T(self_score), selfr);
  }
}

// dS of one row of a masked tile (softmax_grad_row), 0 where self marks a self-masked entry: a
// constant score passes no gradient (self may be null: none).
template <typename T>
void softmax_grad_masked_row(const RowMath& rm, const T* p, T* dp, int64_t n, T D, const char* self) {
  softmax_grad_row(rm, p, dp, n, D);
  if (self)
    for (int64_t c = 0; c < n; ++c)
      if (self[c]) dp[c] = T(0);
}

// Softmax of each row of a masked (nr x nc) score tile, in place, and the row's
// log-sum-exp into lse[r]; a row with nothing allowed becomes zeros, lse -inf.
template <typename T>
void softmax_rows(const RowMath& rm, T* S, int64_t nr, int64_t nc, T* lse) {
  const T ninf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < nr; ++r) {
    T* Sr = S + r * nc;
    const T m = max_row(rm, Sr, nc, ninf);
    if (m == ninf) {
      // NaN beside blocked entries: the row is NaN, not masked (P NaN where a score is, 0 where blocked,
      // as the CUDA row kernels write it)
      const bool nan = has_nan(Sr, nc);
      for (int64_t c = 0; c < nc; ++c) Sr[c] = std::isnan(Sr[c]) ? Sr[c] : T(0);
      lse[r] = nan ? std::numeric_limits<T>::quiet_NaN() : ninf;
      continue;
    }
    exp_shifted(rm, Sr, Sr, nc, m);
    const double z = sum_row(rm, Sr, nc);
    const T inv = T(1.0 / z);
    for (int64_t c = 0; c < nc; ++c) Sr[c] *= inv;
    lse[r] = T(double(m) + std::log(z));
  }
}

// T: the arithmetic, out and lse; In: q, k, v (T, or bfloat16 with T = float, as flash_forward_typed).
template <typename T, typename In = T>
void block_forward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                         const Tensor& kpm, const BlockAttentionParams& p, const Tensor& out, const Tensor& lse) {
  const RowMath& rm = row_math();
  const BlockDims d = block_dims(q, v, members, p);
  const T ninf = -std::numeric_limits<T>::infinity();
  T* O = out.data<T>();
  T* L = lse.data<T>();
  const int64_t os0 = out.strides()[0], os1 = out.strides()[1], os2 = out.strides()[2];
  const int64_t ls0 = lse.strides()[0], ls1 = lse.strides()[1], ls2 = lse.strides()[2];
  // Tokens in no slot keep these.
  parallel_for(d.B * d.Ho * d.N, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(d.Dv, 1)),
               [&](int64_t a, int64_t e) {
                 for (int64_t x = a; x < e; ++x) {
                   const int64_t b = x / (d.Ho * d.N), h = (x / d.N) % d.Ho, n = x % d.N;
                   T* o = O + b * os0 + h * os1 + n * os2;
                   std::fill(o, o + d.Dv, T(0));
                   L[b * ls0 + h * ls1 + n * ls2] = ninf;
                 }
               });
  if (d.B * d.Ho * d.N == 0) return;
  use_single_threaded_blas();
  const In* Q = q.data<In>();
  const In* K = k.data<In>();
  const In* V = v.data<In>();
  const int64_t* M = members.data<int64_t>();
  const bool* pad = kpm.defined() ? kpm.data<bool>() : nullptr;
  const AttentionDropout drop(p.dropout, p.dropout_seed, p.dropout_counter0, d.N, d.N);
  struct Scratch {
    std::vector<In> Qg, Kg, Vg;
    std::vector<T> S, Og, Lr;
    std::vector<int64_t> jpos;
  };
  run_items(
      d.B * d.Ho * d.C, 2.0 * double(d.B * d.Ho * d.C) * double(d.w * d.W) * double(d.Dk + d.Dv),
      [&] {
        return Scratch{std::vector<In>(size_t(d.w * d.Dk)), std::vector<In>(size_t(d.W * d.Dk)),
                       std::vector<In>(size_t(d.W * d.Dv)), std::vector<T>(size_t(d.w * d.W)),
                       std::vector<T>(size_t(d.w * d.Dv)), std::vector<T>(size_t(d.w)),
                       std::vector<int64_t>(size_t(d.W))};
      },
      [&](int64_t it, Scratch& s) {
        // bo: output head (b, h) of B x Ho; bh: the q, k, v head it reads.
        const int64_t bo = it / d.C, c = it % d.C, b = bo / d.Ho, h = bo % d.Ho, bh = bo / d.R;
        const int64_t* mh = d.table(M, b, h);
        const int64_t* qpos = mh + c * d.w;
        window_positions(mh, c, d, p, s.jpos.data());
        gather_rows(Q + bh * d.N * d.Dk, d.Dk, qpos, d.w, s.Qg.data());
        gather_rows(K + bh * d.N * d.Dk, d.Dk, s.jpos.data(), d.W, s.Kg.data());
        gather_rows(V + bh * d.N * d.Dv, d.Dv, s.jpos.data(), d.W, s.Vg.data());
        T* S = s.S.data();
        gemm(false, true, d.w, d.W, d.Dk, T(p.scale), s.Qg.data(), d.Dk, s.Kg.data(), d.Dk, T(0), S, d.W);
        mask_scores(rm, S, qpos, d.w, s.jpos.data(), d.W, pad ? pad + b * d.N : nullptr, p.causal, p.self_mask,
                    p.self_score, static_cast<char*>(nullptr));
        softmax_rows(rm, S, d.w, d.W, s.Lr.data());
        if (drop.on)  // after lse: it normalises before dropout
          for (int64_t r = 0; r < d.w; ++r)
            if (qpos[r] >= 0) drop.apply(rm, S + r * d.W, S + r * d.W, d.W, bo, qpos[r], 0, s.jpos.data());
        gemm(false, false, d.w, d.Dv, d.W, T(1), S, d.W, s.Vg.data(), d.Dv, T(0), s.Og.data(), d.Dv);
        for (int64_t r = 0; r < d.w; ++r) {
          if (qpos[r] < 0) continue;
          std::copy(s.Og.data() + r * d.Dv, s.Og.data() + (r + 1) * d.Dv, O + b * os0 + h * os1 + qpos[r] * os2);
          L[b * ls0 + h * ls1 + qpos[r] * ls2] = s.Lr[size_t(r)];
        }
      });
}

// T: the arithmetic, out, lse and the gradients; In: q, k, v and dout.
template <typename T, typename In = T>
void block_backward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                          const Tensor& kpm, const BlockAttentionParams& p, const Tensor& out, const Tensor& lse,
                          const Tensor& dout, const Tensor& dlse, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv) {
  const RowMath& rm = row_math();
  const BlockDims d = block_dims(q, v, members, p);
  std::fill(dq.data<T>(), dq.data<T>() + dq.numel(), T(0));
  std::fill(dk.data<T>(), dk.data<T>() + dk.numel(), T(0));
  std::fill(dv.data<T>(), dv.data<T>() + dv.numel(), T(0));
  if (d.B * d.H * d.N == 0) return;
  use_single_threaded_blas();
  const T ninf = -std::numeric_limits<T>::infinity();
  const In* Q = q.data<In>();
  const In* K = k.data<In>();
  const In* V = v.data<In>();
  const T* O = out.data<T>();
  const T* L = lse.data<T>();
  const In* dO = dout.data<In>();
  const T* dL = dlse.defined() ? dlse.data<T>() : nullptr;
  const int64_t* M = members.data<int64_t>();
  const bool* pad = kpm.defined() ? kpm.data<bool>() : nullptr;
  const int64_t os0 = out.strides()[0], os1 = out.strides()[1], os2 = out.strides()[2];
  const int64_t ls0 = lse.strides()[0], ls1 = lse.strides()[1], ls2 = lse.strides()[2];
  const int64_t gs0 = dout.strides()[0], gs1 = dout.strides()[1], gs2 = dout.strides()[2];
  const int64_t es0 = dL ? dlse.strides()[0] : 0, es1 = dL ? dlse.strides()[1] : 0,
                es2 = dL ? dlse.strides()[2] : 0;
  const int64_t Dkv = d.Dk + d.Dv;
  // Pass A output: per (batch*head, chunk), the window's dK | dV rows.
  std::vector<T> contrib(size_t(d.B * d.H * d.C * d.W * Dkv));
  T* dQ = dq.data<T>();
  T* dKp = dk.data<T>();
  T* dVp = dv.data<T>();
  const AttentionDropout drop(p.dropout, p.dropout_seed, p.dropout_counter0, d.N, d.N);
  struct Scratch {
    std::vector<In> Qg, Kg, Vg, dOg;
    std::vector<T> S, dP, Dr, Lr, G, Z;
    std::vector<int64_t> jpos;
    std::vector<char> self;
  };
  // One round at a time: a position sits in one slot per round, so within a round
  // every dq row and (pass B) every dk, dv row has one writer; rounds add up in order.
  for (int64_t round = 0; round < d.R; ++round) {
    run_items(
        d.B * d.H * d.C, 2.0 * double(d.B * d.H * d.C) * double(d.w * d.W) * double(3 * d.Dk + 2 * d.Dv),
        [&] {
          return Scratch{std::vector<In>(size_t(d.w * d.Dk)), std::vector<In>(size_t(d.W * d.Dk)),
                         std::vector<In>(size_t(d.W * d.Dv)), std::vector<In>(size_t(d.w * d.Dv)),
                         std::vector<T>(size_t(d.w * d.W)),   std::vector<T>(size_t(d.w * d.W)),
                         std::vector<T>(size_t(d.w)),         std::vector<T>(size_t(d.w)),
                         std::vector<T>(size_t(d.w * d.Dk)),  std::vector<T>(drop.on ? size_t(d.w * d.W) : 0),
                         std::vector<int64_t>(size_t(d.W)),   std::vector<char>(size_t(d.w * d.W))};
        },
        [&](int64_t it, Scratch& s) {
          // bh: q, k, v head (b, hd); h: its output head in this round.
          const int64_t bh = it / d.C, c = it % d.C, b = bh / d.H, h = (bh % d.H) * d.R + round;
          const int64_t* mh = d.table(M, b, h);
          const int64_t* qpos = mh + c * d.w;
          window_positions(mh, c, d, p, s.jpos.data());
          gather_rows(Q + bh * d.N * d.Dk, d.Dk, qpos, d.w, s.Qg.data());
          gather_rows(K + bh * d.N * d.Dk, d.Dk, s.jpos.data(), d.W, s.Kg.data());
          gather_rows(V + bh * d.N * d.Dv, d.Dv, s.jpos.data(), d.W, s.Vg.data());
          for (int64_t r = 0; r < d.w; ++r) {
            const int64_t i = qpos[r];
            In* g = s.dOg.data() + r * d.Dv;
            if (i < 0) {
              std::fill(g, g + d.Dv, In(0.0f));
              s.Dr[size_t(r)] = T(0);
              s.Lr[size_t(r)] = ninf;
              continue;
            }
            const In* src = dO + b * gs0 + h * gs1 + i * gs2;
            std::copy(src, src + d.Dv, g);
            row_dots<T, In>(g, d.Dv, O + b * os0 + h * os1 + i * os2, d.Dv, 1, d.Dv,
                        dL ? dL + b * es0 + h * es1 + i * es2 : nullptr, 0, s.Dr.data() + r);
            s.Lr[size_t(r)] = L[b * ls0 + h * ls1 + i * ls2];
          }
          T* S = s.S.data();
          T* dP = s.dP.data();
          gemm(false, true, d.w, d.W, d.Dk, T(p.scale), s.Qg.data(), d.Dk, s.Kg.data(), d.Dk, T(0), S, d.W);
          mask_scores(rm, S, qpos, d.w, s.jpos.data(), d.W, pad ? pad + b * d.N : nullptr, p.causal, p.self_mask,
                      p.self_score, s.self.data());
          probs_from_lse(rm, S, d.w, d.W, s.Lr.data());
          T* cb = contrib.data() + it * d.W * Dkv;
          gemm(false, true, d.w, d.W, d.Dv, T(1), s.dOg.data(), d.Dv, s.Vg.data(), d.Dv, T(0), dP, d.W);
          // With dropout the weights that met V are Z (dropped, scaled), and dP becomes dP' (AttentionDropout).
          const T* Wt = drop.gathered_backward(rm, S, s.Z.data(), dP, d.w, d.W, b * d.Ho + h, qpos, s.jpos.data());
          // dV window = W^T dO (W = P, or Z with dropout; into the dV columns of the contribution rows)
          gemm(true, false, d.W, d.Dv, d.w, T(1), Wt, d.W, s.dOg.data(), d.Dv, T(0), cb + d.Dk, Dkv);
          for (int64_t r = 0; r < d.w; ++r)
            softmax_grad_masked_row(rm, S + r * d.W, dP + r * d.W, d.W, s.Dr[size_t(r)],
                                    p.self_mask ? s.self.data() + r * d.W : nullptr);
          const In* dS = as_operand<In>(rm, dP, d.w * d.W);
          gemm(false, false, d.w, d.Dk, d.W, T(p.scale), dS, d.W, s.Kg.data(), d.Dk, T(0), s.G.data(), d.Dk);
          for (int64_t r = 0; r < d.w; ++r) {
            if (qpos[r] < 0) continue;
            const T* src = s.G.data() + r * d.Dk;
            T* dst = dQ + (bh * d.N + qpos[r]) * d.Dk;
            for (int64_t x = 0; x < d.Dk; ++x) dst[x] += src[x];
          }
          gemm(true, false, d.W, d.Dk, d.w, T(p.scale), dS, d.W, s.Qg.data(), d.Dk, T(0), cb, Dkv);
        });
    // Pass B: key row j of chunk cc sits at window slot t * w + u of chunk cc - offsets[t].
    parallel_for(d.B * d.H * d.C, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(d.w * Dkv * d.nb, 1)),
                 [&](int64_t a, int64_t e) {
                   for (int64_t it = a; it < e; ++it) {
                     const int64_t bh = it / d.C, cc = it % d.C, b = bh / d.H, h = (bh % d.H) * d.R + round;
                     const int64_t* mh = d.table(M, b, h);
                     for (int64_t t = 0; t < d.nb; ++t) {
                       const int64_t c = (((cc - p.offsets[size_t(t)]) % d.C) + d.C) % d.C;
                       const T* cb = contrib.data() + (bh * d.C + c) * d.W * Dkv;
                       for (int64_t u = 0; u < d.w; ++u) {
                         const int64_t j = mh[cc * d.w + u];
                         if (j < 0) continue;
                         const T* src = cb + (t * d.w + u) * Dkv;
                         T* gk = dKp + (bh * d.N + j) * d.Dk;
                         T* gv = dVp + (bh * d.N + j) * d.Dv;
                         for (int64_t x = 0; x < d.Dk; ++x) gk[x] += src[x];
                         for (int64_t x = 0; x < d.Dv; ++x) gv[x] += src[d.Dk + x];
                       }
                     }
                   }
                 });
  }
}

// ------------------------------------------------------------- routed attention

// Query lists (B', H', C, wq) and key lists (B', H', C, wk), B' in {1, B}, H' in
// {1, H}, contiguous; a list of (b, h) starts at b * sb + h * sh + c * w.
struct RoutedDims {
  int64_t B, H, N, Dk, Dv, C, wq, wk, qsb, qsh, ksb, ksh;
};

RoutedDims routed_dims(const Tensor& q, const Tensor& v, const Tensor& qm, const Tensor& km) {
  const Shape &sq = qm.shape(), &sk = km.shape();
  const int64_t C = sq[2], wq = sq[3], wk = sk[3];
  return {q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3], v.shape()[3], C, wq, wk,
          sq[0] == 1 ? 0 : sq[1] * C * wq, sq[1] == 1 ? 0 : C * wq,
          sk[0] == 1 ? 0 : sk[1] * C * wk, sk[1] == 1 ? 0 : C * wk};
}

// The positions of one list; anything outside [0, N) is an empty slot (-1).
inline void list_positions(const int64_t* list, int64_t w, int64_t N, int64_t* pos) {
  for (int64_t s = 0; s < w; ++s) pos[s] = list[s] >= 0 && list[s] < N ? list[s] : -1;
}

// One (b, h, list) per item: its wq query rows against its wk key rows, in slot
// order (row c * wq + r of the (b, h) slice of out and lse).
template <typename T>
void routed_forward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qm, const Tensor& km,
                          const Tensor& kpm, const RoutedAttentionParams& p, const Tensor& out, const Tensor& lse) {
  const RowMath& rm = row_math();
  const RoutedDims d = routed_dims(q, v, qm, km);
  if (d.B * d.H * d.C == 0) return;
  use_single_threaded_blas();
  const T* Q = q.data<T>();
  const T* K = k.data<T>();
  const T* V = v.data<T>();
  const int64_t* QM = qm.data<int64_t>();
  const int64_t* KM = km.data<int64_t>();
  const bool* pad = kpm.defined() ? kpm.data<bool>() : nullptr;
  T* O = out.data<T>();
  T* L = lse.data<T>();
  const AttentionDropout drop(p.dropout, p.dropout_seed, p.dropout_counter0, d.N, d.N);
  struct Scratch {
    std::vector<T> Qg, Kg, Vg, S, Lr;
    std::vector<int64_t> qpos, kpos;
  };
  run_items(
      d.B * d.H * d.C, 2.0 * double(d.B * d.H * d.C) * double(d.wq * d.wk) * double(d.Dk + d.Dv),
      [&] {
        return Scratch{std::vector<T>(size_t(d.wq * d.Dk)), std::vector<T>(size_t(d.wk * d.Dk)),
                       std::vector<T>(size_t(d.wk * d.Dv)), std::vector<T>(size_t(d.wq * d.wk)),
                       std::vector<T>(size_t(d.wq)),        std::vector<int64_t>(size_t(d.wq)),
                       std::vector<int64_t>(size_t(d.wk))};
      },
      [&](int64_t it, Scratch& s) {
        const int64_t bh = it / d.C, c = it % d.C, b = bh / d.H, h = bh % d.H;
        list_positions(QM + b * d.qsb + h * d.qsh + c * d.wq, d.wq, d.N, s.qpos.data());
        list_positions(KM + b * d.ksb + h * d.ksh + c * d.wk, d.wk, d.N, s.kpos.data());
        gather_rows(Q + bh * d.N * d.Dk, d.Dk, s.qpos.data(), d.wq, s.Qg.data());
        gather_rows(K + bh * d.N * d.Dk, d.Dk, s.kpos.data(), d.wk, s.Kg.data());
        gather_rows(V + bh * d.N * d.Dv, d.Dv, s.kpos.data(), d.wk, s.Vg.data());
        T* S = s.S.data();
        gemm(false, true, d.wq, d.wk, d.Dk, T(p.scale), s.Qg.data(), d.Dk, s.Kg.data(), d.Dk, T(0), S, d.wk);
        mask_scores(rm, S, s.qpos.data(), d.wq, s.kpos.data(), d.wk, pad ? pad + b * d.N : nullptr, p.causal, false,
                    0.0, static_cast<char*>(nullptr));
        softmax_rows(rm, S, d.wq, d.wk, s.Lr.data());
        if (drop.on)  // after lse; list c's weights are the c-th dense (B, H, N, N) block of counters
          for (int64_t r = 0; r < d.wq; ++r)
            if (s.qpos[size_t(r)] >= 0)
              drop.apply(rm, S + r * d.wk, S + r * d.wk, d.wk, (p.list0 + c) * d.B * d.H + bh, s.qpos[size_t(r)],
                         0, s.kpos.data());
        const int64_t row0 = bh * d.C * d.wq + c * d.wq;  // this list's first slot row
        gemm(false, false, d.wq, d.Dv, d.wk, T(1), S, d.wk, s.Vg.data(), d.Dv, T(0), O + row0 * d.Dv, d.Dv);
        std::copy(s.Lr.begin(), s.Lr.end(), L + row0);
      });
}

// The slot-order gradients: dq (B, H, C * wq, Dk), dk (B, H, C * wk, Dk), dv
// (B, H, C * wk, Dv), every row written by its list's item (empty slots: zeros).
template <typename T>
void routed_backward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qm, const Tensor& km,
                           const Tensor& kpm, const RoutedAttentionParams& p, const Tensor& out, const Tensor& lse,
                           const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const RowMath& rm = row_math();
  const RoutedDims d = routed_dims(q, v, qm, km);
  if (d.B * d.H * d.C == 0) return;
  use_single_threaded_blas();
  const T ninf = -std::numeric_limits<T>::infinity();
  const T* Q = q.data<T>();
  const T* K = k.data<T>();
  const T* V = v.data<T>();
  const T* O = out.data<T>();
  const T* L = lse.data<T>();
  const T* dO = dout.data<T>();
  const int64_t* QM = qm.data<int64_t>();
  const int64_t* KM = km.data<int64_t>();
  const bool* pad = kpm.defined() ? kpm.data<bool>() : nullptr;
  T* dQ = dq.data<T>();
  T* dK = dk.data<T>();
  T* dV = dv.data<T>();
  const AttentionDropout drop(p.dropout, p.dropout_seed, p.dropout_counter0, d.N, d.N);
  struct Scratch {
    std::vector<T> Qg, Kg, Vg, dOg, S, dP, Dr, Lr, Z;
    std::vector<int64_t> qpos, kpos;
  };
  run_items(
      d.B * d.H * d.C, 2.0 * double(d.B * d.H * d.C) * double(d.wq * d.wk) * double(3 * d.Dk + 2 * d.Dv),
      [&] {
        return Scratch{std::vector<T>(size_t(d.wq * d.Dk)),  std::vector<T>(size_t(d.wk * d.Dk)),
                       std::vector<T>(size_t(d.wk * d.Dv)),  std::vector<T>(size_t(d.wq * d.Dv)),
                       std::vector<T>(size_t(d.wq * d.wk)),  std::vector<T>(size_t(d.wq * d.wk)),
                       std::vector<T>(size_t(d.wq)),         std::vector<T>(size_t(d.wq)),
                       std::vector<T>(drop.on ? size_t(d.wq * d.wk) : 0),
                       std::vector<int64_t>(size_t(d.wq)),   std::vector<int64_t>(size_t(d.wk))};
      },
      [&](int64_t it, Scratch& s) {
        const int64_t bh = it / d.C, c = it % d.C, b = bh / d.H, h = bh % d.H;
        const int64_t* qpos = s.qpos.data();
        list_positions(QM + b * d.qsb + h * d.qsh + c * d.wq, d.wq, d.N, s.qpos.data());
        list_positions(KM + b * d.ksb + h * d.ksh + c * d.wk, d.wk, d.N, s.kpos.data());
        gather_rows(Q + bh * d.N * d.Dk, d.Dk, qpos, d.wq, s.Qg.data());
        gather_rows(K + bh * d.N * d.Dk, d.Dk, s.kpos.data(), d.wk, s.Kg.data());
        gather_rows(V + bh * d.N * d.Dv, d.Dv, s.kpos.data(), d.wk, s.Vg.data());
        const int64_t qrow0 = bh * d.C * d.wq + c * d.wq, krow0 = bh * d.C * d.wk + c * d.wk;
        for (int64_t r = 0; r < d.wq; ++r) {  // an empty query slot passes no gradient
          T* g = s.dOg.data() + r * d.Dv;
          if (qpos[r] < 0) {
            std::fill(g, g + d.Dv, T(0));
            s.Dr[size_t(r)] = T(0);
            s.Lr[size_t(r)] = ninf;
            continue;
          }
          std::copy(dO + (qrow0 + r) * d.Dv, dO + (qrow0 + r + 1) * d.Dv, g);
          row_dots<T>(g, d.Dv, O + (qrow0 + r) * d.Dv, d.Dv, 1, d.Dv, nullptr, 0, s.Dr.data() + r);
          s.Lr[size_t(r)] = L[qrow0 + r];
        }
        T* S = s.S.data();
        T* dP = s.dP.data();
        gemm(false, true, d.wq, d.wk, d.Dk, T(p.scale), s.Qg.data(), d.Dk, s.Kg.data(), d.Dk, T(0), S, d.wk);
        mask_scores(rm, S, qpos, d.wq, s.kpos.data(), d.wk, pad ? pad + b * d.N : nullptr, p.causal, false, 0.0,
                    static_cast<char*>(nullptr));
        probs_from_lse(rm, S, d.wq, d.wk, s.Lr.data());
        // dV = W^T dO, dP = dO V^T, dS = P (dP - D), dQ = scale dS K, dK = scale dS^T Q; W = P, or with
        // dropout the dropped weights Z, and dP then dP' (AttentionDropout::backward_row).
        gemm(false, true, d.wq, d.wk, d.Dv, T(1), s.dOg.data(), d.Dv, s.Vg.data(), d.Dv, T(0), dP, d.wk);
        const T* Wt = drop.gathered_backward(rm, S, s.Z.data(), dP, d.wq, d.wk, (p.list0 + c) * d.B * d.H + bh, qpos,
                                             s.kpos.data());
        gemm(true, false, d.wk, d.Dv, d.wq, T(1), Wt, d.wk, s.dOg.data(), d.Dv, T(0), dV + krow0 * d.Dv, d.Dv);
        for (int64_t r = 0; r < d.wq; ++r) softmax_grad_row(rm, S + r * d.wk, dP + r * d.wk, d.wk, s.Dr[size_t(r)]);
        gemm(false, false, d.wq, d.Dk, d.wk, T(p.scale), dP, d.wk, s.Kg.data(), d.Dk, T(0), dQ + qrow0 * d.Dk,
             d.Dk);
        gemm(true, false, d.wk, d.Dk, d.wq, T(p.scale), dP, d.wk, s.Qg.data(), d.Dk, T(0), dK + krow0 * d.Dk,
             d.Dk);
      });
}

// ------------------------------------------------------------- rounds

// Rows (b, h, n) of the combined tensor; round r of row x = bh * N + n sits at
// per-round row (bh * R + r) * N + n. Rows have E = Dv + 1 entries [out | lse].
template <typename T>
void rounds_combine_typed(const Tensor& per_round, int64_t R, const Tensor& combined) {
  const int64_t N = combined.shape()[2], E = combined.shape()[3], Dv = E - 1, rows = combined.numel() / E;
  const T* X = per_round.data<T>();
  T* Y = combined.data<T>();
  const T ninf = -std::numeric_limits<T>::infinity();
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(R * E, 1)), [&](int64_t a, int64_t e) {
    std::vector<double> w(static_cast<size_t>(R));
    for (int64_t x = a; x < e; ++x) {
      const int64_t bh = x / N, n = x % N;
      auto src = [&](int64_t r) { return X + ((bh * R + r) * N + n) * E; };
      T* y = Y + x * E;
      T m = ninf;
      for (int64_t r = 0; r < R; ++r) {
        const T lse_r = src(r)[Dv];
        if (lse_r > m || std::isnan(lse_r)) m = lse_r;  // a NaN round makes the row NaN (NaN > m never holds)
      }
      std::fill(y, y + Dv, T(0));
      if (m == ninf) {
        y[Dv] = ninf;
        continue;
      }
      double z = 0;
      for (int64_t r = 0; r < R; ++r) {
        w[size_t(r)] = std::exp(double(src(r)[Dv] - m));
        z += w[size_t(r)];
      }
      for (int64_t r = 0; r < R; ++r) {
        const T wr = T(w[size_t(r)] / z);
        const T* o = src(r);
        for (int64_t c = 0; c < Dv; ++c) y[c] += wr * o[c];
      }
      y[Dv] = T(double(m) + std::log(z));
    }
  });
}

template <typename T>
void rounds_split_typed(const Tensor& per_round, const Tensor& combined, const Tensor& grad, int64_t R,
                        const Tensor& per_round_grad) {
  const int64_t N = combined.shape()[2], E = combined.shape()[3], Dv = E - 1, rows = combined.numel() / E;
  const T* X = per_round.data<T>();
  const T* Y = combined.data<T>();
  const T* G = grad.data<T>();
  T* GX = per_round_grad.data<T>();
  const T ninf = -std::numeric_limits<T>::infinity();
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(R * E, 1)), [&](int64_t a, int64_t e) {
    for (int64_t x = a; x < e; ++x) {
      const int64_t bh = x / N, n = x % N;
      const T* y = Y + x * E;
      const T* g = G + x * E;
      for (int64_t r = 0; r < R; ++r) {
        const int64_t at = ((bh * R + r) * N + n) * E;
        const T* o = X + at;
        T* d = GX + at;
        // d lse / d lse_r = w_r; d out / d lse_r = w_r (out_r - out); d out / d out_r = w_r.
        const T w = (y[Dv] == ninf || o[Dv] == ninf) ? T(0) : T(std::exp(double(o[Dv] - y[Dv])));
        T dot = T(0);
        for (int64_t c = 0; c < Dv; ++c) {
          dot += g[c] * (o[c] - y[c]);
          d[c] = w * g[c];
        }
        d[Dv] = w * (dot + g[Dv]);
      }
    }
  });
}

// The GEMM path's row steps (attention.h: attention_rows_softmax, attention_rows_grad): blocked keys -> -inf,
// then the fused kernel's own row helpers (softmax_rows forward; probs_from_lse, then dS = P (dP - D), in the
// backward, where dp and D are given), and with a rate its dropout: the same draws, in the same order of
// operations, as flash_forward_typed and flash_backward_typed.
template <typename T>
void rows_softmax_typed(const Tensor& scores, const Tensor& kpm, const AttentionRows& rw, const Tensor& lse,
                        const Tensor& dp = Tensor(), const Tensor& D = Tensor()) {
  const RowMath& rm = row_math();
  const int64_t B = scores.shape()[0], H = scores.shape()[1], R = scores.shape()[2], W = scores.shape()[3];
  const int64_t Nk = rw.Nk > 0 ? rw.Nk : W;
  const AttentionDropout drop(rw.dropout, rw.Nq, Nk);
  T* S = scores.data<T>();
  T* L = lse.data<T>();
  T* dP = dp.defined() ? dp.data<T>() : nullptr;
  const T* Dd = dP ? D.data<T>() : nullptr;
  const bool* pad = kpm.defined() ? kpm.data<bool>() : nullptr;
  const T ninf = -std::numeric_limits<T>::infinity();
  parallel_for(B * H * R, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(W, 1)), [&](int64_t a, int64_t e) {
    for (int64_t g = a; g < e; ++g) {
      const int64_t bh = g / R, i = rw.row0 + g % R, b = bh / H;
      const int64_t jend = rw.causal ? std::clamp<int64_t>(i + Nk - rw.Nq + 1, 0, W) : W;  // keys >= jend blocked
      const bool* pb = pad ? pad + b * Nk : nullptr;
      T* s = S + g * W;
      for (int64_t j = 0; j < W; ++j)
        if (j >= jend || (pb && pb[j])) s[j] = ninf;
      T* l = L + bh * rw.Nq + i;
      if (!dP) {
        softmax_rows(rm, s, 1, W, l);
        if (drop.on) drop.apply(rm, s, s, W, bh, i, 0);  // after lse: it normalises before dropout
        continue;
      }
      probs_from_lse(rm, s, 1, W, l);
      T* d = dP + g * W;
      const T Di = Dd[bh * rw.Nq + i];
      if (!drop.on) {
        softmax_grad_row(rm, s, d, W, Di);
        continue;
      }
      // dS from P and dP'; then Z takes P's place for dV = Z^T dO.
      thread_local std::vector<T> Z;
      Z.resize(static_cast<size_t>(W));
      drop.backward_row(rm, s, Z.data(), d, W, bh, i, 0);
      softmax_grad_row(rm, s, d, W, Di);
      std::copy(Z.begin(), Z.end(), s);
    }
  });
}

// ----------------------------------------------------- block attention's GEMM path steps

// A slot table view (B, Ho, n, s) (attention.h): the position of slot (b, ho, c, u), or -1 when empty.
struct SlotTable {
  const int64_t* t;
  int64_t Ho, n, s, s0, s1, s2, s3, N;
  explicit SlotTable(const Tensor& table, int64_t N_)
      : t(table.data<int64_t>()), Ho(table.shape()[1]), n(table.shape()[2]), s(table.shape()[3]),
        s0(table.strides()[0]), s1(table.strides()[1]), s2(table.strides()[2]), s3(table.strides()[3]), N(N_) {}
  // Row g of the B * Ho * n rows: the positions of its s slots start at at(g) (stride s3).
  const int64_t* at(int64_t g) const {
    const int64_t c = g % n, bh = g / n;
    return t + (bh / Ho) * s0 + (bh % Ho) * s1 + c * s2;
  }
  int64_t pos(const int64_t* row, int64_t u) const {
    const int64_t j = row[u * s3];
    return j >= 0 && j < N ? j : -1;
  }
};

template <typename T>
void gather_slots_typed(const Tensor& x, const Tensor& table, int64_t R, const Tensor& out) {
  const int64_t N = x.shape()[2], D = x.shape()[3];
  const SlotTable tb(table, N);
  const int64_t rows = out.numel() / std::max<int64_t>(tb.s * D, 1);
  const T* X = x.data<T>();
  const int64_t xs0 = x.strides()[0], xs1 = x.strides()[1], xs2 = x.strides()[2];
  T* O = out.data<T>();
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(tb.s * D, 1)), [&](int64_t a, int64_t e) {
    std::vector<int64_t> pos(size_t(tb.s));
    for (int64_t g = a; g < e; ++g) {
      const int64_t bh = g / tb.n, b = bh / tb.Ho, h = (bh % tb.Ho) / R;
      const int64_t* row = tb.at(g);
      for (int64_t u = 0; u < tb.s; ++u) pos[size_t(u)] = tb.pos(row, u);
      const T* xb = X + b * xs0 + h * xs1;
      T* o = O + g * tb.s * D;
      for (int64_t u = 0; u < tb.s; ++u, o += D) {
        if (pos[size_t(u)] < 0)
          std::fill(o, o + D, T(0));
        else
          std::copy(xb + pos[size_t(u)] * xs2, xb + pos[size_t(u)] * xs2 + D, o);
      }
    }
  });
}

template <typename T>
void scatter_slots_typed(const Tensor& src, const Tensor& table, int64_t R, int64_t round, bool accumulate,
                         const Tensor& out) {
  const int64_t N = out.shape()[2], D = out.shape()[3], Hout = out.shape()[1];
  const SlotTable tb(table, N);
  const T* S = src.data<T>();
  const int64_t ss0 = src.strides()[0], ss1 = src.strides()[1], ss2 = src.strides()[2], ss3 = src.strides()[3];
  const int64_t os0 = out.strides()[0], os1 = out.strides()[1], os2 = out.strides()[2];
  T* O = out.data<T>();
  const int64_t B = out.shape()[0];
  // One item per (b, h): the positions of one table head are distinct, so items never share a row of out.
  parallel_for(B * Hout, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(tb.n * tb.s * D, 1)),
               [&](int64_t a, int64_t e) {
                 for (int64_t it = a; it < e; ++it) {
                   const int64_t b = it / Hout, ho = (it % Hout) * R + round;
                   for (int64_t c = 0; c < tb.n; ++c) {
                     const int64_t* row = tb.at((b * tb.Ho + ho) * tb.n + c);
                     for (int64_t u = 0; u < tb.s; ++u) {
                       const int64_t j = tb.pos(row, u);
                       if (j < 0) continue;
                       const T* x = S + b * ss0 + ho * ss1 + c * ss2 + u * ss3;
                       T* o = O + b * os0 + (it % Hout) * os1 + j * os2;
                       if (accumulate)
                         for (int64_t d = 0; d < D; ++d) o[d] += x[d];
                       else
                         std::copy(x, x + D, o);
                     }
                   }
                 }
               });
}

// The blocks of the (B, Ho, n, w, W) scores: f(g, S of block g (w x W), its slots' positions (the first w:
// its queries), the self flags of its entries), after masking them (mask_scores).
template <typename T, typename F>
void for_block_rows(const RowMath& rm, const Tensor& scores, const Tensor& table, const Tensor& kpm,
                    const BlockRows& br, int64_t N, F&& f) {
  const SlotTable tb(table, N);
  const int64_t w = scores.shape()[3], W = scores.shape()[4];
  T* S = scores.data<T>();
  const bool* pad = kpm.defined() ? kpm.data<bool>() : nullptr;
  const int64_t blocks = scores.numel() / std::max<int64_t>(w * W, 1);
  parallel_for(blocks, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(w * W, 1)), [&](int64_t a, int64_t e) {
    std::vector<int64_t> jpos(static_cast<size_t>(W));
    std::vector<char> self(static_cast<size_t>(w * W));
    for (int64_t g = a; g < e; ++g) {
      const int64_t b = g / (tb.Ho * tb.n);
      const int64_t* row = tb.at(g);
      for (int64_t u = 0; u < W; ++u) jpos[size_t(u)] = tb.pos(row, u);  // the first w: the query slots
      T* Sg = S + g * w * W;
      mask_scores(rm, Sg, jpos.data(), w, jpos.data(), W, pad ? pad + b * N : nullptr, br.causal, br.self_mask,
                  br.self_score, self.data());
      f(g, Sg, jpos.data(), self.data());
    }
  });
}

template <typename T>
void block_rows_softmax_typed(const Tensor& scores, const Tensor& table, const Tensor& kpm, const BlockRows& br,
                              const Tensor& lse) {
  const RowMath& rm = row_math();
  const int64_t Ho = lse.shape()[1], N = lse.shape()[2], w = scores.shape()[3], W = scores.shape()[4];
  const int64_t n = scores.shape()[2];
  const int64_t ls0 = lse.strides()[0], ls1 = lse.strides()[1], ls2 = lse.strides()[2];
  T* L = lse.data<T>();
  const AttentionDropout drop(br.dropout, N, N);
  // qpos: the window's W key positions, the first w of them the block's queries.
  for_block_rows<T>(rm, scores, table, kpm, br, N, [&](int64_t g, T* Sg, const int64_t* qpos, const char*) {
    const int64_t bh = g / n, b = bh / Ho, h = bh % Ho;
    thread_local std::vector<T> Lr;
    Lr.resize(static_cast<size_t>(w));
    softmax_rows(rm, Sg, w, W, Lr.data());
    for (int64_t r = 0; r < w; ++r)
      if (qpos[r] >= 0) {
        L[b * ls0 + h * ls1 + qpos[r] * ls2] = Lr[size_t(r)];
        if (drop.on) drop.apply(rm, Sg + r * W, Sg + r * W, W, bh, qpos[r], 0, qpos);  // after lse, as the fused
      }
  });
}

template <typename T>
void block_rows_grad_typed(const Tensor& scores, const Tensor& dp, const Tensor& table, const Tensor& kpm,
                           const BlockRows& br, const Tensor& lse, const Tensor& D) {
  const RowMath& rm = row_math();
  const int64_t Ho = lse.shape()[1], N = lse.shape()[2], w = scores.shape()[3], W = scores.shape()[4];
  const int64_t n = scores.shape()[2];
  const int64_t ls0 = lse.strides()[0], ls1 = lse.strides()[1], ls2 = lse.strides()[2];
  const T* L = lse.data<T>();
  const T* Dd = D.data<T>();
  T* dP = dp.data<T>();
  const T ninf = -std::numeric_limits<T>::infinity();
  T* S0 = scores.data<T>();
  const AttentionDropout drop(br.dropout, N, N);
  for_block_rows<T>(rm, scores, table, kpm, br, N, [&](int64_t g, T* Sg, const int64_t* qpos, const char* self) {
    const int64_t bh = g / n, b = bh / Ho, h = bh % Ho;
    T* dPg = dP + (Sg - S0);
    thread_local std::vector<T> Z;
    if (drop.on) Z.resize(static_cast<size_t>(W));
    for (int64_t r = 0; r < w; ++r) {
      const int64_t i = qpos[r];
      const T li = i < 0 ? ninf : L[b * ls0 + h * ls1 + i * ls2];
      const T Di = Dd[g * w + r];
      T* Sr = Sg + r * W;
      probs_from_lse(rm, Sr, 1, W, &li);
      // With dropout (i >= 0: an empty query slot's P is 0): dP' from Z, dS from P, then Z in P's place.
      const bool dropping = drop.on && i >= 0;
      if (dropping) drop.backward_row(rm, Sr, Z.data(), dPg + r * W, W, bh, i, 0, qpos);
      softmax_grad_masked_row(rm, Sr, dPg + r * W, W, Di, br.self_mask ? self + r * W : nullptr);
      if (dropping) std::copy(Z.begin(), Z.end(), Sr);
    }
  });
}

}  // namespace

void rounds_combine_cpu(const Tensor& per_round, int64_t rounds, const Tensor& combined) {
  CF_DISPATCH_FLOAT_STD(combined.dtype(), "block_attention",
                        rounds_combine_typed<scalar_t>(per_round, rounds, combined));
}

void rounds_split_cpu(const Tensor& per_round, const Tensor& combined, const Tensor& grad, int64_t rounds,
                      const Tensor& per_round_grad) {
  CF_DISPATCH_FLOAT_STD(combined.dtype(), "block_attention",
                        rounds_split_typed<scalar_t>(per_round, combined, grad, rounds, per_round_grad));
}

void flash_attention_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                 const FlashAttentionParams& p, const Tensor& out, const Tensor& lse) {
  CF_DISPATCH_FLOAT_STD(q.dtype(), "flash_attention", flash_forward_typed<scalar_t>(q, k, v, kpm, p, out, lse));
}

void flash_attention_backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                  const FlashAttentionParams& p, const Tensor& out, const Tensor& lse,
                                  const Tensor& dout, const Tensor& dlse, const Tensor& dq, const Tensor& dk,
                                  const Tensor& dv) {
  CF_DISPATCH_FLOAT_STD(q.dtype(), "flash_attention",
                    flash_backward_typed<scalar_t>(q, k, v, kpm, p, out, lse, dout, dlse, dq, dk, dv));
}

// The bfloat16 products of the arm: AMX tiles where the CPU and OS give them, else the vdpbf16ps kernel where
// matmul uses it too (bf16_dot.h: AMD's CPUs; on Intel's without AMX the float32 kernels on copies are faster).
namespace {
bool bf16_products_available() { return bf16_amx_available() || bf16_dot_available(); }
// The backward's guard: the CPU can run the products, whichever kernel (a switch flipped between the forward
// and the backward, by a test scope or cf-bench, changes the kernel, not whether the arm may run).
bool bf16_products_runnable() { return bf16_amx_supported() || bf16_dot_supported(); }
}  // namespace

bool flash_attention_bf16_supported(const Tensor& q, const Tensor& k, const Tensor& v) {
  return q.device().is_cpu() && q.dtype() == kBFloat16 && k.dtype() == kBFloat16 && v.dtype() == kBFloat16 &&
         bf16_products_available();
}

void flash_attention_forward_bf16_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                     const FlashAttentionParams& p, const Tensor& out, const Tensor& lse) {
  check_flash_no_dropout(p, "bfloat16 arm");
  CF_CHECK(flash_attention_bf16_supported(q, k, v) && out.dtype() == kFloat32 && lse.dtype() == kFloat32, Error,
           "[flash_attention] internal: the bfloat16 arm takes bfloat16 q, k, v on an AMX or vdpbf16ps CPU and "
           "writes float32");
  flash_forward_typed<float, BFloat16>(q, k, v, kpm, p, out, lse);
}

void flash_attention_backward_bf16_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                      const FlashAttentionParams& p, const Tensor& out, const Tensor& lse,
                                      const Tensor& dout, const Tensor& dlse, const Tensor& dq, const Tensor& dk,
                                      const Tensor& dv) {
  check_flash_no_dropout(p, "bfloat16 arm");
  CF_CHECK(bf16_products_runnable() && q.dtype() == kBFloat16 && dout.dtype() == kBFloat16 &&
               dq.dtype() == kFloat32,
           Error, "[flash_attention] internal: the bfloat16 backward takes bfloat16 q, k, v, dout and writes float32");
  flash_backward_typed<float, BFloat16>(q, k, v, kpm, p, out, lse, dout, dlse, dq, dk, dv);
}

bool block_attention_bf16_supported(const Tensor& q, const Tensor& k, const Tensor& v) {
  return flash_attention_bf16_supported(q, k, v);  // (the same products; any head size, any window)
}

void block_attention_forward_bf16_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                     const Tensor& kpm, const BlockAttentionParams& p, const Tensor& out,
                                     const Tensor& lse) {
  check_no_attention_dropout(p.dropout, "block_attention", "bfloat16 arm");
  CF_CHECK(block_attention_bf16_supported(q, k, v) && out.dtype() == kFloat32 && lse.dtype() == kFloat32, Error,
           "[block_attention] internal: the bfloat16 arm takes bfloat16 q, k, v on an AMX or vdpbf16ps CPU and "
           "writes float32");
  block_forward_typed<float, BFloat16>(q, k, v, members, kpm, p, out, lse);
}

void block_attention_backward_bf16_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                      const Tensor& kpm, const BlockAttentionParams& p, const Tensor& out,
                                      const Tensor& lse, const Tensor& dout, const Tensor& dlse, const Tensor& dq,
                                      const Tensor& dk, const Tensor& dv) {
  check_no_attention_dropout(p.dropout, "block_attention", "bfloat16 arm");
  CF_CHECK(bf16_products_runnable() && q.dtype() == kBFloat16 && dout.dtype() == kBFloat16 &&
               dq.dtype() == kFloat32,
           Error, "[block_attention] internal: the bfloat16 backward takes bfloat16 q, k, v, dout and writes float32");
  block_backward_typed<float, BFloat16>(q, k, v, members, kpm, p, out, lse, dout, dlse, dq, dk, dv);
}

void block_attention_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                 const Tensor& kpm, const BlockAttentionParams& p, const Tensor& out,
                                 const Tensor& lse) {
  CF_DISPATCH_FLOAT_STD(q.dtype(), "block_attention",
                    block_forward_typed<scalar_t>(q, k, v, members, kpm, p, out, lse));
}

void routed_attention_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_members,
                                  const Tensor& key_members, const Tensor& kpm, const RoutedAttentionParams& p,
                                  const Tensor& out, const Tensor& lse) {
  CF_DISPATCH_FLOAT_STD(q.dtype(), "routed_attention",
                        routed_forward_typed<scalar_t>(q, k, v, query_members, key_members, kpm, p, out, lse));
}

void routed_attention_backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& query_members,
                                   const Tensor& key_members, const Tensor& kpm, const RoutedAttentionParams& p,
                                   const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                                   const Tensor& dk, const Tensor& dv) {
  CF_DISPATCH_FLOAT_STD(q.dtype(), "routed_attention",
                        routed_backward_typed<scalar_t>(q, k, v, query_members, key_members, kpm, p, out, lse,
                                                        dout, dq, dk, dv));
}

void block_attention_backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                  const Tensor& kpm, const BlockAttentionParams& p, const Tensor& out,
                                  const Tensor& lse, const Tensor& dout, const Tensor& dlse, const Tensor& dq,
                                  const Tensor& dk, const Tensor& dv) {
  CF_DISPATCH_FLOAT_STD(q.dtype(), "block_attention",
                    block_backward_typed<scalar_t>(q, k, v, members, kpm, p, out, lse, dout, dlse, dq, dk, dv));
}

void gather_slot_rows_cpu(const Tensor& x, const Tensor& table, int64_t rounds, const Tensor& out) {
  CF_DISPATCH_FLOAT_STD(x.dtype(), "block_attention", gather_slots_typed<scalar_t>(x, table, rounds, out));
}

void scatter_slot_rows_cpu(const Tensor& src, const Tensor& table, int64_t rounds, int64_t round, bool accumulate,
                           const Tensor& out) {
  CF_DISPATCH_FLOAT_STD(out.dtype(), "block_attention",
                        scatter_slots_typed<scalar_t>(src, table, rounds, round, accumulate, out));
}

void block_rows_softmax_cpu(const Tensor& scores, const Tensor& table, const Tensor& kpm, const BlockRows& rows,
                            const Tensor& lse) {
  CF_DISPATCH_FLOAT_STD(scores.dtype(), "block_attention",
                        block_rows_softmax_typed<scalar_t>(scores, table, kpm, rows, lse));
}

void block_rows_grad_cpu(const Tensor& scores, const Tensor& dp, const Tensor& table, const Tensor& kpm,
                         const BlockRows& rows, const Tensor& lse, const Tensor& D) {
  CF_DISPATCH_FLOAT_STD(scores.dtype(), "block_attention",
                        block_rows_grad_typed<scalar_t>(scores, dp, table, kpm, rows, lse, D));
}

void attention_rows_softmax_cpu(const Tensor& scores, const Tensor& kpm, const AttentionRows& rows,
                                const Tensor& lse) {
  CF_DISPATCH_FLOAT_STD(scores.dtype(), "flash_attention", rows_softmax_typed<scalar_t>(scores, kpm, rows, lse));
}

void attention_rows_grad_cpu(const Tensor& scores, const Tensor& dp, const Tensor& kpm, const AttentionRows& rows,
                             const Tensor& lse, const Tensor& D) {
  CF_DISPATCH_FLOAT_STD(scores.dtype(), "flash_attention",
                        rows_softmax_typed<scalar_t>(scores, kpm, rows, lse, dp, D));
}

// ---------------------------------------------------------------- routed attention: slots <-> tokens

namespace routed_tokens_cpu {

template <typename T>
void to_tokens(const Tensor& slots, const Tensor& lse, const Tensor& lists, const Tensor& out, const Tensor& count) {
  const int64_t B = out.shape()[0], H = out.shape()[1], N = out.shape()[2], D = out.shape()[3];
  const RoutedLists L = routed_lists_of(lists, B, H, N);
  const T* sp = slots.data<T>();
  const T* lp = lse.data<T>();
  T* op = out.data<T>();
  T* cp = count.data<T>();
  parallel_for(B * H, 1, [&](int64_t b0, int64_t e0) {
    for (int64_t bh = b0; bh < e0; ++bh) {
      T* ob = op + bh * N * D;
      T* cb = cp + bh * N;
      std::fill(ob, ob + N * D, T(0));
      std::fill(cb, cb + N, T(0));
      for (int64_t s = 0; s < L.S; ++s) {
        const int64_t pos = L.pos(bh, s);
        if (pos < 0) continue;
        const T* row = sp + (bh * L.S + s) * D;
        T* o = ob + pos * D;
        for (int64_t j = 0; j < D; ++j) o[j] += row[j];
        if (lp[bh * L.S + s] > -std::numeric_limits<T>::infinity()) cb[pos] += T(1);
      }
      for (int64_t n = 0; n < N; ++n) {
        const T c = std::max(cb[n], T(1));
        for (int64_t j = 0; j < D; ++j) ob[n * D + j] /= c;
      }
    }
  });
}

template <typename T>
void to_slots(const Tensor& g, const Tensor& count, const Tensor& lists, const Tensor& gs) {
  const int64_t B = g.shape()[0], H = g.shape()[1], N = g.shape()[2], D = g.shape()[3];
  const RoutedLists L = routed_lists_of(lists, B, H, N);
  const T* gp = g.data<T>();
  const T* cp = count.data<T>();
  T* out = gs.data<T>();
  parallel_for(B * H * L.S, std::max<int64_t>(1, 8192 / std::max<int64_t>(D, 1)), [&](int64_t b0, int64_t e0) {
    for (int64_t r = b0; r < e0; ++r) {
      const int64_t bh = r / L.S, pos = L.pos(bh, r % L.S);
      T* o = out + r * D;
      if (pos < 0) {
        std::fill(o, o + D, T(0));
        continue;
      }
      const T c = std::max(cp[bh * N + pos], T(1));
      const T* gr = gp + (bh * N + pos) * D;
      for (int64_t j = 0; j < D; ++j) o[j] = gr[j] / c;
    }
  });
}

template <typename T>
void add_rows(const Tensor& src, const Tensor& lists, const Tensor& out, bool accumulate) {
  const int64_t B = out.shape()[0], H = out.shape()[1], N = out.shape()[2], D = out.shape()[3];
  const RoutedLists L = routed_lists_of(lists, B, H, N);
  const T* sp = src.data<T>();
  T* op = out.data<T>();
  parallel_for(B * H, 1, [&](int64_t b0, int64_t e0) {
    for (int64_t bh = b0; bh < e0; ++bh) {
      if (!accumulate) std::fill(op + bh * N * D, op + (bh + 1) * N * D, T(0));
      for (int64_t s = 0; s < L.S; ++s) {
        const int64_t pos = L.pos(bh, s);
        if (pos < 0) continue;
        const T* row = sp + (bh * L.S + s) * D;
        T* o = op + (bh * N + pos) * D;
        for (int64_t j = 0; j < D; ++j) o[j] += row[j];
      }
    }
  });
}

}  // namespace routed_tokens_cpu

void routed_slots_to_tokens_cpu(const Tensor& slots, const Tensor& lse, const Tensor& lists, const Tensor& out,
                                const Tensor& count) {
  CF_DISPATCH_FLOAT_STD(out.dtype(), "routed_attention",
                        routed_tokens_cpu::to_tokens<scalar_t>(slots, lse, lists, out, count));
}

void routed_tokens_to_slots_cpu(const Tensor& g, const Tensor& count, const Tensor& lists, const Tensor& gs) {
  CF_DISPATCH_FLOAT_STD(gs.dtype(), "routed_attention", routed_tokens_cpu::to_slots<scalar_t>(g, count, lists, gs));
}

void routed_slots_add_cpu(const Tensor& src, const Tensor& lists, const Tensor& out, const Tensor& src2,
                          const Tensor& out2, bool accumulate) {
  CF_DISPATCH_FLOAT_STD(out.dtype(), "routed_attention", {
    routed_tokens_cpu::add_rows<scalar_t>(src, lists, out, accumulate);
    if (out2.defined()) routed_tokens_cpu::add_rows<scalar_t>(src2, lists, out2, accumulate);
  });
}

}  // namespace cf::kernels
