#pragma once
// Hooks into the backward engine, for code that must act while backward runs
// (DistributedDataParallel starts each gradient bucket's all-reduce as soon as
// its gradients are ready, so communication overlaps the rest of backward).
#include <cstdint>
#include <functional>

#include "core/tensor.h"

namespace cf::autograd {

// f(leaf) runs on the thread running backward right after a gradient was
// accumulated into `leaf` (leaf.grad() holds the new total), once per backward
// that reaches it. `leaf` must be a leaf that requires grad. Returns an id for
// remove_grad_hook. Hooks run in registration order; an exception from a hook
// ends the backward with it. A hook whose leaf has died is dropped (with what its closure
// holds) at the next registration.
int64_t add_grad_accumulated_hook(const Tensor& leaf, std::function<void(const Tensor&)> f);
void remove_grad_hook(int64_t id);

// Only while a backward runs (from a hook): f runs once after the backward
// has finished its whole graph, before backward() returns. If the backward ends by an
// exception before f ran, on_abort runs instead (if given; its own exceptions are dropped).
void queue_callback(std::function<void()> f, std::function<void()> on_abort = {});

}  // namespace cf::autograd
