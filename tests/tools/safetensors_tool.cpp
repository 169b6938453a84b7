// Helper for tests/python/safetensors_interop.py:
//   cf_safetensors_tool write <path>          write the reference tensors (creator "cf")
//   cf_safetensors_tool check <path> <creator> read a file and check it holds exactly
//                                              the reference tensors and metadata
// The reference values are spelled out identically in the Python script.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "autograd/ops/shape.h"
#include "core/serialization.h"

using namespace cf;

namespace {

const char* kNote = "caf\xc3\xa9 \xe2\x9c\x93";  // "café ✓" in UTF-8

std::vector<std::pair<std::string, Tensor>> reference() {
  std::vector<float> a(6);
  for (int i = 0; i < 6; ++i) a[size_t(i)] = float((i - 2.5) * 0.375);
  std::vector<double> b(6);
  for (int i = 0; i < 6; ++i) b[size_t(i)] = double(i) * 0.1 - 0.7;
  std::vector<float> special = {std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN(), -0.0f,
                                std::numeric_limits<float>::denorm_min(),
                                std::numeric_limits<float>::max()};
  return {
      {"a_f32", Tensor::from_vector(a, {2, 3})},
      {"b_f64", Tensor::from_vector(b, {3, 2})},
      {"c_i64", Tensor::from_vector(std::vector<int64_t>{0, -1, int64_t(1) << 62,
                                                         std::numeric_limits<int64_t>::min()},
                                    {4})},
      {"d_bool", Tensor::from_vector(std::vector<bool>{true, false, false, true}, {2, 2})},
      {"e_scalar", Tensor::scalar(3.141592653589793, kFloat64)},
      {"f_empty", Tensor::zeros({0, 3}, kFloat32)},
      {"g_special", Tensor::from_vector(special, {6})},
  };
}

int check(const std::string& path, const std::string& creator) {
  SafetensorsFile f = load_safetensors(path);
  int bad = 0;
  auto ref = reference();
  if (f.tensors.size() != ref.size() + (creator == "cf" ? 1 : 0)) {
    std::printf("expected %zu tensors, file has %zu\n", ref.size(), f.tensors.size());
    ++bad;
  }
  for (const auto& e : ref) {
    const Tensor* t = f.find(e.first);
    if (!t) {
      std::printf("missing tensor '%s'\n", e.first.c_str());
      ++bad;
      continue;
    }
    if (t->dtype() != e.second.dtype() || t->shape() != e.second.shape()) {
      std::printf("'%s': got %s, expected %s\n", e.first.c_str(), t->describe().c_str(),
                  e.second.describe().c_str());
      ++bad;
      continue;
    }
    if (std::memcmp(t->raw_data(), e.second.raw_data(), e.second.nbytes()) != 0) {
      std::printf("'%s': bytes differ\n", e.first.c_str());
      ++bad;
    } else {
      std::printf("ok %s %s\n", e.first.c_str(), t->describe().c_str());
    }
  }
  auto expect_meta = [&](const std::string& k, const std::string& v) {
    auto it = f.metadata.find(k);
    if (it == f.metadata.end() || it->second != v) {
      std::printf("metadata '%s': expected '%s', got '%s'\n", k.c_str(), v.c_str(),
                  it == f.metadata.end() ? "(missing)" : it->second.c_str());
      ++bad;
    }
  };
  expect_meta("creator", creator);
  expect_meta("note", kNote);
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "write" && argc == 3) {
      auto ts = reference();
      // A non-contiguous view: written in logical order, (3, 2).
      ts.emplace_back("h_transposed", transpose(ts[0].second, 0, 1));
      save_safetensors(argv[2], ts, {{"creator", "cf"}, {"note", kNote}});
      return 0;
    }
    if (cmd == "check" && argc == 4) return check(argv[2], argv[3]);
    std::fprintf(stderr, "usage: %s write <path> | check <path> <creator>\n", argv[0]);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
