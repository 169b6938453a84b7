#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/common/parallel.h"
#include "kernels/kmeans/kmeans.h"
#include "kernels/matmul/matmul.h"

namespace cf::kernels {

namespace {

// scores (rows, k) = alpha * x (rows, d) @ c^T (d, k)
void gemm_nt(const float* x, const float* c, float* out, int64_t rows, int64_t k, int64_t d,
             float alpha) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(k), int(d), alpha, x, int(d),
              c, int(d), 0.0f, out, int(k));
}
void gemm_nt(const double* x, const double* c, double* out, int64_t rows, int64_t k, int64_t d,
             double alpha) {
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(k), int(d), alpha, x, int(d),
              c, int(d), 0.0, out, int(k));
}

// Argmin of s[j] + bias[j] over a row, the lowest index among equal values, in one
// pass over W lanes (GCC/Clang vector extensions, one 512-bit register of T, which
// the compiler splits into what the target has): each lane keeps its first minimum,
// then the lanes merge by (value, index). The tail shorter than W comes last; its
// indices exceed every lane's, so a strict < keeps the lower index on ties.
template <typename T>
struct Lanes;
template <>
struct Lanes<float> {
  typedef float V __attribute__((vector_size(64)));
  typedef int32_t I __attribute__((vector_size(64)));
  static constexpr int W = 16;
};
template <>
struct Lanes<double> {
  typedef double V __attribute__((vector_size(64)));
  typedef int64_t I __attribute__((vector_size(64)));
  static constexpr int W = 8;
};

template <typename T>
inline __attribute__((always_inline)) int64_t row_argmin(const T* s, const T* bias, int64_t k) {
  using V = typename Lanes<T>::V;
  using I = typename Lanes<T>::I;
  constexpr int W = Lanes<T>::W;
  int64_t j = 1, idx = 0;
  T best = s[0] + bias[0];
  if (k >= 2 * W) {
    V a, b;
    I cur, bi;
    std::memcpy(&a, s, sizeof(V));
    std::memcpy(&b, bias, sizeof(V));
    V bv = a + b;
    for (int l = 0; l < W; ++l) cur[l] = l;
    bi = cur;
    for (j = W; j + W <= k; j += W) {
      cur += W;
      std::memcpy(&a, s + j, sizeof(V));
      std::memcpy(&b, bias + j, sizeof(V));
      const V v = a + b;
      const I lt = v < bv;
      bv = lt ? v : bv;
      bi = lt ? cur : bi;
    }
    best = bv[0];
    idx = bi[0];
    for (int l = 1; l < W; ++l)
      if (bv[l] < best || (bv[l] == best && bi[l] < idx)) {
        best = bv[l];
        idx = bi[l];
      }
  }
  for (; j < k; ++j) {
    const T v = s[j] + bias[j];
    if (v < best) {
      best = v;
      idx = j;
    }
  }
  return idx;
}

// Squared distance and dot product accumulated in double. The simd reduction lets
// the compiler split the sum over vector lanes: the bits then depend on the vector
// width of the machine, never on the thread count.
template <typename T>
inline __attribute__((always_inline)) double sqdist(const T* a, const T* b, int64_t d) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t t = 0; t < d; ++t) {
    const double e = double(a[t]) - double(b[t]);
    acc += e * e;
  }
  return acc;
}
template <typename T>
inline __attribute__((always_inline)) double dot(const T* a, const T* b, int64_t d) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t t = 0; t < d; ++t) acc += double(a[t]) * double(b[t]);
  return acc;
}

// The row loops of the kernels, compiled for several x86-64 levels and picked at
// load time (GCC function multiversioning): the build targets baseline x86-64
// (SSE2), where the lanes above run 4 wide; AVX-512 runs them 16 wide.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CF_KMEANS_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CF_KMEANS_CLONES
#endif

