// CPU arm of the sparse products (kernels/sparse/sparse.h): OpenMP over rows,
// and over groups for the scatter (rows of one group may hit the same key, so
// a group is summed serially in a fixed order).
//
// float32 runs in the CPU instruction tier in use (kernels/common/cpu_isa.h): the serial loops
// below are always inlined into one function per tier, called per chunk of rows (a lambda inside
// a tier's function would compile for the baseline). Every tier gives the same bits: the weighted
// sums and the scatter are elementwise over the row, the dot products keep 16 partial sums in a
// fixed order, and this file is compiled with -ffp-contract=off (CMakeLists.txt).
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/common/cpu_isa.h"
#include "kernels/common/parallel.h"
#include "kernels/common/row_math.h"
#include "kernels/sparse/sparse.h"

#ifdef CF_CPU_TIERS
#include <immintrin.h>
#endif

namespace cf::kernels {

namespace {

// Rows per parallel chunk: a row costs K * D multiply-adds.
int64_t grain_rows(int64_t work_per_row) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(work_per_row, 1)); }

// One call's operands in sparse.h's notation: a = q (dot), w (weighted sum) or c (scatter);
// x = k, v or x; idx (G, N, K) into the M rows of x's (dot, weighted sum) or out's (scatter) group.
template <typename T>
struct SparseArgs {
  const T* a;
  const T* x;
  const int64_t* idx;
  T* out;
  int64_t n, m, kk, d;
};

// sum_j a[j] b[j] as 16 partial sums (lane l: the terms j = l mod 16 of the whole blocks of 16)
// added in a fixed tree, plus the remaining terms in order: the same sums in the same order in every
// tier (an `omp simd` reduction's order would follow the vector width). float64 (tests) as written;
// float32 in four 4-lane vectors p[0..3], p[4..7], p[8..11], p[12..15] (GCC's vector extension:
// plain IEEE adds and multiplies per lane), 1.6x faster on SSE2 than the `omp simd` loop it replaces
// (64 x 512 rows of 32 keys, D = 16, one thread: 3.6 against 5.9 ms, measured on a loaded machine).
template <typename T>
CF_ROW_INLINE T dot(const T* a, const T* b, int64_t d) {
  T p[16] = {};
  int64_t j = 0;
  for (; j + 16 <= d; j += 16)
    for (int l = 0; l < 16; ++l) p[l] += a[j + l] * b[j + l];
  T tail = 0;
  for (; j < d; ++j) tail += a[j] * b[j];
  for (int l = 0; l < 8; ++l) p[l] += p[l + 8];
  for (int l = 0; l < 4; ++l) p[l] += p[l + 4];
  return ((p[0] + p[2]) + (p[1] + p[3])) + tail;
}

typedef float Float4 __attribute__((vector_size(16)));
CF_ROW_INLINE Float4 load4(const float* x) {
  Float4 v;
  std::memcpy(&v, x, sizeof v);
  return v;
}
template <>
CF_ROW_INLINE float dot<float>(const float* a, const float* b, int64_t d) {
  Float4 p0 = {}, p1 = {}, p2 = {}, p3 = {};
  int64_t j = 0;
  for (; j + 16 <= d; j += 16) {
    p0 += load4(a + j) * load4(b + j);
    p1 += load4(a + j + 4) * load4(b + j + 4);
    p2 += load4(a + j + 8) * load4(b + j + 8);
    p3 += load4(a + j + 12) * load4(b + j + 12);
  }
  float tail = 0;
  for (; j < d; ++j) tail += a[j] * b[j];
  p0 += p2;  // p[l] += p[l + 8]
  p1 += p3;
  p0 += p1;  // p[l] += p[l + 4]
  return ((p0[0] + p0[2]) + (p0[1] + p0[3])) + tail;
}

template <typename T>
CF_ROW_INLINE void dot_rows(const SparseArgs<T>& s, int64_t b, int64_t e) {
  for (int64_t r = b; r < e; ++r) {
    const T* qr = s.a + r * s.d;
    const T* kg = s.x + (r / s.n) * s.m * s.d;
    for (int64_t t = 0; t < s.kk; ++t) s.out[r * s.kk + t] = dot(qr, kg + s.idx[r * s.kk + t] * s.d, s.d);
  }
}

