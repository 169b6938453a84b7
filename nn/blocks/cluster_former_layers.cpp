#include "nn/blocks/cluster_former_layers.h"

#include <algorithm>
#include <vector>

#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "core/error.h"

namespace cf {
namespace nn {

int64_t num_windows(int64_t x, int64_t m) {
  CF_CHECK(x >= 0 && m > 0, ValueError, "[num_windows] needs context length >= 0 and stride > 0, got ", x, " and ",
           m);
  return x == 0 ? 1 : (x + m - 1) / m;
}

Tensor empty_windows(const Tensor& cmask, int64_t m) {
  CF_CHECK(cmask.defined() && cmask.dtype() == kBool && cmask.dim() == 2, ShapeError,
           "[empty_windows] context_mask must be bool (B, x), got ", cmask.defined() ? cmask.describe() : "undefined");
  const int64_t b = cmask.shape()[0], x = cmask.shape()[1], k = num_windows(x, m);
  // Positions past x count as padding: K m >= x, and every window but the last is full.
  Tensor padded = x == k * m ? cmask : cat({cmask, Tensor::ones({b, k * m - x}, kBool, cmask.device())}, 1);
  return eq(sum(cf::to(reshape(padded, {b, k, m}), kInt64), {2}), double(m));
}

namespace {

std::string desc(const Tensor& t) { return t.defined() ? t.describe() : std::string("undefined"); }

// The inputs of either layer, checked; masks stay on the device (issue 25: no host read per forward).
struct Inputs {
  int64_t b = 0, x = 0, d = 0, k = 0, q = 0;
  Tensor question;  // (B, K, q, D) or undefined
  Tensor cmask;     // (B, x) bool, true = padding, or undefined (none)
  Tensor wqmask;    // (B, K, q) bool: the question mask of each window's copy, or undefined (none)
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
    CF_CHECK(cmask.device() == context.device(), DeviceError, "[", who, "] context_mask on ", cmask.device(),
             " but the context on ", context.device());
    in.cmask = cmask;
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
    CF_CHECK(qmask.device() == context.device(), DeviceError, "[", who, "] question_mask on ", qmask.device(),
             " but the context on ", context.device());
  }
  // The question copy of a window whose own context slice X[m k : m k + m] (its
  // part of eq. 4) is all padding is padding too: batch padding must not add
  // question copies that attend or get clustered.
  if (in.q > 0 && (cmask.defined() || qmask.defined())) {
    const Shape wq{in.b, in.k, in.q};
    Tensor window_pad = cmask.defined() ? expand(unsqueeze(empty_windows(cmask, stride), 2), wq) : Tensor();
    Tensor question_pad = qmask.defined() ? expand(unsqueeze(qmask, 1), wq) : Tensor();
    in.wqmask = !window_pad.defined()     ? contiguous(question_pad)
                : !question_pad.defined() ? contiguous(window_pad)
                                          : logical_or(window_pad, question_pad);
  }
  return in;
}

// A mask for the parts that have none: all false.
Tensor or_none(const Tensor& mask, const Shape& shape, Device device) {
  return mask.defined() ? mask : Tensor::zeros(shape, kBool, device);
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
  const Device dev = context.device();
  // Window k holds context positions m k .. m k + l - 1 (eq. 1); positions past x
  // read row x, an extra zero row, and are masked. The tables depend on sizes alone.
  const std::vector<Tensor> tables = tables_.get({X, K, l, m, int64_t(context.dtype())}, dev, [&] {
    std::vector<int64_t> idx(size_t(K * l));
    std::vector<double> count(size_t(X), 0.0);
    std::vector<bool> past(size_t(K * l));
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < l; ++j) {
        const int64_t p = m * k + j;
        idx[size_t(k * l + j)] = p < X ? p : X;
        past[size_t(k * l + j)] = p >= X;
        if (p < X) count[size_t(p)] += 1;
      }
    return std::vector<Tensor>{Tensor::from_vector(idx, {K * l}),
                               reshape(cf::to(Tensor::from_vector(count, {X}), context.dtype()), {1, X, 1}),
                               Tensor::from_vector(past, {1, K, l})};
  });
  const Tensor &index = tables[0], &counts = tables[1], &past = tables[2];
  // The (B K, q + l) mask: each window's question copy, then its context positions;
  // none at all when nothing can be padding.
  Tensor mask;
  const bool any_past = m * (K - 1) + l > X;
  if (in.cmask.defined() || in.wqmask.defined() || any_past) {
    Tensor ctx_mask = in.cmask.defined()
                          ? reshape(index_select(cat({in.cmask, Tensor::ones({B, 1}, kBool, dev)}, 1), 1, index),
                                    {B, K, l})
                          : expand(past, {B, K, l});
    mask = q > 0 ? cat({or_none(in.wqmask, {B, K, q}, dev), ctx_mask}, 2) : ctx_mask;
    mask = reshape(contiguous(mask), {B * K, q + l});
  }
  Tensor padded = cat({context, Tensor::zeros({B, 1, D}, context.dtype(), dev)}, 1);
  Tensor windows = reshape(index_select(padded, 1, index), {B * K, l, D});
  if (q > 0) windows = cat({reshape(in.question, {B * K, q, D}), windows}, 1);  // eq. 1: [Q; X[mk : mk+l]]
  // eq. 2: one Transformer layer over the windows, batched as B*K sequences.
  Tensor out = layer->forward(windows, mask, causal, aux);
  WindowedStates s;
  if (q > 0) s.question = reshape(narrow(out, 1, 0, q), {B, K, q, D});
  // eqs. 2-3: each context token becomes the mean of its outputs in the windows that hold it.
  Tensor ctx = reshape(narrow(out, 1, q, l), {B, K * l, D});
  Tensor sums = index_add(Tensor::zeros({B, X + 1, D}, context.dtype(), dev), 1, index, ctx);
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
  const Device dev = context.device();
  if (q == 0) {  // no question: eq. 4 is the context itself
    WindowedStates s;
    s.context = layer->forward(context, in.cmask, causal, aux);
    return s;
  }
  // eq. 4: [Q_0; X[0 : m]; Q_1; X[m : 2m]; ...], read from cat([Q_0 .. Q_{K-1}, X]).
  const int64_t n = K * q + X;
  const std::vector<Tensor> tables = tables_.get({X, K, q, m}, dev, [&] {
    std::vector<int64_t> perm, inverse(static_cast<size_t>(n), 0);
    perm.reserve(size_t(n));
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t i = 0; i < q; ++i) perm.push_back(k * q + i);
      for (int64_t p = m * k; p < std::min(m * (k + 1), X); ++p) perm.push_back(K * q + p);
    }
    for (int64_t i = 0; i < n; ++i) inverse[size_t(perm[size_t(i)])] = i;
    return std::vector<Tensor>{Tensor::from_vector(perm, {n}), Tensor::from_vector(inverse, {n})};
  });
  const Tensor &perm = tables[0], &inverse = tables[1];
  Tensor mask;
  if (in.cmask.defined() || in.wqmask.defined())
    mask = index_select(
        cat({reshape(or_none(in.wqmask, {B, K, q}, dev), {B, K * q}), or_none(in.cmask, {B, X}, dev)}, 1), 1, perm);
  Tensor all = cat({reshape(in.question, {B, K * q, D}), context}, 1);
  Tensor h = index_select(all, 1, perm);
  Tensor out = layer->forward(h, mask, causal, aux);
  Tensor back = index_select(out, 1, inverse);
  WindowedStates s;
  s.question = reshape(narrow(back, 1, 0, K * q), {B, K, q, D});
  s.context = narrow(back, 1, K * q, X);
  return s;
}

}  // namespace nn
}  // namespace cf