// Rows [r0, r1) of a score block starting at point b0: nearest centroid, then the
// distance to it computed directly (no cancellation error from the expansion).
#define CF_KMEANS_ROW_LOOPS(T)                                                                  \
  CF_KMEANS_CLONES void assign_rows(const T* scores, const T* bias, const T* X, const T* C,   \
                                    int64_t b0, int64_t r0, int64_t r1, int64_t k, int64_t d, \
                                    bool cosine, int64_t* L, double* D) {                     \
    for (int64_t r = r0; r < r1; ++r) {                                                       \
      const int64_t i = b0 + r, j = row_argmin(scores + r * k, bias, k);                      \
      L[i] = j;                                                                               \
      D[i] = cosine ? std::max(0.0, 1.0 - dot(X + i * d, C + j * d, d))                       \
                    : sqdist(X + i * d, C + j * d, d);                                        \
    }                                                                                         \
  }                                                                                           \
  CF_KMEANS_CLONES void pp_update_rows(const T* X, const T* c, int64_t b, int64_t e, int64_t d, \
                                       double* D) {                                           \
    for (int64_t i = b; i < e; ++i) D[i] = std::min(D[i], sqdist(X + i * d, c, d));          \
  }                                                                                           \
  CF_KMEANS_CLONES void sqnorm_rows(const T* X, int64_t b, int64_t e, int64_t d, double* out) { \
    for (int64_t i = b; i < e; ++i) out[i] = dot(X + i * d, X + i * d, d);                   \
  }                                                                                           \
  CF_KMEANS_CLONES void add_rows(const T* X, const int64_t* order, int64_t p0, int64_t p1,    \
                                 int64_t d, double* acc) {                                    \
    for (int64_t p = p0; p < p1; ++p) {                                                       \
      const T* row = X + order[p] * d;                                                        \
      for (int64_t t = 0; t < d; ++t) acc[t] += double(row[t]);                               \
    }                                                                                         \
  }
CF_KMEANS_ROW_LOOPS(float)
CF_KMEANS_ROW_LOOPS(double)
#undef CF_KMEANS_ROW_LOOPS
#undef CF_KMEANS_CLONES

template <typename T>
void assign_typed(const Tensor& x, const Tensor& c, bool cosine, int64_t block_rows,
                  const Tensor& workspace, const Tensor& labels, const Tensor& dist) {
  const int64_t N = x.size(0), d = x.size(1), k = c.size(0);
  const T* X = x.data<T>();
  const T* C = c.data<T>();
  T* scores = workspace.data<T>();
  int64_t* L = labels.data<int64_t>();
  double* D = dist.data<double>();
  const int64_t rows_max = std::max<int64_t>(1, std::min(block_rows, N));
  CF_CHECK(workspace.numel() >= (rows_max + 1) * k, ValueError, "[kmeans_assign] workspace of ",
           workspace.numel(), " elements, needs (", rows_max, " + 1) * ", k);
  // The centroid term of the expansion |x|^2 - 2 x.c + |c|^2; |x|^2 is the same for
  // every centroid of a row, so the argmin does not need it.
  T* bias = scores + rows_max * k;
  for (int64_t j = 0; j < k; ++j) {
    double s = 0;
    if (!cosine)
      for (int64_t t = 0; t < d; ++t) s += double(C[j * d + t]) * double(C[j * d + t]);
    bias[j] = T(s);
  }
  const T alpha = cosine ? T(-1) : T(-2);
  // Each thread computes the scores of its own rows of the block (a one-thread
  // GEMM: one thread pool, see kernels/matmul/matmul.h) and takes their argmins
  // while the rows are still in cache. Rows per chunk: enough score entries that
  // a thread start pays off, and enough rows for an efficient GEMM.
  use_single_threaded_blas();
  const int64_t grain = std::max<int64_t>(64, kParallelGrain / std::max<int64_t>(k, 1));
  for (int64_t b0 = 0; b0 < N; b0 += rows_max) {
    const int64_t rows = std::min(rows_max, N - b0);
    parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
      gemm_nt(X + (b0 + r0) * d, C, scores + r0 * k, r1 - r0, k, d, alpha);
      assign_rows(scores, bias, X, C, b0, r0, r1, k, d, cosine, L, D);
    });
  }
}

