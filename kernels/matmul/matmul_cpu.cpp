#include <cblas.h>

#include <algorithm>

#include "kernels/elementwise/elementwise.h"
#include "kernels/matmul/matmul.h"

namespace cf::kernels {

namespace {

struct Layout {
  bool ok = false;
  CBLAS_TRANSPOSE trans = CblasNoTrans;
  int64_t ld = 1;
};

// A row-major (rows x cols) matrix with the given element strides, as BLAS sees it.
Layout layout_of(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  Layout l;
  if (cols == 1 || cs == 1) {
    int64_t ld = rows == 1 ? std::max<int64_t>(cols, 1) : rs;
    if (ld >= std::max<int64_t>(cols, 1)) return {true, CblasNoTrans, ld};
  }
  if (rows == 1 || rs == 1) {
    int64_t ld = cols == 1 ? std::max<int64_t>(rows, 1) : cs;
    if (ld >= std::max<int64_t>(rows, 1)) return {true, CblasTrans, ld};
  }
  return l;
}

void gemm(const float* a, const float* b, float* c, int64_t M, int64_t N, int64_t K, Layout la,
          Layout lb) {
  cblas_sgemm(CblasRowMajor, la.trans, lb.trans, int(M), int(N), int(K), 1.0f, a, int(la.ld), b,
              int(lb.ld), 0.0f, c, int(std::max<int64_t>(N, 1)));
}
void gemm(const double* a, const double* b, double* c, int64_t M, int64_t N, int64_t K, Layout la,
          Layout lb) {
  cblas_dgemm(CblasRowMajor, la.trans, lb.trans, int(M), int(N), int(K), 1.0, a, int(la.ld), b,
              int(lb.ld), 0.0, c, int(std::max<int64_t>(N, 1)));
}

template <typename T>
void matmul_typed(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t nd = a.dim();
  const int64_t M = a.shape()[size_t(nd - 2)], K = a.shape()[size_t(nd - 1)],
                N = b.shape()[size_t(nd - 1)];
  if (M == 0 || N == 0) return;
  if (K == 0) {
    fill_cpu(out, 0.0);
    return;
  }
  Layout la = layout_of(M, K, a.strides()[size_t(nd - 2)], a.strides()[size_t(nd - 1)]);
  Layout lb = layout_of(K, N, b.strides()[size_t(nd - 2)], b.strides()[size_t(nd - 1)]);
  CF_CHECK(la.ok && lb.ok, Error, "[matmul] internal error: operands not BLAS-compatible");
  Shape batch(a.shape().begin(), a.shape().end() - 2);
  Shape sa(a.strides().begin(), a.strides().end() - 2), sb(b.strides().begin(), b.strides().end() - 2);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* pc = out.data<T>();
  int64_t nb = numel_of(batch);
  for (int64_t i = 0; i < nb; ++i) {
    int64_t oa = 0, ob = 0, rem = i;
    for (size_t d = batch.size(); d-- > 0;) {
      int64_t k = rem % batch[d];
      rem /= batch[d];
      oa += k * sa[d];
      ob += k * sb[d];
    }
    gemm(pa + oa, pb + ob, pc + i * M * N, M, N, K, la, lb);
  }
}

}  // namespace

bool blas_compatible(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  return layout_of(rows, cols, rs, cs).ok;
}

void matmul_cpu(const Tensor& a, const Tensor& b, const Tensor& out) {
  CF_DISPATCH_FLOAT(a.dtype(), "matmul", matmul_typed<scalar_t>(a, b, out));
}

}  // namespace cf::kernels
