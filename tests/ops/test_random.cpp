// Random tensors (autograd/ops/random.h): CUDA parity. The CUDA tensor equals
// the CPU tensor for the same seed (bit-exact except randn, which goes through the
// device libm).
#include "cuda/cuda_test_util.h"
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>

using namespace cf;
using namespace cf::test;

// ---------------------------------------------------------------- CUDA parity

TEST_SUITE("ops/random") {

// ---------------------------------------------------------------- random (same seed, same tensor)

PARITY_CASE(rand) {
  // the 16-bit dtypes too: the same double draw rounded once (CUDA rounded a float32 fill, another stream)
  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16})
    for (const Shape& s : {Shape{1 << 20}, Shape{3, 5}, Shape{0, 4}, Shape{}}) {
      Generator gc(42), gg(42);
      Tensor a = rand(s, dt, gc, -3.0, 5.0), b = rand(s, dt, gg, -3.0, 5.0, Device::cuda(0));
      check_equal(b, a);
      // A second draw continues the stream (counter offset > 0) identically.
      check_equal(rand(s, dt, gg, 0.0, 1.0, Device::cuda(0)), rand(s, dt, gc));
      CHECK(gg.offset() == gc.offset());
      // Bounds the dtype does not hold: draws rounded below low step up, as on the CPU (and a low just
      // above a subnormal, where the step is one subnormal unit)
      const double tiny = dt == kBFloat16 ? 1.5 * std::ldexp(1.0, -133) : dt == kFloat16 ? 1.5 * std::ldexp(1.0, -24) : 0.0;
      for (auto [low, high] : {std::pair<double, double>{0.7, 0.8}, {-0.3, 0.3}, {tiny, 0.5}}) {
        Tensor c = rand(s, dt, gc, low, high), d = rand(s, dt, gg, low, high, Device::cuda(0));
        check_equal(d, c);
      }
    }
}
PARITY_CASE(randn) {
  for (DType dt : {kFloat32, kFloat64}) {
    Generator gc(7), gg(7);
    Tensor a = randn({1 << 20}, dt, gc, 0.5, 2.0), b = randn({1 << 20}, dt, gg, 0.5, 2.0, Device::cuda(0));
    // Box-Muller through the device libm (log, cos, sqrt): equal to within its rounding.
    // float32 rounds the double result, so a 1-ulp double difference can flip one float ulp.
    ParityOptions o;
    o.atol = dt == kFloat64 ? 1e-12 : 1e-6;
    o.rtol = dt == kFloat64 ? 1e-12 : 1e-6;
    check_close_rel(b, a, o.atol, o.rtol, "randn");
    CHECK(b.device().is_cuda());
  }
  Generator gc(8), gg(8);
  check_close_rel(randn({0, 3}, kFloat64, gg, 0, 1, Device::cuda(0)), randn({0, 3}, kFloat64, gc), 0, 0, "randn empty");
}
PARITY_CASE(randint) {
  for (auto lh : {std::pair<int64_t, int64_t>{0, 10}, {-50, 3}, {-(int64_t(1) << 40), int64_t(1) << 41}, {5, 6}}) {
    Generator gc(3), gg(3);
    check_equal(randint(lh.first, lh.second, {1 << 20}, gg, Device::cuda(0)), randint(lh.first, lh.second, {1 << 20}, gc));
  }
  Generator gc(4), gg(4);
  check_equal(randint(0, 5, {0, 2}, gg, Device::cuda(0)), randint(0, 5, {0, 2}, gc));
}
PARITY_CASE(bernoulli) {
  for (double p : {0.0, 0.3, 0.5, 1.0}) {
    Generator gc(5), gg(5);
    check_equal(bernoulli({1 << 20}, p, gg, Device::cuda(0)), bernoulli({1 << 20}, p, gc));
    check_equal(bernoulli({3, 7}, p, gg, Device::cuda(0)), bernoulli({3, 7}, p, gc));
  }
  Generator gc(6), gg(6);
  check_equal(bernoulli({0}, 0.5, gg, Device::cuda(0)), bernoulli({0}, 0.5, gc));
}

}  // TEST_SUITE
