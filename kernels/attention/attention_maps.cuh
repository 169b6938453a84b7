#pragma once
// Which rows an attention tile reads: the "maps" shared by the float32/float64
// kernels (attention_cuda.cu) and the tensor-core kernels (attention_mma_cuda.cu).
//
//   FullMap  (flash_attention): group 0 holds query rows 0..Nq-1 and keys 0..Nk-1.
//   BlockMap (block_attention): group c is chunk c; its query rows are the
//            positions in members[b, h, c, :], its keys the positions in the
//            window chunks c + offsets[t]. Rows are gathered as tiles are loaded
//            and outputs scattered to token order as they are written.
//   RoutedMap (routed_attention): group c is list c; its query rows are the
//            positions in query_members[b, h, c, :], its keys those in
//            key_members[b, h, c, :]. Rows are gathered the same way, but the
//            outputs (out, lse and the gradients) are written in slot order,
//            since a position may sit in several lists.
//
// orow / krow: the row of out, lse, dout, dlse and dq (orow) or of dk, dv (krow)
// that query slot r (key slot u) of group g writes or reads: its position for
// FullMap and BlockMap, its slot for RoutedMap. Called for held slots only.
//
// A position is an index into the (b, h) slice of q, k, v; -1 is "no row" (an
// empty slot, or past the end of a tile). `tile` is the kernel's number of query
// rows per tile (32 for the scalar kernels, 64 for the tensor-core ones).
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/attention/attention.h"
#include "kernels/common/cuda_utils.cuh"

