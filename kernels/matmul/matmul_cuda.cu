// CUDA batched GEMM through cuBLAS. Contract and operand layouts: matmul.h and
// matmul_cpu.cpp (layout_of / blas_compatible decide which views BLAS can read).
//
// cuBLAS is column-major and cf is row-major: a row-major (M x N) C is the
// column-major (N x M) C^T, and C^T = B^T A^T, so every call passes B first and
// swaps M and N. A row-major operand with unit column stride (NoTrans on the CPU)
// is, read column-major, already its own transpose: CUBLAS_OP_N; one with unit
// row stride (Trans on the CPU) needs CUBLAS_OP_T. The leading dimension is the
// same number in both views.
#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <mutex>
#include <vector>

#include "kernels/common/cuda_utils.cuh"
#include "kernels/elementwise/elementwise.h"
#include "kernels/matmul/matmul.h"

namespace cf::kernels {

namespace {

[[noreturn]] void throw_cublas(cublasStatus_t s, const char* what) {
  throw DeviceError(str("[matmul] cuBLAS error ", cublasGetStatusName(s), " (", cublasGetStatusString(s),
                        ") in ", what));
}

#define CF_CUBLAS_CHECK(call)                                   \
  do {                                                          \
    cublasStatus_t cf_st_ = (call);                             \
    if (cf_st_ != CUBLAS_STATUS_SUCCESS) throw_cublas(cf_st_, #call); \
  } while (0)

// One handle per device, created on first use and never destroyed: destroying it
// at exit can run after the CUDA runtime has shut down (static destruction order),
// and the driver reclaims everything at process exit anyway. Every call binds the
// handle to the stream of cf's kernels (cuda::stream()), so GEMMs are ordered with
// the kernels around them without any synchronisation, and to one workspace of cf's
// per device (kWorkspaceBytes, outside the caching allocator): cublasSetStream resets
// the workspace to cuBLAS's own pool, which may allocate inside a CUDA graph capture,
// and one workspace gives eager and captured GEMMs the same algorithms (the same bits).
// All users of the workspace are ordered on the one stream eager work and replays run on.
// cuBLAS handles are not safe for concurrent use from several host threads; cf
// launches work from one thread at a time (like its other CUDA kernels).
constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS's recommendation for Hopper

cublasHandle_t handle_for(const Tensor& t) {
  static std::mutex mu;
  static std::vector<cublasHandle_t>* handles = new std::vector<cublasHandle_t>();  // never destroyed
  static std::vector<void*>* workspaces = new std::vector<void*>();                 // never freed
  cu::use_device_of(t, "matmul");
  const int dev = t.device().index;
  std::lock_guard<std::mutex> lock(mu);
  if (int(handles->size()) <= dev) {
    handles->resize(size_t(dev) + 1, nullptr);
    workspaces->resize(size_t(dev) + 1, nullptr);
  }
  cublasHandle_t& h = (*handles)[size_t(dev)];
  void*& ws = (*workspaces)[size_t(dev)];
  if (!h) {
    CF_CUDA_CHECK(cudaMalloc(&ws, kWorkspaceBytes), "matmul");
    CF_CUBLAS_CHECK(cublasCreate(&h));
    // Default math: no TF32 unless a call asks for it through its compute type
    // (CUBLAS_COMPUTE_32F_FAST_TF32 below). Pedantic math is not needed: with
    // CUBLAS_COMPUTE_32F, default math already keeps float32 products and sums
    // in float32 (it only allows reduced precision when the compute type or the
    // math mode asks for it), and pedantic can rule out the fastest kernels.
    CF_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  }
  // Every call on the stream cf launches on now (the legacy default stream, or a CUDA
  // graph's capture stream: core/cuda_graph.h).
  CF_CUBLAS_CHECK(cublasSetStream(h, ::cf::cuda::stream()));
  CF_CUBLAS_CHECK(cublasSetWorkspace(h, ws, kWorkspaceBytes));
  return h;
}

// layout_of of matmul_cpu.cpp, with cuBLAS's operation for the column-major view.
struct Layout {
  bool ok = false;
  bool trans = false;  // true: unit row stride (CUBLAS_OP_T); false: unit column stride (OP_N)
  int64_t ld = 1;
};

Layout layout_of(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if (cols == 1 || cs == 1) {
    int64_t ld = rows == 1 ? std::max<int64_t>(cols, 1) : rs;
    if (ld >= std::max<int64_t>(cols, 1)) return {true, false, ld};
  }
  if (rows == 1 || rs == 1) {
    int64_t ld = cols == 1 ? std::max<int64_t>(rows, 1) : cs;
    if (ld >= std::max<int64_t>(rows, 1)) return {true, true, ld};
  }
  return {};
}

// A contiguous device copy of t when its last two axes are not BLAS-readable
// (the autograd layer normally hands over BLAS-ready views, see linalg.cpp, so
// this is a fallback for direct kernel callers).
Tensor blas_ready(const Tensor& t) {
  const int64_t nd = t.dim();
  if (layout_of(t.shape()[size_t(nd - 2)], t.shape()[size_t(nd - 1)], t.strides()[size_t(nd - 2)],
                t.strides()[size_t(nd - 1)])
          .ok)
    return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  copy_cuda(t, c);
  return c;
}

// If offset(b) = b * stride for every row-major batch index b, the batch
// collapses to one stride (stride 0 for a fully broadcast operand).
bool single_stride(const Shape& batch, const Shape& strides, int64_t& stride) {
  int64_t inner = -1, span = 1;  // inner: stride of one step of b; span: product of later sizes
  for (size_t d = batch.size(); d-- > 0;) {
    if (batch[d] == 1) continue;
    if (inner < 0) inner = strides[d];  // innermost batch axis of size > 1: span is 1 here
    if (strides[d] != inner * span) return false;
    span *= batch[d];
  }
  stride = inner < 0 ? 0 : inner;
  return true;
}

int as_int(int64_t v, const char* what) {
  CF_CHECK(v <= INT_MAX, ValueError, "[matmul] ", what, " = ", v,
           " is too large for cuBLAS (at most ", INT_MAX, ")");
  return int(v);
}

// The pointer arrays of a batched GEMM whose batch axes share no single stride:
// entry i holds B's, then A's, then C's matrix of batch index i (row-major over
// the batch shape; C is contiguous), B first as cuBLAS is called with B^T A^T.
struct BatchPointers {
  int dims = 0;
  int64_t size[kMaxDims] = {}, stride_a[kMaxDims] = {}, stride_b[kMaxDims] = {};
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int64_t mn = 0, count = 0;
};
template <typename T>
__global__ void batch_pointers_kernel(BatchPointers p, void** out) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.count; i += step) {
    int64_t oa = 0, ob = 0, rem = i;
    for (int d = p.dims - 1; d >= 0; --d) {
      const int64_t c = rem % p.size[d];
      rem /= p.size[d];
      oa += c * p.stride_a[d];
      ob += c * p.stride_b[d];
    }
    out[i] = const_cast<T*>(static_cast<const T*>(p.b) + ob);
    out[p.count + i] = const_cast<T*>(static_cast<const T*>(p.a) + oa);
    out[2 * p.count + i] = static_cast<T*>(p.c) + i * p.mn;
  }
}

template <typename T>
void matmul_typed(const Tensor& a_in, const Tensor& b_in, const Tensor& out) {
  const int64_t nd = a_in.dim();
  const int64_t M = a_in.shape()[size_t(nd - 2)], K = a_in.shape()[size_t(nd - 1)],
                N = b_in.shape()[size_t(nd - 1)];
  if (M == 0 || N == 0 || out.numel() == 0) return;
  cu::use_device_of(out, "matmul");
  if (K == 0) {  // empty sums: zeros (all-zero bits are 0.0 for float and double)
    CF_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), ::cf::cuda::stream()), "matmul");
    return;
  }
  const Tensor a = blas_ready(a_in), b = blas_ready(b_in);
  const Layout la = layout_of(M, K, a.strides()[size_t(nd - 2)], a.strides()[size_t(nd - 1)]);
  const Layout lb = layout_of(K, N, b.strides()[size_t(nd - 2)], b.strides()[size_t(nd - 1)]);
  CF_CHECK(la.ok && lb.ok, Error, "[matmul] internal error: operands not BLAS-compatible");

  constexpr bool f32 = std::is_same_v<T, float>;
  constexpr bool low = is_low_precision_v<T>;
  const cudaDataType dt = f32 ? CUDA_R_32F
                          : std::is_same_v<T, BFloat16> ? CUDA_R_16BF
                          : std::is_same_v<T, Half> ? CUDA_R_16F
                                                   : CUDA_R_64F;
  // TF32 only when the user opted in (cf::cuda::set_allow_tf32); otherwise full
  // float32 products and sums so results match the CPU to float32 tolerances.
  // bfloat16/float16 operands run on tensor cores with float32 products and sums
  // (CUBLAS_COMPUTE_32F, the CPU path's contract: one rounding of a float32 result).
  const cublasComputeType_t ct =
      low ? CUBLAS_COMPUTE_32F
      : f32 ? (::cf::cuda::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F) : CUBLAS_COMPUTE_64F;
  using S = compute_t<T>;  // alpha/beta in the compute type (float for the 16-bit types)
  const S alpha = S(1), beta = S(0);
  const cublasOperation_t opa = la.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = lb.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = as_int(N, "N"), n = as_int(M, "M"), k = as_int(K, "K");
  const int lda = as_int(la.ld, "lda"), ldb = as_int(lb.ld, "ldb"), ldc = m;

  Shape batch(a.shape().begin(), a.shape().end() - 2);
  Shape sa(a.strides().begin(), a.strides().end() - 2), sb(b.strides().begin(), b.strides().end() - 2);
  const int64_t nb = numel_of(batch);
  const int count = as_int(nb, "batch count");
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  T* pc = static_cast<T*>(out.raw_data());
  cublasHandle_t h = handle_for(out);

  int64_t stride_a = 0, stride_b = 0;
  if (single_stride(batch, sa, stride_a) && single_stride(batch, sb, stride_b)) {
    // The common case (plain batch, or an operand broadcast over the whole batch
    // with stride 0): one strided-batched call.
    CF_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, opb, opa, m, n, k, &alpha, pb, dt, ldb, stride_b, pa, dt, lda,
                                               stride_a, &beta, pc, dt, ldc, M * N, count, ct,
                                               CUBLAS_GEMM_DEFAULT));
    ::cf::cuda::count_launch();
    return;
  }
  // Batch axes that do not collapse to one stride (e.g. (4,1) against (1,5)
  // broadcasting, or (B, H) against (1, H)): one cublasGemmBatchedEx call with
  // pointer arrays that a kernel writes into a device tensor (cf's caching
  // allocator) from the batch shape and strides passed by value, so the host
  // copies nothing and does not wait. The array returns to the cache after the
  // call is queued; later users of that block run after it on the same stream.
  BatchPointers bp;
  bp.dims = int(batch.size());
  for (size_t d = 0; d < batch.size(); ++d) {
    bp.size[d] = batch[d];
    bp.stride_a[d] = sa[d];
    bp.stride_b[d] = sb[d];
  }
  bp.a = pa;
  bp.b = pb;
  bp.c = pc;
  bp.mn = M * N;
  bp.count = nb;
  static_assert(sizeof(void*) == sizeof(int64_t), "pointer arrays are stored as int64");
  Tensor dev = Tensor::empty({3 * nb}, kInt64, out.device());
  void** dp = static_cast<void**>(dev.raw_data());
  batch_pointers_kernel<T><<<cu::grid_for(nb), cu::kThreads, 0, ::cf::cuda::stream()>>>(bp, dp);
  ::cf::cuda::check_launch("matmul");
  CF_CUBLAS_CHECK(cublasGemmBatchedEx(h, opb, opa, m, n, k, &alpha, dp, dt, ldb, dp + nb, dt, lda, &beta,
                                      dp + 2 * nb, dt, ldc, count, ct, CUBLAS_GEMM_DEFAULT));
  ::cf::cuda::count_launch();
}

}  // namespace

void matmul_cuda(const Tensor& a, const Tensor& b, const Tensor& out) {
  CF_DISPATCH_FLOAT(a.dtype(), "matmul", matmul_typed<scalar_t>(a, b, out));
}

}  // namespace cf::kernels
