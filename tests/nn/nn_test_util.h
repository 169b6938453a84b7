#pragma once
// Gradient checks of whole modules: the module's parameters join the inputs of
// cf::gradcheck, and each evaluation installs the (perturbed) values with
// Module::set_parameters.
#include <functional>

#include "cf.h"
#include "test_util.h"

namespace cf::test {

// f(xs) computes the module's output from the non-parameter inputs xs. The module
// must already be float64 (module.to(kFloat64)) and in eval mode if it has dropout.
inline void check_module_grad(nn::Module& m, const std::function<Tensor(const std::vector<Tensor>&)>& f,
                              const std::vector<Tensor>& xs, const GradcheckOptions& opt = {}) {
  std::vector<Tensor> params = m.parameters();
  std::vector<Tensor> inputs = xs;
  inputs.insert(inputs.end(), params.begin(), params.end());
  const size_t nx = xs.size();
  auto g = [&](const std::vector<Tensor>& all) {
    m.set_parameters(std::vector<Tensor>(all.begin() + long(nx), all.end()));
    return f(std::vector<Tensor>(all.begin(), all.begin() + long(nx)));
  };
  GradcheckResult r = gradcheck(g, inputs, opt);
  m.set_parameters(params);
  CHECK_MESSAGE(r.ok, r.message);
  CHECK(r.entries_checked > 0);
}

}  // namespace cf::test
