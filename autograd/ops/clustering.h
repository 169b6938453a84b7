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

// Neural clustering's auxiliary losses (ClusterFormer, Wang et al. 2022), each a fused op:
// one kernel call forward and one backward (kernels/cluster_loss/cluster_loss.h), where
// composed of tensor ops they made about 20 per layer and step (issue 25: kernel launches).
// The phi of both: kInner the paper's inner product; kCosine a . b / (|a| |b|) in both
// losses; kSphere the centroids on the unit sphere, phi(x_j, c_i / |c_i|) in L1 and the
// cosine in L2 (nn/attention/neural_clustering.h says why). A zero row counts as length
// 1e-12. float32 and float64 run in their own dtype; a 16-bit pair is computed in float32
// and the loss returned in the inputs' dtype; under autocast a 16-bit input is cast to float32
// and the loss is float32 (autograd/autocast.h: losses stay float32).
enum class ClusterLossForm { kInner, kCosine, kSphere };

// L1 (eq. 6): the mean over the batch of -(1/n_b) sum_j phi(x_bj, c_hat[b, index_bj]) over the
// non-padding tokens j of sequence b, n_b their number (at least 1: a fully padded sequence
// adds 0). x (B, N, D), c_hat (B, k, D) of one float dtype and device, index int64 (B, N) in
// [0, k) at every non-padding token (k itself marks padding; on CUDA the range check is a
// deferred one, core/cuda.h), key_padding_mask bool (B, N) (true = padding) or undefined.
// Differentiable in x and c_hat; a 0-d result.
Tensor clustering_loss(const Tensor& x, const Tensor& c_hat, const Tensor& index,
                       const Tensor& key_padding_mask = Tensor(), ClusterLossForm form = ClusterLossForm::kInner);
// L2 (eq. 11, with its cyclic term phi(C^_1, C^_k)): the mean over the batch of
// -(1/k) sum_i phi(c_hat_i, c_hat_(i-1) mod k), c_hat (B, k, D) float with k >= 1; both bounded
// forms are the cosine (both arguments are centroids). A 0-d result; 0 for an empty batch.
Tensor centroid_sorting_loss(const Tensor& c_hat, ClusterLossForm form = ClusterLossForm::kInner);

// Clustered attention's centroids (Vyas et al. 2020, eq. 3), one kernel call each way:
// out[..., c, :] = scale / max(n_c, 1) * the sum of the rows x[..., i, :] with assignment[..., i] == c (n_c of
// them; an empty cluster's centroid is 0; id -1 is no cluster). x (..., N, D) of rank >= 2, float32 or float64
// (16-bit cast to float32 under autocast), assignment int64 (..., N) in [-1, clusters) (a data check, deferred
// on CUDA; skipped inside ops::KnownGoodIndices), clusters >= 1, scale finite. -> (..., clusters, D) of x's dtype,
// differentiable in x. The sums in double, members in increasing i, then one multiply: the same bits on the
// CPU and CUDA.
Tensor cluster_means(const Tensor& x, const Tensor& assignment, int64_t clusters, double scale = 1.0);

// Routing attention's commitment term (Roy et al. 2021, section 4.1), one fused kernel call each way:
// scale * sum over the tokens (b, h, n) that are not padding of |x_bhn - mu[h, assign_bhn]|^2, the
// squared distance of each vector to its assigned centroid (the caller divides: routing by its real
// tokens times its routed heads times D). x (B, H, N, D) float32 or float64, centroids (H, C, D) of x's dtype with C >= 1,
// assign int64 (B, H, N) in [0, C) (a data check; deferred on CUDA), key_padding_mask bool (B, N)
// (true = padding) or undefined, scale finite. A 0-d result in x's dtype, differentiable in x; the
// centroids are sg(mu), a constant: ones that require grad are refused with grad mode on (pass
// centroids.detach()). Under autocast 16-bit x and centroids are cast to float32 and the loss is float32.
Tensor commitment_loss(const Tensor& x, const Tensor& centroids, const Tensor& assign,
                       const Tensor& key_padding_mask = Tensor(), double scale = 1.0);

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

// Routing attention's centroid EMA (Roy et al. 2021, section 4.1; nn/attention/routing.cpp), each step one
// kernel call (kernels/kmeans/kmeans.h states the sums and their order). stats (2, R, C, D + 1) of xq's
// dtype receives, per side (queries, keys), head and centroid, the sum of the assigned rows of xq / xk
// (B, R, N, D) float32 or float64 over the tokens that are not padding (mq / mk bool (B, N) or undefined)
// and their count; the ids aq / ak int64 (B, R, N) are the layer's argmax, in [0, C) (not scanned: the
// kernels clamp any other into it). Distributed, the
// stats are all-reduced (summed) between the two steps. The update writes mu (R, C, D) in place:
// mu <- decay mu + (1 - decay) / 2 (mean_q + mean_k), a side without members keeping mu for its mean.
void centroid_ema_stats_into(const Tensor& xq, const Tensor& aq, const Tensor& mq, const Tensor& xk, const Tensor& ak,
                             const Tensor& mk, const Tensor& stats);
void centroid_ema_update_(const Tensor& mu, const Tensor& stats, double decay);

}  // namespace cf::ops
