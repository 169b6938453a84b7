#include <cblas.h>
#include <strings.h>

#include <algorithm>
#include <climits>
#include <iterator>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/error.h"
#include "kernels/common/parallel.h"
#include "kernels/common/row_math.h"
#include "kernels/common/scratch.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/matmul/bf16_amx.h"
#include "kernels/matmul/bf16_dot.h"
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

void gemm(const float* a, const float* b, float* c, int64_t M, int64_t N, int64_t K, Layout la, Layout lb,
          int64_t ldc) {
  cblas_sgemm(CblasRowMajor, la.trans, lb.trans, int(M), int(N), int(K), 1.0f, a, int(la.ld), b,
              int(lb.ld), 0.0f, c, int(ldc));
}
void gemm(const double* a, const double* b, double* c, int64_t M, int64_t N, int64_t K, Layout la, Layout lb,
          int64_t ldc) {
  cblas_dgemm(CblasRowMajor, la.trans, lb.trans, int(M), int(N), int(K), 1.0, a, int(la.ld), b, int(lb.ld),
              0.0, c, int(ldc));
}

// bfloat16 / float16: OpenBLAS 0.3.21 has no sbgemm in its CBLAS interface, so the operands are
// widened to float32 blocks, multiplied by sgemm (float32 accumulation), and the product is rounded
// back once. The conversions are the row tier's (row_math.h: vector code, bit for bit core/half.h's),
// over each operand's rows as stored: a transposed operand stays transposed for sgemm instead of being
// read column by column (element-by-element conversions held float16 at 0.39 of sgemm at 256^3).
// The buffers are per thread and reused across calls.
template <typename T>
void gemm_low(const T* a, const T* b, T* c, int64_t M, int64_t N, int64_t K, Layout la, Layout lb,
              int64_t ldc) {
  thread_local std::vector<float> fa, fb, fc;
  const ScratchTrim trim(fa, fb, fc);
  const RowMath& rm = row_math();
  // A (rows x cols) operand's stored rows: its rows, or its columns when BLAS reads it transposed;
  // widened into a dense buffer whose leading dimension is the stored row's length.
  auto widen = [&](const T* src, std::vector<float>& dst, int64_t rows, int64_t cols, const Layout& l) {
    const bool t = l.trans == CblasTrans;
    const int64_t stored = t ? cols : rows, len = t ? rows : cols;
    scratch_resize(dst, size_t(rows * cols));
    for (int64_t r = 0; r < stored; ++r) widen_row(rm, src + r * l.ld, dst.data() + r * len, len);
    return Layout{true, l.trans, std::max<int64_t>(len, 1)};
  };
  const Layout wa = widen(a, fa, M, K, la), wb = widen(b, fb, K, N, lb);
  scratch_resize(fc, size_t(M * N));
  gemm(fa.data(), fb.data(), fc.data(), M, N, K, wa, wb, std::max<int64_t>(N, 1));
  for (int64_t i = 0; i < M; ++i) round_row(rm, fc.data() + i * N, c + i * ldc, N);
}
void gemm(const BFloat16* a, const BFloat16* b, BFloat16* c, int64_t M, int64_t N, int64_t K, Layout la,
          Layout lb, int64_t ldc) {
  const bool at = la.trans == CblasTrans, bt = lb.trans == CblasTrans;
  const int64_t a_rs = at ? 1 : la.ld, a_cs = at ? la.ld : 1, b_rs = bt ? 1 : lb.ld, b_cs = bt ? lb.ld : 1;
  if (bf16_amx_available()) {  // AMX tiles (the default where the CPU and OS have them)
    bf16_amx_gemm(a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, M, N, K);
    return;
  }
  if (bf16_dot_available()) {  // AVX-512 BF16 dot products, no float32 copies of the operands
    bf16_dot_gemm(a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, M, N, K);
    return;
  }
  gemm_low(a, b, c, M, N, K, la, lb, ldc);
}
void gemm(const Half* a, const Half* b, Half* c, int64_t M, int64_t N, int64_t K, Layout la, Layout lb,
          int64_t ldc) {
  gemm_low(a, b, c, M, N, K, la, lb, ldc);
}

// Where row r (NoTrans) or column r (Trans) of a BLAS operand starts: the offset
// of the r-th row of the logical (rows x cols) matrix.
int64_t row_offset(const Layout& l, int64_t r) { return l.trans == CblasNoTrans ? r * l.ld : r; }
// ... and of its c-th column.
int64_t col_offset(const Layout& l, int64_t c) { return l.trans == CblasNoTrans ? c : c * l.ld; }

