// CUDA parity of the indexing ops (kernels/index/index_cuda.cu) against the CPU:
// every layout the kernels see (transposed / sliced operands, stride-0 broadcast
// index views), duplicate indices, every dtype, empty and multi-block sizes, the
// short-line and sort-based scatter_add paths, float64 gradchecks on CUDA, and
// the out-of-range error (same message as the CPU).
#include <random>

#include "cuda/cuda_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

using Inputs = std::vector<Tensor>;


// The same error message on both devices for f(x, index) with x/index on that device.
template <typename F>
void check_same_error(const Tensor& x, const Tensor& index, F&& f) {
  std::string cpu = error_of([&] { f(x, index); });
  std::string gpu = error_of([&] { f(cuda0(x), cuda0(index)); });
  CHECK(!cpu.empty());
  CHECK(gpu == cpu);
}

}  // namespace

TEST_SUITE("cuda/index") {

PARITY_CASE("gather") {
  const Tensor idx = random_ints({3, 5}, 0, 3, 1);  // duplicates, larger than x on the axis
  check_parity("gather", [](const Inputs& x) { return gather(x[0], 1, x[1]); }, {leaf32({3, 4}), idx});
  // Index smaller than x off the axis, gathering along axis 0.
  check_parity("gather", [](const Inputs& x) { return gather(x[0], 0, x[1]); },
               {leaf32({3, 4}, 2), random_ints({2, 3}, 0, 2, 2)});
  // Non-contiguous x and index (transposed views made inside f).
  check_parity("gather", [](const Inputs& x) { return gather(transpose(x[0], 0, 1), 1, transpose(x[1], 0, 1)); },
               {leaf32({4, 3}, 3), random_ints({5, 3}, 0, 3, 3)});
  check_parity("gather", [](const Inputs& x) { return gather(slice(x[0], 1, 0, 8, 2), 1, x[1]); },
               {leaf32({3, 8}, 4), idx});
  // int64 and bool (forward only).
  check_parity("gather", [](const Inputs& x) { return gather(x[0], 1, x[1]); },
               {random_ints({3, 4}, -50, 50, 5), idx});
  check_parity("gather", [](const Inputs& x) { return gather(gt(x[0], 0.0), 1, x[1]); },
               {leaf32({3, 4}, 6), idx});
  // Empty index.
  check_parity("gather", [](const Inputs& x) { return gather(x[0], 1, x[1]); },
               {leaf32({3, 4}, 7), Tensor::zeros({3, 0}, kInt64)});
  // 1M outputs: many blocks of the grid-stride loop; the backward is a large scatter_add.
  check_parity("gather", [](const Inputs& x) { return gather(x[0], 1, x[1]); },
               {leaf32({1024, 512}, 8), random_ints({1024, 1024}, 0, 511, 8)});
  check_grad_cuda("gather", [](const Inputs& x) { return gather(x[0], 1, x[1]); }, {leaf64({3, 4}), idx});
  check_grad_cuda("gather", [](const Inputs& x) { return gather(x[0], 0, x[1]); },
                  {leaf64({3, 4}, 2), random_ints({2, 3}, 0, 2, 2)});
}

PARITY_CASE("scatter_add") {
  auto f1 = [](const Inputs& x) { return scatter_add(x[0], 1, x[2], x[1]); };
  const Tensor idx = random_ints({3, 5}, 0, 3, 11);
  check_parity("scatter_add", f1, {leaf32({3, 4}), leaf32({3, 5}, 2), idx});
  // src larger than index; x larger than index off the axis.
  check_parity("scatter_add", f1, {leaf32({4, 4}, 3), leaf32({4, 6}, 4), random_ints({3, 5}, 0, 3, 12)});
  // Non-contiguous x, src and index.
  check_parity("scatter_add",
               [](const Inputs& x) {
                 return scatter_add(transpose(x[0], 0, 1), 0, transpose(x[2], 0, 1), slice(x[1], 0, 0, 10, 2));
               },
               {leaf32({3, 4}, 5), leaf32({10, 3}, 6), random_ints({3, 5}, 0, 3, 13)});
  // int64.
  check_parity("scatter_add", f1, {random_ints({3, 4}, -9, 9, 14), random_ints({3, 5}, -9, 9, 15), idx});
  // Empty index: out == x.
  check_parity("scatter_add", f1, {leaf32({3, 4}, 7), leaf32({3, 2}, 8), Tensor::zeros({3, 0}, kInt64)});
  // Long lines with many duplicates: the sort-based path, per-line index (x rows
  // of 300, 4096 terms per line, 64 lines); exercised in float32 and int64.
  const Tensor big_idx = random_ints({64, 4096}, 0, 299, 16);
  check_parity("scatter_add", f1, {leaf32({64, 300}, 9), leaf32({64, 4096}, 10), big_idx});
  check_parity("scatter_add", f1,
               {random_ints({64, 300}, -5, 5, 17), random_ints({64, 4096}, -1000, 1000, 18), big_idx});
  check_grad_cuda("scatter_add", f1, {leaf64({3, 4}, 1), leaf64({3, 5}, 2), idx});
  check_grad_cuda("scatter_add", f1, {leaf64({4, 4}, 3), leaf64({4, 6}, 4), random_ints({3, 5}, 0, 3, 12)});
  // Long lines in float64 gradcheck (sort path in both forward and backward).
  check_grad_cuda("scatter_add", [](const Inputs& x) { return scatter_add(x[0], 0, x[2], x[1]); },
                  {leaf64({5, 2}, 5), leaf64({40, 2}, 6), random_ints({40, 2}, 0, 4, 19)});
}

CUDA_TEST_CASE("scatter_add and index_add with duplicates match the CPU exactly and repeat bit for bit") {
  // Every output element gets its terms in ascending position on both devices
  // (index_cuda.cu), in the storage type: the results are bit-identical to the CPU.
  struct Case {
    Tensor x, src, idx;
    int64_t axis;
    bool index_add;
  };
  Generator g(21);
  std::vector<Case> cases = {
      {randn({4, 8}, kFloat32, g), randn({4, 20}, kFloat32, g), random_ints({4, 20}, 0, 2, 22), 1, false},
      {randn({4, 100}, kFloat32, g), randn({4, 5000}, kFloat32, g), random_ints({4, 5000}, 0, 3, 23), 1, false},
      {randn({1000, 64}, kFloat32, g), randn({20000, 64}, kFloat32, g), random_ints({20000}, 0, 999, 24), 0, true},
      {randn({7, 64}, kFloat64, g), randn({3000, 64}, kFloat64, g), random_ints({3000}, 0, 6, 25), 0, true},
      {randn({64, 9}, kFloat32, g), randn({64, 33}, kFloat32, g), random_ints({33}, 0, 8, 26), 1, true},
  };
  for (const Case& c : cases) {
    auto run = [&](Device d) {
      Tensor x = c.x.to(d), s = c.src.to(d), i = c.idx.to(d);
      return c.index_add ? index_add(x, c.axis, i, s) : scatter_add(x, c.axis, i, s);
    };
    Tensor cpu = run(Device::cpu()), g1 = run(Device::cuda(0)), g2 = run(Device::cuda(0));
    CHECK(values(g1) == values(g2));
    CHECK(values(g1) == values(cpu));
  }
}

PARITY_CASE("index_select") {
  const Tensor idx = Tensor::from_vector(std::vector<int64_t>{0, 2, 2, 3, 0}, {5});
  check_parity("index_select", [](const Inputs& x) { return index_select(x[0], 0, x[1]); }, {leaf32({4, 3}), idx});
  check_parity("index_select", [](const Inputs& x) { return index_select(x[0], 1, x[1]); },
               {leaf32({2, 4}, 2), idx});
  check_parity("index_select",
               [](const Inputs& x) { return index_select(transpose(x[0], 0, 1), 1, slice(x[1], 0, 0, 10, 2)); },
               {leaf32({4, 3}, 3), random_ints({10}, 0, 3, 31)});
  check_parity("index_select", [](const Inputs& x) { return index_select(x[0], 0, x[1]); },
               {random_ints({4, 3}, -9, 9, 32), idx});
  check_parity("index_select", [](const Inputs& x) { return index_select(x[0], 0, x[1]); },
               {leaf32({4, 3}, 4), Tensor::zeros({0}, kInt64)});
  // Embedding-style lookup: 4096 rows of 256 from a table of 1000 (1M outputs);
  // the backward is an index_add of many rows into the table (sort path).
  check_parity("index_select", [](const Inputs& x) { return index_select(x[0], 0, x[1]); },
               {leaf32({1000, 256}, 5), random_ints({4096}, 0, 999, 33)});
  check_grad_cuda("index_select", [](const Inputs& x) { return index_select(x[0], 0, x[1]); },
                  {leaf64({4, 3}), idx});
  check_grad_cuda("index_select", [](const Inputs& x) { return index_select(x[0], 1, x[1]); },
                  {leaf64({2, 4}, 2), idx});
}

PARITY_CASE("index_add") {
  const Tensor idx = Tensor::from_vector(std::vector<int64_t>{1, 1, 3, 0, 1}, {5});
  auto f0 = [](const Inputs& x) { return index_add(x[0], 0, x[2], x[1]); };
  auto f1 = [](const Inputs& x) { return index_add(x[0], 1, x[2], x[1]); };
  check_parity("index_add", f0, {leaf32({4, 3}), leaf32({5, 3}, 2), idx});
  check_parity("index_add", f1, {leaf32({2, 4}, 3), leaf32({2, 5}, 4), idx});
  check_parity("index_add",
               [](const Inputs& x) { return index_add(transpose(x[0], 0, 1), 0, x[2], transpose(x[1], 0, 1)); },
               {leaf32({3, 4}, 5), leaf32({3, 5}, 6), idx});
  check_parity("index_add", f0, {random_ints({4, 3}, -9, 9, 41), random_ints({5, 3}, -9, 9, 42), idx});
  check_parity("index_add", f0, {leaf32({4, 3}, 7), Tensor::zeros({0, 3}), Tensor::zeros({0}, kInt64)});
  // Embedding backward shape: 20000 rows of 64 into a table of 1000 (1.28M terms).
  check_parity("index_add", f0, {leaf32({1000, 64}, 8), leaf32({20000, 64}, 9), random_ints({20000}, 0, 999, 43)});
  check_grad_cuda("index_add", f0, {leaf64({4, 3}, 1), leaf64({5, 3}, 2), idx});
  check_grad_cuda("index_add", f1, {leaf64({2, 4}, 3), leaf64({2, 5}, 4), idx});
}

PARITY_CASE("take_along_dim") {
  const Tensor idx = Tensor::from_vector(std::vector<int64_t>{0, 3, 3, 1, 2, 2, 0, 1, 1, 3}, {1, 2, 5});
  auto f = [](const Inputs& x) { return take_along_dim(x[0], x[1], 2); };
  check_parity("take_along_dim", f, {leaf32({3, 1, 4}), idx});  // broadcast both ways
  check_parity("take_along_dim", f, {leaf32({3, 2, 4}, 2), random_ints({3, 2, 6}, 0, 3, 51)});
  check_parity("take_along_dim",
               [](const Inputs& x) { return take_along_dim(transpose(x[0], 0, 2), x[1], 0); },
               {leaf32({4, 1, 3}, 3), random_ints({5, 2, 1}, 0, 2, 52)});
  check_parity("take_along_dim", f, {random_ints({3, 1, 4}, -9, 9, 53), idx});
  check_parity("take_along_dim", f, {leaf32({3, 1, 4}, 4), Tensor::zeros({1, 2, 0}, kInt64)});
  // Cross-entropy-like pick of one entry per row over many rows.
  check_parity("take_along_dim", [](const Inputs& x) { return take_along_dim(x[0], x[1], 1); },
               {leaf32({1 << 16, 32}, 5), random_ints({1 << 16, 1}, 0, 31, 54)});
  check_grad_cuda("take_along_dim", f, {leaf64({3, 1, 4}), idx});
}

PARITY_CASE("masked_fill") {
  const Tensor mask = Tensor::from_vector(std::vector<bool>{true, false, false, true}, {4});
  auto f = [](const Inputs& x) { return masked_fill(x[0], x[1], 3.0); };
  check_parity("masked_fill", f, {leaf32({3, 4}), mask});  // broadcast mask
  Generator g(3);
  check_parity("masked_fill", [](const Inputs& x) { return masked_fill(transpose(x[0], 0, 1), x[1], -2.5); },
               {leaf32({4, 3}, 2), gt(rand({3, 1}, kFloat32, g), 0.5)});
  check_parity("masked_fill", f, {random_ints({3, 4}, -9, 9, 61), mask});
  check_parity("masked_fill", [](const Inputs& x) { return masked_fill(gt(x[0], 0.0), x[1], 1.0); },
               {leaf32({3, 4}, 4), mask});
  check_parity("masked_fill", [](const Inputs& x) { return masked_fill(x[0], x[1], -INFINITY); },
               {leaf32({3, 4}, 5), mask});
  check_parity("masked_fill", f, {leaf32({0, 4}, 6), mask});
  check_parity("masked_fill", [](const Inputs& x) { return masked_fill(x[0], gt(x[1], 0.0), 0.0); },
               {leaf32({1024, 1024}, 7), rand({1024, 1}, kFloat32, g, -1.0, 1.0)});
  check_grad_cuda("masked_fill", f, {leaf64({3, 4}), mask});
}

PARITY_CASE("one_hot") {
  const Tensor labels = random_ints({2, 3}, 0, 4, 71);
  check_parity("one_hot", [](const Inputs& x) { return one_hot(x[0], 5); }, {labels});
  check_parity("one_hot", [](const Inputs& x) { return one_hot(transpose(x[0], 0, 1), 5, kFloat64); }, {labels});
  check_parity("one_hot", [](const Inputs& x) { return one_hot(x[0], 5, kInt64); }, {labels});
  check_parity("one_hot", [](const Inputs& x) { return one_hot(x[0], 5, kBool); }, {labels});
  check_parity("one_hot", [](const Inputs& x) { return one_hot(x[0], 3); }, {Tensor::zeros({0, 2}, kInt64)});
  check_parity("one_hot", [](const Inputs& x) { return one_hot(x[0], 7); }, {Tensor::scalar(4, kInt64)});
  check_parity("one_hot", [](const Inputs& x) { return one_hot(x[0], 1000); }, {random_ints({4096}, 0, 999, 72)});
}

CUDA_TEST_CASE("out-of-range indices give the CPU's error on CUDA") {
  const Tensor x = Tensor::zeros({3, 3});
  const Tensor bad = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 0, -1}, {2, 3});
  check_same_error(x, bad, [](const Tensor& a, const Tensor& i) { gather(a, 1, i); });
  check_same_error(x, bad, [](const Tensor& a, const Tensor& i) { scatter_add(a, 1, i, a); });
  check_same_error(x, bad, [](const Tensor& a, const Tensor& i) { take_along_dim(a, i, 0); });
  const Tensor bad1 = Tensor::from_vector(std::vector<int64_t>{0, 2, 7, -4}, {4});
  check_same_error(x, bad1, [](const Tensor& a, const Tensor& i) { index_select(a, 0, i); });
  check_same_error(x, bad1, [](const Tensor& a, const Tensor& i) {
    index_add(a, 1, i, Tensor::zeros({3, 4}, kFloat32, a.device()));
  });
  check_same_error(x, bad1, [](const Tensor&, const Tensor& i) { one_hot(i, 3); });
  // Many bad entries over many blocks: the first in row-major order is reported,
  // also when the index is a transposed view (row-major order != memory order).
  std::vector<int64_t> v(size_t(1) << 20, 1);
  v[700000] = 9;
  v[300001] = -3;
  v[900000] = 5;
  const Tensor big = Tensor::from_vector(v, {1024, 1024});
  const Tensor wide = Tensor::zeros({1024, 4});
  check_same_error(wide, big, [](const Tensor& a, const Tensor& i) { gather(a, 1, i); });
  check_same_error(wide, big, [](const Tensor& a, const Tensor& i) { gather(a, 1, transpose(i, 0, 1)); });
  CHECK_THROWS_MSG(gather(cuda0(wide), 1, cuda0(big)), IndexError, "[gather] index -3", "(292,993)");
}

}
