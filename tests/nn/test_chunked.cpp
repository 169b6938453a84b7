// The shared sort-and-chunk attention (nn/attention/chunked.h) against its dense
// reference and against full attention.
#include <cmath>

#include "nn/attention/chunked.h"
#include "nn/nn_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

// A random permutation per (batch, head), as a sort order (B, Hm, N).
Tensor random_order(int64_t B, int64_t Hm, int64_t N, uint64_t seed) {
  Generator gen{seed};
  return argsort(rand({B, Hm, N}, kFloat64, gen), -1);
}

// Checks out and lse of the efficient path against the dense reference, and the
// gradients of a random projection of both with respect to q, k and v (H heads;
// out and lse have H * o.rounds, or H when the rounds are combined). With o.dropout,
// each side draws from its own generator, both started mid-stream at one state: the
// same weights must drop, and the same counters be reserved.
void check_against_dense(const Tensor& members, const Tensor& kpm, const nn::ChunkedAttentionOptions& options,
                         int64_t H = 2, int64_t N = 10, double tol = 1e-12) {
  Generator gen_fast(91), gen_dense(91);
  gen_fast.reserve(12345);
  gen_dense.reserve(12345);
  nn::ChunkedAttentionOptions o = options, od = options;
  o.generator = &gen_fast;
  od.generator = &gen_dense;
  Tensor q = leaf64({2, H, N, 3}, 11), k = leaf64({2, H, N, 3}, 12), v = leaf64({2, H, N, 4}, 13);
  const int64_t Ho = o.combine_rounds ? H : H * o.rounds;
  Tensor wo = leaf64({2, Ho, N, 4}, 14).detach(), wl = leaf64({2, Ho, N}, 15).detach();
  auto loss = [&](const nn::ChunkedAttentionResult& r) {
    // lse is -inf for tokens with nothing to attend to: leave those out of the loss.
    Tensor finite = masked_fill(r.lse, eq(r.lse, -INFINITY), 0.0);
    return sum(r.out * wo) + sum(finite * wl);
  };
  nn::ChunkedAttentionResult fast = nn::chunked_attention(q, k, v, members, kpm, o);
  loss(fast).backward();
  std::vector<Tensor> g_fast = {q.grad(), k.grad(), v.grad()};
  q.zero_grad();
  k.zero_grad();
  v.zero_grad();
  nn::ChunkedAttentionResult dense = nn::chunked_dense_attention(q, k, v, members, kpm, od);
  loss(dense).backward();
  CHECK(gen_fast.offset() == gen_dense.offset());
  check_close(fast.out, dense.out, tol);
  auto lf = values(fast.lse), ld = values(dense.lse);
  REQUIRE(lf.size() == ld.size());
  for (size_t i = 0; i < lf.size(); ++i) {
    if (std::isinf(ld[i])) {
      CHECK(lf[i] == ld[i]);
    } else {
      CHECK(lf[i] == doctest::Approx(ld[i]).epsilon(tol));
    }
  }
  check_close(g_fast[0], q.grad(), tol);
  check_close(g_fast[1], k.grad(), tol);
  check_close(g_fast[2], v.grad(), tol);
}

Tensor padding_mask_2x10() {
  std::vector<bool> m(20, false);
  m[17] = m[18] = m[19] = true;  // batch 1: the last three tokens are padding
  return Tensor::from_vector(m, {2, 10});
}

}  // namespace

TEST_CASE("chunked attention equals its dense reference, forward and backward, under every rule, with dropout too") {
  Tensor kpm = padding_mask_2x10();
  for (int64_t hm : {int64_t(1), int64_t(2)})
    for (int64_t w : {int64_t(3), int64_t(4)})  // 10 tokens: the last chunk has empty slots
      for (bool causal : {false, true})
        for (bool self : {false, true})
          for (int64_t back : {int64_t(0), int64_t(1), int64_t(2)})
            for (double drop : {0.0, 0.3}) {  // with a rate: the weights the dense reference drops
              CAPTURE(hm);
              CAPTURE(w);
              CAPTURE(causal);
              CAPTURE(self);
              CAPTURE(back);
              CAPTURE(drop);
              nn::ChunkedAttentionOptions o;
              o.look_back = back;
              o.look_ahead = back == 2 ? 1 : 0;
              o.causal = causal;
              o.self_mask = self;
              o.dropout = drop;
              Tensor members = nn::chunk_order(random_order(2, hm, 10, uint64_t(7 + w + hm)), w);
              check_against_dense(members, kpm, o);
            }
}

