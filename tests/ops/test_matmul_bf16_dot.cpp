// The bfloat16 GEMM kernels, the AMX one (kernels/matmul/bf16_amx_cpu.cpp) and the AVX-512 BF16
// one (bf16_dot_cpu.cpp), against the converting path (float32 blocks + sgemm): each must meet
// rule R2 of docs/design-notes.md against the float32 product of the same values, on every layout
// and on shapes that are not multiples of the kernels' blocks (AMX: 32 x 32 tiles of C, k blocks
// of 32, row blocks of 64, K blocks of 2048; vdpbf16ps: 4 x 64 and k pairs).
#include <cmath>

#include "kernels/matmul/bf16_amx.h"
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
// Which kernel matmul uses for bfloat16; the destructor restores the defaults whatever happens.
enum class Path { kAmx, kDot, kConverting };
struct PathSwitch {
  void use(Path p) {
    kernels::set_bf16_amx_enabled(p == Path::kAmx);
    kernels::set_bf16_dot_enabled(p == Path::kDot);
  }
  ~PathSwitch() {
    kernels::set_bf16_amx_enabled(true);
    kernels::reset_bf16_dot_enabled();
  }
};
// The paths this CPU can run, each with its name.
std::vector<std::pair<Path, const char*>> runnable_paths() {
  std::vector<std::pair<Path, const char*>> paths = {{Path::kConverting, "converting path"}};
  if (kernels::bf16_amx_supported())
    paths.push_back({Path::kAmx, "AMX kernel"});
  else
    MESSAGE("this CPU (or OS) gives no AMX tiles: the AMX kernel is not run");
  if (kernels::bf16_dot_supported())
    paths.push_back({Path::kDot, "vdpbf16ps kernel"});
  else
    MESSAGE("this CPU has no avx512bf16: the vdpbf16ps kernel is not run");
  return paths;
}
}  // namespace

TEST_CASE("bfloat16 matmul: the AMX and AVX-512 BF16 kernels and the converting path all meet R2, on every layout") {
  // vdpbf16ps: on by default on AMD CPUs that have it, off on Intel's (bf16_dot.h says why)
  CHECK(kernels::bf16_dot_available() == kernels::bf16_dot_default_on());
  if (kernels::bf16_dot_supported()) MESSAGE("vdpbf16ps kernel by default: ", kernels::bf16_dot_default_on());
  CHECK(kernels::bf16_amx_available() == kernels::bf16_amx_supported());  // on by default where it runs
  PathSwitch restore;
  Generator g(3);
  struct Case {
    Shape a, b;
    bool ta, tb;
  };
  std::vector<Case> cases = {{{5, 37}, {37, 70}, false, false}, {{1, 1}, {1, 1}, false, false},
                             {{9, 64}, {64, 16}, false, false}, {{3, 7, 33}, {3, 33, 18}, false, false},
                             {{6, 31}, {31, 65}, true, false},  {{4, 20}, {20, 9}, false, true},
                             {{2, 130, 3}, {3, 129}, false, false},
                             // AMX: two row blocks and a part of a third, both operands transposed
                             {{150, 45}, {45, 97}, true, true},
                             // AMX: K over one K block (2048), so C is carried between blocks
                             {{33, 2085}, {2085, 40}, false, false}, {{17, 2085}, {2085, 35}, true, true}};
  const auto paths = runnable_paths();
  for (const Case& c : cases) {
    Tensor a32 = to(to(rand(c.a, kFloat32, g, -1, 1), kBFloat16), kFloat32);
    Tensor b32 = to(to(rand(c.b, kFloat32, g, -1, 1), kBFloat16), kFloat32);
    Tensor a = to(a32, kBFloat16), b = to(b32, kBFloat16);
    if (c.ta) a = transpose(contiguous(transpose(a, -1, -2)), -1, -2);  // same values, column-major
    if (c.tb) b = transpose(contiguous(transpose(b, -1, -2)), -1, -2);
    for (const auto& [path, name] : paths) {
      restore.use(path);
      Tensor y = matmul(a, b);
      CHECK(y.dtype() == kBFloat16);
      check_r2(y, a32, b32, name);
    }
  }
}

TEST_CASE("bfloat16 matmul: infinities and NaNs come out where the converting path puts them") {
  PathSwitch restore;
  // Row 0 of a holds an inf, row 1 a NaN, row 2 finite values; b's column 1 has a 0 that meets the
  // inf (inf * 0 = NaN) and column 2 overflows in row 2 (2^127 * 4: inf after the sum).
  Tensor a = to(t32({1, INFINITY, 2, NAN, 1, 1, 0x1p127f, 1, 0}, {3, 3}), kBFloat16);
  Tensor b = to(t32({1, 1, 2, 2, 0, 2, 1, 1, 2}, {3, 3}), kBFloat16);
  restore.use(Path::kConverting);
  const std::vector<double> want = values(to(matmul(a, b), kFloat32));
  for (const auto& [path, name] : runnable_paths()) {
    INFO(std::string(name));
    restore.use(path);
    const std::vector<double> got = values(to(matmul(a, b), kFloat32));
    for (size_t i = 0; i < want.size(); ++i) {
      INFO("element ", i, ": ", got[i], " vs ", want[i]);
      if (std::isnan(want[i]))
        CHECK(std::isnan(got[i]));
      else if (std::isinf(want[i]))
        CHECK(got[i] == want[i]);
      else
        CHECK(got[i] == doctest::Approx(want[i]).epsilon(1.0 / 128));
    }
  }
}

