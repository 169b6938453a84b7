#pragma once
// K-Means kernels: the assignment step, the update step (segment sums) and the
// k-means++ distance update, each on contiguous tensors of one device, with a CPU
// arm (kmeans_cpu.cpp) and a CUDA arm (kmeans_cuda.cu). nn/clustering/kmeans.cpp owns
// validation, initialisation, empty-cluster re-seeding and the iteration loop.
#include <algorithm>
#include <cstdint>

#include "core/tensor.h"
#include "core/error.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

// For each row i of x (N, d) the index of the nearest centroid of c (k, d), both
// contiguous and of one float dtype. The nearest minimises |c_j|^2 - 2 x_i.c_j (l2)
// or -x_i.c_j (cosine: rows of x and c already unit-norm); ties go to the lower j.
// The scores of block_rows rows at a time come from one GEMM into `workspace`
// (at least (block_rows + 1) * k elements of x's dtype; the last row holds the
// centroid term); nothing is allocated. Writes labels (N,) int64 and dist (N,)
// float64: |x_i - c_j|^2 (l2) or 1 - x_i.c_j clamped at 0 (cosine), computed
// directly rather than from the expansion.
void kmeans_assign_cpu(const Tensor& x, const Tensor& c, bool cosine, int64_t block_rows,
                       const Tensor& workspace, const Tensor& labels, const Tensor& dist);

// Segment sums: counts[j] = #{i : labels[i] == j} (int64 (k,)) and sums[j] = the sum
// of those rows of x (float64 (k, d)), added in increasing i whatever the thread
// count, so the result is bitwise reproducible. `order` (N,) int64 is scratch: the
// point indices sorted stably by label (a counting sort).
void kmeans_update_cpu(const Tensor& x, const Tensor& labels, const Tensor& order,
                       const Tensor& counts, const Tensor& sums);

// k-means++ step: dist[i] = min(dist[i], |x_i - x_c|^2) (cosine rows: the same,
// which is 2 - 2 cos) for the new centre row `center` of x; dist (N,) float64.
void kmeans_pp_update_cpu(const Tensor& x, int64_t center, const Tensor& dist);

// Greedy k-means++ trial: potential[l] = sum_i min(dist[i], |x_i - x_{cand[l]}|^2)
// for each candidate row cand (L,) int64, into potential (L,) float64. The distances
// come from one GEMM per chunk of kPotentialChunk rows through the expansion
// xnorm[i] + |x_c|^2 - 2 x_i.x_c (clamped at 0), xnorm (N,) float64 holding |x_i|^2
// (kmeans_row_sqnorms). They only rank the candidates; the chosen one's distances
// are then computed exactly by kmeans_pp_update. Chunks are summed in order, so the
// result does not depend on the thread count. workspace: at least
// L * d + kPotentialChunk * L elements of x's dtype.
constexpr int64_t kPotentialChunk = 2048;
void kmeans_pp_potentials_cpu(const Tensor& x, const Tensor& xnorm, const Tensor& dist,
                              const Tensor& cand, const Tensor& workspace, const Tensor& potential);
// out[i] = |x_i|^2 in double, out (N,) float64.
void kmeans_row_sqnorms_cpu(const Tensor& x, const Tensor& out);

// Elkan's assignment step (Elkan 2003, "Using the triangle inequality to accelerate
// k-means"): the same nearest centroid as kmeans_assign_cpu, skipping the distances
// the bounds prove useless. Euclidean distances on the rows as given (cosine: unit
// rows, whose Euclidean nearest is the cosine nearest). State between calls:
// lower (N, k) float64 lower bounds of |x_i - c_j|, upper (N,) float64 an upper bound
// of |x_i - c_labels[i]|, labels (N,) int64. first = true computes every distance and
// fills the state; otherwise c_prev (k, d) holds the centroids of the previous call,
// whose moves loosen the bounds first. `scratch` holds at least k * k + 2 * k
// doubles. Writes dist (N,) float64 exactly as kmeans_assign_cpu does.
void kmeans_elkan_assign_cpu(const Tensor& x, const Tensor& c, const Tensor& c_prev, bool first,
                             bool cosine, const Tensor& lower, const Tensor& upper,
                             const Tensor& scratch, const Tensor& labels, const Tensor& dist);

