#pragma once
// Seeded parameter initialisers. Each overwrites t in place (under no-grad) with
// values drawn from `gen`, so a model built twice from one seed is identical.
// Fans follow PyTorch: for a weight of shape (out, in, k...) fan_in = in * k...,
// fan_out = out * k...; a 1-d tensor has fan_in = fan_out = its length.
#include "core/rng.h"
#include "core/tensor.h"

namespace cf {
namespace nn {
namespace init {

void zeros_(Tensor& t);
void ones_(Tensor& t);
void constant_(Tensor& t, double value);
void uniform_(Tensor& t, double low, double high, Generator& gen = default_generator());
void normal_(Tensor& t, double mean, double std, Generator& gen = default_generator());
// Glorot: U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)); normal std = gain * sqrt(2 / (fan_in + fan_out)).
void xavier_uniform_(Tensor& t, double gain = 1.0, Generator& gen = default_generator());
void xavier_normal_(Tensor& t, double gain = 1.0, Generator& gen = default_generator());
// He, fan_in mode, gain sqrt(2 / (1 + a^2)) for a leaky ReLU of slope a (a = 0: ReLU).
void kaiming_uniform_(Tensor& t, double a = 0.0, Generator& gen = default_generator());
void kaiming_normal_(Tensor& t, double a = 0.0, Generator& gen = default_generator());

struct Fans {
  int64_t in, out;
};
Fans fans(const Tensor& t);

}  // namespace init
}  // namespace nn
}  // namespace cf
