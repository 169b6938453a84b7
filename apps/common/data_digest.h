#pragma once
// A digest of the data a run trains and evaluates on, for the apps' checkpoint signatures: a data
// file edited in place (labels swapped, texts added) or a vocabulary that changed with it must not
// resume, or be reused as finished, from a checkpoint trained on the old contents (the signatures
// named the file only). Not cryptographic: it tells versions of the data apart.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cf.h"

namespace cf::apps {

class DataDigest {
 public:
  // 64-bit FNV-1a over 8-byte words (then the tail bytes): about 1 ns per word.
  DataDigest& bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      h_ = (h_ ^ w) * kPrime;
    }
    for (; i < n; ++i) h_ = (h_ ^ p[i]) * kPrime;
    return count(n);  // (so that a split between two calls is a different input)
  }
  template <typename T>
  DataDigest& values(const std::vector<T>& v) {
    return bytes(v.data(), v.size() * sizeof(T));
  }
  DataDigest& text(const std::string& s) { return bytes(s.data(), s.size()); }
  // Shape, dtype and values of t (on any device: read through a contiguous CPU copy).
  DataDigest& tensor(const Tensor& t) {
    for (int64_t s : t.shape()) count(uint64_t(s));
    count(uint64_t(t.dtype()));
    const Tensor c = cf::contiguous(t.device().is_cpu() ? t : t.to(Device::cpu()));
    return bytes(c.raw_data(), size_t(c.nbytes()));
  }
  // 16 hex digits, mixed once more (splitmix64's finaliser) so near inputs look unrelated.
  std::string hex() const {
    uint64_t z = h_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(z));
    return buf;
  }

 private:
  static constexpr uint64_t kPrime = 0x100000001b3ull;
  DataDigest& count(uint64_t n) {
    h_ = (h_ ^ n) * kPrime;
    return *this;
  }
  uint64_t h_ = 0xcbf29ce484222325ull;
};

}  // namespace cf::apps
