#pragma once
// Internal (includes the CUDA runtime header; only .cpp/.cu files of cf include
// it): checked CUDA calls. Every failure becomes a cf::DeviceError whose message
// names the op and the CUDA error.
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "core/cuda.h"
#include "core/error.h"

namespace cf::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* op, const char* what);

// Checks the last launch and counts it (TransferStats::kernel_launches); with
// sync_debug() also waits, checks for errors raised while the kernel ran, and reads
// the deferred data checks (check_errors).
void check_launch(const char* op);

// Deferred data checks (core/cuda.h states the contract). A check reserves a slot of
// its device's record with defer_check, whose `launch` queues the kernel that looks
// at the data and writes the slot, and returns without waiting. The kernel stores the smallest failing
// row-major position in `position` (atomicMin; kNoFailure: none) and the value found
// there in `value` (only the thread or block that owns the final minimum may write
// it: see bad_index_kernel in kernels/index/index_cuda.cu); `blocks_done` is scratch for a kernel whose last
// block finishes the slot, and must be left 0. `raise` runs on the host when the
// slot is read with a failure and throws the op's error from (position, value).
struct CheckSlot {
  unsigned long long position;
  long long value;
  unsigned int blocks_done;
  unsigned int unused;
};
constexpr unsigned long long kNoFailure = ~0ull;
using RaiseCheck = std::function<void(int64_t position, int64_t value)>;
// Slots live in a fixed device array per device, reset after each read; when all are
// in use, the records are read first (one synchronisation per 4096 unread checks).
// `launch` runs under the record's lock, so no reader on another thread can read and
// reset the slot between its reservation and its kernel. The record is per process:
// a host read on any thread reports a failed check queued by any thread.
void defer_check(Device d, RaiseCheck raise, const char* op, const std::function<void(CheckSlot*)>& launch);

// Counts one kernel launch (check_launch does; cuBLAS and CUB calls call it too).
void count_launch();

// Makes d the current device of the calling thread.
void set_device(Device d, const char* op);

// The stream every kernel, cuBLAS and CUB call, memset and device copy of cf is queued on from
// this thread: the legacy default stream (0), or, while this thread captures a cuda::Graph, the
// capture stream (core/cuda_graph.h). Eager work keeps the one-stream order it always had.
cudaStream_t stream();

// ---- CUDA graph capture (core/cuda_graph.cpp drives it; core/cuda.cpp holds the state) ----
// A graph's private memory: while its capture runs, the capturing thread's allocations on the
// graph's device come from (and its frees go back to) this pool, and no eager allocation ever
// gets one of its blocks while the graph lives, since a replay writes them again. Blocks taken
// from the shared cache at capture join the pool. Retired when the graph is destroyed: its cached
// blocks go back to the shared cache, its live ones when they are freed.
struct GraphPool;
std::shared_ptr<GraphPool> make_graph_pool(Device d);
void retire_graph_pool(const std::shared_ptr<GraphPool>& pool);
int64_t graph_pool_allocations(const GraphPool& pool);  // blocks handed out from it so far
// Whether block (an allocation's start) is one of pool's: allocated, or freed, while it was captured.
bool graph_pool_owns(const GraphPool& pool, const void* block);
// A graph's deferred checks (defer_check): slots of its own, written by its check kernels at
// every replay and read, like the eager ones, by the next host read after queue_graph_checks.
struct GraphChecks;
std::shared_ptr<GraphChecks> make_graph_checks(Device d);
void set_graph_check_cursor(GraphChecks& checks, int64_t slot);  // where the next check's slot is
int64_t graph_check_cursor(const GraphChecks& checks);
void queue_graph_checks(const std::shared_ptr<GraphChecks>& checks);  // after a replay was queued
// What a capturing thread captures into; set by core/cuda_graph.cpp for the capture's length.
struct CaptureScope {
  Device device;
  cudaStream_t stream = nullptr;
  std::shared_ptr<GraphPool> pool;
  std::shared_ptr<GraphChecks> checks;
  bool refreshing = false;     // re-capturing a replayable part before a replay (cuda::replayable)
  bool in_replayable = false;  // inside a replayable part's first call
  void* graph = nullptr;       // the cuda::Graph's implementation
};
void set_capture_scope(CaptureScope* scope);  // this thread's; null ends it
CaptureScope* capture_scope();

}  // namespace cf::cuda

// CF_CUDA_CHECK(cudaMemcpy(...), "op"): throws DeviceError "[op] CUDA error ..." on failure.
#define CF_CUDA_CHECK(call, op)                                           \
  do {                                                                    \
    cudaError_t cf_err_ = (call);                                         \
    if (cf_err_ != cudaSuccess) ::cf::cuda::throw_cuda_error(cf_err_, op, #call); \
  } while (0)
