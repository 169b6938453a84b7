#include "nn/attention/hamming_kmeans.h"

#include <algorithm>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/random.h"
#include "autograd/ops/shape.h"
#include "core/error.h"
#include "kernels/common/parallel.h"

namespace cf {
namespace nn {

Tensor random_hyperplanes(int64_t bits, int64_t dim, DType dtype, Generator& gen) {
  CF_CHECK(bits >= 1 && bits <= 63, ValueError, "[random_hyperplanes] bits must be in [1, 63], got ", bits);
  CF_CHECK(dim >= 1, ValueError, "[random_hyperplanes] dim must be >= 1, got ", dim);
  return randn({bits, dim}, dtype, gen);
}

namespace {
template <typename T>
void pack_signs(const T* proj, int64_t rows, int64_t bits, int64_t* out) {
  kernels::parallel_for(rows, 4096, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* p = proj + r * bits;
      uint64_t c = 0;
      for (int64_t j = 0; j < bits; ++j) c |= uint64_t(p[j] > T(0)) << j;
      out[r] = int64_t(c);
    }
  });
}
}  // namespace

Tensor hash_codes(const Tensor& x, const Tensor& planes) {
  CF_CHECK(x.defined() && planes.defined(), ValueError, "[hash_codes] x and planes must be defined");
  CF_CHECK(x.device().is_cpu() && planes.device().is_cpu(), NotImplementedError,
           "[hash_codes] runs on the CPU only (no CUDA kernel yet); got x on ", x.device(), ", planes on ",
           planes.device());
  CF_CHECK(is_floating(x.dtype()) && x.dtype() == planes.dtype(), DTypeError,
           "[hash_codes] x and planes must share one float dtype, got ", x.dtype(), " and ", planes.dtype());
  CF_CHECK(x.dim() >= 1 && planes.dim() == 2 && planes.shape()[1] == x.shape()[x.dim() - 1], ShapeError,
           "[hash_codes] expected x (..., D) and planes (bits, D), got x ", shape_str(x.shape()), ", planes ",
           shape_str(planes.shape()));
  const int64_t bits = planes.shape()[0], d = planes.shape()[1];
  CF_CHECK(bits >= 1 && bits <= 63, ValueError, "[hash_codes] planes must hold 1..63 hyperplanes, got ", bits);
  NoGradGuard ng;
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  const int64_t rows = x.numel() / std::max<int64_t>(d, 1);
  Tensor proj = contiguous(matmul(reshape(x.detach(), {rows, d}), transpose(planes.detach(), 0, 1)));
  Tensor out = Tensor::empty(out_shape, kInt64);
  if (x.dtype() == kFloat32)
    pack_signs(proj.data<float>(), rows, bits, out.data<int64_t>());
  else
    pack_signs(proj.data<double>(), rows, bits, out.data<int64_t>());
  return out;
}

namespace {
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
CF_POPCNT_CLONES void kmeans_row(const int64_t* codes, const bool* excl, int64_t n, int64_t clusters, int64_t iterations,
                int64_t bits, int64_t* out) {
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
}  // namespace

Tensor hamming_kmeans(const Tensor& codes, int64_t clusters, int64_t iterations, int64_t bits,
                      const Tensor& exclude) {
  CF_CHECK(codes.defined(), ValueError, "[hamming_kmeans] codes must be defined");
  CF_CHECK(codes.dtype() == kInt64 && codes.dim() == 2, DTypeError,
           "[hamming_kmeans] codes must be int64 (G, N), got ", codes.describe());
  CF_CHECK(codes.device().is_cpu(), NotImplementedError, "[hamming_kmeans] runs on the CPU only (no CUDA kernel yet); got codes on ", codes.device());
  CF_CHECK(clusters >= 1, ValueError, "[hamming_kmeans] clusters must be >= 1, got ", clusters);
  CF_CHECK(iterations >= 0, ValueError, "[hamming_kmeans] iterations must be >= 0, got ", iterations);
  CF_CHECK(bits >= 1 && bits <= 63, ValueError, "[hamming_kmeans] bits must be in [1, 63], got ", bits);
  if (exclude.defined())
    CF_CHECK(exclude.dtype() == kBool && exclude.shape() == codes.shape(), ShapeError,
             "[hamming_kmeans] exclude must be bool of the codes' shape ", shape_str(codes.shape()), ", got ",
             exclude.describe());
  Tensor c = contiguous(codes);
  Tensor e = exclude.defined() ? contiguous(exclude) : Tensor();
  const int64_t g = c.shape()[0], n = c.shape()[1];
  const int64_t* cp = c.data<int64_t>();
  const uint64_t mask = (uint64_t(1) << bits) - 1;
  for (int64_t i = 0; i < g * n; ++i)
    CF_CHECK(cp[i] >= 0 && (uint64_t(cp[i]) & ~mask) == 0, ValueError, "[hamming_kmeans] code ", cp[i],
             " at position ", i, " has bits beyond the ", bits, " given");
  Tensor out = Tensor::empty({g, n}, kInt64);
  int64_t* op = out.data<int64_t>();
  const bool* ep = e.defined() ? e.data<bool>() : nullptr;
  kernels::parallel_for(g, 0, [&](int64_t b, int64_t en) {
    for (int64_t r = b; r < en; ++r)
      kmeans_row(cp + r * n, ep ? ep + r * n : nullptr, n, clusters, iterations, bits, op + r * n);
  });
  return out;
}

}  // namespace nn
}  // namespace cf
