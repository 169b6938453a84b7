// The AVX-512 BF16 GEMM (kernels/matmul/bf16_dot_cpu.cpp) against the converting path
// (float32 blocks + sgemm): both must meet rule R2 of docs/design-notes.md against the float32
// product of the same values, on every layout and on shapes that are not multiples of the
// kernel's 4 x 64 block or of its k pairs.
#include <cmath>

#include "kernels/matmul/bf16_dot.h"
#include "tests/test_util.h"

using namespace cf;
using namespace cf::test;

namespace {
void check_r2(const Tensor& y, const Tensor& a32, const Tensor& b32, const char* what) {
  INFO(std::string(what));
  Tensor ref = matmul(a32, b32), mag = matmul(abs(a32), abs(b32));
  std::vector<double> yv = values(y), rv = values(ref), mv = values(mag);
  REQUIRE(yv.size() == rv.size());
  for (size_t i = 0; i < yv.size(); ++i)
    REQUIRE_MESSAGE(std::fabs(yv[i] - rv[i]) <= std::fabs(rv[i]) / 256 + std::ldexp(mv[i], -20), "element ", i,
                    ": ", yv[i], " vs ", rv[i]);
}
struct DotSwitch {  // restores the kernel switch whatever happens
  ~DotSwitch() { kernels::set_bf16_dot_enabled(false); }  // the default
};
}  // namespace

TEST_CASE("bfloat16 matmul: AVX-512 BF16 kernel and converting path both meet R2, on every layout") {
  CHECK_FALSE(kernels::bf16_dot_available());  // off by default (the converting path is faster)
  if (!kernels::bf16_dot_supported()) {
    MESSAGE("this CPU has no avx512bf16: only the converting path runs");
  }
  DotSwitch restore;
  Generator g(3);
  struct Case {
    Shape a, b;
    bool ta, tb;
  };
  std::vector<Case> cases = {{{5, 37}, {37, 70}, false, false}, {{1, 1}, {1, 1}, false, false},
                             {{9, 64}, {64, 16}, false, false}, {{3, 7, 33}, {3, 33, 18}, false, false},
                             {{6, 31}, {31, 65}, true, false},  {{4, 20}, {20, 9}, false, true},
                             {{2, 130, 3}, {3, 129}, false, false}};
  for (const Case& c : cases) {
    Tensor a32 = to(to(rand(c.a, kFloat32, g, -1, 1), kBFloat16), kFloat32);
    Tensor b32 = to(to(rand(c.b, kFloat32, g, -1, 1), kBFloat16), kFloat32);
    Tensor a = to(a32, kBFloat16), b = to(b32, kBFloat16);
    if (c.ta) a = transpose(contiguous(transpose(a, -1, -2)), -1, -2);  // same values, column-major
    if (c.tb) b = transpose(contiguous(transpose(b, -1, -2)), -1, -2);
    for (bool dot : {true, false}) {
      kernels::set_bf16_dot_enabled(dot);
      Tensor y = matmul(a, b);
      CHECK(y.dtype() == kBFloat16);
      check_r2(y, a32, b32, dot ? "dot kernel" : "converting path");
    }
  }
}
