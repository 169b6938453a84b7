// bfloat16 / float16: the value types' rounding, tensor creation, casts, printing, files,
// dtype promotion, and parity of every CPU op family with float32 under the tolerance rules of
// docs/design-notes.md ("Low-precision parity rules"):
//   R1 exact     -- ops computed in float32 on the widened inputs and rounded once equal the
//                   float32 op's result rounded to the storage type, bit for bit;
//   R2 matmul    -- |y - ref| <= u |ref| + 2^-20 (|A||B|)_ij (float32 accumulation in another order);
//   R3 chained   -- ops that round intermediates (layer_norm, cross_entropy, every backward):
//                   max|y - ref| <= 8 u max|ref|;
// with u the unit roundoff: 2^-8 for bfloat16, 2^-11 for float16.
#include <malloc.h>

#include <cmath>
#include <cstring>
#include <sstream>

#include "kernels/matmul/bf16_amx.h"
#include "kernels/matmul/bf16_dot.h"
#include "tests/test_files.h"
#include "tests/test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

float bits_f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

double unit_roundoff(DType dt) { return dt == kBFloat16 ? 1.0 / 256 : 1.0 / 2048; }

// Inputs in the storage type and the same (exactly widened) values in float32.
struct Pair {
  Tensor low, ref;
};
Pair pair(DType dt, const Shape& shape, uint64_t seed, double lo = -2, double hi = 2) {
  Generator g(seed);
  Tensor x = rand(shape, kFloat32, g, lo, hi);
  Tensor l = to(x, dt);
  return {l, to(l, kFloat32)};
}

// R1: y (low) == round(ref) bit for bit (NaN == NaN).
void check_r1(const Tensor& y, const Tensor& ref, const char* what) {
  INFO(std::string(what), " ", std::string(dtype_name(y.dtype())));
  REQUIRE(y.shape() == ref.shape());
  if (!is_floating(ref.dtype())) {
    CHECK(values(y) == values(ref));
    return;
  }
  std::vector<double> a = values(y), b = values(to(ref, y.dtype()));
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))))
      FAIL_CHECK("element ", i, ": got ", a[i], ", float32 rounded gives ", b[i]);
}

// R3: normwise relative.
void check_r3(const Tensor& y, const Tensor& ref, double u, const char* what, double factor = 8) {
  INFO(std::string(what), " ", std::string(dtype_name(y.dtype())));
  REQUIRE(y.shape() == ref.shape());
  std::vector<double> a = values(y), b = values(ref);
  double m = 0, err = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::fabs(b[i]));
    err = std::max(err, std::fabs(a[i] - b[i]));
  }
  CHECK_MESSAGE(err <= factor * u * m, "max error ", err, " vs bound ", factor * u * m);
}

}  // namespace

TEST_CASE("bfloat16 rounds to nearest even and keeps NaN, inf and signed zero") {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even mantissa (1).
  CHECK(BFloat16(1.0f + 1.0f / 256).bits == 0x3F80);
  // 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up to even.
  CHECK(BFloat16(1.0f + 3.0f / 256).bits == 0x3F82);
  // just above the tie rounds up
  CHECK(BFloat16(bits_f(0x3F808001)).bits == 0x3F81);
  CHECK(BFloat16(bits_f(0x3F807FFF)).bits == 0x3F80);
  CHECK(BFloat16(-0.0f).bits == 0x8000);
  CHECK(BFloat16(std::numeric_limits<float>::infinity()).bits == 0x7F80);
  CHECK(BFloat16(std::numeric_limits<float>::max()).bits == 0x7F80);  // rounds past bf16 max
  // a signalling NaN whose payload sits only in the low bits stays a NaN (not inf)
  BFloat16 n(bits_f(0x7F800001));
  CHECK(std::isnan(float(n)));
  CHECK(std::isnan(float(BFloat16(-std::nanf("")))));
  CHECK(float(BFloat16(3.140625f)) == 3.140625f);  // representable values are exact
  // every bf16 bit pattern round-trips through float32
  for (uint32_t b = 0; b < 0x10000; ++b) {
    BFloat16 v = BFloat16::from_bits(uint16_t(b));
    float f = float(v);
    if (std::isnan(f)) continue;
    REQUIRE(BFloat16(f).bits == b);
  }
}

