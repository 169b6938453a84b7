// Backward engine: dependency-counted reverse topological walk (Kahn's
// algorithm) from the root's node; gradients for one node are summed in a
// buffer before its backward runs, so each node runs once per backward call.
#include <algorithm>
#include <atomic>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <unordered_map>

#include "autograd/autocast.h"
#include "autograd/hooks.h"
#include "autograd/node.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/shape.h"
#include "core/cuda_graph.h"

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

namespace {
// The entry point of the pass running on this thread, for its errors: "backward" or "grad".
thread_local const char* t_pass = "backward";
}  // namespace

SavedTensor::SavedTensor(const Tensor& t) {
  if (t.defined()) {
    t_ = t.detach();
    version_ = t.version();
  }
}

Tensor SavedTensor::unpack(const char* op) const {
  if (t_.defined() && t_.version() != version_)
    throw AutogradError(str("[", t_pass, "] a tensor ", t_.describe(), " saved by '", op,
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
  n->backward = std::make_shared<const BackwardFn>(std::move(fn));
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

namespace {
// The gradient given for a root (or ones for an omitted one), checked against it.
Tensor root_gradient(const Tensor& root, const Tensor& grad_output, const char* op) {
  CF_CHECK(root.defined(), AutogradError, "[", op, "] called on an undefined tensor");
  if (!root.requires_grad()) {
    throw AutogradError(str("[", op, "] tensor ", root.describe(), " does not require grad: ",
                            is_floating(root.dtype())
                                ? "no input of its computation requires grad"
                                : "outputs of this dtype (indices, masks, ids) are not differentiable"));
  }
  if (!grad_output.defined()) {
    CF_CHECK(root.numel() == 1, AutogradError, "[", op,
             "] grad_output may be omitted only for a one-element tensor; got shape ", shape_str(root.shape()));
    return ones_like(root);
  }
  CF_CHECK(grad_output.shape() == root.shape() && grad_output.dtype() == root.dtype() &&
               grad_output.device() == root.device(),
           AutogradError, "[", op, "] grad_output ", grad_output.describe(), " does not match tensor ",
           root.describe());
  return grad_output;
}

// True when g is a dense gradient no one else can see: its tensor and its memory are held by the
// caller alone (not a saved tensor, another leaf's gradient, a hook's capture, the user's grad_output,
// a shared number constant, a view of a larger buffer) and the memory is cf's own (not borrowed
// through DLPack). Such a gradient can become a leaf's .grad as it is, where a copy was a kernel
// call per parameter and step (35 of a 2-layer encoder's 175; PyTorch's AccumulateGrad steals too).
bool stealable(const Tensor& g) {
  const TensorImpl& i = *g.impl_ptr();
  return g.impl_shared().use_count() == 1 && i.storage && i.storage.use_count() == 1 && !i.storage->release &&
         !i.grad_fn && !i.requires_grad && i.offset == 0 && g.is_contiguous() &&
         static_cast<size_t>(g.numel()) * dtype_size(g.dtype()) == i.storage->nbytes;
}

// Accumulates g into t's .grad out of place (a gradient handed to the user is never changed later).
// A g the caller gives up (moves in) and no one else holds is taken without a copy (stealable).
void accumulate_into(const Tensor& t, Tensor g) {
  // Backward passes in several threads may reach one leaf (a shared parameter): the read-add-store of
  // its .grad is one step, or one thread's gradient is lost.
  static std::mutex grad_mutex;
  std::lock_guard<std::mutex> lock(grad_mutex);
  Tensor old = t.grad();
  if (old.defined()) {
    // (a CUDA graph replay would add to the gradient as it was at the capture, not as the last step left it)
    CF_CHECK(!cuda::made_before_capture(old), DeviceError,
             "[backward] accumulates into a .grad made before this CUDA graph capture (", old.describe(),
             "): call zero_grad inside the captured step");
    t.set_grad(add(old, g));
  } else if (stealable(g)) {
    t.set_grad(g);
  } else {
    t.set_grad(clone(g));
  }
}

// The engine: runs the graph below `roots` (node, gradient; a node twice sums). Without `capture`
// (backward): leaves accumulate into .grad and their hooks run. With it (autograd::grad): the gradient
// reaching each captured node is stored at its index in `captured`, no leaf changes, and only the nodes
// from which a captured node can be reached run.
void run_graph(const std::vector<std::pair<std::shared_ptr<Node>, Tensor>>& roots, bool retain_graph,
               const std::unordered_map<Node*, size_t>* capture, std::vector<Tensor>* captured) {
  NoGradGuard no_grad;
  AutocastGuard no_autocast(std::nullopt);  // backward ops run in their forward's dtypes
  struct PassName {  // (restored for a backward nested in a hook)
    const char* saved = t_pass;
    explicit PassName(const char* name) { t_pass = name; }
    ~PassName() { t_pass = saved; }
  } pass_name(capture ? "grad" : "backward");
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
    std::vector<Node*> stack;
    for (const auto& r : roots)
      if (deps.emplace(r.first.get(), 0).second) stack.push_back(r.first.get());
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
  // With a capture: the nodes with a captured node below them (the others need not run their backward).
  std::unordered_map<Node*, bool> leads;
  if (capture) {
    std::unordered_map<Node*, bool> reaches;  // captured, or leads to one
    std::vector<Node*> post;                   // children before parents
    {
      std::unordered_map<Node*, bool> seen;
      std::vector<std::pair<Node*, size_t>> stack;  // (node, next edge to visit)
      for (const auto& r : roots) {
        if (!seen.emplace(r.first.get(), true).second) continue;
        stack.emplace_back(r.first.get(), 0);
        while (!stack.empty()) {
          Node* n = stack.back().first;
          const size_t i = stack.back().second++;
          if (i < n->next_edges.size()) {
            Node* next = n->next_edges[i].node.get();
            if (next && seen.emplace(next, true).second) stack.emplace_back(next, 0);
            continue;
          }
          post.push_back(n);
          stack.pop_back();
        }
      }
    }
    for (Node* n : post) {
      bool below = false;
      for (const Edge& e : n->next_edges)
        if (e.node && reaches[e.node.get()]) below = true;
      leads[n] = below;
      reaches[n] = below || capture->count(n) > 0;
    }
  }

  // The nodes this pass frees. Should it fail further on, they stay freed and the leaves it reached keep
  // their gradients (PyTorch's behaviour too); a second try is then told that a failed pass freed them.
  struct FreedNodes {
    std::vector<Node*> nodes;  // (alive: the roots hold the graph for the whole pass)
    const int uncaught = std::uncaught_exceptions();
    ~FreedNodes() {
      if (std::uncaught_exceptions() > uncaught)
        for (Node* n : nodes)
          if (n->released) n->freed_by_failed_pass = true;  // (the failing node itself was restored)
    }
  } freed;
  std::unordered_map<Node*, Tensor> buffer;
  std::deque<Node*> ready;
  for (const auto& r : roots) {
    Tensor& slot = buffer[r.first.get()];
    slot = slot.defined() ? add(slot, r.second) : r.second;
  }
  for (const auto& r : roots)
    if (deps[r.first.get()] == 0 && std::find(ready.begin(), ready.end(), r.first.get()) == ready.end())
      ready.push_back(r.first.get());
  while (!ready.empty()) {
    Node* n = ready.front();
    ready.pop_front();
    Tensor gn = buffer[n];
    buffer.erase(n);

    if (capture) {
      if (auto it = capture->find(n); it != capture->end()) (*captured)[it->second] = gn;
      if (n->leaf) continue;  // autograd::grad leaves every .grad as it was
    } else if (n->leaf) {
      Tensor leaf(n->leaf);
      // A leaf frozen (requires_grad_(false)) after the forward gets no gradient, as in PyTorch:
      // an optimizer would otherwise still move it.
      if (!gn.defined() || !leaf.requires_grad()) continue;
      accumulate_into(leaf, std::move(gn));
      run_grad_hooks(leaf);
      continue;
    }
    const bool run = !capture || leads[n];
    // A pass that frees the graph takes the node's function (its saved tensors go with it at the end of
    // this step, once no other pass runs it), atomically: another thread's pass through the same graph
    // then finds it released. A retaining pass holds its own reference while it runs it.
    std::shared_ptr<const BackwardFn> backward;
    bool taken = false;
    if (run) {
      if (retain_graph) {
        if (!n->released.load()) backward = std::atomic_load(&n->backward);
      } else if (!n->released.exchange(true)) {
        backward = std::atomic_exchange(&n->backward, std::shared_ptr<const BackwardFn>());
        taken = true;
      }
    }
    if (run && !backward)
      throw AutogradError(n->freed_by_failed_pass
                              ? str("[", t_pass, "] the graph through '", n->name,
                                    "' was freed by an earlier backward (or autograd::grad) that failed after "
                                    "running that part (the leaves it reached kept their gradients); run the "
                                    "forward again")
                              : str("[", t_pass, "] the graph through '", n->name,
                                    "' was already freed by an earlier backward (or autograd::grad); pass "
                                    "retain_graph=true to the first one to run it again"));
    if (taken) freed.nodes.push_back(n);
    if (!capture && gn.defined())
      if (std::shared_ptr<TensorImpl> out = n->retained.lock()) accumulate_into(Tensor(out), gn);  // (copied: gn goes on to the backward)

    std::vector<Tensor> grads;
    if (gn.defined() && run) {
      try {
        grads = (*backward)(gn);
      } catch (...) {
        if (taken) {  // a failed step frees nothing: the graph can run again, as before
          freed.nodes.pop_back();  // (not freed: another thread may take it before this pass ends)
          std::atomic_store(&n->backward, backward);
          n->released = false;
        }
        throw;
      }
      CF_CHECK(grads.size() == n->next_edges.size(), AutogradError, "[", t_pass, "] node '", n->name,
               "' returned ", grads.size(), " gradients for ", n->next_edges.size(), " inputs");
    } else {
      grads.resize(n->next_edges.size());  // no gradient reached this node, or none is asked of it
    }
    for (size_t i = 0; i < grads.size(); ++i) {
      Node* next = n->next_edges[i].node.get();
      if (!next) continue;
      if (grads[i].defined()) {
        CF_CHECK(grads[i].shape() == n->next_edges[i].shape, AutogradError, "[", t_pass, "] node '",
                 n->name, "' returned a gradient of shape ", shape_str(grads[i].shape()),
                 " for input ", i, " of shape ", shape_str(n->next_edges[i].shape));
        Tensor& slot = buffer[next];
        slot = slot.defined() ? add(slot, grads[i]) : grads[i];
      }
      if (--deps[next] == 0) ready.push_back(next);
    }
  }
  // A callback may queue another (index loop: the vector may grow).
  for (size_t i = 0; i < callbacks.size(); ++i) {
    auto f = std::move(callbacks[i].run);
    callback_scope.done = i + 1;
    f();
  }
}
}  // namespace

void run_backward(const Tensor& root, const Tensor& grad_output, bool retain_graph) {
  Tensor g = root_gradient(root, grad_output, "backward");
  run_graph({{node_of(root), g}}, retain_graph, nullptr, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph, bool allow_unused) {
  CF_CHECK(!outputs.empty(), AutogradError, "[grad] no outputs given");
  CF_CHECK(!inputs.empty(), AutogradError, "[grad] no inputs given");
  CF_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(), AutogradError, "[grad] ",
           grad_outputs.size(), " grad_outputs for ", outputs.size(), " outputs");
  std::vector<std::pair<std::shared_ptr<Node>, Tensor>> roots;
  for (size_t i = 0; i < outputs.size(); ++i) {
    try {
      roots.emplace_back(nullptr, root_gradient(outputs[i], grad_outputs.empty() ? Tensor() : grad_outputs[i], "grad"));
    } catch (const AutogradError& e) {
      throw AutogradError(str(e.what(), " (output ", i, ")"));
    }
  }
  for (size_t i = 0; i < outputs.size(); ++i) roots[i].first = node_of(outputs[i]);
  std::unordered_map<Node*, size_t> capture;
  std::vector<std::shared_ptr<Node>> input_nodes;  // (kept alive: an unused leaf's accumulator is new)
  std::vector<size_t> first_of(inputs.size());     // an input given again gets its first copy's gradient
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    CF_CHECK(t.defined() && t.requires_grad(), AutogradError, "[grad] input ", i, " ",
             t.defined() ? t.describe() : std::string("(undefined)"), " does not require grad");
    input_nodes.push_back(node_of(t));
    first_of[i] = capture.emplace(input_nodes.back().get(), i).first->second;
  }
  std::vector<Tensor> captured(inputs.size());
  run_graph(roots, retain_graph, &capture, &captured);
  for (size_t i = 0; i < inputs.size(); ++i) captured[i] = captured[first_of[i]];  // (cloned below)
  for (size_t i = 0; i < inputs.size(); ++i) {
    CF_CHECK(captured[i].defined() || allow_unused, AutogradError, "[grad] input ", i, " ", inputs[i].describe(),
             " received no gradient: the outputs do not depend on it (allow_unused=true gives it an undefined "
             "gradient)");
    if (!captured[i].defined()) continue;
    // A gradient can be another's or a grad_output's very tensor (add's backward passes its gradient on):
    // each returned one is the caller's own, as backward() clones into .grad, so an in-place change of one
    // changes no other.
    bool aliased = false;
    for (size_t j = 0; j < i && !aliased; ++j) aliased = captured[j].defined() && captured[j].shares_storage(captured[i]);
    for (size_t j = 0; j < grad_outputs.size() && !aliased; ++j)
      aliased = grad_outputs[j].defined() && grad_outputs[j].shares_storage(captured[i]);
    if (aliased) captured[i] = clone(captured[i]);
  }
  return captured;
}

void retain_grad(const Tensor& t) {
  CF_CHECK(t.defined() && t.requires_grad(), AutogradError, "[retain_grad] ",
           t.defined() ? t.describe() : std::string("an undefined tensor"), " does not require grad");
  if (t.is_leaf()) return;
  t.grad_fn()->retained = t.impl_shared();
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
