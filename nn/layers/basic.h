#pragma once
// Basic layers: Linear, Embedding, LayerNorm, Dropout, activations, Sequential.
// Constructors draw their initial weights from `gen` (default: the global generator).
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "nn/module.h"

namespace cf {
namespace nn {

// y = x W^T + b; W is (out, in) as in PyTorch, so weights move between the two as is.
// Init: W, b ~ U(-1/sqrt(in), 1/sqrt(in)) (PyTorch's default).
class Linear : public UnaryModule {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;  // (..., in) -> (..., out)
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  Tensor weight, bias;

 private:
  int64_t in_, out_;
};

// Rows of a (num, dim) table picked by int64 ids of any shape -> (..., dim).
// The padding row (padding_idx >= 0) starts at zero, outputs zero and gets no gradient.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, int64_t padding_idx = -1,
            Generator& gen = default_generator());
  Tensor forward(const Tensor& ids);
  Tensor operator()(const Tensor& ids) { return forward(ids); }
  int64_t num_embeddings() const { return num_; }
  int64_t dim() const { return dim_; }
  Tensor weight;

 private:
  int64_t num_, dim_, padding_idx_;
};

// Layer normalisation over the last axis, with learned scale (ones) and shift (zeros).
class LayerNorm : public UnaryModule {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;

 private:
  int64_t dim_;
  double eps_;
};

// Inverted dropout in training mode, identity in eval mode. Draws from `gen`,
// which must outlive the layer (default: the global generator).
class Dropout : public UnaryModule {
 public:
  explicit Dropout(double p, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;
  double p() const { return p_; }

 private:
  double p_;
  Generator* gen_;
};

class ReLU : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
};
class GELU : public UnaryModule {  // exact erf form
 public:
  Tensor forward(const Tensor& x) override;
};
class LeakyReLU : public UnaryModule {
 public:
  explicit LeakyReLU(double negative_slope = 0.01) : slope_(negative_slope) {}
  Tensor forward(const Tensor& x) override;

 private:
  double slope_;
};
class Tanh : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
};
class Sigmoid : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override;
};
class Identity : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override { return x; }
};

// "relu", "gelu", "leaky_relu" (slope 0.01, or "leaky_relu:0.2"), "tanh", "sigmoid", "identity".
std::shared_ptr<UnaryModule> make_activation(const std::string& name);

// Applies its layers in order; they are named "0", "1", ...
class Sequential : public UnaryModule {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<UnaryModule>> layers);
  Sequential& push_back(std::shared_ptr<UnaryModule> layer);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return layers_.size(); }
  UnaryModule& operator[](size_t i) const;

 private:
  std::vector<std::shared_ptr<UnaryModule>> layers_;
};

// Position-wise feed-forward block: Linear(d, d_ff) -> activation -> dropout -> Linear(d_ff, d).
class FeedForward : public UnaryModule {
 public:
  FeedForward(int64_t d_model, int64_t d_ff, const std::string& activation = "relu", double dropout = 0.0,
              Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> fc1, fc2;

 private:
  std::shared_ptr<UnaryModule> act_;
  std::shared_ptr<Dropout> drop_;
};

}  // namespace nn
}  // namespace cf
