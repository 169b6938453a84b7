#pragma once
// IDX files, the format of MNIST and Fashion-MNIST, plain or gzip-compressed.
//
// Layout: bytes 0-1 are zero, byte 2 the element type, byte 3 the number of
// dimensions d; then d big-endian uint32 sizes; then the elements, big-endian,
// row-major. Types: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32,
// 0x0E float64. A gzip file is recognised by its 1f 8b magic.
// Every check names the file: bad magic, unknown type, d = 0 or more than 16,
// a data part shorter (truncated) or longer (trailing bytes) than the sizes say,
// and a gzip stream that is corrupt.
#include <string>

#include "core/tensor.h"

namespace cf {
namespace data {

// The tensor of an IDX file, converted to `dtype`: float32 or float64 for any type
// (values as stored, uint8 stays 0..255), int64 for the integer types (0x08-0x0C;
// float data asked as int64 is a DTypeError).
Tensor read_idx(const std::string& path, DType dtype = kFloat32);

// Where the Debian package dataset-fashion-mnist installs the files.
constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct FashionMnist {
  Tensor train_images;  // (60000, 28, 28) float32
  Tensor train_labels;  // (60000,) int64, 0..9
  Tensor test_images;   // (10000, 28, 28) float32
  Tensor test_labels;   // (10000,) int64
};

// Reads train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte
// and t10k-labels-idx1-ubyte from `dir`, each with or without ".gz". Images are
// float32, divided by 255 (in [0, 1]) when scale is true, else 0..255. IOError naming
// the folder and the file names when one is missing; checks that image and label
// counts agree and labels lie in 0..9.
FashionMnist load_fashion_mnist(const std::string& dir = kFashionMnistDir, bool scale = true);
// Whether all four files exist in dir (for tests and apps that fall back).
bool fashion_mnist_available(const std::string& dir = kFashionMnistDir);
// The ten class names, index = label.
const char* fashion_mnist_class_name(int64_t label);

}  // namespace data
}  // namespace cf
