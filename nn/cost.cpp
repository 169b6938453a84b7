#include "nn/cost.h"

#include <unordered_set>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/op_names.h"
#include "core/error.h"
#include "core/rng.h"

namespace cf {
namespace nn {

namespace {
thread_local int64_t* g_selection = nullptr;
}

void report_macs(int64_t macs) {
  if (g_selection) *g_selection += macs;
}

int64_t graph_macs(const std::vector<Tensor>& outputs) {
  std::unordered_set<const autograd::Node*> seen;
  std::vector<const autograd::Node*> stack;
  for (const Tensor& t : outputs)
    if (t.defined() && t.grad_fn()) stack.push_back(t.grad_fn().get());
  int64_t macs = 0;
  while (!stack.empty()) {
    const autograd::Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    if (std::string(n->name) == opname::matmul && n->next_edges.size() == 2) {
      // The contracted length is a's last axis (1-d operands included).
      const Shape& a = n->next_edges[0].shape;
      CF_CHECK(!a.empty(), ValueError, "[graph_macs] matmul node with a 0-d operand");
      macs += numel_of(n->output_shape) * a[a.size() - 1];
    }
    macs += n->forward_macs;
    for (const autograd::Edge& e : n->next_edges)
      if (e.node) stack.push_back(e.node.get());
  }
  return macs;
}

Cost measure_cost(Module& module, const std::function<std::vector<Tensor>()>& forward) {
  CF_CHECK(bool(forward), ValueError, "[measure_cost] forward is empty");
  const bool was_training = module.is_training();
  std::vector<Tensor> params = module.parameters();
  std::vector<bool> had_grad;
  for (Tensor& p : params) {
    had_grad.push_back(p.requires_grad());
    if (is_floating(p.dtype())) p.set_requires_grad(true);
  }
  module.eval();
  Cost c;
  c.params = module.num_parameters();
  try {
    // Grad mode on and the selection counter active, both restored on exit; so is the default generator,
    // which a forward may draw from (random centroid seeds, LSH rotations): a cost taken between two
    // seeded runs changed the second one's draws (cf-pointcloud's second seed differed with the list).
    // (Draws made meanwhile by other threads are rewound with it: measure costs from one thread.)
    struct Scope {
      bool prev = grad_enabled();
      int64_t* prev_sel = g_selection;
      std::pair<uint64_t, uint64_t> rng = default_generator().state();
      explicit Scope(int64_t* sel) {
        set_grad_enabled(true);
        g_selection = sel;
      }
      ~Scope() {
        set_grad_enabled(prev);
        g_selection = prev_sel;
        default_generator().set_state(rng.first, rng.second);
      }
    } scope(&c.selection_macs);
    c.macs = graph_macs(forward()) + c.selection_macs;
  } catch (...) {
    for (size_t i = 0; i < params.size(); ++i) params[i].set_requires_grad(had_grad[i]);
    module.train(was_training);
    throw;
  }
  for (size_t i = 0; i < params.size(); ++i) params[i].set_requires_grad(had_grad[i]);
  module.train(was_training);
  return c;
}

}  // namespace nn
}  // namespace cf