TEST_CASE("chunked attention equals its dense reference on chunks large enough for the parallel kernel") {
  std::vector<bool> m(1200, false);
  for (int64_t j = 1190; j < 1200; ++j) m[size_t(j)] = true;
  Tensor kpm = Tensor::from_vector(m, {2, 600});
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    nn::ChunkedAttentionOptions o;
    o.look_back = 1;
    o.causal = causal;
    check_against_dense(nn::chunk_order(random_order(2, 2, 600, 31), 32), kpm, o, 2, 600);
  }
}

TEST_CASE("chunked attention over rounds (a table per head and round, one q, k, v) equals its dense reference") {
  // The dense reference repeats q, k, v per round; the kernels read them through
  // each round's table and sum the rounds' gradients.
  Tensor kpm = padding_mask_2x10();
  for (int64_t rounds : {int64_t(2), int64_t(3)})
    for (bool causal : {false, true})
      for (int64_t back : {int64_t(0), int64_t(1), int64_t(2)}) {
        CAPTURE(rounds);
        CAPTURE(causal);
        CAPTURE(back);
        nn::ChunkedAttentionOptions o;
        o.look_back = back;
        o.look_ahead = back == 2 ? 1 : 0;
        o.causal = causal;
        o.self_mask = causal;
        o.rounds = rounds;
        for (bool combine : {false, true}) {
          CAPTURE(combine);
          o.combine_rounds = combine;
          o.dropout = back == 1 ? 0.5 : 0.0;  // dropout per round, combined through the lse before dropout
          // A self-only query's lse is the self score, -1e5: its last 1e-11 are rounding, and combined
          // rounds weigh each other by exp(lse_r - lse), so both sides carry ~1e-11 relative error there.
          const double tol = combine && o.self_mask ? 1e-9 : 1e-12;
          check_against_dense(nn::chunk_order(random_order(2, 2 * rounds, 10, uint64_t(40 + rounds)), 3), kpm, o,
                              2, 10, tol);
          // One table shared by every head and round.
          check_against_dense(nn::chunk_order(random_order(2, 1, 10, uint64_t(50 + rounds)), 4), kpm, o, 2, 10,
                              tol);
        }
      }
  // Chunks large enough for the parallel kernel: the rounds add up across threads.
  nn::ChunkedAttentionOptions o;
  o.look_back = 1;
  o.rounds = 4;
  std::vector<bool> m(1200, false);
  for (int64_t j = 1190; j < 1200; ++j) m[size_t(j)] = true;
  check_against_dense(nn::chunk_order(random_order(2, 8, 600, 33), 32), Tensor::from_vector(m, {2, 600}), o, 2, 600);
  o.combine_rounds = true;
  check_against_dense(nn::chunk_order(random_order(2, 8, 600, 34), 32), Tensor::from_vector(m, {2, 600}), o, 2, 600);
  o.dropout = 0.2;  // and with dropout, on the same team
  check_against_dense(nn::chunk_order(random_order(2, 8, 600, 35), 32), Tensor::from_vector(m, {2, 600}), o, 2, 600);
}