template <typename T>
CF_ROW_INLINE void wsum_rows(const SparseArgs<T>& s, int64_t b, int64_t e) {
  for (int64_t r = b; r < e; ++r) {
    T* o = s.out + r * s.d;
    for (int64_t j = 0; j < s.d; ++j) o[j] = 0;
    const T* vg = s.x + (r / s.n) * s.m * s.d;
    for (int64_t t = 0; t < s.kk; ++t) {
      const T c = s.a[r * s.kk + t];
      if (c == T(0)) continue;
      const T* vr = vg + s.idx[r * s.kk + t] * s.d;
      for (int64_t j = 0; j < s.d; ++j) o[j] += c * vr[j];
    }
  }
}

// Groups [b, e): out[g, idx[g, n, t], :] += c[g, n, t] * x[g, n, :] in increasing (n, t).
template <typename T>
CF_ROW_INLINE void scatter_groups(const SparseArgs<T>& s, int64_t b, int64_t e) {
  for (int64_t gg = b; gg < e; ++gg) {
    T* og = s.out + gg * s.m * s.d;
    for (int64_t r = gg * s.n; r < (gg + 1) * s.n; ++r) {
      const T* xr = s.x + r * s.d;
      for (int64_t t = 0; t < s.kk; ++t) {
        const T cv = s.a[r * s.kk + t];
        if (cv == T(0)) continue;
        T* o = og + s.idx[r * s.kk + t] * s.d;
        for (int64_t j = 0; j < s.d; ++j) o[j] += cv * xr[j];
      }
    }
  }
}

// The float32 loops of one tier.
using Range = void (*)(const SparseArgs<float>&, int64_t, int64_t);
struct SparseTier {
  Range dot, wsum, scatter;
};

// wsum_<tier>, scatter_<tier>; the dot products' tiers below.
#define CF_SPARSE_TIER(name, attr)                                                                       \
  attr void wsum_##name(const SparseArgs<float>& s, int64_t b, int64_t e) { wsum_rows<float>(s, b, e); } \
  attr void scatter_##name(const SparseArgs<float>& s, int64_t b, int64_t e) { scatter_groups<float>(s, b, e); }
CF_SPARSE_TIER(baseline, )
void dot_baseline(const SparseArgs<float>& s, int64_t b, int64_t e) { dot_rows<float>(s, b, e); }
#ifdef CF_CPU_TIERS
CF_SPARSE_TIER(avx2, CF_TARGET_AVX2)
CF_SPARSE_TIER(avx512, CF_TARGET_AVX512)
CF_TARGET_AVX2 void dot_avx2(const SparseArgs<float>& s, int64_t b, int64_t e) { dot_rows<float>(s, b, e); }

