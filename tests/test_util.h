#pragma once
// Shared test helpers: value comparison, error-message checks and the gradcheck
// case registry that the op-coverage test reads.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cf.h"

namespace cf::test {

// Every op name a GRADCHECK test exercised (filled as the cases register).
inline std::set<std::string>& gradcheck_cases() {
  static std::set<std::string> s;
  return s;
}
struct GradcheckCaseRegistrar {
  explicit GradcheckCaseRegistrar(const char* op) { gradcheck_cases().insert(op); }
};
// How many gradchecks of each op ran and passed in this process (check_grad counts them): a GRADCHECK_CASE
// whose body checks no gradient of its own op fails (the registry test counts registered cases only).
inline std::map<std::string, int64_t>& gradchecks_passed() {
  static std::map<std::string, int64_t> m;
  return m;
}

// Whether y's graph holds a node named `name`.
inline bool graph_has(const Tensor& y, const char* name) {
  for (const char* n : autograd::graph_node_names(y))
    if (std::string(n) == name) return true;
  return false;
}

// Run cf::gradcheck and also prove the graph really contains a node named `op`.
inline void check_grad(const char* op, const GradcheckFn& f, const std::vector<Tensor>& inputs,
                       const GradcheckOptions& opt = {}) {
  INFO("op: ", std::string(op));
  const bool has_op = graph_has(f(inputs), op);
  CHECK_MESSAGE(has_op, "the graph of the gradcheck function has no node named ", op);
  GradcheckResult r = gradcheck(f, inputs, opt);
  CHECK_MESSAGE(r.ok, r.message);
  CHECK(r.entries_checked > 0);
  if (has_op && r.ok && r.entries_checked > 0) ++gradchecks_passed()[op];
}

// float64 leaf of the given shape with distinct values (seeded), requiring grad.
// cf::set_num_threads(n) while alive; the count before (set or OpenMP's) is back after.
class NumThreadsGuard {
 public:
  explicit NumThreadsGuard(int n) : before_(num_threads_is_set() ? get_num_threads() : 0) { set_num_threads(n); }
  ~NumThreadsGuard() { set_num_threads(before_); }
  NumThreadsGuard(const NumThreadsGuard&) = delete;
  NumThreadsGuard& operator=(const NumThreadsGuard&) = delete;

 private:
  int before_;
};

inline Tensor leaf64(const Shape& shape, uint64_t seed = 1, double low = -1.0, double high = 1.0) {
  Generator g(seed);
  Tensor t = rand(shape, kFloat64, g, low, high);
  t.set_requires_grad(true);
  return t;
}

inline Tensor t64(const std::vector<double>& v, const Shape& s) { return Tensor::from_vector(v, s); }
inline Tensor t32(const std::vector<float>& v, const Shape& s) { return Tensor::from_vector(v, s); }
inline Tensor ti64(const std::vector<int64_t>& v, const Shape& s) { return Tensor::from_vector(v, s); }

// Values of any float tensor as doubles.
inline std::vector<double> values(const Tensor& t) {
  if (t.dtype() == kFloat64) return t.to_vector<double>();
  if (is_low_precision(t.dtype())) {  // exact: every bfloat16/float16 value is a float32
    NoGradGuard ng;
    return values(to(t.detach(), kFloat32));
  }
  if (t.dtype() == kFloat32) {
    auto v = t.to_vector<float>();
    return std::vector<double>(v.begin(), v.end());
  }
  if (t.dtype() == kInt64) {
    auto v = t.to_vector<int64_t>();
    return std::vector<double>(v.begin(), v.end());
  }
  std::vector<double> out;
  for (bool b : t.to_vector<bool>()) out.push_back(b ? 1.0 : 0.0);
  return out;
}

// The largest |a - b| over two results of one shape (equal entries, -inf against -inf too, count 0;
// a NaN on either side counts infinity, so no NaN passes a bound).
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = values(a), y = values(b);
  REQUIRE(x.size() == y.size());
  double m = 0.0;
  for (size_t e = 0; e < x.size(); ++e) {
    if (std::isnan(x[e]) || std::isnan(y[e])) return std::numeric_limits<double>::infinity();
    if (x[e] != y[e]) m = std::max(m, std::abs(x[e] - y[e]));
  }
  return m;
}

// Elementwise |a - b| <= tol (NaN equals NaN), with a readable failure message.
inline void check_close(const Tensor& actual, const std::vector<double>& expected, double tol = 1e-6) {
  std::vector<double> a = values(actual);
  REQUIRE_MESSAGE(a.size() == expected.size(), "size ", a.size(), " vs expected ", expected.size());
  for (size_t i = 0; i < a.size(); ++i) {
    bool both_nan = std::isnan(a[i]) && std::isnan(expected[i]);
    bool same_inf = std::isinf(a[i]) && a[i] == expected[i];
    if (!both_nan && !same_inf && !(std::fabs(a[i] - expected[i]) <= tol))
      FAIL_CHECK("element ", i, ": got ", a[i], ", expected ", expected[i]);
  }
}
inline void check_close(const Tensor& actual, const Tensor& expected, double tol = 1e-6) {
  CHECK_MESSAGE(actual.shape() == expected.shape(), shape_str(actual.shape()), " vs ",
                shape_str(expected.shape()));
  check_close(actual, values(expected), tol);
}

// The same values as a tensor of dtype dt (integer-valued data stays exact in every dtype).
inline Tensor make(DType dt, const std::vector<double>& v, const Shape& s) {
  if (dt == kFloat64) return t64(v, s);
  if (dt == kFloat32) return t32(std::vector<float>(v.begin(), v.end()), s);
  std::vector<int64_t> iv;
  for (double e : v) iv.push_back(int64_t(e));
  return ti64(iv, s);
}

