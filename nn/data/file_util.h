#pragma once
// Small file helpers shared by the readers and savers in nn/data (internal).
#include <string>

namespace cf {
namespace data {
namespace detail {

// Write `contents` to `path` atomically: a temporary file in the same folder, then
// rename. Throws IOError starting with "[op]" and naming the file.
void write_file_atomic(const std::string& path, const std::string& contents, const char* op);
// The whole file; IOError naming it when it cannot be opened or read.
std::string read_file(const std::string& path, const char* op);
// The whole file, decompressed when it is gzip (recognised by its 1f 8b magic);
// IOError naming it when it cannot be read or the stream is corrupt or truncated.
std::string read_file_maybe_gzip(const std::string& path, const char* op);

}  // namespace detail
}  // namespace data
}  // namespace cf