// The AVX-512 dot products, for head sizes D that are multiples of 16: one query row against 16 of
// its keys at a time, each dot product as 16 partial sums in a register (lane l: the terms
// j = l mod 16, added in order from 0, as dot() does), then the 16 registers folded together in
// dot()'s tree: p[l] += p[l + 8] (128-bit quarters), p[l] += p[l + 4] (quarters), then
// (p0 + p2) + (p1 + p3) (within quarters), each step on two registers at once, so 16 adds (the
// last one dot()'s + 0 for its empty tail) finish 16 dot products where dot() needs 4 lane
// extractions per product. The same sums in the same
// order as dot(): the same bits (tests/ops/test_sparse.cpp compares the tiers). The folds leave
// the products in the order t = 0, 4, 8, 12, 1, 5, ... (a 4 x 4 transpose), undone by one permute.
// (maskz forms throughout: GCC 12 warns that the plain forms' undefined pass-through is uninitialised.)
CF_TARGET_AVX512 void dot_avx512(const SparseArgs<float>& s, int64_t b, int64_t e) {
  if (s.d % 16 != 0) return dot_rows<float>(s, b, e);
  const __mmask16 all = 0xFFFF;
  const __m512i transpose = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t r = b; r < e; ++r) {
    const float* qr = s.a + r * s.d;
    const float* kg = s.x + (r / s.n) * s.m * s.d;
    const int64_t* ir = s.idx + r * s.kk;
    float* out = s.out + r * s.kk;
    int64_t t0 = 0;
    for (; t0 + 16 <= s.kk; t0 += 16) {
      __m512 v[16], w[8], x[4], y[2];
      for (int u = 0; u < 16; ++u) {
        const float* kr = kg + ir[t0 + u] * s.d;
        __m512 acc = zero;
        for (int64_t j = 0; j < s.d; j += 16)
          acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(qr + j), _mm512_loadu_ps(kr + j)));
        v[u] = acc;
      }
      for (int i = 0; i < 8; ++i)  // quarters [a0 a1 b0 b1] + [a2 a3 b2 b3]: p[l] += p[l + 8]
        w[i] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(all, v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_maskz_shuffle_f32x4(all, v[2 * i], v[2 * i + 1], 0xEE));
      for (int i = 0; i < 4; ++i)  // quarters [a0 a2 b0 b2] + [a1 a3 b1 b3]: p[l] += p[l + 4]
        x[i] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(all, w[2 * i], w[2 * i + 1], 0x88),
                             _mm512_maskz_shuffle_f32x4(all, w[2 * i], w[2 * i + 1], 0xDD));
      for (int i = 0; i < 2; ++i)  // within quarters [a0 a1 b0 b1] + [a2 a3 b2 b3]: p0 + p2, p1 + p3
        y[i] = _mm512_add_ps(_mm512_maskz_shuffle_ps(all, x[2 * i], x[2 * i + 1], 0x44),
                             _mm512_maskz_shuffle_ps(all, x[2 * i], x[2 * i + 1], 0xEE));
      // within quarters [a0 a2 b0 b2] + [a1 a3 b1 b3]: (p0 + p2) + (p1 + p3); then + 0, as dot()'s
      // empty tail (it turns a -0 sum into +0)
      const __m512 z = _mm512_add_ps(_mm512_add_ps(_mm512_maskz_shuffle_ps(all, y[0], y[1], 0x88),
                                                   _mm512_maskz_shuffle_ps(all, y[0], y[1], 0xDD)),
                                     zero);
      _mm512_storeu_ps(out + t0, _mm512_maskz_permutexvar_ps(all, transpose, z));
    }
    for (; t0 < s.kk; ++t0) out[t0] = dot(qr, kg + ir[t0] * s.d, s.d);
  }
}
#endif
#undef CF_SPARSE_TIER

const SparseTier& sparse_tier() {
  static const SparseTier baseline{dot_baseline, wsum_baseline, scatter_baseline};
#ifdef CF_CPU_TIERS
  static const SparseTier avx2{dot_avx2, wsum_avx2, scatter_avx2};
  static const SparseTier avx512{dot_avx512, wsum_avx512, scatter_avx512};
  switch (cpu_isa()) {  // before the parallel loop: it may throw on a bad CF_CPU_ISA
    case CpuIsa::kAvx512: return avx512;
    case CpuIsa::kAvx2: return avx2;
    default: break;
  }
#endif
  return baseline;
}

// The loop `pick` chooses for T (float32: the tier's; float64: the baseline template) over rows or
// groups [0, count), `grain` per chunk.
template <typename T>
void run(const SparseArgs<T>& s, int64_t count, int64_t grain, Range SparseTier::*pick,
         void (*generic)(const SparseArgs<T>&, int64_t, int64_t)) {
  if constexpr (std::is_same_v<T, float>) {
    const Range f = sparse_tier().*pick;
    parallel_for(count, grain, [&](int64_t b, int64_t e) { f(s, b, e); });
  } else {
    parallel_for(count, grain, [&](int64_t b, int64_t e) { generic(s, b, e); });
  }
}

}  // namespace

void sparse_dot_cpu(const Tensor& q, const Tensor& k, const Tensor& idx, const Tensor& out) {
  const int64_t g = q.size(0), n = q.size(1), d = q.size(2), m = k.size(1), kk = idx.size(2);
  CF_DISPATCH_FLOAT_STD(q.dtype(), "sparse_dot", {
    const SparseArgs<scalar_t> s{q.data<scalar_t>(), k.data<scalar_t>(), idx.data<int64_t>(),
                                 out.data<scalar_t>(), n, m, kk, d};
    run<scalar_t>(s, g * n, grain_rows(kk * d), &SparseTier::dot, dot_rows<scalar_t>);
  });
}

void sparse_weighted_sum_cpu(const Tensor& w, const Tensor& v, const Tensor& idx, const Tensor& out) {
  const int64_t g = w.size(0), n = w.size(1), kk = w.size(2), m = v.size(1), d = v.size(2);
  CF_DISPATCH_FLOAT_STD(w.dtype(), "sparse_weighted_sum", {
    const SparseArgs<scalar_t> s{w.data<scalar_t>(), v.data<scalar_t>(), idx.data<int64_t>(),
                                 out.data<scalar_t>(), n, m, kk, d};
    run<scalar_t>(s, g * n, grain_rows(kk * d), &SparseTier::wsum, wsum_rows<scalar_t>);
  });
}