TEST_CASE("float16 rounds to nearest even in the normal, subnormal and overflow ranges") {
  CHECK(Half(1.0f).bits == 0x3C00);
  CHECK(Half(1.0f + 1.0f / 2048).bits == 0x3C00);      // tie to even (down)
  CHECK(Half(1.0f + 3.0f / 2048).bits == 0x3C02);      // tie to even (up)
  CHECK(Half(65504.0f).bits == 0x7BFF);
  CHECK(Half(65519.0f).bits == 0x7BFF);                 // below the halfway point to 65536
  CHECK(Half(65520.0f).bits == 0x7C00);                 // the tie goes to inf (even)
  CHECK(Half(-1e6f).bits == 0xFC00);
  CHECK(Half(std::ldexp(1.0f, -24)).bits == 0x0001);   // smallest subnormal
  CHECK(Half(std::ldexp(1.0f, -25)).bits == 0x0000);   // tie between 0 and 2^-24: even (0)
  CHECK(Half(std::ldexp(1.5f, -25)).bits == 0x0001);
  CHECK(Half(std::ldexp(3.0f, -25)).bits == 0x0002);   // 1.5 * 2^-24: tie, even is 2
  CHECK(Half(std::ldexp(1.0f, -14)).bits == 0x0400);   // smallest normal
  CHECK(Half(std::ldexp(1023.5f, -24)).bits == 0x0400);  // subnormal rounding carries into normal
  CHECK(Half(-0.0f).bits == 0x8000);
  CHECK(std::isnan(float(Half(bits_f(0x7F800001)))));
  CHECK(std::isinf(float(Half::from_bits(0x7C00))));
  for (uint32_t b = 0; b < 0x10000; ++b) {
    float f = float(Half::from_bits(uint16_t(b)));
    if (std::isnan(f)) continue;
    REQUIRE(Half(f).bits == b);
  }
  // every float16 value is exact in float32; the conversion of the bit pattern agrees with ldexp
  CHECK(float(Half::from_bits(0x0001)) == std::ldexp(1.0f, -24));
  CHECK(float(Half::from_bits(0x3555)) == 0.333251953125f);
}

TEST_CASE("float64 and int64 round once into bfloat16 and float16") {
  // Through float32 they rounded twice: a value just past a tie became the tie in float32, which
  // then went to even (the side the value is not on).
  CHECK(BFloat16(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30)).bits == BFloat16(1.0078125f).bits);
  CHECK(Half(65519.999).bits == 0x7BFF);  // below fp16's overflow threshold 65520 (float32: 65520, inf)
  CHECK(Half(65520.0).bits == 0x7C00);
  CHECK(float(BFloat16(int64_t(2147483648LL + 8388608 + 1))) == 2147483648.f + 16777216.f);
  CHECK(BFloat16(1e300).bits == 0x7F80);   // beyond float's range: inf, as rounding d itself gives
  CHECK(Half(-1e300).bits == 0xFC00);
  CHECK(std::isnan(float(BFloat16(std::nan("")))));
  CHECK(BFloat16(-0.0).bits == 0x8000);
  CHECK(Half(std::ldexp(1.0, -26)).bits == 0x0000);  // below half the smallest subnormal: 0
  CHECK(Half(std::ldexp(1.0, -25) + std::ldexp(1.0, -60)).bits == 0x0001);  // just past that tie
  // Every tie between neighbours, nudged either way by far less than float32 resolves: each goes
  // to its own side (before, all went to the even neighbour).
  Generator g(3);
  std::vector<double> u = values(rand({4000}, kFloat64, g));
  for (size_t i = 0; i < u.size(); ++i) {
    const uint16_t b = uint16_t(0x3800 + int(u[i] * 0x1000));  // positive normals in both formats
    const double lo16 = float(BFloat16::from_bits(b)), hi16 = float(BFloat16::from_bits(uint16_t(b + 1)));
    const double tie = (lo16 + hi16) / 2, nudge = (hi16 - lo16) * std::ldexp(1.0, -30);
    REQUIRE(BFloat16(tie + nudge).bits == b + 1);
    REQUIRE(BFloat16(tie - nudge).bits == b);
    const double lo = float(Half::from_bits(b)), hi = float(Half::from_bits(uint16_t(b + 1)));
    const double t = (lo + hi) / 2, n = (hi - lo) * std::ldexp(1.0, -30);
    REQUIRE(Half(t + n).bits == b + 1);
    REQUIRE(Half(t - n).bits == b);
  }
  // Tensors convert through the same constructors.
  Tensor x = Tensor::from_vector(std::vector<double>{65519.999, 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30)}, {2});
  CHECK(values(to(x, kFloat16))[0] == 65504.0);
  CHECK(values(to(x, kBFloat16))[1] == 1.0078125);
}

