#pragma once
// CUDA graphs of whole steps (issue 25: a small training step's time is its launches). Opt-in:
//
//   cf::cuda::Graph graph;
//   bench.train_step();                          // eager warm-up: optimizer state, handles, caches
//   graph.capture([&] { bench.train_step(); });  // recorded, not run
//   for (...) { copy_(ids, next_batch.cuda()); graph.replay(); }  // each replay is that step
//
// capture() runs fn with this thread's kernels recorded on a capture stream instead of run, and
// instantiates them; replay() queues them all again (one launch per part, see replayable) on
// the stream eager work uses, and returns without waiting. A replay computes what the eager
// calls captured would have computed on the tensors they used then: the same addresses, shapes
// and kernel arguments, so inputs change by writing into those tensors (copy_ of a batch moved to
// the device, outside the capture), and results are read from the tensors the capture left (the
// loss, the parameters, their .grad). A .grad made before the capture cannot be accumulated into
// inside it (refused): call zero_grad in the captured step.
//
// What a captured fn must not do (each refused with a DeviceError naming the op, and the graph is
// left empty): read or write host memory (item, to_vector, cpu, printing, copies from the host),
// wait (synchronize, check_errors). Random draws (dropout, LSH's rotations) are captured with a
// rebase (philox_rebase_for): before each replay but the first, the graph writes each generator's
// seed and counter shift to the device and advances the generator by the capture's draws, so a
// replay draws what the eager step would have. Work queued from another thread, or
// on another stream, during the capture ends it with the CUDA error. Run the step eagerly once
// before capturing it, so that state made on the first call (an optimizer's moments, momentum
// buffers) exists: a fill of it in the graph would run again at every replay.
//
// Memory: the blocks allocated while capturing stay the graph's (a private pool) until the graph
// is destroyed or captures again, so eager work never receives a block a replay writes; the pool
// is about one step's peak. Data checks queued in the capture (a class id out of range, an index
// past its axis) write the graph's own slots at each replay; the next host read reports a failure
// of any replay since the last read, as for eager ops (core/cuda.h).
#include <cstdint>
#include <functional>
#include <memory>

#include "core/device.h"

namespace cf {
class Generator;
class Tensor;
}

namespace cf::cuda {

class Graph {
 public:
  Graph();
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Records fn's CUDA work on `device` (the graph's previous capture, if any, is dropped first).
  // Throws DeviceError without CUDA or a visible device, or when fn does something a graph cannot
  // hold (above); ValueError for a CPU device.
  void capture(const std::function<void()>& fn, Device device = Device::cuda(0));
  // Queues the captured work once; DeviceError before a successful capture or while capturing.
  void replay();
  bool captured() const;
  // Parts of the capture (replayable splits it): a replay is one graph launch per part.
  int64_t parts() const;
  // Drops the captured work and returns its private memory (blocks still held by tensors return
  // when those are freed).
  void reset();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Host code whose kernels take values that change from step to step on the host, not on the
// device: an optimizer step's step counts, bias corrections and learning rate. Outside a capture
// it calls fn. Inside one it calls fn too, capturing its kernels as a part of their own, and the
// graph calls fn again before every replay but the first (the capture's call prepared the first
// replay's arguments), re-capturing it and updating that part's kernel arguments in place; so fn's
// host effects (the step counts) advance once per replay, as for eager steps. fn must queue the
// same kernels each time and allocate no device memory (else the replay throws DeviceError).
void replayable(const std::function<void()>& fn);

// For a random op about to reserve counters from gen for a kernel on `device`: null outside a
// capture and for a CPU device; inside one, the device pair (seed, counter shift) the kernel rebases
// its draws on (core/rng.h, philox_rebase), the graph's for gen (whose offset at its first draw in the
// capture is recorded). DeviceError inside a replayable part (it is called again before replays,
// drawing anew) and beyond 16 generators in one capture.
const uint64_t* philox_rebase_for(Generator& gen, Device device, const char* op);

// Inside a capture: the graph holds t (a CUDA tensor made before the capture that its kernels read)
// until it is reset or destroyed. For cf's own caches, which may drop an entry between replays
// (the shared number constants, the per-size member tables): a dropped block would go back to the
// shared cache while the graph still reads it. Outside a capture, nothing. A user's tensors the
// step reads (the inputs, the parameters) are the user's to keep, as in PyTorch.
void keep_for_graph(const Tensor& t);

// Inside a capture: whether t's memory predates it (made before the capture, so a replay would read
// it as it is then, not as the captured step left it). False outside a capture and for CPU tensors.
bool made_before_capture(const Tensor& t);

}  // namespace cf::cuda
