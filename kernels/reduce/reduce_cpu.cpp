#include <algorithm>
#include <cmath>
#include <vector>
#include <limits>
#include <type_traits>

#include "kernels/common/parallel.h"
#include "kernels/common/row_math.h"
#include "kernels/reduce/reduce.h"

namespace cf::kernels {

namespace {

struct Split {
  Shape kept_sizes, kept_strides, red_sizes, red_strides;
  int64_t red_numel = 1;
};

Split split_axes(const Tensor& x, const std::vector<int64_t>& axes) {
  Split s;
  size_t j = 0;
  for (int64_t d = 0; d < x.dim(); ++d) {
    bool reduced = j < axes.size() && axes[j] == d;
    if (reduced) ++j;
    (reduced ? s.red_sizes : s.kept_sizes).push_back(x.shape()[size_t(d)]);
    (reduced ? s.red_strides : s.kept_strides).push_back(x.strides()[size_t(d)]);
  }
  s.red_numel = numel_of(s.red_sizes);
  return s;
}

// Calls f(value, position) for every element of the reduced region at `base`.
template <typename T, typename F>
inline void visit(const T* data, const Split& s, int64_t base, F&& f) {
  if (s.red_sizes.size() == 1) {
    const int64_t st = s.red_strides[0], n = s.red_sizes[0];
    const T* p = data + base;
    if (st == 1) {
      for (int64_t i = 0; i < n; ++i) f(p[i], i);
    } else {
      for (int64_t i = 0; i < n; ++i) f(p[i * st], i);
    }
    return;
  }
  int64_t pos = 0;
  for_each_offset(s.red_sizes, s.red_strides, base, [&](int64_t off) { f(data[off], pos++); });
}

// An odometer over the axes (sizes, strides): odometer_start sets idx to linear position pos's
// indices and returns its offset; odometer_step moves idx and off to the next position without
// dividing (visit_range over reduced axes, reduce_typed over kept ones).
inline int64_t odometer_start(const Shape& sizes, const Shape& strides, int64_t pos, int64_t* idx) {
  int64_t off = 0;
  for (int d = int(sizes.size()) - 1; d >= 0; --d) {
    idx[d] = pos % sizes[size_t(d)];
    pos /= sizes[size_t(d)];
    off += idx[d] * strides[size_t(d)];
  }
  return off;
}
inline void odometer_step(const Shape& sizes, const Shape& strides, int64_t* idx, int64_t& off) {
  for (int d = int(sizes.size()) - 1; d >= 0; --d) {
    if (++idx[d] < sizes[size_t(d)]) {
      off += strides[size_t(d)];
      return;
    }
    off -= strides[size_t(d)] * (sizes[size_t(d)] - 1);
    idx[d] = 0;
  }
}

// Like visit, over the positions [begin, end) of the reduced region only.
template <typename T, typename F>
inline void visit_range(const T* data, const Split& s, int64_t base, int64_t begin, int64_t end,
                        F&& f) {
  int64_t idx[kMaxDims];
  int64_t off = base + odometer_start(s.red_sizes, s.red_strides, begin, idx);
  for (int64_t pos = begin; pos < end; ++pos) {
    f(data[off], pos);
    odometer_step(s.red_sizes, s.red_strides, idx, off);
  }
}

// Sum of one large reduced region, split into a number of chunks fixed by its size
// (not by the thread count, so every thread count gives the same bits); the partial
// sums are added in chunk order.
template <typename T, typename acc_t>
acc_t chunked_sum(const T* data, const Split& s, int64_t base) {
  const int64_t n = s.red_numel;
  const int64_t chunks = std::clamp<int64_t>(n / kParallelGrain, 1, 64);
  std::vector<acc_t> partial(size_t(chunks), acc_t(0));
  parallel_for(chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      acc_t acc = 0;
      visit_range(data, s, base, n * c / chunks, n * (c + 1) / chunks,
                  [&](T v, int64_t) { acc += acc_t(v); });
      partial[size_t(c)] = acc;
    }
  });
  acc_t total = 0;
  for (acc_t p : partial) total += p;
  return total;
}