void sparse_scatter_rows_cpu(const Tensor& c, const Tensor& x, const Tensor& idx, const Tensor& out) {
  const int64_t g = c.size(0), n = c.size(1), kk = c.size(2), d = x.size(2), m = out.size(1);
  CF_DISPATCH_FLOAT_STD(x.dtype(), "sparse_scatter_rows", {
    const SparseArgs<scalar_t> s{c.data<scalar_t>(), x.data<scalar_t>(), idx.data<int64_t>(),
                                 out.data<scalar_t>(), n, m, kk, d};
    run<scalar_t>(s, g, 0, &SparseTier::scatter, scatter_groups<scalar_t>);
  });
}

// ---------------------------------------------------------------- cluster_topk_attention
// Rows (g, i) in parallel for everything that is the row's own (its scores, weights, o, dq), each through the
// sparse products' loops above (the tier's: one query row against its cluster's key list, so float32 runs the
// AVX-512 / AVX2 dot products and weighted sums) and the tier's exponentials; the sums over queries (dk, dv,
// dmass, drest) per group, serially in increasing (i, t), the order the CUDA arm's segments give
// (sparse_cuda.cu): the scatters are the sparse products' own, over a per-query key table built in the
// backward. Written first with scalar loops, this kernel ran 1.8x behind the composition of sparse products
// it replaced (one thread, N = 4096, kk = 32, D = 64).

