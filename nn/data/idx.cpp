#include "nn/data/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include "core/io.h"

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>


namespace cf {
namespace data {

namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzHandle = std::unique_ptr<gzFile_s, GzCloser>;

// Reads up to n bytes; returns the count (short at end of data). Throws on a gzip error.
size_t gz_read(gzFile f, unsigned char* dst, size_t n, const std::string& path, bool gz) {
  size_t got = 0;
  while (got < n) {
    unsigned chunk = unsigned(std::min<size_t>(n - got, size_t(1) << 30));
    int r = gzread(f, dst + got, chunk);
    if (r < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      throw IOError(str("[read_idx] '", path, "': ", gz ? "corrupt gzip stream: " : "read error: ",
                        msg ? msg : "unknown error"));
    }
    if (r == 0) break;
    got += size_t(r);
  }
  // zlib reports a gzip stream cut short only through gzerror.
  int code = 0;
  const char* msg = gzerror(f, &code);
  if (code != Z_OK && code != Z_STREAM_END)
    throw IOError(str("[read_idx] '", path, "': ", gz ? "corrupt or truncated gzip stream: " : "read error: ",
                      msg ? msg : "unknown error"));
  return got;
}

int type_size(unsigned char t) {
  switch (t) {
    case 0x08: case 0x09: return 1;
    case 0x0B: return 2;
    case 0x0C: case 0x0D: return 4;
    case 0x0E: return 8;
    default: return 0;
  }
}
const char* type_name(unsigned char t) {
  switch (t) {
    case 0x08: return "uint8";
    case 0x09: return "int8";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return "?";
  }
}

uint64_t be(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

template <typename T>
void convert(const unsigned char* src, int64_t n, unsigned char type, T* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const unsigned char* p = src + i * type_size(type);
    switch (type) {
      case 0x08: dst[i] = T(p[0]); break;
      case 0x09: dst[i] = T(int8_t(p[0])); break;
      case 0x0B: dst[i] = T(int16_t(uint16_t(be(p, 2)))); break;
      case 0x0C: dst[i] = T(int32_t(uint32_t(be(p, 4)))); break;
      case 0x0D: {
        uint32_t u = uint32_t(be(p, 4));
        float f;
        std::memcpy(&f, &u, 4);
        dst[i] = T(f);
        break;
      }
      case 0x0E: {
        uint64_t u = be(p, 8);
        double d;
        std::memcpy(&d, &u, 8);
        dst[i] = T(d);
        break;
      }
    }
  }
}

bool file_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

Tensor read_idx(const std::string& path, DType dtype) {
  CF_CHECK(dtype == kFloat32 || dtype == kFloat64 || dtype == kInt64, DTypeError,
           "[read_idx] dtype must be float32, float64 or int64, got ", dtype);
  // Regular files only, checked without blocking (a FIFO would hang fopen/gzopen).
  const uint64_t file_size = io::check_readable(path, "read_idx");

  // Detect gzip by its magic (gzread would also pass plain files through unchanged).
  bool gz = false;
  {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) {
      int err = errno;
      throw IOError(str("[read_idx] cannot open '", path, "': ", std::strerror(err)));
    }
    unsigned char m[2] = {0, 0};
    size_t k = std::fread(m, 1, 2, f);
    std::fclose(f);
    gz = k == 2 && m[0] == 0x1f && m[1] == 0x8b;
  }
  GzHandle h(gzopen(path.c_str(), "rb"));
  CF_CHECK(h != nullptr, IOError, "[read_idx] cannot open '", path, "'");
  gzFile f = h.get();
  const char* what = gz ? " (gzip)" : "";

  unsigned char head[4];
  size_t got = gz_read(f, head, 4, path, gz);
  CF_CHECK(got == 4, IOError, "[read_idx] '", path, "'", what, " is truncated: ", got,
           " bytes, shorter than the 4-byte IDX header");
  CF_CHECK(head[0] == 0 && head[1] == 0, IOError, "[read_idx] '", path, "'", what,
           " is not an IDX file: magic starts with bytes ", int(head[0]), " ", int(head[1]),
           ", expected 0 0");
  unsigned char type = head[2];
  int tsize = type_size(type);
  CF_CHECK(tsize != 0, IOError, "[read_idx] '", path, "'", what, " has unsupported element type 0x",
           std::hex, int(type), std::dec,
           " (supported: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64)");
  int nd = head[3];
  CF_CHECK(nd >= 1 && nd <= kMaxDims, IOError, "[read_idx] '", path, "'", what, " has ", nd,
           " dimensions; supported: 1 to ", kMaxDims);
  if (dtype == kInt64)
    CF_CHECK(type != 0x0D && type != 0x0E, DTypeError, "[read_idx] '", path, "' holds ",
             type_name(type), " data; read it as float32 or float64, not int64");