TEST_CASE("rand in bfloat16 and float16 stays at or above low and below high") {
  // A float32 draw just below high rounded up to high on store (0.2% of bfloat16 draws in [0, 1)),
  // and one just above a low the dtype does not hold rounded down below it (0.7, -0.3).
  for (DType dt : {kBFloat16, kFloat16}) {
    CAPTURE(dt);
    for (auto [low, high] :
         {std::pair<double, double>{0.0, 1.0}, {-2.0, 3.0}, {0.5, 0.75}, {0.7, 0.8}, {-0.3, 0.3}}) {
      Generator g(7);
      std::vector<double> v = values(rand({1 << 16}, dt, g, low, high));
      double top = -INFINITY, bottom = INFINITY;
      for (double x : v) {
        top = std::max(top, x);
        bottom = std::min(bottom, x);
      }
      CHECK(top < high);
      CHECK(bottom >= low);
      CHECK(top > low + 0.9 * (high - low));  // still spread over the range
    }
    Generator g(7);  // a range that holds no value of the dtype has nothing to draw
    CHECK_THROWS_MSG(rand({4}, dt, g, 0.7, 0.7001), ValueError, "[rand] [0.7, 0.7001) holds no", dtype_name(dt));
  }
}

TEST_CASE("low-precision tensors: creation, casts both ways, item, printing, names") {
  for (DType dt : {kBFloat16, kFloat16}) {
    INFO(dt);
    CHECK(dtype_size(dt) == 2);
    CHECK(is_floating(dt));
    Tensor z = Tensor::full({2, 3}, 1.5, dt);
    CHECK(z.dtype() == dt);
    CHECK(z.nbytes() == 12);
    CHECK(values(z) == std::vector<double>(6, 1.5));
    CHECK(values(Tensor::arange(4, dt)) == std::vector<double>{0, 1, 2, 3});
    CHECK(Tensor::scalar(0.1, dt).item() == double(float(dt == kBFloat16 ? float(BFloat16(0.1f))
                                                                          : float(Half(0.1f)))));
    // float32 -> low -> float32 rounds once; low -> float64 is exact
    Tensor x = t32({1.0f + 1.0f / 256, 3.0f, -0.0f, 1e-3f}, {4});
    Tensor l = to(x, dt);
    std::vector<double> back = values(to(l, kFloat64));
    CHECK(back[1] == 3.0);
    CHECK(std::signbit(back[2]));
    if (dt == kBFloat16) CHECK(back[0] == 1.0);
    else CHECK(back[0] == 1.0 + 1.0 / 256);
    // int64 and bool convert too
    CHECK(values(to(to(ti64({-3, 7}, {2}), dt), kInt64)) == std::vector<double>{-3, 7});
    CHECK(values(to(to(t32({0, 2}, {2}), dt), kBool)) == std::vector<double>{0, 1});
    std::ostringstream os;
    os << to(t32({1.5f, -2.0f}, {2}), dt);
    CHECK(os.str() == std::string("tensor([1.5, -2], shape=(2), dtype=") + dtype_name(dt) + ")");
    // data<T>() checks the dtype
    CHECK_THROWS_MSG(l.data<float>(), DTypeError, "[data]", dtype_name(dt), "float32");
  }
  CHECK(std::string(dtype_name(kBFloat16)) == "bfloat16");
  CHECK(std::string(dtype_name(kFloat16)) == "float16");
  // from_vector with the value types
  Tensor b = Tensor::from_vector(std::vector<BFloat16>{BFloat16(1.0f), BFloat16(-2.5f)}, {2});
  CHECK(b.dtype() == kBFloat16);
  CHECK(values(b) == std::vector<double>{1.0, -2.5});
}

