// Backward engine: dependency-counted reverse topological walk (Kahn's
// algorithm) from the root's node; gradients for one node are summed in a
// buffer before its backward runs, so each node runs once per backward call.
#include <deque>
#include <unordered_map>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/shape.h"

namespace cf {

namespace {
thread_local bool g_grad_enabled = true;
}
bool grad_enabled() { return g_grad_enabled; }
void set_grad_enabled(bool on) { g_grad_enabled = on; }

void Tensor::backward(const Tensor& grad_output, bool retain_graph) const {
  autograd::run_backward(*this, grad_output, retain_graph);
}

namespace autograd {

SavedTensor::SavedTensor(const Tensor& t) {
  if (t.defined()) {
    t_ = t.detach();
    version_ = t.version();
  }
}

Tensor SavedTensor::unpack(const char* op) const {
  if (t_.defined() && t_.version() != version_)
    throw AutogradError(str("[backward] a tensor ", t_.describe(), " saved by '", op,
                            "' for backward was modified in place afterwards (version ",
                            t_.version(), ", saved at version ", version_, ")"));
  return t_;
}

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}
bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

namespace {
std::shared_ptr<Node> accumulator_for(const Tensor& leaf) {
  TensorImpl* impl = leaf.impl_ptr();
  if (auto n = impl->grad_accumulator.lock()) return n;
  auto n = std::make_shared<Node>();
  n->name = "accumulate_grad";
  n->leaf = leaf.impl_shared();
  n->output_shape = leaf.shape();
  n->output_dtype = leaf.dtype();
  n->output_device = leaf.device();
  impl->grad_accumulator = n;
  return n;
}

std::shared_ptr<Node> node_of(const Tensor& t) {
  return t.is_leaf() ? accumulator_for(t) : t.grad_fn();
}
}  // namespace

namespace {
template <typename Range>
void record_impl(const char* name, const Range& inputs, Tensor& output, BackwardFn fn) {
  CF_CHECK(is_floating(output.dtype()), AutogradError, "[", name,
           "] internal error: a ", output.dtype(), " output cannot carry a gradient");
  auto n = std::make_shared<Node>();
  n->name = name;
  n->backward = std::move(fn);
  n->next_edges.resize(inputs.size());
  size_t i = 0;
  for (const Tensor& t : inputs) {
    Edge& e = n->next_edges[i++];
    if (!t.defined()) continue;
    e.shape = t.shape();
    if (t.requires_grad()) e.node = node_of(t);
  }
  n->output_shape = output.shape();
  n->output_dtype = output.dtype();
  n->output_device = output.device();
  TensorImpl* impl = output.impl_ptr();
  impl->grad_fn = std::move(n);
  impl->requires_grad = true;
}
}  // namespace

void record(const char* name, std::initializer_list<Tensor> inputs, Tensor& output, BackwardFn fn) {
  record_impl(name, inputs, output, std::move(fn));
}
void record(const char* name, const std::vector<Tensor>& inputs, Tensor& output, BackwardFn fn) {
  record_impl(name, inputs, output, std::move(fn));
}

void run_backward(const Tensor& root, const Tensor& grad_output, bool retain_graph) {
  CF_CHECK(root.defined(), AutogradError, "[backward] called on an undefined tensor");
  if (!root.requires_grad()) {
    throw AutogradError(str("[backward] tensor ", root.describe(), " does not require grad: ",
                            is_floating(root.dtype())
                                ? "no input of its computation requires grad"
                                : "outputs of this dtype (indices, masks, ids) are not differentiable"));
  }
  Tensor g = grad_output;
  if (!g.defined()) {
    CF_CHECK(root.numel() == 1, AutogradError,
             "[backward] grad_output may be omitted only for a one-element tensor; got shape ",
             shape_str(root.shape()));
    g = ones_like(root);
  } else {
    CF_CHECK(g.shape() == root.shape() && g.dtype() == root.dtype() && g.device() == root.device(),
             AutogradError, "[backward] grad_output ", g.describe(), " does not match tensor ",
             root.describe());
  }

  NoGradGuard no_grad;
  AutocastGuard no_autocast(std::nullopt);  // backward ops run in their forward's dtypes
  std::shared_ptr<Node> root_node = node_of(root);

  // Count, for every reachable node, how many edges point at it.
  std::unordered_map<Node*, int> deps;
  {
    std::vector<Node*> stack{root_node.get()};
    deps[root_node.get()] = 0;
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->next_edges) {
        if (!e.node) continue;
        auto it = deps.find(e.node.get());
        if (it == deps.end()) {
          deps[e.node.get()] = 1;
          stack.push_back(e.node.get());
        } else {
          ++it->second;
        }
      }
    }
  }

  std::unordered_map<Node*, Tensor> buffer;
  buffer[root_node.get()] = g;
  std::deque<Node*> ready{root_node.get()};
  while (!ready.empty()) {
    Node* n = ready.front();
    ready.pop_front();
    Tensor gn = buffer[n];
    buffer.erase(n);

    if (n->leaf) {
      if (!gn.defined()) continue;
      Tensor leaf(n->leaf);
      Tensor old = leaf.grad();
      // Accumulate out of place: a gradient handed to the user is never changed later.
      leaf.set_grad(old.defined() ? add(old, gn) : clone(gn));
      continue;
    }
    if (n->released)
      throw AutogradError(str("[backward] the graph through '", n->name,
                              "' was already freed by an earlier backward; pass retain_graph=true "
                              "to the first backward to run it again"));

    std::vector<Tensor> grads;
    if (gn.defined()) {
      grads = n->backward(gn);
      CF_CHECK(grads.size() == n->next_edges.size(), AutogradError, "[backward] node '", n->name,
               "' returned ", grads.size(), " gradients for ", n->next_edges.size(), " inputs");
    } else {
      grads.resize(n->next_edges.size());  // no gradient reached this node: nothing flows on
    }
    for (size_t i = 0; i < grads.size(); ++i) {
      Node* next = n->next_edges[i].node.get();
      if (!next) continue;
      if (grads[i].defined()) {
        CF_CHECK(grads[i].shape() == n->next_edges[i].shape, AutogradError, "[backward] node '",
                 n->name, "' returned a gradient of shape ", shape_str(grads[i].shape()),
                 " for input ", i, " of shape ", shape_str(n->next_edges[i].shape));
        Tensor& slot = buffer[next];
        slot = slot.defined() ? add(slot, grads[i]) : grads[i];
      }
      if (--deps[next] == 0) ready.push_back(next);
    }
    if (!retain_graph) {
      n->backward = nullptr;  // frees the saved tensors
      n->released = true;
    }
  }
}

std::vector<const char*> graph_node_names(const Tensor& t) {
  std::vector<const char*> names;
  if (!t.defined() || !t.grad_fn()) return names;
  std::unordered_map<Node*, bool> seen;
  std::vector<Node*> stack{t.grad_fn().get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (seen[n]) continue;
    seen[n] = true;
    names.push_back(n->name);
    for (const Edge& e : n->next_edges)
      if (e.node) stack.push_back(e.node.get());
  }
  return names;
}

}  // namespace autograd
}  // namespace cf
