#pragma once
// Graph nodes of the eager autograd engine. Every node has exactly one
// differentiable output (extra outputs such as indices are never differentiable)
// and one edge per input; the backward function maps the output's gradient to
// one gradient per input (an undefined Tensor means "no gradient").
#include <atomic>
#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/tensor.h"

namespace cf::autograd {

struct Node;

// One input of a node: where its gradient goes, and the shape it must have.
struct Edge {
  std::shared_ptr<Node> node;  // null when the input does not require grad
  Shape shape;
};

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

struct Node {
  const char* name = "";          // the op's registry name, e.g. "mul"
  // The op's backward; null once the graph is freed. Read and swapped with std::atomic_load /
  // std::atomic_exchange: a pass running it holds its own reference, so a freeing pass in another
  // thread cannot destroy it mid-call (a retain_graph pass beside a freeing one ran a freed closure).
  std::shared_ptr<const BackwardFn> backward;
  std::vector<Edge> next_edges;   // one per input
  Shape output_shape;
  DType output_dtype = kFloat32;
  Device output_device;
  std::shared_ptr<TensorImpl> leaf;  // set only on a leaf's gradient accumulator
  // The output, when retain_grad() asked backward to keep its gradient in its .grad (a non-leaf's).
  std::weak_ptr<TensorImpl> retained;
  // Set by the pass that frees this node (without retain_graph), which takes `backward` first: of two
  // threads running passes through one graph, the second gets "already freed", not a freed function.
  std::atomic<bool> released{false};
  // Set when the pass that freed it failed further on: a second try is told why the graph is gone.
  std::atomic<bool> freed_by_failed_pass{false};
  // Multiply-adds of a fused forward kernel, for nn::measure_cost (nn/cost.h):
  // set by ops that replace matmuls (flash_attention, block_attention) so a
  // model's count does not depend on which path ran; matmul nodes are counted
  // from their shapes and leave it 0.
  int64_t forward_macs = 0;

  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  // Frees the nodes only this one holds without recursion: a chain of 200k ops (a running total
  // kept with its history) overflowed the stack through nested shared_ptr destructors.
  ~Node();
};

// A tensor kept for backward. It is stored detached (no reference to its own
// grad_fn, so no cycles) together with its storage version; unpack() throws if
// the tensor was modified in place after it was saved.
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t);  // NOLINT: implicit on purpose, saving reads naturally
  Tensor unpack(const char* op) const;
  bool defined() const { return t_.defined(); }

 private:
  Tensor t_;
  int64_t version_ = 0;
};

// True when grad mode is on and any of the tensors requires grad.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);
bool any_requires_grad(const std::vector<Tensor>& inputs);

// Attach a node named `name` producing `output` from `inputs` (call only when
// any_requires_grad is true). `output` becomes non-leaf and requires grad.
void record(const char* name, std::initializer_list<Tensor> inputs, Tensor& output, BackwardFn fn);
void record(const char* name, const std::vector<Tensor>& inputs, Tensor& output, BackwardFn fn);

// Run backward from `root`. grad_output may be undefined for a one-element root.
void run_backward(const Tensor& root, const Tensor& grad_output, bool retain_graph);

// The gradients of sum_i <outputs[i], grad_outputs[i]> with respect to each of `inputs` (tensors that
// require grad, leaves or not), returned instead of accumulated: no .grad changes and no gradient hook
// runs, as PyTorch's torch.autograd.grad (without create_graph: cf's backward records no graph).
// grad_outputs may be empty, or hold undefined entries, for one-element outputs. Only the nodes that lead
// to an input run. An input the outputs do not depend on is an AutogradError naming it, unless
// allow_unused (its gradient is then undefined). An input given twice gets its gradient twice (as torch).
// retain_graph as in backward. No two returned gradients,
// nor a returned gradient and a grad_output, share storage.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                         bool allow_unused = false);

// Later backward passes also keep the gradient of this non-leaf tensor in its .grad, accumulated as a
// leaf's (PyTorch's retain_grad); a no-op for a leaf that requires grad (it keeps its gradient anyway).
// An AutogradError for a tensor that does not require grad.
void retain_grad(const Tensor& t);

// Names of every node reachable from t's grad_fn (for tests of graph shape).
std::vector<const char*> graph_node_names(const Tensor& t);

}  // namespace cf::autograd
