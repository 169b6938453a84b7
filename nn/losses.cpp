#include "nn/losses.h"

#include <cmath>
#include <limits>

#include "autograd/autocast.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"

namespace cf {
namespace nn {

namespace {

using ops::check_defined;
using ops::check_float;
// `other` must match `ref` in dtype and device.
void need_like(const Tensor& other, const char* other_name, const Tensor& ref, const char* ref_name,
               const char* loss) {
  CF_CHECK(other.dtype() == ref.dtype(), DTypeError, "[", loss, "] ", other_name, " ",
           other.describe(), " and ", ref_name, " ", ref.describe(),
           " must have the same dtype (cast with cf::to)");
  CF_CHECK(other.device() == ref.device(), DeviceError, "[", loss, "] ", other_name, " ",
           other.describe(), " and ", ref_name, " ", ref.describe(), " are on different devices");
}
// Autocast runs losses in float32 (a 16-bit prediction from a Linear beside float32 targets, as
// torch.autocast's float32 list): true when the policy is on and a defined operand is 16-bit.
bool any_autocast_16bit(std::initializer_list<const Tensor*> ts) {
  if (!autocast_dtype()) return false;
  for (const Tensor* t : ts)
    if (t->defined() && is_low_precision(t->dtype())) return true;
  return false;
}
// `other` must broadcast to ref's shape without enlarging it.
void need_broadcastable(const Tensor& other, const char* other_name, const Tensor& ref,
                        const char* ref_name, const char* loss) {
  CF_CHECK(broadcasts_to(other.shape(), ref.shape()), ShapeError, "[", loss, "] ", other_name, " ", other.describe(),
           " does not broadcast to ", ref_name, " ", ref.describe());
}

Tensor reduce(const Tensor& loss, Reduction r, const char* op) {
  switch (r) {
    case Reduction::None: return loss;
    case Reduction::Sum: return sum(loss);
    case Reduction::Mean:
      CF_CHECK(loss.numel() > 0, ShapeError, "[", op, "] the mean over no elements (", loss.describe(),
               ") is undefined; reduction 'sum' gives 0");
      return mean(loss);
  }
  return loss;
}

}  // namespace

// ---------------- cross entropy ----------------

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyLossOptions& o) {
  CrossEntropyOptions fused;
  fused.ignore_index = o.ignore_index;
  fused.label_smoothing = o.label_smoothing;
  fused.reduction = o.reduction;
  if (!o.weight.defined()) return cf::cross_entropy(logits, targets, fused);

  const char* op = "cross_entropy";
  check_cross_entropy_args(logits, targets, o.label_smoothing);
  const int64_t C = logits.size(1);
  const Tensor& weight = o.weight;
  CF_CHECK(weight.dim() == 1 && weight.size(0) == C, ShapeError, "[cross_entropy] class weights ",
           weight.describe(), " do not match logits ", logits.describe(),
           ": expected weights of shape (", C, ")");
  need_like(weight, "class weights", logits, "logits", op);
  if (targets.device().is_cpu()) {
    for (int64_t t : targets.to_vector<int64_t>())
      CF_CHECK(t == o.ignore_index || (t >= 0 && t < C), IndexError, "[cross_entropy] target ", t,
               " is out of range for ", C, " classes (logits ", logits.describe(),
               ", ignore_index ", o.ignore_index, ")");
  }

  const Tensor w = weight.detach();
  Tensor logp = log_softmax(logits, 1);                       // (N, C, ...)
  Tensor ignored = eq(targets, double(o.ignore_index));       // (N, ...)
  Tensor safe = where(logical_not(ignored), targets, 0.0);  // ignored -> class 0
  // (an ignored row's log p of class 0 may be -inf or NaN (masked logits): zeroed, not multiplied by its 0 weight)
  Tensor logp_y = masked_fill(squeeze(gather(logp, 1, unsqueeze(safe, 1)), 1), ignored, 0.0);
  Tensor w_y = masked_fill(reshape(index_select(w, 0, flatten(safe)), targets.shape()), ignored, 0.0);
  Tensor loss = neg(mul(w_y, logp_y));
  if (o.label_smoothing > 0) {
    Shape ws(size_t(logits.dim()), 1);
    ws[1] = C;
    Tensor smooth = neg(sum(mul(logp, reshape(w, ws)), {1}));
    smooth = masked_fill(smooth, ignored, 0.0);
    loss = add(mul(loss, 1.0 - o.label_smoothing), mul(smooth, o.label_smoothing / double(C)));
  }
  switch (o.reduction) {
    case Reduction::None: return loss;
    case Reduction::Sum: return sum(loss);
    case Reduction::Mean: {
      Tensor wsum = sum(w_y);
      Tensor denom = where(eq(wsum, 0.0), ones_like(wsum), wsum);
      return div(sum(loss), denom);
    }
  }
  return loss;
}

// ---------------- binary cross entropy with logits ----------------

Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& targets,
                                        const BCEWithLogitsOptions& o) {
  const char* op = "binary_cross_entropy_with_logits";
  check_defined(logits, op, "logits");
  check_defined(targets, op, "targets");
  check_float(logits, op, "logits");
  if (any_autocast_16bit({&logits, &targets, &o.pos_weight, &o.weight})) {
    BCEWithLogitsOptions o32 = o;
    o32.pos_weight = autocast::to_float32(o.pos_weight);
    o32.weight = autocast::to_float32(o.weight);
    return binary_cross_entropy_with_logits(autocast::to_float32(logits), autocast::to_float32(targets), o32);
  }
  need_like(targets, "targets", logits, "logits", op);
  CF_CHECK(targets.shape() == logits.shape(), ShapeError, "[", op, "] targets ", targets.describe(),
           " do not match logits ", logits.describe(), ": they must have the same shape");
  if (o.pos_weight.defined()) {
    need_like(o.pos_weight, "pos_weight", logits, "logits", op);
    need_broadcastable(o.pos_weight, "pos_weight", logits, "logits", op);
  }
  if (o.weight.defined()) {
    need_like(o.weight, "weight", logits, "logits", op);
    need_broadcastable(o.weight, "weight", logits, "logits", op);
  }
  // With t = log1p(exp(-|x|)) (never above log 2): loss = (1 - y) x + softplus(-x), written per sign
  // of x so no term cancels and no inf meets a zero:
  //   x > 0:  x (1 - y) + t            gradient 1 - y - sigmoid(-x)
  //   x <= 0: -x y + t                 gradient sigmoid(x) - y
  // The form (1 - y) x + softplus(-x) gave the x <= 0, y = 0 gradient as 1 - sigmoid(-x): 0
  // instead of 3.1e-7 at x = -15 in float32; relu(x) - x y gave NaN at x = +inf. At x = 0 the
  // second branch holds, so the gradient is sigmoid(0) - y.
  const Tensor pos = gt(logits, 0.0);
  const Tensor tail = log1p(exp(where(pos, neg(logits), logits)));
  // x+ = max(x, 0) and x- = min(x, 0) through where, so no branch multiplies an infinite logit by a
  // zero gradient on its way to the targets (their gradient at x = +-inf is -x, as in PyTorch).
  // pos_weight p scales softplus(-x) by lw = 1 + (p - 1) y; per branch that is
  //   x > 0:  x (1 - y) + lw t       x <= 0:  -x p y + lw t
  // (so the x <= 0, y = 0 gradient is still sigmoid(x) alone, and no (p - 1) * inf appears).
  const Tensor x_pos = where(pos, logits, 0.0), x_neg = where(logical_not(pos), logits, 0.0);
  const Tensor neg_coef = o.pos_weight.defined() ? mul(o.pos_weight, targets) : targets;
  const Tensor tail_w = o.pos_weight.defined() ? mul(add(mul(sub(o.pos_weight, 1.0), targets), 1.0), tail) : tail;
  Tensor loss = add(sub(mul(x_pos, 1.0 - targets), mul(x_neg, neg_coef)), tail_w);
  if (o.weight.defined()) loss = mul(loss, o.weight);
  return reduce(loss, o.reduction, op);
}