TEST_CASE("low-precision casts are differentiable and gradients come back in the input's dtype") {
  Tensor x = t32({1, 2, 3}, {3});
  x.set_requires_grad(true);
  Tensor y = sum(mul(to(x, kBFloat16), 2.0));
  CHECK(y.dtype() == kBFloat16);
  y.backward();
  CHECK(x.grad().dtype() == kFloat32);
  CHECK(values(x.grad()) == std::vector<double>{2, 2, 2});
}

TEST_CASE("dtype promotion follows PyTorch among floating dtypes") {
  CHECK(promote_types(kBFloat16, kFloat16) == kFloat32);
  CHECK(promote_types(kBFloat16, kFloat32) == kFloat32);
  CHECK(promote_types(kFloat16, kFloat64) == kFloat64);
  CHECK(promote_types(kFloat32, kFloat64) == kFloat64);
  CHECK(promote_types(kInt64, kBFloat16) == kBFloat16);
  CHECK(promote_types(kBool, kInt64) == kInt64);
  Tensor a = to(t32({1, 2}, {2}), kBFloat16), h = to(t32({0.5, 0.25}, {2}), kFloat16);
  Tensor s = add(a, h);
  CHECK(s.dtype() == kFloat32);
  CHECK(values(s) == std::vector<double>{1.5, 2.25});
  CHECK(mul(t32({2}, {1}), t64({3}, {1})).dtype() == kFloat64);
  CHECK(lt(a, h).dtype() == kBool);
  CHECK(where(gt(a, 1.5), a, t32({9, 9}, {2})).dtype() == kFloat32);
  // gradients return in each input's dtype
  Tensor x = to(t32({1, 2}, {2}), kBFloat16).set_requires_grad(true);
  Tensor w = t64({3, 4}, {2}).set_requires_grad(true);
  sum(mul(x, w)).backward();
  CHECK(x.grad().dtype() == kBFloat16);
  CHECK(w.grad().dtype() == kFloat64);
  CHECK(values(x.grad()) == std::vector<double>{3, 4});
  // int64 never mixes with floats implicitly (the int64 rule)
  CHECK_THROWS_MSG(add(a, ti64({1, 2}, {2})), DTypeError, "[add]", "bfloat16", "int64");
}

TEST_CASE("safetensors reads and writes BF16 and F16 bit-exactly") {
  TempDir tmp;
  std::string path = tmp.file("low.safetensors");
  Tensor b = to(t32({1.0f + 1.0f / 128, -3.5f, 1e30f, 0}, {2, 2}), kBFloat16);
  Tensor h = to(t32({65504, -1e-7f, 0.1f}, {3}), kFloat16);
  Tensor ht = transpose(to(t32({1, 2, 3, 4, 5, 6}, {2, 3}), kFloat16), 0, 1);  // non-contiguous
  save_safetensors(path, {{"b", b}, {"h", h}, {"ht", ht}});
  SafetensorsFile f = load_safetensors(path);
  REQUIRE(f.find("b"));
  CHECK(f.find("b")->dtype() == kBFloat16);
  CHECK(f.find("h")->dtype() == kFloat16);
  CHECK(std::memcmp(f.find("b")->raw_data(), b.raw_data(), 8) == 0);
  CHECK(std::memcmp(f.find("h")->raw_data(), h.raw_data(), 6) == 0);
  CHECK(values(*f.find("ht")) == values(ht));
  CHECK(std::string(safetensors_dtype_name(kBFloat16)) == "BF16");
  CHECK(std::string(safetensors_dtype_name(kFloat16)) == "F16");
}

