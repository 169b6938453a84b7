// The CPU instruction tiers of the row helpers (kernels/common/cpu_isa.h, row_math.cpp): every
// tier this CPU runs gives the baseline tier's bits, row by row and through the kernels that use
// them (softmax, flash, block and routed attention, forward and backward); the setting's names
// and errors.
#include <cfenv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/common/cpu_isa.h"
#include "kernels/common/row_math.h"
#include "test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

using kernels::CpuIsa;

std::vector<CpuIsa> tiers_run_here() {
  std::vector<CpuIsa> t;
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512})
    if (kernels::cpu_isa_runs(isa)) t.push_back(isa);
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // (an empty vector's data() may be null, which memcmp must not get even for 0 bytes)
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
std::vector<float> values_f32(const Tensor& t) { return contiguous(t).to_vector<float>(); }
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// A 16-bit format's rows (row_math.h's widen_row / round_row) in every tier against core/half.h's
// conversions: all 65536 patterns widened (subnormals, infinities, NaN payloads), and float32 patterns
// covering every value of the kept high bits with the `dropped` low bits at the rounding edges (0, just
// below, at and just above the tie, all ones): NaNs, overflow, subnormal results, carries into the
// exponent; then every short row length, which leaves every vector tail, writing nothing past the row.
template <typename T>
void check_16bit_rows(int dropped) {
  std::vector<T> all(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b] = T::from_bits(uint16_t(b));
  const uint32_t tie = 1u << (dropped - 1), ones = (1u << dropped) - 1;
  std::vector<float> x;
  for (uint32_t hi = 0; hi < (1u << (32 - dropped)); ++hi)
    for (uint32_t lo : {0u, tie - 1, tie, tie + 1, ones}) {
      const uint32_t u = (hi << dropped) | lo;
      float f;
      std::memcpy(&f, &u, 4);
      x.push_back(f);
    }
  // Integer arithmetic (and exact products) only: the same bits in every rounding mode a program may set,
  // and no FP exception flag raised, signalling NaNs included (a program with traps on would stop).
  const std::pair<int, const char*> modes[] = {
      {FE_TONEAREST, "to nearest"}, {FE_UPWARD, "upward"}, {FE_DOWNWARD, "downward"}, {FE_TOWARDZERO, "toward zero"}};
  for (CpuIsa isa : tiers_run_here()) {
    for (const auto& [mode, mode_name] : modes) {
      INFO("tier ", kernels::cpu_isa_name(isa), ", rounding ", mode_name);
      const kernels::RowMath& rm = kernels::row_math(isa);
      std::vector<float> wide(all.size());
      std::vector<T> narrow(x.size());
      std::feclearexcept(FE_ALL_EXCEPT);
      REQUIRE(std::fesetround(mode) == 0);
      kernels::widen_row(rm, all.data(), wide.data(), int64_t(all.size()));
      kernels::round_row(rm, x.data(), narrow.data(), int64_t(x.size()));
      std::fesetround(FE_TONEAREST);
      CHECK(std::fetestexcept(FE_ALL_EXCEPT) == 0);
      int bad = 0;
      for (size_t i = 0; i < all.size(); ++i)
        if (!same_bits(wide[i], float(all[i])) && bad++ < 5) FAIL_CHECK("widen ", all[i].bits);
      for (size_t i = 0; i < x.size(); ++i)
        if (narrow[i].bits != T(x[i]).bits && bad++ < 5) FAIL_CHECK("round ", x[i], " at ", i);
      for (int64_t n = 0; n < 40; ++n) {
        std::vector<T> part(size_t(n) + 1, T::from_bits(0xABCD));
        kernels::round_row(rm, x.data() + 1000, part.data(), n);
        for (int64_t i = 0; i < n; ++i)
          if (part[size_t(i)].bits != T(x[size_t(1000 + i)]).bits && bad++ < 5) FAIL_CHECK("tail ", n);
        if (part[size_t(n)].bits != 0xABCD && bad++ < 5) FAIL_CHECK("wrote past ", n);
      }
      CHECK(bad == 0);
    }
  }
}

