#pragma once
// File IO shared by every reader and writer in cf (safetensors, checkpoints,
// .npy, tokenizers, app outputs), so they all get the same guarantees:
//
// - writes are atomic: the bytes go to ".NAME.tmp-PID-N" in the target's folder,
//   which is fsync'ed and renamed over NAME (then the folder is fsync'ed), so a
//   crash or a full disk never leaves a half file and an existing NAME survives a
//   failed write. Errors say why ("No space left on device").
// - temporaries of NAME left by a process that no longer runs (a SIGKILL during
//   a write) are removed when NAME is written again.
// - reads open without blocking and accept only regular files, so a FIFO or a
//   device named like the input is an error instead of a hang.
//
// Every error is a cf::IOError starting with "[op] " and naming the file.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace cf {
namespace io {

// Streams bytes into the temporary; commit() makes them the file. Destroying an
// uncommitted writer (an exception on the way) removes the temporary. A symlinked path
// writes its target (the link stays); a path naming a device, FIFO, socket or directory
// is an IOError (renaming over it would replace it by a plain file).
class AtomicWriter {
 public:
  AtomicWriter(std::string path, const char* op);
  ~AtomicWriter();
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;

  void write(const void* data, size_t n);
  // fsync, close, rename over the target, fsync the folder.
  void commit();
  const std::string& temp_path() const { return tmp_; }

 private:
  [[noreturn]] void fail(const std::string& what, int err);
  std::string path_, target_, tmp_;  // target_: path_ with its symlinks followed
  const char* op_;
  int fd_ = -1;
  bool committed_ = false;
};

// The whole of `contents` to `path`, atomically.
void write_file_atomic(const std::string& path, const std::string& contents, const char* op);

// ".NAME.tmp-PID-N" in path's folder; N counts within the process.
std::string temp_path_for(const std::string& path);
// Removes the temporaries of `path` whose writer process is gone; returns how
// many. Temporaries of live processes (a concurrent writer) are left alone.
int remove_stale_temps(const std::string& path);

// Opens a regular file for reading (O_RDONLY | O_CLOEXEC, never blocking on a
// FIFO) and returns the fd and its size. IOError "[op] cannot open 'PATH': no such
// file" (or the system's reason), "[op] 'PATH' is not a regular file (it is a FIFO)".
struct ReadableFile {
  int fd = -1;
  uint64_t size = 0;
};
ReadableFile open_for_read(const std::string& path, const char* op);
// open_for_read, close: the size of a readable regular file, for readers that
// then open it with their own stream (std::ifstream, gzopen).
uint64_t check_readable(const std::string& path, const char* op);
// The whole file (via open_for_read).
std::string read_file(const std::string& path, const char* op);
// The whole file, decompressed when it is gzip (recognised by its 1f 8b magic);
// "[op] 'PATH': corrupt or truncated gzip stream: <zlib's reason>" when it is broken.
std::string read_file_maybe_gzip(const std::string& path, const char* op);

// Calls f(line, row) for each line of a text file's contents: split at '\n', a
// trailing '\r' dropped (CRLF files), lines numbered from 1 (for error messages);
// a last line without '\n' counts, an empty text has no lines.
void for_each_line(const std::string& text, const std::function<void(int64_t line, std::string_view row)>& f);

}  // namespace io
}  // namespace cf
