#pragma once
// Gradient utilities for a training loop: global-norm clipping and scaling.
//
// Both replace each gradient with a new tensor (p.set_grad(g * c)) instead of
// writing into it: a gradient handed out earlier is never changed behind the
// caller's back, and a broadcast (stride-0) gradient from the engine is safe.
//
// Gradient accumulation: the engine already sums gradients over backward()
// calls. To train on a batch in k micro-batches and get the gradient of the
// full-batch mean loss, either scale each micro-batch loss by 1/k before its
// backward(), or call scale_grads(params, 1.0 / k) once before step(). (With
// Reduction::Mean and micro-batches of unequal size, weight each micro-batch
// loss by its share of the batch instead.)
#include <vector>

#include "core/tensor.h"
#include "nn/state_dict.h"

namespace cf {
namespace nn {

// The p-norm of all defined gradients taken as one vector, accumulated in double: sqrt(sum of squares) for
// norm_type 2, (sum |g|^p)^(1/p) for another p > 0, max |g| for p = inf (PyTorch's norm_type);
// parameters without a gradient are skipped (0 when none has one). ValueError for a p <= 0 or NaN.
double grad_norm(const std::vector<Tensor>& params, double norm_type = 2.0);
double grad_norm(const StateDict& params, double norm_type = 2.0);

// Scales every gradient by max_norm / (norm + 1e-6) when that is below 1, as
// PyTorch's clip_grad_norm_ does, and returns the norm (of norm_type, as grad_norm) before clipping.
// A non-finite norm (a NaN or inf gradient) leaves the gradients unchanged and is
// returned, so the caller can skip the step; with error_if_nonfinite it throws
// ValueError instead. max_norm must be > 0 (inf means "measure only").
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm,
                      bool error_if_nonfinite = false, double norm_type = 2.0);
double clip_grad_norm(const StateDict& params, double max_norm, bool error_if_nonfinite = false,
                      double norm_type = 2.0);

// The same two without a host read (a CUDA training step, or one a CUDA graph captures): the norm
// comes back as a 0-d float64 tensor on the gradients' device (all on one device; 0 on the first
// parameter's when none has a gradient), and the clipping factor min(1, max_norm / (norm + 1e-6))
// is applied on the device, 1 when the norm is not finite (the gradients left unchanged; read the
// norm to stop). On CUDA the numbers are the double-returning functions': the same reductions,
// added in the same order on the device instead of the host. On the CPU those sum squares in index
// order where these use the sum reduction, so the two may differ in the last bits there. The norm
// is the plain power sum: a float64 gradient norm beyond about 1e154 comes out inf (grad_norm
// rescales such gradients on the host first); float32 and 16-bit gradients never reach that.
Tensor grad_norm_tensor(const std::vector<Tensor>& params, double norm_type = 2.0);
Tensor clip_grad_norm_tensor(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

// Multiplies every defined gradient by factor (e.g. 1/k after k accumulated micro-batches).
void scale_grads(const std::vector<Tensor>& params, double factor);
void scale_grads(const StateDict& params, double factor);

}  // namespace nn
}  // namespace cf
