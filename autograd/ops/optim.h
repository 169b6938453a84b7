#pragma once
// Fused optimizer steps in place (kernels/optim): one pass per parameter on its
// device, for float32/float64 parameters whose tensors are contiguous. Not
// differentiable and recorded nowhere (optimizers run under no autograd); each
// bumps the versions of the tensors it writes.
#include "core/tensor.h"
#include "kernels/optim/optim.h"

namespace cf::ops {

using AdamStep = kernels::AdamStep;
using SgdStep = kernels::SgdStep;

// Whether the fused steps take p (float32/float64, contiguous; optimizers keep
// 16-bit parameters as float32 masters); otherwise they compose the same update
// from elementwise ops.
bool fused_step_supported(const Tensor& p);

// sum of g's squared entries in double (reads the value to the host: the
// caller asked for it). Contiguous float32/float64 CPU tensors are summed in
// index order; others through the reduction ops in float64.
double sum_squares(const Tensor& g);

// Adam/AdamW on p with gradient g and moments m, v (all p's shape, dtype, device;
// g may be strided).
void adam_step_(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const AdamStep& s);
// adam_step_ on each of `steps` (their g may be strided), the same results, in one kernel call per
// (device, dtype) run of parameters: on CUDA a launch per 16 parameters instead of one each. The
// entries must not share memory with one another (on CUDA they are updated at once): the
// optimizers' update_all steps such entries one by one. Every entry is checked before any is
// written. An entry with `low` steps a 16-bit parameter's float32 master p from the parameter's
// gradient g and rounds the result into low (kernels/optim/optim.h).
void adam_steps_(std::vector<kernels::AdamTensors> steps);
// SGD on p with gradient g and momentum buffer buf (undefined without momentum).
void sgd_step_(const Tensor& p, const Tensor& g, const Tensor& buf, const SgdStep& s);
// sgd_step_ on each of `steps`, batched and checked as adam_steps_.
void sgd_steps_(std::vector<kernels::SgdTensors> steps);

}  // namespace cf::ops