TEST_CASE("bfloat16 AMX and vdpbf16ps kernels, called directly: every operand layout, K blocks, a C window") {
  // matmul cuts a product into slabs per thread, so through it a kernel may never see more than 64 rows
  // together with K over 2048 (AMX: several row blocks, each carrying C between K blocks), nor a C window
  // inside a wider matrix, nor operands with neither stride 1 (matmul copies those first): this calls the
  // kernels on them. K is odd (the vdpbf16ps kernel pads its last pair) and N not a multiple of 16 or 64.
  using Gemm = void (*)(const BFloat16*, int64_t, int64_t, const BFloat16*, int64_t, int64_t, BFloat16*, int64_t,
                        int64_t, int64_t, int64_t);
  std::vector<std::pair<Gemm, const char*>> kernels_here;
  if (kernels::bf16_amx_supported()) kernels_here.push_back({&kernels::bf16_amx_gemm, "AMX kernel"});
  if (kernels::bf16_dot_supported()) kernels_here.push_back({&kernels::bf16_dot_gemm, "vdpbf16ps kernel"});
  if (kernels_here.empty()) {
    MESSAGE("this CPU has neither AMX tiles nor avx512bf16: no kernel to call");
    return;
  }
  Generator g(11);
  const int64_t M = 100, N = 50, K = 2085, ldc = 61, col0 = 5;
  // the layouts: 0 row-major, 1 transposed (columns contiguous), 2 every other element of a row-major
  // matrix twice as wide (neither stride 1)
  for (const auto& [gemm, name] : kernels_here)
    for (int la : {0, 1, 2})
      for (int lb : {0, 1, 2}) {
        INFO(name, ": a layout ", la, ", b layout ", lb);
        const std::vector<double> av = values(rand({2 * M * K}, kFloat64, g, -1, 1)),
                                  bv = values(rand({2 * K * N}, kFloat64, g, -1, 1));
        std::vector<BFloat16> a(av.size()), b(bv.size());
        for (size_t i = 0; i < a.size(); ++i) a[i] = BFloat16(av[i]);
        for (size_t i = 0; i < b.size(); ++i) b[i] = BFloat16(bv[i]);
        // element (i, k) of A at i a_rs + k a_cs, (k, j) of B at k b_rs + j b_cs
        const int64_t a_rs = la == 0 ? K : la == 1 ? 1 : 2 * K, a_cs = la == 0 ? 1 : la == 1 ? M : 2;
        const int64_t b_rs = lb == 0 ? N : lb == 1 ? 1 : 2 * N, b_cs = lb == 0 ? 1 : lb == 1 ? K : 2;
        std::vector<BFloat16> c(size_t(M * ldc), BFloat16(7.0f));  // 7: must stay outside the window
        gemm(a.data(), a_rs, a_cs, b.data(), b_rs, b_cs, c.data() + col0, ldc, M, N, K);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < ldc; ++j) {
            const float y = float(c[size_t(i * ldc + j)]);
            if (j < col0 || j >= col0 + N) {
              REQUIRE_MESSAGE(y == 7.0f, "written outside C at (", i, ", ", j, ")");
              continue;
            }
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; ++k) {
              const double p = double(float(a[size_t(i * a_rs + k * a_cs)])) *
                               double(float(b[size_t(k * b_rs + (j - col0) * b_cs)]));
              ref += p;
              mag += std::fabs(p);
            }
            REQUIRE_MESSAGE(std::fabs(y - ref) <= std::fabs(ref) / 256 + std::ldexp(mag, -20), "(", i, ", ",
                            j - col0, "): ", y, " vs ", ref);
          }
      }
}

TEST_CASE("bfloat16 matmul: the AMX and vdpbf16ps kernels flush subnormals, the converting path keeps them") {
  // The exception to rule R2 (docs/design-notes.md): 2^-130 * 2^10 = 2^-120 (a subnormal input), and
  // 2^-63 * 2^-64 = 2^-127 (normal inputs, a subnormal product).
  PathSwitch restore;
  Tensor a = to(t32({0x1p-130f, 0x1p-63f}, {2, 1}), kBFloat16), b = to(t32({0x1p10f, 0x1p-64f}, {1, 2}), kBFloat16);
  restore.use(Path::kConverting);
  const std::vector<double> kept = values(to(matmul(a, b), kFloat32));
  CHECK(kept[0] == std::ldexp(1.0, -120));
  CHECK(kept[3] == std::ldexp(1.0, -127));
  for (const auto& [path, name] : runnable_paths()) {
    if (path == Path::kConverting) continue;
    INFO(std::string(name));
    restore.use(path);
    const std::vector<double> flushed = values(to(matmul(a, b), kFloat32));
    CHECK(flushed[0] == 0.0);
    CHECK(flushed[3] == 0.0);
  }
}
