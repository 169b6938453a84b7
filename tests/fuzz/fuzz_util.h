#pragma once
// Shared by the libFuzzer targets (tests/fuzz/README.md): the input bytes as a
// file the loaders can open by path, and the rule for what counts as a finding.
//
// The loaders take paths, so each input goes into an anonymous in-memory file
// (memfd) opened through /proc/self/fd/N: a regular file, no disk traffic.
//
// A loader may reject any input, but only with a cf::Error (the typed errors of
// DESIGN.md section 6). Crashes, sanitizer reports, timeouts, allocations above
// -malloc_limit_mb and any other exception (std::bad_alloc, std::out_of_range,
// nlohmann's errors escaping) are findings: the target aborts on the last.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "core/error.h"

namespace cf::fuzz {

class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = ::memfd_create("cf-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) std::abort();
    size_t done = 0;
    while (done < size) {
      const ssize_t w = ::write(fd_, data + done, size - done);
      if (w <= 0) std::abort();
      done += size_t(w);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Runs f; a cf::Error is an accepted rejection, anything else aborts.
template <typename F>
void expect_cf_errors_only(F&& f) {
  try {
    f();
  } catch (const cf::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cf-fuzz: escaped non-cf exception: %s\n", e.what());
    std::abort();
  }
}

}  // namespace cf::fuzz
