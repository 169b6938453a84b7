// Fixed sparse attention (Child et al. 2019, nn/attention/sparse.h): the pattern's index lists against the
// pattern written from its definition, the module against dense attention over that pattern (padding, causal,
// partial last block), gradients, options and errors, and a causal LM that learns through it.
#include <cmath>

#include "nn/attention/full.h"
#include "nn/attention/multi_head.h"
#include "nn/attention/sparse.h"
#include "nn/nn_test_util.h"
#include "nn/pattern_lm.h"

using namespace cf;
using namespace cf::test;

namespace {

// Dense attention over A(1) u A(2) of the header, plus the usual padding and causal masks.
Tensor dense_sparse_reference(const nn::AttentionArgs& a, int64_t block, int64_t summary) {
  const int64_t n = a.q.shape()[2];
  Tensor blocked = reshape(nn::fixed_sparse_blocked(n, block, summary), {1, 1, n, n});
  Tensor other = nn::dense_block_mask(a);
  if (other.defined()) blocked = logical_or(blocked, other);
  return nn::dense_attention(a.q, a.k, a.v, blocked, 1.0 / std::sqrt(double(a.q.shape()[3])));
}

}  // namespace

TEST_CASE("sparse attention: the fixed pattern from its definition (l = 3, c = 1, n = 7)") {
  // Blocks {0,1,2} {3,4,5} {6}; summary cells j mod 3 == 2: positions 2 and 5 (block 2 has none yet).
  Tensor b = nn::fixed_sparse_blocked(7, 3, 1);
  const std::vector<bool> row4 = {true, true, false, false, false, false, true};  // block {3,4,5} and summary 2
  const std::vector<bool> row6 = {true, true, false, true, true, false, false};  // itself and summaries 2, 5
  CHECK(narrow(b, 0, 4, 1).to_vector<bool>() == row4);
  CHECK(narrow(b, 0, 6, 1).to_vector<bool>() == row6);
  Tensor qm, km;
  nn::fixed_sparse_members(7, 3, 1, false, qm, km);
  CHECK(qm.shape() == Shape{1, 1, 3, 3});
  CHECK(km.shape() == Shape{1, 1, 3, 5});  // l + (C - 1) c = 3 + 2
  CHECK(qm.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, -1, -1});
  CHECK(km.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 5, -1, 3, 4, 5, 2, -1, 6, -1, -1, 2, 5});
  nn::fixed_sparse_members(7, 3, 1, true, qm, km);  // causal: no later block's summary
  CHECK(km.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, -1, -1, 3, 4, 5, 2, -1, 6, -1, -1, 2, 5});
}

TEST_CASE("sparse attention: equals dense attention over the pattern, forward and backward (float64)") {
  // n = 11 with l = 4 leaves a partial last block whose summary cell (j mod 4 >= 2) holds position 10 only.
  for (int64_t c : {1, 2, 4})
    for (bool causal : {false, true})
      for (bool padded : {false, true}) {
        INFO("c ", c, " causal ", causal, " padded ", padded);
        nn::SparseAttention att(4, c);
        Tensor q = leaf64({2, 2, 11, 3}, 1), k = leaf64({2, 2, 11, 3}, 2), v = leaf64({2, 2, 11, 5}, 3);
        Tensor m = padded ? pad_mask(2, 11, {{0, 10}, {1, 2}, {1, 9}}) : Tensor();
        Tensor wo = leaf64({2, 2, 11, 5}, 4).detach();
        nn::AttentionArgs a = attention_args(q, k, v, m, causal);
        Tensor fast = att.forward(a);
        sum(fast * wo).backward();
        std::vector<Tensor> g = {q.grad(), k.grad(), v.grad()};
        q.zero_grad();
        k.zero_grad();
        v.zero_grad();
        Tensor dense = dense_sparse_reference(a, 4, c);
        sum(dense * wo).backward();
        check_close(fast, dense, 1e-12);
        check_close(g[0], q.grad(), 1e-12);
        check_close(g[1], k.grad(), 1e-12);
        check_close(g[2], v.grad(), 1e-12);
      }
}

TEST_CASE("sparse attention: c = l and a single block are full attention, and the default l and c") {
  Tensor q = leaf64({1, 2, 9, 4}, 5), k = leaf64({1, 2, 9, 4}, 6), v = leaf64({1, 2, 9, 3}, 7);
  nn::FullAttention full;
  for (bool causal : {false, true}) {
    INFO("causal ", causal);
    nn::AttentionArgs a = attention_args(q, k, v, pad_mask(1, 9, {{0, 8}}), causal);
    Tensor ref = full.forward(a);
    check_close(nn::SparseAttention(3, 3).forward(a), ref, 1e-12);  // every cell is a summary cell
    check_close(nn::SparseAttention(9, 1).forward(a), ref, 1e-12);  // one block
    check_close(nn::SparseAttention(16, 2).forward(a), ref, 1e-12);  // a block longer than the sequence
  }
  nn::SparseAttention d;
  CHECK(d.block_for(9) == 3);
  CHECK(d.block_for(10) == 4);  // ceil(sqrt(10))
  CHECK(d.block_for(128) == 12);
  CHECK(d.summary_for(12) == 3);  // l / 4
  CHECK(d.summary_for(3) == 1);
  CHECK(nn::SparseAttention(0, 5).summary_for(3) == 3);  // a given c never exceeds a derived l
  nn::AttentionArgs a = attention_args(q, k, v, Tensor(), true);
  check_close(d.forward(a), dense_sparse_reference(a, 3, 1), 1e-12);
}

