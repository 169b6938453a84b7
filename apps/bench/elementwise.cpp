// cf-bench elementwise (apps/bench/bench.h).
#include <cstring>
#include <vector>

#include "bench/bench.h"
#ifdef CF_WITH_CUDA
#include "bench/cuda_baselines.h"
#endif

namespace cf::bench {

namespace {

// ---------------------------------------------------------------- elementwise

}  // namespace

json bench_elementwise(const BenchOptions& o) {
  int64_t n = o.numel;
  int64_t reps = o.repeat > 0 ? o.repeat : 5;
  double bytes1 = double(n) * sizeof(float);
  cf::Generator gen(7);
  cf::Tensor a = cf::rand({n}, cf::kFloat32, gen, -1, 1).to(g_device);
  cf::Tensor b = cf::rand({n}, cf::kFloat32, gen, -1, 1).to(g_device);
  cf::Tensor inplace = cf::clone(a);

  // Baseline: memcpy of one tensor's bytes into a buffer already touched (on
  // CUDA a device-to-device cudaMemcpy between two device buffers).
  double t_copy = 0;
  if (g_device.is_cuda()) {
#ifdef CF_WITH_CUDA
    cf::Tensor dst = cf::Tensor::zeros({n}, cf::kFloat32, g_device);
    t_copy = time_median(reps, [&] { cf::bench::device_copy(dst.raw_data(), a.raw_data(), size_t(bytes1)); });
#endif
  } else {
    std::vector<float> dst(size_t(n), 0.0f);
    t_copy = time_median(reps, [&] { std::memcpy(dst.data(), a.data<float>(), size_t(bytes1)); });
  }
  double gbps_copy = 2 * bytes1 / t_copy * 1e-9;  // read + write

  json rows = json::array();
  json base;
  base["name"] = g_device.is_cuda() ? "cudaMemcpy_d2d" : "memcpy";
  base["params"] = {{"numel", n}, {"dtype", "float32"}, {"repeat", reps},
                    {"bytes_moved", 2 * bytes1}};
  base["time_s"] = t_copy;
  base["gbps"] = gbps_copy;
  rows.push_back(base);

  struct Case {
    const char* name;
    int tensors_moved;  // inputs read + outputs written
    std::function<void()> f;
    const char* note;
  };
  cf::Tensor keep;
  // Row-wise ops over rows of 1024 (attention- and Transformer-like widths).
  const int64_t row = 1024;
  cf::Tensor rows2d = cf::reshape(a, {n / row, row});
  cf::Tensor ln_w = cf::Tensor::ones({row}, cf::kFloat32, g_device),
             ln_b = cf::Tensor::zeros({row}, cf::kFloat32, g_device);
  std::vector<Case> cases = {
      {"add", 3, [&] { keep = cf::Tensor(); keep = cf::add(a, b); }, "out = a + b (allocates out)"},
      {"mul", 3, [&] { keep = cf::Tensor(); keep = cf::mul(a, b); }, "out = a * b (allocates out)"},
      {"exp", 2, [&] { keep = cf::Tensor(); keep = cf::exp(a); }, "out = exp(a) (allocates out)"},
      {"softmax", 2, [&] { keep = cf::Tensor(); keep = cf::softmax(rows2d, -1); },
       "softmax over rows of 1024 (allocates out)"},
      {"layer_norm", 2, [&] { keep = cf::Tensor(); keep = cf::layer_norm(rows2d, {row}, ln_w, ln_b); },
       "layer_norm over rows of 1024 with weight and bias (allocates out)"},
      {"add_inplace", 3,
       [&] {
         cf::NoGradGuard ng;
         cf::add_(inplace, b);
       },
       "a += b in place (no allocation: the kernel's own bandwidth)"},
  };
  for (const Case& c : cases) {
    keep = cf::Tensor();
    cf::reset_peak_memory(g_device);
    double t = time_median(reps, c.f);
    double moved = c.tensors_moved * bytes1;
    json r;
    r["name"] = c.name;
    r["params"] = {{"numel", n}, {"dtype", "float32"}, {"repeat", reps}, {"bytes_moved", moved},
                   {"what", c.note}};
    r["time_s"] = t;
    r["gbps"] = moved / t * 1e-9;
    r["ratio_vs_memcpy"] = (moved / t * 1e-9) / gbps_copy;
    r["peak_bytes"] = cf::memory_stats(g_device).peak_bytes;
    rows.push_back(r);
  }
  return report("elementwise", rows);
}

}  // namespace cf::bench
