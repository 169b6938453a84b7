#include "core/serialization.h"

#include "core/io.h"
#include "core/json.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

// The buffer and the header length are little-endian on disk; cf copies bytes
// straight between the file and tensor memory, so it needs a little-endian host.
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "cf serialization (safetensors) assumes a little-endian host");
#endif

namespace cf {
namespace {

using ojson = nlohmann::ordered_json;

// Runtime twin of the static_assert above, for compilers without __BYTE_ORDER__.
void check_little_endian(const char* op) {
  const uint16_t probe = 1;
  unsigned char first = 0;
  std::memcpy(&first, &probe, 1);
  CF_CHECK(first == 1, NotImplementedError, "[", op,
           "] safetensors files are little-endian; this host is big-endian, which cf does not support");
}

bool parse_dtype(const std::string& s, DType& out) {
  if (s == "F32") out = kFloat32;
  else if (s == "F64") out = kFloat64;
  else if (s == "I64") out = kInt64;
  else if (s == "BOOL") out = kBool;
  else if (s == "BF16") out = kBFloat16;
  else if (s == "F16") out = kFloat16;
  else return false;
  return true;
}

std::string errno_text(int err) { return std::strerror(err); }

// ---- writing ----

// Write the tensor's elements in logical order.
void write_tensor(io::AtomicWriter& w, const Tensor& t) {
  size_t nbytes = t.nbytes();
  if (nbytes == 0) return;
  if (t.is_contiguous()) {
    w.write(t.raw_data(), nbytes);
    return;
  }
  // Gather in chunks of whole elements so a large strided tensor needs no full copy.
  const size_t item = dtype_size(t.dtype());
  const char* base = static_cast<const char*>(t.impl_ptr()->storage->data);
  std::vector<char> buf;
  const size_t chunk = size_t(1) << 20;
  buf.reserve(std::min(nbytes, chunk));
  for_each_offset(t.shape(), t.strides(), t.offset(), [&](int64_t o) {
    const char* src = base + o * int64_t(item);
    buf.insert(buf.end(), src, src + item);
    if (buf.size() >= chunk) {
      w.write(buf.data(), buf.size());
      buf.clear();
    }
  });
  if (!buf.empty()) w.write(buf.data(), buf.size());
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "F32";
    case DType::Float64: return "F64";
    case DType::Int64: return "I64";
    case DType::Bool: return "BOOL";
    case DType::BFloat16: return "BF16";
    case DType::Float16: return "F16";
  }
  return "?";
}

const Tensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& e : tensors)
    if (e.first == name) return &e.second;
  return nullptr;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const char* op = "save_safetensors";
  check_little_endian(op);
  CF_CHECK(!path.empty(), ValueError, "[save_safetensors] empty file path");

  // ---- validate everything before touching the disk ----
  std::set<std::string> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string& name = tensors[i].first;
    const Tensor& t = tensors[i].second;
    CF_CHECK(!name.empty(), ValueError, "[save_safetensors] ", path, ": tensor #", i,
             " has an empty name");
    CF_CHECK(name != "__metadata__", ValueError, "[save_safetensors] ", path,
             ": '__metadata__' is reserved and cannot name a tensor");
    CF_CHECK(seen.insert(name).second, ValueError, "[save_safetensors] ", path,
             ": duplicate tensor name '", name, "'");
    CF_CHECK(t.defined(), ValueError, "[save_safetensors] ", path, ": tensor '", name,
             "' is undefined");
    CF_CHECK(t.device().is_cpu(), DeviceError, "[save_safetensors] ", path, ": tensor '", name,
             "' is ", t.describe(), "; move it to the CPU first");
  }

  // ---- header ----
  ojson header = ojson::object();
  if (!metadata.empty()) {
    ojson meta = ojson::object();
    for (const auto& kv : metadata) meta[kv.first] = kv.second;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const auto& e : tensors) {
    const Tensor& t = e.second;
    ojson entry = ojson::object();
    entry["dtype"] = safetensors_dtype_name(t.dtype());
    ojson shape = ojson::array();
    for (int64_t d = 0; d < t.dim(); ++d) shape.push_back(t.size(d));
    entry["shape"] = std::move(shape);
    uint64_t end = offset + uint64_t(t.nbytes());
    entry["data_offsets"] = ojson::array({offset, end});
    offset = end;
    header[e.first] = std::move(entry);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& ex) {
    throw ValueError(str("[save_safetensors] ", path,
                         ": a tensor name or metadata string is not valid UTF-8 (", ex.what(), ")"));
  }
  // Pad the header with spaces so the buffer starts 8-byte aligned, as the reference
  // implementation does.
  while (text.size() % 8 != 0) text.push_back(' ');
  unsigned char len_bytes[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(n >> (8 * i));

  // ---- write the temporary, fsync, rename (core/io.h) ----
  io::AtomicWriter w(path, "save_safetensors");
  w.write(len_bytes, 8);
  w.write(text.data(), text.size());
  for (const auto& e : tensors) write_tensor(w, e.second);
  w.commit();
}

