#pragma once
// Query grouping of clustered attention (Vyas et al. 2020, section 3.2.2): hash the
// queries by the signs of random projections (LSH, Charikar 2002), then run K-Means
// in Hamming space on the codes. Cost O(N D B) for hashing and O(N C L) for L Lloyd
// iterations with C clusters, instead of O(N C D L) for Euclidean K-Means.
// Neither step is differentiable; both return int64 tensors without history.
#include "core/rng.h"
#include "core/tensor.h"

namespace cf {

// Random hyperplanes (bits, D) drawn N(0, 1) from gen, in q's dtype, on `device` (on CUDA equal to the CPU's
// draw to within the device libm's rounding: randn's parity).
Tensor random_hyperplanes(int64_t bits, int64_t dim, DType dtype, Generator& gen, Device device = Device::cpu());

// Codes of x (..., D) under planes (bits, D), bits in [1, 63]: bit b of the int64
// code is 1 when x . planes[b] > 0. Output int64 (...), always >= 0.
Tensor hash_codes(const Tensor& x, const Tensor& planes);

// Hamming K-Means on codes int64 (G, N) of `bits` bits, one independent problem per
// row g. Rows are clustered over their valid entries only (`exclude` bool (G, N),
// true = padding, or undefined); excluded entries get cluster -1.
// Rule for small rows: a row with n valid entries uses min(clusters, n) clusters,
// numbered from 0; the remaining ids are empty.
// Initialisation: farthest-point (the first valid code, then repeatedly the valid
// code farthest in Hamming distance from the chosen ones), deterministic.
// Each of the `iterations` Lloyd steps sets every centroid bit to the majority
// vote of its members (a tie keeps the old bit) and reassigns each code to its
// nearest centroid (popcount of the XOR; ties go to the lower id). A cluster left
// empty is re-seeded with the member farthest from its centroid among clusters of
// two or more members. Returns int64 (G, N) cluster ids.
Tensor hamming_kmeans(const Tensor& codes, int64_t clusters, int64_t iterations, int64_t bits,
                      const Tensor& exclude = Tensor());

}  // namespace cf

// The steps of Euclidean / spherical K-Means (the loop is nn/clustering/kmeans.cpp),
// writing into outputs the caller allocated on x's device, so a Lloyd loop
// allocates its buffers once. Each checks that its tensors share x's device and
// are contiguous, then runs the kernel of that device (kernels/kmeans/kmeans.h,
// where each contract, with its tie and summation-order rules, is stated).
namespace cf::ops {

// Rows of the potential workspace per GEMM chunk (kmeans_pp_potentials).
int64_t kmeans_potential_chunk();
// labels (N,) int64, dist (N,) float64: each row's nearest centroid of c (k, d) and
// its distance; workspace of at least (block_rows + 1) * k elements of x's dtype.
void kmeans_assign_into(const Tensor& x, const Tensor& c, bool cosine, int64_t block_rows, const Tensor& workspace,
                        const Tensor& labels, const Tensor& dist);
// The same by Elkan's bounds (CPU only); lower (N, k), upper (N,), scratch and c_prev are its state.
void kmeans_elkan_assign_into(const Tensor& x, const Tensor& c, const Tensor& c_prev, bool first, bool cosine,
                              const Tensor& lower, const Tensor& upper, const Tensor& scratch,
                              const Tensor& labels, const Tensor& dist);
// counts (k,) int64 and sums (k, d) float64 of each cluster's members; order (N,) int64 scratch.
void kmeans_update_into(const Tensor& x, const Tensor& labels, const Tensor& order, const Tensor& counts,
                        const Tensor& sums);
// dist[i] = min(dist[i], |x_i - x_center|^2).
void kmeans_pp_update_into(const Tensor& x, int64_t center, const Tensor& dist);
// potential[l] = sum_i min(dist[i], |x_i - x_cand[l]|^2); xnorm from kmeans_row_sqnorms_into.
void kmeans_pp_potentials_into(const Tensor& x, const Tensor& xnorm, const Tensor& dist, const Tensor& cand,
                               const Tensor& workspace, const Tensor& potential);
// out (N,) float64 = |x_i|^2.
void kmeans_row_sqnorms_into(const Tensor& x, const Tensor& out);

}  // namespace cf::ops