// Threading. cf parallelises GEMMs itself, with the same OpenMP team as every
// other kernel, and runs each BLAS call on one thread. Two thread pools (ours
// and OpenBLAS's pthreads) on the same cores made each wait for the other: on 2
// cores, half of a small Transformer's training step went to libgomp spinning
// and sched_yield (perf), and small per-chunk GEMMs (clustered attention) ran
// one at a time on a pool sized for large ones.
constexpr double kParallelFlops = 2e6;  // below this a parallel region costs more than it saves
constexpr int64_t kMinPartRows = 16;    // a split GEMM keeps at least this many rows (or columns) per part


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
  // CBLAS takes int sizes: beyond INT_MAX the cast wrapped (K = 2^32 + 5 multiplied 5 columns; 2^31 + 5 was
  // an "illegal value" OpenBLAS printed, leaving the output unwritten). Refused, as cuBLAS's are.
  for (const auto& [v, what] : {std::pair<int64_t, const char*>{M, "M"}, {N, "N"}, {K, "K"}, {la.ld, "a's leading dimension"},
                                {lb.ld, "b's leading dimension"}})
    CF_CHECK(v <= INT_MAX, ValueError, "[matmul] ", what, " = ", v, " is too large for BLAS (at most ", INT_MAX,
             "): a ", shape_str(a.shape()), " @ ", shape_str(b.shape()), " product");
  Shape batch(a.shape().begin(), a.shape().end() - 2);
  Shape sa(a.strides().begin(), a.strides().end() - 2), sb(b.strides().begin(), b.strides().end() - 2);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* pc = out.data<T>();
  const int64_t nb = numel_of(batch);
  use_single_threaded_blas();

  // Work items: every batch entry, each cut into `parts` slabs of rows of C (or
  // of columns when C is wide and short) so that a few large GEMMs still keep
  // every thread busy; many batch entries are simply shared out.
  const int threads = max_threads();
  const double flops = 2.0 * double(M) * double(N) * double(K) * double(nb);
  const bool split_rows = M >= N;
  const int64_t split_len = split_rows ? M : N;
  int64_t parts = 1;
  if (threads > 1 && nb % threads != 0 && nb < 8 * int64_t(threads))
    parts = std::max<int64_t>(1, std::min<int64_t>(threads, split_len / kMinPartRows));
  const int64_t items = nb * parts, part_len = (split_len + parts - 1) / parts;

  auto run = [&](int64_t item) {
    const int64_t i = item / parts, part = item % parts;
    int64_t oa = 0, ob = 0, rem = i;
    for (size_t d = batch.size(); d-- > 0;) {
      int64_t k = rem % batch[d];
      rem /= batch[d];
      oa += k * sa[d];
      ob += k * sb[d];
    }
    const int64_t lo = part * part_len, len = std::min(part_len, split_len - lo);
    if (len <= 0) return;
    T* c = pc + i * M * N;
    if (split_rows)
      gemm(pa + oa + row_offset(la, lo), pb + ob, c + lo * N, len, N, K, la, lb, std::max<int64_t>(N, 1));
    else
      gemm(pa + oa, pb + ob + col_offset(lb, lo), c + lo, M, len, K, la, lb, std::max<int64_t>(N, 1));
  };
  if (threads > 1 && items > 1 && flops >= kParallelFlops) {
    ParallelErrors errors;  // (the 16-bit path's buffers may fail to allocate)
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t item = 0; item < items; ++item) errors.run([&] { run(item); });
    errors.rethrow();
  } else {
    for (int64_t item = 0; item < items; ++item) run(item);
  }
}

}  // namespace

void use_single_threaded_blas() {
  // Cheap check every call: a user (or a benchmark's raw-BLAS baseline) may
  // have raised OpenBLAS's thread count since.
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

BlasKernels blas_kernels() {
  BlasKernels k;
  const char* name = openblas_get_corename();
  k.family = name ? name : "unknown";
  const char* config = openblas_get_config();
  k.config = config ? config : "";
#if defined(__x86_64__) && defined(__GNUC__)
  // OpenBLAS's x86-64 families from before AVX2 (kernel/x86_64 in its sources)
  static const char* const kOld[] = {"Prescott", "Core2",  "Penryn", "Dunnington", "Nehalem",   "Sandybridge",
                                     "Atom",     "Nano",   "Opteron", "Opteron_SSE3", "Barcelona", "Bobcat",
                                     "Bulldozer", "Piledriver", "Steamroller", "Athlon", "Katmai", "Coppermine", "Northwood", "Banias"};
  const bool old = std::any_of(std::begin(kOld), std::end(kOld),
                               [&](const char* o) { return strcasecmp(o, k.family.c_str()) == 0; });
  k.older_than_cpu = old && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return k;
}

bool blas_compatible(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  return layout_of(rows, cols, rs, cs).ok;
}

void matmul_cpu(const Tensor& a, const Tensor& b, const Tensor& out) {
  CF_DISPATCH_FLOAT(a.dtype(), "matmul", matmul_typed<scalar_t>(a, b, out));
}

}  // namespace cf::kernels