// ---- reading ----

namespace {

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
  size_t header_index;
};

class ReadFile {
 public:
  explicit ReadFile(int fd) : fd_(fd) {}
  ~ReadFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;
  // Read exactly n bytes at offset; false on a short read or an error.
  bool read_at(void* dst, size_t n, uint64_t off, int& err) const {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      ssize_t r = ::pread(fd_, p, std::min<size_t>(n, size_t(1) << 30), off_t(off));
      if (r < 0) {
        if (errno == EINTR) continue;
        err = errno;
        return false;
      }
      if (r == 0) {
        err = 0;
        return false;
      }
      p += r;
      n -= size_t(r);
      off += uint64_t(r);
    }
    return true;
  }

 private:
  int fd_;
};

std::string json_type_of(const ojson& j) {
  if (j.is_number_float()) return "a float";
  if (j.is_number()) return "an integer";
  if (j.is_string()) return "a string";
  if (j.is_boolean()) return "a boolean";
  if (j.is_array()) return "an array";
  if (j.is_object()) return "an object";
  return "null";
}

}  // namespace

SafetensorsFile load_safetensors(const std::string& path) {
  check_little_endian("load_safetensors");
  auto fail = [&](const auto&... a) { return IOError(str("[load_safetensors] ", path, ": ", a...)); };

  // Never blocks (a FIFO named like the file is an error, not a hang); regular files only.
  const io::ReadableFile opened = io::open_for_read(path, "load_safetensors");
  ReadFile file(opened.fd);
  const uint64_t file_size = opened.size;
  int err = 0;

  // ---- header length and header ----
  if (file_size < 8)
    throw fail("file is ", file_size, " bytes, shorter than the 8-byte header length");
  unsigned char len_bytes[8];
  if (!file.read_at(len_bytes, 8, 0, err)) throw fail("cannot read the header length: ", errno_text(err));
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t(len_bytes[i]) << (8 * i);
  if (header_len > file_size - 8)
    throw fail("header length ", header_len, " runs past the end of the file (", file_size,
               " bytes, so at most ", file_size - 8, ")");
  std::string text(size_t(header_len), '\0');
  if (header_len > 0 && !file.read_at(&text[0], text.size(), 8, err))
    throw fail("cannot read the header: ", err ? errno_text(err) : "file shrank while reading");
  const uint64_t data_start = 8 + header_len;
  const uint64_t buffer_size = file_size - data_start;

  ojson header;
  try {
    header = io::parse_ordered_json(text);
  } catch (const io::JsonStructureError& ex) {
    throw fail("header is not valid: ", ex.what());
  } catch (const nlohmann::json::parse_error& ex) {
    throw fail("header is not valid JSON (at header byte ", ex.byte, "): ", ex.what());
  } catch (const nlohmann::json::exception& ex) {
    // A number beyond double's range (1e400) is out_of_range 406, not a
    // parse_error: it escaped as a non-cf exception (found by fuzz_safetensors).
    throw fail("header is not valid JSON: ", ex.what());
  }
  if (!header.is_object()) throw fail("header is ", json_type_of(header), ", not a JSON object");

  // ---- entries and metadata ----
  SafetensorsFile out;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const ojson& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw fail("'__metadata__' is ", json_type_of(v), ", not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          throw fail("metadata value '", m.key(), "' is ", json_type_of(m.value()),
                     ", not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) throw fail("entry '", name, "' is ", json_type_of(v), ", not an object");
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!v.contains(field)) throw fail("entry '", name, "' has no '", field, "'");
    Entry e;
    e.name = name;
    e.header_index = entries.size();

    const ojson& dt = v["dtype"];
    if (!dt.is_string()) throw fail("entry '", name, "': dtype is ", json_type_of(dt), ", not a string");
    if (!parse_dtype(dt.get<std::string>(), e.dtype))
      throw fail("entry '", name, "': unsupported dtype '", dt.get<std::string>(),
                 "' (cf reads F32, F64, I64, BOOL, BF16, F16)");

    const ojson& sh = v["shape"];
    if (!sh.is_array()) throw fail("entry '", name, "': shape is ", json_type_of(sh), ", not an array");
    if (sh.size() > size_t(kMaxDims))
      throw fail("entry '", name, "': shape has ", sh.size(), " dimensions; cf supports at most ",
                 kMaxDims);
    uint64_t numel = 1;
    bool overflow = false;
    // The strides multiply the non-zero sizes, so those must fit int64 even when a zero size makes the
    // tensor empty ((0, 2^62, 2^62) failed later in Tensor::empty with a ShapeError naming no file).
    uint64_t nonzero_product = 1;
    bool strides_overflow = false;
    for (const auto& d : sh) {
      if (!d.is_number_integer())
        throw fail("entry '", name, "': shape holds ", json_type_of(d), " (", d.dump(),
                   "), not an integer");
      if (d.is_number_unsigned() ? d.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())
                                 : d.get<int64_t>() < 0)
        throw fail("entry '", name, "': shape ", sh.dump(), " has a ",
                   d.is_number_unsigned() ? "too large" : "negative", " dimension");
      int64_t di = d.get<int64_t>();
      e.shape.push_back(di);
      if (di != 0 && numel > std::numeric_limits<uint64_t>::max() / uint64_t(di)) overflow = true;
      numel *= uint64_t(di);
      if (di != 0) {
        if (nonzero_product > uint64_t(std::numeric_limits<int64_t>::max()) / uint64_t(di)) strides_overflow = true;
        nonzero_product *= uint64_t(di);
      }
    }
    if (strides_overflow)
      throw fail("entry '", name, "': shape ", sh.dump(),
                 " has sizes whose product exceeds int64 (its strides cannot be represented)");

    const ojson& offs = v["data_offsets"];
    if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_integer() ||
        !offs[1].is_number_integer())
      throw fail("entry '", name, "': data_offsets must be an array of two integers, got ",
                 offs.dump());
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned())
      throw fail("entry '", name, "': data_offsets ", offs.dump(), " are negative");
    e.begin = offs[0].get<uint64_t>();
    e.end = offs[1].get<uint64_t>();
    if (e.end < e.begin)
      throw fail("entry '", name, "': data_offsets ", offs.dump(), " end before they begin");
    if (e.end > buffer_size)
      throw fail("entry '", name, "': data_offsets ", offs.dump(), " run past the data buffer (",
                 buffer_size, " bytes)");
    const uint64_t item = dtype_size(e.dtype);
    if (overflow || numel > std::numeric_limits<uint64_t>::max() / item ||
        numel * item != e.end - e.begin)
      throw fail("entry '", name, "': ", e.end - e.begin, " bytes for shape ", shape_str(e.shape),
                 " of ", dt.get<std::string>(), ", which needs ",
                 overflow ? std::string("more than 2^64") : std::to_string(numel * item));
    entries.push_back(std::move(e));
  }

  // ---- the entries must tile the buffer exactly ----
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < pos)
      throw fail("entries '", prev->name, "' [", prev->begin, ", ", prev->end, ") and '", e.name,
                 "' [", e.begin, ", ", e.end, ") overlap");
    if (e.begin > pos)
      throw fail("bytes [", pos, ", ", e.begin, ") of the data buffer belong to no tensor (a hole before '",
                 e.name, "')");
    pos = e.end;
    if (e.end > e.begin || !prev) prev = &e;
  }
  if (pos < buffer_size)
    throw fail(buffer_size - pos, " bytes of trailing data after the last tensor (buffer is ",
               buffer_size, " bytes, tensors cover ", pos, ")");

  // ---- data ----
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    size_t n = size_t(e.end - e.begin);
    if (n > 0 && !file.read_at(t.raw_data(), n, data_start + e.begin, err))
      throw fail("cannot read the data of '", e.name, "': ", err ? errno_text(err) : "file shrank while reading");
    if (e.dtype == kBool) {
      const unsigned char* b = static_cast<const unsigned char*>(t.raw_data());
      for (size_t i = 0; i < n; ++i)
        if (b[i] > 1)
          throw fail("BOOL tensor '", e.name, "' holds byte ", int(b[i]), " at element ", i,
                     "; expected 0 or 1");
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace cf
