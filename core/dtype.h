#pragma once
#include <cstddef>
#include <cstdint>
#include <ostream>

#include "core/error.h"

namespace cf {

enum class DType : uint8_t { Float32, Float64, Int64, Bool };

constexpr DType kFloat32 = DType::Float32;
constexpr DType kFloat64 = DType::Float64;
constexpr DType kInt64 = DType::Int64;
constexpr DType kBool = DType::Bool;

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Int64: return 8;
    case DType::Bool: return 1;
  }
  return 0;
}
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int64: return "int64";
    case DType::Bool: return "bool";
  }
  return "?";
}
inline bool is_floating(DType t) { return t == DType::Float32 || t == DType::Float64; }
inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::Float32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::Float64; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::Bool; };

}  // namespace cf

// Run the body with `scalar_t` bound to the C++ type of a dtype.
// OP names the calling op for the error message.
#define CF_DTYPE_CASE(D, T, ...) \
  case ::cf::DType::D: {         \
    using scalar_t = T;          \
    __VA_ARGS__;                 \
    break;                       \
  }
#define CF_DISPATCH_FLOAT(dtype, OP, ...)                                        \
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
    default:                                                                     \
      throw ::cf::DTypeError(::cf::str("[", OP, "] expects a numeric dtype, got ", dtype)); \
  }
#define CF_DISPATCH_ALL(dtype, OP, ...)                                          \
  switch (dtype) {                                                               \
    CF_DTYPE_CASE(Float32, float, __VA_ARGS__)                                   \
    CF_DTYPE_CASE(Float64, double, __VA_ARGS__)                                  \
    CF_DTYPE_CASE(Int64, int64_t, __VA_ARGS__)                                   \
    CF_DTYPE_CASE(Bool, bool, __VA_ARGS__)                                       \
  }
