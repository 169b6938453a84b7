#pragma once
// Fused optimizer steps: one pass over a parameter updates it and its state in
// place (Adam/AdamW: Kingma & Ba 2015, Algorithm 1, with L2 or decoupled weight
// decay, Loshchilov & Hutter 2019; SGD with momentum, dampening and Nesterov as
// PyTorch's). autograd/ops/optim.h owns validation. CPU arm optim_cpu.cpp, CUDA
// arm optim_cuda.cu. Every tensor float32/float64 of one dtype, contiguous, of
// one shape and on one device.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

struct AdamStep {
  double lr = 0, weight_decay = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  int64_t step = 1;        // t >= 1, for the bias corrections
  bool decoupled = false;  // AdamW: p *= 1 - lr * wd; Adam: g += wd * p
};
// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
void adam_step_cpu(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const AdamStep& s);

// Many parameters' Adam steps in one call, each exactly adam_step's (its own constants: step
// count, lr, weight decay). Every tensor of one device and one dtype. On CUDA one launch per
// kAdamBatch parameters, where a step per parameter was a launch of its own (a model's 35
// parameters were 35 of its training step's ~210 launches; issue 25).
struct AdamTensors {
  Tensor p, g, m, v;
  AdamStep s;
};
inline constexpr int kAdamBatch = 16;
void adam_steps_cpu(const std::vector<AdamTensors>& steps);

struct SgdStep {
  double lr = 0, weight_decay = 0, momentum = 0, dampening = 0;
  bool nesterov = false;
  bool first = false;  // the first step: the momentum buffer starts at d
};
// d = g + wd p; buf = first ? d : momentum buf + (1 - dampening) d;
// p -= lr (nesterov ? d + momentum buf : buf). buf undefined: p -= lr d.
void sgd_step_cpu(const Tensor& p, const Tensor& g, const Tensor& buf, const SgdStep& s);

// sum_i g[i]^2 in double, in index order (gradient-norm clipping); CPU only: on
// CUDA autograd/ops/optim.cpp uses the reduction kernels.
double sum_squares_cpu(const Tensor& g);

#ifdef CF_WITH_CUDA
void adam_step_cuda(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const AdamStep& s);
void adam_steps_cuda(const std::vector<AdamTensors>& steps);
void sgd_step_cuda(const Tensor& p, const Tensor& g, const Tensor& buf, const SgdStep& s);
#endif

inline void adam_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const AdamStep& s) {
  CF_DEVICE_DISPATCH("adam_step", p.device(), adam_step_cpu(p, g, m, v, s), adam_step_cuda(p, g, m, v, s));
}
inline void adam_steps(const std::vector<AdamTensors>& steps) {
  if (steps.empty()) return;
  CF_DEVICE_DISPATCH("adam_step", steps.front().p.device(), adam_steps_cpu(steps), adam_steps_cuda(steps));
}
inline void sgd_step(const Tensor& p, const Tensor& g, const Tensor& buf, const SgdStep& s) {
  CF_DEVICE_DISPATCH("sgd_step", p.device(), sgd_step_cpu(p, g, buf, s), sgd_step_cuda(p, g, buf, s));
}

}  // namespace cf::kernels
