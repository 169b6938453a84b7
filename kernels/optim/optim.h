#pragma once
// Fused optimizer steps: one pass over a parameter updates it and its state in
// place (Adam/AdamW: Kingma & Ba 2015, Algorithm 1, with L2 or decoupled weight
// decay, Loshchilov & Hutter 2019; SGD with momentum, dampening and Nesterov as
// PyTorch's). autograd/ops/optim.h owns validation. CPU arm optim_cpu.cpp, CUDA
// arm optim_cuda.cu. Every tensor float32/float64 of one dtype, contiguous, of
// one shape and on one device (a master's step: below).
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

// Many parameters' steps in one call, each exactly its single step's (its own constants: step
// count, lr, weight decay). On CUDA one launch per kStepBatch parameters, where a step per
// parameter was a launch of its own (a model's 35 parameters were 35 of its training step's ~210
// launches; issue 25).
//
// A 16-bit parameter steps its float32 master (mixed precision, nn/optim/optimizer.h): p is the
// master, g the parameter's bfloat16/float16 gradient, widened to float32 in registers, and `low`
// the 16-bit parameter, which receives the updated master rounded to nearest even. The same bits
// as widening g with to(), stepping the master and copy_ing it into the parameter, in one pass and
// without a float32 copy of the gradient. Without `low`, g has p's dtype.
inline constexpr int kStepBatch = 16;
struct AdamTensors {
  Tensor p, g, m, v;
  AdamStep s;
  Tensor low;  // the 16-bit parameter of the master p, or undefined
};
void adam_steps_cpu(const std::vector<AdamTensors>& steps);

struct SgdStep {
  double lr = 0, weight_decay = 0, momentum = 0, dampening = 0;
  bool nesterov = false;
  bool first = false;  // the first step: the momentum buffer starts at d
};
// d = g + wd p; buf = first ? d : momentum buf + (1 - dampening) d;
// p -= lr (nesterov ? d + momentum buf : buf). buf undefined: p -= lr d.
void sgd_step_cpu(const Tensor& p, const Tensor& g, const Tensor& buf, const SgdStep& s);
struct SgdTensors {
  Tensor p, g, buf;  // buf undefined without momentum
  SgdStep s;
  Tensor low;  // as AdamTensors::low
};
void sgd_steps_cpu(const std::vector<SgdTensors>& steps);

// sum_i g[i]^2 in double, in index order (gradient-norm clipping); CPU only: on
// CUDA autograd/ops/optim.cpp uses the reduction kernels.
double sum_squares_cpu(const Tensor& g);

#ifdef CF_WITH_CUDA
void adam_step_cuda(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const AdamStep& s);
void adam_steps_cuda(const std::vector<AdamTensors>& steps);
void sgd_step_cuda(const Tensor& p, const Tensor& g, const Tensor& buf, const SgdStep& s);
void sgd_steps_cuda(const std::vector<SgdTensors>& steps);
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
inline void sgd_steps(const std::vector<SgdTensors>& steps) {
  if (steps.empty()) return;
  CF_DEVICE_DISPATCH("sgd_step", steps.front().p.device(), sgd_steps_cpu(steps), sgd_steps_cuda(steps));
}

}  // namespace cf::kernels