// Scores as the kernels see them: mostly ordinary, with -inf (masked), NaN, -0,
// values far below the maximum (exp underflows) and long runs, at lengths that
// exercise every vector tail.
std::vector<float> row_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-12.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) {
    const uint32_t pick = rng() % 40;
    v = pick == 0 ? -INFINITY : pick == 1 ? -0.0f : pick == 2 ? -95.0f : pick == 3 ? 0.0f : u(rng);
  }
  if (n > 5 && seed % 3 == 0) x[size_t(n / 2)] = NAN;
  return x;
}

// Gradients of a tensor list after the kernels ran at one tier, as float vectors.
std::vector<std::vector<float>> values_of(const std::vector<Tensor>& ts) {
  std::vector<std::vector<float>> out;
  for (const Tensor& t : ts) out.push_back(contiguous(t).to_vector<float>());
  return out;
}

// The tier setting restored at the end of a test case.
struct IsaRestore {
  CpuIsa before = kernels::cpu_isa();
  ~IsaRestore() { kernels::set_cpu_isa(before); }
};

}  // namespace

TEST_CASE("env_switch: unset or empty is no choice, 0 and 1 are off and on, anything else is named") {
  const char* var = "CF_TEST_ENV_SWITCH";
  unsetenv(var);
  CHECK(!kernels::env_switch(var, "matmul").has_value());
  setenv(var, "", 1);
  CHECK(!kernels::env_switch(var, "matmul").has_value());
  setenv(var, "0", 1);
  CHECK(kernels::env_switch(var, "matmul") == false);
  setenv(var, "1", 1);
  CHECK(kernels::env_switch(var, "matmul") == true);
  for (const char* bad : {"off", "true", "01", " 1", "yes"}) {
    setenv(var, bad, 1);
    const std::string want =
        std::string("[matmul] the environment variable CF_TEST_ENV_SWITCH must be 0 or 1 (or unset), got '") + bad + "'";
    CHECK_THROWS_MSG(kernels::env_switch(var, "matmul"), ValueError, want.c_str());
  }
  unsetenv(var);
}

TEST_CASE("cpu_isa: names, the supported tier, the setting, and a bad name or missing tier named") {
  CHECK(kernels::parse_cpu_isa("auto") == CpuIsa::kAuto);
  CHECK(kernels::parse_cpu_isa("baseline") == CpuIsa::kBaseline);
  CHECK(kernels::parse_cpu_isa("avx2") == CpuIsa::kAvx2);
  CHECK(kernels::parse_cpu_isa("avx512") == CpuIsa::kAvx512);
  for (CpuIsa isa : {CpuIsa::kAuto, CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512})
    CHECK(kernels::parse_cpu_isa(kernels::cpu_isa_name(isa)) == isa);
  CHECK_THROWS_MSG(kernels::parse_cpu_isa("sse4"), ValueError,
                   "[cpu_isa] CF_CPU_ISA must be auto, baseline, avx2 or avx512, got 'sse4'");
  CHECK_THROWS_MSG(kernels::parse_cpu_isa("avx", "--cpu-isa"), ValueError, "[cpu_isa] --cpu-isa must be auto");
  CHECK_THROWS_MSG(kernels::parse_cpu_isa(""), ValueError, "got ''");

  const CpuIsa best = kernels::cpu_isa_supported();
  CHECK(best != CpuIsa::kAuto);
  CHECK(kernels::cpu_isa_runs(CpuIsa::kBaseline));
  CHECK(kernels::cpu_isa_runs(CpuIsa::kAuto));
  const std::string note = std::string("this CPU runs the ") + kernels::cpu_isa_name(best) + " tier";
  MESSAGE(note);
  IsaRestore restore;
  kernels::set_cpu_isa(CpuIsa::kBaseline);
  CHECK(kernels::cpu_isa() == CpuIsa::kBaseline);
  CHECK(kernels::row_math().isa == CpuIsa::kBaseline);
  kernels::set_cpu_isa(CpuIsa::kAuto);  // back to the best this CPU runs
  CHECK(kernels::cpu_isa() == best);
  CHECK(kernels::row_math().isa == best);
  CHECK(kernels::row_math(CpuIsa::kAuto).isa == best);
  if (best != CpuIsa::kAvx512) {
    CHECK_THROWS_MSG(kernels::set_cpu_isa(CpuIsa::kAvx512), ValueError,
                     "[cpu_isa] set_cpu_isa asks for avx512 but this CPU runs at most ");
    CHECK_THROWS_MSG(kernels::row_math(CpuIsa::kAvx512), ValueError, "[row_math] this CPU lacks the avx512 tier");
    CHECK(kernels::cpu_isa() == best);  // a refused setting changes nothing
  } else {
    MESSAGE("this CPU runs every tier: the missing-tier errors are not reachable here");
  }
}

