// CPU arm of query hashing and Hamming K-Means (kernels/kmeans/hamming.h):
// OpenMP over rows (hashing) and over groups (one K-Means problem each).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/common/parallel.h"
#include "kernels/kmeans/hamming.h"

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

// Hamming distances are the inner loops (O(N C L)). On x86-64 the row is compiled
// three ways and picked at run time: the scalar loops with the POPCNT instruction
// (target_clones; a software popcount is several times slower) or without, and,
// where the CPU has AVX-512 VPOPCNTDQ (Ice Lake and later, Zen 4), the same steps
// as minima / maxima of packed (distance, index) keys, which the compiler
// vectorises eight codes at a time with VPOPCNTQ and VPMINUQ: about 4x the scalar
// assignment at N = 512, C = 100. Without AVX-512 the packed form is slower than
// the branchy scalar loop, hence both.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CF_POPCNT_CLONES __attribute__((target_clones("popcnt", "default")))
#define CF_VPOPCNT_TARGET __attribute__((target("avx512vpopcntdq,avx512f,avx512vl,avx512bw,popcnt")))
#define CF_HAVE_VPOPCNT_ROW 1
#else
#define CF_POPCNT_CLONES
#endif

// One row: clusters the non-excluded codes[0..n), writes ids into out. kPacked
// selects the packed-key form of the two O(N C) loops; both give the same ids.
template <bool kPacked>
inline __attribute__((always_inline)) void kmeans_row_body(const int64_t* codes, const bool* excl, int64_t n,
                                                           int64_t clusters, int64_t iterations, int64_t bits,
                                                           int64_t* out) {
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
    const uint64_t cj = cen[size_t(j)] = x[size_t(pick)];
    if constexpr (kPacked) {
      // the first farthest: the maximum of (distance, inverted index)
      uint64_t key = 0;
      for (int64_t i = 0; i < m; ++i) {
        const int d = mind[size_t(i)] = std::min(mind[size_t(i)], hamming(x[size_t(i)], cj));
        key = std::max(key, (uint64_t(d) << 32) | (0xFFFFFFFFu - uint64_t(i)));
      }
      pick = int64_t(0xFFFFFFFFu - (key & 0xFFFFFFFFu));
    } else {
      int best = -1;
      for (int64_t i = 0; i < m; ++i) {
        mind[size_t(i)] = std::min(mind[size_t(i)], hamming(x[size_t(i)], cj));
        if (mind[size_t(i)] > best) best = mind[size_t(i)], pick = i;
      }
    }
  }

  std::vector<int64_t> a(static_cast<size_t>(m));
  std::vector<int> dist(static_cast<size_t>(m));
  std::vector<int64_t> count(static_cast<size_t>(c));
  // always_inline: as a function of its own the lambda would be compiled for the default
  // target (no POPCNT, no AVX-512) at -O2 and below
  auto assign = [&]() __attribute__((always_inline)) {
    std::fill(count.begin(), count.end(), 0);
    for (int64_t i = 0; i < m; ++i) {
      const uint64_t xi = x[size_t(i)];
      int best = 1 << 30;
      int64_t bj = 0;
      if constexpr (kPacked) {
        // the first nearest: the minimum of (distance, index)
        uint64_t key = ~uint64_t(0);
        for (int64_t j = 0; j < c; ++j) key = std::min(key, (uint64_t(hamming(xi, cen[size_t(j)])) << 32) | uint64_t(j));
        best = int(key >> 32);
        bj = int64_t(key & 0xFFFFFFFFu);
      } else {
        for (int64_t j = 0; j < c; ++j) {
          int h = hamming(xi, cen[size_t(j)]);
          if (h < best) best = h, bj = j;
        }
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
  // Per cluster, how many members have each bit set; a centroid bit takes the
  // majority (a tie keeps it).
  std::vector<int64_t> ones(kPacked ? 0 : static_cast<size_t>(c * bits));
  // The packed form counts all 64 bits of every code, branch-free (vectorised over
  // the bits); bits from `bits` up are 0 in every code and centroid, so their
  // counts are 0 and the vote keeps them 0.
  std::vector<int32_t> ones64(kPacked ? static_cast<size_t>(c * 64) : 0);
  for (int64_t it = 0; it < iterations; ++it) {
    bool changed = false;
    if constexpr (kPacked) {
      std::fill(ones64.begin(), ones64.end(), 0);
      for (int64_t i = 0; i < m; ++i) {
        int32_t* o = ones64.data() + a[size_t(i)] * 64;
        // two 32-bit halves: shifts and adds of one width vectorise (VPSRLVD, VPADDD)
        const uint32_t lo = uint32_t(x[size_t(i)]), hi = uint32_t(x[size_t(i)] >> 32);
        for (int b = 0; b < 32; ++b) o[b] += int32_t((lo >> b) & 1u);
        for (int b = 0; b < 32; ++b) o[32 + b] += int32_t((hi >> b) & 1u);
      }
      for (int64_t j = 0; j < c; ++j) {
        const int32_t cnt = int32_t(count[size_t(j)]);
        if (cnt == 0) continue;
        // 2 ones > cnt, written o > cnt - o (no overflow), per 32-bit half
        uint32_t half_set[2] = {0, 0}, half_clear[2] = {0, 0};
        for (int h = 0; h < 2; ++h) {
          const int32_t* o = ones64.data() + j * 64 + h * 32;
          for (int b = 0; b < 32; ++b) {
            half_set[h] |= uint32_t(o[b] > cnt - o[b]) << b;
            half_clear[h] |= uint32_t(o[b] < cnt - o[b]) << b;
          }
        }
        const uint64_t set = uint64_t(half_set[1]) << 32 | half_set[0];
        const uint64_t clear = uint64_t(half_clear[1]) << 32 | half_clear[0];
        const uint64_t cj = (cen[size_t(j)] | set) & ~clear;
        changed |= cj != cen[size_t(j)];
        cen[size_t(j)] = cj;
      }
    } else {
      std::fill(ones.begin(), ones.end(), 0);
      for (int64_t i = 0; i < m; ++i) {
        int64_t* o = ones.data() + a[size_t(i)] * bits;
        for (uint64_t v = x[size_t(i)]; v; v &= v - 1) ++o[__builtin_ctzll(v)];
      }
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
    }
    if (!changed) break;  // a fixed point: further iterations reproduce the same assignment
    assign();
  }
  for (int64_t i = 0; i < m; ++i) out[pos[size_t(i)]] = a[size_t(i)];
}

CF_POPCNT_CLONES void kmeans_row_scalar(const int64_t* codes, const bool* excl, int64_t n, int64_t clusters,
                                        int64_t iterations, int64_t bits, int64_t* out) {
  kmeans_row_body<false>(codes, excl, n, clusters, iterations, bits, out);
}

#ifdef CF_HAVE_VPOPCNT_ROW
CF_VPOPCNT_TARGET void kmeans_row_vpopcnt(const int64_t* codes, const bool* excl, int64_t n, int64_t clusters,
                                          int64_t iterations, int64_t bits, int64_t* out) {
  kmeans_row_body<true>(codes, excl, n, clusters, iterations, bits, out);
}
#endif

}  // namespace

bool hamming_kmeans_vectorised() {
#ifdef CF_HAVE_VPOPCNT_ROW
  static const bool yes = __builtin_cpu_supports("avx512vpopcntdq") && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
  return yes;
#else
  return false;
#endif
}

namespace {

using KMeansRow = void (*)(const int64_t*, const bool*, int64_t, int64_t, int64_t, int64_t, int64_t*);

KMeansRow kmeans_row(bool vectorised, int64_t n) {
#ifdef CF_HAVE_VPOPCNT_ROW
  // (its bit counts are int32)
  if (vectorised && hamming_kmeans_vectorised() && n <= std::numeric_limits<int32_t>::max())
    return kmeans_row_vpopcnt;
#endif
  (void)vectorised;
  return kmeans_row_scalar;
}

}  // namespace

void hash_pack_signs_cpu(const Tensor& proj, const Tensor& out) {
  const int64_t rows = proj.size(0), bits = proj.size(1);
  CF_DISPATCH_FLOAT_STD(proj.dtype(), "hash_codes",
                    pack_signs(proj.data<scalar_t>(), rows, bits, out.data<int64_t>()));
}

void hamming_kmeans_cpu(const Tensor& codes, const Tensor& exclude, int64_t clusters, int64_t iterations,
                        int64_t bits, const Tensor& out, bool vectorised) {
  const KMeansRow row = kmeans_row(vectorised, codes.size(1));
  const int64_t g = codes.size(0), n = codes.size(1);
  const int64_t* cp = codes.data<int64_t>();
  const bool* ep = exclude.defined() ? exclude.data<bool>() : nullptr;
  int64_t* op = out.data<int64_t>();
  parallel_for(g, 0, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      row(cp + r * n, ep ? ep + r * n : nullptr, n, clusters, iterations, bits, op + r * n);
  });
}

}  // namespace cf::kernels