TEST_CASE("chunked attention over combined rounds: rows with nothing in some or every round") {
  // Position 0 of batch 0 sits in no slot of round 0 and 1 of head 0, position 1 in none at all: out 0 and
  // lse -inf where every round is empty, the other rounds' attention alone where one is; zero gradients.
  Tensor q = leaf64({1, 1, 4, 3}, 1), k = leaf64({1, 1, 4, 3}, 2), v = leaf64({1, 1, 4, 2}, 3);
  Tensor members = ti64({-1, 2, 3, -1, /**/ 0, 2, 3, -1}, {1, 2, 1, 4});
  nn::ChunkedAttentionOptions o;
  o.rounds = 2;
  o.combine_rounds = true;
  nn::ChunkedAttentionResult r = nn::chunked_attention(q, k, v, members, Tensor(), o);
  nn::ChunkedAttentionOptions single;  // round 1 alone
  nn::ChunkedAttentionResult r1 = nn::chunked_attention(q, k, v, narrow(members, 1, 1, 1), Tensor(), single);
  auto out = values(r.out), lse = values(r.lse), out1 = values(r1.out), lse1 = values(r1.lse);
  // Position 0, in round 1 only: round 1's attention, both columns and lse.
  CHECK(out[0] == doctest::Approx(out1[0]).epsilon(1e-12));
  CHECK(out[1] == doctest::Approx(out1[1]).epsilon(1e-12));
  CHECK(lse[0] == doctest::Approx(lse1[0]).epsilon(1e-12));
  CHECK(out[2] == 0.0);
  CHECK(out[3] == 0.0);
  CHECK(lse[1] == -INFINITY);
  CHECK(std::isfinite(lse[2]));
  CHECK(std::isfinite(lse[3]));
  sum(r.out * r.out).backward();
  CHECK(values(q.grad())[3] == 0.0);  // position 1 (row 1 of q) is in no slot
  CHECK(std::isfinite(values(q.grad())[0]));
}

TEST_CASE("chunked attention over rounds: float64 gradcheck") {
  Tensor kpm = padding_mask_2x10();
  nn::ChunkedAttentionOptions o;
  o.look_back = 1;
  o.causal = true;
  o.self_mask = true;
  o.rounds = 3;
  Tensor members = nn::chunk_order(random_order(2, 6, 10, 23), 4);
  Tensor q = leaf64({2, 2, 10, 3}, 1), k = leaf64({2, 2, 10, 3}, 2), v = leaf64({2, 2, 10, 2}, 3);
  for (bool combine : {false, true}) {
    CAPTURE(combine);
    o.combine_rounds = combine;
    GradcheckResult r = gradcheck(
        [&](const std::vector<Tensor>& xs) {
          nn::ChunkedAttentionResult c = nn::chunked_attention(xs[0], xs[1], xs[2], members, kpm, o);
          return sum(c.out * c.out) + sum(masked_fill(c.lse, lt(c.lse, -1e4), 0.0));
        },
        {q, k, v});
    CHECK_MESSAGE(r.ok, r.message);
  }
}

TEST_CASE("one chunk holding every token is full attention") {
  Tensor q = leaf64({2, 2, 6, 3}, 1), k = leaf64({2, 2, 6, 3}, 2), v = leaf64({2, 2, 6, 4}, 3);
  std::vector<bool> pm(12, false);
  pm[10] = pm[11] = true;
  Tensor kpm = Tensor::from_vector(pm, {2, 6});
  for (bool causal : {false, true}) {
    nn::ChunkedAttentionOptions o;
    o.causal = causal;
    o.look_back = 1;  // wraps onto the only chunk: its keys must count once
    Tensor members = nn::chunk_order(random_order(2, 1, 6, 3), 6);
    nn::AttentionArgs a;
    a.q = q;
    a.k = k;
    a.v = v;
    a.key_padding_mask = kpm;
    a.causal = causal;
    Tensor full = nn::dense_attention(q, k, v, nn::dense_block_mask(a), 1.0 / std::sqrt(3.0));
    check_close(nn::chunked_attention(q, k, v, members, kpm, o).out, full, 1e-12);
  }
}

