#pragma once
// Raw CUDA baselines for cf-bench --device cuda (built only with the CUDA
// backend): what cf's kernels are measured against in the same run.
#include <cstddef>
#include <cstdint>
#include <string>

namespace cf::bench {

// The GPU's name as the CUDA runtime reports it.
std::string gpu_name(int device);
// C[b] = A[b] @ B[b] for row-major float32 (batch, m, k) @ (batch, k, n), one
// cublasSgemmStridedBatched call (TF32 as cf::cuda::allow_tf32() says).
void cublas_sgemm_strided_batched(const void* a, const void* b, void* c, int64_t batch, int64_t m,
                                  int64_t n, int64_t k, int device);
// The same product for bfloat16 (bf16 = true) or float16 operands and output: one
// cublasGemmStridedBatchedEx call with float32 compute (CUBLAS_COMPUTE_32F, tensor cores).
void cublas_gemm_ex_strided_batched_16(const void* a, const void* b, void* c, int64_t batch, int64_t m,
                                       int64_t n, int64_t k, bool bf16, int device);
// cudaMemcpy device to device.
void device_copy(void* dst, const void* src, size_t bytes);

}  // namespace cf::bench
