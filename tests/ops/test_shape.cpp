#include "test_util.h"

using namespace cf;
using namespace cf::test;

TEST_SUITE("ops/shape") {

GRADCHECK_CASE("reshape") {
  check_grad("reshape", [](auto& x) { return reshape(x[0], {3, 2}); }, {leaf64({2, 3})});
  // Through a copy (transposed input cannot be viewed flat).
  check_grad("reshape", [](auto& x) { return reshape(transpose(x[0], 0, 1), {6}); }, {leaf64({2, 3})});
  check_grad("reshape", [](auto& x) { return unsqueeze(squeeze(x[0]), 0); }, {leaf64({2, 1, 3})});
}
GRADCHECK_CASE("permute") {
  check_grad("permute", [](auto& x) { return permute(x[0], {2, 0, 1}); }, {leaf64({2, 3, 2})});
}
GRADCHECK_CASE("slice") {
  check_grad("slice", [](auto& x) { return slice(x[0], 1, 1, 5, 2); }, {leaf64({2, 6})});
  check_grad("slice", [](auto& x) { return narrow(x[0], 0, 1, 2); }, {leaf64({4, 2})});
}
GRADCHECK_CASE("expand") {
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
