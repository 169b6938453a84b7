// cf-bench select (apps/bench/bench.h): the selection steps of clustered
// attention. cf::topk of k among N float32 scores per line (improved clustered
// attention's top-k keys per centroid) and cf::hamming_kmeans of N 63-bit query
// codes per row (clustered attention's grouping), each with a baseline timed in
// the same run on the CPU.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops/clustering.h"
#include "bench/bench.h"
#include "kernels/kmeans/hamming.h"

namespace cf::bench {

namespace {

// Lines and rows per case: the sizes of the cf-approx per-token model at N = 512
// (batch 16, 4 heads, 100 clusters: 6,400 lines of top-k, 64 rows of codes), the
// same element count at other N.
int64_t topk_lines(int64_t n) { return std::max<int64_t>(1, 3276800 / n); }
int64_t kmeans_rows(int64_t n) { return std::max<int64_t>(1, 32768 / n); }

// The textbook top-k the baseline runs: per line, std::partial_sort of (value,
// position) pairs, larger value first and ties to the lower position (cf::topk's
// order on NaN-free data), lines split over as many OpenMP threads as cf's kernels use.
void partial_sort_topk(const float* x, int64_t lines, int64_t n, int64_t k, int64_t* out) {
#pragma omp parallel num_threads(cf::get_num_threads())
  {
    std::vector<std::pair<float, int64_t>> buf(static_cast<size_t>(n));
#pragma omp for schedule(static)
    for (int64_t l = 0; l < lines; ++l) {
      for (int64_t j = 0; j < n; ++j) buf[size_t(j)] = {x[l * n + j], j};
      std::partial_sort(buf.begin(), buf.begin() + k, buf.end(), [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
      });
      for (int64_t j = 0; j < k; ++j) out[l * k + j] = buf[size_t(j)].second;
    }
  }
}

json topk_row(const BenchOptions& o, int64_t n, bool rising) {
  const int64_t lines = topk_lines(n), k = std::min(o.topk, n);
  const int64_t reps = o.repeat > 0 ? o.repeat : 5;
  cf::Generator gen{uint64_t(n * 17 + (rising ? 1 : 0))};
  cf::Tensor x = cf::randn({lines, n}, cf::kFloat32, gen);
  // rising: every line in ascending order, the order in which every score enters a heap
  if (rising) x = cf::sort(x, -1).values;
  const cf::Tensor xd = x.to(g_device);
  const double t_cf = time_median(reps, [&] { cf::ValuesIndices r = cf::topk(xd, k, -1); });
  json r;
  r["name"] = std::string("topk_") + (rising ? "rising" : "random") + "_n" + std::to_string(n) + "_k" +
              std::to_string(k);
  r["params"] = {{"lines", lines}, {"n", n}, {"k", k}, {"data", rising ? "rising" : "random"},
                 {"dtype", "float32"}, {"repeat", reps}};
  r["time_s"] = t_cf;
  r["ns_per_element"] = t_cf / double(lines * n) * 1e9;
  if (g_device.is_cpu()) {
    std::vector<int64_t> idx(size_t(lines * k));
    const double t_base = time_median(reps, [&] { partial_sort_topk(x.data<float>(), lines, n, k, idx.data()); });
    r["params"]["baseline"] = "std::partial_sort of (value, position) pairs per line, lines over the OpenMP threads";
    r["partial_sort_time_s"] = t_base;
    r["ratio_vs_partial_sort"] = t_base / t_cf;
    // the same answer, or the ratio means nothing
    r["same_indices_as_baseline"] = cf::topk(x, k, -1).indices.to_vector<int64_t>() == idx;
  }
  return r;
}

json hamming_row(const BenchOptions& o, int64_t n) {
  const int64_t rows = kmeans_rows(n), bits = 63, iterations = 10;
  const int64_t reps = o.repeat > 0 ? o.repeat : 5;
  cf::Generator gen{uint64_t(n * 29)};
  const cf::Tensor codes = cf::randint(0, int64_t(1) << 62, {rows, n}, gen) * 2 +
                           cf::randint(0, 2, {rows, n}, gen);  // 63 random bits
  const cf::Tensor cd = codes.to(g_device);
  const double t_cf =
      time_median(reps, [&] { cf::Tensor ids = cf::hamming_kmeans(cd, o.clusters, iterations, bits); });
  json r;
  r["name"] = "hamming_kmeans_n" + std::to_string(n) + "_c" + std::to_string(o.clusters);
  r["params"] = {{"rows", rows}, {"n", n}, {"clusters", o.clusters}, {"bits", bits},
                 {"iterations", iterations}, {"repeat", reps}};
  r["time_s"] = t_cf;
  if (g_device.is_cpu()) {
    // The CPU kernel's scalar form: what runs on a CPU without AVX-512 VPOPCNTDQ.
    cf::Tensor out = cf::Tensor::empty({rows, n}, cf::kInt64);
    const double t_scalar = time_median(reps, [&] {
      cf::kernels::hamming_kmeans_cpu(codes, cf::Tensor(), o.clusters, iterations, bits, out, false);
    });
    // the same ids from both forms, or the ratio means nothing
    cf::Tensor vec = cf::Tensor::empty({rows, n}, cf::kInt64);
    cf::kernels::hamming_kmeans_cpu(codes, cf::Tensor(), o.clusters, iterations, bits, vec, true);
    r["same_ids_as_scalar"] = vec.to_vector<int64_t>() == out.to_vector<int64_t>();
    r["params"]["vectorised"] = cf::kernels::hamming_kmeans_vectorised();
    r["params"]["baseline"] = "the same kernel's scalar form (one popcount and branch per code and centroid)";
    r["scalar_time_s"] = t_scalar;
    r["ratio_vs_scalar"] = t_scalar / t_cf;
  }
  return r;
}

}  // namespace

json bench_select(const BenchOptions& o) {
  json rows = json::array();
  for (int64_t n : o.sizes) {
    rows.push_back(topk_row(o, n, false));
    rows.push_back(topk_row(o, n, true));
    rows.push_back(hamming_row(o, n));
  }
  return report("select", rows);
}

}  // namespace cf::bench
