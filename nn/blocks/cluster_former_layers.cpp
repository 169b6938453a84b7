#include "nn/blocks/cluster_former_layers.h"

#include <algorithm>
#include <vector>

#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/shape.h"
#include "core/error.h"

namespace cf {
namespace nn {

int64_t num_windows(int64_t x, int64_t m) {
  CF_CHECK(x >= 0 && m > 0, ValueError, "[num_windows] needs context length >= 0 and stride > 0, got ", x, " and ",
           m);
  return x == 0 ? 1 : (x + m - 1) / m;
}

namespace {

std::string desc(const Tensor& t) { return t.defined() ? t.describe() : std::string("undefined"); }

struct Inputs {
  int64_t b = 0, x = 0, d = 0, k = 0, q = 0;
  Tensor question;               // (B, K, q, D) or undefined
  std::vector<bool> cmask, qmask;  // (B, x), (B, q): true = padding
  std::vector<bool> wqmask;        // (B, K, q): the question mask of each window's copy
};

// Validates the shared inputs of both layers and broadcasts a (B, q, D) question to every window.
Inputs check_inputs(const char* who, int64_t d_model, int64_t stride, const Tensor& context, const Tensor& cmask,
                    const Tensor& question, const Tensor& qmask) {
  Inputs in;
  CF_CHECK(context.defined() && context.dim() == 3 && context.shape()[2] == d_model && context.shape()[1] > 0 &&
               is_floating(context.dtype()),
           ShapeError, "[", who, "] context must be float (B, x, ", d_model, ") with x > 0, got ", desc(context));
  in.b = context.shape()[0];
  in.x = context.shape()[1];
  in.d = d_model;
  in.k = num_windows(in.x, stride);
  if (cmask.defined()) {
    CF_CHECK(cmask.dtype() == kBool && cmask.dim() == 2 && cmask.shape()[0] == in.b && cmask.shape()[1] == in.x,
             ShapeError, "[", who, "] context_mask must be bool (", in.b, ", ", in.x, ") (true = padding), got ",
             cmask.describe());
    in.cmask = cmask.to_vector<bool>();
  } else {
    in.cmask.assign(size_t(in.b * in.x), false);
  }
  if (question.defined()) {
    CF_CHECK(question.dtype() == context.dtype(), DTypeError, "[", who, "] question ", question.dtype(),
             " and context ", context.dtype(), " must share a dtype");
    const Shape& s = question.shape();
    const bool shared = question.dim() == 3 && s[0] == in.b && s[2] == d_model;
    const bool per_window = question.dim() == 4 && s[0] == in.b && s[1] == in.k && s[3] == d_model;
    CF_CHECK(shared || per_window, ShapeError, "[", who, "] question must be (B, q, D) = (", in.b, ", q, ", d_model,
             ") or per window (B, K, q, D) = (", in.b, ", ", in.k, ", q, ", d_model, ") with K = ceil(", in.x, " / ",
             stride, "), got ", question.describe());
    in.q = shared ? s[1] : s[2];
    in.question = shared ? expand(unsqueeze(question, 1), {in.b, in.k, in.q, d_model}) : question;
  }
  if (qmask.defined()) {
    CF_CHECK(question.defined(), ValueError, "[", who, "] question_mask given without a question");
    CF_CHECK(qmask.dtype() == kBool && qmask.dim() == 2 && qmask.shape()[0] == in.b && qmask.shape()[1] == in.q,
             ShapeError, "[", who, "] question_mask must be bool (", in.b, ", ", in.q, ") (true = padding), got ",
             qmask.describe());
    in.qmask = qmask.to_vector<bool>();
  } else {
    in.qmask.assign(size_t(in.b * in.q), false);
  }
  // The question copy of a window whose own context slice X[m k : m k + m] (its
  // part of eq. 4) is all padding is padding too: batch padding must not add
  // question copies that attend or get clustered.
  in.wqmask.assign(size_t(in.b * in.k * in.q), false);
  for (int64_t b = 0; b < in.b; ++b)
    for (int64_t k = 0; k < in.k; ++k) {
      bool empty = true;
      for (int64_t p = stride * k; p < std::min(stride * (k + 1), in.x) && empty; ++p)
        empty = in.cmask[size_t(b * in.x + p)];
      for (int64_t i = 0; i < in.q; ++i)
        in.wqmask[size_t((b * in.k + k) * in.q + i)] = empty || in.qmask[size_t(b * in.q + i)];
    }
  return in;
}

Tensor bool_tensor(const std::vector<bool>& v, const Shape& s, Device device) {
  for (bool e : v)
    if (e) return Tensor::from_vector(v, s).to(device);
  return Tensor();  // nothing masked: let the attention skip the mask
}

}  // namespace

// ---------------- Sliding-Window layer ----------------

SlidingWindowLayer::SlidingWindowLayer(const TransformerLayerOptions& o, int64_t window, int64_t stride,
                                       Generator& gen)
    : window_(window), stride_(stride) {
  CF_CHECK(stride > 0 && window > stride, ValueError,
           "[SlidingWindowLayer] needs window l > stride m > 0 (overlapping windows, section 3.1), got l=", window,
           " m=", stride);
  layer = register_module("layer", std::make_shared<TransformerEncoderLayer>(o, gen));
}

WindowedStates SlidingWindowLayer::forward(const Tensor& context, const Tensor& cmask, const Tensor& question,
                                           const Tensor& qmask, bool causal, AuxLosses* aux) {
  const int64_t d_model = layer->self_attn->d_model();
  Inputs in = check_inputs("SlidingWindowLayer", d_model, stride_, context, cmask, question, qmask);
  const int64_t B = in.b, X = in.x, D = in.d, K = in.k, q = in.q, l = window_, m = stride_;
  // Window k holds context positions m k .. m k + l - 1 (eq. 1); positions past x
  // read row x, an extra zero row, and are masked.
  std::vector<int64_t> idx(size_t(K * l));
  std::vector<double> count(size_t(X), 0.0);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < l; ++j) {
      const int64_t p = m * k + j;
      idx[size_t(k * l + j)] = p < X ? p : X;
      if (p < X) count[size_t(p)] += 1;
    }
  std::vector<bool> mask(size_t(B * K * (q + l)));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < K; ++k) {
      const size_t row = size_t((b * K + k) * (q + l));
      for (int64_t i = 0; i < q; ++i) mask[row + size_t(i)] = in.wqmask[size_t((b * K + k) * q + i)];
      for (int64_t j = 0; j < l; ++j) {
        const int64_t p = idx[size_t(k * l + j)];
        mask[row + size_t(q + j)] = p >= X || in.cmask[size_t(b * X + p)];
      }
    }
  const Tensor index = Tensor::from_vector(idx, {K * l}).to(context.device());
  Tensor padded = cat({context, Tensor::zeros({B, 1, D}, context.dtype(), context.device())}, 1);
  Tensor windows = reshape(index_select(padded, 1, index), {B * K, l, D});
  if (q > 0) windows = cat({reshape(in.question, {B * K, q, D}), windows}, 1);  // eq. 1: [Q; X[mk : mk+l]]
  // eq. 2: one Transformer layer over the windows, batched as B*K sequences.
  Tensor out = layer->forward(windows, bool_tensor(mask, {B * K, q + l}, context.device()), causal, aux);
  WindowedStates s;
  if (q > 0) s.question = reshape(narrow(out, 1, 0, q), {B, K, q, D});
  // eqs. 2-3: each context token becomes the mean of its outputs in the windows that hold it.
  Tensor ctx = reshape(narrow(out, 1, q, l), {B, K * l, D});
  Tensor sums = index_add(Tensor::zeros({B, X + 1, D}, context.dtype(), context.device()), 1, index, ctx);
  Tensor counts = reshape(cf::to(Tensor::from_vector(count, {X}).to(context.device()), context.dtype()), {1, X, 1});
  s.context = narrow(sums, 1, 0, X) / counts;
  return s;
}

