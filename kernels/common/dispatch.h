#pragma once
// Device dispatch for kernel families: the CPU arm always exists; the CUDA arm
// is compiled only with CF_WITH_CUDA, otherwise it throws a clear error. Every
// dispatch is counted as a kernel call (core/kernel_calls.h).
#include "core/error.h"
#include "core/kernel_calls.h"

#ifdef CF_WITH_CUDA
#define CF_DEVICE_DISPATCH(OP, device, cpu_call, cuda_call) \
  do {                                                       \
    ::cf::detail::count_kernel_call((device).is_cuda());     \
    if ((device).is_cuda()) {                                \
      cuda_call;                                             \
    } else {                                                 \
      cpu_call;                                              \
    }                                                        \
  } while (0)
#define CF_DEVICE_CHECK(OP, device) \
  do {                              \
  } while (0)
#else
#define CF_DEVICE_DISPATCH(OP, device, cpu_call, cuda_call)                             \
  do {                                                                                  \
    if ((device).is_cuda())                                                             \
      throw ::cf::NotImplementedError(::cf::str("[", OP, "] has no CUDA implementation in this build")); \
    ::cf::detail::count_kernel_call(false);                                             \
    cpu_call;                                                                           \
  } while (0)
// The dispatch's device check alone (no kernel, not counted): an op fails with its own
// name before it allocates on a device the build lacks.
#define CF_DEVICE_CHECK(OP, device)                                                     \
  do {                                                                                  \
    if ((device).is_cuda())                                                             \
      throw ::cf::NotImplementedError(::cf::str("[", OP, "] has no CUDA implementation in this build")); \
  } while (0)
#endif