TEST_CASE("row helpers: every tier this CPU runs gives the baseline tier's bits, and the header's") {
  const kernels::RowMath& base = kernels::row_math(CpuIsa::kBaseline);
  for (CpuIsa isa : tiers_run_here()) {
    CAPTURE(kernels::cpu_isa_name(isa));
    const kernels::RowMath& rm = kernels::row_math(isa);
    CHECK(rm.isa == isa);
    for (int64_t n : {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 513, 1000}) {
      for (uint32_t seed = 1; seed <= 3; ++seed) {
        CAPTURE(n);
        CAPTURE(seed);
        const std::vector<float> x = row_values(n, seed);
        // the maximum (NaN skipped), from -inf and from a larger start
        for (float init : {-INFINITY, 1.5f}) {
          const float m = rm.max_row(x.data(), n, init);
          CHECK(same_bits(m, base.max_row(x.data(), n, init)));
          CHECK(same_bits(m, kernels::max_row(x.data(), n, init)));
        }
        // exp(x - shift), the row's maximum as the shift
        const float shift = n > 0 ? base.max_row(x.data(), n, -INFINITY) : 0.0f;
        std::vector<float> y(x.size()), y0(x.size()), yh(x.size());
        rm.exp_shifted(x.data(), y.data(), n, shift);
        base.exp_shifted(x.data(), y0.data(), n, shift);
        kernels::exp_shifted(x.data(), yh.data(), n, shift);
        CHECK(same_bits(y, y0));
        CHECK(same_bits(y, yh));
        // the sum in double, over finite and over non-finite rows
        CHECK(same_bits(rm.sum_row(y.data(), n), base.sum_row(y.data(), n)));
        CHECK(same_bits(rm.sum_row(x.data(), n), kernels::sum_row(x.data(), n)));
        // dS = P (dP - D), 0 where P is 0 (D infinite too)
        for (float D : {0.25f, INFINITY}) {
          std::vector<float> dp = row_values(n, seed + 10), dp0 = dp;
          rm.softmax_grad_row(y.data(), dp.data(), n, D);
          base.softmax_grad_row(y.data(), dp0.data(), n, D);
          CHECK(same_bits(dp, dp0));
          for (int64_t k = 0; k < n; ++k)
            if (y[size_t(k)] == 0.0f) CHECK(dp[size_t(k)] == 0.0f);
        }
      }
    }
  }
  // A NaN in the same vector lane as the maximum, one register width (8, 16, 32 floats) or two
  // later, must not hide it: x > m ? x : m skips NaN in every lane and order.
  for (CpuIsa isa : tiers_run_here()) {
    const kernels::RowMath& rm = kernels::row_math(isa);
    for (int64_t n : {40, 100}) {
      for (int64_t p = 0; p < 8; ++p) {
        for (int64_t w : {4, 8, 16, 32, 64}) {
          if (p + w >= n) continue;
          std::vector<float> row(static_cast<size_t>(n), -1.0f);
          row[size_t(p)] = 5.0f;
          row[size_t(p + w)] = NAN;
          CAPTURE(kernels::cpu_isa_name(isa));
          CAPTURE(n);
          CAPTURE(p);
          CAPTURE(w);
          CHECK(rm.max_row(row.data(), n, -INFINITY) == 5.0f);
          row[size_t(p)] = -1.0f;  // and a NaN before the maximum
          row[size_t(p + w)] = 5.0f;
          row[size_t(p)] = NAN;
          CHECK(rm.max_row(row.data(), n, -INFINITY) == 5.0f);
        }
      }
    }
  }
  // The mask of a score row: -inf where lim > i, self_score where own == i, the score otherwise
  // (the column forms mask_scores builds: always blocked, never blocked, causal, own key, none).
  for (CpuIsa isa : tiers_run_here()) {
    const kernels::RowMath& rm = kernels::row_math(isa);
    for (int64_t n : {0, 1, 7, 8, 9, 16, 17, 33, 64, 100}) {
      CAPTURE(kernels::cpu_isa_name(isa));
      CAPTURE(n);
      std::mt19937 rng(uint32_t(n) + 5);
      std::vector<int64_t> lim(static_cast<size_t>(n)), own(static_cast<size_t>(n));
      for (int64_t c = 0; c < n; ++c) {
        const uint32_t pick = rng() % 4;
        const int64_t j = int64_t(rng() % 12);
        lim[size_t(c)] = pick == 0   ? std::numeric_limits<int64_t>::max()
                         : pick == 1 ? std::numeric_limits<int64_t>::min()
                                     : j;
        own[size_t(c)] = pick == 0 ? -1 : j;
      }
      for (int64_t i : {0, 3, 5, 11}) {
        CAPTURE(i);
        const std::vector<float> x = row_values(n, uint32_t(i) + 1);
        std::vector<float> y = x, y0 = x, want = x;
        std::vector<char> self(static_cast<size_t>(n), 7), self0(static_cast<size_t>(n), 7);
        rm.mask_row(y.data(), lim.data(), own.data(), n, i, -1e5f, self.data());
        base.mask_row(y0.data(), lim.data(), own.data(), n, i, -1e5f, self0.data());
        for (int64_t c = 0; c < n; ++c) {
          if (lim[size_t(c)] > i)
            want[size_t(c)] = -INFINITY;
          else if (own[size_t(c)] == i)
            want[size_t(c)] = -1e5f;
          CHECK(self[size_t(c)] == char(own[size_t(c)] == i));
        }
        CHECK(same_bits(y, y0));
        CHECK(same_bits(y, want));
        CHECK(self == self0);
        std::vector<float> y1 = x;  // without the self flags
        rm.mask_row(y1.data(), lim.data(), own.data(), n, i, -1e5f, nullptr);
        CHECK(same_bits(y1, want));
      }
    }
  }
  // The sum keeps double partials: float32 rounding of 2^24 + 1 ones would lose the last one.
  std::vector<float> ones((size_t(1) << 24) + 8, 1.0f);
  for (CpuIsa isa : tiers_run_here())
    CHECK(kernels::row_math(isa).sum_row(ones.data(), int64_t(ones.size())) == double(ones.size()));
}

