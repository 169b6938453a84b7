#include "nn/attention/neural_clustering.h"

#include <cmath>
#include <unordered_map>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/nn_functional.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/sort.h"
#include "core/error.h"
#include "nn/attention/chunked.h"
#include "nn/init.h"
#include "nn/losses.h"

namespace cf {
namespace nn {

namespace {

std::string describe(const Tensor& t) { return t.defined() ? t.describe() : std::string("undefined"); }

void check_mask(const Tensor& m, int64_t b, int64_t n, const char* who) {
  if (!m.defined()) return;
  CF_CHECK(m.dtype() == kBool && m.dim() == 2 && m.shape()[0] == b && m.shape()[1] == n, ShapeError, "[", who,
           "] key_padding_mask must be bool (B, N) = (", b, ", ", n, "), got ", m.describe());
}

}  // namespace

ClusterLossForm cluster_loss_form_from_string(const std::string& name, const std::string& who) {
  CF_CHECK(name == "inner" || name == "cosine" || name == "sphere", ValueError, "[", who,
           "] loss_form must be \"inner\", \"cosine\" or \"sphere\", got \"", name, "\"");
  return name == "inner" ? ClusterLossForm::kInner
                         : name == "cosine" ? ClusterLossForm::kCosine : ClusterLossForm::kSphere;
}

std::string to_string(ClusterLossForm form) {
  switch (form) {
    case ClusterLossForm::kCosine: return "cosine";
    case ClusterLossForm::kSphere: return "sphere";
    case ClusterLossForm::kInner: break;
  }
  return "inner";
}

NeuralClusteringResult neural_clustering(const Tensor& x, const Tensor& c, const Tensor& w_c,
                                         const Tensor& key_padding_mask, ClusterTieOrder tie_order) {
  const char* who = "neural_clustering";
  CF_CHECK(x.defined() && x.dim() == 3 && is_floating(x.dtype()), ShapeError, "[", who,
           "] x must be float (B, N, D), got ", describe(x));
  const int64_t B = x.shape()[0], N = x.shape()[1], D = x.shape()[2];
  CF_CHECK(c.defined() && ((c.dim() == 2 && c.shape()[1] == D) ||
                           (c.dim() == 3 && c.shape()[0] == B && c.shape()[2] == D)) &&
               c.shape()[c.dim() - 2] >= 1,
           ShapeError, "[", who, "] centroids must be (k, D) or (B, k, D) with k >= 1 for x ", shape_str(x.shape()),
           ", got ", describe(c));
  CF_CHECK(w_c.defined() && w_c.dim() == 2 && w_c.shape()[0] == D && w_c.shape()[1] == D, ShapeError, "[", who,
           "] W^C must be (D, D) = (", D, ", ", D, "), got ", describe(w_c));
  CF_CHECK(c.dtype() == x.dtype() && w_c.dtype() == x.dtype(), DTypeError, "[", who,
           "] x, centroids and W^C must share one dtype, got ", x.dtype(), ", ", c.dtype(), ", ", w_c.dtype());
  check_mask(key_padding_mask, B, N, who);
  const int64_t k = c.shape()[c.dim() - 2];

  NeuralClusteringResult r;
  Tensor xw = matmul(x, w_c);                                  // X W^C (B, N, D)
  Tensor scores = matmul(c, transpose(xw, 1, 2));              // phi(C_i, X_j W^C), (B, k, N)
  if (key_padding_mask.defined())
    scores = masked_fill(scores, reshape(key_padding_mask, {B, 1, N}), -INFINITY);
  r.u = softmax(scores, -1);                                   // eq. 2: normalised over the sequence
  r.c_hat = matmul(r.u, xw);                                   // eq. 3
  NoGradGuard ng;
  ops::KnownGoodIndices built_here;  // the gathers below read argsort's outputs: permutations of [0, N)
  Tensor u = r.u.detach();
  Tensor index = argmax(u, 1);                                 // eq. 4, (B, N)
  if (key_padding_mask.defined()) index = masked_fill(index, key_padding_mask, double(k));
  Tensor order;
  if (tie_order == ClusterTieOrder::kMembership) {
    // Two stable passes (least significant key first): by descending U_{I_j, j},
    // then by cluster index, so a cluster's most typical members come first.
    Tensor by_membership = argsort(amax(u, {1}), -1, /*descending=*/true);
    Tensor by_cluster = argsort(gather(index, 1, by_membership), -1);
    order = gather(by_membership, 1, by_cluster);
  } else {
    order = argsort(index, -1);                                // stable: ties keep their positions
  }
  r.index = index;
  r.order = order;                                             // eq. 5: I'
  return r;
}

// ---------------------------------------------------------------- the layer

NeuralClusteringAttention::NeuralClusteringAttention(int64_t d_model, const NeuralClusteringOptions& o, Generator& gen)
    : d_model_(d_model), options_(o) {
  CF_CHECK(d_model >= 1, ValueError, "[NeuralClusteringAttention] d_model must be >= 1, got ", d_model);
  CF_CHECK(o.clusters >= 1, ValueError, "[NeuralClusteringAttention] clusters (k) must be >= 1, got ", o.clusters);
  CF_CHECK(o.look_back >= 0, ValueError, "[NeuralClusteringAttention] look_back must be >= 0, got ", o.look_back);
  CF_CHECK(o.scale >= 0 && std::isfinite(o.scale), ValueError,
           "[NeuralClusteringAttention] scale must be >= 0 (0: 1/sqrt(d_k)), got ", o.scale);
  CF_CHECK(o.dropout >= 0 && o.dropout < 1, ValueError, "[NeuralClusteringAttention] dropout must be in [0, 1), got ",
           o.dropout);
  centroids = Tensor::empty({o.clusters, d_model});
  init::normal_(centroids, 0.0, 1.0 / std::sqrt(double(d_model)), gen);
  w_c = Tensor::empty({d_model, d_model});
  const double a = 1.0 / std::sqrt(double(d_model));
  init::uniform_(w_c, -a, a, gen);
  register_parameter("centroids", &centroids);
  register_parameter("w_c", &w_c);
}

std::shared_ptr<Attention> NeuralClusteringAttention::create(const AttentionSpec& spec) {
  const Config& c = spec.options;
  NeuralClusteringOptions o;
  o.clusters = c.require<int64_t>("clusters");
  o.look_back = c.get<int64_t>("look_back", o.look_back);
  o.scale = c.get<double>("scale", o.scale);
  o.dropout = c.get<double>("dropout", o.dropout);
  o.losses_reach_input = c.get<bool>("losses_reach_input", o.losses_reach_input);
  o.loss_form = cluster_loss_form_from_string(c.get<std::string>("loss_form", "inner"),
                                              "NeuralClusteringAttention");
  const std::string tie = c.get<std::string>("tie_order", "membership");
  CF_CHECK(tie == "membership" || tie == "position", ValueError, "[NeuralClusteringAttention] ",
           c.path_of("tie_order"), " must be \"membership\" or \"position\", got \"", tie, "\"");
  o.tie_order = tie == "membership" ? ClusterTieOrder::kMembership : ClusterTieOrder::kPosition;
  c.finish();
  return std::make_shared<NeuralClusteringAttention>(spec.d_model, o, spec.gen ? *spec.gen : default_generator());
}

namespace {
// This thread's pass through each chain: the layer expected next and C^ of the layer before it.
// (The weak pointer tells a live chain from a freed one whose address a new chain took.)
struct ChainPass {
  std::weak_ptr<CentroidChain> chain;
  int64_t next = 0;
  Tensor c_hat;  // (B, k, D)
};
thread_local std::unordered_map<const CentroidChain*, ChainPass> t_chain_passes;
}  // namespace

Tensor NeuralClusteringAttention::current_centroids() const {
  if (chain_index_ == 0) return centroids;
  if (!chain_) return Tensor();
  auto it = t_chain_passes.find(chain_.get());
  if (it == t_chain_passes.end() || it->second.chain.lock() != chain_ || it->second.next != chain_index_)
    return Tensor();
  return it->second.c_hat;
}

Tensor NeuralClusteringAttention::forward(const AttentionArgs& a) {
  // Autocast: the clustering (eqs. 2-4: argmax, sort) runs in float32 on a float32 copy of
  // query_input, with C and W^C in their own float32 and the policy off. The attention gets
  // the 16-bit q, k, v: chunked_attention runs them on the block kernel's tensor-core arm
  // (CUDA, head size 64; issue 26) or on float32 copies. The output is float32 either way.
  if (autocast_dtype()) {
    const AttentionArgs a32 = autocast_float32_args(a);  // cast before turning the policy off
    Tensor members;
    {
      AutocastGuard off(std::nullopt);
      members = cluster(a32);
    }
    return attend(members.defined() ? a : a32, members);  // N = 0: float32 zeros
  }
  return attend(a, cluster(a));
}

namespace {

// With padding, N in eq. 8 is each sequence's own length n_b (its valid tokens, which the sort
// puts first: padding's cluster index is k): row b's k blocks hold w_b = ceil(n_b / k) slots
// of the table's w, the rest empty. Blocks of the padded length's w made a text's output depend
// on the longest text of its batch. Tensor ops on the order's device: no host read.
Tensor padded_block_members(const Tensor& order, const Tensor& key_padding_mask, int64_t k, int64_t w) {
  const int64_t B = order.shape()[0], N = order.shape()[1];
  const Device dev = order.device();
  const Tensor valid = sum(to(logical_not(key_padding_mask), kFloat64), {1}, true);  // n_b, (B, 1)
  // w_b = ceil(n_b / k) = #{j in [0, w) : j k < n_b}
  const Tensor jk = reshape(to(Tensor::arange(w, kInt64, dev), kFloat64) * double(k), {1, w});
  const Tensor wb = reshape(sum(to(lt(jk, valid), kFloat64), {1}, true), {B, 1, 1});
  const Tensor block = reshape(to(Tensor::arange(k, kInt64, dev), kFloat64), {1, k, 1});
  const Tensor slot = reshape(to(Tensor::arange(w, kInt64, dev), kFloat64), {1, 1, w});
  const Tensor at = block * wb + slot;  // (B, k, w): the sorted token slot s of block i holds
  const Tensor used = logical_and(lt(slot, wb), lt(at, reshape(valid, {B, 1, 1})));
  const Tensor from = reshape(to(clamp(at, 0.0, double(N - 1)), kInt64), {B, k * w});
  const Tensor picked = reshape(gather(order, 1, from), {B, k, w});
  return reshape(where(used, picked, full_like(picked, -1.0)), {B, 1, k, w});
}

}  // namespace

Tensor NeuralClusteringAttention::cluster(const AttentionArgs& a) {
  const char* who = "NeuralClusteringAttention";
  check_attention_args(a, who);
  const Shape& qs = a.q.shape();
  const int64_t B = qs[0], N = qs[2];
  CF_CHECK(a.k.shape()[2] == N, ShapeError, "[", who, "] is self-attention only: Nq (", N, ") != Nk (",
           a.k.shape()[2], ")");
  CF_CHECK(a.query_input.defined() && a.query_input.dim() == 3 && a.query_input.shape()[0] == B &&
               a.query_input.shape()[1] == N && a.query_input.shape()[2] == d_model_,
           ShapeError, "[", who, "] clusters the layer input: query_input must be (B, N, d_model) = (", B, ", ", N,
           ", ", d_model_, "), got ", describe(a.query_input));
  CF_CHECK(a.query_input.dtype() == a.q.dtype(), DTypeError, "[", who, "] query_input is ", a.query_input.dtype(),
           " but q is ", a.q.dtype());
  Tensor c = current_centroids();
  CF_CHECK(c.defined(), ValueError, "[", who, "] layer ", chain_index_,
           " of a centroid chain ran before layer ", chain_index_ - 1,
           " in this forward pass: it clusters with that layer's updated centroids (eq. 3)");
  // A model converted to 16 bits, under autocast: the float32 island reads C and W^C widened
  // (differentiable casts, so their 16-bit parameters get gradients); they were refused.
  Tensor wc = w_c;
  if (is_low_precision(c.dtype()) && !is_low_precision(a.q.dtype())) c = cf::to(c, a.q.dtype());
  if (wc.defined() && is_low_precision(wc.dtype()) && !is_low_precision(a.q.dtype())) wc = cf::to(wc, a.q.dtype());
  CF_CHECK(c.dtype() == a.q.dtype(), DTypeError, "[", who, "] q is ", a.q.dtype(), " but the centroids are ",
           c.dtype(), " (convert the module with to(dtype))");
  CF_CHECK(c.dim() == 2 || c.shape()[0] == B, ShapeError, "[", who, "] centroids ", c.describe(),
           " do not fit this batch (B = ", B, ")");
  // Hand C^ to the next layer; the last one clears it (no graph kept between passes).
  auto hand_over = [&](const Tensor& c_hat) {
    if (!chain_) return;
    if (chain_index_ + 1 >= chain_->size) {
      t_chain_passes.erase(chain_.get());
      return;
    }
    // A pass that stopped part way (one layer probed, an exception) leaves its C^ and graph here until the
    // chain's next pass; a chain freed meanwhile never has one: its entry goes now (it held the graph,
    // the input included, for good: 0.58 MB a model in a hunt's loop)
    for (auto it = t_chain_passes.begin(); it != t_chain_passes.end();)
      it = it->second.chain.expired() ? t_chain_passes.erase(it) : std::next(it);
    t_chain_passes[chain_.get()] = ChainPass{chain_, chain_index_ + 1, c_hat};
  };
  if (N == 0) {
    hand_over(c);  // no token moves a centroid (eq. 3): the next layer clusters with C unchanged
    return Tensor();
  }

  // See NeuralClusteringOptions::losses_reach_input: by default U, C^, L1 and L2
  // see X as a constant, so the unbounded losses move only C and W^C.
  Tensor xin = options_.losses_reach_input ? a.query_input : a.query_input.detach();
  NeuralClusteringResult r = neural_clustering(xin, c, wc, a.key_padding_mask, options_.tie_order);
  hand_over(r.c_hat);
  // The cluster ids (argmax, k at padding), the member table (argsort's order, -1 past N) and the gathers
  // that build it are in range by construction: no data scans (ops::KnownGoodIndices).
  ops::KnownGoodIndices built_here;
  if (a.aux) {
    a.aux->add(kClusteringLossName, clustering_loss(xin, r.c_hat, r.index, a.key_padding_mask, options_.loss_form));
    a.aux->add(kCentroidSortingLossName, centroid_sorting_loss(r.c_hat, options_.loss_form));
  }

  // Eqs. 8-10 (appendix B's eqs. 12-14 when causal): k blocks of w = ceil(N / k)
  // sorted tokens, each seeing itself and look_back blocks before it, cyclically.
  // Exactly k blocks: the k w - N slots after the last token are empty (-1), so
  // when ceil(N / w) < k (e.g. N = 11, k = 5, w = 3) the last block is empty and
  // block 1's cyclic look-back (eq. 8: K^S((1-2)w : w)) reaches nothing there.
  const int64_t k = options_.clusters, w = (N + k - 1) / k;
  if (!a.key_padding_mask.defined()) {
    Tensor order = reshape(r.order, {B, 1, N});
    if (k * w > N) order = pad(order, {0, k * w - N}, -1.0);
    return reshape(contiguous(order), {B, 1, k, w});
  }
  return padded_block_members(r.order, a.key_padding_mask, k, w);
}


Tensor NeuralClusteringAttention::attend(const AttentionArgs& a, const Tensor& members) const {
  if (!members.defined())  // N = 0
    return Tensor::zeros({a.q.shape()[0], a.q.shape()[1], 0, a.v.shape()[3]}, a.v.dtype(), a.v.device());
  ChunkedAttentionOptions co;
  co.look_back = options_.look_back;
  co.causal = a.causal;
  co.scale = options_.scale;
  co.dropout = is_training() ? options_.dropout : 0.0;
  ops::KnownGoodIndices built_here;  // members: cluster()'s table, from argsort
  return chunked_attention(a.q, a.k, a.v, members, a.key_padding_mask, co).out;
}

void link_centroid_chain(const std::vector<Attention*>& stack) {
  std::vector<NeuralClusteringAttention*> layers;
  for (Attention* a : stack)
    if (auto* l = dynamic_cast<NeuralClusteringAttention*>(a)) layers.push_back(l);
  if (layers.size() < 2) return;
  CF_CHECK(layers[0]->centroids.defined(), ValueError,
           "[link_centroid_chain] the first layer of the stack has no centroids of its own (it was linked as a "
           "later layer of another stack)");
  for (size_t i = 1; i < layers.size(); ++i)
    CF_CHECK(layers[i]->options_.clusters == layers[0]->options_.clusters &&
                 layers[i]->d_model_ == layers[0]->d_model_,
             ValueError, "[link_centroid_chain] layer ", i, " has k = ", layers[i]->options_.clusters,
             ", d_model = ", layers[i]->d_model_, " but layer 0 has k = ", layers[0]->options_.clusters,
             ", d_model = ", layers[0]->d_model_, ": C^ is handed over unchanged");
  auto chain = std::make_shared<CentroidChain>();
  chain->size = int64_t(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    layers[i]->chain_ = chain;
    layers[i]->chain_index_ = int64_t(i);
    if (i > 0) layers[i]->centroids = Tensor();  // unregistered: undefined parameters are skipped
  }
}

}  // namespace nn
}  // namespace cf
