#include "bench/cuda_baselines.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>

#include "core/cuda.h"

namespace cf::bench {
namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(int(s)));
}
}  // namespace

std::string gpu_name(int device) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  return p.name;
}

void cublas_sgemm_strided_batched(const void* a, const void* b, void* c, int64_t batch, int64_t m,
                                  int64_t n, int64_t k, int device) {
  static cublasHandle_t handle = nullptr;  // the baseline's own handle, kept to exit
  check(cudaSetDevice(device), "cudaSetDevice");
  if (!handle) check(cublasCreate(&handle), "cublasCreate");
  check(cublasSetMathMode(handle, cf::cuda::allow_tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
        "cublasSetMathMode");
  const float one = 1.0f, zero = 0.0f;
  // Row-major C = A B is column-major C^T = B^T A^T: swap the operands.
  check(cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(m), int(k), &one,
                                  static_cast<const float*>(b), int(n), n * k, static_cast<const float*>(a),
                                  int(k), m * k, &zero, static_cast<float*>(c), int(n), m * n, int(batch)),
        "cublasSgemmStridedBatched");
}

void cublas_gemm_ex_strided_batched_16(const void* a, const void* b, void* c, int64_t batch, int64_t m,
                                       int64_t n, int64_t k, bool bf16, int device) {
  static cublasHandle_t handle = nullptr;
  check(cudaSetDevice(device), "cudaSetDevice");
  if (!handle) check(cublasCreate(&handle), "cublasCreate");
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType dt = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  check(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(m), int(k), &one, b, dt, int(n),
                                   n * k, a, dt, int(k), m * k, &zero, c, dt, int(n), m * n, int(batch),
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
}

void device_copy(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
}

}  // namespace cf::bench
