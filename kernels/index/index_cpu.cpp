// CPU indexing kernels. All of them walk strided operands with the loop plans of
// kernels/common/loop.h; the indexed axis is handled by hand inside the callback.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "kernels/common/loop.h"
#include "kernels/common/parallel.h"
#include "kernels/common/upcast.h"
#include "kernels/index/index.h"

namespace cf::kernels {

namespace {

// Like strided_loop, but with a caller-chosen grain: a loop element of scatter
// stands for a whole run along the indexed axis, so the default grain is too coarse.
template <int N, typename F>
void loop_with_grain(const Shape& shape, const std::array<const Tensor*, N>& ops, int64_t grain,
                     F&& inner) {
  LoopPlan<N> p = make_loop_plan<N>(shape, ops);
  if (p.numel == 0) return;
  std::array<char*, N> base;
  for (int k = 0; k < N; ++k) base[size_t(k)] = static_cast<char*>(ops[size_t(k)]->raw_data());
  parallel_for(p.numel, std::max<int64_t>(grain, 1),
               [&](int64_t b, int64_t e) { run_loop_range<N>(p, base, b, e, inner); });
}

// The kernels' own bounds test: the ops scan an index before these kernels run, except where its
// values are known good (ops::KnownGoodIndices: an op's backward rereading the index its forward
// scanned, a layer's argsort tables). Memory no version counter sees (a NumPy or DLPack view of the
// index) can still change it in between, so the kernels never index past the axis: a bad value is
// skipped and reported after the loop (no exception leaves a parallel region), the output unfinished.
struct IndexOutOfRange {
  std::atomic<bool> hit{false};
  std::atomic<int64_t> value{0};
  void note(int64_t v) {
    if (!hit.exchange(true)) value = v;
  }
  void raise_if_hit(const char* op, int64_t len) const {
    if (hit)
      throw IndexError(str("[", op, "] index ", value.load(), " is out of range for an axis of length ", len,
                           " (the index changed after it was checked: through a NumPy or DLPack view of it, which "
                           "no version counter sees?)"));
  }
};

// t's strides with the entry of `axis` replaced by `stride`.
Shape strides_with(const Tensor& t, int64_t axis, int64_t stride) {
  Shape st = t.strides();
  st[size_t(axis)] = stride;
  return st;
}

}  // namespace

BadIndex find_bad_index_cpu(const Tensor& index, int64_t limit, const int64_t* allowed) {
  BadIndex r;
  const int64_t n = index.numel();
  if (n == 0) return r;
  // Each chunk records its first bad position; the smallest wins, so the answer does not
  // depend on the thread count. Nothing in the parallel region throws.
  std::atomic<int64_t> first{std::numeric_limits<int64_t>::max()};
  LoopPlan<1> p = make_loop_plan<1>(index.shape(), {&index});
  std::array<char*, 1> base{static_cast<char*>(index.raw_data())};
  parallel_for(n, kParallelGrain, [&](int64_t b, int64_t e) {
    int64_t pos = b;
    bool hit = false;
    auto inner = [&](auto& ptr, auto& st, int64_t len) {
      if (hit) return;
      for (int64_t k = 0; k < len; ++k) {
        int64_t v = *reinterpret_cast<const int64_t*>(ptr[0] + k * st[0]);
        if ((v < 0 || v >= limit) && !(allowed && v == *allowed)) {
          hit = true;
          int64_t cur = first.load();
          while (pos + k < cur && !first.compare_exchange_weak(cur, pos + k)) {
          }
          return;
        }
      }
      pos += len;
    };
    run_loop_range<1>(p, base, b, e, inner);
  });
  int64_t at = first.load();
  if (at == std::numeric_limits<int64_t>::max()) return r;
  // Turn the row-major position back into an element offset to read the value.
  int64_t off = index.offset(), rem = at;
  for (int64_t d = index.dim() - 1; d >= 0; --d) {
    int64_t sz = index.shape()[size_t(d)];
    off += (rem % sz) * index.strides()[size_t(d)];
    rem /= sz;
  }
  r.found = true;
  r.position = at;
  r.value = static_cast<const int64_t*>(index.impl_ptr()->storage->data)[off];
  return r;
}

void gather_cpu(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out) {
  const int64_t ax_st = x.strides()[size_t(axis)], ax_len = x.shape()[size_t(axis)];
  // x seen at index's shape with the axis pinned to its first element; the callback
  // adds index * axis stride.
  Tensor xv = make_view(x, index.shape(), strides_with(x, axis, 0), x.offset());
  IndexOutOfRange bad;
  CF_DISPATCH_ALL(x.dtype(), "gather", {
    using T = scalar_t;
    strided_loop<3>(index.shape(), {&out, &index, &xv}, [&](auto& p, auto& s, int64_t n) {
      for (int64_t k = 0; k < n; ++k) {
        int64_t id = *reinterpret_cast<const int64_t*>(p[1] + k * s[1]);
        if (id < 0 || id >= ax_len) {
          bad.note(id);
          continue;
        }
        *reinterpret_cast<T*>(p[0] + k * s[0]) =
            reinterpret_cast<const T*>(p[2] + k * s[2])[id * ax_st];
      }
    });
  });
  bad.raise_if_hit("gather", ax_len);
}

void scatter_cpu(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src, ScatterMode mode) {
  if (mode == ScatterMode::Add && is_low_precision(out.dtype())) {  // accumulate in float32, round each output once
    Tensor of = upcast_float32(out);
    scatter_cpu(of, axis, index, upcast_float32(src), mode);
    downcast_into(of, out);
    return;
  }
  const int64_t len = index.shape()[size_t(axis)];
  if (len == 0 || index.numel() == 0) return;
  const int64_t out_as = out.strides()[size_t(axis)];
  const int64_t idx_as = index.strides()[size_t(axis)];
  const int64_t src_as = src.strides()[size_t(axis)];
  // Loop over index's shape without the axis: each loop element owns a distinct line of
  // out along the axis (its other coordinates differ), so chunks never write the same
  // element and the axis run inside a line is applied in order.
  Shape lines = index.shape();
  lines[size_t(axis)] = 1;
  Tensor ov = make_view(out, lines, out.strides(), out.offset());
  Tensor iv = make_view(index, lines, index.strides(), index.offset());
  Tensor sv = make_view(src, lines, src.strides(), src.offset());
  const int64_t out_len = out.shape()[size_t(axis)];
  IndexOutOfRange bad;
  auto run = [&](auto apply) {
    loop_with_grain<3>(lines, {&ov, &iv, &sv}, kParallelGrain / len, [&](auto& p, auto& s, int64_t n) {
      // j outside, k inside: rows of src are read along their contiguous axis, and
      // every output element still gets its terms in ascending j.
      for (int64_t j = 0; j < len; ++j)
        for (int64_t k = 0; k < n; ++k) {
          const int64_t id = reinterpret_cast<const int64_t*>(p[1] + k * s[1])[j * idx_as];
          if (id < 0 || id >= out_len) {
            bad.note(id);
            continue;
          }
          apply(p[0] + k * s[0], id * out_as, p[2] + k * s[2], j * src_as);
        }
    });
    bad.raise_if_hit(mode == ScatterMode::Assign ? "scatter" : "scatter_add", out_len);
  };
  if (mode == ScatterMode::Assign) {
    CF_DISPATCH_ALL(out.dtype(), "scatter", {
      using T = scalar_t;
      run([](char* o, int64_t oi, const char* v, int64_t vi) {
        reinterpret_cast<T*>(o)[oi] = reinterpret_cast<const T*>(v)[vi];
      });
    });
    return;
  }
  CF_DISPATCH_NUMERIC_STD(out.dtype(), "scatter_add", {
    using T = scalar_t;
    run([](char* o, int64_t oi, const char* v, int64_t vi) {
      reinterpret_cast<T*>(o)[oi] += reinterpret_cast<const T*>(v)[vi];
    });
  });
}

void masked_fill_cpu(const Tensor& x, const Tensor& mask, double value, const Tensor& out) {
  CF_DISPATCH_ALL(x.dtype(), "masked_fill", {
    using T = scalar_t;
    const T v = static_cast<T>(value);
    strided_loop<3>(out.shape(), {&out, &x, &mask}, [&](auto& p, auto& s, int64_t n) {
      for (int64_t k = 0; k < n; ++k) {
        bool m = *reinterpret_cast<const bool*>(p[2] + k * s[2]);
        *reinterpret_cast<T*>(p[0] + k * s[0]) = m ? v : *reinterpret_cast<const T*>(p[1] + k * s[1]);
      }
    });
  });
}

void one_hot_cpu(const Tensor& labels, const Tensor& out) {
  const int64_t classes = out.shape().back();
  // out seen at labels' shape: each loop element is one row of `classes` entries.
  Shape rows(out.strides().begin(), out.strides().end() - 1);
  Tensor ov = make_view(out, labels.shape(), rows, out.offset());
  CF_DISPATCH_ALL(out.dtype(), "one_hot", {
    using T = scalar_t;
    loop_with_grain<2>(labels.shape(), {&ov, &labels}, kParallelGrain / std::max<int64_t>(classes, 1),
                       [&](auto& p, auto& s, int64_t n) {
      for (int64_t k = 0; k < n; ++k) {
        T* row = reinterpret_cast<T*>(p[0] + k * s[0]);
        std::fill(row, row + classes, T(0));
        row[*reinterpret_cast<const int64_t*>(p[1] + k * s[1])] = T(1);
      }
    });
  });
}

void ring_append_cpu(const Tensor& memory, const Tensor& counters, const Tensor& rows, const Tensor& keep,
                     RingSlots slots) {
  const int64_t n = rows.shape()[0], cap = memory.shape()[0];
  if (n == 0 || cap == 0) return;  // (as the CUDA kernel: no row to write, or no ring to write it in)
  const int64_t* kp = static_cast<const int64_t*>(keep.raw_data());
  int64_t* c = static_cast<int64_t*>(counters.raw_data());
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += kp[i] != 0;
  const int64_t drop = count > cap ? count - cap : 0;  // only the newest cap rows survive the pops
  const size_t row_bytes = size_t(memory.numel() / std::max<int64_t>(cap, 1)) * dtype_size(memory.dtype());
  char* dst = static_cast<char*>(memory.raw_data());
  const char* src = static_cast<const char*>(rows.raw_data());
  // A write row outside the ring (counters from a damaged state: MemoryBank refuses them at load) wraps
  // into it rather than writing outside the memory.
  int64_t rank = 0, next = cap > 0 ? ((c[slots.next_at] % cap) + cap) % cap : 0;
  for (int64_t i = 0; i < n; ++i) {
    if (kp[i] == 0) continue;
    if (rank++ < drop) continue;
    std::memcpy(dst + size_t(next) * row_bytes, src + size_t(i) * row_bytes, row_bytes);
    next = next + 1 == cap ? 0 : next + 1;
  }
  c[slots.next_at] = next;
  c[slots.size_at] = std::min(cap, c[slots.size_at] + count - drop);
}

void bincount_rows_cpu(const Tensor& ids, int64_t bins, const Tensor& counts) {
  const int64_t rows = ids.dim() == 0 ? 1 : ids.shape()[0], w = rows == 0 ? 0 : ids.numel() / rows;
  const int64_t* v = static_cast<const int64_t*>(ids.raw_data());
  int64_t* c = static_cast<int64_t*>(counts.raw_data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < w; ++j) {
      const int64_t x = v[r * w + j];
      if (x >= 0 && x < bins) ++c[r * bins + x];
    }
}

}  // namespace cf::kernels
