#pragma once
#include <cstdint>
#include <ostream>
#include <string>

namespace cf {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
  // Parse "cpu", "cuda", "cuda:1"; throws cf::ValueError otherwise.
  static Device parse(const std::string& s);
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

// True when this build was compiled with the CUDA backend.
bool cuda_built();

}  // namespace cf