template <typename T>
void update_typed(const Tensor& x, const Tensor& labels, const Tensor& order, const Tensor& counts,
                  const Tensor& sums) {
  const int64_t N = x.size(0), d = x.size(1), k = counts.numel();
  const T* X = x.data<T>();
  const int64_t* L = labels.data<int64_t>();
  int64_t* O = order.data<int64_t>();
  int64_t* cnt = counts.data<int64_t>();
  double* S = sums.data<double>();
  std::fill(cnt, cnt + k, int64_t(0));
  for (int64_t i = 0; i < N; ++i) {
    CF_CHECK(L[i] >= 0 && L[i] < k, IndexError, "[kmeans_update] label ", L[i], " of point ", i,
             " is outside [0, ", k, ")");
    ++cnt[L[i]];
  }
  // Counting sort of the point indices by label, stable: within a cluster the rows
  // are summed in increasing index, which fixes the floating-point result.
  std::vector<int64_t> start(size_t(k) + 1, 0);
  for (int64_t j = 0; j < k; ++j) start[size_t(j) + 1] = start[size_t(j)] + cnt[j];
  {
    std::vector<int64_t> pos(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < N; ++i) O[pos[size_t(L[i])]++] = i;
  }
  // One cluster per task: each sum is computed by one thread in a fixed order, so the
  // partition of clusters over threads cannot change any bit.
  const bool par = N * d > kParallelGrain && k > 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(max_threads()) if (par)
  for (int64_t j = 0; j < k; ++j) {
    double* acc = S + j * d;
    std::fill(acc, acc + d, 0.0);
    add_rows(X, O, start[size_t(j)], start[size_t(j) + 1], d, acc);
  }
}

template <typename T>
void pp_update_typed(const Tensor& x, int64_t center, const Tensor& dist) {
  const int64_t N = x.size(0), d = x.size(1);
  const T* X = x.data<T>();
  double* D = dist.data<double>();
  parallel_for(N, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(d, 1)),
               [&](int64_t b, int64_t e) { pp_update_rows(X, X + center * d, b, e, d, D); });
}

template <typename T>
void pp_potentials_typed(const Tensor& x, const Tensor& xnorm, const Tensor& dist, const Tensor& cand,
                         const Tensor& workspace, const Tensor& potential) {
  const int64_t N = x.size(0), d = x.size(1), L = cand.numel();
  CF_CHECK(workspace.numel() >= L * d + kPotentialChunk * L, ValueError,
           "[kmeans_pp_potentials] workspace of ", workspace.numel(), " elements, needs ",
           L * d + kPotentialChunk * L);
  const T* X = x.data<T>();
  const double* XN = xnorm.data<double>();
  const double* D = dist.data<double>();
  const int64_t* C = cand.data<int64_t>();
  double* P = potential.data<double>();
  T* cbuf = workspace.data<T>();  // (L, d): the candidate rows
  T* S = cbuf + L * d;            // (chunk, L): x_i . x_c
  double cn[64];
  CF_CHECK(L <= 64, ValueError, "[kmeans_pp_potentials] at most 64 candidates, got ", L);
  for (int64_t l = 0; l < L; ++l) {
    std::memcpy(cbuf + l * d, X + C[l] * d, size_t(d) * sizeof(T));
    cn[l] = XN[C[l]];
    P[l] = 0;
  }
  for (int64_t b = 0; b < N; b += kPotentialChunk) {
    const int64_t rows = std::min(kPotentialChunk, N - b);
    gemm_nt(X + b * d, cbuf, S, rows, L, d, T(1));
    // Per chunk first, then into the totals: a fixed order of additions.
    double acc[64] = {0};
    for (int64_t r = 0; r < rows; ++r) {
      const double xn = XN[b + r], di = D[b + r];
      for (int64_t l = 0; l < L; ++l)
        acc[l] += std::min(di, std::max(0.0, xn + cn[l] - 2.0 * double(S[r * L + l])));
    }
    for (int64_t l = 0; l < L; ++l) P[l] += acc[l];
  }
}

template <typename T>
void sqnorms_typed(const Tensor& x, const Tensor& out) {
  const int64_t N = x.size(0), d = x.size(1);
  const T* X = x.data<T>();
  double* O = out.data<double>();
  parallel_for(N, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(d, 1)),
               [&](int64_t b, int64_t e) { sqnorm_rows(X, b, e, d, O); });
}

