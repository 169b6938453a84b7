// Backward engine: dependency-counted reverse topological walk (Kahn's
// algorithm) from the root's node; gradients for one node are summed in a
// buffer before its backward runs, so each node runs once per backward call.
#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>

#include "autograd/autocast.h"
#include "autograd/hooks.h"
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

// ---- hooks (autograd/hooks.h) ----
namespace {
struct GradHook {
  std::weak_ptr<TensorImpl> leaf;  // the key's impl, to tell a reused address apart
  std::function<void(const Tensor&)> f;
};
struct HookTable {
  std::mutex m;
  std::atomic<int64_t> count{0};  // the engine's fast path: no hooks at all
  int64_t next_id = 1;
  std::multimap<const TensorImpl*, std::pair<int64_t, GradHook>> by_leaf;
};
HookTable& hooks() {
  static HookTable t;
  return t;
}
// The callbacks of the backward running on this thread (null outside one).
// Each with what to run instead when the backward ends by an exception before it (may be empty).
struct QueuedCallback {
  std::function<void()> run, abort;
};
thread_local std::vector<QueuedCallback>* t_callbacks = nullptr;

void run_grad_hooks(const Tensor& leaf) {
  HookTable& t = hooks();
  if (t.count.load(std::memory_order_relaxed) == 0) return;
  std::vector<std::function<void(const Tensor&)>> fs;
  {
    std::lock_guard<std::mutex> lock(t.m);
    auto range = t.by_leaf.equal_range(leaf.impl_ptr());
    std::vector<std::pair<int64_t, std::function<void(const Tensor&)>>> found;
    for (auto it = range.first; it != range.second; ++it)
      if (it->second.second.leaf.lock() == leaf.impl_shared()) found.emplace_back(it->second.first, it->second.second.f);
    std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& p : found) fs.push_back(std::move(p.second));
  }
  for (auto& f : fs) f(leaf);
}
}  // namespace

int64_t add_grad_accumulated_hook(const Tensor& leaf, std::function<void(const Tensor&)> f) {
  CF_CHECK(leaf.defined() && leaf.is_leaf() && leaf.requires_grad(), AutogradError,
           "[add_grad_accumulated_hook] needs a leaf tensor that requires grad, got ",
           leaf.defined() ? leaf.describe() : std::string("an undefined tensor"),
           leaf.defined() && !leaf.is_leaf() ? " (not a leaf)" : "");
  HookTable& t = hooks();
  std::vector<GradHook> dead;  // destroyed after the lock is released: a closure may own anything
  std::lock_guard<std::mutex> lock(t.m);
  // The hooks of leaves that died since are dropped here (each held its closure, and whatever that
  // captured, until remove_grad_hook: 500 hooks capturing 256 KB each leaked 128 MB).
  for (auto it = t.by_leaf.begin(); it != t.by_leaf.end();) {
    if (it->second.second.leaf.expired()) {
      dead.push_back(std::move(it->second.second));
      it = t.by_leaf.erase(it);
      t.count.fetch_sub(1);
    } else {
      ++it;
    }
  }
  int64_t id = t.next_id++;
  t.by_leaf.emplace(leaf.impl_ptr(), std::make_pair(id, GradHook{leaf.impl_shared(), std::move(f)}));
  t.count.fetch_add(1);
  return id;
}

void remove_grad_hook(int64_t id) {
  HookTable& t = hooks();
  std::lock_guard<std::mutex> lock(t.m);
  for (auto it = t.by_leaf.begin(); it != t.by_leaf.end(); ++it)
    if (it->second.first == id) {
      t.by_leaf.erase(it);
      t.count.fetch_sub(1);
      return;
    }
}

void queue_callback(std::function<void()> f, std::function<void()> on_abort) {
  CF_CHECK(t_callbacks != nullptr, AutogradError,
           "[queue_callback] only a hook running inside backward can queue a callback");
  t_callbacks->push_back({std::move(f), std::move(on_abort)});
}

Node::~Node() {
  // Move every edge target this node is the last owner of onto a stack, and each one's own such
  // targets before it dies, so destruction depth stays 1 however long the chain (PyTorch's
  // deleteNode does the same). A target someone else still holds is released at once, not when
  // the edge vector dies: an input used twice (t * t, h + tanh(h)) is held by two edges, and
  // the second one must see itself as the last owner.
  std::vector<std::shared_ptr<Node>> stack;
  auto take_unique = [&stack](std::vector<Edge>& edges) {
    for (Edge& e : edges) {
      if (!e.node) continue;
      if (e.node.use_count() == 1) stack.push_back(std::move(e.node));
      else e.node.reset();
    }
  };
  take_unique(next_edges);
  while (!stack.empty()) {
    std::shared_ptr<Node> n = std::move(stack.back());
    stack.pop_back();
    take_unique(n->next_edges);
  }  // n, now without unique children, is destroyed here
}

namespace {
std::shared_ptr<Node> accumulator_for(const Tensor& leaf) {
  TensorImpl* impl = leaf.impl_ptr();
  // Forwards in several threads may record ops on one leaf: its weak_ptr is read and set as one step.
  static std::mutex accumulator_mutex;
  std::lock_guard<std::mutex> lock(accumulator_mutex);
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
  // Callbacks queued by hooks during this backward (restored for a nested one).
  std::vector<QueuedCallback> callbacks;
  struct CallbackScope {
    std::vector<QueuedCallback>* mine;
    std::vector<QueuedCallback>* saved;
    size_t done = 0;  // callbacks run (or started) so far
    explicit CallbackScope(std::vector<QueuedCallback>* m) : mine(m), saved(t_callbacks) { t_callbacks = m; }
    ~CallbackScope() {
      t_callbacks = saved;
      // An exception ended this backward: the callbacks that did not run hear of it (DDP resets the
      // reduction it began; it waited for a finish() that never came and stopped averaging).
      for (size_t i = done; i < mine->size(); ++i)
        if ((*mine)[i].abort) {
          try {
            (*mine)[i].abort();
          } catch (...) {  // already unwinding: an abort handler cannot fail the backward twice
          }
        }
    }
  } callback_scope(&callbacks);

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
      Tensor leaf(n->leaf);
      // A leaf frozen (requires_grad_(false)) after the forward gets no gradient, as in PyTorch:
      // an optimizer would otherwise still move it.
      if (!gn.defined() || !leaf.requires_grad()) continue;
      {
        // Backward passes in several threads may reach one leaf (a shared parameter): the
        // read-add-store of its .grad is one step, or one thread's gradient is lost.
        static std::mutex leaf_grad_mutex;
        std::lock_guard<std::mutex> lock(leaf_grad_mutex);
        Tensor old = leaf.grad();
        // Accumulate out of place: a gradient handed to the user is never changed later.
        leaf.set_grad(old.defined() ? add(old, gn) : clone(gn));
      }
      run_grad_hooks(leaf);
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
  // A callback may queue another (index loop: the vector may grow).
  for (size_t i = 0; i < callbacks.size(); ++i) {
    auto f = std::move(callbacks[i].run);
    callback_scope.done = i + 1;
    f();
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