TEST_CASE("low-precision parity R1: elementwise, comparisons, where, casts are float32 rounded once") {
  for (DType dt : {kBFloat16, kFloat16}) {
    Pair x = pair(dt, {5, 7}, 1), y = pair(dt, {5, 7}, 2), p = pair(dt, {5, 7}, 3, 0.1, 3);
    Pair row = pair(dt, {7}, 4);
    using U = Tensor (*)(const Tensor&);
    std::vector<std::pair<const char*, U>> unary = {
        {"neg", neg}, {"abs", abs}, {"square", square}, {"exp", exp}, {"sin", sin}, {"cos", cos},
        {"tanh", tanh}, {"sigmoid", sigmoid}, {"relu", relu}, {"gelu", gelu}, {"erf", erf}, {"sign", sign}};
    for (auto& [name, f] : unary) check_r1(f(x.low), f(x.ref), name);
    check_r1(log(p.low), log(p.ref), "log");
    check_r1(sqrt(p.low), sqrt(p.ref), "sqrt");
    check_r1(rsqrt(p.low), rsqrt(p.ref), "rsqrt");
    check_r1(reciprocal(p.low), reciprocal(p.ref), "reciprocal");
    check_r1(pow(p.low, 2.5), pow(p.ref, 2.5), "pow scalar");
    check_r1(clamp(x.low, -0.5, 0.7), clamp(x.ref, -0.5, 0.7), "clamp");
    check_r1(leaky_relu(x.low, 0.01), leaky_relu(x.ref, 0.01), "leaky_relu");
    check_r1(add(x.low, y.low), add(x.ref, y.ref), "add");
    check_r1(sub(x.low, row.low), sub(x.ref, row.ref), "sub broadcast");
    check_r1(mul(x.low, y.low), mul(x.ref, y.ref), "mul");
    check_r1(div(x.low, p.low), div(x.ref, p.ref), "div");
    check_r1(pow(p.low, y.low), pow(p.ref, y.ref), "pow");
    check_r1(maximum(x.low, y.low), maximum(x.ref, y.ref), "maximum");
    check_r1(minimum(x.low, y.low), minimum(x.ref, y.ref), "minimum");
    check_r1(lt(x.low, y.low), lt(x.ref, y.ref), "lt");
    check_r1(eq(x.low, x.low), eq(x.ref, x.ref), "eq");
    check_r1(where(gt(x.low, 0.0), x.low, y.low), where(gt(x.ref, 0.0), x.ref, y.ref), "where");
    check_r1(transpose(x.low, 0, 1), transpose(x.ref, 0, 1), "transpose");
    check_r1(contiguous(transpose(x.low, 0, 1)), contiguous(transpose(x.ref, 0, 1)), "contiguous");
    Generator g1(5), g2(5);  // the same mask; the keep-scale 1/(1-p) is applied in float32
    check_r1(dropout(x.low, 0.3, true, g1), dropout(x.ref, 0.3, true, g2), "dropout");
    Generator g3(6), g4(6);
    check_r1(randn({4, 5}, dt, g3), randn({4, 5}, kFloat32, g4), "randn");
  }
}

