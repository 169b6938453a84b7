// cf-bench: what every subcommand shares (bench.h).
#include <cblas.h>

#include <string>

#include "bench/bench.h"
#ifdef CF_WITH_CUDA
#include "bench/cuda_baselines.h"
#include "kernels/attention/attention.h"
#endif

#ifndef CF_BUILD_TYPE
#define CF_BUILD_TYPE "unknown"
#endif
#ifndef CF_VERSION
#define CF_VERSION "unknown"
#endif

namespace cf::bench {

std::optional<cf::DType> low_dtype(const BenchOptions& o) {
  if (o.precision == "bf16") return cf::kBFloat16;
  if (o.precision == "fp16") return cf::kFloat16;
  return std::nullopt;
}
const char* dtype_label(const BenchOptions& o) {
  return o.precision == "bf16" ? "bfloat16" : o.precision == "fp16" ? "float16" : "float32";
}

cf::Device g_device = cf::Device::cpu();
void device_sync() { cf::apps::device_sync(g_device); }

double time_median(int64_t reps, const std::function<void()>& f) {
  return cf::apps::time_median(reps, g_device, f);
}

namespace {

json machine_info() {
  json m = cf::apps::machine_record();  // cpu, cores, OpenMP threads, UTC: what every app records
  // cf runs each BLAS call on one thread and parallelises GEMMs over its OpenMP
  // team (kernels/matmul); the raw-BLAS baselines below run OpenBLAS with as
  // many threads as that team.
  m["blas_threading"] = "cf: OpenMP team, 1-thread BLAS calls; raw-BLAS baselines: OpenBLAS threads = OpenMP threads";
  m["openblas_config"] = std::string(openblas_get_config());
#if defined(__clang__)
  m["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  m["compiler"] = std::string("gcc ") + __VERSION__;
#else
  m["compiler"] = "unknown";
#endif
  m["build_type"] = CF_BUILD_TYPE;
  m["cf_version"] = CF_VERSION;
  m["cuda_built"] = cf::cuda_built();
  m["device"] = g_device.str();
#ifdef CF_WITH_CUDA
  if (g_device.is_cuda()) {
    m["gpu"] = cf::bench::gpu_name(g_device.index);
    m["tf32"] = cf::cuda::allow_tf32();
    // The float32 attention paths (kernels/attention/attention.h; CF_{FLASH,BLOCK,ROUTED}_ATTENTION_PATH).
    const char* flash[] = {"auto", "gemm", "mma"};
    const char* block[] = {"auto", "fused", "gemm", "mma"};
    m["flash_attention_path"] = flash[int(cf::kernels::flash_attention_path())];
    m["block_attention_path"] = block[int(cf::kernels::block_attention_path())];
    const char* routed[] = {"auto", "fused", "mma"};
    m["routed_attention_path"] = routed[int(cf::kernels::routed_attention_path())];
  }
#endif
  return m;
}

}  // namespace

json report(const std::string& name, json results) {
  json out;
  out["bench"] = name;
  out["machine"] = machine_info();
  out["results"] = std::move(results);
  return out;
}

}  // namespace cf::bench
