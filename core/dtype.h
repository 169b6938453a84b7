#pragma once
#include <cstddef>
#include <cstdint>
#include <ostream>

#include "core/error.h"
#include "core/half.h"

namespace cf {

enum class DType : uint8_t { Float32, Float64, Int64, Bool, BFloat16, Float16 };

constexpr DType kFloat32 = DType::Float32;
constexpr DType kFloat64 = DType::Float64;
constexpr DType kInt64 = DType::Int64;
constexpr DType kBool = DType::Bool;
// Storage-only low precision (core/half.h): arithmetic in float32 registers.
constexpr DType kBFloat16 = DType::BFloat16;
constexpr DType kFloat16 = DType::Float16;

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Int64: return 8;
    case DType::Bool: return 1;
    case DType::BFloat16: return 2;
    case DType::Float16: return 2;
  }
  return 0;
}
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int64: return "int64";
    case DType::Bool: return "bool";
    case DType::BFloat16: return "bfloat16";
    case DType::Float16: return "float16";
  }
  return "?";
}
inline bool is_low_precision(DType t) { return t == DType::BFloat16 || t == DType::Float16; }
inline bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float64 || is_low_precision(t);
}
// Result dtype of a binary op on a and b (PyTorch's rules for tensors; docs/design-notes.md):
// equal dtypes stay; bool < int64 < floating; between floats the wider wins, except that
// bfloat16 with float16 gives float32 (neither holds the other's values).
inline DType promote_types(DType a, DType b) {
  if (a == b) return a;
  auto rank = [](DType t) {
    switch (t) {
      case DType::Bool: return 0;
      case DType::Int64: return 1;
      case DType::BFloat16: case DType::Float16: return 2;
      case DType::Float32: return 3;
      case DType::Float64: return 4;
    }
    return 0;
  };
  if (is_low_precision(a) && is_low_precision(b)) return DType::Float32;
  return rank(a) >= rank(b) ? a : b;
}
inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::Float32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::Float64; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::Bool; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::BFloat16; };
template <> struct dtype_of<Half> { static constexpr DType value = DType::Float16; };

}  // namespace cf

// Run the body with `scalar_t` bound to the C++ type of a dtype.
// OP names the calling op for the error message.
#define CF_DTYPE_CASE(D, T, ...) \
  case ::cf::DType::D: {         \
    using scalar_t = T;          \
    __VA_ARGS__;                 \
    break;                       \
  }
// The _FLOAT, _NUMERIC and _ALL forms include bfloat16 and float16 (scalar_t = cf::BFloat16 /
// cf::Half: loads convert to float32, stores round to nearest even). Kernels not yet written for
// the storage types use the _STD forms, which name the dtypes they take in their error.
#define CF_LOW_CASES(...)                              \
  CF_DTYPE_CASE(BFloat16, ::cf::BFloat16, __VA_ARGS__) \
  CF_DTYPE_CASE(Float16, ::cf::Half, __VA_ARGS__)
#define CF_DISPATCH_FLOAT(dtype, OP, ...)                                        \
  switch (dtype) {                                                               \
    CF_DTYPE_CASE(Float32, float, __VA_ARGS__)                                   \
    CF_DTYPE_CASE(Float64, double, __VA_ARGS__)                                  \
    CF_LOW_CASES(__VA_ARGS__)                                                    \
    default:                                                                     \
      throw ::cf::DTypeError(::cf::str("[", OP, "] expects a floating dtype, got ", dtype)); \
  }
#define CF_DISPATCH_FLOAT_STD(dtype, OP, ...)                                    \
  switch (dtype) {                                                               \
    CF_DTYPE_CASE(Float32, float, __VA_ARGS__)                                   \
    CF_DTYPE_CASE(Float64, double, __VA_ARGS__)                                  \
    default:                                                                     \
      throw ::cf::DTypeError(::cf::str("[", OP, "] expects float32 or float64, got ", dtype)); \
  }
#define CF_DISPATCH_NUMERIC(dtype, OP, ...)                                      \
  switch (dtype) {                                                               \
    CF_DTYPE_CASE(Float32, float, __VA_ARGS__)                                   \
    CF_DTYPE_CASE(Float64, double, __VA_ARGS__)                                  \
    CF_DTYPE_CASE(Int64, int64_t, __VA_ARGS__)                                   \
    CF_LOW_CASES(__VA_ARGS__)                                                    \
    default:                                                                     \
      throw ::cf::DTypeError(::cf::str("[", OP, "] expects a numeric dtype, got ", dtype)); \
  }
#define CF_DISPATCH_NUMERIC_STD(dtype, OP, ...)                                  \
  switch (dtype) {                                                               \
    CF_DTYPE_CASE(Float32, float, __VA_ARGS__)                                   \
    CF_DTYPE_CASE(Float64, double, __VA_ARGS__)                                  \
    CF_DTYPE_CASE(Int64, int64_t, __VA_ARGS__)                                   \
    default:                                                                     \
      throw ::cf::DTypeError(::cf::str("[", OP, "] expects a numeric dtype, got ", dtype)); \
  }
#define CF_DISPATCH_ALL(dtype, OP, ...)                                          \
  switch (dtype) {                                                               \
    CF_DTYPE_CASE(Float32, float, __VA_ARGS__)                                   \
    CF_DTYPE_CASE(Float64, double, __VA_ARGS__)                                  \
    CF_DTYPE_CASE(Int64, int64_t, __VA_ARGS__)                                   \
    CF_DTYPE_CASE(Bool, bool, __VA_ARGS__)                                       \
    CF_LOW_CASES(__VA_ARGS__)                                                    \
  }
#define CF_DISPATCH_ALL_STD(dtype, OP, ...)                                      \
  switch (dtype) {                                                               \
    CF_DTYPE_CASE(Float32, float, __VA_ARGS__)                                   \
    CF_DTYPE_CASE(Float64, double, __VA_ARGS__)                                  \
    CF_DTYPE_CASE(Int64, int64_t, __VA_ARGS__)                                   \
    CF_DTYPE_CASE(Bool, bool, __VA_ARGS__)                                       \
    default:                                                                     \
      throw ::cf::DTypeError(::cf::str("[", OP, "] has no kernel for ", dtype, " on this device")); \
  }
