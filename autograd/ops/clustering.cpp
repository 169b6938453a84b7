#include "autograd/ops/clustering.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/random.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/common.h"
#include "autograd/op_names.h"
#include "core/error.h"
#include "kernels/cluster_loss/cluster_loss.h"
#include "kernels/kmeans/hamming.h"
#include "kernels/kmeans/kmeans.h"

namespace cf {

Tensor random_hyperplanes(int64_t bits, int64_t dim, DType dtype, Generator& gen, Device device) {
  CF_CHECK(bits >= 1 && bits <= 63, ValueError, "[random_hyperplanes] bits must be in [1, 63], got ", bits);
  CF_CHECK(dim >= 1, ValueError, "[random_hyperplanes] dim must be >= 1, got ", dim);
  return randn({bits, dim}, dtype, gen, 0.0, 1.0, device);
}

Tensor hash_codes(const Tensor& x, const Tensor& planes) {
  CF_CHECK(x.defined() && planes.defined(), ValueError, "[hash_codes] x and planes must be defined");
  CF_CHECK(x.device() == planes.device(), DeviceError, "[hash_codes] x and planes must be on one device, got x on ",
           x.device(), ", planes on ", planes.device());
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
  Tensor out = Tensor::empty(out_shape, kInt64, x.device());
  kernels::hash_pack_signs(proj, out);
  return out;
}

Tensor hamming_kmeans(const Tensor& codes, int64_t clusters, int64_t iterations, int64_t bits,
                      const Tensor& exclude) {
  CF_CHECK(codes.defined(), ValueError, "[hamming_kmeans] codes must be defined");
  CF_CHECK(codes.dtype() == kInt64 && codes.dim() == 2, DTypeError,
           "[hamming_kmeans] codes must be int64 (G, N), got ", codes.describe());
  CF_CHECK(clusters >= 1, ValueError, "[hamming_kmeans] clusters must be >= 1, got ", clusters);
  CF_CHECK(iterations >= 0, ValueError, "[hamming_kmeans] iterations must be >= 0, got ", iterations);
  CF_CHECK(bits >= 1 && bits <= 63, ValueError, "[hamming_kmeans] bits must be in [1, 63], got ", bits);
  if (exclude.defined()) {
    CF_CHECK(exclude.dtype() == kBool && exclude.shape() == codes.shape(), ShapeError,
             "[hamming_kmeans] exclude must be bool of the codes' shape ", shape_str(codes.shape()), ", got ",
             exclude.describe());
    CF_CHECK(exclude.device() == codes.device(), DeviceError, "[hamming_kmeans] exclude is on ", exclude.device(),
             " but the codes are on ", codes.device());
  }
  Tensor c = contiguous(codes);
  Tensor e = exclude.defined() ? contiguous(exclude) : Tensor();
  const int64_t g = c.shape()[0], n = c.shape()[1];
  // Every code in [0, 2^bits): a data check, deferred on CUDA (the kernel reads only
  // the low `bits` bits meanwhile). With 63 bits every non-negative int64 fits: the
  // limit 2^63 - 1 leaves out only itself, which `allowed` lets through.
  const int64_t limit = bits == 63 ? std::numeric_limits<int64_t>::max() : int64_t(1) << bits;
  check_indices(
      "hamming_kmeans", c, limit,
      [bits](int64_t at, int64_t code) {
        throw ValueError(str("[hamming_kmeans] code ", code, " at position ", at, " has bits beyond the ", bits,
                             " given"));
      },
      bits == 63 ? std::optional<int64_t>(limit) : std::nullopt);
  Tensor out = Tensor::empty({g, n}, kInt64, c.device());
  kernels::hamming_kmeans(c, e, clusters, iterations, bits, out);
  return out;
}

namespace {

std::string describe_arg(const Tensor& t) { return t.defined() ? t.describe() : std::string("undefined"); }

using ops::dense_data;

kernels::ClusterLossParams loss_params(ClusterLossForm form) {
  kernels::ClusterLossParams p;
  p.unit_x = form == ClusterLossForm::kCosine;
  p.unit_c = form != ClusterLossForm::kInner;
  return p;
}

}  // namespace

Tensor clustering_loss(const Tensor& x, const Tensor& c_hat, const Tensor& index, const Tensor& key_padding_mask,
                       ClusterLossForm form) {
  const char* who = opname::clustering_loss;
  const bool index_ok = index.defined() && index.dtype() == kInt64 && x.defined() && x.dim() == 3 &&
                        index.shape() == Shape({x.shape()[0], x.shape()[1]});
  CF_CHECK(x.defined() && x.dim() == 3 && c_hat.defined() && c_hat.dim() == 3 && c_hat.shape()[0] == x.shape()[0] &&
               c_hat.shape()[2] == x.shape()[2] && index_ok,
           ShapeError, "[", who, "] expected x (B, N, D), c_hat (B, k, D) and int64 index (B, N); got x ",
           describe_arg(x), ", c_hat ", describe_arg(c_hat), ", index ", describe_arg(index));
  // Autocast: the loss in float32 (a 16-bit C^ from an autocast product beside a float32 x), as every loss.
  if (autocast_dtype() && is_floating(x.dtype()) && is_floating(c_hat.dtype()) &&
      (is_low_precision(x.dtype()) || is_low_precision(c_hat.dtype())))
    return clustering_loss(autocast::to_float32(x), autocast::to_float32(c_hat), index, key_padding_mask, form);
  CF_CHECK(is_floating(x.dtype()) && c_hat.dtype() == x.dtype(), DTypeError, "[", who,
           "] x and c_hat must share one float dtype, got ", x.dtype(), " and ", c_hat.dtype());
  const int64_t B = x.shape()[0], N = x.shape()[1], k = c_hat.shape()[1];
  CF_CHECK(k >= 1, ShapeError, "[", who, "] c_hat must hold k >= 1 centroids, got ", c_hat.describe());
  CF_CHECK(!key_padding_mask.defined() || (key_padding_mask.dtype() == kBool && key_padding_mask.dim() == 2 &&
                                           key_padding_mask.shape()[0] == B && key_padding_mask.shape()[1] == N),
           ShapeError, "[", who, "] key_padding_mask must be bool (B, N) = (", B, ", ", N, "), got ",
           describe_arg(key_padding_mask));
  ops::check_same_device(who, {&x, &c_hat, &index, &key_padding_mask});
  if (is_low_precision(x.dtype()))  // the sums in float32, the loss in the inputs' dtype
    return to(clustering_loss(to(x, kFloat32), to(c_hat, kFloat32), index, key_padding_mask, form), x.dtype());
  // Padded tokens carry index k (no centroid): point them at centroid 0 (the kernels skip them).
  Tensor idx = dense_data(key_padding_mask.defined() ? masked_fill(index, key_padding_mask, 0.0) : index);
  // The other tokens' ids in [0, k) (a data check, deferred on CUDA: no host read).
  check_indices(who, idx, k, [k](int64_t at, int64_t id) {
    throw IndexError(str("[clustering_loss] cluster index ", id, " at flat position ", at, " is out of range [0, ",
                         k, ") for k = ", k, " centroids (k itself marks padding, where key_padding_mask is set)"));
  });
  const kernels::ClusterLossParams p = loss_params(form);
  const Tensor xd = dense_data(x), cd = dense_data(c_hat), md = dense_data(key_padding_mask);
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
  const Tensor counts = Tensor::empty({B}, kFloat64, x.device());  // n_b, for the backward
  kernels::clustering_loss_forward(xd, cd, idx, md, p, out, counts);
  if (autograd::any_requires_grad({&x, &c_hat})) {
    autograd::SavedTensor sx(xd), sc(cd), si(idx), sm(md), sn(counts);
    const bool need_x = x.requires_grad(), need_c = c_hat.requires_grad();
    autograd::record(who, {x, c_hat}, out, [sx, sc, si, sm, sn, p, need_x, need_c](const Tensor& g) {
      const char* op = opname::clustering_loss;
      const Tensor xv = sx.unpack(op), cv = sc.unpack(op);
      Tensor dx = need_x ? Tensor::empty(xv.shape(), xv.dtype(), xv.device()) : Tensor();
      Tensor dc = Tensor::empty(cv.shape(), cv.dtype(), cv.device());
      kernels::clustering_loss_backward(xv, cv, si.unpack(op), sm.defined() ? sm.unpack(op) : Tensor(),
                                        sn.unpack(op), p, dense_data(g), dx, dc);
      return std::vector<Tensor>{dx, need_c ? dc : Tensor()};
    });
  }
  return out;
}

Tensor centroid_sorting_loss(const Tensor& c_hat, ClusterLossForm form) {
  const char* who = opname::centroid_sorting_loss;
  CF_CHECK(c_hat.defined() && c_hat.dim() == 3 && c_hat.shape()[1] >= 1 && is_floating(c_hat.dtype()), ShapeError,
           "[", who, "] c_hat must be float (B, k, D) with k >= 1, got ", describe_arg(c_hat));
  if (autocast_dtype() && is_low_precision(c_hat.dtype()))  // autocast: the loss in float32
    return centroid_sorting_loss(autocast::to_float32(c_hat), form);
  if (is_low_precision(c_hat.dtype()))
    return to(centroid_sorting_loss(to(c_hat, kFloat32), form), c_hat.dtype());
  const bool unit = form != ClusterLossForm::kInner;
  const Tensor cd = dense_data(c_hat);
  Tensor out = Tensor::empty({}, c_hat.dtype(), c_hat.device());
  kernels::centroid_sorting_loss_forward(cd, unit, out);
  if (autograd::any_requires_grad({&c_hat})) {
    autograd::SavedTensor sc(cd);
    autograd::record(who, {c_hat}, out, [sc, unit](const Tensor& g) {
      const Tensor cv = sc.unpack(opname::centroid_sorting_loss);
      Tensor dc = Tensor::empty(cv.shape(), cv.dtype(), cv.device());
      kernels::centroid_sorting_loss_backward(cv, unit, dense_data(g), dc);
      return std::vector<Tensor>{dc};
    });
  }
  return out;
}

Tensor cluster_means(const Tensor& x, const Tensor& assignment, int64_t clusters, double scale) {
  const char* who = opname::cluster_means;
  const bool shapes_ok = x.defined() && x.dim() >= 2 && assignment.defined() &&
                         assignment.shape() == Shape(x.shape().begin(), x.shape().end() - 1);
  CF_CHECK(shapes_ok, ShapeError, "[", who, "] expected x (..., N, D) of rank >= 2 and assignment (..., N) of its "
           "shape without the last axis; got x ", describe_arg(x), ", assignment ", describe_arg(assignment));
  if (autocast_dtype() && is_low_precision(x.dtype()))  // no 16-bit kernel: float32 under autocast
    return cluster_means(autocast::to_float32(x), assignment, clusters, scale);
  CF_CHECK(x.dtype() == kFloat32 || x.dtype() == kFloat64, DTypeError, "[", who,
           "] x must be float32 or float64, got ", x.dtype());
  CF_CHECK(assignment.dtype() == kInt64, DTypeError, "[", who, "] assignment must be int64, got ", assignment.dtype());
  CF_CHECK(clusters >= 1, ValueError, "[", who, "] clusters must be >= 1, got ", clusters);
  CF_CHECK(std::isfinite(scale), ValueError, "[", who, "] scale must be finite, got ", scale);
  ops::check_same_device(who, {&x, &assignment});
  const Tensor a = dense_data(assignment);
  check_indices(
      who, a, clusters,
      [clusters](int64_t at, int64_t id) {
        throw IndexError(str("[cluster_means] cluster id ", id, " at flat position ", at, " is out of range [-1, ",
                             clusters, ")"));
      },
      -1);
  const Tensor xd = dense_data(x);
  Shape out_shape(x.shape().begin(), x.shape().end() - 2), count_shape;
  count_shape = out_shape;
  out_shape.insert(out_shape.end(), {clusters, x.shape().back()});
  count_shape.push_back(clusters);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  Tensor counts = Tensor::empty(count_shape, kInt64, x.device());
  kernels::cluster_means_forward(xd, a, scale, out, counts);
  if (autograd::any_requires_grad({&x})) {
    autograd::SavedTensor sa(a), sc(counts);
    const Shape xs = x.shape();
    autograd::record(who, {x}, out, [sa, sc, xs, scale](const Tensor& g) {
      const char* op = opname::cluster_means;
      Tensor dx = Tensor::empty(xs, g.dtype(), g.device());
      kernels::cluster_means_backward(dense_data(g), sa.unpack(op), sc.unpack(op), scale, dx);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

Tensor commitment_loss(const Tensor& x, const Tensor& centroids, const Tensor& assign, const Tensor& key_padding_mask,
                       double scale) {
  const char* who = opname::commitment_loss;
  CF_CHECK(x.defined() && x.dim() == 4 && centroids.defined() && centroids.dim() == 3 &&
               centroids.shape()[0] == x.shape()[1] && centroids.shape()[2] == x.shape()[3] &&
               centroids.shape()[1] >= 1 && assign.defined() && assign.dtype() == kInt64 &&
               assign.shape() == Shape({x.shape()[0], x.shape()[1], x.shape()[2]}),
           ShapeError, "[", who, "] expected x (B, H, N, D), centroids (H, C, D) with C >= 1 and int64 assign "
           "(B, H, N); got x ", describe_arg(x), ", centroids ", describe_arg(centroids), ", assign ",
           describe_arg(assign));
  if (autocast_dtype() && (is_low_precision(x.dtype()) || is_low_precision(centroids.dtype())))  // a loss: float32
    return commitment_loss(autocast::to_float32(x), autocast::to_float32(centroids), assign, key_padding_mask, scale);
  CF_CHECK((x.dtype() == kFloat32 || x.dtype() == kFloat64) && centroids.dtype() == x.dtype(), DTypeError, "[", who,
           "] x and centroids must share one dtype, float32 or float64; got ", x.dtype(), " and ", centroids.dtype());
  CF_CHECK(!(grad_enabled() && centroids.requires_grad()), AutogradError, "[", who,
           "] the centroids are sg(mu), a constant of the loss, and get no gradient: pass centroids.detach()");
  CF_CHECK(std::isfinite(scale), ValueError, "[", who, "] scale must be finite, got ", scale);
  const int64_t B = x.shape()[0], N = x.shape()[2], C = centroids.shape()[1];
  CF_CHECK(!key_padding_mask.defined() || (key_padding_mask.dtype() == kBool && key_padding_mask.dim() == 2 &&
                                           key_padding_mask.shape()[0] == B && key_padding_mask.shape()[1] == N),
           ShapeError, "[", who, "] key_padding_mask must be bool (B, N) = (", B, ", ", N, "), got ",
           describe_arg(key_padding_mask));
  ops::check_same_device(who, {&x, &centroids, &assign, &key_padding_mask});
  // Padded tokens may hold any id (routing's come from argmax over padding too): point them at 0.
  const Tensor a = dense_data(key_padding_mask.defined() ? masked_fill(assign, reshape(key_padding_mask, {B, 1, N}), 0.0)
                                                         : assign);
  check_indices(who, a, C, [C](int64_t at, int64_t id) {
    throw IndexError(str("[commitment_loss] centroid index ", id, " at flat position ", at, " is out of range [0, ",
                         C, ")"));
  });
  const Tensor xd = dense_data(x), md = dense_data(centroids), pd = dense_data(key_padding_mask);
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
  kernels::commitment_forward(xd, md, a, pd, scale, out);
  if (autograd::any_requires_grad({&x})) {
    autograd::SavedTensor sx(xd), sm(md), sa(a), sp(pd);
    autograd::record(who, {x}, out, [sx, sm, sa, sp, scale](const Tensor& g) {
      const char* op = opname::commitment_loss;
      const Tensor xv = sx.unpack(op);
      Tensor dx = Tensor::empty(xv.shape(), xv.dtype(), xv.device());
      kernels::commitment_backward(xv, sm.unpack(op), sa.unpack(op), sp.defined() ? sp.unpack(op) : Tensor(), scale,
                                   dense_data(g), dx);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

}  // namespace cf

namespace cf::ops {

namespace {

// Every tensor of a K-Means step defined, contiguous and on x's device: the
// kernels index raw pointers of one device.
void check_step(const char* op, const Tensor& x, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    CF_CHECK(t->defined() && t->is_contiguous(), ValueError, "[", op, "] every buffer must be a defined contiguous "
             "tensor, got ", t->defined() ? t->describe() : std::string("undefined"));
    CF_CHECK(t->device() == x.device(), DeviceError, "[", op, "] a buffer on ", t->device(), " beside x on ",
             x.device());
  }
}

}  // namespace

int64_t kmeans_potential_chunk() { return kernels::kPotentialChunk; }

void kmeans_assign_into(const Tensor& x, const Tensor& c, bool cosine, int64_t block_rows, const Tensor& workspace,
                        const Tensor& labels, const Tensor& dist) {
  check_step("kmeans_assign", x, {&x, &c, &workspace, &labels, &dist});
  kernels::kmeans_assign(x, c, cosine, block_rows, workspace, labels, dist);
}

void kmeans_elkan_assign_into(const Tensor& x, const Tensor& c, const Tensor& c_prev, bool first, bool cosine,
                              const Tensor& lower, const Tensor& upper, const Tensor& scratch,
                              const Tensor& labels, const Tensor& dist) {
  check_step("kmeans_elkan_assign", x, {&x, &c, &c_prev, &lower, &upper, &scratch, &labels, &dist});
  kernels::kmeans_elkan_assign(x, c, c_prev, first, cosine, lower, upper, scratch, labels, dist);
}

void kmeans_update_into(const Tensor& x, const Tensor& labels, const Tensor& order, const Tensor& counts,
                        const Tensor& sums) {
  check_step("kmeans_update", x, {&x, &labels, &order, &counts, &sums});
  kernels::kmeans_update(x, labels, order, counts, sums);
}

void kmeans_pp_update_into(const Tensor& x, int64_t center, const Tensor& dist) {
  check_step("kmeans_pp_update", x, {&x, &dist});
  CF_CHECK(center >= 0 && center < x.size(0), IndexError, "[kmeans_pp_update] center ", center, " outside the ",
           x.size(0), " rows of x");
  kernels::kmeans_pp_update(x, center, dist);
}

void kmeans_pp_potentials_into(const Tensor& x, const Tensor& xnorm, const Tensor& dist, const Tensor& cand,
                               const Tensor& workspace, const Tensor& potential) {
  check_step("kmeans_pp_potentials", x, {&x, &xnorm, &dist, &cand, &workspace, &potential});
  kernels::kmeans_pp_potentials(x, xnorm, dist, cand, workspace, potential);
}

void kmeans_row_sqnorms_into(const Tensor& x, const Tensor& out) {
  check_step("kmeans_row_sqnorms", x, {&x, &out});
  kernels::kmeans_row_sqnorms(x, out);
}

void centroid_ema_stats_into(const Tensor& xq, const Tensor& aq, const Tensor& mq, const Tensor& xk, const Tensor& ak,
                             const Tensor& mk, const Tensor& stats) {
  const char* op = "centroid_ema_stats";
  check_step(op, xq, {&xq, &aq, &xk, &ak, &stats});
  CF_CHECK((xq.dtype() == kFloat32 || xq.dtype() == kFloat64), DTypeError, "[", op,
           "] runs on float32 or float64, got ", xq.describe());
  CF_CHECK(xq.dim() == 4 && xk.shape() == xq.shape() && xk.dtype() == xq.dtype() &&
               stats.dtype() == xq.dtype() && stats.dim() == 4 && stats.shape()[0] == 2 &&
               stats.shape()[1] == xq.shape()[1] && stats.shape()[2] >= 1 && stats.shape()[3] == xq.shape()[3] + 1,
           ShapeError, "[", op, "] expected xq, xk (B, R, N, D) of one float dtype and stats (2, R, C, D + 1) of it, got ",
           xq.describe(), ", ", xk.describe(), ", ", stats.describe());
  const Shape ids{xq.shape()[0], xq.shape()[1], xq.shape()[2]}, mask{xq.shape()[0], xq.shape()[2]};
  CF_CHECK(aq.dtype() == kInt64 && ak.dtype() == kInt64 && aq.shape() == ids && ak.shape() == ids, ShapeError, "[",
           op, "] ids must be int64 ", shape_str(ids), ", got ", aq.describe(), ", ", ak.describe());
  for (const Tensor* m : {&mq, &mk})
    CF_CHECK(!m->defined() || (m->dtype() == kBool && m->shape() == mask && m->device() == xq.device()), ShapeError,
             "[", op, "] padding masks must be bool ", shape_str(mask), " on x's device, got ", m->describe());
  // (masks of any layout: the layer's may be views)
  kernels::centroid_ema_stats(xq, aq, dense_data(mq), xk, ak, dense_data(mk), stats);
}

void centroid_ema_update_(const Tensor& mu, const Tensor& stats, double decay) {
  const char* op = "centroid_ema_update";
  check_step(op, mu, {&mu, &stats});
  CF_CHECK(mu.dtype() == kFloat32 || mu.dtype() == kFloat64, DTypeError, "[", op, "] runs on float32 or float64, got ",
           mu.describe());
  CF_CHECK(mu.dim() == 3 && stats.dtype() == mu.dtype() &&
               stats.shape() == Shape({2, mu.shape()[0], mu.shape()[1], mu.shape()[2] + 1}),
           ShapeError, "[", op, "] expected mu (R, C, D) and stats (2, R, C, D + 1) of its float dtype, got ",
           mu.describe(), ", ", stats.describe());
  CF_CHECK(decay >= 0 && decay < 1, ValueError, "[", op, "] decay must be in [0, 1), got ", decay);
  kernels::centroid_ema_update(mu, stats, decay);
  mu.bump_version();
}

}  // namespace cf::ops