TEST_CASE("low-precision parity R1: reductions, softmax, index, shape and sort ops") {
  for (DType dt : {kBFloat16, kFloat16}) {
    Pair x = pair(dt, {4, 6, 5}, 11), y = pair(dt, {4, 6, 5}, 12);
    check_r1(sum(x.low), sum(x.ref), "sum all");
    check_r1(sum(x.low, {1}), sum(x.ref, {1}), "sum axis 1");
    check_r1(mean(x.low, {0, 2}), mean(x.ref, {0, 2}), "mean");
    check_r1(var(x.low, {2}), var(x.ref, {2}), "var");
    check_r1(logsumexp(x.low, {2}), logsumexp(x.ref, {2}), "logsumexp");
    check_r1(amax(x.low, {1}), amax(x.ref, {1}), "amax");
    check_r1(amin(x.low, {2}), amin(x.ref, {2}), "amin");
    check_r1(argmax(x.low, 2), argmax(x.ref, 2), "argmax");
    check_r1(softmax(x.low, -1), softmax(x.ref, -1), "softmax");
    check_r1(softmax(x.low, 1), softmax(x.ref, 1), "softmax strided axis");
    check_r1(log_softmax(x.low, -1), log_softmax(x.ref, -1), "log_softmax");
    Tensor idx = ti64({0, 2, 2, 1, 0, 4}, {6});
    check_r1(index_select(x.low, 2, idx), index_select(x.ref, 2, idx), "index_select");
    Tensor gi = ti64(std::vector<int64_t>(4 * 6 * 2, 3), {4, 6, 2});
    check_r1(gather(x.low, 2, gi), gather(x.ref, 2, gi), "gather");
    check_r1(take_along_dim(x.low, gi, 2), take_along_dim(x.ref, gi, 2), "take_along_dim");
    check_r1(scatter_add(x.low, 2, gi, slice(y.low, 2, 0, 2)),
             scatter_add(x.ref, 2, gi, slice(y.ref, 2, 0, 2)), "scatter_add");
    Tensor mask = gt(x.ref, 0.5);
    check_r1(masked_fill(x.low, mask, -1e4), masked_fill(x.ref, mask, -1e4), "masked_fill");
    check_r1(one_hot(ti64({2, 0}, {2}), 3, dt), one_hot(ti64({2, 0}, {2}), 3, kFloat32), "one_hot");
    check_r1(cat({x.low, y.low}, 1), cat({x.ref, y.ref}, 1), "cat");
    check_r1(stack({x.low, y.low}, 0), stack({x.ref, y.ref}, 0), "stack");
    check_r1(pad(x.low, {1, 2}, 0.5), pad(x.ref, {1, 2}, 0.5), "pad");
    check_r1(permute(x.low, {2, 0, 1}), permute(x.ref, {2, 0, 1}), "permute");
    check_r1(reshape(x.low, {24, 5}), reshape(x.ref, {24, 5}), "reshape");
    check_r1(expand(slice(x.low, 0, 0, 1), {3, 6, 5}), expand(slice(x.ref, 0, 0, 1), {3, 6, 5}), "expand");
    auto sl = sort(x.low, 2), sr = sort(x.ref, 2);
    check_r1(sl.values, sr.values, "sort values");
    check_r1(sl.indices, sr.indices, "sort indices");
    auto tl = topk(x.low, 3, 1), tr = topk(x.ref, 3, 1);
    check_r1(tl.values, tr.values, "topk values");
    check_r1(tl.indices, tr.indices, "topk indices");
    check_r1(argsort(x.low, 0, true), argsort(x.ref, 0, true), "argsort");
  }
}

