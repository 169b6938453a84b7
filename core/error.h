#pragma once
// cf::Error family. Every message starts with "[op]" and shows the shapes,
// dtypes and devices involved (DESIGN.md section 6).
#include <sstream>
#include <stdexcept>
#include <string>

namespace cf {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};
class ShapeError : public Error { using Error::Error; };
class DTypeError : public Error { using Error::Error; };
class DeviceError : public Error { using Error::Error; };
class IndexError : public Error { using Error::Error; };
class ValueError : public Error { using Error::Error; };
class IOError : public Error { using Error::Error; };
class AutogradError : public Error { using Error::Error; };
class NotImplementedError : public Error { using Error::Error; };

namespace detail {
inline void str_into(std::ostringstream&) {}
template <typename T, typename... R>
void str_into(std::ostringstream& os, const T& v, const R&... rest) {
  os << v;
  str_into(os, rest...);
}
}  // namespace detail

// Concatenate anything streamable into a string: cf::str("[add] ", shape).
template <typename... A>
std::string str(const A&... a) {
  std::ostringstream os;
  detail::str_into(os, a...);
  return os.str();
}

}  // namespace cf

// Throw ErrType with the streamed message when cond is false.
#define CF_CHECK(cond, ErrType, ...) \
  do {                               \
    if (!(cond)) throw ::cf::ErrType(::cf::str(__VA_ARGS__)); \
  } while (0)