template <typename T>
void elkan_typed(const Tensor& x, const Tensor& c, const Tensor& c_prev, bool first, bool cosine,
                 const Tensor& lower, const Tensor& upper, const Tensor& scratch,
                 const Tensor& labels, const Tensor& dist) {
  const int64_t N = x.size(0), d = x.size(1), k = c.size(0);
  const T* X = x.data<T>();
  const T* C = c.data<T>();
  double* lo = lower.data<double>();
  double* up = upper.data<double>();
  int64_t* L = labels.data<int64_t>();
  double* D = dist.data<double>();
  CF_CHECK(scratch.numel() >= k * k + 2 * k, ValueError, "[kmeans_elkan_assign] scratch of ",
           scratch.numel(), " elements, needs ", k * k + 2 * k);
  double* cc = scratch.data<double>();  // (k, k): half the centroid-centroid distances
  double* s = cc + k * k;               // (k,): min over j' != j of cc[j][j']
  double* shift = s + k;                // (k,): how far each centroid moved
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(k * d, 1));
  if (first) {
    parallel_for(N, grain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        int64_t a = 0;
        double best = HUGE_VAL;
        for (int64_t j = 0; j < k; ++j) {
          const double dij = std::sqrt(sqdist(X + i * d, C + j * d, d));
          lo[i * k + j] = dij;
          if (dij < best) best = dij, a = j;
        }
        L[i] = a;
        up[i] = best;
      }
    });
  } else {
    const T* P = c_prev.data<T>();
    for (int64_t j = 0; j < k; ++j) shift[j] = std::sqrt(sqdist(P + j * d, C + j * d, d));
    for (int64_t j = 0; j < k; ++j) {
      s[j] = HUGE_VAL;
      for (int64_t j2 = 0; j2 < k; ++j2) {
        cc[j * k + j2] = 0.5 * std::sqrt(sqdist(C + j * d, C + j2 * d, d));
        if (j2 != j) s[j] = std::min(s[j], cc[j * k + j2]);
      }
    }
    parallel_for(N, grain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        double* li = lo + i * k;
        // The bounds after the centroids moved (Elkan's steps 5 and 6).
        for (int64_t j = 0; j < k; ++j) li[j] = std::max(0.0, li[j] - shift[j]);
        int64_t a = L[i];
        double u = up[i] + shift[a];
        // Ties go to the lower index, as in the full argmin: a bound equal to u rules out only a centroid
        // above a (with <= for every centroid, a lower one exactly as near was skipped and the point kept
        // its higher label: Elkan and Lloyd gave different clusterings from the same start).
        auto ruled_out = [&](int64_t j, double bound) { return bound > u || (bound == u && j > a); };
        if (u < s[a]) {  // no other centroid can be as near (step 2)
          up[i] = u;
          continue;
        }
        bool tight = false;
        for (int64_t j = 0; j < k; ++j) {
          if (j == a || ruled_out(j, li[j]) || ruled_out(j, cc[a * k + j])) continue;  // step 3
          if (!tight) {  // step 3a: make the upper bound exact once
            u = std::sqrt(sqdist(X + i * d, C + a * d, d));
            li[a] = u;
            tight = true;
            if (ruled_out(j, li[j]) || ruled_out(j, cc[a * k + j])) continue;
          }
          const double dij = std::sqrt(sqdist(X + i * d, C + j * d, d));  // step 3b
          li[j] = dij;
          // Ties keep the lower index, as the full argmin does.
          if (dij < u || (dij == u && j < a)) {
            a = j;
            u = dij;
          }
        }
        L[i] = a;
        up[i] = u;
      }
    });
  }
  // The exact distance to the chosen centroid, as the plain assignment reports it;
  // it also makes the upper bound exact for the next call.
  parallel_for(N, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(d, 1)), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const double sq = sqdist(X + i * d, C + L[i] * d, d);
      D[i] = cosine ? std::max(0.0, 0.5 * sq) : sq;
      up[i] = std::sqrt(sq);
      lo[i * k + L[i]] = up[i];
    }
  });
}

}  // namespace

void kmeans_elkan_assign_cpu(const Tensor& x, const Tensor& c, const Tensor& c_prev, bool first,
                             bool cosine, const Tensor& lower, const Tensor& upper,
                             const Tensor& scratch, const Tensor& labels, const Tensor& dist) {
  CF_DISPATCH_FLOAT_STD(x.dtype(), "kmeans_elkan_assign",
                    elkan_typed<scalar_t>(x, c, c_prev, first, cosine, lower, upper, scratch,
                                          labels, dist));
}

void kmeans_pp_potentials_cpu(const Tensor& x, const Tensor& xnorm, const Tensor& dist,
                              const Tensor& cand, const Tensor& workspace, const Tensor& potential) {
  CF_DISPATCH_FLOAT_STD(x.dtype(), "kmeans_pp_potentials",
                    pp_potentials_typed<scalar_t>(x, xnorm, dist, cand, workspace, potential));
}

void kmeans_row_sqnorms_cpu(const Tensor& x, const Tensor& out) {
  CF_DISPATCH_FLOAT_STD(x.dtype(), "kmeans_row_sqnorms", sqnorms_typed<scalar_t>(x, out));
}

