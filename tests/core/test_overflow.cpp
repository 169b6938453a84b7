// Issue 27, defects 1-3: shape and byte-count products that overflow int64 are a
// ShapeError naming the op and the shape, never a wrapped count (a zero-byte
// allocation written past, or a view whose numel() is 0).
#include "test_util.h"

using namespace cf;
using namespace cf::test;

TEST_CASE("checked_mul/add/numel/nbytes report overflow and keep exact values") {
  CHECK(checked_mul(int64_t(1) << 31, int64_t(1) << 31, "t") == int64_t(1) << 62);
  CHECK_THROWS_MSG(checked_mul(int64_t(1) << 32, int64_t(1) << 31, "t", "d_model"), ShapeError, "[t]",
                   "d_model overflows int64", "4294967296 * 2147483648");
  CHECK_THROWS_MSG(checked_mul(-(int64_t(1) << 32), int64_t(1) << 32, "t"), ShapeError, "[t]");
  CHECK(checked_add(INT64_MAX - 1, 1, "t") == INT64_MAX);
  CHECK_THROWS_MSG(checked_add(INT64_MAX, 1, "t"), ShapeError, "[t] size overflows int64");
  CHECK(checked_numel({3, 4, 5}, "t") == 60);
  CHECK(checked_numel({}, "t") == 1);
  // A zero makes the element count 0, but the strides of the other sizes must
  // still fit (fuzz_idx found contiguous_strides overflowing on such a shape).
  CHECK(checked_numel({int64_t(1) << 31, 0, int64_t(1) << 31}, "t") == 0);
  CHECK_THROWS_MSG(checked_numel({int64_t(1) << 40, 0, int64_t(1) << 40}, "t"), ShapeError, "[t]",
                   "(1099511627776,0,1099511627776)", "strides cannot be represented");
  CHECK_THROWS_MSG(Tensor::empty({int64_t(1) << 40, 0, int64_t(1) << 40}), ShapeError, "[empty]");
  CHECK_THROWS_MSG(checked_numel({int64_t(1) << 33, int64_t(1) << 31}, "t"), ShapeError, "[t]",
                   "(8589934592,2147483648)", "more elements than int64");
  CHECK(checked_nbytes({int64_t(1) << 60}, 4, "t") == int64_t(1) << 62);
  CHECK_THROWS_MSG(checked_nbytes({int64_t(1) << 62}, 4, "t"), ShapeError, "[t]", "(4611686018427387904)",
                   "4-byte elements");
}

TEST_CASE("defect 1: factories whose byte count overflows throw instead of allocating 0 bytes") {
  const int64_t big = int64_t(1) << 62;
  CHECK_THROWS_MSG(Tensor::zeros({big}), ShapeError, "[full]", "(4611686018427387904)");
  CHECK_THROWS_MSG(Tensor::ones({big}), ShapeError, "[full]", "(4611686018427387904)");
  CHECK_THROWS_MSG(Tensor::zeros({int64_t(1) << 61}, kFloat64), ShapeError, "[full]", "8-byte elements");
  CHECK_THROWS_MSG(Tensor::empty({big}), ShapeError, "[empty]", "(4611686018427387904)");
  CHECK_THROWS_MSG(Tensor::zeros({int64_t(1) << 33, int64_t(1) << 31}), ShapeError, "[full]",
                   "more elements than int64");
  // Valid empty shapes with huge other sizes stay valid.
  Tensor e = Tensor::zeros({0, big});
  CHECK(e.numel() == 0);
  CHECK(e.nbytes() == 0);
}

TEST_CASE("defect 2: a tensor whose numel wraps to 0 cannot be made, so slicing it cannot crash") {
  CHECK_THROWS_MSG(Tensor::zeros({int64_t(1) << 33, int64_t(1) << 31}), ShapeError, "[full]",
                   "(8589934592,2147483648)");
  // The view path: a huge-but-countable expanded tensor slices into a small one
  // with the right values.
  Tensor big = expand(Tensor::ones({1, 1}), {int64_t(1) << 30, int64_t(1) << 30});
  CHECK(big.numel() == int64_t(1) << 60);
  CHECK(sum(slice(slice(big, 0, 0, 1000), 1, 0, 1000)).item() == doctest::Approx(1e6));
}