namespace cluster_topk_cpu {

template <typename T>
using Rows = ClusterTopkArgs<T>;

// The tier's row loops for T: float32 through sparse_tier() and row_math(), float64 the templates.
template <typename T>
struct Loops {
  Range dot = nullptr, wsum = nullptr, scatter = nullptr;
  const RowMath* rm = nullptr;
  Loops() {
    if constexpr (std::is_same_v<T, float>) {
      const SparseTier& t = sparse_tier();
      dot = t.dot;
      wsum = t.wsum;
      scatter = t.scatter;
    }
    rm = &row_math();
  }
  void dots(const SparseArgs<T>& s) const {  // out[t] = a . x[idx[t]], one row
    if constexpr (std::is_same_v<T, float>) dot(s, 0, 1);
    else dot_rows<T>(s, 0, 1);
  }
  void weighted(const SparseArgs<T>& s) const {  // out = sum_t a[t] x[idx[t]], one row (from 0)
    if constexpr (std::is_same_v<T, float>) wsum(s, 0, 1);
    else wsum_rows<T>(s, 0, 1);
  }
  void scatter_group(const SparseArgs<T>& s, int64_t g) const {  // group g: out[idx] += c x, increasing (n, t)
    if constexpr (std::is_same_v<T, float>) scatter(s, g, g + 1);
    else scatter_groups<T>(s, g, g + 1);
  }
};

// Row `row` = g Nq + i: its cluster's key list (nullptr for a query without a cluster) and the scores
// scale q_i . k_l into s (kk), -inf where the key is blocked.
template <typename T>
const int64_t* row_scores(const Rows<T>& a, const Loops<T>& L, int64_t row, T* s) {
  const int64_t c = a.assign[row];
  if (c < 0) return nullptr;
  const int64_t g = row / a.Nq, i = row % a.Nq, last = i + a.Nk - a.Nq;
  const int64_t* keys = a.top + (g * a.C + c) * a.kk;
  L.dots({a.q + row * a.D, a.k + g * a.Nk * a.D, keys, s, 1, a.Nk, a.kk, a.D});
  const bool* pad = a.kpm ? a.kpm + (g / a.heads) * a.Nk : nullptr;
  for (int64_t t = 0; t < a.kk; ++t) {
    const int64_t l = keys[t];
    s[t] = (pad && pad[l]) || (a.causal && l > last) ? -std::numeric_limits<T>::infinity() : a.scale * s[t];
  }
  return keys;
}

// Z (dropped, scaled P) from P into z.
template <typename T>
void drop_weights(const Rows<T>& a, int64_t row, const T* p, T* z) {
  if (a.threshold) dropout_row(p, z, a.kk, a.seed, a.counter0 + uint64_t(row * a.kk), a.threshold, a.keep_scale);
  else std::copy(p, p + a.kk, z);
}

template <typename T>
void forward(const Rows<T>& a, int64_t G, T* out, T* o, T* P) {
  const T ninf = -std::numeric_limits<T>::infinity();
  const Loops<T> L;
  parallel_for(G * a.Nq, grain_rows(a.kk * (a.D + a.Dv)), [&](int64_t b, int64_t e) {
    std::vector<T> s(size_t(a.kk)), z(size_t(a.kk));
    for (int64_t row = b; row < e; ++row) {
      T* orow = o + row * a.Dv;
      T* out_r = out + row * a.Dv;
      T* p = P + row * a.kk;
      const int64_t* keys = row_scores(a, L, row, s.data());
      if (!keys) {
        std::fill(orow, orow + a.Dv, T(0));
        std::fill(out_r, out_r + a.Dv, T(0));
        std::fill(p, p + a.kk, T(0));
        continue;
      }
      T mx = ninf;
      for (int64_t t = 0; t < a.kk; ++t)
        if (s[t] > mx || s[t] != s[t]) mx = s[t];  // a NaN score makes the row NaN
      const int64_t g = row / a.Nq, c = a.assign[row];
      if (mx == ninf) {
        std::fill(orow, orow + a.Dv, T(0));
        std::fill(p, p + a.kk, T(0));
      } else {
        exp_shifted(*L.rm, s.data(), p, a.kk, mx);  // -inf scores: 0
        const T inv = T(1.0 / sum_row(*L.rm, p, a.kk));
        for (int64_t t = 0; t < a.kk; ++t) p[t] *= inv;
        drop_weights(a, row, p, z.data());
        L.weighted({z.data(), a.v + g * a.Nk * a.Dv, keys, orow, 1, a.Nk, a.kk, a.Dv});
      }
      const T m = a.mass ? a.mass[g * a.C + c] : T(1);
      const T* rr = a.rest ? a.rest + (g * a.C + c) * a.Dv : nullptr;
      for (int64_t j = 0; j < a.Dv; ++j) out_r[j] = m * orow[j] + (rr ? rr[j] : T(0));
    }
  });
}

template <typename T>
void backward(const Rows<T>& a, int64_t G, const T* o, const T* P, const T* gout, T* dq, T* dk, T* dv, T* dmass,
              T* drest) {
  const int64_t rows = G * a.Nq;
  const Loops<T> L;
  // Per row: dS and Z (rows x kk) with the row's key list (rows x kk; a query without a cluster: key 0 with
  // dS = Z = 0), do = mass dout (rows x Dv), dout . o (rows); dq written here.
  // From cf's caching allocator, not std::vector: fresh zeroed pages for every call cost this backward a
  // third of its time (N = 2048, 8 heads: 12 MB of scratch).
  const DType dt = std::is_same_v<T, float> ? kFloat32 : kFloat64;
  const Tensor ds_t = Tensor::empty({rows * a.kk}, dt), zs_t = Tensor::empty({rows * a.kk}, dt),
               dos_t = Tensor::empty({rows * a.Dv}, dt), go_t = Tensor::empty({rows}, dt),
               table_t = Tensor::empty({rows * a.kk}, kInt64);
  T* const ds = ds_t.data<T>();
  T* const zs = zs_t.data<T>();
  T* const dos = dos_t.data<T>();
  T* const go = go_t.data<T>();
  int64_t* const table = table_t.data<int64_t>();
  parallel_for(rows, grain_rows(a.kk * (a.D + a.Dv)), [&](int64_t b, int64_t e) {
    std::vector<T> dp(size_t(a.kk));
    for (int64_t row = b; row < e; ++row) {
      T* dqr = dq + row * a.D;
      T* dsr = ds + row * a.kk;
      T* zr = zs + row * a.kk;
      T* dor = dos + row * a.Dv;
      int64_t* kr = table + row * a.kk;
      const T* gr = gout + row * a.Dv;
      const T* orow = o + row * a.Dv;
      go[row] = dot(gr, orow, a.Dv);
      const int64_t c = a.assign[row], g = row / a.Nq;
      const int64_t* keys = c >= 0 ? a.top + (g * a.C + c) * a.kk : nullptr;
      const T* p = P + row * a.kk;  // the forward's weights (0 at blocked keys)
      const T m = keys && a.mass ? a.mass[g * a.C + a.assign[row]] : T(1);
      for (int64_t j = 0; j < a.Dv; ++j) dor[j] = m * gr[j];
      if (keys) std::copy(keys, keys + a.kk, kr);
      else std::fill(kr, kr + a.kk, int64_t(0));
      if (!keys) {
        std::fill(dqr, dqr + a.D, T(0));
        std::fill(dsr, dsr + a.kk, T(0));
        std::fill(zr, zr + a.kk, T(0));
        continue;
      }
      drop_weights(a, row, p, zr);
      const T Drow = dot(dor, orow, a.Dv);  // rowsum(Z dZ) = do . o
      L.dots({dor, a.v + g * a.Nk * a.Dv, keys, dp.data(), 1, a.Nk, a.kk, a.Dv});  // dZ = do . v_l
      for (int64_t t = 0; t < a.kk; ++t) {
        T d = dp[t];
        if (a.threshold) d = zr[t] == T(0) ? T(0) : d * a.keep_scale;  // dropped: no gradient through it
        dsr[t] = p[t] == T(0) ? T(0) : a.scale * (p[t] * (d - Drow));  // blocked (or underflowed): 0
      }
      L.weighted({dsr, a.k + g * a.Nk * a.D, keys, dqr, 1, a.Nk, a.kk, a.D});  // dq = sum_t dS_t k_t
    }
  });
  // Sums over queries: per group, in increasing (i, t).
  parallel_for(G, 0, [&](int64_t b, int64_t e) {
    for (int64_t g = b; g < e; ++g) {
      std::fill(dk + g * a.Nk * a.D, dk + (g + 1) * a.Nk * a.D, T(0));
      std::fill(dv + g * a.Nk * a.Dv, dv + (g + 1) * a.Nk * a.Dv, T(0));
      L.scatter_group({ds, a.q, table, dk, a.Nq, a.Nk, a.kk, a.D}, g);
      L.scatter_group({zs, dos, table, dv, a.Nq, a.Nk, a.kk, a.Dv}, g);
      if (dmass) std::fill(dmass + g * a.C, dmass + (g + 1) * a.C, T(0));
      if (drest) std::fill(drest + g * a.C * a.Dv, drest + (g + 1) * a.C * a.Dv, T(0));
      for (int64_t row = g * a.Nq; row < (g + 1) * a.Nq; ++row) {
        const int64_t c = a.assign[row];
        if (c < 0) continue;
        if (dmass) dmass[g * a.C + c] += go[row];
        if (drest) {
          T* r = drest + (g * a.C + c) * a.Dv;
          const T* gr = gout + row * a.Dv;
          for (int64_t j = 0; j < a.Dv; ++j) r[j] += gr[j];
        }
      }
    }
  });
}

}  // namespace cluster_topk_cpu