void kmeans_assign_cpu(const Tensor& x, const Tensor& c, bool cosine, int64_t block_rows,
                       const Tensor& workspace, const Tensor& labels, const Tensor& dist) {
  CF_DISPATCH_FLOAT_STD(x.dtype(), "kmeans_assign",
                    assign_typed<scalar_t>(x, c, cosine, block_rows, workspace, labels, dist));
}

void kmeans_update_cpu(const Tensor& x, const Tensor& labels, const Tensor& order,
                       const Tensor& counts, const Tensor& sums) {
  CF_DISPATCH_FLOAT_STD(x.dtype(), "kmeans_update", update_typed<scalar_t>(x, labels, order, counts, sums));
}

void kmeans_pp_update_cpu(const Tensor& x, int64_t center, const Tensor& dist) {
  CF_DISPATCH_FLOAT_STD(x.dtype(), "kmeans_pp_update", pp_update_typed<scalar_t>(x, center, dist));
}

// ---------------------------------------------------------------- routing's centroid EMA

namespace centroid_ema_cpu {
namespace {

template <typename T>
void stats_typed(const Tensor& xq, const Tensor& aq, const Tensor& mq, const Tensor& xk, const Tensor& ak,
                 const Tensor& mk, const Tensor& stats) {
  const int64_t B = xq.shape()[0], R = xq.shape()[1], N = xq.shape()[2], D = xq.shape()[3];
  const int64_t C = stats.shape()[2];
  T* out = stats.data<T>();
  const int64_t M = B * N, S = C * (D + 1), L = centroid_ema_chunk(M, R, S);
  // One task per (side, head): its tokens in chunks of L in order, each chunk summed on its own, then
  // added to the total (CUDA's order: the chunks there run in parallel).
  parallel_for(2 * R, 1, [&](int64_t u0, int64_t u1) {
    std::vector<double> total(static_cast<size_t>(S)), part(static_cast<size_t>(S));
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t s = u / R, r = u % R;
      const T* x = (s == 0 ? xq : xk).data<T>();
      const int64_t* a = (s == 0 ? aq : ak).data<int64_t>();
      const Tensor& m = s == 0 ? mq : mk;
      const bool* pad = m.defined() ? m.data<bool>() : nullptr;
      std::fill(total.begin(), total.end(), 0.0);
      for (int64_t t0 = 0; t0 < M; t0 += L) {
        std::fill(part.begin(), part.end(), 0.0);
        for (int64_t tk = t0; tk < std::min(M, t0 + L); ++tk) {
          const int64_t b = tk / N, n = tk % N;
          if (pad && pad[tk]) continue;
          const int64_t t = (b * R + r) * N + n, c = std::min(std::max(a[t], int64_t(0)), C - 1);
          const T* row = x + t * D;
          double* o = part.data() + c * (D + 1);
          for (int64_t d = 0; d < D; ++d) o[d] += double(row[d]);
          o[D] += 1;
        }
        for (int64_t j = 0; j < S; ++j) total[size_t(j)] += part[size_t(j)];
      }
      T* o = out + u * S;
      for (int64_t j = 0; j < S; ++j) o[j] = T(total[size_t(j)]);
    }
  });
}

template <typename T>
void update_typed(const Tensor& mu, const Tensor& stats, double decay) {
  const int64_t R = mu.shape()[0], C = mu.shape()[1], D = mu.shape()[2];
  T* p = mu.data<T>();
  const T* st = stats.data<T>();
  parallel_for(R * C * D, kParallelGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t rc = i / D, d = i % D;
      const T* q = st + rc * (D + 1);
      const T* k = st + (R * C + rc) * (D + 1);
      const double m = double(p[i]);
      const double mean_q = q[D] > T(0) ? double(q[d]) / double(q[D]) : m;
      const double mean_k = k[D] > T(0) ? double(k[d]) / double(k[D]) : m;
      p[i] = T(decay * m + (1.0 - decay) / 2.0 * (mean_q + mean_k));
    }
  });
}

}  // namespace
}  // namespace centroid_ema_cpu

void centroid_ema_stats_cpu(const Tensor& xq, const Tensor& aq, const Tensor& mq, const Tensor& xk, const Tensor& ak,
                            const Tensor& mk, const Tensor& stats) {
  if (stats.dtype() == kFloat64)
    centroid_ema_cpu::stats_typed<double>(xq, aq, mq, xk, ak, mk, stats);
  else
    centroid_ema_cpu::stats_typed<float>(xq, aq, mq, xk, ak, mk, stats);
}

