#pragma once
// Query grouping of clustered attention (Vyas et al. 2020, section 3.2.2): the
// sign hashing of projected queries and K-Means in Hamming space on the codes.
// autograd/ops/clustering.h owns validation; CPU arm hamming_cpu.cpp, CUDA arm
// hamming_cuda.cu. Every tensor contiguous and on one device; outputs preallocated.
#include <cstdint>

#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace cf::kernels {

// out[r] = sum over b < bits of (proj[r, b] > 0) << b; proj (rows, bits) float, out (rows,) int64.
void hash_pack_signs_cpu(const Tensor& proj, const Tensor& out);

// Hamming K-Means of each row of codes (G, N) int64 over its entries that
// exclude (G, N) bool (or undefined) does not mark; excluded entries get -1. The
// algorithm and its tie rules: autograd/ops/clustering.h. out (G, N) int64.
// `vectorised`: the AVX-512 VPOPCNTDQ form of the loops where the CPU has it (false:
// the scalar form, for the test that the two agree).
void hamming_kmeans_cpu(const Tensor& codes, const Tensor& exclude, int64_t clusters, int64_t iterations,
                        int64_t bits, const Tensor& out, bool vectorised = true);
// Whether this CPU runs the vectorised form (AVX-512 VPOPCNTDQ, x86-64 builds with gcc).
bool hamming_kmeans_vectorised();

#ifdef CF_WITH_CUDA
void hash_pack_signs_cuda(const Tensor& proj, const Tensor& out);
void hamming_kmeans_cuda(const Tensor& codes, const Tensor& exclude, int64_t clusters, int64_t iterations,
                         int64_t bits, const Tensor& out);
#endif

inline void hash_pack_signs(const Tensor& proj, const Tensor& out) {
  CF_DEVICE_DISPATCH("hash_codes", proj.device(), hash_pack_signs_cpu(proj, out), hash_pack_signs_cuda(proj, out));
}
inline void hamming_kmeans(const Tensor& codes, const Tensor& exclude, int64_t clusters, int64_t iterations,
                           int64_t bits, const Tensor& out) {
  CF_DEVICE_DISPATCH("hamming_kmeans", codes.device(),
                     hamming_kmeans_cpu(codes, exclude, clusters, iterations, bits, out),
                     hamming_kmeans_cuda(codes, exclude, clusters, iterations, bits, out));
}

}  // namespace cf::kernels
