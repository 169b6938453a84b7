#pragma once
// Counter-based Philox4x32-10 RNG (Salmon et al., SC'11). Element i of a random
// op draws from philox(key = seed, counter = offset + i), so the stream depends
// only on (seed, offset, i): identical on CPU and CUDA and in any thread order.
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#if defined(__CUDACC__)
#define CF_HOST_DEVICE __host__ __device__
#else
#define CF_HOST_DEVICE
#endif

namespace cf {

struct PhiloxOut {
  uint32_t v[4];
};

CF_HOST_DEVICE inline void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

CF_HOST_DEVICE inline PhiloxOut philox4x32_10(uint64_t seed, uint64_t counter) {
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c0, hi0, lo0);
    philox_mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in [0, 1): 24 random bits for float, 53 for double.
CF_HOST_DEVICE inline float philox_uniform_f(const PhiloxOut& r) {
  return float(r.v[0] >> 8) * (1.0f / 16777216.0f);
}
CF_HOST_DEVICE inline double philox_uniform_d(const PhiloxOut& r) {
  uint64_t bits = (uint64_t(r.v[0]) << 21) ^ uint64_t(r.v[1] >> 11);
  return double(bits & ((uint64_t(1) << 53) - 1)) * (1.0 / 9007199254740992.0);
}
// Standard normal by Box-Muller on two 32-bit words (computed in double).
CF_HOST_DEVICE inline double philox_normal(const PhiloxOut& r) {
  double u1 = (double(r.v[2]) + 1.0) * (1.0 / 4294967296.0);  // (0, 1]
  double u2 = double(r.v[3]) * (1.0 / 4294967296.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Where a CUDA graph replay moves a captured draw (core/cuda_graph.h): `rebase`, null outside a
// capture (and always on the CPU), points to the device pair (seed, counter shift) of the generator
// the draw reserved its counters from, rewritten before each replay; a kernel applies it once,
// before its first draw.
CF_HOST_DEVICE inline void philox_rebase(uint64_t& seed, uint64_t& counter0, const uint64_t* rebase) {
  if (rebase) {
    seed = rebase[0];
    counter0 += rebase[1];
  }
}

// The same, read where a draw happens (a kernel that draws few times per thread).
CF_HOST_DEVICE inline uint64_t philox_seed_at(uint64_t seed, const uint64_t* rebase) {
  return rebase ? rebase[0] : seed;
}
CF_HOST_DEVICE inline uint64_t philox_counter0_at(uint64_t counter0, const uint64_t* rebase) {
  return rebase ? counter0 + rebase[1] : counter0;
}

// A seed and a running offset; each random op reserves as many counters as it
// draws elements, so successive calls never reuse a counter.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  // Expires when this generator is destroyed (a CUDA graph that draws from it checks before a replay).
  std::weak_ptr<const bool> lifetime() const { return alive_; }
  void manual_seed(uint64_t seed) {
    std::lock_guard<std::mutex> l(m_);
    seed_ = seed;
    offset_ = 0;
  }
  // Locked like the writers: reading the state while another thread reserves
  // counters is otherwise a data race (ThreadSanitizer, issue 27).
  uint64_t seed() const {
    std::lock_guard<std::mutex> l(m_);
    return seed_;
  }
  uint64_t offset() const {
    std::lock_guard<std::mutex> l(m_);
    return offset_;
  }
  // (seed, offset) read under one lock: a consistent state while other threads draw.
  std::pair<uint64_t, uint64_t> state() const {
    std::lock_guard<std::mutex> l(m_);
    return {seed_, offset_};
  }
  // Restore a state saved from seed() and offset() (training checkpoints).
  void set_state(uint64_t seed, uint64_t offset) {
    std::lock_guard<std::mutex> l(m_);
    seed_ = seed;
    offset_ = offset;
  }
  // The seed and the first counter of a fresh block of n counters, under one lock.
  std::pair<uint64_t, uint64_t> take(uint64_t n) {
    std::lock_guard<std::mutex> l(m_);
    const uint64_t o = offset_;
    offset_ += n;
    return {seed_, o};
  }
  // Returns the first counter of a fresh block of n counters.
  uint64_t reserve(uint64_t n) {
    std::lock_guard<std::mutex> l(m_);
    uint64_t o = offset_;
    offset_ += n;
    return o;
  }

 private:
  mutable std::mutex m_;
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
  std::shared_ptr<const bool> alive_ = std::make_shared<const bool>(true);
};

// Process-wide generator used when an op is given none.
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace cf