// ---------------- mean squared error ----------------

Tensor mse_loss(const Tensor& a, const Tensor& b, Reduction reduction) {
  const char* op = "mse_loss";
  check_defined(a, op, "a");
  check_defined(b, op, "b");
  check_float(a, op, "a");
  if (any_autocast_16bit({&a, &b})) return mse_loss(autocast::to_float32(a), autocast::to_float32(b), reduction);
  need_like(b, "b", a, "a", op);
  CF_CHECK(a.shape() == b.shape(), ShapeError, "[mse_loss] a ", a.describe(), " and b ",
           b.describe(), " must have the same shape");
  return reduce(square(sub(a, b)), reduction, op);
}

// ---------------- Chamfer distance ----------------

Tensor chamfer_distance(const Tensor& a, const Tensor& b, Reduction reduction) {
  const char* op = "chamfer_distance";
  check_defined(a, op, "a");
  check_defined(b, op, "b");
  check_float(a, op, "a");
  if (any_autocast_16bit({&a, &b}))
    return chamfer_distance(autocast::to_float32(a), autocast::to_float32(b), reduction);
  need_like(b, "b", a, "a", op);
  CF_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(2),
           ShapeError, "[chamfer_distance] point sets must be a (B, N, D) and b (B, M, D), got a ",
           a.describe(), " and b ", b.describe());
  CF_CHECK(a.size(0) > 0 && a.size(1) > 0 && b.size(1) > 0, ShapeError,
           "[chamfer_distance] empty batch or point set: a ", a.describe(), ", b ", b.describe());
  Tensor aa = sum(square(a), {2}, true);                 // (B, N, 1)
  Tensor bb = unsqueeze(sum(square(b), {2}), 1);         // (B, 1, M)
  Tensor ab = matmul(a, transpose(b, 1, 2));             // (B, N, M)
  Tensor d = clamp(add(sub(aa, mul(ab, 2.0)), bb), 0.0, std::numeric_limits<double>::infinity());
  Tensor per = add(mean(amin(d, {2}), {1}), mean(amin(d, {1}), {1}));  // (B)
  return reduce(per, reduction, op);
}

