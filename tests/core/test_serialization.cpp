// safetensors save/load: exact round trips, atomic saves, and one specific error
// message per kind of corrupt file.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "core/serialization.h"
#include "test_files.h"
#include "test_util.h"

using namespace cf;
using cf::test::read_bytes;
using cf::test::TempDir;
namespace fs = std::filesystem;

namespace {


// Write a safetensors file from a header string and a data buffer by hand.
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               uint64_t header_len_override = UINT64_MAX) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header_len_override == UINT64_MAX ? header.size() : header_len_override;
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = char((n >> (8 * i)) & 0xff);
  out.write(len, 8);
  out.write(header.data(), std::streamsize(header.size()));
  out.write(data.data(), std::streamsize(data.size()));
}

// Bitwise equality of two tensors' logical contents, same dtype and shape.
void check_same(const Tensor& a, const Tensor& b) {
  REQUIRE(a.dtype() == b.dtype());
  REQUIRE(a.shape() == b.shape());
  Tensor ca = contiguous(a), cb = contiguous(b);
  CHECK(std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0);
}

}  // namespace

TEST_CASE("safetensors round trip: every dtype, 0-d, empty, non-contiguous, metadata") {
  TempDir tmp;
  std::string path = tmp.file("all.safetensors");
  float nan = std::numeric_limits<float>::quiet_NaN();
  float inf = std::numeric_limits<float>::infinity();
  Tensor f32 = test::t32({1.5f, -0.0f, nan, inf, -inf, 1e-45f}, {2, 3});
  Tensor f64 = test::t64({0.1, -2.5e300, 4.9e-324, 3.0}, {2, 2});
  Tensor i64 = test::ti64({0, -1, std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max()}, {4});
  Tensor b = Tensor::from_vector(std::vector<bool>{true, false, false, true, true, false}, {3, 2});
  Tensor scalar = Tensor::scalar(2.75, kFloat64);
  Tensor empty = Tensor::zeros({0, 3}, kFloat32);
  Tensor empty_i = Tensor::zeros({2, 0}, kInt64);
  Tensor base = test::t64({1, 2, 3, 4, 5, 6}, {2, 3});
  std::vector<Tensor> strided = test::layouts(base);  // contiguous, transposed layout, step-2 slice
  Tensor tr = transpose(base, 0, 1);                   // (3,2) view
  f32.set_requires_grad(true);

  std::vector<std::pair<std::string, Tensor>> ts = {
      {"f32", f32},     {"f64", f64},       {"i64", i64},   {"bool", b},
      {"scalar", scalar}, {"empty", empty}, {"empty_i", empty_i}, {"transposed", tr},
      {"layout1", strided[1]}, {"layout2", strided[2]}, {"unicode ✓ name", base}};
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "ünï ✓"}, {"empty", ""}};
  save_safetensors(path, ts, meta);

  SafetensorsFile f = load_safetensors(path);
  REQUIRE(f.tensors.size() == ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    INFO("tensor ", ts[i].first);
    CHECK(f.tensors[i].first == ts[i].first);  // file order = save order
    check_same(f.tensors[i].second, ts[i].second.detach());
    if (f.tensors[i].second.numel() > 0) CHECK(f.tensors[i].second.is_contiguous());
    CHECK_FALSE(f.tensors[i].second.requires_grad());
  }
  CHECK(f.metadata == meta);
  REQUIRE(f.find("transposed") != nullptr);
  CHECK(f.find("transposed")->to_vector<double>() == std::vector<double>{1, 4, 2, 5, 3, 6});
  CHECK(f.find("scalar")->dim() == 0);
  CHECK(f.find("nope") == nullptr);
  CHECK(f.tensors[3].second.to_vector<bool>() == std::vector<bool>{true, false, false, true, true, false});

  // Header: 8-byte aligned, spaces padding, the dtypes spelled as safetensors does.
  std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  CHECK(n % 8 == 0);
  std::string header = bytes.substr(8, size_t(n));
  for (const char* s : {"\"F32\"", "\"F64\"", "\"I64\"", "\"BOOL\"", "\"__metadata__\""})
    CHECK(header.find(s) != std::string::npos);
  CHECK(tmp.count() == 1);  // no temporary left behind
}

