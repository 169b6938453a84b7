#pragma once
// Per-thread scratch vectors of the CPU GEMM paths (the 16-bit converting path's float32 blocks, the bfloat16
// kernels' packed operands): kept from call to call, so that a model's many products allocate nothing, but let
// go of after a call that grew one past kKeptScratchBytes, so that one large product does not hold its buffers
// for the thread's lifetime (the converting path's three float32 blocks of an 8192^3 float16 product are
// 768 MB, and every OpenMP thread that ran a part keeps its own).
#include <cstddef>
#include <tuple>
#include <vector>

namespace cf::kernels {

// Per vector: a 4096 x 4096 float32 block is kept (releasing and faulting in 3 x 64 MB each call cost 6% of a
// 4096^3 float16 product on one thread); those of 8192^3 (256 MB each) go, at about 5% of that product's time.
constexpr size_t kKeptScratchBytes = size_t(64) << 20;

// x sized to n scratch elements: a vector that must grow is freed first and allocated at exactly n (vector growth
// would double the capacity: 36 MB then 64 MB made 72 MB, past the limit below, freed after every call of such a
// pair; and it would copy the old scratch over). Contents are unspecified, as scratch.
template <typename T>
void scratch_resize(std::vector<T>& x, size_t n) {
  if (n > x.capacity()) std::vector<T>().swap(x);
  x.resize(n);
}

// On scope exit (an exception leaving the GEMM included), frees each of the given vectors whose capacity (what a
// call needed, sized by scratch_resize) is beyond kKeptScratchBytes; smaller ones keep their memory for the next
// call. Only frees: nothing in a destructor may allocate (an allocation failing there would end the process).
template <typename... V>
class ScratchTrim {
 public:
  explicit ScratchTrim(V&... v) : v_(v...) {}
  ~ScratchTrim() {
    std::apply([](auto&... x) { (trim(x), ...); }, v_);
  }
  ScratchTrim(const ScratchTrim&) = delete;
  ScratchTrim& operator=(const ScratchTrim&) = delete;

 private:
  template <typename T>
  static void trim(std::vector<T>& x) noexcept {
    if (x.capacity() * sizeof(T) > kKeptScratchBytes) std::vector<T>().swap(x);
  }
  std::tuple<V&...> v_;
};
template <typename... V>
ScratchTrim(V&...) -> ScratchTrim<V...>;

}  // namespace cf::kernels
