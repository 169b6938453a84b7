// The device arms of core's factories (core/cuda.h: fill_device, arange_device):
// Tensor::full, zeros, ones, scalar and arange on a CUDA device write their elements
// with one kernel on the stream, so building a constant in a forward neither copies
// from the host nor waits for the device.
#include <cstring>

#include "core/cuda_check.h"
#include "core/half.h"

namespace cf {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65535 * 16 ? b : 65535 * 16);  // grid-stride beyond
}

template <typename W>
__global__ void fill_kernel(W* out, W value, int64_t n) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) out[i] = value;
}

template <typename T>
__global__ void arange_kernel(T* out, int64_t n) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) out[i] = T(i);
}

template <typename W>
void fill_words(void* dst, const void* element, int64_t n) {
  W value;
  std::memcpy(&value, element, sizeof(W));
  fill_kernel<W><<<blocks_for(n), kThreads, 0, ::cf::cuda::stream()>>>(static_cast<W*>(dst), value, n);
}

}  // namespace

void fill_device(void* dst, Device device, const void* element, size_t elem_size, int64_t n, const char* op) {
  cuda::check_device(device, op);
  if (n == 0) return;
  cuda::set_device(device, op);
  switch (elem_size) {
    case 1: fill_words<uint8_t>(dst, element, n); break;
    case 2: fill_words<uint16_t>(dst, element, n); break;
    case 4: fill_words<uint32_t>(dst, element, n); break;
    case 8: fill_words<uint64_t>(dst, element, n); break;
    default: throw ValueError(str("[", op, "] no device fill for ", elem_size, "-byte elements"));
  }
  cuda::check_launch(op);
}

void arange_device(void* dst, Device device, DType dtype, int64_t n, const char* op) {
  cuda::check_device(device, op);
  if (n == 0) return;
  cuda::set_device(device, op);
  CF_DISPATCH_NUMERIC(dtype, op,
                      arange_kernel<scalar_t>
                      <<<blocks_for(n), kThreads, 0, ::cf::cuda::stream()>>>(static_cast<scalar_t*>(dst), n));
  cuda::check_launch(op);
}

}  // namespace cf
