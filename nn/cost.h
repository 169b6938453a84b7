#pragma once
// Cost accounting for any module: parameter count and forward multiply-accumulates
// (MACs), the two figures the papers' tables report (e.g. Centroid Transformers,
// Tables 1, 2 and 6).
//
// MACs are derived from the computation the module really runs, not written by
// hand per model: measure_cost runs one forward with autograd recording on, then
// walks the graph that produced the outputs and adds up every GEMM node
// ("matmul", which attention scores and attention-weighted sums use):
// (..., n, k) @ (..., k, m) costs numel(output) * k MACs, broadcast batch axes
// included. A fused kernel that replaces matmuls (linear, flash_attention, block_attention)
// sets its node's forward_macs to what those matmuls would count, so the figure
// does not change with the path. Each node counts once, so a tensor reused by several consumers is not
// double counted.
//
// Work that does not lie on a differentiable path to the outputs (index
// selection: KNN distance GEMMs, farthest point sampling, K-Means assignments) is
// not in the graph; such code reports its multiply-adds with report_macs(), and
// measure_cost adds them (Cost::selection_macs, included in Cost::macs).
// Not counted, by construction: elementwise products and sums (activations,
// LayerNorm, softmax, depthwise-convolution taps, pooling), as in the usual
// layer-based counters (GEMM/conv MACs of the learned transforms and attention products).
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "nn/module.h"

namespace cf {
namespace nn {

struct Cost {
  int64_t params = 0;  // scalar parameters (shared ones once)
  int64_t macs = 0;    // forward multiply-accumulates for the given input (selection included)
  int64_t selection_macs = 0;  // the part reported through report_macs (not in the graph)
};

// Called by selection code outside the autograd graph: adds `macs` to the
// measure_cost running on this thread, if any (otherwise does nothing).
void report_macs(int64_t macs);

// MACs of the matmul nodes in the graph that produced `outputs` (0 for tensors without history).
int64_t graph_macs(const std::vector<Tensor>& outputs);

// Runs `forward` once in eval mode with grad mode on (every parameter temporarily
// requiring grad, so frozen ones are recorded too), then restores the module's mode
// and flags, and leaves the default generator where it was (a forward's draws from it are undone;
// not alongside other threads drawing from it).
// `forward` returns the model's output tensor(s) for the input size of interest.
Cost measure_cost(Module& module, const std::function<std::vector<Tensor>()>& forward);

}  // namespace nn
}  // namespace cf
