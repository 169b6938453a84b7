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

// The value text of `key` in the header dict: what follows "'key':" up to the
// matching end (a quoted string, a parenthesised tuple, or a bare word).
std::string dict_value(const std::string& h, const std::string& key, const std::string& path) {
  size_t k = h.find("'" + key + "'");
  if (k == std::string::npos) k = h.find("\"" + key + "\"");
  if (k == std::string::npos)
    throw IOError(str("[read_npy] '", path, "': header has no '", key, "' entry: ", h));
  size_t p = h.find(':', k + key.size() + 2);
  if (p == std::string::npos) throw IOError(str("[read_npy] '", path, "': unparsable header: ", h));
  ++p;
  while (p < h.size() && h[p] == ' ') ++p;
  if (p >= h.size()) throw IOError(str("[read_npy] '", path, "': unparsable header: ", h));
  size_t e;
  if (h[p] == '\'' || h[p] == '"') {
    e = h.find(h[p], p + 1);
    if (e == std::string::npos) throw IOError(str("[read_npy] '", path, "': unparsable header: ", h));
    return h.substr(p + 1, e - p - 1);
  }
  if (h[p] == '(') {
    e = h.find(')', p);
    if (e == std::string::npos) throw IOError(str("[read_npy] '", path, "': unparsable header: ", h));
    return h.substr(p, e - p + 1);
  }
  e = h.find_first_of(",}", p);
  if (e == std::string::npos) throw IOError(str("[read_npy] '", path, "': unparsable header: ", h));
  std::string v = h.substr(p, e - p);
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return v;
}

// The header's top-level keys are exactly descr, fortran_order and shape, each once, as NumPy's reader requires
// (a header with others, or without the dict's quotes, is not one NumPy wrote).
void check_header_keys(const std::string& h, const std::string& path) {
  std::vector<std::string> keys;
  int depth = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    const char c = h[i];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if ((c != '\'' && c != '"') || depth != 0) continue;
    const size_t e = h.find(c, i + 1);
    if (e == std::string::npos) throw IOError(str("[read_npy] '", path, "': unparsable header: ", h));
    size_t k = e + 1;
    while (k < h.size() && h[k] == ' ') ++k;
    if (k < h.size() && h[k] == ':') keys.push_back(h.substr(i + 1, e - i - 1));
    i = e;
  }
  for (const std::string& key : keys)
    if ((key != "descr" && key != "fortran_order" && key != "shape") ||
        std::count(keys.begin(), keys.end(), key) != 1)
      throw IOError(str("[read_npy] '", path, "': unparsable header (key '", key,
                        "': a .npy header holds descr, fortran_order and shape, once each): ", h));
}

Shape parse_shape(const std::string& t, const std::string& path) {
  // "(3, 4)", "(5,)", "()": entries separated by one comma (a trailing one allowed), as a Python tuple
  Shape s;
  size_t i = 1;
  while (i < t.size() - 1) {
    while (i < t.size() && t[i] == ' ') ++i;
    if (!s.empty()) {
      if (t[i] != ',') throw IOError(str("[read_npy] '", path, "': bad shape ", t, " in the header"));
      ++i;
      while (i < t.size() && t[i] == ' ') ++i;
    }
    if (i >= t.size() - 1) break;
    size_t j = i;
    while (j < t.size() && t[j] >= '0' && t[j] <= '9') ++j;
    // Python 2 files may write long sizes as "3L".
    if (j == i) throw IOError(str("[read_npy] '", path, "': bad shape ", t, " in the header"));
    if (j - i > 18) throw IOError(str("[read_npy] '", path, "': shape ", t, " is too large"));
    s.push_back(std::stoll(t.substr(i, j - i)));
    i = j;
    if (i < t.size() && t[i] == 'L') ++i;
    if (i < t.size() && t[i] != ',' && t[i] != ' ' && t[i] != ')')
      throw IOError(str("[read_npy] '", path, "': bad shape ", t, " in the header"));
  }
  if (s.size() > size_t(kMaxDims))
    throw IOError(str("[read_npy] '", path, "': ", s.size(), " dimensions, at most ", kMaxDims));
  return s;
}

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
  if (major < 1 || major > 3)
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
  check_header_keys(h, path);
  const std::string descr = dict_value(h, "descr", path);
  const std::string fortran = dict_value(h, "fortran_order", path);
  const Shape shape = parse_shape(dict_value(h, "shape", path), path);
  if (fortran != "False")
    throw IOError(str("[read_npy] '", path, "': Fortran-order arrays are not supported (fortran_order ",
                      fortran, "); save a C-order array (numpy.ascontiguousarray)"));
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