#ifdef CF_WITH_CUDA
void kmeans_assign_cuda(const Tensor& x, const Tensor& c, bool cosine, int64_t block_rows,
                        const Tensor& workspace, const Tensor& labels, const Tensor& dist);
void kmeans_update_cuda(const Tensor& x, const Tensor& labels, const Tensor& order,
                        const Tensor& counts, const Tensor& sums);
void kmeans_pp_update_cuda(const Tensor& x, int64_t center, const Tensor& dist);
// The CUDA arm ranks the candidates by direct distances (xnorm and workspace unused).
void kmeans_pp_potentials_cuda(const Tensor& x, const Tensor& xnorm, const Tensor& dist,
                               const Tensor& cand, const Tensor& workspace, const Tensor& potential);
void kmeans_row_sqnorms_cuda(const Tensor& x, const Tensor& out);
#endif

// Device dispatch: every tensor argument on x's device (nn/clustering/kmeans.cpp
// allocates them there).
inline void kmeans_assign(const Tensor& x, const Tensor& c, bool cosine, int64_t block_rows,
                          const Tensor& workspace, const Tensor& labels, const Tensor& dist) {
  CF_DEVICE_DISPATCH("kmeans_assign", x.device(),
                     kmeans_assign_cpu(x, c, cosine, block_rows, workspace, labels, dist),
                     kmeans_assign_cuda(x, c, cosine, block_rows, workspace, labels, dist));
}
inline void kmeans_update(const Tensor& x, const Tensor& labels, const Tensor& order,
                          const Tensor& counts, const Tensor& sums) {
  CF_DEVICE_DISPATCH("kmeans_update", x.device(), kmeans_update_cpu(x, labels, order, counts, sums),
                     kmeans_update_cuda(x, labels, order, counts, sums));
}
inline void kmeans_pp_update(const Tensor& x, int64_t center, const Tensor& dist) {
  CF_DEVICE_DISPATCH("kmeans_pp_update", x.device(), kmeans_pp_update_cpu(x, center, dist),
                     kmeans_pp_update_cuda(x, center, dist));
}
inline void kmeans_pp_potentials(const Tensor& x, const Tensor& xnorm, const Tensor& dist,
                                 const Tensor& cand, const Tensor& workspace, const Tensor& potential) {
  CF_DEVICE_DISPATCH("kmeans_pp_potentials", x.device(),
                     kmeans_pp_potentials_cpu(x, xnorm, dist, cand, workspace, potential),
                     kmeans_pp_potentials_cuda(x, xnorm, dist, cand, workspace, potential));
}
inline void kmeans_row_sqnorms(const Tensor& x, const Tensor& out) {
  CF_DEVICE_DISPATCH("kmeans_row_sqnorms", x.device(), kmeans_row_sqnorms_cpu(x, out),
                     kmeans_row_sqnorms_cuda(x, out));
}
// Routing attention's centroid EMA (Roy et al. 2021, section 4.1), its two steps each one kernel call
// (as tensor ops they were about 26 a layer and step; issue 25). Side s (0: queries xq, aq, mq; 1: keys
// xk, ak, mk): x (B, R, N, D) contiguous, a int64 (B, R, N) in [0, C) (clamped, as the caller built
// them), m bool (B, N) (true = padding) or undefined.
// stats (2, R, C, D + 1) contiguous, x's dtype: [s, r, c] = the sum of the rows x_s[b, r, n] assigned to c
// over the tokens that are not padding, then their count. Summed in double: the B N tokens in chunks of
// centroid_ema_chunk(...) in token order (b, then n), each chunk's sum in order, then the chunks' sums in
// order, on both devices (the same bits; on CUDA the chunks run in parallel).
inline int64_t centroid_ema_chunk(int64_t tokens, int64_t R, int64_t slots) {
  // At least 128 tokens a chunk, and at most 4M double partials (32 MB) over all chunks of the 2 R lists.
  const int64_t max_chunks = std::max<int64_t>(1, (int64_t(1) << 22) / std::max<int64_t>(1, 2 * R * slots));
  return std::max<int64_t>(128, (tokens + max_chunks - 1) / max_chunks);
}
void centroid_ema_stats_cpu(const Tensor& xq, const Tensor& aq, const Tensor& mq, const Tensor& xk, const Tensor& ak,
                            const Tensor& mk, const Tensor& stats);
