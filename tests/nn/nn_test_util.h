#pragma once
// Gradient checks of whole modules: the module's parameters join the inputs of
// cf::gradcheck, and each evaluation installs the (perturbed) values with
// Module::set_parameters.
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cf.h"
#include "test_util.h"

namespace cf::test {

// f(xs) computes the module's output from the non-parameter inputs xs. The module
// must already be float64 (module.to(kFloat64)) and in eval mode if it has dropout.
inline void check_module_grad(nn::Module& m, const std::function<Tensor(const std::vector<Tensor>&)>& f,
                              const std::vector<Tensor>& xs, const GradcheckOptions& opt = {}) {
  std::vector<Tensor> params = m.parameters();
  std::vector<Tensor> inputs = xs;
  inputs.insert(inputs.end(), params.begin(), params.end());
  const size_t nx = xs.size();
  auto g = [&](const std::vector<Tensor>& all) {
    m.set_parameters(std::vector<Tensor>(all.begin() + long(nx), all.end()));
    return f(std::vector<Tensor>(all.begin(), all.begin() + long(nx)));
  };
  GradcheckResult r = gradcheck(g, inputs, opt);
  m.set_parameters(params);
  CHECK_MESSAGE(r.ok, r.message);
  CHECK(r.entries_checked > 0);
}

// Attention arguments with one padding mask for the keys and the queries (undefined: none).
inline nn::AttentionArgs attention_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm = {},
                                        bool causal = false, nn::AuxLosses* aux = nullptr) {
  nn::AttentionArgs a;
  a.q = q;
  a.k = k;
  a.v = v;
  a.key_padding_mask = kpm;
  a.query_padding_mask = kpm;
  a.causal = causal;
  a.aux = aux;
  return a;
}

// The spec of a registered variant with options that suit the small inputs of the tests (N >= 16: 4 clusters,
// buckets, chunks or blocks; fixed seeds for the variants that draw).
inline nn::AttentionSpec small_attention_spec(const std::string& type, int64_t d_model, int64_t n_heads) {
  static const std::map<std::string, nlohmann::json> options = {
      {"lsh", {{"seed", 0}, {"bucket_size", 4}, {"n_hashes", 2}}},
      {"routing", {{"n_clusters", 4}, {"seed", 0}}},
      {"cluster-former", {{"chunk_size", 4}, {"num_clusters", 4}}},
      {"neural-clustering", {{"clusters", 4}}},
      {"clustered", {{"clusters", 4}, {"hash_seed", 7}}},
      {"improved-clustered", {{"clusters", 4}, {"topk", 4}, {"hash_seed", 7}}},
      {"sparse", {{"block_size", 4}, {"summary", 1}}}};
  nn::AttentionSpec spec;
  spec.type = type;
  spec.d_model = d_model;
  spec.n_heads = n_heads;
  auto o = options.find(type);
  if (o != options.end()) spec.options = nn::Config(o->second, "attention");
  return spec;
}

// A (B, N) key padding mask, true at the (batch, position) pairs listed.
inline Tensor pad_mask(int64_t B, int64_t N, const std::vector<std::pair<int64_t, int64_t>>& padded) {
  std::vector<bool> m(size_t(B * N), false);
  for (auto& p : padded) m[size_t(p.first * N + p.second)] = true;
  return Tensor::from_vector(m, {B, N});
}

// The rows (b, h, i) of a (B, H, N, D) tensor whose token is not padding, flattened:
// attention variants are compared on these (padded queries' rows follow each
// variant's own rule).
inline std::vector<double> real_rows(const Tensor& t, const Tensor& kpm) {
  const Shape& s = t.shape();
  auto v = values(t);
  std::vector<bool> pad(size_t(s[0] * s[2]), false);
  if (kpm.defined()) pad = kpm.to_vector<bool>();
  std::vector<double> out;
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t h = 0; h < s[1]; ++h)
      for (int64_t i = 0; i < s[2]; ++i)
        if (!pad[size_t(b * s[2] + i)])
          for (int64_t d = 0; d < s[3]; ++d) out.push_back(v[size_t(((b * s[1] + h) * s[2] + i) * s[3] + d)]);
  return out;
}

// Element-wise |a - b| <= tol, each failure reported with its index.
inline void check_vec_close(const std::vector<double>& a, const std::vector<double>& b, double tol) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(a[i] - b[i]) <= tol)) FAIL_CHECK("element ", i, ": ", a[i], " vs ", b[i]);
}

}  // namespace cf::test
