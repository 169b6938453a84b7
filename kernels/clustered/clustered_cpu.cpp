// CPU arm of the clustered-attention kernels (kernels/clustered/clustered.h):
// OpenMP over rows (hashing, sparse products), over groups (Hamming K-Means, the
// scatter: rows of one group may hit the same key, so a group is summed serially
// in a fixed order).
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/clustered/clustered.h"
#include "kernels/common/parallel.h"

namespace cf::kernels {

namespace {

template <typename T>
void pack_signs(const T* proj, int64_t rows, int64_t bits, int64_t* out) {
  parallel_for(rows, 4096, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* p = proj + r * bits;
      uint64_t c = 0;
      for (int64_t j = 0; j < bits; ++j) c |= uint64_t(p[j] > T(0)) << j;
      out[r] = int64_t(c);
    }
  });
}

inline __attribute__((always_inline)) int hamming(uint64_t a, uint64_t b) { return __builtin_popcountll(a ^ b); }

// Hamming distances are the inner loop (O(N C L)): on x86-64 the row is compiled
// twice and the loader picks the POPCNT version where the CPU has it (a software
// popcount is several times slower).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CF_POPCNT_CLONES __attribute__((target_clones("popcnt", "default")))
#else
#define CF_POPCNT_CLONES
#endif

// One row: clusters the non-excluded codes[0..n), writes ids into out.
CF_POPCNT_CLONES void kmeans_row(const int64_t* codes, const bool* excl, int64_t n, int64_t clusters,
                                 int64_t iterations, int64_t bits, int64_t* out) {
  std::vector<int64_t> pos;
  pos.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    if (excl && excl[i])
      out[i] = -1;
    else
      pos.push_back(i);
  }
  const int64_t m = int64_t(pos.size());
  if (m == 0) return;
  const int64_t c = std::min(clusters, m);
  std::vector<uint64_t> x(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) x[size_t(i)] = uint64_t(codes[pos[size_t(i)]]);

  // Farthest-point initialisation: deterministic, and it puts one seed in every
  // group of codes that lies farther apart than the groups are wide.
  std::vector<uint64_t> cen(static_cast<size_t>(c));
  std::vector<int> mind(size_t(m), 1 << 30);
  int64_t pick = 0;
  for (int64_t j = 0; j < c; ++j) {
    cen[size_t(j)] = x[size_t(pick)];
    int best = -1;
    for (int64_t i = 0; i < m; ++i) {
      mind[size_t(i)] = std::min(mind[size_t(i)], hamming(x[size_t(i)], cen[size_t(j)]));
      if (mind[size_t(i)] > best) best = mind[size_t(i)], pick = i;
    }
  }

  std::vector<int64_t> a(static_cast<size_t>(m));
  std::vector<int> dist(static_cast<size_t>(m));
  std::vector<int64_t> count(static_cast<size_t>(c));
  auto assign = [&] {
    std::fill(count.begin(), count.end(), 0);
    for (int64_t i = 0; i < m; ++i) {
      int best = 1 << 30;
      int64_t bj = 0;
      for (int64_t j = 0; j < c; ++j) {
        int h = hamming(x[size_t(i)], cen[size_t(j)]);
        if (h < best) best = h, bj = j;
      }
      a[size_t(i)] = bj;
      dist[size_t(i)] = best;
      ++count[size_t(bj)];
    }
    // Re-seed empty clusters with the farthest member of a cluster of >= 2.
    for (int64_t j = 0; j < c; ++j) {
      if (count[size_t(j)] > 0) continue;
      int64_t far = -1;
      for (int64_t i = 0; i < m; ++i)
        if (count[size_t(a[size_t(i)])] >= 2 && (far < 0 || dist[size_t(i)] > dist[size_t(far)])) far = i;
      if (far < 0 || dist[size_t(far)] == 0) break;  // only duplicates left: nothing to separate
      --count[size_t(a[size_t(far)])];
      a[size_t(far)] = j;
      dist[size_t(far)] = 0;
      cen[size_t(j)] = x[size_t(far)];
      count[size_t(j)] = 1;
    }
  };
  assign();
  std::vector<int64_t> ones(static_cast<size_t>(c * bits));
  for (int64_t it = 0; it < iterations; ++it) {
    std::fill(ones.begin(), ones.end(), 0);
    for (int64_t i = 0; i < m; ++i) {
      int64_t* o = ones.data() + a[size_t(i)] * bits;
      for (uint64_t v = x[size_t(i)]; v; v &= v - 1) ++o[__builtin_ctzll(v)];
    }
    bool changed = false;
    for (int64_t j = 0; j < c; ++j) {
      if (count[size_t(j)] == 0) continue;
      uint64_t cj = cen[size_t(j)];
      for (int64_t b = 0; b < bits; ++b) {
        int64_t twice = 2 * ones[size_t(j * bits + b)];
        if (twice > count[size_t(j)])
          cj |= uint64_t(1) << b;
        else if (twice < count[size_t(j)])
          cj &= ~(uint64_t(1) << b);
      }
      changed |= cj != cen[size_t(j)];
      cen[size_t(j)] = cj;
    }
    if (!changed) break;  // a fixed point: further iterations reproduce the same assignment
    assign();
  }
  for (int64_t i = 0; i < m; ++i) out[pos[size_t(i)]] = a[size_t(i)];
}

