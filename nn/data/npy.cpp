#include "nn/data/npy.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <vector>

#include "core/io.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "cf's .npy and raw readers assume a little-endian host"
#endif

namespace cf {
namespace data {

namespace {

constexpr char kMagic[] = "\x93NUMPY";

std::ifstream open_input(const std::string& path, const char* op, int64_t& size) {
  // Regular files only, checked without blocking (a FIFO would hang the stream open).
  size = int64_t(io::check_readable(path, op));
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    int err = errno;
    throw IOError(str("[", op, "] cannot open '", path, "': ", std::strerror(err)));
  }
  return f;
}

void read_exact(std::ifstream& f, char* dst, int64_t n, const std::string& path, const char* what) {
  f.read(dst, std::streamsize(n));
  if (f.gcount() != std::streamsize(n))
    throw IOError(str("[read_npy] '", path, "': truncated ", what, " (", int64_t(f.gcount()), " of ",
                      n, " bytes)"));
}

// The header dict NumPy writes, parsed strictly as the Python literal it is: "{'descr': '<f4',
// 'fortran_order': False, 'shape': (3, 4), }" with exactly these three keys, each once, in any order,
// then spaces and one newline of padding. A bare 'shape': 1, a missing brace or text after it is an
// error (NumPy's reader refuses them too): a hand-edited header must not read as another array.
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

class HeaderParser {
 public:
  HeaderParser(const std::string& h, const std::string& path) : h_(h), path_(path) {}

  NpyHeader parse() {
    NpyHeader out;
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    skip_spaces();
    expect('{', "the header dict must start with '{'");
    skip_spaces();
    while (peek() != '}') {
      const std::string key = quoted("a quoted key");
      skip_spaces();
      expect(':', "':' after a key");
      skip_spaces();
      bool* seen = key == "descr" ? &seen_descr : key == "fortran_order" ? &seen_fortran
                 : key == "shape" ? &seen_shape : nullptr;
      if (!seen || *seen)
        fail(str("key '", key, "': a .npy header holds descr, fortran_order and shape, once each"));
      *seen = true;
      if (key == "descr") out.descr = quoted("descr as a quoted string");
      else if (key == "fortran_order") out.fortran_order = boolean();
      else out.shape = tuple();
      separator('}', "',' or '}' after a value");
    }
    ++i_;  // '}'
    while (i_ < h_.size() && (h_[i_] == ' ' || h_[i_] == '\n' || h_[i_] == '\0')) ++i_;
    if (i_ != h_.size()) fail("text after the header dict");
    if (!seen_descr || !seen_fortran || !seen_shape)
      throw IOError(str("[read_npy] '", path_, "': header has no '",
                        !seen_descr ? "descr" : !seen_fortran ? "fortran_order" : "shape", "' entry: ", h_));
    if (out.shape.size() > size_t(kMaxDims))
      throw IOError(str("[read_npy] '", path_, "': ", out.shape.size(), " dimensions, at most ", kMaxDims));
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw IOError(str("[read_npy] '", path_, "': unparsable header (", what, " at offset ", i_, "): ", h_));
  }
  char peek() const { return i_ < h_.size() ? h_[i_] : '\0'; }
  void skip_spaces() {
    while (i_ < h_.size() && h_[i_] == ' ') ++i_;
  }
  // After an entry: a comma (spaces around it) before the next one, or the closing character (left for the
  // caller's loop to see).
  bool separator(char close, const char* what) {
    skip_spaces();
    if (peek() == ',') {
      ++i_;
      skip_spaces();
      return true;
    }
    if (peek() != close) fail(what);
    return false;
  }
  void expect(char c, const char* what) {
    if (peek() != c) fail(what);
    ++i_;
  }
  std::string quoted(const char* what) {
    const char q = peek();
    if (q != '\'' && q != '"') fail(what);
    const size_t e = h_.find(q, i_ + 1);
    if (e == std::string::npos) fail(what);
    std::string v = h_.substr(i_ + 1, e - i_ - 1);
    i_ = e + 1;
    return v;
  }
  bool boolean() {
    for (const char* word : {"True", "False"}) {
      const size_t n = std::strlen(word);
      if (h_.compare(i_, n, word) == 0) {
        i_ += n;
        return word[0] == 'T';
      }
    }
    fail("fortran_order must be True or False");
  }
  // "(3, 4)", "(5,)", "()": integers separated by commas, a trailing one allowed (Python 2's "3L" too)
  Shape tuple() {
    Shape s;
    bool comma = false;  // after the last size
    expect('(', "shape must be a tuple");
    skip_spaces();
    while (peek() != ')') {
      const size_t start = i_;
      while (peek() >= '0' && peek() <= '9') ++i_;
      if (i_ == start) fail("a size in the shape tuple");
      if (i_ - start > 18) throw IOError(str("[read_npy] '", path_, "': shape ", h_.substr(start, i_ - start),
                                             "... is too large"));
      s.push_back(std::stoll(h_.substr(start, i_ - start)));
      if (peek() == 'L') ++i_;
      comma = separator(')', "',' or ')' in the shape tuple");
    }
    // "(6)" is the number 6 to Python, not a tuple: NumPy refuses it, and so does this reader
    if (s.size() == 1 && !comma) fail("a one-element shape tuple needs its comma, as (6,)");
    ++i_;  // ')'
    return s;
  }

