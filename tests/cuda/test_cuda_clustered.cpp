// Clustered and improved clustered attention (causal too) on CUDA against the
// CPU with a given assignment: the same output and input gradients, with
// padding. Their ops' parity cases: tests/ops/test_clustering.cpp and test_sparse.cpp.
#include "cuda/cuda_test_util.h"
#include "nn/attention/clustered.h"

using namespace cf;
using namespace cf::test;

TEST_SUITE("cuda/clustered") {

CUDA_TEST_CASE("clustered and improved clustered attention (causal, dropout too) on CUDA equal the CPU with a given assignment") {
  const int64_t B = 2, H = 2, N = 20, D = 8, C = 5;
  std::vector<int64_t> a;
  for (int64_t i = 0; i < B * H * N; ++i) a.push_back((i * 7 + i / 3) % C);
  a[3] = -1;  // a query without a cluster (padding)
  const Tensor assignment = Tensor::from_vector(a, {B, H, N});
  std::vector<bool> pv(size_t(B * N), false);
  for (int64_t j = N - 4; j < N; ++j) pv[size_t(N + j)] = true;  // batch row 1: 4 padded keys
  const Tensor pad = Tensor::from_vector(pv, {B, N});
  // With attention-weight dropout in training too: a generator of one state on each device, so
  // the same centroid and top-k weights drop (the fused path through the flash GEMM path and
  // ops::dropout_scale_at's kernel).
  for (double rate : {0.0, 0.3})
    for (int64_t topk : {0, 3, 32})
      for (bool causal : {false, true})
        for (nn::CentroidPath path : {nn::CentroidPath::kFused, nn::CentroidPath::kDense}) {
          if (causal && topk == 0) continue;  // plain clustered attention refuses causal masks
          if (causal && path == nn::CentroidPath::kDense) continue;  // causal forms no centroid weights
          INFO("topk ", topk, causal ? " (causal)" : "", path == nn::CentroidPath::kFused ? " fused" : " dense",
               " dropout ", rate);
          ParityOptions opt;
          opt.atol = 1e-10;
          opt.rtol = 1e-9;
          check_parity("clustered_attention",
                       [&](const std::vector<Tensor>& x) {
                         const Device d = x[0].device();
                         Generator g(77);
                         g.reserve(31);
                         return nn::clustered_attention(x[0], x[1], x[2], assignment.to(d), C, pad.to(d), 0.35, topk,
                                                        rate, rate > 0, g, causal, path);
                       },
                       {leaf64({B, H, N, D}, 1), leaf64({B, H, N, D}, 2), leaf64({B, H, N, D}, 3)}, opt);
        }
}

}  // TEST_SUITE
