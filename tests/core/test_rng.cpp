#include <cmath>

#include "test_util.h"

using namespace cf;
using namespace cf::test;

TEST_SUITE("core") {

TEST_CASE("philox matches the published known-answer vectors") {
  // Random123 kat_vectors, philox4x32_10: counter 0, key 0 and counter/key all ones.
  PhiloxOut z = philox4x32_10(0, 0);
  CHECK(z.v[0] == 0x6627e8d5u);
  CHECK(z.v[1] == 0xe169c58du);
  CHECK(z.v[2] == 0xbc57ac4cu);
  CHECK(z.v[3] == 0x9b00dbd8u);
}

TEST_CASE("random streams are reproducible and well distributed") {
  Generator g1(42), g2(42);
  Tensor a = randn({10000}, kFloat64, g1), b = randn({10000}, kFloat64, g2);
  CHECK(a.to_vector<double>() == b.to_vector<double>());
  // The offset advances: the next draw differs.
  Tensor c = randn({10000}, kFloat64, g1);
  CHECK(c.to_vector<double>() != a.to_vector<double>());
  auto v = a.to_vector<double>();
  double m = 0, s = 0;
  for (double x : v) m += x;
  m /= double(v.size());
  for (double x : v) s += (x - m) * (x - m);
  s = std::sqrt(s / double(v.size()));
  CHECK(std::fabs(m) < 0.05);
  CHECK(std::fabs(s - 1.0) < 0.05);

  Generator g3(7);
  auto u = rand({20000}, kFloat32, g3, 2.0, 4.0).to_vector<float>();
  double um = 0;
  for (float x : u) {
    REQUIRE(x >= 2.0f);
    REQUIRE(x < 4.0f);
    um += x;
  }
  CHECK(std::fabs(um / double(u.size()) - 3.0) < 0.03);

  auto ri = randint(-3, 3, {6000}, g3).to_vector<int64_t>();
  std::vector<int> counts(6, 0);
  for (int64_t x : ri) {
    REQUIRE(x >= -3);
    REQUIRE(x < 3);
    ++counts[size_t(x + 3)];
  }
  for (int c6 : counts) CHECK(std::abs(c6 - 1000) < 150);
  // Spans beyond 2^32 take 128 random bits: 64 bits modulo a span of 3 * 2^62 gave the first third of the
  // range half the draws (0.5 instead of 1/3); modulo 10^18, 0.46 of the draws fell below 2^64 mod 10^18.
  {
    const int64_t lo = std::numeric_limits<int64_t>::min();
    const std::vector<int64_t> wide = randint(lo, int64_t(1) << 62, {60000}, g3).to_vector<int64_t>();
    double first_third = 0;
    for (int64_t x : wide) first_third += x < -(int64_t(1) << 62);
    CHECK(std::fabs(first_third / 60000.0 - 1.0 / 3.0) < 0.01);  // 5 standard deviations
    const std::vector<int64_t> e18 = randint(0, int64_t(1000000000000000000), {60000}, g3).to_vector<int64_t>();
    const double cut = double(uint64_t(-1) % uint64_t(1000000000000000000) + 1);  // 2^64 mod 10^18
    double below = 0;
    for (int64_t x : e18) below += double(x) < cut;
    CHECK(std::fabs(below / 60000.0 - cut / 1e18) < 0.01);
  }

  auto bern = bernoulli({20000}, 0.3, g3).to_vector<bool>();
  double frac = 0;
  for (bool x : bern) frac += x;
  CHECK(std::fabs(frac / double(bern.size()) - 0.3) < 0.02);

  // The same element index gives the same value whatever the thread split: a
  // large draw agrees with the prefix of a small one from the same state.
  Generator g4(9), g5(9);
  auto big = rand({100000}, kFloat64, g4).to_vector<double>();
  auto small = rand({10}, kFloat64, g5).to_vector<double>();
  for (size_t i = 0; i < small.size(); ++i) CHECK(big[i] == small[i]);

  manual_seed(5);
  auto d1 = rand({4}).to_vector<float>();
  manual_seed(5);
  CHECK(rand({4}).to_vector<float>() == d1);
}

TEST_CASE("random bad input") {
  Generator g(1);
  CHECK_THROWS_MSG(rand({2}, kInt64, g), DTypeError, "[rand]", "int64");
  CHECK_THROWS_MSG(rand({2}, kFloat32, g, 1.0, 1.0), ValueError, "[rand] needs finite low < high, got [1, 1)");
  CHECK_THROWS_MSG(rand({2}, kFloat64, g, -1e308, 1e308), ValueError, "[rand] the bounds [-1e+308, 1e+308)",
                   "width must lie within float64's range");
  CHECK_THROWS_MSG(rand({2}, kFloat16, g, 7e4, 8e4), ValueError, "within float16's range (|x| <= 65504)");
  CHECK_THROWS_MSG(rand({2}, kFloat32, g, 0.0, 1e39), ValueError, "within float32's range");
  for (DType dt : {kFloat16, kBFloat16}) {  // the widest bounds each 16-bit dtype holds: finite, in [low, high)
    const double top = dt == kFloat16 ? 65504.0 : 3.3895313892515355e38;
    for (double v : values(rand({1000}, dt, g, -top, top))) {
      CHECK(std::isfinite(v));
      CHECK(v >= -top);
      CHECK(v < top);
    }
  }
  CHECK_THROWS_MSG(randn({2}, kFloat32, g, 0.0, -1.0), ValueError, "[randn]", "std");
  // mean and std within the dtype's range (float32 randn(0, 1e39) filled infinities)
  CHECK_THROWS_MSG(randn({2}, kFloat32, g, 0.0, 1e39), ValueError, "[randn] mean 0 and std 1e+39",
                   "within float32's range");
  CHECK_THROWS_MSG(randn({2}, kBFloat16, g, 1e39, 1.0), ValueError, "[randn]", "within bfloat16's range");
  CHECK(std::isfinite(randn({2}, kFloat64, g, 0.0, 1e39).to_vector<double>()[0]));
  CHECK_THROWS_MSG(randint(3, 3, {2}, g), ValueError, "[randint]", "[3, 3)");
  CHECK_THROWS_MSG(bernoulli({2}, 1.5, g), ValueError, "[bernoulli]", "1.5");
  CHECK_THROWS_MSG(rand({2}, kFloat32, g, 0.0, 1.0, Device::cuda(63)), DeviceError, "cuda:63");
}

}