  const std::string& h_;
  const std::string& path_;
  size_t i_ = 0;
};

// Element count, checked for overflow (a corrupt header must not wrap around).
int64_t checked_numel(const Shape& s, int64_t item, const std::string& path, const char* op) {
  try {
    (void)checked_nbytes(s, size_t(item), op);  // the core overflow check, elements and bytes
  } catch (const ShapeError& e) {
    throw IOError(str("[", op, "] '", path, "': shape ", shape_str(s), " is too large: ", e.what()));
  }
  return numel_of(s);
}

std::string header_for(const Tensor& t) {
  const char* descr = nullptr;
  switch (t.dtype()) {
    case DType::Float32: descr = "<f4"; break;
    case DType::Float64: descr = "<f8"; break;
    case DType::Int64: descr = "<i8"; break;
    case DType::Bool: descr = "|b1"; break;
    case DType::Float16: descr = "<f2"; break;
    case DType::BFloat16:  // numpy has no bfloat16
      throw DTypeError(str("[save_npy] numpy has no bfloat16; convert ", t.describe(), " with cf::to first"));
  }
  std::string shape = "(";
  for (size_t i = 0; i < t.shape().size(); ++i)
    shape += std::to_string(t.shape()[i]) + (t.shape().size() == 1 ? "," : i + 1 < t.shape().size() ? ", " : "");
  shape += ")";
  std::string dict = str("{'descr': '", descr, "', 'fortran_order': False, 'shape': ", shape, ", }");
  // magic (6) + version (2) + length (2) + dict + padding + '\n': a multiple of 64.
  size_t total = 10 + dict.size() + 1;
  size_t pad = (64 - total % 64) % 64;
  return dict + std::string(pad, ' ') + "\n";
}

}  // namespace

Tensor read_npy(const std::string& path) {
  int64_t file_size = 0;
  std::ifstream f = open_input(path, "read_npy", file_size);
  char pre[8];
  f.read(pre, 8);
  if (f.gcount() != 8 || std::memcmp(pre, kMagic, 6) != 0)
    throw IOError(str("[read_npy] '", path, "' is not a .npy file (no \\x93NUMPY magic)"));
  const int major = static_cast<unsigned char>(pre[6]), minor = static_cast<unsigned char>(pre[7]);
  if (major < 1 || major > 3 || minor != 0)
    throw IOError(str("[read_npy] '", path, "': unsupported .npy version ", major, ".", minor,
                      " (1.0, 2.0 and 3.0 are read)"));
  unsigned char lenb[4] = {0, 0, 0, 0};
  const int len_bytes = major == 1 ? 2 : 4;
  read_exact(f, reinterpret_cast<char*>(lenb), len_bytes, path, "header length");
  const int64_t hlen = int64_t(lenb[0]) | int64_t(lenb[1]) << 8 | int64_t(lenb[2]) << 16 |
                       int64_t(lenb[3]) << 24;
  if (hlen > file_size)
    throw IOError(str("[read_npy] '", path, "': header length ", hlen, " exceeds the file size ",
                      file_size));
  std::string h(size_t(hlen), '\0');
  read_exact(f, h.data(), hlen, path, "header");
  const NpyHeader header = HeaderParser(h, path).parse();
  const std::string& descr = header.descr;
  const Shape& shape = header.shape;
  if (header.fortran_order)
    throw IOError(str("[read_npy] '", path, "': Fortran-order arrays are not supported (fortran_order "
                      "True); save a C-order array (numpy.ascontiguousarray)"));
  DType dtype;
  int64_t item;
  if (descr == "<f4") dtype = kFloat32, item = 4;
  else if (descr == "<f8") dtype = kFloat64, item = 8;
  else if (descr == "<f2") dtype = kFloat16, item = 2;
  else if (descr == "<i8") dtype = kInt64, item = 8;
  else if (descr == "<i4") dtype = kInt64, item = 4;
  else if (descr == "|b1") dtype = kBool, item = 1;
  else if (descr == "|u1") dtype = kFloat32, item = 1;
  else if (!descr.empty() && descr[0] == '>')
    throw IOError(str("[read_npy] '", path, "': big-endian data ('", descr,
                      "') is not supported; save it little-endian (astype('<", descr.substr(1), "'), the same type)"));
  else
    throw IOError(str("[read_npy] '", path, "': unsupported dtype '", descr,
                      "' (float32 '<f4', float64 '<f8', float16 '<f2', int64 '<i8', int32 '<i4', uint8 '|u1', bool '|b1')"));
  const int64_t n = checked_numel(shape, item, path, "read_npy");
  const int64_t data_offset = (major == 1 ? 10 : 12) + hlen;
  const int64_t have = file_size - data_offset, need = n * item;
  if (have < need)
    throw IOError(str("[read_npy] '", path, "': truncated data: shape ", shape_str(shape), " of '",
                      descr, "' needs ", need, " bytes, the file holds ", have));
  if (have > need)
    throw IOError(str("[read_npy] '", path, "': ", have - need, " trailing bytes after the ", need,
                      " bytes of data that shape ", shape_str(shape), " of '", descr, "' holds"));
  Tensor t = Tensor::empty(shape, dtype);
  if (item == int64_t(dtype_size(dtype))) {
    read_exact(f, static_cast<char*>(t.raw_data()), need, path, "data");
    if (dtype == kBool) {  // a byte other than 0 or 1 would read as true to one op and as 2 to another
      const auto* b = static_cast<const unsigned char*>(t.raw_data());
      for (int64_t i = 0; i < n; ++i)
        if (b[i] > 1)
          throw IOError(str("[read_npy] '", path, "': bool data holds byte ", int(b[i]), " at element ", i,
                            "; expected 0 or 1"));
    }
  } else {
    std::vector<char> raw(static_cast<size_t>(need));
    read_exact(f, raw.data(), need, path, "data");
    if (descr == "<i4") {
      int64_t* o = t.data<int64_t>();
      for (int64_t i = 0; i < n; ++i) {
        int32_t v;
        std::memcpy(&v, raw.data() + i * 4, 4);
        o[i] = v;
      }
    } else {  // |u1
      float* o = t.data<float>();
      for (int64_t i = 0; i < n; ++i) o[i] = float(static_cast<unsigned char>(raw[size_t(i)]));
    }
  }
  return t;
}

void save_npy(const std::string& path, const Tensor& t) {
  CF_CHECK(t.defined(), ValueError, "[save_npy] '", path, "': undefined tensor");
  CF_CHECK(t.device().is_cpu(), DeviceError, "[save_npy] '", path, "': tensor is ", t.describe(),
           "; move it to the CPU first");
  const std::string header = header_for(t);
  std::string out(kMagic, 6);
  out += char(1);
  out += char(0);
  out += char(header.size() & 0xff);
  out += char((header.size() >> 8) & 0xff);
  out += header;
  const size_t item = dtype_size(t.dtype());
  const size_t start = out.size();
  out.resize(start + size_t(t.numel()) * item);
  char* dst = out.data() + start;
  const char* base = static_cast<const char*>(t.impl_ptr()->storage->data);
  if (t.is_contiguous()) {
    std::memcpy(dst, base + size_t(t.offset()) * item, size_t(t.numel()) * item);
  } else {
    size_t i = 0;
    for_each_offset(t.shape(), t.strides(), t.offset(), [&](int64_t o) {
      std::memcpy(dst + (i++) * item, base + size_t(o) * item, item);
    });
  }
  io::write_file_atomic(path, out, "save_npy");
}

Tensor read_raw_float32(const std::string& path, const Shape& shape) {
  for (int64_t d : shape)
    CF_CHECK(d >= 0, ValueError, "[read_raw_float32] '", path, "': negative size in shape ",
             shape_str(shape));
  int64_t file_size = 0;
  std::ifstream f = open_input(path, "read_raw_float32", file_size);
  const int64_t n = checked_numel(shape, 4, path, "read_raw_float32");
  if (file_size != n * 4)
    throw IOError(str("[read_raw_float32] '", path, "' holds ", file_size, " bytes (",
                      file_size % 4 == 0 ? str(file_size / 4, " float32 values") : str("not a whole number of float32 values"),
                      "), shape ", shape_str(shape), " needs ", n * 4));
  Tensor t = Tensor::empty(shape, kFloat32);
  f.read(static_cast<char*>(t.raw_data()), std::streamsize(n * 4));
  if (f.gcount() != std::streamsize(n * 4))
    throw IOError(str("[read_raw_float32] '", path, "': read error after ", int64_t(f.gcount()), " bytes"));
  return t;
}

}  // namespace data
}  // namespace cf