// ---------------- auxiliary losses ----------------

void AuxLosses::add(const std::string& name, const Tensor& loss) {
  CF_CHECK(!name.empty(), ValueError, "[AuxLosses::add] empty loss name");
  CF_CHECK(loss.defined(), ValueError, "[AuxLosses::add] loss '", name, "' is an undefined tensor");
  CF_CHECK(is_floating(loss.dtype()) && loss.numel() == 1, ValueError, "[AuxLosses::add] loss '",
           name, "' must be a float scalar, got ", loss.describe());
  losses_[name].push_back(loss.dim() == 0 ? loss : reshape(loss, Shape{}));
}

const std::vector<Tensor>& AuxLosses::get(const std::string& name) const {
  static const std::vector<Tensor> none;
  auto it = losses_.find(name);
  return it == losses_.end() ? none : it->second;
}

std::vector<std::string> AuxLosses::names() const {
  std::vector<std::string> out;
  for (const auto& kv : losses_) out.push_back(kv.first);
  return out;
}

Tensor AuxLosses::total(const std::map<std::string, double>& weights) const {
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& e : v) s += (s.empty() ? "" : ", ") + e;
    return s.empty() ? std::string("none") : s;
  };
  std::vector<std::string> given;
  for (const auto& kv : weights) given.push_back(kv.first);
  for (const auto& kv : losses_)
    CF_CHECK(weights.count(kv.first), ValueError, "[AuxLosses::total] no weight for aux loss '",
             kv.first, "' (weights given for: ", list(given), ")");
  for (const auto& kv : weights)
    CF_CHECK(losses_.count(kv.first), ValueError, "[AuxLosses::total] weight given for unknown aux loss '",
             kv.first, "' (collected: ", list(names()), ")");
  CF_CHECK(!losses_.empty(), ValueError, "[AuxLosses::total] no auxiliary loss was collected");
  Tensor out;
  DType dt = losses_.begin()->second.front().dtype();
  // One product per name, none for a weight of 1 (exact): each is a kernel call forward and
  // backward, a launch on the GPU (issue 25).
  for (const auto& kv : losses_) {
    Tensor group;
    for (const Tensor& l : kv.second) {
      CF_CHECK(l.dtype() == dt, DTypeError, "[AuxLosses::total] aux loss '", kv.first, "' is ",
               l.describe(), " but others are ", dt, "; cast with cf::to");
      group = group.defined() ? cf::add(group, l) : l;
    }
    const double wgt = weights.at(kv.first);
    // (a lone loss of weight 1 is multiplied all the same: the total is a new tensor, never the caller's)
    const bool lone = losses_.size() == 1 && kv.second.size() == 1;
    const Tensor term = wgt == 1.0 && !lone ? group : mul(group, wgt);
    out = out.defined() ? cf::add(out, term) : term;
  }
  return out;
}

}  // namespace nn
}  // namespace cf
