// .npy and raw float32 files (nn/data/npy.h): byte-exact agreement with NumPy's
// writer, round trips of every dtype, the conversions, and every malformed file.
#include <cstring>
#include <string>
#include <vector>

#include "nn/data/npy.h"
#include "test_files.h"
#include "test_util.h"

using namespace cf;
using namespace cf::data;
using cf::test::read_bytes;
using cf::test::TempDir;
using cf::test::write_bytes;

namespace {

// A version 1.0 file as NumPy writes it: dict padded with spaces so that the data
// starts at a multiple of 64, then '\n'.
std::string npy_v1(const std::string& dict, const std::string& data) {
  size_t total = 10 + dict.size() + 1;
  std::string header = dict + std::string((64 - total % 64) % 64, ' ') + "\n";
  std::string s = std::string("\x93NUMPY", 6) + char(1) + char(0);
  s += char(header.size() & 0xff);
  s += char(header.size() >> 8);
  return s + header + data;
}

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

}  // namespace

TEST_SUITE("data") {

TEST_CASE("Npy: save_npy writes NumPy's bytes exactly, read_npy reads them back") {
  TempDir dir;
  std::vector<float> v = {0, 1, 2, 3, 4, 5};
  // np.save(f, np.arange(6, dtype='<f4').reshape(2, 3)): header length 0x76 = 118.
  std::string expected = npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", bytes_of(v));
  CHECK(expected.size() == 128 + 24);
  CHECK(static_cast<unsigned char>(expected[8]) == 0x76);
  save_npy(dir.file("a.npy"), Tensor::from_vector(v, {2, 3}));
  CHECK(read_bytes(dir.file("a.npy")) == expected);
  CHECK(dir.count() == 1);  // the temporary was renamed, nothing left behind
  Tensor t = read_npy(dir.file("a.npy"));
  CHECK(t.dtype() == kFloat32);
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.to_vector<float>() == v);
  // 1-d shapes are written "(n,)", as Python tuples are.
  save_npy(dir.file("b.npy"), Tensor::from_vector(std::vector<int64_t>{7, -8}, {2}));
  CHECK(read_bytes(dir.file("b.npy")).find("'shape': (2,), }") != std::string::npos);
}

TEST_CASE("Npy: round trips of float32, float64, int64, bool, 0-d, empty and strided tensors") {
  TempDir dir;
  Generator g(3);
  std::vector<Tensor> cases = {
      rand({4, 5}, kFloat32, g), rand({2, 3, 4}, kFloat64, g),
      Tensor::from_vector(std::vector<int64_t>{1, -2, 3, 1LL << 40}, {4}),
      Tensor::from_vector(std::vector<bool>{true, false, true}, {3}), Tensor::scalar(2.5, kFloat64),
      Tensor::zeros({0, 3}, kFloat32)};
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string p = dir.file("c" + std::to_string(i) + ".npy");
    save_npy(p, cases[i]);
    Tensor r = read_npy(p);
    INFO("case ", i, " ", cases[i].describe());
    CHECK(r.dtype() == cases[i].dtype());
    CHECK(r.shape() == cases[i].shape());
    CHECK(cf::test::values(r) == cf::test::values(cases[i]));
  }
  // A transposed view is written in its logical (C) order.
  Tensor m = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  save_npy(dir.file("t.npy"), transpose(m, 0, 1));
  CHECK(read_npy(dir.file("t.npy")).to_vector<double>() == std::vector<double>{1, 4, 2, 5, 3, 6});
}

