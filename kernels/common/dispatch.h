#pragma once
// Device dispatch for kernel families: the CPU arm always exists; the CUDA arm
// is compiled only with CF_WITH_CUDA, otherwise it throws a clear error.
#include "core/error.h"

#ifdef CF_WITH_CUDA
#define CF_DEVICE_DISPATCH(OP, device, cpu_call, cuda_call) \
  do {                                                       \
    if ((device).is_cuda()) {                                \
      cuda_call;                                             \
    } else {                                                 \
      cpu_call;                                              \
    }                                                        \
  } while (0)
#else
#define CF_DEVICE_DISPATCH(OP, device, cpu_call, cuda_call)                             \
  do {                                                                                  \
    if ((device).is_cuda())                                                             \
      throw ::cf::NotImplementedError(::cf::str("[", OP, "] has no CUDA implementation in this build")); \
    cpu_call;                                                                           \
  } while (0)
#endif