TEST_CASE("defect 3: expand and reshape to shapes whose numel overflows throw") {
  CHECK_THROWS_MSG(expand(Tensor::ones({1, 1}), {int64_t(1) << 33, int64_t(1) << 31}), ShapeError,
                   "[expand]", "(8589934592,2147483648)", "more elements than int64");
  CHECK_THROWS_MSG(expand(Tensor::ones({1, 1}), {4, -3}), ShapeError, "[expand] negative size", "(4,-3)");
  // 2^62 float32 elements is countable, but its bytes are not.
  CHECK_THROWS_MSG(expand(Tensor::ones({1}), {int64_t(1) << 62}), ShapeError, "[expand]",
                   "4-byte elements");
  // reshape: the product of the wanted sizes used to wrap; (2^62, 4) wrapped to 0 elements.
  Tensor z = Tensor::zeros({0});
  CHECK_THROWS_MSG(reshape(Tensor::zeros({4}), {int64_t(1) << 62, 4}), ShapeError, "[reshape]",
                   "(4611686018427387904,4)");
  CHECK_THROWS_MSG(view(Tensor::zeros({4}), {int64_t(1) << 62, 4, -1}), ShapeError, "[view]");
  CHECK(reshape(z, {int64_t(1) << 62, 0}).numel() == 0);
  CHECK(reshape(Tensor::zeros({2, 3}), {-1}).shape() == Shape{6});
}

TEST_CASE("defect 11: positional tables too large to count or to allocate name the layer and sizes") {
  CHECK_THROWS_MSG(nn::SinusoidalPositionalEncoding(int64_t(1) << 40, int64_t(1) << 30), ShapeError,
                   "[SinusoidalPositionalEncoding] max_len 1099511627776 x dim 1073741824",
                   "more elements than int64");
  CHECK_THROWS_MSG(nn::LearnedPositionalEncoding(int64_t(1) << 40, int64_t(1) << 30), ShapeError,
                   "[LearnedPositionalEncoding] max_len 1099511627776");
  // 2^48 bytes: countable, never allocatable (was a bare std::bad_alloc from a staging vector).
  CHECK_THROWS_MSG(nn::SinusoidalPositionalEncoding(int64_t(1) << 40, 64), Error,
                   "[SinusoidalPositionalEncoding] max_len 1099511627776 x dim 64", "[allocate] out of CPU memory");
}

TEST_CASE("a kernel's scratch too large for memory is an exception, not the end of the process") {
#if !defined(__SANITIZE_ADDRESS__)  // (ASan's operator new aborts on a failed allocation by design)
  // One list of 2^23 slots, 8 of them filled: the CPU kernels' per-thread (w, w) score tile is 256 TiB, beyond
  // any address space, so it fails whatever the host's overcommit (a hunt found 2^17's 64 GiB). Its bad_alloc
  // was thrown inside an OpenMP region, which ended the process.
  const int64_t w = int64_t(1) << 23;
  std::vector<int64_t> slots(size_t(w), -1);
  for (int64_t i = 0; i < 8; ++i) slots[size_t(i)] = i;
  const Tensor members = Tensor::from_vector(slots, {1, 1, 1, w});
  const Tensor q = Tensor::ones({1, 1, 8, 4}), k = Tensor::ones({1, 1, 8, 4}), v = Tensor::ones({1, 1, 8, 4});
  CHECK_THROWS_AS(routed_attention(q, k, v, members, members), std::bad_alloc);
  CHECK_THROWS_AS(block_attention(q, k, v, members), std::bad_alloc);
  CHECK(values(routed_attention(q, k, v, narrow(members, 3, 0, 8), narrow(members, 3, 0, 8))).size() == 32);  // usable after
#endif
}

TEST_CASE("sizes that add or multiply past int64 in cat, block_attention and the depthwise convolutions are named") {
  // cat: four (2^62, 0) tensors joined to a (0, 0) tensor without a word
  const Tensor huge_empty = Tensor::zeros({int64_t(1) << 62, 0});
  CHECK_THROWS_MSG(cat({huge_empty, huge_empty, huge_empty, huge_empty}, 0), ShapeError, "[cat]",
                   "the joined axis overflows int64");
  // block_attention: H x rounds wrapped to 0 heads (empty outputs, no error)
  const Tensor q = Tensor::zeros({1, 4, 8, 4});
  BlockAttentionOptions o;
  o.rounds = int64_t(1) << 62;
  CHECK_THROWS_MSG(block_attention(q, q, q, Tensor::zeros({1, 1, 1, 8}, kInt64), Tensor(), o), ShapeError,
                   "[block_attention] heads x rounds overflows int64");
  // DepthwiseConv1d: n + 2 padding wrapped (output length 0, then "shorter than the kernel")
  nn::DepthwiseConv1d conv(2, 3, 1, int64_t(1) << 62);
  CHECK_THROWS_MSG(conv.output_length(4), ShapeError, "[DepthwiseConv1d] 2 x padding overflows int64");
}
