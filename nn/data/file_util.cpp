#include "nn/data/file_util.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <zlib.h>

#include "core/error.h"

namespace cf {
namespace data {
namespace detail {

void write_file_atomic(const std::string& path, const std::string& contents, const char* op) {
  static std::atomic<unsigned> counter{0};
  std::string tmp = str(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) {
      int err = errno;
      throw IOError(str("[", op, "] cannot write '", path, "': cannot create temporary file '",
                        tmp, "': ", std::strerror(err)));
    }
    f.write(contents.data(), std::streamsize(contents.size()));
    f.flush();
    if (!f) {
      f.close();
      std::remove(tmp.c_str());
      throw IOError(str("[", op, "] cannot write '", path, "': write to '", tmp, "' failed"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    throw IOError(str("[", op, "] cannot write '", path, "': rename from '", tmp,
                      "' failed: ", std::strerror(err)));
  }
}

std::string read_file(const std::string& path, const char* op) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    throw IOError(str("[", op, "] cannot open '", path, "': ", std::strerror(err)));
  }
  if (S_ISDIR(st.st_mode)) throw IOError(str("[", op, "] '", path, "' is a directory, not a file"));
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    int err = errno;
    throw IOError(str("[", op, "] cannot open '", path, "': ", std::strerror(err)));
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw IOError(str("[", op, "] read error in '", path, "'"));
  return ss.str();
}

std::string read_file_maybe_gzip(const std::string& path, const char* op) {
  std::string raw = read_file(path, op);
  if (raw.size() < 2 || (unsigned char)raw[0] != 0x1f || (unsigned char)raw[1] != 0x8b) return raw;
  // inflate with gzip framing (windowBits 15 + 16); concatenated members are read in turn.
  std::string out;
  z_stream z{};
  CF_CHECK(inflateInit2(&z, 15 + 16) == Z_OK, IOError, "[", op, "] '", path, "': zlib init failed");
  z.next_in = reinterpret_cast<Bytef*>(raw.data());
  z.avail_in = uInt(raw.size());
  char buf[1 << 16];
  int rc = Z_OK;
  while (true) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof(buf);
    rc = inflate(&z, Z_NO_FLUSH);
    out.append(buf, sizeof(buf) - z.avail_out);
    if (rc == Z_STREAM_END) {
      if (z.avail_in == 0) break;
      inflateReset(&z);  // another gzip member follows
      continue;
    }
    if (rc != Z_OK) break;
    if (z.avail_in == 0 && z.avail_out != 0) {
      rc = Z_BUF_ERROR;  // input ended inside the stream
      break;
    }
  }
  const char* msg = z.msg;
  std::string why = msg ? msg : (rc == Z_BUF_ERROR ? "unexpected end of data" : "error " + std::to_string(rc));
  inflateEnd(&z);
  CF_CHECK(rc == Z_STREAM_END, IOError, "[", op, "] '", path, "': corrupt or truncated gzip stream: ", why);
  return out;
}

}  // namespace detail
}  // namespace data
}  // namespace cf