TEST_CASE("low-precision parity R2/R3: matmul, layer_norm, cross_entropy and gradients") {
  for (DType dt : {kBFloat16, kFloat16}) {
    const double u = unit_roundoff(dt);
    Pair a = pair(dt, {3, 17, 33}, 21), b = pair(dt, {3, 33, 9}, 22);
    Tensor y = matmul(a.low, b.low);
    CHECK(y.dtype() == dt);
    Tensor ref = matmul(a.ref, b.ref);
    Tensor mag = matmul(abs(a.ref), abs(b.ref));
    std::vector<double> yv = values(y), rv = values(ref), mv = values(mag);
    for (size_t i = 0; i < yv.size(); ++i)
      REQUIRE_MESSAGE(std::fabs(yv[i] - rv[i]) <= u * std::fabs(rv[i]) + std::ldexp(mv[i], -20),
                      "matmul element ", i, ": ", yv[i], " vs ", rv[i]);
    // transposed operands take the converting path too
    check_r3(matmul(transpose(a.low, 1, 2), a.low), matmul(transpose(a.ref, 1, 2), a.ref), u,
             "matmul transposed");

    Pair x = pair(dt, {6, 16}, 23), w = pair(dt, {16}, 24, 0.5, 1.5), bias = pair(dt, {16}, 25);
    check_r3(layer_norm(x.low, {16}, w.low, bias.low), layer_norm(x.ref, {16}, w.ref, bias.ref), u,
             "layer_norm");
    Tensor tgt = ti64({0, 3, 15, 7, 7, 1}, {6});
    check_r3(cross_entropy(x.low, tgt), cross_entropy(x.ref, tgt), u, "cross_entropy");

    // gradients: L = sum(v * f(inputs)) in the storage type vs float32 on the same values
    Pair v = pair(dt, {6, 16}, 26);
    auto grads = [&](const Tensor& xin, const Tensor& win, const Tensor& vin, int which) {
      Tensor xl = xin.detach().set_requires_grad(true), wl = win.detach().set_requires_grad(true);
      Tensor out;
      if (which == 0) out = softmax(xl, -1);
      if (which == 1) out = layer_norm(xl, {16}, wl);
      if (which == 2) out = matmul(xl, transpose(reshape(wl, {1, 16}), 0, 1));
      if (which == 3) out = gelu(mul(xl, wl));
      Tensor vv = which == 2 ? slice(vin, 1, 0, 1) : vin;
      sum(mul(vv, out)).backward();
      return std::make_pair(xl.grad(), wl.grad());
    };
    const char* names[] = {"softmax backward", "layer_norm backward", "matmul backward", "gelu*mul backward"};
    for (int which = 0; which < 4; ++which) {
      auto gl = grads(x.low, w.low, v.low, which), gr = grads(x.ref, w.ref, v.ref, which);
      CHECK(gl.first.dtype() == dt);
      check_r3(gl.first, gr.first, u, names[which]);
      if (which != 0) check_r3(gl.second, gr.second, u, names[which]);
    }
  }
}

TEST_CASE("16-bit matmul's converting path is sgemm's product of the widened operands, rounded once, on every layout") {
  // float16's only CPU path and bfloat16's where AMX and vdpbf16ps are off: the operands are widened row by
  // row as stored (a transposed operand stays transposed for sgemm) and C is rounded by the row tier, so
  // the result equals the float32 matmul of the same values in the same layout, rounded once (rule R1).
  // Values include float16's subnormals, numbers that overflow it in the sum, inf and NaN.
  struct Restore {
    ~Restore() {
      kernels::set_bf16_amx_enabled(true);
      kernels::reset_bf16_dot_enabled();
    }
  } restore;
  kernels::set_bf16_amx_enabled(false);
  kernels::set_bf16_dot_enabled(false);
  struct Case {
    Shape a, b;
    bool ta, tb;
  };
  const std::vector<Case> cases = {{{5, 37}, {37, 70}, false, false}, {{1, 1}, {1, 1}, false, false},
                                   {{6, 31}, {31, 65}, true, false},  {{4, 20}, {20, 9}, false, true},
                                   {{3, 7, 33}, {3, 33, 18}, true, true}, {{2, 130, 3}, {3, 129}, false, true},
                                   {{1, 40}, {40, 1}, true, true},     {{64, 96}, {96, 80}, false, false}};
  for (DType dt : {kBFloat16, kFloat16}) {
    Generator g(31);
    for (const Case& c : cases) {
      INFO(std::string(dtype_name(dt)), " ", shape_str(c.a), " @ ", shape_str(c.b), " transposed ", c.ta, c.tb);
      Tensor a = to(rand(c.a, kFloat32, g, -3, 3), dt), b = to(rand(c.b, kFloat32, g, -3, 3), dt);
      if (dt == kFloat16) {  // a subnormal, a large value (inf in float16 after the sum), inf, NaN
        std::vector<double> av = values(a);
        av[0] = 3e-6;
        if (av.size() > 3) {
          av[1] = 60000;
          av[2] = INFINITY;
          av[3] = NAN;
        }
        a = to(Tensor::from_vector(av, c.a), dt);
      }
      auto layout = [](const Tensor& x, bool t) { return t ? transpose(contiguous(transpose(x, -1, -2)), -1, -2) : x; };
      a = layout(a, c.ta);
      b = layout(b, c.tb);
      check_r1(matmul(a, b), matmul(layout(to(a, kFloat32), c.ta), layout(to(b, kFloat32), c.tb)), "matmul");
      // a row-strided operand (leading dimension beyond its columns)
      Tensor wide = to(rand({c.b[c.b.size() - 2], c.b.back() + 3}, kFloat32, g, -1, 1), dt);
      Tensor bs = slice(wide, 1, 0, c.b.back());
      check_r1(matmul(contiguous(a), bs), matmul(to(contiguous(a), kFloat32), slice(to(wide, kFloat32), 1, 0, c.b.back())),
               "matmul, strided b");
    }
  }
}