void cluster_topk_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& top,
                              const Tensor& assign, const Tensor& mass, const Tensor& rest, const Tensor& kpm,
                              const ClusterTopkParams& p, const Tensor& out, const Tensor& o, const Tensor& P) {
  CF_DISPATCH_FLOAT_STD(q.dtype(), "cluster_topk_attention", {
    auto a = cluster_topk_args<scalar_t>(q, k, v, top, assign, mass, rest, kpm, p);
    a.threshold = dropout_threshold(p.dropout);
    cluster_topk_cpu::forward(a, q.size(0) * q.size(1), out.data<scalar_t>(), o.data<scalar_t>(), P.data<scalar_t>());
  });
}

void cluster_topk_backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& top,
                               const Tensor& assign, const Tensor& mass, const Tensor& kpm,
                               const ClusterTopkParams& p, const Tensor& o, const Tensor& P, const Tensor& dout,
                               const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dmass,
                               const Tensor& drest) {
  CF_DISPATCH_FLOAT_STD(q.dtype(), "cluster_topk_attention", {
    auto a = cluster_topk_args<scalar_t>(q, k, v, top, assign, mass, Tensor(), kpm, p);
    a.threshold = dropout_threshold(p.dropout);
    cluster_topk_cpu::backward(a, q.size(0) * q.size(1), o.data<scalar_t>(), P.data<scalar_t>(), dout.data<scalar_t>(),
                               dq.data<scalar_t>(), dk.data<scalar_t>(), dv.data<scalar_t>(),
                               dmass.defined() ? dmass.data<scalar_t>() : nullptr,
                               drest.defined() ? drest.data<scalar_t>() : nullptr);
  });
}

}  // namespace cf::kernels
