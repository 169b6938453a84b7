#pragma once
// Helpers for the data tests: a temporary folder removed at scope exit.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>

namespace cf::test {

struct DataTempDir {
  std::filesystem::path path;
  DataTempDir() {
    static std::atomic<int> n{0};
    path = std::filesystem::temp_directory_path() /
           ("cf_test_data_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~DataTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::string str() const { return path.string(); }
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

}  // namespace cf::test
