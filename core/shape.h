#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace cf {

using Shape = std::vector<int64_t>;

int64_t numel_of(const Shape& s);
Shape contiguous_strides(const Shape& s);
// "(2,3)"; a 0-d shape prints as "()".
std::string shape_str(const Shape& s);
// NumPy broadcasting of two shapes; throws ShapeError naming `op`.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Map a possibly negative axis into [0, ndim); throws IndexError naming `op`.
int64_t normalize_axis(int64_t axis, int64_t ndim, const char* op);

struct ShapePrinter { const Shape& s; };
inline std::ostream& operator<<(std::ostream& os, ShapePrinter p) { return os << shape_str(p.s); }

}  // namespace cf
