#include "test_util.h"
#include "cuda/cuda_test_util.h"
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>

using namespace cf;
using namespace cf::test;

TEST_SUITE("ops/shape") {

GRADCHECK_CASE(reshape) {
  check_grad("reshape", [](auto& x) { return reshape(x[0], {3, 2}); }, {leaf64({2, 3})});
  // Through a copy (transposed input cannot be viewed flat).
  check_grad("reshape", [](auto& x) { return reshape(transpose(x[0], 0, 1), {6}); }, {leaf64({2, 3})});
  check_grad("reshape", [](auto& x) { return unsqueeze(squeeze(x[0]), 0); }, {leaf64({2, 1, 3})});
}
GRADCHECK_CASE(permute) {
  check_grad("permute", [](auto& x) { return permute(x[0], {2, 0, 1}); }, {leaf64({2, 3, 2})});
}
GRADCHECK_CASE(slice) {
  check_grad("slice", [](auto& x) { return slice(x[0], 1, 1, 5, 2); }, {leaf64({2, 6})});
  check_grad("slice", [](auto& x) { return narrow(x[0], 0, 1, 2); }, {leaf64({4, 2})});
}
GRADCHECK_CASE(expand) {
  check_grad("expand", [](auto& x) { return expand(x[0], {3, 2, 4}); }, {leaf64({2, 1})});
}

TEST_CASE("views of views write through to the base") {
  Tensor base = Tensor::zeros({4, 4});
  Tensor v = slice(transpose(base, 0, 1), 0, 1, 3);  // columns 1..2 of base
  fill_(v, 1.0);
  auto b = base.to_vector<float>();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) CHECK(b[size_t(i * 4 + j)] == ((j == 1 || j == 2) ? 1.0f : 0.0f));
}

}

// ---------------------------------------------------------------- CUDA parity
// CUDA parity of the shape ops (views and copy_cuda): contiguous and strided
// sources, large and empty tensors, float64 gradchecks on CUDA.

TEST_SUITE("ops/shape") {

// ---------------------------------------------------------------- shape ops (copy_cuda)

PARITY_CASE(reshape) {
  check_parity("reshape", [](const Inputs& x) { return reshape(x[0], {5, 4}); }, {leaf32({4, 5}, 1)});
  check_parity("reshape", [](const Inputs& x) { return reshape(transpose(x[0], 0, 1), {-1}); }, {leaf32({4, 5}, 2)});
  check_parity("reshape", [](const Inputs& x) { return reshape(slice(x[0], 1, 0, 8, 2), {3, 4}); }, {leaf32({3, 8}, 3)});
  check_parity("reshape", [](const Inputs& x) { return reshape(transpose(x[0], 0, 1), {-1}); }, {leaf32({1024, 1024}, 4)});
  check_parity("reshape", [](const Inputs& x) { return reshape(x[0], {0, 6}); }, {leaf32({3, 0, 2}, 5)});
  check_grad_cuda("reshape", [](const Inputs& x) { return reshape(transpose(x[0], 0, 1), {6}); }, {leaf64({2, 3})});
  check_grad_cuda("reshape", [](const Inputs& x) { return reshape(x[0], {3, 2}); }, {leaf64({2, 3}, 2)});
}
PARITY_CASE(permute) {
  check_parity("permute", [](const Inputs& x) { return permute(x[0], {2, 0, 1}); }, {leaf32({3, 4, 5}, 1)});
  check_parity("permute", [](const Inputs& x) { return contiguous(permute(x[0], {1, 2, 0})); }, {leaf32({3, 4, 5}, 2)});
  check_parity("permute", [](const Inputs& x) { return contiguous(permute(x[0], {1, 0, 2})); }, {leaf32({64, 128, 128}, 3)});
  check_parity("permute", [](const Inputs& x) { return permute(x[0], {1, 0}); }, {leaf32({0, 3}, 4)});
  check_grad_cuda("permute", [](const Inputs& x) { return permute(x[0], {2, 0, 1}); }, {leaf64({2, 3, 2})});
}
PARITY_CASE(slice) {
  check_parity("slice", [](const Inputs& x) { return slice(x[0], 1, 1, 5, 2); }, {leaf32({3, 6}, 1)});
  check_parity("slice", [](const Inputs& x) { return slice(transpose(x[0], 0, 1), 0, 1, 4); }, {leaf32({3, 6}, 2)});
  check_parity("slice", [](const Inputs& x) { return slice(x[0], 0, 3, 1 << 20, 3); }, {leaf32({1 << 20}, 3)});
  check_parity("slice", [](const Inputs& x) { return slice(x[0], 0, 2, 2); }, {leaf32({4}, 4)});
  check_grad_cuda("slice", [](const Inputs& x) { return slice(x[0], 1, 1, 5, 2); }, {leaf64({2, 6})});
  check_grad_cuda("slice", [](const Inputs& x) { return narrow(x[0], 0, 1, 2); }, {leaf64({4, 2}, 2)});
}
PARITY_CASE(expand) {
  check_parity("expand", [](const Inputs& x) { return expand(x[0], {3, 2, 4}); }, {leaf32({2, 1}, 1)});
  check_parity("expand", [](const Inputs& x) { return contiguous(expand(x[0], {5, 4, 3})); }, {leaf32({4, 1}, 2)});
  check_parity("expand", [](const Inputs& x) { return contiguous(expand(x[0], {1024, 1024})); }, {leaf32({1, 1024}, 3)});
  check_parity("expand", [](const Inputs& x) { return expand(x[0], {0, 3}); }, {leaf32({1, 3}, 4)});
  check_grad_cuda("expand", [](const Inputs& x) { return expand(x[0], {3, 2, 4}); }, {leaf64({2, 1})});
}

}  // TEST_SUITE
