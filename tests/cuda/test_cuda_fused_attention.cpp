// The fused attention kernels (kernels/attention/attention_cuda.cu) against the
// CPU: flash_attention and block_attention, forward and input gradients, with
// padding, causal, Nq != Nk, sizes off the 32 x 32 CUDA tiles (and off the CPU's
// 64 x 128), fully masked rows, empty slots, tokens in no slot, look_back 0/1/2
// with look_ahead, self mask, shared and per-head member tables, head sizes that
// need more than 48 KiB of shared memory; float64 gradchecks on the GPU.
//
// Tolerances: both devices accumulate the dot products in float32 in a different
// order (BLAS tiles on the CPU, per-thread loops on the GPU), over Dk <= 128 and
// windows of up to a few hundred keys: atol 1e-5, rtol 1e-4 (the default) hold
// for the forward; gradients sum over every query, so they get rtol 1e-3.
#include <random>

#include "autograd/ops/attention.h"
#include "cuda/cuda_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

Tensor padding_mask(int64_t B, int64_t N, int64_t padded_in_last) {
  std::vector<bool> m(size_t(B * N), false);
  for (int64_t j = N - padded_in_last; j < N; ++j) m[size_t((B - 1) * N + j)] = true;
  return Tensor::from_vector(m, {B, N});
}

// members (B, Hm, C, w) from a random permutation of N per (b, hm), with `holes`
// tokens left out (in no slot) and the last chunk's tail empty.
Tensor random_members(int64_t B, int64_t Hm, int64_t N, int64_t w, int64_t holes, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t kept = N - holes, C = (kept + w - 1) / w;
  std::vector<int64_t> m;
  for (int64_t bh = 0; bh < B * Hm; ++bh) {
    std::vector<int64_t> perm(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) perm[size_t(i)] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t s = 0; s < C * w; ++s) m.push_back(s < kept ? perm[size_t(s)] : -1);
  }
  return Tensor::from_vector(m, {B, Hm, C, w});
}

// lse with its -inf entries (tokens with nothing to attend to) as 0, so a
// projection of it has finite gradients.
Tensor finite_lse(const Tensor& lse) { return masked_fill(lse, eq(lse, -INFINITY), 0.0); }

ParityOptions grad_tolerance() {
  ParityOptions o;
  o.rtol = 1e-3;
  return o;
}

}  // namespace

