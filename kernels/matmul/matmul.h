#pragma once
// Batched GEMM: out[b] = a[b] @ b[b] for a (batch..., M, K), b (batch..., K, N)
// with identical batch shapes (broadcast views with stride 0 are fine) and a
// contiguous out (batch..., M, N). float32 -> sgemm, float64 -> dgemm.
#include <string>

#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

// Whether a matrix with these strides can be handed to BLAS without a copy.
bool blas_compatible(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride);

// cf runs every BLAS call on one thread and shares GEMM work out over its own
// OpenMP team (matmul_cpu.cpp says why). Kernels that call BLAS directly call
// this first and split their GEMMs themselves.
void use_single_threaded_blas();

// The CPU BLAS's kernels: OpenBLAS's name for them ("SkylakeX", "Haswell",
// "Prescott", ...) and whether they are older than this CPU: pre-AVX2 kernels
// on an x86-64 CPU with AVX2. Debian 12's OpenBLAS 0.3.21 runs its Prescott
// kernels on CPUs it does not know (an AVX-512 Xeon among them), about 5x
// slower for sgemm; OPENBLAS_CORETYPE (scripts/openblas-env.sh) picks better
// ones before the program starts. The apps record the name and warn.
struct BlasKernels {
  std::string family;
  std::string config;  // openblas_get_config(): version and build options (DYNAMIC_ARCH: OPENBLAS_CORETYPE works)
  bool older_than_cpu = false;
};
BlasKernels blas_kernels();

void matmul_cpu(const Tensor& a, const Tensor& b, const Tensor& out);
#ifdef CF_WITH_CUDA
void matmul_cuda(const Tensor& a, const Tensor& b, const Tensor& out);
#endif

inline void matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  CF_DEVICE_DISPATCH("matmul", out.device(), matmul_cpu(a, b, out), matmul_cuda(a, b, out));
}

}  // namespace cf::kernels