TEST_CASE("Npy: versions 2.0 and 3.0, int32 and uint8 conversions, header variants") {
  TempDir dir;
  // Version 2.0: a 4-byte header length.
  std::string dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }";
  std::string header = dict + std::string((64 - (12 + dict.size() + 1) % 64) % 64, ' ') + "\n";
  std::string v2 = std::string("\x93NUMPY", 6) + char(2) + char(0);
  v2 += char(header.size() & 0xff);
  v2 += char(header.size() >> 8);
  v2 += std::string(2, '\0');
  v2 += header + bytes_of(std::vector<double>{1.5, -2.5});
  write_bytes(dir.file("v2.npy"), v2);
  CHECK(read_npy(dir.file("v2.npy")).to_vector<double>() == std::vector<double>{1.5, -2.5});
  v2[6] = char(3);
  write_bytes(dir.file("v3.npy"), v2);
  CHECK(read_npy(dir.file("v3.npy")).to_vector<double>() == std::vector<double>{1.5, -2.5});

  write_bytes(dir.file("i4.npy"), npy_v1("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }",
                                         bytes_of(std::vector<int32_t>{-1, 0, 70000})));
  Tensor i4 = read_npy(dir.file("i4.npy"));
  CHECK(i4.dtype() == kInt64);
  CHECK(i4.to_vector<int64_t>() == std::vector<int64_t>{-1, 0, 70000});
  write_bytes(dir.file("u1.npy"), npy_v1("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2), }",
                                         std::string("\x00\xff", 2)));
  Tensor u1 = read_npy(dir.file("u1.npy"));
  CHECK(u1.dtype() == kFloat32);
  CHECK(u1.to_vector<float>() == std::vector<float>{0, 255});
  // Keys in another order, double quotes, Python 2 long sizes.
  write_bytes(dir.file("k.npy"), npy_v1("{\"shape\": (1L, 2L), \"fortran_order\": False, \"descr\": \"<f4\"}",
                                        bytes_of(std::vector<float>{3, 4})));
  Tensor k = read_npy(dir.file("k.npy"));
  CHECK(k.shape() == Shape{1, 2});
  CHECK(k.to_vector<float>() == std::vector<float>{3, 4});
}

