#include "nn/attention/cluster_former.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/sort.h"
#include "core/cuda_graph.h"
#include "core/error.h"
#include "nn/attention/chunked.h"
#include "nn/clustering/kmeans.h"

namespace cf {
namespace nn {

ClusterFormerAttention::ClusterFormerAttention(int64_t d_model, const ClusterFormerAttentionOptions& o,
                                               Generator& gen)
    : chunk_(o.chunk_size), scale_(o.scale), dropout_(o.dropout) {
  CF_CHECK(d_model > 0, ValueError, "[ClusterFormerAttention] d_model must be positive, got ", d_model);
  CF_CHECK(o.chunk_size > 0, ValueError, "[ClusterFormerAttention] chunk_size must be positive, got ",
           o.chunk_size);
  CF_CHECK(o.scale >= 0, ValueError, "[ClusterFormerAttention] scale must be >= 0 (0: 1/sqrt(d_k)), got ", o.scale);
  CF_CHECK(o.dropout >= 0 && o.dropout < 1, ValueError, "[ClusterFormerAttention] dropout must be in [0, 1), got ",
           o.dropout);
  MemoryBankOptions bo = o.bank;
  bo.dim = d_model;
  bank = register_module("bank", std::make_shared<MemoryBank>(bo, gen));
}

ClusterFormerAttentionOptions ClusterFormerAttention::read_options(const Config& c) {
  ClusterFormerAttentionOptions o;
  o.chunk_size = c.get<int64_t>("chunk_size", o.chunk_size);
  o.scale = c.get<double>("scale", o.scale);
  o.dropout = c.get<double>("dropout", o.dropout);
  o.bank.num_clusters = c.get<int64_t>("num_clusters", o.bank.num_clusters);
  o.bank.capacity = c.get<int64_t>("memory_size", o.bank.capacity);
  o.bank.update_every = c.get<int64_t>("update_every", o.bank.update_every);
  o.bank.kmeans_iters = c.get<int64_t>("kmeans_iters", o.bank.kmeans_iters);
  o.bank.seed = c.get<uint64_t>("seed", o.bank.seed);
  o.bank.save_memory = c.get<bool>("save_memory", o.bank.save_memory);
  c.finish();
  CF_CHECK(o.chunk_size > 0, ValueError, "[ClusterFormerAttention] ", c.path_of("chunk_size"), " must be positive, got ",
           o.chunk_size);
  return o;
}

std::shared_ptr<Attention> ClusterFormerAttention::create(const AttentionSpec& spec) {
  // The bank's initial centroids come from the layer's generator (spec.gen), so a
  // model's initial state depends only on the generator it is built with.
  return std::make_shared<ClusterFormerAttention>(spec.d_model, read_options(spec.options),
                                                  spec.gen ? *spec.gen : default_generator());
}

Tensor ClusterFormerAttention::assign(const Tensor& x, const Tensor& mask) const {
  const int64_t d = bank->options().dim, p = bank->options().num_clusters;
  CF_CHECK(x.defined() && x.dim() == 3 && x.shape()[2] == d && is_floating(x.dtype()), ShapeError,
           "[ClusterFormerAttention] hidden states must be float (B, N, ", d, "), got ",
           x.defined() ? x.describe() : std::string("undefined"));
  if (mask.defined())
    CF_CHECK(mask.dtype() == kBool && mask.dim() == 2 && mask.shape()[0] == x.shape()[0] &&
                 mask.shape()[1] == x.shape()[1],
             ShapeError, "[ClusterFormerAttention] padding mask must be bool (", x.shape()[0], ", ", x.shape()[1],
             "), got ", mask.describe());
  NoGradGuard ng;
  const int64_t b = x.shape()[0], n = x.shape()[1];
  // eq. 5: argmax_c cos(h, c), through the K-Means engine's blocked assignment.
  // A zero state has no direction (its cosine is undefined; padding rows are often
  // zero): it is given centroid 0's direction, so it joins cluster 0 (ties go to
  // the lower id), and every other row keeps its exact assignment.
  // A 16-bit layer input (a model converted with to(bfloat16)) is assigned in float32, the bank's dtype:
  // the K-Means engine has no 16-bit path, and the argmax of eq. 5 needs no more than float32.
  const Tensor xs = is_low_precision(x.dtype()) ? cf::to(x.detach(), kFloat32) : x.detach();
  Tensor centroids = cf::to(bank->centroids, xs.dtype());
  Tensor flat = reshape(xs, {b * n, d});
  flat = contiguous(where(eq(sum(square(flat), {1}, true), 0.0), narrow(centroids, 0, 0, 1), flat));
  Tensor ids = reshape(kmeans_assign(flat, centroids, KMeansMetric::cosine), {b, n});
  if (mask.defined()) ids = where(mask, Tensor::full({b, n}, double(p), kInt64, ids.device()), ids);
  return ids;
}

void ClusterFormerAttention::set_fixed_assignments(const Tensor& ids) {
  if (ids.defined()) {
    const int64_t p = bank->options().num_clusters;
    CF_CHECK(ids.dtype() == kInt64 && ids.dim() == 2, ValueError,
             "[ClusterFormerAttention] fixed assignments must be int64 (B, N), got ", ids.describe());
    // A data check: on CUDA deferred to the next host read (no wait here).
    check_indices("ClusterFormerAttention", ids, p + 1, [p](int64_t, int64_t v) {
      throw IndexError(str("[ClusterFormerAttention] fixed cluster id ", v, " out of range [0, ", p, "] (", p,
                           " = padding)"));
    });
  }
  std::lock_guard<std::mutex> lock(mu_);
  fixed_ids_ = ids;
}

Tensor ClusterFormerAttention::last_assignments() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_ids_;
}

Tensor ClusterFormerAttention::forward(const AttentionArgs& a) {
  check_attention_args(a, "ClusterFormerAttention");
  const Shape& qs = a.q.shape();
  const int64_t b = qs[0], n = qs[2];
  CF_CHECK(a.k.shape()[2] == n, ShapeError, "[ClusterFormerAttention] self-attention only: ", n, " queries but ",
           a.k.shape()[2], " keys");
  CF_CHECK(a.query_input.defined() && a.query_input.dim() == 3 && a.query_input.shape()[0] == b &&
               a.query_input.shape()[1] == n && a.query_input.shape()[2] == bank->options().dim,
           ValueError, "[ClusterFormerAttention] needs the layer input as query_input (", b, ", ", n,
           ", ", bank->options().dim, "), got ", a.query_input.defined() ? a.query_input.describe() : std::string("undefined"));
  const Tensor& pad = a.key_padding_mask;
  if (n == 0 || b == 0) {  // no token to assign or attend (kmeans_assign refuses an empty input)
    Tensor none = Tensor::zeros({b, n}, kInt64, a.q.device());
    std::lock_guard<std::mutex> lock(mu_);
    last_ids_ = none;
    return Tensor::zeros({b, qs[1], n, a.v.shape()[3]}, a.v.dtype(), a.v.device());
  }
  // Algorithm 1: Memory.add(States) during training, padding excluded.
  if (is_training() && grad_enabled()) bank->add(a.query_input, pad);
  Tensor ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ids = fixed_ids_;
    cuda::keep_for_graph(ids);  // (a CUDA graph reads it past a later set_fixed_assignments)
  }
  if (ids.defined()) {
    CF_CHECK(ids.shape()[0] == b && ids.shape()[1] == n, ShapeError,
             "[ClusterFormerAttention] fixed assignments are ", shape_str(ids.shape()), " but the input is (",
             b, ", ", n, ")");
  } else {
    ids = assign(a.query_input, pad);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_ids_ = ids;
  }
  // eq. 6: stable argsort, so equal ids keep position order; eq. 8: uniform chunks.
  Tensor order = reshape(argsort(ids, 1), {b, 1, n});
  ops::KnownGoodIndices built_here;  // the member table is argsort's order: no scan of it
  Tensor members = chunk_order(order, std::min(chunk_, n));
  ChunkedAttentionOptions co;
  co.causal = a.causal;
  co.scale = scale_ > 0 ? scale_ : 1.0 / std::sqrt(double(qs[3]));
  co.dropout = is_training() ? dropout_ : 0.0;
  // eqs. 7 and 9: attention within each chunk, outputs back in token order.
  return chunked_attention(a.q, a.k, a.v, members, pad, co).out;
}

}  // namespace nn
}  // namespace cf