TEST_CASE("bfloat16 rows: every tier converts as core/half.h, for every float32 high half and rounding case") {
  check_16bit_rows<BFloat16>(16);
}

TEST_CASE("float16 rows: every tier converts as core/half.h, for every rounding case of every float32 exponent") {
  // (the 13 dropped bits' edges also fall inside the kept bits for every subnormal shift, 2^-25 and below)
  check_16bit_rows<Half>(13);
}

TEST_CASE("copy between float32 and bfloat16 or float16 (contiguous: the row tiers) equals the element by element path") {
  // the strided view takes the generic loop; the contiguous copy the tiered rows
  Tensor x = randn({3, 1000}, kFloat32, default_generator());
  for (DType low : {kBFloat16, kFloat16}) {
    INFO(dtype_name(low));
    Tensor strided = to(transpose(x, 0, 1), low), contiguous_ = to(contiguous(transpose(x, 0, 1)), low);
    CHECK(values(strided) == values(contiguous_));
    Tensor back = to(contiguous_, kFloat32), back_strided = to(transpose(contiguous_, 0, 1), kFloat32);
    CHECK(values(back) == values(contiguous(transpose(back_strided, 0, 1))));
  }
}

TEST_CASE("bfloat16 and float16 add, sub, mul, div (the row tiers' conversions) give float32's result rounded once") {
  // contiguous operands, a broadcast row (stride 0 inside runs: a scalar), and strided views (the element loop)
  std::vector<float> va = values_f32(randn({4, 300}, kFloat32, default_generator()));
  std::vector<float> vb = values_f32(randn({4, 300}, kFloat32, default_generator()));
  va[3] = std::numeric_limits<float>::quiet_NaN();
  vb[5] = std::numeric_limits<float>::infinity();
  vb[7] = 0.0f;
  va[9] = 70000.0f;  // beyond float16's range: inf there
  vb[11] = 1e-6f;     // a float16 subnormal
  for (DType low : {kBFloat16, kFloat16}) {
    INFO(dtype_name(low));
    Tensor a = to(Tensor::from_vector(std::vector<double>(va.begin(), va.end()), {4, 300}), low);
    Tensor b = to(Tensor::from_vector(std::vector<double>(vb.begin(), vb.end()), {4, 300}), low);
    Tensor s = slice(b, 1, 0, 1);  // (4, 1): one value per row, broadcast
    auto want = [low](const Tensor& x, const Tensor& y, int op) {
      Tensor fx = to(x, kFloat32), fy = to(y, kFloat32);
      Tensor r = op == 0 ? add(fx, fy) : op == 1 ? sub(fx, fy) : op == 2 ? mul(fx, fy) : div(fx, fy);
      return to(r, low);
    };
    auto same = [](const Tensor& x, const Tensor& y) {
      const std::vector<double> p = values(x), q = values(y);
      REQUIRE(p.size() == q.size());
      for (size_t i = 0; i < p.size(); ++i)
        if (!(p[i] == q[i] || (std::isnan(p[i]) && std::isnan(q[i])))) return false;
      return true;
    };
    for (int op = 0; op < 4; ++op) {
      INFO("op ", op);
      auto run = [op](const Tensor& x, const Tensor& y) {
        return op == 0 ? add(x, y) : op == 1 ? sub(x, y) : op == 2 ? mul(x, y) : div(x, y);
      };
      CHECK(same(run(a, b), want(a, b, op)));
      CHECK(same(run(a, s), want(a, s, op)));
      CHECK(same(run(s, a), want(s, a, op)));
      CHECK(same(run(transpose(a, 0, 1), transpose(b, 0, 1)), want(transpose(a, 0, 1), transpose(b, 0, 1), op)));
    }
  }
}