TEST_CASE("sparse attention: float64 gradcheck through MultiHeadAttention, built by name") {
  Generator g(2);
  nn::AttentionSpec spec;
  spec.type = "sparse";
  spec.d_model = 8;
  spec.n_heads = 2;
  spec.options = nn::Config(nlohmann::json{{"block_size", 3}, {"summary", 1}}, "attention");
  nn::MultiHeadAttention mha(8, 2, nn::make_attention(spec), g);
  CHECK(mha.attention().type() == "sparse");
  mha.to(kFloat64);
  Tensor mask = pad_mask(1, 7, {{0, 6}});
  for (bool causal : {false, true}) {
    INFO("causal ", causal);
    check_module_grad(mha, [&](const std::vector<Tensor>& xs) { return mha(xs[0], mask, causal); },
                      {leaf64({1, 7, 8}, 4)});
  }
}

TEST_CASE("sparse attention: bad arguments and options are errors naming the values") {
  CHECK_THROWS_MSG(nn::SparseAttention(-1), ValueError,
                   "[SparseAttention] block_size and summary must be >= 0 (0: the default), got block_size=-1");
  CHECK_THROWS_MSG(nn::SparseAttention(4, 5), ValueError, "[SparseAttention] summary (c = 5) must be <= block_size (l = 4)");
  CHECK_THROWS_MSG(nn::SparseAttention(4, 1, -1.0), ValueError, "[SparseAttention] scale must be >= 0");
  nn::SparseAttention att(4, 1);
  Tensor q = leaf64({1, 2, 5, 4});
  CHECK_THROWS_MSG(att.forward(attention_args(q, leaf64({1, 2, 6, 4}), leaf64({1, 2, 6, 4}), Tensor(), false)), ShapeError,
                   "[SparseAttention] the fixed pattern is self-attention: q has 5 positions, k 6");
  CHECK_THROWS_MSG(att.forward(attention_args(q, leaf64({1, 2, 5, 3}), q, Tensor(), false)), ShapeError,
                   "[SparseAttention] inconsistent shapes");
  Tensor qm, km;
  CHECK_THROWS_MSG(nn::fixed_sparse_members(5, 0, 1, false, qm, km), ValueError,
                   "[fixed_sparse_members] needs n >= 0, block size l >= 1 and 1 <= summary c <= l; got n=5 l=0 c=1");
  CHECK_THROWS_MSG(nn::fixed_sparse_blocked(5, 2, 3), ValueError, "[fixed_sparse_blocked]", "l=2 c=3");
  {  // An empty sequence gives an empty output.
    Tensor z = leaf64({1, 2, 0, 4});
    CHECK(att.forward(attention_args(z, z, z, Tensor(), true)).shape() == Shape{1, 2, 0, 4});
  }
  for (bool causal : {false, true}) {  // A block longer than the sequence is one block of N (it allocated 2^40 slots).
    nn::SparseAttention huge(int64_t(1) << 40, 1), exact(5, 1);
    Tensor k = leaf64({1, 2, 5, 4}, 2), v = leaf64({1, 2, 5, 4}, 3);
    check_close(huge.forward(attention_args(q, k, v, Tensor(), causal)),
                exact.forward(attention_args(q, k, v, Tensor(), causal)), 0);
  }
  nn::AttentionSpec spec;
  spec.type = "sparse";
  spec.d_model = 8;
  spec.n_heads = 2;
  spec.options = nn::Config(nlohmann::json{{"block", 2}}, "attention");
  CHECK_THROWS_MSG(nn::make_attention(spec), ValueError, "unknown key", "attention.block");
  spec.options = nn::Config(nlohmann::json{{"block_size", 2}, {"summary", 3}}, "attention");
  CHECK_THROWS_MSG(nn::make_attention(spec), ValueError, "summary (c = 3) must be <= block_size (l = 2)");
}

// The repeating-pattern corpus of the Transformer tests (period 6: the next token depends on the last two).
// Blocks of 4 with one summary cell: a query at a block's start sees the previous token only through the
// summary cell, two tokens back only through the first layer's summary output.
TEST_CASE("sparse attention: a causal LM with the fixed pattern learns the pattern corpus" * CF_SLOW) {
  Generator g(test_seed(9));
  models::CausalLM lm(pattern_lm_config("sparse", {{"block_size", 4}, {"summary", 1}}), g);
  const PatternLMRun r = train_pattern_lm(lm, 150);
  MESSAGE("sparse causal LM: loss ", r.first, " -> ", r.last, ", held-out ", r.held_out, " nats/token");
  CHECK(r.held_out < 0.1);
}
