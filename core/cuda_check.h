#pragma once
// Internal (includes the CUDA runtime header; only .cpp/.cu files of cf include
// it): checked CUDA calls. Every failure becomes a cf::DeviceError whose message
// names the op and the CUDA error.
#include <cuda_runtime.h>

#include "core/cuda.h"
#include "core/error.h"

namespace cf::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* op, const char* what);

// Checks the last launch; with sync_debug() also waits and checks for errors
// raised while the kernel ran.
void check_launch(const char* op);

// Makes d the current device of the calling thread.
void set_device(Device d, const char* op);

}  // namespace cf::cuda

// CF_CUDA_CHECK(cudaMemcpy(...), "op"): throws DeviceError "[op] CUDA error ..." on failure.
#define CF_CUDA_CHECK(call, op)                                           \
  do {                                                                    \
    cudaError_t cf_err_ = (call);                                         \
    if (cf_err_ != cudaSuccess) ::cf::cuda::throw_cuda_error(cf_err_, op, #call); \
  } while (0)