TEST_CASE("a window wrapping around a few chunks counts each chunk once") {
  // Two chunks, look_back 3 and look_ahead 2 reach both chunks many times over:
  // the result is attention over all tokens.
  Tensor q = leaf64({1, 1, 8, 3}, 4), k = leaf64({1, 1, 8, 3}, 5), v = leaf64({1, 1, 8, 2}, 6);
  nn::ChunkedAttentionOptions o;
  o.look_back = 3;
  o.look_ahead = 2;
  Tensor members = nn::chunk_order(random_order(1, 1, 8, 9), 4);
  Tensor full = nn::dense_attention(q, k, v, Tensor(), 1.0 / std::sqrt(3.0));
  check_close(nn::chunked_attention(q, k, v, members, Tensor(), o).out, full, 1e-12);
}

TEST_CASE("chunked attention: tokens in no slot, self-only queries and fully padded windows") {
  Tensor q = leaf64({1, 1, 5, 2}, 1), k = leaf64({1, 1, 5, 2}, 2), v = leaf64({1, 1, 5, 3}, 3);
  // Chunks {3, 1}, {4, -1}; token 0 and 2 are in no slot.
  Tensor members = ti64({3, 1, 4, -1}, {1, 1, 2, 2});
  nn::ChunkedAttentionOptions o;
  o.causal = true;
  o.self_mask = true;
  nn::ChunkedAttentionResult r = nn::chunked_attention(q, k, v, members, Tensor(), o);
  auto out = values(r.out), lse = values(r.lse), vv = values(v);
  for (int64_t t : {0, 2}) {
    CHECK(lse[size_t(t)] == -INFINITY);
    for (int64_t d = 0; d < 3; ++d) CHECK(out[size_t(t * 3 + d)] == 0.0);
  }
  // Token 1 (chunk 0, causal) may only see itself: it attends to itself, with the
  // Reformer's self score. Token 4 is alone in its chunk: the same.
  for (int64_t t : {1, 4}) {
    CHECK(lse[size_t(t)] == doctest::Approx(nn::kSelfMaskedScore));
    for (int64_t d = 0; d < 3; ++d) CHECK(out[size_t(t * 3 + d)] == doctest::Approx(vv[size_t(t * 3 + d)]));
  }
  // Token 3 sees token 1 (earlier) and itself: the self score must give way.
  for (int64_t d = 0; d < 3; ++d) CHECK(out[size_t(3 * 3 + d)] == doctest::Approx(vv[size_t(1 * 3 + d)]));
  // Every key padded: zeros, -inf, and a zero (not NaN) gradient.
  Tensor all = Tensor::from_vector(std::vector<bool>(5, true), {1, 5});
  nn::ChunkedAttentionResult z = nn::chunked_attention(q, k, v, members, all, nn::ChunkedAttentionOptions{});
  CHECK(values(z.out) == std::vector<double>(15, 0.0));
  sum(z.out).backward();
  CHECK(values(q.grad()) == std::vector<double>(10, 0.0));
}