// Rows per parallel chunk: a row costs K * D multiply-adds.
int64_t grain_rows(int64_t work_per_row) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(work_per_row, 1)); }

template <typename T>
void dot_rows(const T* q, const T* k, const int64_t* idx, T* out, int64_t g, int64_t n, int64_t m, int64_t kk,
              int64_t d) {
  parallel_for(g * n, grain_rows(kk * d), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* qr = q + r * d;
      const T* kg = k + (r / n) * m * d;
      for (int64_t t = 0; t < kk; ++t) {
        const T* kr = kg + idx[r * kk + t] * d;
        T s = 0;
        // omp simd: the reduction may be reordered into vector lanes (a fixed
        // order for a given build, so results stay reproducible).
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < d; ++j) s += qr[j] * kr[j];
        out[r * kk + t] = s;
      }
    }
  });
}

template <typename T>
void wsum_rows(const T* w, const T* v, const int64_t* idx, T* out, int64_t g, int64_t n, int64_t m, int64_t kk,
               int64_t d) {
  parallel_for(g * n, grain_rows(kk * d), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      T* o = out + r * d;
      for (int64_t j = 0; j < d; ++j) o[j] = 0;
      const T* vg = v + (r / n) * m * d;
      for (int64_t t = 0; t < kk; ++t) {
        const T c = w[r * kk + t];
        if (c == T(0)) continue;
        const T* vr = vg + idx[r * kk + t] * d;
        for (int64_t j = 0; j < d; ++j) o[j] += c * vr[j];
      }
    }
  });
}

template <typename T>
void scatter_groups(const T* c, const T* x, const int64_t* idx, T* out, int64_t g, int64_t n, int64_t m,
                    int64_t kk, int64_t d) {
  parallel_for(g, 0, [&](int64_t b, int64_t e) {
    for (int64_t gg = b; gg < e; ++gg) {
      T* og = out + gg * m * d;
      for (int64_t r = gg * n; r < (gg + 1) * n; ++r) {
        const T* xr = x + r * d;
        for (int64_t t = 0; t < kk; ++t) {
          const T cv = c[r * kk + t];
          if (cv == T(0)) continue;
          T* o = og + idx[r * kk + t] * d;
          for (int64_t j = 0; j < d; ++j) o[j] += cv * xr[j];
        }
      }
    }
  });
}

}  // namespace

void hash_pack_signs_cpu(const Tensor& proj, const Tensor& out) {
  const int64_t rows = proj.size(0), bits = proj.size(1);
  CF_DISPATCH_FLOAT_STD(proj.dtype(), "hash_codes",
                    pack_signs(proj.data<scalar_t>(), rows, bits, out.data<int64_t>()));
}

void hamming_kmeans_cpu(const Tensor& codes, const Tensor& exclude, int64_t clusters, int64_t iterations,
                        int64_t bits, const Tensor& out) {
  const int64_t g = codes.size(0), n = codes.size(1);
  const int64_t* cp = codes.data<int64_t>();
  const bool* ep = exclude.defined() ? exclude.data<bool>() : nullptr;
  int64_t* op = out.data<int64_t>();
  parallel_for(g, 0, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      kmeans_row(cp + r * n, ep ? ep + r * n : nullptr, n, clusters, iterations, bits, op + r * n);
  });
}

void sparse_dot_cpu(const Tensor& q, const Tensor& k, const Tensor& idx, const Tensor& out) {
  const int64_t g = q.size(0), n = q.size(1), d = q.size(2), m = k.size(1), kk = idx.size(2);
  CF_DISPATCH_FLOAT_STD(q.dtype(), "sparse_dot",
                    dot_rows(q.data<scalar_t>(), k.data<scalar_t>(), idx.data<int64_t>(), out.data<scalar_t>(), g,
                             n, m, kk, d));
}

void sparse_weighted_sum_cpu(const Tensor& w, const Tensor& v, const Tensor& idx, const Tensor& out) {
  const int64_t g = w.size(0), n = w.size(1), kk = w.size(2), m = v.size(1), d = v.size(2);
  CF_DISPATCH_FLOAT_STD(w.dtype(), "sparse_weighted_sum",
                    wsum_rows(w.data<scalar_t>(), v.data<scalar_t>(), idx.data<int64_t>(), out.data<scalar_t>(), g,
                              n, m, kk, d));
}

void sparse_scatter_rows_cpu(const Tensor& c, const Tensor& x, const Tensor& idx, const Tensor& out) {
  const int64_t g = c.size(0), n = c.size(1), kk = c.size(2), d = x.size(2), m = out.size(1);
  CF_DISPATCH_FLOAT_STD(x.dtype(), "sparse_scatter_rows",
                    scatter_groups(c.data<scalar_t>(), x.data<scalar_t>(), idx.data<int64_t>(),
                                   out.data<scalar_t>(), g, n, m, kk, d));
}

}  // namespace cf::kernels
