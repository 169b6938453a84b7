// cf-bench matmul (apps/bench/bench.h).
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "bench/bench.h"
#include "kernels/matmul/bf16_amx.h"
#include "kernels/matmul/bf16_dot.h"
#ifdef CF_WITH_CUDA
#include "bench/cuda_baselines.h"
#endif

namespace cf::bench {

namespace {

// ---------------------------------------------------------------- matmul

double max_abs_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

int64_t reps_for(const BenchOptions& o, double flops) {
  if (o.repeat > 0) return o.repeat;
  // Small problems run more often so that the median is stable.
  return flops < 1e9 ? 21 : flops < 1e10 ? 7 : 5;
}

#ifdef CF_WITH_CUDA
// matmul_row's baseline on CUDA, into r: one cublasGemmStridedBatchedEx in the
// 16-bit dtype, or one cublasSgemmStridedBatched, on the same device buffers.
void cublas_baseline(json& r, const cf::Tensor& A, const cf::Tensor& B, const cf::Tensor& out, const cf::Shape& shape,
                     std::optional<cf::DType> low, int64_t count, int64_t n, int64_t reps, double flops, double t_cf) {
  if (low) {
    // Baseline: one cublasGemmStridedBatchedEx call in the same dtype on the same buffers.
    cf::Tensor Cd = cf::Tensor::empty(shape, *low, g_device);
    double t_cublas = time_median(reps, [&] {
      cf::bench::cublas_gemm_ex_strided_batched_16(A.raw_data(), B.raw_data(), Cd.raw_data(), count, n, n, n,
                                                   *low == cf::kBFloat16, g_device.index);
    });
    r["params"]["baseline"] = "cublasGemmStridedBatchedEx (16-bit, CUBLAS_COMPUTE_32F) on the same device buffers";
    r["cublas_time_s"] = t_cublas;
    r["cublas_gflops"] = flops / t_cublas * 1e-9;
    r["ratio_vs_cublas"] = t_cublas / t_cf;
    std::vector<float> got = cf::to(out, cf::kFloat32).to_vector<float>(),
                       want = cf::to(Cd, cf::kFloat32).to_vector<float>();
    r["max_abs_diff_vs_cublas"] = max_abs_diff(got.data(), want.data(), count * n * n);
  } else {
    // Baseline: one cublasSgemmStridedBatched call on the same device buffers.
    cf::Tensor Cd = cf::Tensor::empty(shape, cf::kFloat32, g_device);
    double t_cublas = time_median(reps, [&] {
      cf::bench::cublas_sgemm_strided_batched(A.raw_data(), B.raw_data(), Cd.raw_data(), count, n, n, n,
                                              g_device.index);
    });
    r["params"]["baseline"] = "cublasSgemmStridedBatched on the same device buffers";
    r["cublas_time_s"] = t_cublas;
    r["cublas_gflops"] = flops / t_cublas * 1e-9;
    r["ratio_vs_cublas"] = t_cublas / t_cf;
    std::vector<float> got = out.to_vector<float>(), want = Cd.to_vector<float>();
    r["max_abs_diff_vs_cublas"] = max_abs_diff(got.data(), want.data(), count * n * n);
  }
}
#endif

// One row: cf::matmul on (bs, n, n) @ (bs, n, n) against cblas_sgemm called once per
// batch entry on the same buffers (bs = 0 means plain 2-d n x n operands).
json matmul_row(const BenchOptions& o, cf::Generator& gen, int64_t bs, int64_t n) {
  int64_t count = std::max<int64_t>(bs, 1);
  cf::Shape shape = bs > 0 ? cf::Shape{bs, n, n} : cf::Shape{n, n};
  const std::optional<cf::DType> low = low_dtype(o);
  cf::Tensor A = cf::rand(shape, cf::kFloat32, gen, -1, 1).to(g_device);
  cf::Tensor B = cf::rand(shape, cf::kFloat32, gen, -1, 1).to(g_device);
  if (low) {  // 16-bit operands; the float32 baselines read their exact float32 values
    A = cf::to(A, *low);
    B = cf::to(B, *low);
  }
  std::vector<float> C(size_t(count * n * n));
  double flops = 2.0 * double(count) * double(n) * double(n) * double(n);
  int64_t reps = reps_for(o, flops);

  cf::reset_peak_memory(g_device);
  cf::Tensor out;
  double t_cf = time_median(reps, [&] {
    out = cf::Tensor();  // free the previous result first: peak_bytes is one call's
    out = cf::matmul(A, B);
  });
  int64_t peak = cf::memory_stats(g_device).peak_bytes;
  json r;
  r["name"] = bs > 0 ? "bmm_" + std::to_string(bs) + "x" + std::to_string(n)
                     : "matmul_" + std::to_string(n);
  r["params"] = {{"m", n}, {"n", n}, {"k", n}, {"batch", count}, {"dtype", dtype_label(o)},
                 {"repeat", reps}};
  r["time_s"] = t_cf;
  r["gflops"] = flops / t_cf * 1e-9;
  r["peak_bytes"] = peak;
#ifdef CF_WITH_CUDA
  if (g_device.is_cuda()) {
    cublas_baseline(r, A, B, out, shape, low, count, n, reps, flops, t_cf);
    return r;
  }
#endif
  // The baseline's float32 operands (16-bit ones widened), made after cf's call was measured: alive during
  // it, the copies counted in its peak_bytes (5/3 of one call's at float32).
  const cf::Tensor A32 = low ? cf::to(A, cf::kFloat32) : A, B32 = low ? cf::to(B, cf::kFloat32) : B;
  const float* pa = A32.data<float>();
  const float* pb = B32.data<float>();
  RawBlasThreads raw_blas;
  double t_blas = time_median(reps, [&] {
    for (int64_t i = 0; i < count; ++i)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(n), int(n), 1.0f,
                  pa + i * n * n, int(n), pb + i * n * n, int(n), 0.0f, C.data() + i * n * n,
                  int(n));
  });
  if (low == cf::kBFloat16) {
    // Which bfloat16 path wins, in the same run: the default (AMX tiles where the CPU and OS give them, else
    // the vdpbf16ps kernel on an AMD CPU that has it, else float32 copies + cblas_sgemm), timed above, against
    // the other paths this CPU has.
    const bool amx = cf::kernels::bf16_amx_available(), dot = !amx && cf::kernels::bf16_dot_available();
    r["params"]["kernel"] = amx   ? "AMX tiles (TDPBF16PS; the default)"
                            : dot ? "vdpbf16ps (AVX-512 BF16; the default here)"
                                  : "float32 blocks + cblas_sgemm (the default)";
    if (amx || dot) {
      cf::kernels::set_bf16_amx_enabled(false);
      cf::kernels::set_bf16_dot_enabled(false);
      const double t_conv = time_median(reps, [&] { cf::Tensor tmp = cf::matmul(A, B); });
      r["converting_time_s"] = t_conv;
      r["ratio_vs_converting"] = t_conv / t_cf;
    }
    if (cf::kernels::bf16_dot_supported() && !dot) {
      cf::kernels::set_bf16_amx_enabled(false);
      cf::kernels::set_bf16_dot_enabled(true);
      const double t_dot = time_median(reps, [&] { cf::Tensor tmp = cf::matmul(A, B); });
      r["vdpbf16ps_time_s"] = t_dot;
      r["ratio_vdpbf16ps_vs_default"] = t_cf / t_dot;
    }
    cf::kernels::reset_bf16_dot_enabled();
    cf::kernels::set_bf16_amx_enabled(amx);
  }
  cf::Tensor outc = cf::contiguous(cf::to(out, cf::kFloat32));
  if (bs > 0) r["params"]["baseline"] = "loop of cblas_sgemm over the batch";
  if (low) r["params"]["baseline"] = "cblas_sgemm (float32) on float32 copies of the same values";
  r["cblas_time_s"] = t_blas;
  r["cblas_gflops"] = flops / t_blas * 1e-9;
  r["ratio_vs_cblas"] = t_blas / t_cf;
  r["max_abs_diff_vs_cblas"] = max_abs_diff(outc.data<float>(), C.data(), count * n * n);
  return r;
}

}  // namespace

json bench_matmul(const BenchOptions& o) {
  json rows = json::array();
  cf::Generator gen(42);
  for (int64_t n : o.sizes) rows.push_back(matmul_row(o, gen, 0, n));
  if (o.batch.size() == 2 && o.batch[0] > 0 && o.batch[1] > 0)
    rows.push_back(matmul_row(o, gen, o.batch[0], o.batch[1]));
  return report("matmul", rows);
}

}  // namespace cf::bench
