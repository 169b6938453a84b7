#pragma once
// The CUDA runtime as cf sees it: which devices exist, the switches that change
// how kernels run, and byte copies between devices. Every function works in a
// build without CUDA (no devices; copies between CPU buffers only).
#include <cstddef>
#include <cstdint>

#include "core/device.h"
#include "core/dtype.h"

namespace cf::cuda {

// CUDA devices visible to this process; 0 without the CUDA backend, driver or GPU.
int device_count();
bool is_available();
// Throws DeviceError naming `op` when d is a CUDA device this process cannot use.
void check_device(Device d, const char* op);
// Waits for all work queued on the current device (no-op without CUDA). Refused (DeviceError)
// while this thread captures a cuda::Graph.
void synchronize();
// True while this thread captures a cuda::Graph (core/cuda_graph.h): its kernels are then
// recorded, not run, and host reads and writes of device memory, waits and random draws are
// refused with a DeviceError naming the op. Always false without CUDA.
bool capturing();

// Host round trips, counted since the start or the last reset (issue 25's measured
// residency: on the GPU the host waits for nothing, so a forward or backward pass
// must leave these unchanged). device_to_host: copies from a CUDA device to the CPU
// (item(), to_vector(), .cpu(): each makes the host wait for the stream);
// host_to_device: copies the other way (synchronous for pageable host memory);
// synchronizations: calls of synchronize(); kernel_launches: kernels cf queued (its
// own, each checked by check_launch, and each cuBLAS or CUB call, counted once though
// a library call may queue several kernels; memsets and device-to-device copies are
// not counted), the launch overhead a fused kernel or a CUDA graph would remove.
// Copies between CPU buffers, and every count in a build without CUDA, stay 0.
// Thread-safe; counts all threads.
struct TransferStats {
  int64_t device_to_host = 0, device_to_host_bytes = 0;
  int64_t host_to_device = 0, host_to_device_bytes = 0;
  int64_t synchronizations = 0;
  int64_t kernel_launches = 0;
};
TransferStats transfer_stats();
void reset_transfer_stats();
// b - a, field by field (the round trips of the code between two reads).
TransferStats operator-(const TransferStats& b, const TransferStats& a);

// Deferred data checks (issue 25): a check that must look at device data (an index
// out of range, a cross-entropy target outside the classes, an integer division by
// zero) does not stop the stream. Its kernel records what it finds on the device,
// and the op returns at once (its output is then meaningless, never out of bounds:
// the kernels clamp bad indices). The next device-to-host copy (item, to_vector,
// cpu, printing), synchronize() or check_errors() reads the records and throws the
// error of the first failed check, with the same type and "[op] ..." message the CPU
// raises at once; later failures are dropped with it. With sync_debug() each check
// is read as soon as it is queued, so the op that failed throws itself.
// check_errors: waits for the device when a check is pending; no-op otherwise and
// without CUDA. pending_checks: checks queued and not yet read.
void check_errors();
int64_t pending_checks();

// TF32 tensor-core math in float32 matmuls and in the float32 tensor-core attention kernels
// (one TF32 product instead of 3xTF32; kernels/attention/attention.h says which attention calls
// take those kernels). Off by default: float32 results then agree with the CPU to float32
// tolerances (DESIGN.md section 4).
void set_allow_tf32(bool on);
bool allow_tf32();

// Synchronise and check for errors after every kernel launch, so an error names
// the op that caused it. On when built with -DCF_CUDA_SYNC_DEBUG=ON or when the
// environment variable CF_CUDA_SYNC_DEBUG is set to 1 at start.
void set_sync_debug(bool on);
bool sync_debug();

}  // namespace cf::cuda

namespace cf {

// The device arms of core's factories (core/factories_cuda.cu): one kernel queued on
// the stream writes the n elements at dst; the host copies nothing and waits for
// nothing (a pageable host-to-device copy of a buffer filled on the host would make it
// wait for the stream, in every forward that builds a zeros tensor). fill_device
// repeats the element whose elem_size (1, 2, 4 or 8) bytes are at `element`;
// arange_device writes 0, 1, ..., n-1 converted to dtype as the CPU converts them.
// Without CUDA both throw the device error.
void fill_device(void* dst, Device device, const void* element, size_t elem_size, int64_t n, const char* op);
void arange_device(void* dst, Device device, DType dtype, int64_t n, const char* op);

// Copy n bytes between any two devices (host<->device transfers of large
// buffers go through pinned staging buffers). `op` names the caller in errors.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n,
                const char* op);

}  // namespace cf