TEST_CASE("chunked attention float64 gradcheck (look-back, causal, self mask, shared members)") {
  Tensor kpm = padding_mask_2x10();
  nn::ChunkedAttentionOptions o;
  o.look_back = 1;
  o.causal = true;
  o.self_mask = true;
  Tensor members = nn::chunk_order(random_order(2, 1, 10, 21), 4);
  Tensor q = leaf64({2, 2, 10, 3}, 1), k = leaf64({2, 2, 10, 3}, 2), v = leaf64({2, 2, 10, 2}, 3);
  GradcheckResult r = gradcheck(
      [&](const std::vector<Tensor>& xs) {
        nn::ChunkedAttentionResult c = nn::chunked_attention(xs[0], xs[1], xs[2], members, kpm, o);
        // Leave out the lse of self-only queries (-1e5, constant): next to it, a
        // finite difference of step 1e-6 loses the digits it measures.
        return sum(c.out * c.out) + sum(masked_fill(c.lse, lt(c.lse, -1e4), 0.0));
      },
      {q, k, v});
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("chunked attention with dropout: the rate takes effect, fresh weights each call, B H N^2 counters") {
  // (Equality with the dense reference under dropout: the tests above.) The rate takes effect (the output moves, lse does not), draws B H N^2 counters, and successive calls
  // (training steps) drop other weights; rate 0 draws nothing.
  Tensor q = leaf64({1, 2, 10, 3}, 1), k = leaf64({1, 2, 10, 3}, 2), v = leaf64({1, 2, 10, 4}, 3);
  const Tensor members = nn::chunk_order(random_order(1, 1, 10, 84), 5);
  Generator g(5);
  nn::ChunkedAttentionOptions plain, drop;
  plain.look_back = drop.look_back = 1;
  drop.dropout = 0.5;
  drop.generator = &g;
  const nn::ChunkedAttentionResult a = nn::chunked_attention(q, k, v, members, Tensor(), plain),
                                   b = nn::chunked_attention(q, k, v, members, Tensor(), drop);
  CHECK(g.offset() == uint64_t(2 * 10 * 10));
  CHECK(max_abs_diff(a.out, b.out) > 0.01);
  CHECK(max_abs_diff(a.lse, b.lse) == 0.0);
  CHECK(max_abs_diff(nn::chunked_attention(q, k, v, members, Tensor(), drop).out, b.out) > 0.01);
  plain.generator = &g;
  nn::chunked_attention(q, k, v, members, Tensor(), plain);
  CHECK(g.offset() == uint64_t(2 * 2 * 10 * 10));
}

TEST_CASE("chunked attention with dropout: float64 gradcheck") {
  Tensor kpm = padding_mask_2x10();
  Tensor members = nn::chunk_order(random_order(2, 1, 10, 22), 4);
  Tensor q = leaf64({2, 2, 10, 3}, 1), k = leaf64({2, 2, 10, 3}, 2), v = leaf64({2, 2, 10, 2}, 3);
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    GradcheckResult r = gradcheck(
        [&](const std::vector<Tensor>& xs) {
          Generator g(31);  // a fresh generator per evaluation: the same weights drop every time
          nn::ChunkedAttentionOptions o;
          o.look_back = 1;
          o.causal = causal;
          o.dropout = 0.4;
          o.generator = &g;
          nn::ChunkedAttentionResult c = nn::chunked_attention(xs[0], xs[1], xs[2], members, kpm, o);
          return sum(c.out * c.out) + sum(masked_fill(c.lse, eq(c.lse, -INFINITY), 0.0));
        },
        {q, k, v});
    CHECK_MESSAGE(r.ok, r.message);
  }
}

TEST_CASE("chunk_order pads the last chunk") {
  Tensor order = ti64({4, 0, 3, 1, 2}, {1, 1, 5});
  CHECK(nn::chunk_order(order, 2).shape() == Shape{1, 1, 3, 2});
  CHECK(nn::chunk_order(order, 2).to_vector<int64_t>() == std::vector<int64_t>{4, 0, 3, 1, 2, -1});
  CHECK(nn::chunk_order(order, 8).to_vector<int64_t>() == std::vector<int64_t>{4, 0, 3, 1, 2, -1, -1, -1});
  CHECK_THROWS_MSG(nn::chunk_order(order, 0), ValueError, "[chunk_order] chunk size w must be >= 1, got 0");
  CHECK_THROWS_MSG(nn::chunk_order(to(order, kFloat32), 2), ShapeError, "[chunk_order] order must be int64");
}

