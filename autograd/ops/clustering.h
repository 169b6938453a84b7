#pragma once
// Query grouping of clustered attention (Vyas et al. 2020, section 3.2.2): hash the
// queries by the signs of random projections (LSH, Charikar 2002), then run K-Means
// in Hamming space on the codes. Cost O(N D B) for hashing and O(N C L) for L Lloyd
// iterations with C clusters, instead of O(N C D L) for Euclidean K-Means.
// Neither step is differentiable; both return int64 tensors without history.
#include "core/rng.h"
#include "core/tensor.h"

namespace cf {

// Random hyperplanes (bits, D) drawn N(0, 1) from gen, in q's dtype.
Tensor random_hyperplanes(int64_t bits, int64_t dim, DType dtype, Generator& gen);

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