TEST_CASE("a large 16-bit product lets go of its float32 blocks after the call (kernels/common/scratch.h)") {
#if defined(__SANITIZE_ADDRESS__) || !defined(__GLIBC__)
  MESSAGE("glibc's mallinfo2 does not see this allocator: not checked in this build");
#else
  // The converting path's per-thread blocks were kept for the thread's lifetime, whatever their size: A's float32
  // copy here is 80 MB (above the 64 MB kept), mapped by glibc on its own, so the mapped bytes show it.
  test::NumThreadsGuard one(1);  // the product runs on this thread
  Generator g(5);
  const Tensor a = to(rand({10000, 2000}, kFloat32, g, -1, 1), kFloat16), b = to(rand({2000, 8}, kFloat32, g, -1, 1), kFloat16);
  const size_t before = mallinfo2().hblkhd;
  const Tensor c = matmul(a, b);
  const size_t after = mallinfo2().hblkhd;
  CHECK(c.shape() == Shape({10000, 8}));
  CHECK_MESSAGE(after < before + (size_t(8) << 20), "mapped bytes grew from ", before, " to ", after);
  // A block within the limit is kept, at its size: A's float32 block of 36 MB, then one of 64 MB (growing from
  // 36 doubled the capacity to 72 MB, past the limit: that block was freed after every call of such a pair).
  const Tensor b8 = to(rand({4096, 8}, kFloat32, g, -1, 1), kFloat16);
  const Tensor mid = to(rand({2304, 4096}, kFloat32, g, -1, 1), kFloat16), big = to(rand({4096, 4096}, kFloat32, g, -1, 1), kFloat16);
  const size_t start = mallinfo2().hblkhd;
  (void)matmul(mid, b8);
  (void)matmul(big, b8);
  const size_t kept = mallinfo2().hblkhd;
  CHECK_MESSAGE(kept >= start + (size_t(60) << 20), "mapped bytes ", start, " then ", kept, ": the 64 MB block went");
  (void)matmul(big, b8);
  CHECK_MESSAGE(mallinfo2().hblkhd == kept, "mapped bytes ", kept, " then ", mallinfo2().hblkhd);
#endif
}

TEST_CASE("low-precision bad input names the dtypes") {
  Tensor b = Tensor::zeros({2, 2}, kBFloat16);
  CHECK_THROWS_MSG(matmul(b, Tensor::zeros({2, 2}, kFloat16)), DTypeError, "[matmul]", "bfloat16", "float16");
  CHECK_THROWS_MSG(exp(ti64({1}, {1})), DTypeError, "[exp]", "bfloat16");
}