TEST_CASE("chunked attention rejects bad arguments with the shapes in the message") {
  Tensor q = leaf64({1, 2, 4, 3}), k = leaf64({1, 2, 4, 3}), v = leaf64({1, 2, 4, 2});
  Tensor members = ti64({0, 1, 2, 3}, {1, 1, 2, 2});
  nn::ChunkedAttentionOptions o;
  CHECK_THROWS_MSG(nn::chunked_attention(q, leaf64({1, 2, 5, 3}), v, members, Tensor(), o), ShapeError,
                   "[chunked_attention] q and k must have one shape", "(1,2,5,3)");
  CHECK_THROWS_MSG(nn::chunked_attention(q, k, v, Tensor::full({1, 3, 2, 2}, -1.0, kInt64), Tensor(), o),
                   ShapeError, "members (1,3,2,2) does not fit q (1,2,4,3)");
  nn::ChunkedAttentionOptions two = o;
  two.rounds = 2;  // a table per head and round: 4 heads, or 1 shared
  CHECK_THROWS_MSG(nn::chunked_attention(q, k, v, Tensor::full({1, 2, 2, 2}, -1.0, kInt64), Tensor(), two),
                   ShapeError,
                   "[chunked_attention] members (1,2,2,2) does not fit q (1,2,4,3) and rounds=2 (want (1, 4 or 1, C >= "
                   "1, w >= 1))");
  two.rounds = 0;
  CHECK_THROWS_MSG(nn::chunked_attention(q, k, v, members, Tensor(), two), ValueError,
                   "[chunked_attention] rounds must be >= 1, got 0");
  CHECK_THROWS_MSG(nn::chunked_attention(q, k, v, ti64({0, 1, 1, 3}, {1, 1, 2, 2}), Tensor(), o), ValueError,
                   "position 1 appears twice in members[0, 0]");
  CHECK_THROWS_MSG(nn::chunked_attention(q, k, v, ti64({0, 1, 4, 3}, {1, 1, 2, 2}), Tensor(), o), IndexError,
                   "holds position 4, outside [-1, 4)");
  CHECK_THROWS_MSG(nn::chunked_attention(q, k, v, to(members, kFloat32), Tensor(), o), ShapeError,
                   "members must be int64");
  CHECK_THROWS_MSG(nn::chunked_attention(q, k, v, members, Tensor::zeros({1, 3}, kBool), o), ShapeError,
                   "key_padding_mask must be bool (B, N) = (1, 4), got bool (1,3)");
  nn::ChunkedAttentionOptions bad;
  bad.look_back = -1;
  CHECK_THROWS_MSG(nn::chunked_attention(q, k, v, members, Tensor(), bad), ValueError,
                   "look_back and look_ahead must be >= 0", "look_back=-1");
  CHECK_THROWS_MSG(nn::chunked_attention(q, k, to(v, kFloat32), members, Tensor(), o), DTypeError,
                   "must share one float dtype");
  nn::ChunkedAttentionOptions rate;
  rate.dropout = 1.0;
  CHECK_THROWS_MSG(nn::chunked_attention(q, k, v, members, Tensor(), rate), ValueError,
                   "[chunked_attention] dropout must be in [0, 1), got 1");
}

TEST_CASE("FullAttention and chunked_attention run the fused kernels (attention dropout too, on the CPU)") {
  Tensor q = leaf64({1, 2, 6, 3}, 1), k = leaf64({1, 2, 6, 3}, 2), v = leaf64({1, 2, 6, 4}, 3);
  nn::AttentionArgs a;
  a.q = q;
  a.k = k;
  a.v = v;
  a.causal = true;
  nn::FullAttention full;
  Tensor out = full.forward(a);
  CHECK(graph_has(out, "flash_attention"));
  CHECK_FALSE(graph_has(out, "softmax"));
  check_close(out, nn::dense_attention(q, k, v, nn::dense_block_mask(a), 1.0 / std::sqrt(3.0)), 1e-12);
  nn::FullAttention with_dropout(0.5);
  with_dropout.train();
  Tensor dropped = with_dropout.forward(a);
  CHECK(graph_has(dropped, "flash_attention"));
  CHECK_FALSE(graph_has(dropped, "softmax"));
  with_dropout.eval();
  CHECK(graph_has(with_dropout.forward(a), "flash_attention"));
  nn::ChunkedAttentionOptions o;
  o.look_back = 1;
  Tensor members = nn::chunk_order(random_order(1, 1, 6, 4), 2);
  nn::ChunkedAttentionResult r = nn::chunked_attention(q, k, v, members, Tensor(), o);
  CHECK(graph_has(r.out, "block_attention"));
  CHECK(graph_has(r.lse, "block_attention"));
  CHECK_FALSE(graph_has(r.out, "softmax"));
}