  std::vector<unsigned char> dimbuf(size_t(nd) * 4);
  got = gz_read(f, dimbuf.data(), dimbuf.size(), path, gz);
  CF_CHECK(got == dimbuf.size(), IOError, "[read_idx] '", path, "'", what,
           " is truncated inside the header (", nd, " dimension sizes)");
  Shape shape;
  uint64_t count = 1;
  const uint64_t limit = uint64_t(1) << 40;  // elements; guards against absurd headers
  for (int d = 0; d < nd; ++d) {
    uint64_t s = be(&dimbuf[size_t(d) * 4], 4);
    shape.push_back(int64_t(s));
    if (s != 0 && count > limit / s) count = limit + 1;
    else count *= s;
  }
  CF_CHECK(count <= limit, IOError, "[read_idx] '", path, "'", what, " claims shape ",
           shape_str(shape), ", too large to be real");
  uint64_t data_bytes = count * uint64_t(tsize);
  uint64_t header = 4 + 4 * uint64_t(nd);
  if (!gz)
    CF_CHECK(file_size == header + data_bytes, IOError, "[read_idx] '", path, "' ",
             (file_size < header + data_bytes ? "is truncated" : "has trailing data"),
             ": shape ", shape_str(shape), " of ", type_name(type), " needs ", data_bytes,
             " data bytes after the ", header, "-byte header, the file has ",
             file_size - header);

  // Read in chunks so that a lying gzip header cannot make us allocate it all up front.
  std::vector<unsigned char> raw;
  const size_t chunk = size_t(1) << 24;
  while (raw.size() < data_bytes) {
    size_t want = size_t(std::min<uint64_t>(chunk, data_bytes - raw.size()));
    size_t old = raw.size();
    raw.resize(old + want);
    size_t r = gz_read(f, raw.data() + old, want, path, gz);
    raw.resize(old + r);
    if (r < want) break;
  }
  CF_CHECK(raw.size() == data_bytes, IOError, "[read_idx] '", path, "'", what,
           " is truncated: shape ", shape_str(shape), " of ", type_name(type), " needs ",
           data_bytes, " data bytes, found ", raw.size());
  unsigned char extra;
  CF_CHECK(gz_read(f, &extra, 1, path, gz) == 0, IOError, "[read_idx] '", path, "'", what,
           " has trailing data after the ", data_bytes, " data bytes of shape ", shape_str(shape));

  Tensor out = Tensor::empty(shape, dtype);
  int64_t n = int64_t(count);
  if (dtype == kFloat32) convert(raw.data(), n, type, out.data<float>());
  else if (dtype == kFloat64) convert(raw.data(), n, type, out.data<double>());
  else convert(raw.data(), n, type, out.data<int64_t>());
  return out;
}

namespace {
const char* kFiles[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                         "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

std::string find_file(const std::string& dir, const char* name) {
  std::string base = dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
  if (file_exists(base)) return base;
  if (file_exists(base + ".gz")) return base + ".gz";
  return "";
}
}  // namespace

bool fashion_mnist_available(const std::string& dir) {
  for (const char* n : kFiles)
    if (find_file(dir, n).empty()) return false;
  return true;
}

const char* fashion_mnist_class_name(int64_t label) {
  static const char* names[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                  "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  CF_CHECK(label >= 0 && label < 10, IndexError, "[fashion_mnist_class_name] label ", label,
           " is outside 0..9");
  return names[label];
}

FashionMnist load_fashion_mnist(const std::string& dir, bool scale) {
  std::string paths[4];
  for (int i = 0; i < 4; ++i) {
    paths[i] = find_file(dir, kFiles[i]);
    CF_CHECK(!paths[i].empty(), IOError, "[load_fashion_mnist] '", dir, "' has no ", kFiles[i],
             " (nor ", kFiles[i], ".gz); it needs train-images-idx3-ubyte, train-labels-idx1-ubyte, "
             "t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, optionally gzip'd "
             "(Debian: apt-get install dataset-fashion-mnist puts them in ", kFashionMnistDir, ")");
  }
  FashionMnist d;
  d.train_images = read_idx(paths[0], kFloat32);
  d.train_labels = read_idx(paths[1], kInt64);
  d.test_images = read_idx(paths[2], kFloat32);
  d.test_labels = read_idx(paths[3], kInt64);
  for (int i = 0; i < 2; ++i) {
    const Tensor& im = i == 0 ? d.train_images : d.test_images;
    const Tensor& lb = i == 0 ? d.train_labels : d.test_labels;
    CF_CHECK(im.dim() == 3, ShapeError, "[load_fashion_mnist] '", paths[2 * i],
             "' has shape ", shape_str(im.shape()), "; expected (N, rows, cols)");
    CF_CHECK(lb.dim() == 1 && lb.size(0) == im.size(0), ShapeError, "[load_fashion_mnist] '",
             paths[2 * i + 1], "' has shape ", shape_str(lb.shape()), " but '", paths[2 * i],
             "' holds ", im.size(0), " images");
    const int64_t* p = lb.data<int64_t>();
    for (int64_t k = 0; k < lb.numel(); ++k)
      CF_CHECK(p[k] >= 0 && p[k] <= 9, ValueError, "[load_fashion_mnist] '", paths[2 * i + 1],
               "': label ", p[k], " at index ", k, " is outside 0..9");
    if (scale) {
      float* q = im.data<float>();
      for (int64_t k = 0; k < im.numel(); ++k) q[k] /= 255.0f;
    }
  }
  return d;
}

}  // namespace data
}  // namespace cf
