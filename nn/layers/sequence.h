#pragma once
// Layers over token sequences (B, N, D): positional encodings and depthwise
// convolutions along the sequence (1-d) and over a square token grid (2-d).
#include <memory>
#include <mutex>

#include "core/rng.h"
#include "nn/module.h"

namespace cf {
namespace nn {

// Adds each token its position's row of a (max_len, dim) table. forward(x) gives token n
// position n; forward_at(x, positions) takes them per token ((B, N) int64, each in
// [0, max_len); on the device, an out-of-range one is index_select's deferred error), for
// inputs whose padding is not at the end, e.g. ClusterFormerQA's [question; context].
class PositionalEncoding : public UnaryModule {
 public:
  virtual Tensor forward_at(const Tensor& x, const Tensor& positions) = 0;
};

// x + PE[:N] with the fixed sinusoids of Vaswani et al. (2017), section 3.5:
// PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)).
// The table is a non-persistent buffer: it is not part of the state dict.
class SinusoidalPositionalEncoding : public PositionalEncoding {
 public:
  SinusoidalPositionalEncoding(int64_t max_len, int64_t dim);
  Tensor forward(const Tensor& x) override;  // (B, N, D) with N <= max_len
  Tensor forward_at(const Tensor& x, const Tensor& positions) override;
  Tensor table;                              // (max_len, dim), float32 (or the dtype to() gave it)

 private:
  int64_t max_len_, dim_;
  Tensor current_table();
  // The storage of the float64 table forward filled exactly (a weak reference: a table converted
  // since, which Module::to does in place with new storage, is refilled).
  std::weak_ptr<Storage> exact64_;
  std::mutex mu_;  // forwards in several threads on one model: one of them refills the table
};

// x + P[:N] with a learned table P ~ N(0, 0.02^2).
class LearnedPositionalEncoding : public PositionalEncoding {
 public:
  LearnedPositionalEncoding(int64_t max_len, int64_t dim, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;
  Tensor forward_at(const Tensor& x, const Tensor& positions) override;
  Tensor weight;  // (max_len, dim)

 private:
  int64_t max_len_, dim_;
};

// Depthwise convolution along the sequence axis of (B, N, C): each channel has its
// own kernel of `kernel_size` taps, no mixing between channels. With stride s and
// zero padding p on both ends, N_out = floor((N + 2p - k) / s) + 1. Used to
// down-sample tokens (e.g. the stride-2 centroid initialisation).
// weight (C, k) and bias (C), init U(-1/sqrt(k), 1/sqrt(k)) as PyTorch's Conv1d with groups = C.
class DepthwiseConv1d : public UnaryModule {
 public:
  DepthwiseConv1d(int64_t channels, int64_t kernel_size, int64_t stride = 1, int64_t padding = 0,
                  bool bias = true, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;
  int64_t output_length(int64_t n) const;
  Tensor weight, bias;

 private:
  int64_t channels_, kernel_, stride_, padding_;
};

// Depthwise 2-d convolution over the token grid: x (B, N = S*S, C) is read as an S x S
// image per channel; output (B, S' * S', C) in row-major grid order with
// S' = floor((S + 2p - k) / s) + 1. weight (C, k*k), bias (C). The paper's centroid
// initialisation for image tokens (section 3.4: kernel 3, stride 2, padding 1).
class DepthwiseConv2d : public UnaryModule {
 public:
  DepthwiseConv2d(int64_t channels, int64_t kernel_size, int64_t stride, int64_t padding, bool bias = true,
                  Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;
  int64_t output_side(int64_t side) const;
  Tensor weight, bias;

 private:
  int64_t channels_, kernel_, stride_, padding_;
};

}  // namespace nn
}  // namespace cf
