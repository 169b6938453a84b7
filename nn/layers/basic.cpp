#include "autograd/autocast.h"
#include "nn/layers/basic.h"

#include <cmath>

#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/nn_functional.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "core/error.h"
#include "nn/init.h"

namespace cf {
namespace nn {

namespace {
void check_input(const char* layer, const Tensor& x) {
  CF_CHECK(x.defined(), ValueError, "[", layer, "] input is undefined");
}
}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias, Generator& gen)
    : in_(in_features), out_(out_features) {
  CF_CHECK(in_features > 0 && out_features > 0, ValueError, "[Linear] features must be positive, got in=",
           in_features, " out=", out_features);
  weight = Tensor::empty({out_, in_});
  double bound = 1.0 / std::sqrt(double(in_));
  init::uniform_(weight, -bound, bound, gen);
  register_parameter("weight", &weight);
  if (with_bias) {
    bias = Tensor::empty({out_});
    init::uniform_(bias, -bound, bound, gen);
    register_parameter("bias", &bias);
  }
}

Tensor Linear::forward(const Tensor& x) {
  check_input("Linear", x);
  CF_CHECK(x.dim() >= 1 && x.shape().back() == in_, ShapeError, "[Linear] expected input (..., ", in_,
           "), got ", shape_str(x.shape()));
  // Under autocast the product casts its operands and the bias to the low dtype (autograd/autocast.h),
  // so the layer's output is in the low dtype as in PyTorch.
  CF_CHECK(autocast_dtype() || x.dtype() == weight.dtype(), DTypeError, "[Linear] input is ", x.dtype(),
           " but weights are ", weight.dtype());
  return linear(x, weight, bias);
}

Embedding::Embedding(int64_t num_embeddings, int64_t dim, int64_t padding_idx, Generator& gen)
    : num_(num_embeddings), dim_(dim), padding_idx_(padding_idx) {
  CF_CHECK(num_ > 0 && dim_ > 0, ValueError, "[Embedding] sizes must be positive, got num_embeddings=", num_,
           " dim=", dim_);
  CF_CHECK(padding_idx >= -1 && padding_idx < num_, ValueError, "[Embedding] padding_idx ", padding_idx,
           " out of range for ", num_, " embeddings (-1: none)");
  weight = Tensor::empty({num_, dim_});
  init::normal_(weight, 0.0, 1.0, gen);
  if (padding_idx_ >= 0) {
    Tensor row = narrow(weight, 0, padding_idx_, 1);
    init::zeros_(row);
  }
  register_parameter("weight", &weight);
}

Tensor Embedding::forward(const Tensor& ids) {
  check_input("Embedding", ids);
  CF_CHECK(ids.dtype() == kInt64, DTypeError, "[Embedding] ids must be int64, got ", ids.dtype());
  Tensor flat = reshape(ids, {ids.numel()});
  Tensor rows;
  try {
    rows = index_select(weight, 0, flat);  // checks every id
  } catch (const IndexError& e) {
    throw IndexError(str("[Embedding] ids ", shape_str(ids.shape()), " for ", num_, " embeddings: ", e.what()));
  }
  if (padding_idx_ >= 0) {
    // Zero rows for padding ids, so the padding row neither contributes nor learns.
    Tensor keep = cf::to(reshape(ne(flat, double(padding_idx_)), {flat.numel(), 1}), weight.dtype());
    rows = rows * keep;
  }
  Shape out = ids.shape();
  out.push_back(dim_);
  return reshape(rows, out);
}

LayerNorm::LayerNorm(int64_t dim, double eps, bool affine) : dim_(dim), eps_(eps) {
  CF_CHECK(dim > 0, ValueError, "[LayerNorm] dim must be positive, got ", dim);
  CF_CHECK(eps > 0, ValueError, "[LayerNorm] eps must be positive, got ", eps);
  if (affine) {
    weight = Tensor::ones({dim});
    bias = Tensor::zeros({dim});
    register_parameter("weight", &weight);
    register_parameter("bias", &bias);
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  check_input("LayerNorm", x);
  CF_CHECK(x.dim() >= 1 && x.shape().back() == dim_, ShapeError, "[LayerNorm] expected input (..., ", dim_,
           "), got ", shape_str(x.shape()));
  return layer_norm(x, {dim_}, weight, bias, eps_);
}

Dropout::Dropout(double p, Generator& gen) : p_(p), gen_(&gen) {
  CF_CHECK(p >= 0.0 && p < 1.0, ValueError, "[Dropout] p must be in [0, 1), got ", p);
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p_ == 0.0) return x;
  return dropout(x, p_, true, *gen_);
}

Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor GELU::forward(const Tensor& x) { return gelu(x); }
Tensor LeakyReLU::forward(const Tensor& x) { return leaky_relu(x, slope_); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }
Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }

std::shared_ptr<UnaryModule> make_activation(const std::string& name) {
  if (name == "relu") return std::make_shared<ReLU>();
  if (name == "gelu") return std::make_shared<GELU>();
  if (name == "tanh") return std::make_shared<Tanh>();
  if (name == "sigmoid") return std::make_shared<Sigmoid>();
  if (name == "identity") return std::make_shared<Identity>();
  if (name == "leaky_relu") return std::make_shared<LeakyReLU>();
  const std::string prefix = "leaky_relu:";
  if (name.compare(0, prefix.size(), prefix) == 0) {
    std::string num = name.substr(prefix.size());
    size_t used = 0;
    double slope = 0;
    try {
      slope = std::stod(num, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    CF_CHECK(used == num.size() && used > 0 && std::isfinite(slope), ValueError, "[make_activation] bad slope in '",
             name, "' (a finite number)");
    return std::make_shared<LeakyReLU>(slope);
  }
  throw ValueError(str("[make_activation] unknown activation '", name,
                       "' (known: relu, gelu, leaky_relu, leaky_relu:<slope>, tanh, sigmoid, identity)"));
}

Sequential::Sequential(std::vector<std::shared_ptr<UnaryModule>> layers) {
  for (auto& l : layers) push_back(std::move(l));
}

Sequential& Sequential::push_back(std::shared_ptr<UnaryModule> layer) {
  CF_CHECK(layer != nullptr, ValueError, "[Sequential] layer ", layers_.size(), " is null");
  register_module(std::to_string(layers_.size()), layer);
  layers_.push_back(std::move(layer));
  return *this;
}

UnaryModule& Sequential::operator[](size_t i) const {
  CF_CHECK(i < layers_.size(), IndexError, "[Sequential] layer ", i, " out of range for ", layers_.size(), " layers");
  return *layers_[i];
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& l : layers_) h = l->forward(h);
  return h;
}

FeedForward::FeedForward(int64_t d_model, int64_t d_ff, const std::string& activation, double p,
                         Generator& gen) {
  fc1 = register_module("fc1", std::make_shared<Linear>(d_model, d_ff, true, gen));
  act_ = register_module("activation", make_activation(activation));  // no state: listed in named_modules
  // Dropout draws from the global generator: `gen` is for initial weights and may not outlive us.
  drop_ = register_module("dropout", std::make_shared<Dropout>(p));
  fc2 = register_module("fc2", std::make_shared<Linear>(d_ff, d_model, true, gen));
}

Tensor FeedForward::forward(const Tensor& x) { return fc2->forward(drop_->forward(act_->forward(fc1->forward(x)))); }

}  // namespace nn
}  // namespace cf