namespace cf::kernels::attention_maps {

// cu::nan_max: a row with a NaN score gets a NaN maximum on every lane of a warp reduction, so its
// out and lse come out NaN, as from the dense softmax, not the masked-row zeros (attention_cpu.cpp,
// has_nan).
using cu::nan_max;

// (b, h, n) element strides of a row-indexed tensor (out, lse, dout, dlse).
struct Rows3 {
  int64_t s0 = 0, s1 = 0, s2 = 0;
  __host__ __device__ int64_t at(int64_t b, int64_t h, int64_t n) const { return b * s0 + h * s1 + n * s2; }
};
inline Rows3 rows3(const Tensor& t) {
  if (!t.defined()) return {};
  return {t.strides()[0], t.strides()[1], t.strides()[2]};
}

struct FullMap {
  int64_t H, Nq, Nk, shift;
  bool causal;
  const bool* pad;  // (B, Nk) or null
  __device__ int64_t rows() const { return Nq; }
  __device__ int64_t qpos(int64_t, int64_t, int64_t r) const { return r < Nq ? r : -1; }
  __device__ int64_t kpos(int64_t, int64_t, int64_t j) const { return j < Nk ? j : -1; }
  __device__ bool blocked(int64_t b, int64_t i, int64_t j) const {
    return i < 0 || j < 0 || (pad && pad[b * Nk + j]) || (causal && j > i + shift);
  }
  __device__ bool self(int64_t, int64_t) const { return false; }
  __device__ int64_t orow(int64_t, int64_t, int64_t i) const { return i; }
  __device__ int64_t krow(int64_t, int64_t, int64_t j) const { return j; }
  // Keys [0, key_end) can be allowed for the query rows [r0, r0 + tile).
  __device__ int64_t key_end(int64_t r0, int64_t tile) const {
    if (!causal) return Nk;
    const int64_t e = r0 + tile + shift;
    return e < 0 ? 0 : (e < Nk ? e : Nk);
  }
  // dK/dV side: key groups, their keys, and the query groups that see them.
  __device__ int64_t group_keys() const { return Nk; }
  __device__ int64_t group_kpos(int64_t, int64_t, int64_t u) const { return u < Nk ? u : -1; }
  __device__ int64_t visits() const { return 1; }
  __device__ int64_t visit_group(int64_t, int64_t) const { return 0; }
  // First query row that may see key j0 (causal: i + shift >= j0), tile-aligned.
  __device__ int64_t row_begin(int64_t j0, int64_t tile) const {
    if (!causal) return 0;
    const int64_t r = j0 - shift;
    return r <= 0 ? 0 : (r / tile) * tile;
  }
};

struct BlockMap {
  int64_t H, Hm, N, C, w, nb;
  const int64_t* members;  // (B, Hm, C, w)
  int64_t back;  // offsets[t]: 0, then -1 .. -back, then 1, 2, ... (block_map checks the form)
  bool causal, self_mask;
  const bool* pad;  // (B, N) or null
  __device__ const int64_t* head(int64_t bh) const {
    const int64_t b = bh / H, h = bh % H;
    return members + (b * Hm + (Hm == 1 ? 0 : h)) * C * w;
  }
  __device__ int64_t chunk(int64_t c) const { return ((c % C) + C) % C; }
  __device__ int64_t offset(int64_t t) const { return t == 0 ? 0 : t <= back ? -t : t - back; }
  __device__ int64_t rows() const { return w; }
  // A position outside [0, N) counts as an empty slot: the members check
  // (autograd/ops/attention.cpp) reports it at the next host read, and meanwhile no
  // row outside the tensors is read or written.
  __device__ int64_t valid(int64_t p) const { return p < N ? p : -1; }
  __device__ int64_t qpos(int64_t bh, int64_t c, int64_t r) const { return r < w ? valid(head(bh)[c * w + r]) : -1; }
  __device__ int64_t kpos(int64_t bh, int64_t c, int64_t j) const {
    if (j >= nb * w) return -1;
    return valid(head(bh)[chunk(c + offset(j / w)) * w + j % w]);
  }
  __device__ bool blocked(int64_t b, int64_t i, int64_t j) const {
    return i < 0 || j < 0 || (pad && pad[b * N + j]) || (causal && j > i);
  }
  __device__ bool self(int64_t i, int64_t j) const { return self_mask && i == j; }
  __device__ int64_t orow(int64_t, int64_t, int64_t i) const { return i; }
  __device__ int64_t krow(int64_t, int64_t, int64_t j) const { return j; }
  __device__ int64_t key_end(int64_t, int64_t) const { return nb * w; }
  __device__ int64_t group_keys() const { return w; }
  __device__ int64_t group_kpos(int64_t bh, int64_t cc, int64_t u) const {
    return u < w ? valid(head(bh)[cc * w + u]) : -1;
  }
  __device__ int64_t visits() const { return nb; }
  __device__ int64_t visit_group(int64_t cc, int64_t t) const { return chunk(cc - offset(t)); }
  __device__ int64_t row_begin(int64_t, int64_t) const { return 0; }
};

// Lists (B', H', C, w) contiguous with B' in {1, B} and H' in {1, H}: list c of
// (b, h) starts at b * sb + h * sh + c * w.
struct RoutedMap {
  int64_t H, N, C, wq, wk, qsb, qsh, ksb, ksh;
  const int64_t* qm;
  const int64_t* km;
  bool causal;
  const bool* pad;  // (B, N) or null
  __device__ int64_t valid(int64_t p) const { return p >= 0 && p < N ? p : -1; }
  __device__ int64_t rows() const { return wq; }
  __device__ int64_t qpos(int64_t bh, int64_t c, int64_t r) const {
    const int64_t b = bh / H, h = bh % H;
    return r < wq ? valid(qm[b * qsb + h * qsh + c * wq + r]) : -1;
  }
  __device__ int64_t kpos(int64_t bh, int64_t c, int64_t j) const {
    const int64_t b = bh / H, h = bh % H;
    return j < wk ? valid(km[b * ksb + h * ksh + c * wk + j]) : -1;
  }
  __device__ bool blocked(int64_t b, int64_t i, int64_t j) const {
    return i < 0 || j < 0 || (pad && pad[b * N + j]) || (causal && j > i);
  }
  __device__ bool self(int64_t, int64_t) const { return false; }
  __device__ int64_t orow(int64_t c, int64_t r, int64_t) const { return c * wq + r; }
  __device__ int64_t krow(int64_t c, int64_t u, int64_t) const { return c * wk + u; }
  __device__ int64_t key_end(int64_t, int64_t) const { return wk; }
  __device__ int64_t group_keys() const { return wk; }
  __device__ int64_t group_kpos(int64_t bh, int64_t c, int64_t u) const { return kpos(bh, c, u); }
  __device__ int64_t visits() const { return 1; }
  __device__ int64_t visit_group(int64_t c, int64_t) const { return c; }
  __device__ int64_t row_begin(int64_t, int64_t) const { return 0; }
};

inline FullMap full_map(const Tensor& q, const Tensor& k, const Tensor& kpm, const FlashAttentionParams& p) {
  return FullMap{q.shape()[1], q.shape()[2], k.shape()[2], k.shape()[2] - q.shape()[2], p.causal,
                 kpm.defined() ? static_cast<const bool*>(kpm.raw_data()) : nullptr};
}

// The window's chunk offsets travel as one number, the count of backward ones: the
// table ops::block_window_offsets builds is 0, -1 .. -back, 1 .. ahead (nothing is
// skipped before it holds C offsets), so no per-call host-to-device copy is needed.
inline BlockMap block_map(const Tensor& q, const Tensor& members, const Tensor& kpm, const BlockAttentionParams& p) {
  const std::vector<int64_t>& o = p.offsets;
  int64_t back = 0;
  while (back + 1 < int64_t(o.size()) && o[size_t(back + 1)] == -(back + 1)) ++back;
  for (size_t t = 0; t < o.size(); ++t)
    CF_CHECK(o[t] == (t == 0 ? 0 : int64_t(t) <= back ? -int64_t(t) : int64_t(t) - back), ValueError,
             "[block_attention] internal: the window offsets are not 0, -1 .. -b, 1 .. a (offset ", t, " is ", o[t],
             ")");
  return BlockMap{q.shape()[1] * p.rounds,  // output heads: the member table's (or a shared table)
                  members.shape()[1],
                  q.shape()[2],
                  members.shape()[2],
                  members.shape()[3],
                  int64_t(p.offsets.size()),
                  static_cast<const int64_t*>(members.raw_data()),
                  back,
                  p.causal,
                  p.self_mask,
                  kpm.defined() ? static_cast<const bool*>(kpm.raw_data()) : nullptr};
}

inline RoutedMap routed_map(const Tensor& q, const Tensor& qm, const Tensor& km, const Tensor& kpm,
                            const RoutedAttentionParams& p) {
  const Shape &sq = qm.shape(), &sk = km.shape();
  const int64_t C = sq[2], wq = sq[3], wk = sk[3];
  return RoutedMap{q.shape()[1],
                   q.shape()[2],
                   C,
                   wq,
                   wk,
                   sq[0] == 1 ? 0 : sq[1] * C * wq,
                   sq[1] == 1 ? 0 : C * wq,
                   sk[0] == 1 ? 0 : sk[1] * C * wk,
                   sk[1] == 1 ? 0 : C * wk,
                   static_cast<const int64_t*>(qm.raw_data()),
                   static_cast<const int64_t*>(km.raw_data()),
                   p.causal,
                   kpm.defined() ? static_cast<const bool*>(kpm.raw_data()) : nullptr};
}

}  // namespace cf::kernels::attention_maps