TEST_CASE("safetensors: empty file list and no metadata") {
  TempDir tmp;
  std::string path = tmp.file("none.safetensors");
  save_safetensors(path, {});
  SafetensorsFile f = load_safetensors(path);
  CHECK(f.tensors.empty());
  CHECK(f.metadata.empty());
  // Overwrite an existing file.
  save_safetensors(path, {{"x", Tensor::arange(5)}}, {{"k", "v"}});
  f = load_safetensors(path);
  REQUIRE(f.tensors.size() == 1);
  CHECK(f.tensors[0].second.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
}

TEST_CASE("safetensors: reading entries out of header order sorts them by data offset") {
  TempDir tmp;
  std::string path = tmp.file("order.safetensors");
  std::string data(16, '\0');
  double one = 1.0, two = 2.0;
  std::memcpy(&data[0], &two, 8);
  std::memcpy(&data[8], &one, 8);
  write_raw(path,
            R"({"b":{"dtype":"F64","shape":[1],"data_offsets":[8,16]},)"
            R"("a":{"dtype":"F64","shape":[],"data_offsets":[0,8]},)"
            R"("z":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})",
            data);
  SafetensorsFile f = load_safetensors(path);
  REQUIRE(f.tensors.size() == 3);
  CHECK(f.tensors[0].first == "a");
  CHECK(f.tensors[0].second.item<double>() == 2.0);
  CHECK(f.tensors[1].first == "z");
  CHECK(f.tensors[2].first == "b");
  CHECK(f.tensors[2].second.item<double>() == 1.0);
}

TEST_CASE("safetensors: save refuses bad input and leaves the old file intact") {
  TempDir tmp;
  std::string path = tmp.file("keep.safetensors");
  save_safetensors(path, {{"w", Tensor::arange(3)}}, {{"v", "1"}});
  const std::string before = read_bytes(path);
  Tensor x = Tensor::ones({2});

  CHECK_THROWS_MSG(save_safetensors(path, {{"a", x}, {"a", x}}), ValueError, "[save_safetensors]",
                   "keep.safetensors", "duplicate tensor name 'a'");
  CHECK_THROWS_MSG(save_safetensors(path, {{"", x}}), ValueError, "[save_safetensors]", "empty name");
  CHECK_THROWS_MSG(save_safetensors(path, {{"__metadata__", x}}), ValueError, "reserved");
  CHECK_THROWS_MSG(save_safetensors(path, {{"u", Tensor()}}), ValueError, "'u' is undefined");
  CHECK_THROWS_MSG(save_safetensors(path, {{"a", x}, {"gpu", test::fake_cuda({2, 2})}}), DeviceError,
                   "[save_safetensors]", "keep.safetensors", "'gpu'", "cuda:0",
                   "move it to the CPU first");
  CHECK_THROWS_MSG(save_safetensors(path, {{std::string("bad\xff"), x}}), ValueError, "UTF-8");
  CHECK(read_bytes(path) == before);
  CHECK(tmp.count() == 1);

  // A directory that does not exist: IOError naming the file, nothing created.
  std::string nodir = tmp.file("missing_dir/x.safetensors");
  CHECK_THROWS_MSG(save_safetensors(nodir, {{"a", x}}), IOError, "[save_safetensors]",
                   "x.safetensors", "cannot create temporary file");
  CHECK(tmp.count() == 1);

  // Target is a directory: the rename fails, the temporary is removed.
  fs::create_directories(tmp.dir / "adir");
  fs::create_directories(tmp.dir / "adir" / "inner");
  CHECK_THROWS_MSG(save_safetensors(tmp.file("adir"), {{"a", x}}), IOError, "[save_safetensors]",
                   "adir", "rename");
  CHECK(tmp.count() == 2);  // keep.safetensors and adir only
  CHECK(read_bytes(path) == before);
}

TEST_CASE("load_safetensors: every corrupt file gives its own message") {
  TempDir tmp;
  std::string p = tmp.file("bad.safetensors");
  const std::string f32_4(4, '\0');
  auto entry = [](const std::string& name, const std::string& body) {
    return "\"" + name + "\":{" + body + "}";
  };
  auto check_bad = [&](const std::string& header, const std::string& data,
                       std::initializer_list<const char*> frags) {
    write_raw(p, header, data);
    bool thrown = false;
    try {
      load_safetensors(p);
    } catch (const IOError& e) {
      thrown = true;
      std::string m = e.what();
      CHECK_MESSAGE(m.rfind("[load_safetensors] ", 0) == 0, m);
      CHECK_MESSAGE(m.find("bad.safetensors") != std::string::npos, m);
      for (const char* f : frags) CHECK_MESSAGE(m.find(f) != std::string::npos, "'", m, "' lacks '", f, "'");
    }
    CHECK_MESSAGE(thrown, "no IOError for header ", header);
  };

  CHECK_THROWS_MSG(load_safetensors(tmp.file("nope.safetensors")), IOError,
                   "[load_safetensors]", "nope.safetensors", "no such file");
  CHECK_THROWS_MSG(load_safetensors(tmp.dir.string()), IOError, "not a regular file");
  {
    std::ofstream(p, std::ios::binary) << "abc";
    CHECK_THROWS_MSG(load_safetensors(p), IOError, "bad.safetensors", "3 bytes, shorter than");
    std::ofstream(p, std::ios::binary).close();
    CHECK_THROWS_MSG(load_safetensors(p), IOError, "0 bytes, shorter than");
  }
  write_raw(p, "{}", "", 1000);
  CHECK_THROWS_MSG(load_safetensors(p), IOError, "header length 1000 runs past the end of the file");
  write_raw(p, "{}", "", UINT64_MAX - 1);
  CHECK_THROWS_MSG(load_safetensors(p), IOError, "runs past the end of the file");

  check_bad("{\"a\": ", "", {"not valid JSON"});
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]") + "," +
                entry("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]") + "}",
            f32_4, {"key 'a' appears twice in the top-level object"});
  check_bad("[1, 2]", "", {"header is an array, not a JSON object"});
  check_bad("{\"a\": 3}", "", {"entry 'a' is an integer, not an object"});
  check_bad("{" + entry("a", "\"shape\":[1],\"data_offsets\":[0,4]") + "}", f32_4, {"'a' has no 'dtype'"});
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"data_offsets\":[0,4]") + "}", f32_4, {"'a' has no 'shape'"});
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"shape\":[1]") + "}", f32_4, {"'a' has no 'data_offsets'"});
  check_bad("{" + entry("a", "\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]") + "}", f32_4,
            {"dtype is an integer, not a string"});
  check_bad("{" + entry("a", "\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,4]") + "}", f32_4,
            {"unsupported dtype 'F8_E4M3'", "F32, F64, I64, BOOL, BF16, F16"});
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]") + "}", f32_4,
            {"shape is a string, not an array"});
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]") + "}", f32_4,
            {"shape holds a float (1.5)"});
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]") + "}", f32_4,
            {"negative dimension"});
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"
                             "\"data_offsets\":[0,4]") + "}",
            f32_4, {"17 dimensions"});
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]") + "}", f32_4,
            {"data_offsets must be an array of two integers"});
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{}") + "}", f32_4,
            {"data_offsets must be an array of two integers"});
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]") + "}", f32_4,
            {"are negative"});
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]") + "}", f32_4,
            {"end before they begin"});
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]") + "}", f32_4,
            {"run past the data buffer (4 bytes)"});
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]") + "}", f32_4,
            {"4 bytes for shape (2) of F32, which needs 8"});
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
                             "\"data_offsets\":[0,4]") + "}",
            f32_4, {"shape [4294967296,4294967296,16] has sizes whose product exceeds int64"});
  // a zero size does not excuse the others: the strides multiply them (from a bug hunt: a ShapeError from
  // Tensor::empty naming no file)
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"shape\":[0,9223372036854775807,9223372036854775807],"
                             "\"data_offsets\":[0,0]") + "}",
            "", {"entry 'a': shape [0,9223372036854775807,9223372036854775807] has sizes whose product exceeds int64"});
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]") + "," +
                entry("b", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]") + "}",
            f32_4, {"entries 'a' [0, 4) and 'b' [0, 4) overlap"});
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]") + "}",
            std::string(8, '\0'), {"bytes [0, 4) of the data buffer belong to no tensor", "before 'a'"});
  check_bad("{" + entry("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]") + "}",
            std::string(6, '\0'), {"2 bytes of trailing data"});
  check_bad("{\"__metadata__\": [1]}", "", {"'__metadata__' is an array, not an object"});
  check_bad("{\"__metadata__\": {\"epoch\": 3}}", "", {"metadata value 'epoch' is an integer, not a string"});
  check_bad("{" + entry("m", "\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[0,2]") + "}",
            std::string("\x01\x07", 2), {"BOOL tensor 'm' holds byte 7 at element 1"});
}