TEST_CASE("dropout rows: every tier drops exactly where the Philox uniform is below p (core/rng.h)") {
  std::vector<float> x(301);
  for (size_t k = 0; k < x.size(); ++k) x[k] = float(k) * 0.37f - 40.0f;
  // p on a 2^-53 step (0.5: a draw of exactly p is kept), counters across 2^32, a 64-bit seed
  for (double p : {0.0, 0.1, 1.0 / 3.0, 0.5, 0.9, 1.0}) {
    for (uint64_t counter0 : {uint64_t(0), (uint64_t(1) << 32) - 150, uint64_t(0x123456789abcULL)}) {
      for (uint64_t seed : {uint64_t(7), uint64_t(0xfedcba9876543210ULL)}) {
        CAPTURE(p);
        CAPTURE(counter0);
        CAPTURE(seed);
        const float scale = float(1.0 / (1.0 - p));
        std::vector<float> want(x.size());
        std::vector<double> want_d(x.size()), got_d(x.size()), xd(x.begin(), x.end());
        for (size_t k = 0; k < x.size(); ++k) {
          const double u = philox_uniform_d(philox4x32_10(seed, counter0 + k));
          want[k] = u < p ? 0.0f : x[k] * scale;
          want_d[k] = u < p ? 0.0 : xd[k] * (1.0 / (1.0 - p));
        }
        // Gathered counters (block attention's key positions): counter0 + cols[k], scattered and out of order.
        std::vector<int64_t> cols(x.size());
        std::vector<float> want_g(x.size());
        for (size_t k = 0; k < x.size(); ++k) {
          cols[k] = int64_t((k * 7919) % 5003);
          const double u = philox_uniform_d(philox4x32_10(seed, counter0 + uint64_t(cols[k])));
          want_g[k] = u < p ? 0.0f : x[k] * scale;
        }
        const uint64_t threshold = kernels::dropout_threshold(p);
        for (CpuIsa isa : tiers_run_here()) {
          CAPTURE(kernels::cpu_isa_name(isa));
          std::vector<float> got(x.size());
          kernels::row_math(isa).dropout_row(x.data(), got.data(), int64_t(x.size()), seed, counter0, threshold,
                                             scale, nullptr);
          CHECK(same_bits(got, want));
          kernels::row_math(isa).dropout_row(x.data(), got.data(), int64_t(x.size()), seed, counter0, threshold,
                                             scale, cols.data());
          CHECK(same_bits(got, want_g));
        }
        kernels::dropout_row<double>(xd.data(), got_d.data(), int64_t(xd.size()), seed, counter0, threshold,
                                     1.0 / (1.0 - p));
        CHECK(std::memcmp(got_d.data(), want_d.data(), got_d.size() * sizeof(double)) == 0);
      }
    }
  }
  // the draws on either side of the threshold: u = p exactly is kept, one step below is dropped
  CHECK(kernels::dropout_threshold(0.5) == uint64_t(1) << 52);
  CHECK(kernels::dropout_threshold(0.5 + std::ldexp(1.0, -53)) == (uint64_t(1) << 52) + 1);
  CHECK(kernels::dropout_threshold(1.0) == uint64_t(1) << 53);
  // p 2^53 not an integer: rounded up (0.1 2^53 = 900719925474099.25), and the smallest steps
  CHECK(kernels::dropout_threshold(0.1) == uint64_t(900719925474100ULL));
  CHECK(kernels::dropout_threshold(std::ldexp(1.0, -54)) == 1);
  CHECK(kernels::dropout_threshold(std::ldexp(1.0, -1074)) == 1);
  CHECK(kernels::dropout_threshold(0.0) == 0);
  CHECK(kernels::dropout_threshold(-0.5) == 0);
  CHECK(kernels::dropout_threshold(std::nan("")) == 0);
  CHECK(kernels::dropout_threshold(2.0) == uint64_t(1) << 53);
  // A rate planted on one element's own draw: u = p is kept, one 2^-53 step above it is dropped
  // (a "<=" in the test, or a threshold not rounded up, fails here).
  const uint64_t seed = 11, counter0 = 1000;
  std::vector<float> one(5, 2.0f), got(5);
  const PhiloxOut r = philox4x32_10(seed, counter0 + 2);
  const uint64_t bits = ((uint64_t(r.v[0]) << 21) ^ uint64_t(r.v[1] >> 11)) & ((uint64_t(1) << 53) - 1);
  REQUIRE(std::ldexp(double(bits), -53) == philox_uniform_d(r));
  for (CpuIsa isa : tiers_run_here()) {
    CAPTURE(kernels::cpu_isa_name(isa));
    const kernels::RowMath& rm = kernels::row_math(isa);
    for (int64_t step : {0, 1}) {
      const double p = std::ldexp(double(bits + uint64_t(step)), -53);
      rm.dropout_row(one.data(), got.data(), 5, seed, counter0, kernels::dropout_threshold(p), 1.0f, nullptr);
      CHECK((got[2] == 0.0f) == (step == 1));
      CHECK((got[2] == 0.0f) == (philox_uniform_d(r) < p));
    }
  }
}

