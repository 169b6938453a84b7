#include "core/io.h"

#include <zlib.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace cf {
namespace io {
namespace {

std::string folder_of(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

std::string temp_prefix(const std::string& path) {
  return "." + std::filesystem::path(path).filename().string() + ".tmp-";
}

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "it is a directory";
  if (S_ISFIFO(m)) return "it is a FIFO";
  if (S_ISCHR(m)) return "it is a character device";
  if (S_ISBLK(m)) return "it is a block device";
  if (S_ISSOCK(m)) return "it is a socket";
  return "it is not a plain file";
}

// The file a write to `path` lands in: `path`, or what its symlinks point to (followed, so the
// link survives, as writing through it would leave it; a relative link is taken from its folder).
std::string resolve_links(const std::string& path) {
  std::string p = path;
  for (int hop = 0; hop < 40; ++hop) {  // SYMLOOP_MAX's usual value: a cycle ends as ELOOP would
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    std::string target(size_t(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
    const ssize_t n = ::readlink(p.c_str(), target.data(), target.size());
    if (n < 0) return p;  // the open below reports it
    target.resize(size_t(n));
    p = target.empty() || target[0] == '/' ? target : (std::filesystem::path(folder_of(p)) / target).string();
  }
  return p;
}

}  // namespace

std::string temp_path_for(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  const std::string name =
      temp_prefix(path) + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
  return (std::filesystem::path(path).parent_path() / name).string();
}

int remove_stale_temps(const std::string& path) {
  const std::string dir = folder_of(path), prefix = temp_prefix(path);
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;  // the write itself will report an unusable folder
  int removed = 0;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    // ".NAME.tmp-PID-N": only digits, one '-', digits.
    const std::string rest = name.substr(prefix.size());
    const size_t dash = rest.find('-');
    if (dash == 0 || dash == std::string::npos || dash > 9) continue;
    const std::string pid_text = rest.substr(0, dash), n_text = rest.substr(dash + 1);
    auto digits = [](const std::string& s) {
      return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (!digits(pid_text) || !digits(n_text)) continue;
    const pid_t pid = pid_t(std::stol(pid_text));
    // A live process (ours, or a concurrent writer) may still be writing it. EPERM
    // means it exists under another user: leave it too.
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (::unlink((dir + "/" + name).c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

AtomicWriter::AtomicWriter(std::string path, const char* op) : path_(std::move(path)), op_(op) {
  if (path_.empty()) {  // (the rename of the temporary failed with ENOENT, naming '' as the file)
    committed_ = true;  // nothing was created
    throw IOError(str("[", op_, "] the file name is empty"));
  }
  // The temporary is renamed over the target, which would replace a device, a FIFO or a socket by a
  // plain file (--out /dev/null would have become one): those are refused; a symlink is followed.
  target_ = resolve_links(path_);
  struct stat st {};
  const bool exists = ::stat(target_.c_str(), &st) == 0;
  if (!exists && errno == ELOOP) {  // a cycle of links, or too long a chain: renaming would replace the link
    committed_ = true;  // nothing was created
    throw IOError(str("[", op_, "] cannot write '", path_, "': ", std::strerror(ELOOP)));
  }
  if (exists && !S_ISREG(st.st_mode)) {
    committed_ = true;  // nothing was created
    throw IOError(str("[", op_, "] cannot write '", path_, "': ", kind_of(st.st_mode),
                      ", not a regular file (cf writes a temporary file and renames it over the target)"));
  }
  remove_stale_temps(target_);
  tmp_ = temp_path_for(target_);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    committed_ = true;  // nothing was created: nothing to remove
    throw IOError(str("[", op_, "] ", path_, ": cannot create temporary file '", tmp_,
                      "': ", std::strerror(err)));
  }
  // A file written over keeps its permissions (the temporary's 0644 made a private checkpoint readable by
  // all at its next save). Best effort: a failure leaves the temporary's mode.
  // (Permission bits and the sticky bit only: a setuid or setgid bit is not carried to new contents.)
  if (exists) (void)::fchmod(fd_, st.st_mode & 01777);
}

AtomicWriter::~AtomicWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicWriter::fail(const std::string& what, int err) {
  throw IOError(str("[", op_, "] ", path_, ": ", what, ": ", std::strerror(err)));
}

void AtomicWriter::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(str("writing the temporary file '", tmp_, "' failed"), errno);
    }
    p += w;
    n -= size_t(w);
  }
}

void AtomicWriter::commit() {
  // A full disk often shows only here: ext4 and NFS may accept write() into the
  // page cache and refuse the blocks at fsync or close.
  if (::fsync(fd_) != 0) fail(str("fsync of the temporary file '", tmp_, "' failed"), errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(str("closing the temporary file '", tmp_, "' failed"), errno);
  if (::rename(tmp_.c_str(), target_.c_str()) != 0)
    fail(str("cannot rename the temporary file '", tmp_, "' over it"), errno);
  committed_ = true;
  // Make the rename itself durable; a failure here does not undo a complete file.
  const int dfd = ::open(folder_of(target_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, const std::string& contents, const char* op) {
  AtomicWriter w(path, op);
  w.write(contents.data(), contents.size());
  w.commit();
}

ReadableFile open_for_read(const std::string& path, const char* op) {
  // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer forever.
  // It does not affect reads of regular files, the only kind accepted below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) throw IOError(str("[", op, "] cannot open '", path, "': no such file"));
    throw IOError(str("[", op, "] cannot open '", path, "': ", std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw IOError(str("[", op, "] cannot stat '", path, "': ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IOError(str("[", op, "] '", path, "' is not a regular file (", kind_of(st.st_mode), ")"));
  }
  return {fd, uint64_t(st.st_size)};
}

uint64_t check_readable(const std::string& path, const char* op) {
  const ReadableFile f = open_for_read(path, op);
  ::close(f.fd);
  return f.size;
}

std::string read_file(const std::string& path, const char* op) {
  ReadableFile f = open_for_read(path, op);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(f.fd, buf, sizeof buf);
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(f.fd);
      throw IOError(str("[", op, "] read error in '", path, "': ", std::strerror(err)));
    }
    if (r == 0) break;
    out.append(buf, size_t(r));
  }
  ::close(f.fd);
  return out;
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

void for_each_line(const std::string& text, const std::function<void(int64_t line, std::string_view row)>& f) {
  const std::string_view all(text);
  size_t pos = 0;
  int64_t line = 0;
  while (pos < all.size()) {
    size_t end = all.find('\n', pos);
    if (end == std::string_view::npos) end = all.size();
    size_t stop = end;
    if (stop > pos && all[stop - 1] == '\r') --stop;
    f(++line, all.substr(pos, stop - pos));
    pos = end + 1;
  }
}

}  // namespace io
}  // namespace cf
