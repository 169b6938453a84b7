#include "nn/data/file_util.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/stat.h>

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

}  // namespace detail
}  // namespace data
}  // namespace cf
