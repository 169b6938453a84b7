// The centroid initialisations I(x) of Centroid Transformers (sections 3.1-3.4):
// sampling (random, farthest point), window means, K-Means means, linear maps
// and strided convolutions, with the padding each leaves.
#include "nn/attention/centroid.h"
#include "nn/attention/centroid_internal.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/nn_functional.h"
#include "autograd/ops/point.h"
#include "autograd/ops/random.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/sort.h"
#include "core/error.h"
#include "nn/cost.h"
#include "nn/init.h"

namespace cf {
namespace nn {

using namespace centroid_detail;

namespace {

// mask (B, N) bool at idx (B, M) -> bool (B, M), or undefined without a mask. Kept when all false:
// deciding otherwise would read it back from the device (issue 25).
Tensor gather_mask(const Tensor& mask, const Tensor& idx) {
  if (!mask.defined()) return Tensor();
  return gt(gather(cf::to(mask, kFloat32), 1, idx), 0.5);
}

// Mean of x (B, N, D) per segment seg (B, N) int64 in [0, M), weighted by keep
// (B, N) (undefined: all ones). Empty segments give `fallback` rows (or zero).
// Differentiable in x (and fallback); returns also the counts (B, M).
Tensor segment_mean(const Tensor& x, const Tensor& seg, int64_t m, const Tensor& keep, const Tensor& fallback,
                    Tensor* counts_out) {
  const int64_t b = x.shape()[0], n = x.shape()[1], d = x.shape()[2];
  Tensor flat_seg = flat_rows(seg, m, "CentroidInit");  // segment ids offset per batch row into (B*M)
  Tensor src = reshape(x, {b * n, d});
  Tensor w = keep.defined() ? reshape(keep, {b * n}) : Tensor::ones({b * n}, x.dtype(), x.device());
  if (keep.defined()) src = src * unsqueeze(w, 1);
  Tensor sums = index_add(Tensor::zeros({b * m, d}, x.dtype(), x.device()), 0, flat_seg, src);
  Tensor counts = index_add(Tensor::zeros({b * m}, x.dtype(), x.device()), 0, flat_seg, w);
  Tensor empty = eq(counts, 0.0);
  Tensor mean_rows = sums / unsqueeze(clamp(counts, 1.0, INFINITY), 1);
  // Always the select (identity where no segment is empty): testing for an empty one first
  // would read a value back to the host on every forward.
  if (fallback.defined()) mean_rows = where(unsqueeze(empty, 1), reshape(fallback, {b * m, d}), mean_rows);
  if (counts_out) *counts_out = reshape(counts, {b, m});
  return reshape(mean_rows, {b, m, d});
}

}  // namespace

// ---------------------------------------------------------------- CentroidInit

CentroidInit::CentroidInit(const CentroidAttentionOptions& o, Generator& gen) : o_(o) {
  o.validate("CentroidInit");
  // Learnable initialisations: a linear projection over the sequence (section 3.3,
  // "We use a linear projection to learn the initialization of the latent
  // capsules") and a depthwise strided convolution of the tokens (section 3.4).
  if (o.init == "linear") seq_proj = register_module("seq_proj", std::make_shared<Linear>(o.seq_len, o.num_centroids, o.bias, gen));
  if (o.init == "conv")
    conv1d = register_module("conv", std::make_shared<DepthwiseConv1d>(o.d_model, o.conv_kernel, o.conv_stride,
                                                                       o.conv_padding, o.bias, gen));
  if (o.init == "conv2d")
    conv2d = register_module("conv", std::make_shared<DepthwiseConv2d>(o.d_model, o.conv_kernel, o.conv_stride,
                                                                       o.conv_padding, o.bias, gen));
}

int64_t CentroidInit::num_centroids(int64_t n) const {
  if (o_.init == "linear") return o_.num_centroids;
  if (o_.init == "conv") return conv1d->output_length(n);
  if (o_.init == "conv2d") {
    int64_t side = int64_t(std::llround(std::sqrt(double(n))));
    int64_t so = conv2d->output_side(side);
    return so * so;
  }
  if (o_.num_centroids > 0) return o_.num_centroids;
  return std::max<int64_t>(1, int64_t(std::ceil(double(n) / o_.downsample - 1e-9)));
}

CentroidInitResult CentroidInit::forward(const Tensor& x, const Tensor& mask, const Tensor& space,
                                         Generator* sampler) {
  CF_CHECK(x.defined() && x.dim() == 3 && x.shape()[2] == o_.d_model && is_floating(x.dtype()), ShapeError,
           "[CentroidInit] expected float input (B, N, ", o_.d_model, "), got ", describe(x));
  const int64_t b = x.shape()[0], n = x.shape()[1];
  check_mask("CentroidInit", "key_padding_mask", mask, b, n);
  if (space.defined())
    CF_CHECK(space.dim() == 3 && space.shape()[0] == b && space.shape()[1] == n && is_floating(space.dtype()),
             ShapeError, "[CentroidInit] sample_space must be float (B, N, C) = (", b, ", ", n, ", C), got ",
             space.describe());
  const std::string& mode = o_.init;
  const bool learned = mode == "linear" || mode == "conv" || mode == "conv2d";
  // A text model passes its padding mask even when nothing is padding (models::padding_mask); only these
  // inits, which cannot leave padding out, look at its values: a data check, deferred on CUDA (no host read).
  if ((learned || mode == "kmeans") && mask.defined())
    check_indices("CentroidInit", cf::to(mask, kInt64), 1, [mode](int64_t, int64_t) {
      throw ValueError(str("[CentroidInit] init \"", mode,
                           "\" does not support padded inputs (use random, mean or fps with a key_padding_mask that "
                           "masks any)"));
    });
  CentroidInitResult r;
  if (mode == "linear") {
    CF_CHECK(n == o_.seq_len, ShapeError, "[CentroidInit] init \"linear\" projects a sequence of length seq_len = ",
             o_.seq_len, ", got N = ", n);
    r.u = transpose(seq_proj->forward(transpose(x, 1, 2)), 1, 2);
    return r;
  }
  if (mode == "conv") {
    r.u = conv1d->forward(x);
    return r;
  }
  if (mode == "conv2d") {
    r.u = conv2d->forward(x);
    return r;
  }
  const int64_t m = num_centroids(n);
  CF_CHECK(m >= 1 && m <= n, ShapeError, "[CentroidInit] M = ", m, " centroids for N = ", n,
           " inputs; centroid attention needs 1 <= M <= N");
  if (mode == "random") {
    // Section 3.1: "randomly sample N/3 elements from the original sequence"; kept in
    // sequence order, so a text's centroids stay in reading order.
    // The keys come from the same Philox stream on every device (autograd/ops/random.h).
    Tensor keys = rand({b, n}, kFloat32, sampler ? *sampler : default_generator(), 0.0, 1.0, x.device());
    if (mask.defined()) keys = masked_fill(keys, mask, 2.0);  // padding only when real inputs run out
    r.indices = sort(topk(keys, m, -1, false).indices, -1).values;
  } else if (mode == "fps" || mode == "kmeans") {
    // Section 3.2: "We use Farthest Point Sampling (FPS) as our initialization function".
    const Tensor& points = space.defined() ? space : x;
    report_macs(b * m * n * points.shape()[2]);  // the O(N M C) distance updates (nn/cost.h)
    r.indices = farthest_point_sampling(points, m, mode == "kmeans" ? Tensor() : mask);
  }
  if (mode == "random" || mode == "fps") {
    r.u = gather_rows(x, r.indices);
    r.mask = gather_mask(mask, r.indices);
    if (space.defined()) r.positions = gather_rows(space.detach(), r.indices);
    return r;
  }
  if (mode == "mean") {
    // Section 3.1: "mean pooling refers to apply mean pooling on every three
    // elements"; for N not a multiple of M, window j covers [floor(jN/M), floor((j+1)N/M)).
    // Padding is left out of each mean; a window of padding only is a padded centroid.
    if (!mask.defined() && n % m == 0) {
      r.u = mean(reshape(x, {b, m, n / m, o_.d_model}), {2});
      return r;
    }
    // The windows depend on (N, M) alone: built once per size and device, no copy per forward.
    const Tensor window_of = windows_.get({n, m}, x.device(), [&] {
      std::vector<int64_t> seg(static_cast<size_t>(n));
      for (int64_t j = 0; j < m; ++j)
        for (int64_t i = j * n / m; i < (j + 1) * n / m; ++i) seg[size_t(i)] = j;
      return std::vector<Tensor>{Tensor::from_vector(seg, {1, n})};
    })[0];
    Tensor keep = mask.defined() ? cf::to(logical_not(mask), x.dtype()) : Tensor();
    Tensor counts;
    r.u = segment_mean(x, expand(window_of, {b, n}), m, keep, Tensor(), &counts);
    if (mask.defined()) r.mask = eq(counts, 0.0);  // a window of padding only
    return r;
  }
  // K-Means (Table 3's baseline, "K-means for 3 iterations"): FPS seeds, then Lloyd
  // steps: assign each input to its nearest centroid (in sample space), move each
  // centroid to the mean of its inputs (an empty cluster keeps its centroid). The
  // centroids are means of x under fixed assignments, so gradients reach x.
  // Not nn/clustering/kmeans.h: that engine re-seeds empty clusters and stops on a
  // tolerance, while this baseline is a fixed number of steps, and its means of x
  // must stay differentiable.
  Tensor pts = space.defined() ? space.detach() : x.detach();
  Tensor c = gather_rows(pts, r.indices);
  r.u = gather_rows(x, r.indices);
  for (int64_t it = 0; it < o_.kmeans_iters; ++it) {
    Tensor assign = reshape(knn_indices(pts, c, 1), {b, n});
    r.u = segment_mean(x, assign, m, Tensor(), r.u, nullptr);
    NoGradGuard ng;
    c = segment_mean(pts, assign, m, Tensor(), c, nullptr);
  }
  r.indices = Tensor();
  if (space.defined()) r.positions = c;
  return r;
}

}  // namespace nn
}  // namespace cf