TEST_CASE("row helpers' tiers through the kernels: softmax and flash, block and routed attention give the same bits") {
  IsaRestore restore;
  Generator g(7);
  const int64_t B = 2, H = 2, N = 70, D = 16;
  const Tensor x = randn({5, 3, 77}, kFloat32, g);
  const Tensor kpm = padding_mask(B, N, 9);
  const Tensor members = random_members(B, H, N, 16, 3, 11);
  // routed lists: every query and key in one list per (b, h), as routed attention's own tests build them
  std::vector<int64_t> lists;
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t s = 0; s < 40; ++s) lists.push_back(s < 35 ? (c * 35 + s + bh) % N : -1);
  const Tensor rm_lists = Tensor::from_vector(lists, {B, H, 2, 40});
  auto leaf = [&](uint64_t seed) {
    Generator gg(seed);
    Tensor t = randn({B, H, N, D}, kFloat32, gg);
    t.set_requires_grad(true);
    return t;
  };
  const Tensor q = leaf(1), k = leaf(2), v = leaf(3);
  const Tensor w = randn({B, H, N, D}, kFloat32, g);  // a loss weight

  auto run = [&](CpuIsa isa) {
    kernels::set_cpu_isa(isa);
    std::vector<Tensor> outs;
    outs.push_back(softmax(x, -1));
    outs.push_back(log_softmax(x, -1));
    for (bool causal : {false, true}) {
      for (const Tensor* t : {&q, &k, &v}) t->zero_grad();
      Tensor o = flash_attention(q, k, v, kpm, 0.0, causal);
      sum(o * w).backward();
      outs.insert(outs.end(), {o, q.grad(), k.grad(), v.grad()});
    }
    for (const Tensor* t : {&q, &k, &v}) t->zero_grad();
    BlockAttentionOptions bo;
    bo.look_back = 1;
    BlockAttentionResult br = block_attention(q, k, v, members, kpm, bo);
    sum(br.out * w).backward();
    outs.insert(outs.end(), {br.out, br.lse, q.grad(), k.grad(), v.grad()});
    // causal by position and the Reformer's own-key rule (keys shared with the queries)
    for (const Tensor* t : {&q, &v}) t->zero_grad();
    bo.causal = true;
    bo.self_mask = true;
    BlockAttentionResult bs = block_attention(q, q, v, members, kpm, bo);
    sum(bs.out * w).backward();
    outs.insert(outs.end(), {bs.out, bs.lse, q.grad(), v.grad()});
    for (const Tensor* t : {&q, &k, &v}) t->zero_grad();
    Tensor ro = routed_attention(q, k, v, rm_lists, rm_lists, kpm);
    sum(ro * w).backward();
    outs.insert(outs.end(), {ro, q.grad(), k.grad(), v.grad()});
    return values_of(outs);
  };
  const std::vector<std::vector<float>> base = run(CpuIsa::kBaseline);
  for (CpuIsa isa : tiers_run_here()) {
    CAPTURE(kernels::cpu_isa_name(isa));
    const std::vector<std::vector<float>> got = run(isa);
    REQUIRE(got.size() == base.size());
    for (size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      CHECK(same_bits(got[i], base[i]));
    }
  }
}