TEST_SUITE("cuda/fused_attention") {

PARITY_CASE("flash_attention") {
  struct Case {
    int64_t B, H, Nq, Nk, Dk, Dv, padded;
    double scale;
  };
  // Off-tile sizes, Nq > Nk (causal: early queries see nothing), Nq < Nk, one
  // row, head sizes 64 and 128 (over 48 KiB of shared memory in the backward).
  const std::vector<Case> cases = {{2, 2, 70, 45, 16, 24, 5, 0.0}, {1, 3, 45, 70, 8, 8, 0, 0.7},
                                   {2, 1, 100, 100, 64, 64, 31, 0.0}, {1, 1, 1, 33, 4, 4, 0, 0.0},
                                   {1, 2, 40, 40, 128, 128, 3, 0.0}};
  uint64_t seed = 100;
  for (const Case& c : cases)
    for (bool causal : {false, true}) {
      INFO("Nq ", c.Nq, " Nk ", c.Nk, " Dk ", c.Dk, " causal ", causal);
      Tensor kpm = c.padded ? padding_mask(c.B, c.Nk, c.padded) : Tensor();
      check_parity(
          "flash_attention",
          [&](const std::vector<Tensor>& x) {
            return flash_attention(x[0], x[1], x[2], kpm.defined() ? kpm.to(x[0].device()) : Tensor(), c.scale,
                                   causal);
          },
          {leaf32({c.B, c.H, c.Nq, c.Dk}, seed++), leaf32({c.B, c.H, c.Nk, c.Dk}, seed++),
           leaf32({c.B, c.H, c.Nk, c.Dv}, seed++)},
          grad_tolerance());
    }
  // Every key of batch 1 padded: zeros and zero gradients on both devices.
  Tensor all = padding_mask(2, 20, 20);
  check_parity("flash_attention",
               [&](const std::vector<Tensor>& x) { return flash_attention(x[0], x[1], x[2], all.to(x[0].device())); },
               {leaf32({2, 2, 9, 8}, 7), leaf32({2, 2, 20, 8}, 8), leaf32({2, 2, 20, 8}, 9)}, grad_tolerance());
}

CUDA_TEST_CASE("flash_attention float64 gradcheck on CUDA") {
  Tensor kpm = padding_mask(2, 6, 2).to(Device::cuda(0));
  for (bool causal : {false, true})
    check_grad_cuda("flash_attention",
                    [&](const std::vector<Tensor>& x) { return flash_attention(x[0], x[1], x[2], kpm, 0.0, causal); },
                    {leaf64({2, 2, 5, 3}, 1), leaf64({2, 2, 6, 3}, 2), leaf64({2, 2, 6, 2}, 3)});
}

PARITY_CASE("block_attention") {
  struct Case {
    int64_t B, H, Hm, N, w, holes, Dk, padded;
  };
  // w = 40 crosses the 32-row tiles; holes leave tokens in no slot; w = 5 gives
  // many small chunks; Dk 128 needs the shared-memory opt-in.
  const std::vector<Case> cases = {{2, 2, 1, 100, 40, 7, 16, 9}, {1, 2, 2, 50, 5, 0, 8, 0},
                                   {2, 1, 1, 64, 16, 3, 128, 4}};
  uint64_t seed = 200;
  uint32_t mseed = 1;
  for (const Case& c : cases) {
    Tensor members = random_members(c.B, c.Hm, c.N, c.w, c.holes, mseed++);
    Tensor kpm = c.padded ? padding_mask(c.B, c.N, c.padded) : Tensor();
    for (int64_t back : {0, 1, 2})
      for (bool causal : {false, true}) {
        BlockAttentionOptions o;
        o.look_back = back;
        o.look_ahead = back == 2 ? 1 : 0;
        o.causal = causal;
        o.self_mask = causal && back == 1;
        INFO("N ", c.N, " w ", c.w, " Hm ", c.Hm, " look_back ", back, " causal ", causal);
        std::vector<Tensor> in = {leaf32({c.B, c.H, c.N, c.Dk}, seed), leaf32({c.B, c.H, c.N, c.Dk}, seed + 1),
                                  leaf32({c.B, c.H, c.N, 12}, seed + 2)};
        seed += 3;
        auto run = [&](const std::vector<Tensor>& x) {
          const Device d = x[0].device();
          return block_attention(x[0], x[1], x[2], members.to(d), kpm.defined() ? kpm.to(d) : Tensor(), o);
        };
        check_parity("block_attention", [&](const std::vector<Tensor>& x) { return run(x).out; }, in,
                     grad_tolerance());
        // lse's own gradient path (LSH combines hashing rounds through it).
        check_parity("block_attention", [&](const std::vector<Tensor>& x) { return finite_lse(run(x).lse); }, in,
                     grad_tolerance());
      }
  }
}

CUDA_TEST_CASE("block_attention float64 gradcheck on CUDA") {
  Tensor members = random_members(2, 1, 9, 3, 1, 5).to(Device::cuda(0));
  Tensor kpm = padding_mask(2, 9, 2).to(Device::cuda(0));
  BlockAttentionOptions o;
  o.look_back = 1;
  o.causal = true;
  o.self_mask = true;
  check_grad_cuda("block_attention",
                  [&](const std::vector<Tensor>& x) {
                    BlockAttentionResult r = block_attention(x[0], x[1], x[2], members, kpm, o);
                    return sum(r.out * r.out) + sum(masked_fill(r.lse, lt(r.lse, -1e4), 0.0));
                  },
                  {leaf64({2, 2, 9, 3}, 1), leaf64({2, 2, 9, 3}, 2), leaf64({2, 2, 9, 2}, 3)});
}

}  // TEST_SUITE