template <typename T>
void reduce_typed(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out,
                  const Tensor& indices, int64_t correction) {
  using acc_t = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
  Split s = split_axes(x, axes);
  const T* data = static_cast<const T*>(x.impl_ptr()->storage->data);
  T* o = out.data<T>();
  int64_t* ix = indices.defined() ? indices.data<int64_t>() : nullptr;
  const int64_t n_out = numel_of(s.kept_sizes), n_red = s.red_numel;
  const int64_t x_off = x.offset();
  // Offset in x of the first element reduced into output oi.
  auto base_of = [&](int64_t oi) {
    int64_t idx[kMaxDims];
    return x_off + odometer_start(s.kept_sizes, s.kept_strides, oi, idx);
  };

  // Few outputs over a large region (a whole-tensor sum): parallelise inside the region.
  if ((op == ReduceOp::Sum || op == ReduceOp::Mean) && n_out <= 4 && n_red >= 4 * kParallelGrain) {
    for (int64_t oi = 0; oi < n_out; ++oi) {
      acc_t acc = chunked_sum<T, acc_t>(data, s, base_of(oi));
      o[oi] = op == ReduceOp::Mean ? T(double(acc) / double(n_red)) : T(acc);
    }
    return;
  }

  // Sum/mean over the leading axes of a contiguous tensor (bias gradients, sum_to of a
  // broadcast operand): stream x once in memory order, adding each row into a row of
  // accumulators, instead of striding through x once per output. Each output still
  // adds its elements in the same order as the general path below: the same bits.
  bool leading = !axes.empty() && x.is_contiguous() && n_out > 1;
  for (size_t j = 0; leading && j < axes.size(); ++j) leading = axes[j] == int64_t(j);
  if ((op == ReduceOp::Sum || op == ReduceOp::Mean) && leading) {
    const T* rows = data + x_off;
    constexpr bool low = std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>;
    const RowMath* rm = nullptr;
    if constexpr (low) rm = &row_math();  // 16-bit rows widened by the row tier (exact: the same sums)
    parallel_for(n_out, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n_red, 1)),
                 [&](int64_t b, int64_t e) {
      std::vector<acc_t> acc(size_t(e - b), acc_t(0));
      std::vector<float> wide(low ? size_t(e - b) : 0);
      for (int64_t r = 0; r < n_red; ++r) {
        const T* row = rows + r * n_out + b;
        if constexpr (low) {
          widen_row(*rm, row, wide.data(), e - b);
          for (int64_t j = 0; j < e - b; ++j) acc[size_t(j)] += acc_t(wide[size_t(j)]);
        } else {
          for (int64_t j = 0; j < e - b; ++j) acc[size_t(j)] += acc_t(row[j]);
        }
      }
      for (int64_t j = b; j < e; ++j)
        o[j] = op == ReduceOp::Mean ? T(double(acc[size_t(j - b)]) / double(n_red)) : T(acc[size_t(j - b)]);
    });
    return;
  }

  parallel_for(n_out, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n_red, 1)),
               [&](int64_t b, int64_t e) {
    // The next output's base from this one's, stepped through the kept axes: no divisions per
    // output, which cost more than a short reduced row itself (a max over 8 values, LSH's hash).
    int64_t idx[kMaxDims];
    int64_t base = x_off + odometer_start(s.kept_sizes, s.kept_strides, b, idx);
    for (int64_t oi = b; oi < e; odometer_step(s.kept_sizes, s.kept_strides, idx, base), ++oi) {
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Mean: {
          acc_t acc = 0;
          visit(data, s, base, [&](T v, int64_t) { acc += acc_t(v); });
          o[oi] = op == ReduceOp::Mean ? T(double(acc) / double(n_red)) : T(acc);
          break;
        }
        case ReduceOp::Max:
        case ReduceOp::Min: {
          const bool is_max = op == ReduceOp::Max;
          T best = T(0);
          int64_t best_i = -1;
          visit(data, s, base, [&](T v, int64_t i) {
            if (best_i < 0) {
              best = v;
              best_i = i;
              return;
            }
            if (best != best) return;  // a NaN already won: NaN propagates
            if (v != v || (is_max ? v > best : v < best)) {  // strict: the first extremum wins
              best = v;
              best_i = i;
            }
          });
          o[oi] = best;
          if (ix) ix[oi] = best_i;
          break;
        }
        case ReduceOp::LogSumExp: {
          double m = -std::numeric_limits<double>::infinity();
          // NaN absorbs (std::max would skip it): a row holding a NaN gives NaN, as in PyTorch.
          visit(data, s, base, [&](T v, int64_t) { m = (double(v) > m || v != v) ? double(v) : m; });
          if (!std::isfinite(m)) {  // all -inf, a +inf or a NaN: the answer is m itself
            o[oi] = T(m);
            break;
          }
          double acc = 0;
          visit(data, s, base, [&](T v, int64_t) { acc += std::exp(double(v) - m); });
          o[oi] = T(m + std::log(acc));
          break;
        }
        case ReduceOp::Var: {
          double mean = 0;
          visit(data, s, base, [&](T v, int64_t) { mean += double(v); });
          mean /= double(n_red);
          double acc = 0;
          visit(data, s, base, [&](T v, int64_t) { acc += (double(v) - mean) * (double(v) - mean); });
          o[oi] = T(acc / double(n_red - correction));
          break;
        }
      }
    }
  });
}

}  // namespace

namespace {
template <typename T>
void signed_argmax_typed(const T* x, int64_t rows, int64_t n, int64_t* out) {
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) out[r] = signed_argmax_row(x + r * n, n);
  });
}
}  // namespace

void signed_argmax_cpu(const Tensor& x, const Tensor& out) {
  const int64_t n = x.shape().back(), rows = n ? x.numel() / n : 0;
  if (rows == 0) return;
  CF_DISPATCH_FLOAT_STD(x.dtype(), "signed_argmax",
                        signed_argmax_typed<scalar_t>(x.data<scalar_t>(), rows, n, out.data<int64_t>()));
}

void reduce_cpu(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out,
                const Tensor& indices, int64_t correction) {
  CF_DISPATCH_NUMERIC(x.dtype(), "reduce", reduce_typed<scalar_t>(op, x, axes, out, indices, correction));
}

}  // namespace cf::kernels