// mu (R, C, D) contiguous, in place: mu <- decay mu + (1 - decay) / 2 (mean_q + mean_k), each side's mean
// its sum over its count, mu itself where the count is 0; in double, rounded once.
void centroid_ema_update_cpu(const Tensor& mu, const Tensor& stats, double decay);
#ifdef CF_WITH_CUDA
void centroid_ema_stats_cuda(const Tensor& xq, const Tensor& aq, const Tensor& mq, const Tensor& xk,
                             const Tensor& ak, const Tensor& mk, const Tensor& stats);
void centroid_ema_update_cuda(const Tensor& mu, const Tensor& stats, double decay);
#endif
inline void centroid_ema_stats(const Tensor& xq, const Tensor& aq, const Tensor& mq, const Tensor& xk,
                               const Tensor& ak, const Tensor& mk, const Tensor& stats) {
  CF_DEVICE_DISPATCH("centroid_ema", stats.device(), centroid_ema_stats_cpu(xq, aq, mq, xk, ak, mk, stats),
                     centroid_ema_stats_cuda(xq, aq, mq, xk, ak, mk, stats));
}
inline void centroid_ema_update(const Tensor& mu, const Tensor& stats, double decay) {
  CF_DEVICE_DISPATCH("centroid_ema", mu.device(), centroid_ema_update_cpu(mu, stats, decay),
                     centroid_ema_update_cuda(mu, stats, decay));
}

// Clustered attention's centroids (Vyas et al. 2020, eq. 3; autograd/ops/clustering.h cluster_means):
// x (G, N, D) (any 3+-d layout with those sizes folded: (B, H, N, D) gives G = B H) contiguous, assign
// int64 (G, N) in [-1, C) (-1: no cluster; others clamped into [0, C), as the caller checked them).
// Forward: out (G, C, D) = scale / max(n_c, 1) times the sum of the rows of x assigned to c, counts (G, C)
// int64 n_c; the sum in double in increasing i on both devices, then one multiply: the same bits.
// Backward: dx (G, N, D) = dout[g, a_i] * (scale / max(n_a, 1)) rounded to x's dtype, 0 for a_i = -1.
void cluster_means_forward_cpu(const Tensor& x, const Tensor& assign, double scale, const Tensor& out,
                               const Tensor& counts);
void cluster_means_backward_cpu(const Tensor& dout, const Tensor& assign, const Tensor& counts, double scale,
                                const Tensor& dx);
#ifdef CF_WITH_CUDA
void cluster_means_forward_cuda(const Tensor& x, const Tensor& assign, double scale, const Tensor& out,
                                const Tensor& counts);
void cluster_means_backward_cuda(const Tensor& dout, const Tensor& assign, const Tensor& counts, double scale,
                                 const Tensor& dx);
#endif
inline void cluster_means_forward(const Tensor& x, const Tensor& assign, double scale, const Tensor& out,
                                  const Tensor& counts) {
  CF_DEVICE_DISPATCH("cluster_means", x.device(), cluster_means_forward_cpu(x, assign, scale, out, counts),
                     cluster_means_forward_cuda(x, assign, scale, out, counts));
}
inline void cluster_means_backward(const Tensor& dout, const Tensor& assign, const Tensor& counts, double scale,
                                   const Tensor& dx) {
  CF_DEVICE_DISPATCH("cluster_means", dx.device(), cluster_means_backward_cpu(dout, assign, counts, scale, dx),
                     cluster_means_backward_cuda(dout, assign, counts, scale, dx));
}

// Elkan's bounds are a CPU speed-up with no CUDA arm: on CUDA the loop in
// nn/clustering/kmeans.cpp runs the GEMM assignment, which gives the same clustering.
inline void kmeans_elkan_assign(const Tensor& x, const Tensor& c, const Tensor& c_prev, bool first,
                                bool cosine, const Tensor& lower, const Tensor& upper,
                                const Tensor& scratch, const Tensor& labels, const Tensor& dist) {
  CF_CHECK(x.device().is_cpu(), NotImplementedError,
           "[kmeans_elkan_assign] runs on the CPU only; x is ", x.describe());
  kmeans_elkan_assign_cpu(x, c, c_prev, first, cosine, lower, upper, scratch, labels, dist);
}

}  // namespace cf::kernels