// ---------------- Cluster-Former layer ----------------

ClusterFormerLayer::ClusterFormerLayer(const TransformerLayerOptions& o, int64_t stride, Generator& gen)
    : stride_(stride) {
  CF_CHECK(stride > 0, ValueError, "[ClusterFormerLayer] stride must be positive, got ", stride);
  layer = register_module("layer", std::make_shared<TransformerEncoderLayer>(o, gen));
}

bool ClusterFormerLayer::has_memory_bank() const {
  return dynamic_cast<ClusterFormerAttention*>(&layer->self_attn->attention()) != nullptr;
}

ClusterFormerAttention& ClusterFormerLayer::attention() const {
  auto* a = dynamic_cast<ClusterFormerAttention*>(&layer->self_attn->attention());
  CF_CHECK(a, ValueError, "[ClusterFormerLayer] attention(): the layer's attention is \"",
           layer->self_attn->attention().type(), "\", not \"cluster-former\"");
  return *a;
}

WindowedStates ClusterFormerLayer::forward(const Tensor& context, const Tensor& cmask, const Tensor& question,
                                           const Tensor& qmask, bool causal, AuxLosses* aux) {
  const int64_t d_model = layer->self_attn->d_model();
  Inputs in = check_inputs("ClusterFormerLayer", d_model, stride_, context, cmask, question, qmask);
  const int64_t B = in.b, X = in.x, D = in.d, K = in.k, q = in.q, m = stride_;
  if (q == 0) {  // no question: eq. 4 is the context itself
    WindowedStates s;
    s.context = layer->forward(context, bool_tensor(in.cmask, {B, X}, context.device()), causal, aux);
    return s;
  }
  // eq. 4: [Q_0; X[0 : m]; Q_1; X[m : 2m]; ...], read from cat([Q_0 .. Q_{K-1}, X]).
  const int64_t n = K * q + X;
  std::vector<int64_t> perm, inverse(static_cast<size_t>(n), 0);
  perm.reserve(size_t(n));
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t i = 0; i < q; ++i) perm.push_back(k * q + i);
    for (int64_t p = m * k; p < std::min(m * (k + 1), X); ++p) perm.push_back(K * q + p);
  }
  for (int64_t i = 0; i < n; ++i) inverse[size_t(perm[size_t(i)])] = i;
  std::vector<bool> mask(size_t(B * n));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t src = perm[size_t(i)];
      mask[size_t(b * n + i)] = src < K * q ? in.wqmask[size_t(b * K * q + src)] : in.cmask[size_t(b * X + src - K * q)];
    }
  Tensor all = cat({reshape(in.question, {B, K * q, D}), context}, 1);
  Tensor h = index_select(all, 1, Tensor::from_vector(perm, {n}).to(context.device()));
  Tensor out = layer->forward(h, bool_tensor(mask, {B, n}, context.device()), causal, aux);
  Tensor back = index_select(out, 1, Tensor::from_vector(inverse, {n}).to(context.device()));
  WindowedStates s;
  s.question = reshape(narrow(back, 1, 0, K * q), {B, K, q, D});
  s.context = narrow(back, 1, K * q, X);
  return s;
}

}  // namespace nn
}  // namespace cf