// One logical tensor in three layouts: contiguous, transposed-layout and a step-2
// slice of a larger tensor (the last two non-contiguous), so kernels see strides.
inline std::vector<Tensor> layouts(const Tensor& base) {
  std::vector<Tensor> out{base};
  int64_t last = base.dim() - 1;
  if (base.dim() >= 2) out.push_back(transpose(contiguous(transpose(base, 0, last)), 0, last));
  if (base.dim() >= 1 && base.size(last) > 1) {
    Shape big = base.shape();
    big[size_t(last)] *= 2;
    Tensor b = Tensor::zeros(big, base.dtype());
    Tensor v = slice(b, last, 0, big[size_t(last)], 2);
    copy_(v, base);
    out.push_back(v);
  }
  for (size_t i = 1; i < out.size(); ++i) REQUIRE_FALSE(out[i].is_contiguous());
  return out;
}

// Block attention's inputs (autograd/ops/attention.h): a bool (B, N) key padding mask with
// the last `padded_in_last` keys of the last batch row padded, and members (B, Hm, C, w) from
// a random permutation of N per (b, hm), with `holes` tokens left out (in no slot) and the
// last chunk's tail empty.
inline Tensor padding_mask(int64_t B, int64_t N, int64_t padded_in_last) {
  std::vector<bool> m(size_t(B * N), false);
  for (int64_t j = N - padded_in_last; j < N; ++j) m[size_t((B - 1) * N + j)] = true;
  return Tensor::from_vector(m, {B, N});
}
inline Tensor random_members(int64_t B, int64_t Hm, int64_t N, int64_t w, int64_t holes, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t kept = N - holes, C = (kept + w - 1) / w;
  std::vector<int64_t> m;
  for (int64_t bh = 0; bh < B * Hm; ++bh) {
    std::vector<int64_t> perm(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) perm[size_t(i)] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t s = 0; s < C * w; ++s) m.push_back(s < kept ? perm[size_t(s)] : -1);
  }
  return Tensor::from_vector(m, {B, Hm, C, w});
}

// A tensor that claims to live on CUDA (no storage): lets tests check the
// device validation every op does before touching data, in any build.
inline Tensor fake_cuda(const Shape& shape, DType dtype = kFloat32) {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = Device::cuda(0);
  return Tensor(impl);
}

}  // namespace cf::test

// Test tiers: a learning test (one that trains a model and checks what it
// learned) that takes over about 10 s in Release, or over about 5 s under the
// sanitizers, is declared TEST_CASE("..." * CF_SLOW). CTest labels it `slow`
// (tests/slow_labels.cmake); the Release stage of scripts/test.sh runs it, the
// sanitizer stage runs `ctest -LE slow` (the learning tests there repeat what the
// unit cases check, at up to 6x their Release time: the encoder classifier 4.7 s
// in Release, 30.6 s under ASan + UBSan).
#define CF_SLOW doctest::test_suite("slow")

namespace cf::test {
// The seed of a learning test: `fallback` unless CF_TEST_SEED is set, so that a
// test's margin can be checked over many seeds (bits differ between machines:
// OpenBLAS picks other kernels on other CPUs), e.g.
//   for s in 1 2 3 4 5 6 7 8; do CF_TEST_SEED=$s build/tests/cf_tests -tc="long-range*"; done
inline uint64_t test_seed(uint64_t fallback) {
  const char* s = std::getenv("CF_TEST_SEED");
  return s && *s ? std::strtoull(s, nullptr, 10) : fallback;
}
}  // namespace cf::test

// Register a gradcheck test case for the op `op` (an identifier of
// autograd/op_names.h: a name the registry lacks does not compile).
#define CF_GRADCHECK_CONCAT2(a, b) a##b
#define CF_GRADCHECK_CONCAT(a, b) CF_GRADCHECK_CONCAT2(a, b)
// The body runs inside a test case that then requires at least one passing check_grad of that op.
#define GRADCHECK_CASE(op)                                                                                  \
  static ::cf::test::GradcheckCaseRegistrar CF_GRADCHECK_CONCAT(cf_gc_reg_, __LINE__)(::cf::opname::op); \
  static void CF_GRADCHECK_CONCAT(cf_gc_body_, __LINE__)();                                                 \
  TEST_CASE("gradcheck " #op) {                                                                             \
    const int64_t before = ::cf::test::gradchecks_passed()[::cf::opname::op];                               \
    CF_GRADCHECK_CONCAT(cf_gc_body_, __LINE__)();                                                           \
    CHECK_MESSAGE(::cf::test::gradchecks_passed()[::cf::opname::op] > before,                               \
                  "the gradcheck case of " #op " passed no check_grad(\"" #op "\", ...)");                  \
  }                                                                                                          \
  static void CF_GRADCHECK_CONCAT(cf_gc_body_, __LINE__)()

// Check that expr throws ErrType and that its message contains every fragment.
#define CHECK_THROWS_MSG(expr, ErrType, ...)                                                    \
  do {                                                                                          \
    bool cf_thrown_ = false;                                                                    \
    try {                                                                                       \
      (void)(expr);                                                                             \
    } catch (const ErrType& e) {                                                                \
      cf_thrown_ = true;                                                                        \
      std::string cf_msg_ = e.what();                                                           \
      for (const char* frag : {__VA_ARGS__})                                                    \
        CHECK_MESSAGE(cf_msg_.find(frag) != std::string::npos, "message '", cf_msg_,           \
                      "' lacks '", frag, "'");                                                  \
    }                                                                                           \
    CHECK_MESSAGE(cf_thrown_, #expr " did not throw " #ErrType);                                \
  } while (0)
