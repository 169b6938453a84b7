// Clustered attention's kernels on CUDA (kernels/clustered/clustered_cuda.cu)
// against the CPU: sign hashing and Hamming K-Means give the same integers, the
// sparse products and their scatter the same values and gradients, and the
// clustered / improved clustered computation with a given assignment the same
// output and input gradients, with padding.
#include <random>

#include "cuda/cuda_test_util.h"
#include "nn/attention/clustered.h"
#include "nn/attention/hamming_kmeans.h"
#include "nn/attention/sparse_products.h"

using namespace cf;
using namespace cf::test;

namespace {

// Codes of `bits` bits around `groups` random centres per row, each bit flipped
// with probability 0.1: planted clusters for Hamming K-Means.
Tensor planted_codes(int64_t rows, int64_t n, int64_t groups, int64_t bits, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution flip(0.1);
  std::vector<int64_t> v;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<uint64_t> centre(static_cast<size_t>(groups));
    for (auto& c : centre) c = rng() & ((uint64_t(1) << bits) - 1);
    for (int64_t i = 0; i < n; ++i) {
      uint64_t c = centre[size_t(i % groups)];
      for (int64_t b = 0; b < bits; ++b)
        if (flip(rng)) c ^= uint64_t(1) << b;
      v.push_back(int64_t(c));
    }
  }
  return Tensor::from_vector(v, {rows, n});
}

}  // namespace

TEST_SUITE("cuda/clustered") {

CUDA_TEST_CASE("hash_codes on CUDA gives the CPU's codes") {
  Generator g(3);
  const Tensor x = rand({2, 3, 40, 16}, kFloat64, g, -1, 1);
  const Tensor planes = nn::random_hyperplanes(63, 16, kFloat64, g);
  const Tensor c = nn::hash_codes(x, planes), gc = nn::hash_codes(cuda0(x), cuda0(planes));
  CHECK(gc.device().is_cuda());
  CHECK(gc.shape() == c.shape());
  CHECK(gc.cpu().to_vector<int64_t>() == c.to_vector<int64_t>());
}

CUDA_TEST_CASE("Hamming K-Means on CUDA gives the CPU's clusters, with exclusions and small rows") {
  for (int64_t bits : {8, 31, 63}) {
    INFO("bits ", bits);
    const int64_t rows = 5, n = 70;
    const Tensor codes = planted_codes(rows, n, 6, bits, uint32_t(bits));
    // Row 1: padded tail; row 2: all padding; row 3: only 3 valid entries (fewer
    // than the clusters); rows 0 and 4: everything valid.
    std::vector<bool> ex(size_t(rows * n), false);
    for (int64_t i = 50; i < n; ++i) ex[size_t(1 * n + i)] = true;
    for (int64_t i = 0; i < n; ++i) ex[size_t(2 * n + i)] = true;
    for (int64_t i = 3; i < n; ++i) ex[size_t(3 * n + i)] = true;
    const Tensor excl = Tensor::from_vector(ex, {rows, n});
    for (int64_t clusters : {1, 6, 20, 100}) {
      INFO("clusters ", clusters);
      for (int64_t iterations : {0, 1, 10}) {
        const Tensor c = nn::hamming_kmeans(codes, clusters, iterations, bits, excl);
        const Tensor gc = nn::hamming_kmeans(cuda0(codes), clusters, iterations, bits, cuda0(excl));
        CHECK(gc.device().is_cuda());
        CHECK(gc.cpu().to_vector<int64_t>() == c.to_vector<int64_t>());
      }
    }
    // Without an exclusion mask, and with duplicate codes (re-seeding stops).
    const Tensor dup = Tensor::from_vector(std::vector<int64_t>(40, 5), {1, 40});
    CHECK(nn::hamming_kmeans(cuda0(dup), 4, 10, bits).cpu().to_vector<int64_t>() ==
          nn::hamming_kmeans(dup, 4, 10, bits).to_vector<int64_t>());
    CHECK(nn::hamming_kmeans(cuda0(codes), 6, 10, bits).cpu().to_vector<int64_t>() ==
          nn::hamming_kmeans(codes, 6, 10, bits).to_vector<int64_t>());
  }
}

CUDA_TEST_CASE("sparse products on CUDA: forward and gradients equal the CPU's, repeated keys included") {
  // idx with many repeats (keys in [0, 5) for M = 7): the scatter adds several
  // terms into one row.
  const Tensor idx = random_ints({3, 9, 4}, 0, 4, 17);
  for (bool f64 : {true, false}) {
    INFO((f64 ? "float64" : "float32"));
    auto leaf = [&](const Shape& s, uint64_t seed) { return f64 ? leaf64(s, seed) : leaf32(s, seed); };
    ParityOptions opt;
    if (!f64) opt.atol = 1e-5, opt.rtol = 1e-4;
    else opt.atol = 1e-12, opt.rtol = 1e-12;
    check_parity("sparse_dot",
                 [&](const std::vector<Tensor>& x) { return nn::sparse_dot(x[0], x[1], idx.to(x[0].device())); },
                 {leaf({3, 9, 5}, 1), leaf({3, 7, 5}, 2)}, opt);
    check_parity("sparse_weighted_sum",
                 [&](const std::vector<Tensor>& x) {
                   return nn::sparse_weighted_sum(x[0], x[1], idx.to(x[0].device()));
                 },
                 {leaf({3, 9, 4}, 3), leaf({3, 7, 6}, 4)}, opt);
  }
}

CUDA_TEST_CASE("clustered and improved clustered attention (causal too) on CUDA equal the CPU with a given assignment") {
  const int64_t B = 2, H = 2, N = 20, D = 8, C = 5;
  std::vector<int64_t> a;
  for (int64_t i = 0; i < B * H * N; ++i) a.push_back((i * 7 + i / 3) % C);
  a[3] = -1;  // a query without a cluster (padding)
  const Tensor assignment = Tensor::from_vector(a, {B, H, N});
  std::vector<bool> pv(size_t(B * N), false);
  for (int64_t j = N - 4; j < N; ++j) pv[size_t(N + j)] = true;  // batch row 1: 4 padded keys
  const Tensor pad = Tensor::from_vector(pv, {B, N});
  for (int64_t topk : {0, 3, 32})
    for (bool causal : {false, true}) {
      if (causal && topk == 0) continue;  // plain clustered attention refuses causal masks
      INFO("topk ", topk, causal ? " (causal)" : "");
      ParityOptions opt;
      opt.atol = 1e-10;
      opt.rtol = 1e-9;
      check_parity("clustered_attention",
                   [&](const std::vector<Tensor>& x) {
                     const Device d = x[0].device();
                     return nn::clustered_attention(x[0], x[1], x[2], assignment.to(d), C, pad.to(d), 0.35, topk, 0.0,
                                                    false, default_generator(), causal);
                   },
                   {leaf64({B, H, N, D}, 1), leaf64({B, H, N, D}, 2), leaf64({B, H, N, D}, 3)}, opt);
    }
}

}  // TEST_SUITE
