#pragma once
// NumPy .npy files and raw little-endian float32 arrays: the vector formats the
// cf-kmeans app reads and writes, usable from any program.
//
// .npy layout (NumPy's format 1.0, 2.0 and 3.0): the magic "\x93NUMPY", a major and
// minor version byte, the header length (uint16 little endian for 1.0, uint32 for
// 2.0/3.0), then the header, a Python dict literal such as
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }, padded with spaces
// and a newline, and then the elements in C order.
// Read: descr '<f4' (float32), '<f8' (float64), '<i8' (int64), '<i4' (int32, read
// as int64) and '|b1' (bool); '|u1' (uint8) read as float32. Errors name the file:
// bad magic or version, an unparsable header, Fortran order, big-endian or other
// descr, a negative or overflowing shape, and a data part shorter (truncated) or
// longer (trailing bytes) than the shape says.
#include <string>

#include "core/tensor.h"

namespace cf {
namespace data {

Tensor read_npy(const std::string& path);

// Writes t (float32, float64, int64 or bool; any shape, 0-d included; any strides)
// as a version 1.0 .npy file, atomically (a temporary in the same folder, then rename).
void save_npy(const std::string& path, const Tensor& t);

// A file of raw little-endian float32 values in C order, as `shape`; the file size
// must be exactly numel * 4 bytes (the error says how many values it holds).
Tensor read_raw_float32(const std::string& path, const Shape& shape);

}  // namespace data
}  // namespace cf
