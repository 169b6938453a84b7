#include "nn/data/mnist_csv.h"

#include <vector>

#include "core/error.h"
#include "core/io.h"

namespace cf {
namespace data {

namespace {
// Bytes of the file as they may appear in a message: other than printable ASCII as \xNN (a binary file given
// as the CSV printed raw bytes to the terminal).
std::string printable(std::string_view s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}
}  // namespace

MnistCsv read_mnist_csv(const std::string& path, bool scale) {
  constexpr const char* op = "read_mnist_csv";
  constexpr int64_t kPixels = 28 * 28;
  const std::string text = io::read_file_maybe_gzip(path, op);
  std::vector<float> pixels;
  std::vector<int64_t> labels;
  io::for_each_line(text, [&](int64_t line, std::string_view row) {
    if (row.empty()) return;  // blank lines (a last empty line) are skipped
    const size_t stop = row.size();
    int64_t column = 0;
    size_t p = 0;
    while (true) {
      // One non-negative decimal integer (the format has no signs, spaces or decimals).
      size_t q = p;
      int64_t v = 0;
      while (q < stop && row[q] >= '0' && row[q] <= '9' && q - p < 4) v = v * 10 + (row[q++] - '0');
      const bool sep_ok = q == stop || row[q] == ',';
      CF_CHECK(q > p && sep_ok, IOError, "[", op, "] '", path, "' line ", line, " column ", column + 1,
               ": expected an integer 0..255 (pixel) or 0..9 (label), got '",
               printable(row.substr(p, std::min<size_t>(stop - p, 12))), "'");
      if (column < kPixels) {
        CF_CHECK(v <= 255, IOError, "[", op, "] '", path, "' line ", line, " column ", column + 1,
                 ": pixel ", v, " is outside 0..255");
        pixels.push_back(scale ? float(v) / 255.0f : float(v));
      } else if (column == kPixels) {
        CF_CHECK(v <= 9, IOError, "[", op, "] '", path, "' line ", line, ": label ", v, " is outside 0..9");
        labels.push_back(v);
      }
      ++column;
      if (q == stop) break;
      p = q + 1;
    }
    CF_CHECK(column == kPixels + 1, IOError, "[", op, "] '", path, "' line ", line, ": ", column,
             " columns, expected 785 (784 pixels of a 28 x 28 image, then the label)");
  });
  const int64_t n = int64_t(labels.size());
  CF_CHECK(n > 0, IOError, "[", op, "] '", path, "' holds no images");
  MnistCsv out;
  out.images = Tensor::from_vector(pixels, {n, 28, 28});
  out.labels = Tensor::from_vector(labels, {n});
  return out;
}

}  // namespace data
}  // namespace cf
