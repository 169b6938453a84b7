// CPU sort/top-k: one line along the axis at a time, lines split over threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/common/parallel.h"
#include "kernels/sort/sort.h"

namespace cf::kernels {

namespace {

// Floating types whose values fit an order-preserving 32-bit code (float32 and the
// 16-bit types, which widen to float exactly).
template <typename T>
constexpr bool kCodedSort = std::is_same_v<T, float> || std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>;

// a < b with NaN above everything (NaNs equal among themselves).
template <typename T>
inline bool value_less(T a, T b) {
  if constexpr (std::is_floating_point_v<T> || kCodedSort<T>) {
    if (std::isnan(double(a))) return false;
    if (std::isnan(double(b))) return true;
  }
  return a < b;
}

// value_less as an unsigned code: a larger value gets a larger code, every NaN the
// largest one, -0 and +0 the same one (value_less calls them equal).
inline uint32_t order_code(float v) {
  if (std::isnan(v)) return 0xFFFFFFFFu;
  if (v == 0.0f) v = 0.0f;
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The first k of the order `before` in [first, last): the whole range sorted when k
// is its length, else a selection (O(len)) and a sort of the k selected (O(k log k)),
// cheaper than a heap when many elements enter it (rising scores along a line).
template <typename It, typename Less>
void sort_head(It first, It last, int64_t k, Less before) {
  if (k < last - first) std::nth_element(first, first + (k - 1), last, before);
  std::sort(first, first + k, before);
}

// sort_head on distinct 64-bit keys, the first k sorted into keys[0, k). When k is
// well below the line's length, a strided sample's order statistic of expected rank
// about 4k in the line filters it first (branch-free), and the selection runs on the
// candidates; if the sample misled (fewer than k passed), on the whole line. Distinct
// keys make the answer the same either way.
void head_of_keys(std::vector<uint64_t>& keys, std::vector<uint64_t>& cand, int64_t k) {
  constexpr int64_t kSample = 64;
  const int64_t len = int64_t(keys.size());
  if (8 * k <= len && len >= 4 * kSample) {
    uint64_t sample[kSample];
    const int64_t stride = len / kSample;
    for (int64_t i = 0; i < kSample; ++i) sample[i] = keys[size_t(i * stride)];
    const int64_t r = (4 * k * kSample + len - 1) / len;  // <= kSample / 2 here
    std::nth_element(sample, sample + r, sample + kSample);
    const uint64_t pivot = sample[r];
    int64_t m = 0;
    for (uint64_t key : keys) {
      cand[size_t(m)] = key;
      m += key <= pivot;
    }
    if (m >= k) {
      sort_head(cand.begin(), cand.begin() + m, k, std::less<uint64_t>());
      std::copy(cand.begin(), cand.begin() + k, keys.begin());
      return;
    }
  }
  sort_head(keys.begin(), keys.end(), k, std::less<uint64_t>());
}

template <typename T>
void sort_typed(const Tensor& x, int64_t axis, int64_t k, bool descending, const Tensor& values,
                const Tensor& indices) {
  const int64_t len = x.shape()[size_t(axis)];
  if (k == 0 || x.numel() == 0) return;
  const int64_t lines = x.numel() / len;
  // Non-axis dimensions, shared by x and the outputs (which have length k on `axis`).
  Shape sizes, xst, vst, ist;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d == axis) continue;
    sizes.push_back(x.shape()[size_t(d)]);
    xst.push_back(x.strides()[size_t(d)]);
    vst.push_back(values.defined() ? values.strides()[size_t(d)] : 0);
    ist.push_back(indices.strides()[size_t(d)]);
  }
  const int64_t x_as = x.strides()[size_t(axis)];
  const int64_t v_as = values.defined() ? values.strides()[size_t(axis)] : 0;
  const int64_t i_as = indices.strides()[size_t(axis)];
  const T* xd = static_cast<const T*>(x.impl_ptr()->storage->data) + x.offset();
  T* vd = values.defined() ? values.data<T>() : nullptr;
  int64_t* id = indices.data<int64_t>();

  // Each line's element offsets: the non-axis coordinates of `line` (x and the
  // outputs share them; the outputs have length k on `axis`).
  auto offsets = [&](int64_t line, int64_t& xo, int64_t& vo, int64_t& io) {
    xo = vo = io = 0;
    for (size_t d = sizes.size(); d-- > 0;) {
      int64_t c = line % sizes[d];
      line /= sizes[d];
      xo += c * xst[d];
      vo += c * vst[d];
      io += c * ist[d];
    }
  };
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / len);

  if constexpr (kCodedSort<T>) {
    if (len <= int64_t(std::numeric_limits<uint32_t>::max())) {
      // One 64-bit key per element, (value code, position), compared as integers: the
      // order of `before` below without its branches (the hot loop of improved
      // clustered attention's top-k). Descending flips the code, not the position, so
      // ties still go to the lower position.
      const uint32_t flip = descending ? 0xFFFFFFFFu : 0u;
      parallel_for(lines, grain, [&](int64_t b, int64_t e) {
        // once per chunk; candidates only where head_of_keys may filter
        std::vector<uint64_t> keys(static_cast<size_t>(len)), cand(8 * k <= len ? keys.size() : 0);
        for (int64_t line = b; line < e; ++line) {
          int64_t xo, vo, io;
          offsets(line, xo, vo, io);
          for (int64_t j = 0; j < len; ++j)
            keys[size_t(j)] = (uint64_t(order_code(float(xd[xo + j * x_as])) ^ flip) << 32) | uint64_t(j);
          head_of_keys(keys, cand, k);
          for (int64_t j = 0; j < k; ++j) {
            const int64_t src = int64_t(keys[size_t(j)] & 0xFFFFFFFFu);
            if (vd) vd[vo + j * v_as] = xd[xo + src * x_as];
            id[io + j * i_as] = src;
          }
        }
      });
      return;
    }
  }

  using Key = std::pair<T, int64_t>;
  // Value first, then position: a strict total order, so the unstable std::sort and
  // std::nth_element give the one stable answer.
  auto before = [descending](const Key& a, const Key& b) {
    if (descending ? value_less(b.first, a.first) : value_less(a.first, b.first)) return true;
    if (descending ? value_less(a.first, b.first) : value_less(b.first, a.first)) return false;
    return a.second < b.second;
  };
  parallel_for(lines, grain, [&](int64_t b, int64_t e) {
    std::vector<Key> buf(static_cast<size_t>(len));  // once per chunk, not per line
    for (int64_t line = b; line < e; ++line) {
      int64_t xo, vo, io;
      offsets(line, xo, vo, io);
      for (int64_t j = 0; j < len; ++j) buf[size_t(j)] = {xd[xo + j * x_as], j};
      sort_head(buf.begin(), buf.end(), k, before);
      for (int64_t j = 0; j < k; ++j) {
        if (vd) vd[vo + j * v_as] = buf[size_t(j)].first;
        id[io + j * i_as] = buf[size_t(j)].second;
      }
    }
  });
}

}  // namespace

void sort_cpu(const Tensor& x, int64_t axis, int64_t k, bool descending, const Tensor& values,
              const Tensor& indices) {
  CF_DISPATCH_NUMERIC(x.dtype(), "sort", sort_typed<scalar_t>(x, axis, k, descending, values, indices));
}

}  // namespace cf::kernels
