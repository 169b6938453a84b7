// kernels/common/segments.h: stable grouping of items by key with CUB.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <climits>

#include "kernels/common/cuda_utils.cuh"
#include "kernels/common/segments.h"

namespace cf::kernels {

namespace {

__global__ void count_keys_kernel(const uint64_t* keys, int64_t n, unsigned long long* count, int64_t* pos) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    pos[i] = i;
    atomicAdd(count + keys[i], 1ull);
  }
}

}  // namespace

void segments_by_key_cuda(const uint64_t* keys, int64_t n, int64_t num_keys, const Tensor& order,
                          const Tensor& start, const Tensor& count, const char* op) {
  CF_CHECK(n <= INT_MAX && num_keys <= INT_MAX, ValueError, "[", op, "] ", n, " items of ", num_keys,
           " keys exceed the CUDA sort's limit (", INT_MAX, ")");
  const Device dev = order.device();
  cu::use_device_of(order, op);
  int64_t* cnt = cu::ptr<int64_t>(count);
  CF_CUDA_CHECK(cudaMemsetAsync(cnt, 0, size_t(num_keys) * sizeof(int64_t), ::cf::cuda::stream()), op);
  if (n == 0) {
    CF_CUDA_CHECK(cudaMemsetAsync(cu::ptr<int64_t>(start), 0, size_t(num_keys) * sizeof(int64_t), ::cf::cuda::stream()),
                  op);
    return;
  }
  Tensor pos = Tensor::empty({n}, kInt64, dev);  // 0..n-1: the values the sort carries
  count_keys_kernel<<<cu::grid_for(n), cu::kThreads, 0, ::cf::cuda::stream()>>>(
      keys, n, reinterpret_cast<unsigned long long*>(cnt), cu::ptr<int64_t>(pos));
  ::cf::cuda::check_launch(op);
  // Only the bits a key in [0, num_keys) can set take part in the sort.
  int end_bit = 1;
  while (end_bit < 64 && (uint64_t(1) << end_bit) < uint64_t(num_keys)) ++end_bit;
  Tensor keys_out = Tensor::empty({n}, kInt64, dev);
  uint64_t* ko = reinterpret_cast<uint64_t*>(cu::ptr<int64_t>(keys_out));
  size_t sort_bytes = 0, scan_bytes = 0;
  CF_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, ko, cu::ptr<int64_t>(pos),
                                                cu::ptr<int64_t>(order), int(n), 0, end_bit, ::cf::cuda::stream()),
                op);
  CF_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, cnt, cu::ptr<int64_t>(start), int(num_keys),
                                              ::cf::cuda::stream()),
                op);
  // Temporary storage from cf's caching allocator, never a bare cudaMalloc.
  Tensor temp = Tensor::empty({int64_t((std::max(sort_bytes, scan_bytes) + 7) / 8) + 1}, kInt64, dev);
  CF_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw_data(), sort_bytes, keys, ko, cu::ptr<int64_t>(pos),
                                                cu::ptr<int64_t>(order), int(n), 0, end_bit, ::cf::cuda::stream()),
                op);
  ::cf::cuda::count_launch();
  CF_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.raw_data(), scan_bytes, cnt, cu::ptr<int64_t>(start), int(num_keys),
                                              ::cf::cuda::stream()),
                op);
  ::cf::cuda::count_launch();
}

}  // namespace cf::kernels