void centroid_ema_update_cpu(const Tensor& mu, const Tensor& stats, double decay) {
  if (mu.dtype() == kFloat64)
    centroid_ema_cpu::update_typed<double>(mu, stats, decay);
  else
    centroid_ema_cpu::update_typed<float>(mu, stats, decay);
}

// ---------------------------------------------------------------- cluster means (eq. 3)

namespace cluster_means_cpu {

// Sizes of the (G, N, D) view of x and of the C clusters.
struct Sizes {
  int64_t G, N, D, C;
};
Sizes sizes_of(const Tensor& x, int64_t C) {
  const int64_t N = x.dim() >= 2 ? x.shape()[size_t(x.dim() - 2)] : 1, D = x.dim() >= 1 ? x.shape().back() : 1;
  return {N * D > 0 ? x.numel() / (N * D) : 0, N, D, C};
}

template <typename T>
void forward_typed(const Tensor& x, const Tensor& assign, double scale, const Tensor& out, const Tensor& counts) {
  Sizes z = sizes_of(x, out.shape()[size_t(out.dim() - 2)]);
  z.G = counts.numel() / z.C;  // (not from x: with N = 0 every centroid is still written, as 0)
  const T* xp = x.data<T>();
  const int64_t* ap = assign.data<int64_t>();
  T* op = out.data<T>();
  int64_t* cp = counts.data<int64_t>();
  parallel_for(z.G, 1, [&](int64_t b, int64_t e) {
    std::vector<double> sums(size_t(z.C * z.D));
    for (int64_t g = b; g < e; ++g) {
      std::fill(sums.begin(), sums.end(), 0.0);
      int64_t* cg = cp + g * z.C;
      std::fill(cg, cg + z.C, int64_t(0));
      for (int64_t i = 0; i < z.N; ++i) {
        const int64_t a = ap[g * z.N + i];
        if (a < 0) continue;
        const int64_t c = std::min(a, z.C - 1);
        ++cg[c];
        const T* xr = xp + (g * z.N + i) * z.D;
        double* sr = sums.data() + c * z.D;
        for (int64_t j = 0; j < z.D; ++j) sr[j] += double(xr[j]);
      }
      for (int64_t c = 0; c < z.C; ++c) {
        const double f = scale / double(std::max<int64_t>(cg[c], 1));
        for (int64_t j = 0; j < z.D; ++j) op[(g * z.C + c) * z.D + j] = T(sums[size_t(c * z.D + j)] * f);
      }
    }
  });
}

template <typename T>
void backward_typed(const Tensor& dout, const Tensor& assign, const Tensor& counts, double scale, const Tensor& dx) {
  const Sizes z = sizes_of(dx, dout.shape()[size_t(dout.dim() - 2)]);
  const T* gp = dout.data<T>();
  const int64_t* ap = assign.data<int64_t>();
  const int64_t* cp = counts.data<int64_t>();
  T* dp = dx.data<T>();
  parallel_for(z.G * z.N, std::max<int64_t>(1, 16384 / std::max<int64_t>(z.D, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      T* out = dp + r * z.D;
      const int64_t a = ap[r];
      if (a < 0) {
        std::fill(out, out + z.D, T(0));
        continue;
      }
      const int64_t g = r / z.N, c = std::min(a, z.C - 1);
      const T f = T(scale / double(std::max<int64_t>(cp[g * z.C + c], 1)));
      const T* gr = gp + (g * z.C + c) * z.D;
      for (int64_t j = 0; j < z.D; ++j) out[j] = gr[j] * f;
    }
  });
}

}  // namespace cluster_means_cpu

void cluster_means_forward_cpu(const Tensor& x, const Tensor& assign, double scale, const Tensor& out,
                               const Tensor& counts) {
  if (x.dtype() == kFloat64) cluster_means_cpu::forward_typed<double>(x, assign, scale, out, counts);
  else cluster_means_cpu::forward_typed<float>(x, assign, scale, out, counts);
}

void cluster_means_backward_cpu(const Tensor& dout, const Tensor& assign, const Tensor& counts, double scale,
                                const Tensor& dx) {
  if (dx.dtype() == kFloat64) cluster_means_cpu::backward_typed<double>(dout, assign, counts, scale, dx);
  else cluster_means_cpu::backward_typed<float>(dout, assign, counts, scale, dx);
}

}  // namespace cf::kernels