TEST_CASE("Npy: malformed files give errors naming the file and the problem") {
  TempDir dir;
  const std::string p = dir.file("bad.npy");
  const std::string f4 = bytes_of(std::vector<float>{1, 2, 3, 4, 5, 6});
  auto dict = [](const std::string& descr, const std::string& fortran, const std::string& shape) {
    return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
  };
  CHECK_THROWS_MSG(read_npy(dir.file("missing.npy")), IOError, "[read_npy]", "missing.npy", "cannot open");
  CHECK_THROWS_MSG(read_npy(dir.str()), IOError, "[read_npy]", "is a directory");
  write_bytes(p, "PK\x03\x04 not numpy at all");
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "not a .npy file");
  std::string v9 = npy_v1(dict("<f4", "False", "(2, 3)"), f4);
  v9[6] = char(9);
  write_bytes(p, v9);
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "unsupported .npy version 9.0");
  write_bytes(p, npy_v1(dict("<f4", "False", "(2, 3)"), f4).substr(0, 40));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "header length 118 exceeds the file size 40");
  write_bytes(p, npy_v1(dict("<f4", "True", "(2, 3)"), f4));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "Fortran-order");
  write_bytes(p, npy_v1(dict(">f4", "False", "(2, 3)"), f4));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "big-endian", ">f4", "astype('<f4')");
  write_bytes(p, npy_v1(dict(">i8", "False", "(2, 3)"), f4 + f4));  // the hint keeps the type (it said <f4)
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "big-endian", ">i8", "astype('<i8')");
  write_bytes(p, npy_v1(dict("<c8", "False", "(3,)"), f4));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "unsupported dtype '<c8'");
  write_bytes(p, npy_v1(dict("<f4", "False", "(2, 4)"), f4));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "truncated data", "(2,4)", "needs 32 bytes", "holds 24");
  write_bytes(p, npy_v1(dict("<f4", "False", "(2, 2)"), f4));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "8 trailing bytes");
  write_bytes(p, npy_v1(dict("<f4", "False", "(2, x)"), f4));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "unparsable header (a size in the shape tuple");
  write_bytes(p, npy_v1(dict("<f4", "False", "(4611686018427387904, 4611686018427387904)"), f4));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "too large");
  write_bytes(p, npy_v1("{'descr': '<f4', 'shape': (6,), }", f4));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "no 'fortran_order' entry");
  // What NumPy refuses too (these loaded as (2, 3) before): entries not separated by commas, keys NumPy
  // does not write, a key twice.
  write_bytes(p, npy_v1(dict("<f4", "False", "(2 3)"), f4));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "',' or ')' in the shape tuple", "(2 3)");
  write_bytes(p, npy_v1(dict("<f4", "False", "(2,, 3)"), f4));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "a size in the shape tuple", "(2,, 3)");
  write_bytes(p, npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2,3,), 'extra': 1}", f4));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "key 'extra'");
  write_bytes(p, npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'shape': (6,)}", f4));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "key 'shape'");
  write_bytes(p, npy_v1(dict("<f4", "False", "(2,3,)"), f4));  // a trailing comma is a tuple still
  CHECK(read_npy(p).shape() == Shape{2, 3});
  write_bytes(p, npy_v1(dict("<f4", "False", "( 2 , 3 )"), f4));  // spaces anywhere in the tuple
  CHECK(read_npy(p).shape() == Shape{2, 3});
  write_bytes(p, npy_v1(dict("<f4", "False", "(6)"), f4));  // the number 6, not a tuple (NumPy refuses it)
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "a one-element shape tuple needs its comma");
  write_bytes(p, npy_v1(dict("<f4", "False", "(6,)"), f4));
  CHECK(read_npy(p).shape() == Shape{6});
  // A shape that is no tuple read as a 0-d array, and a broken dict loaded (from a bug hunt)
  const std::string one = bytes_of(std::vector<float>{1});
  for (const char* shape : {"1", "x", "[1]"}) {
    write_bytes(p, npy_v1(dict("<f4", "False", shape), one));
    CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "shape must be a tuple");
  }
  write_bytes(p, npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (6,)", f4));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "',' or '}' after a value");
  write_bytes(p, npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (6,)} junk", f4));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "text after the header dict");
  write_bytes(p, npy_v1("'descr': '<f4', 'fortran_order': False, 'shape': (6,)", f4));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "must start with '{'");
  write_bytes(p, npy_v1(dict("<f4", "0", "(6,)"), f4));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "fortran_order must be True or False");
  std::string v15 = npy_v1(dict("<f4", "False", "(6,)"), f4);
  v15[7] = char(5);
  write_bytes(p, v15);
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "unsupported .npy version 1.5");
  // bool data is bytes 0 and 1 (a 2 read as true to one op, as 2 to another: sum, to(float32))
  write_bytes(p, npy_v1(dict("|b1", "False", "(3,)"), std::string("\x01\x00\x02", 3)));
  CHECK_THROWS_MSG(read_npy(p), IOError, "[read_npy]", "bad.npy", "bool data holds byte 2 at element 2; expected 0 or 1");
  // Saving: an unwritable folder names the file; nothing is left behind.
  CHECK_THROWS_MSG(save_npy(dir.file("no/such/dir/x.npy"), Tensor::zeros({2})), IOError, "[save_npy]",
                   "x.npy");
  CHECK_THROWS_MSG(save_npy(dir.file("u.npy"), Tensor()), ValueError, "[save_npy]", "undefined");
}

TEST_CASE("Npy: raw float32 files with a shape") {
  TempDir dir;
  std::vector<float> v = {1, 2, 3, 4, 5, 6};
  write_bytes(dir.file("x.f32"), bytes_of(v));
  Tensor t = read_raw_float32(dir.file("x.f32"), {3, 2});
  CHECK(t.shape() == Shape{3, 2});
  CHECK(t.to_vector<float>() == v);
  CHECK_THROWS_MSG(read_raw_float32(dir.file("x.f32"), {4, 2}), IOError, "[read_raw_float32]", "x.f32",
                   "holds 24 bytes (6 float32 values)", "(4,2) needs 32");
  write_bytes(dir.file("odd.f32"), "abcde");
  CHECK_THROWS_MSG(read_raw_float32(dir.file("odd.f32"), {1}), IOError, "[read_raw_float32]", "odd.f32",
                   "not a whole number");
  CHECK_THROWS_MSG(read_raw_float32(dir.file("none.f32"), {1}), IOError, "[read_raw_float32]", "none.f32",
                   "cannot open");
  CHECK_THROWS_MSG(read_raw_float32(dir.file("x.f32"), {-1, 6}), ValueError, "[read_raw_float32]", "negative");
}

}  // TEST_SUITE
