#pragma once
// Finite-difference gradient check, DESIGN.md section 4:
//  * float64 inputs, central differences with eps = 1e-6;
//  * pass when |analytic - numeric| <= atol + rtol * |numeric| (atol 1e-5, rtol 1e-3);
//  * scalar loss L = sum(w * f(x)) with a random w;
//  * the full Jacobian for small problems, random projections v^T J u for large ones;
//  * backward run twice gives bit-identical gradients; a zero grad_output gives zeros.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace cf {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
  // Full Jacobian when (input elements) x (output elements) is at most this.
  int64_t full_jacobian_max_entries = 4096;
  // Per-element gradient of L when the inputs have at most this many elements.
  int64_t elementwise_max_inputs = 2048;
  int num_projections = 3;  // random directions u for v^T J u
  uint64_t seed = 1234;     // for w and the projections
  bool check_repeat = true;  // backward twice -> bit-identical gradients
  bool check_zero_grad = true;
};

struct GradcheckResult {
  bool ok = true;
  std::string message;     // first failure, with op, input, index, analytic and numeric values
  double max_abs_error = 0;
  int64_t entries_checked = 0;
  std::string mode;        // "full-jacobian" or "weighted-gradient+projections"
  explicit operator bool() const { return ok; }
};

using GradcheckFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Checks d f / d inputs for every input that requires grad (they must be float64;
// others, such as index tensors, are passed through unchanged). f must be
// deterministic: random ops inside it need a fixed generator seed per call.
GradcheckResult gradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {});

}  // namespace cf
