#pragma once
// Random tensors from the counter-based Philox generator (core/rng.h). Element i
// of a call uses counter (generator offset + i), so a seed gives the same stream
// on every device and thread count.
#include "core/rng.h"
#include "core/tensor.h"

namespace cf {

// Uniform in [low, high).
Tensor rand(const Shape& shape, DType dtype = kFloat32, Generator& gen = default_generator(),
            double low = 0.0, double high = 1.0, Device device = Device::cpu());
// Normal(mean, std).
Tensor randn(const Shape& shape, DType dtype = kFloat32, Generator& gen = default_generator(),
             double mean = 0.0, double std = 1.0, Device device = Device::cpu());
// Integers uniform in [low, high), int64.
Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator& gen = default_generator(),
               Device device = Device::cpu());
// Bool tensor, each element true with probability p in [0, 1].
Tensor bernoulli(const Shape& shape, double p, Generator& gen = default_generator(),
                 Device device = Device::cpu());

}  // namespace cf
