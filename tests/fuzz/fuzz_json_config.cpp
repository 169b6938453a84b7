// libFuzzer target: JSON config files, both readers: nn::load_json_file with the
// typed nn::Config getters, and the apps' option table (apps/common/options.h,
// whose errors are UsageErrors, the apps' cf::Error-like exception).
#include <vector>

#include "common/options.h"
#include "fuzz_util.h"
#include "nn/config.h"

namespace {
template <typename T>
void try_get(cf::nn::Config& c, const char* key) {
  try {
    (void)c.get<T>(key, T{});
  } catch (const cf::Error&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cf::fuzz::MemFile f(data, size);
  cf::fuzz::expect_cf_errors_only([&] {
    cf::nn::Config c = cf::nn::Config::from_file(f.path());
    try_get<int64_t>(c, "k");
    try_get<int>(c, "steps");
    try_get<uint64_t>(c, "seed");
    try_get<double>(c, "lr");
    try_get<float>(c, "scale");
    try_get<bool>(c, "causal");
    try_get<std::string>(c, "type");
    try_get<std::vector<int64_t>>(c, "shape");
    try_get<std::vector<double>>(c, "betas");
    try_get<std::vector<std::string>>(c, "attentions");
    if (c.has("model")) {
      try {
        cf::nn::Config m = c.child("model");
        try_get<int64_t>(m, "d_model");
      } catch (const cf::Error&) {
      }
    }
  });
  // The apps' reader: every kind of option once.
  int64_t k = 0;
  double lr = 0;
  std::string s;
  bool b = false;
  std::vector<int64_t> ints, seeds;
  std::vector<std::string> strings;
  cf::apps::Options o;
  o.add_int("k", &k, 1, "an integer");
  o.add_number("lr", &lr, "a number");
  o.add_string("type", &s, "a string");
  o.add_bool("causal", &b, "a boolean");
  o.add_int_list("shape", &ints, 1, "an integer list");
  o.add_string_list("attentions", &strings, "a string list");
  o.add_seeds(&seeds);
  try {
    o.apply_file(f.path());
  } catch (const cf::apps::UsageError&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cf-fuzz: Options::apply_file let through: %s\n", e.what());
    std::abort();
  }
  return 0;
}
