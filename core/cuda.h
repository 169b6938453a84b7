#pragma once
// The CUDA runtime as cf sees it: which devices exist, the switches that change
// how kernels run, and byte copies between devices. Every function works in a
// build without CUDA (no devices; copies between CPU buffers only).
#include <cstddef>

#include "core/device.h"

namespace cf::cuda {

// CUDA devices visible to this process; 0 without the CUDA backend, driver or GPU.
int device_count();
bool is_available();
// Throws DeviceError naming `op` when d is a CUDA device this process cannot use.
void check_device(Device d, const char* op);
// Waits for all work queued on the current device (no-op without CUDA).
void synchronize();

// TF32 tensor-core math in float32 matmuls. Off by default: float32 results then
// agree with the CPU to float32 tolerances (DESIGN.md section 4).
void set_allow_tf32(bool on);
bool allow_tf32();

// Synchronise and check for errors after every kernel launch, so an error names
// the op that caused it. On when built with -DCF_CUDA_SYNC_DEBUG=ON or when the
// environment variable CF_CUDA_SYNC_DEBUG is set to 1 at start.
void set_sync_debug(bool on);
bool sync_debug();

}  // namespace cf::cuda

namespace cf {

// Copy n bytes between any two devices (host<->device transfers of large
// buffers go through pinned staging buffers). `op` names the caller in errors.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n,
                const char* op);

}  // namespace cf
