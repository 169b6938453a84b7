// flash_attention through GEMMs over chunks of query rows, and block_attention through GEMMs over chunks of
// blocks (attention.h says when and why). Device-generic: every step is a kernel of another family (matmul,
// elementwise, reduce) or one of the attention family's row and slot kernels, so the same code runs, and is
// tested, on the CPU.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "kernels/attention/attention.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/matmul/matmul.h"
#include "kernels/reduce/reduce.h"

namespace cf::kernels {

namespace {

// Rows [r0, r0 + n) of every (b, h) of a contiguous (B, H, N, D) tensor, as a view.
Tensor row_chunk(const Tensor& t, int64_t r0, int64_t n) {
  const Shape& s = t.shape();
  const int64_t H = s[1], N = s[2], D = s[3];
  return make_view(t, {s[0], H, n, D}, {H * N * D, N * D, D, 1}, t.offset() + r0 * D, "flash_attention");
}

// A contiguous (B, H, n, w) at the start of a contiguous (B, H, r, C) buffer, n w <= r C.
Tensor leading(const Tensor& buf, int64_t n, int64_t w) {
  const Shape& s = buf.shape();
  const Shape shape{s[0], s[1], n, w};
  return make_view(buf, shape, contiguous_strides(shape), buf.offset(), "flash_attention");
}

// lse rows [r0, r0 + n) of every (b, h) of a contiguous (B, H, N).
Tensor lse_rows(const Tensor& lse, int64_t r0, int64_t n) {
  const Shape& s = lse.shape();
  return make_view(lse, {s[0], s[1], n}, {s[1] * s[2], s[2], 1}, lse.offset() + r0, "flash_attention");
}

// Keys any query of rows [i0, i0 + n) may see: causal, the last row's prefix (query i sees j <= i + Nk - Nq),
// so a chunk of a causal attention computes about half the scores, not all of them.
int64_t key_width(bool causal, int64_t i0, int64_t n, int64_t Nq, int64_t Nk) {
  return causal ? std::clamp<int64_t>(i0 + n + Nk - Nq, 0, Nk) : Nk;
}

Tensor transposed(const Tensor& t) {
  const Shape &s = t.shape(), &st = t.strides();
  return make_view(t, {s[0], s[1], s[3], s[2]}, {st[0], st[1], st[3], st[2]}, t.offset(), "flash_attention");
}

// alpha as a (1, 1, 1, 1) tensor on t's device, broadcast by binary ops (written by a fill kernel: no copy).
Tensor scalar_like(const Tensor& t, double alpha) {
  Tensor a = Tensor::empty({1, 1, 1, 1}, t.dtype(), t.device());
  fill(a, alpha);
  return a;
}

// alpha t as a new contiguous tensor (the scale folded into q once: O(N d)).
Tensor scaled(const Tensor& t, const Tensor& alpha) {
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device());
  binary(BinaryOp::Mul, t, alpha, out);
  return out;
}

// The workspace cap of both paths: clamp(4 x bytes of q, k, v, 16 MiB, 128 MiB).
int64_t workspace_budget(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t inputs = (q.numel() + k.numel() + v.numel()) * int64_t(dtype_size(q.dtype()));
  return std::clamp<int64_t>(4 * inputs, int64_t(16) << 20, int64_t(128) << 20);
}

// Query rows per chunk: one (B, H, rows, Nk) score buffer holds at most clamp(4 x bytes of q, k, v,
// 16 MiB, 128 MiB), so the workspace grows with the inputs (O(N d)) up to a cap, never as N^2.
int64_t rows_per_chunk(const Tensor& q, const Tensor& k, const Tensor& v, int64_t fixed) {
  const int64_t Nq = q.shape()[2];
  if (fixed > 0) return std::min(fixed, Nq);
  const int64_t row_bytes = q.shape()[0] * q.shape()[1] * k.shape()[2] * int64_t(dtype_size(q.dtype()));
  return std::clamp<int64_t>(workspace_budget(q, k, v) / std::max<int64_t>(row_bytes, 1), 1, Nq);
}

void check_dtype(const Tensor& q, const char* op = "flash_attention") {
  CF_CHECK(q.dtype() == kFloat32 || q.dtype() == kFloat64, DTypeError, "[", op,
           "] expects float32 or float64, got ", q.dtype());
}

// A contiguous view of `shape` at the start of a contiguous buffer at least that large (a chunk's share).
Tensor leading_as(const Tensor& buf, const Shape& shape) {
  return make_view(buf, shape, contiguous_strides(shape), buf.offset(), "block_attention");
}

// The last two axes of a 5-d view swapped.
Tensor transposed5(const Tensor& t) {
  const Shape &s = t.shape(), &st = t.strides();
  return make_view(t, {s[0], s[1], s[2], s[4], s[3]}, {st[0], st[1], st[2], st[4], st[3]}, t.offset(),
                   "block_attention");
}

// Block attention's window table (B, Hm, C, W = T w): row c holds block c's w slots, then those of blocks
// c + offsets[t] (cyclic) for t = 1 .. T - 1 (offsets[0] == 0: a row's first w slots are its queries).
// Two copies per offset (the blocks before and after the wrap-around); no host read.
Tensor window_table(const Tensor& members, const std::vector<int64_t>& offsets) {
  const Shape& ms = members.shape();
  const int64_t B = ms[0], Hm = ms[1], C = ms[2], w = ms[3], T = int64_t(offsets.size()), W = T * w;
  Tensor win = Tensor::empty({B, Hm, C, W}, kInt64, members.device());
  auto rows = [&](const Tensor& t, int64_t c0, int64_t n, int64_t col0, int64_t row_len) {
    return make_view(t, {B, Hm, n, w}, {Hm * C * row_len, C * row_len, row_len, 1},
                     t.offset() + c0 * row_len + col0, "block_attention");
  };
  for (int64_t t = 0; t < T; ++t) {
    const int64_t off = ((offsets[size_t(t)] % C) + C) % C;
    copy(rows(members, off, C - off, 0, w), rows(win, 0, C - off, t * w, W));  // rows c < C - off: block c + off
    if (off > 0) copy(rows(members, 0, off, 0, w), rows(win, C - off, off, t * w, W));  // the wrapped rows
  }
  return win;
}

// The window table's view (B, Ho, n, s) for output heads Ho (a shared table: stride 0 over heads), blocks
// [c0, c0 + n) and columns [col0, col0 + s).
Tensor table_view(const Tensor& win, int64_t Ho, int64_t c0, int64_t n, int64_t col0, int64_t s) {
  const Shape& sh = win.shape();
  const int64_t Hm = sh[1], C = sh[2], W = sh[3];
  return make_view(win, {sh[0], Ho, n, s}, {Hm * C * W, Hm == 1 ? 0 : C * W, W, 1},
                   win.offset() + c0 * W + col0, "block_attention");
}

// Blocks per chunk: the chunk's buffers and the window table `win` together within the workspace cap (at least
// one block). The forward holds scores and the gathered Q, K, V and O; the backward also dP, dO and the
// gradients of Q, K, V. The table counts too: LSH-8's at N = 65536 is 33.5 MB, and without it the GEMM path
// peaked at 2009 MB there against 1850 MB fused (H200, 2026-11-28).
int64_t blocks_per_chunk(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& win, int64_t Ho,
                         int64_t C, int64_t w, int64_t W, bool backward, int64_t fixed) {
  if (fixed > 0) return std::min(fixed, C);
  const int64_t Dk = q.shape()[3], Dv = v.shape()[3];
  const int64_t per_block = q.shape()[0] * Ho * int64_t(dtype_size(q.dtype())) *
                            (backward ? 2 * w * W + 2 * w * Dk + 2 * w * Dv + 2 * w + 2 * W * (Dk + Dv)
                                      : w * W + w * (Dk + Dv) + W * (Dk + Dv));
  const int64_t budget = workspace_budget(q, k, v) - win.numel() * int64_t(dtype_size(win.dtype()));
  return std::clamp<int64_t>(budget / std::max<int64_t>(per_block, 1), 1, C);
}

// out (B, H, n, D) contiguous = a (B, H, n, W) @ x (B, H, W, D) with the W keys split into s parts of
// floor(W / s), s = `fixed` if > 0, else flash_gemm_key_splits (which says why): one batched GEMM over (B, H, s)
// into s partial products, summed into out; the last W mod s keys (if any) in one more product, added.
void matmul_key_split(const Tensor& a, const Tensor& x, const Tensor& out, int64_t fixed) {
  const Shape &as = a.strides(), &xs = x.strides();
  const int64_t B = a.shape()[0], H = a.shape()[1], n = a.shape()[2], W = a.shape()[3], D = x.shape()[3];
  const int64_t s = std::clamp<int64_t>(fixed > 0 ? fixed : flash_gemm_key_splits(B * H, n, D, W), 1, W);
  if (s == 1) {
    matmul(a, x, out);
    return;
  }
  const int64_t Kc = W / s, rest = W - s * Kc;
  const Tensor parts = Tensor::empty({B, H, s, n, D}, out.dtype(), out.device());
  matmul(make_view(a, {B, H, s, n, Kc}, {as[0], as[1], Kc * as[3], as[2], as[3]}, a.offset(), "flash_attention"),
         make_view(x, {B, H, s, Kc, D}, {xs[0], xs[1], Kc * xs[2], xs[2], xs[3]}, x.offset(), "flash_attention"),
         parts);
  reduce(ReduceOp::Sum, parts, {2}, make_view(out, {B, H, 1, n, D}, contiguous_strides({B, H, 1, n, D}),
                                               out.offset(), "flash_attention"));
  if (rest > 0) {
    const Tensor t = Tensor::empty({B, H, n, D}, out.dtype(), out.device());
    matmul(make_view(a, {B, H, n, rest}, as, a.offset() + s * Kc * as[3], "flash_attention"),
           make_view(x, {B, H, rest, D}, xs, x.offset() + s * Kc * xs[2], "flash_attention"), t);
    add_scaled(out, t, 1.0, out);
  }
}

// CF_BLOCK_ATTENTION_PATH, CF_FLASH_ATTENTION_PATH and CF_ROUTED_ATTENTION_PATH, each read once: -1 until then.
std::atomic<int> g_block_path{-1}, g_flash_path{-1}, g_routed_path{-1};

// A path setting: the environment variable's value (parsed, "auto" when unset) the first time it is read;
// a set_*_path call before or after that wins.
template <typename Path>
Path path_setting(std::atomic<int>& slot, const char* variable, Path (*parse)(const std::string&)) {
  int v = slot.load();
  if (v < 0) {
    const char* env = std::getenv(variable);
    v = int(parse(env ? env : "auto"));
    int expected = -1;
    slot.compare_exchange_strong(expected, v);  // a set_*_path in between wins
    v = slot.load();
  }
  return Path(v);
}

// q, k, v the float32 tensor-core kernels can read as they are (the ops hand them dense tensors; a view at
// an odd offset takes the other path). Asked after the supported() rules: it reads the data's address.
bool dense_aligned(const Tensor& q, const Tensor& k, const Tensor& v) {
  auto ready = [](const Tensor& t) {
    return t.is_contiguous() && reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0;
  };
  return ready(q) && ready(k) && ready(v);
}

}  // namespace

int64_t flash_gemm_key_splits(int64_t BH, int64_t rows, int64_t D, int64_t keys) {
  const int64_t tiles = BH * ((rows + 63) / 64) * ((D + 63) / 64);
  if (tiles == 0 || tiles >= kFlashGemmWantedTiles || keys < 2 * kFlashGemmMinSplitKeys) return 1;  // 0: D == 0
  return std::min((kFlashGemmWantedTiles + tiles - 1) / tiles, keys / kFlashGemmMinSplitKeys);
}

void flash_attention_forward_gemm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                  const FlashAttentionParams& p, const Tensor& out, const Tensor& lse,
                                  int64_t chunk_rows, int64_t key_splits) {
  check_dtype(q);
  const int64_t B = q.shape()[0], H = q.shape()[1], Nq = q.shape()[2], Nk = k.shape()[2], Dv = v.shape()[3];
  const RowDropout drop{p.dropout, p.dropout_seed, p.dropout_counter0, p.dropout_rebase};
  if (B == 0 || H == 0 || Nq == 0) return;
  if (Nk == 0) {  // nothing to attend to: the documented zeros and -inf
    fill(out, 0.0);
    fill(lse, -std::numeric_limits<double>::infinity());
    return;
  }
  const int64_t r = rows_per_chunk(q, k, v, chunk_rows);
  const Tensor qs = scaled(q, scalar_like(q, p.scale));
  const Tensor S = Tensor::empty({B, H, r, Nk}, q.dtype(), q.device());
  // One chunk (the usual case below the cap) writes out directly; more go through a buffer,
  // since a chunk's rows of out are not one contiguous block.
  const Tensor O = r < Nq ? Tensor::empty({B, H, r, Dv}, q.dtype(), q.device()) : out;
  for (int64_t i0 = 0; i0 < Nq; i0 += r) {
    const int64_t n = std::min(r, Nq - i0), W = key_width(p.causal, i0, n, Nq, Nk);
    if (W == 0) {  // causal rows before the first key: nothing allowed
      fill(row_chunk(out, i0, n), 0.0);
      fill(lse_rows(lse, i0, n), -std::numeric_limits<double>::infinity());
      continue;
    }
    const Tensor Sc = leading(S, n, W), Oc = leading(O, n, Dv);
    matmul(row_chunk(qs, i0, n), transposed(row_chunk(k, 0, W)), Sc);
    attention_rows_softmax(Sc, kpm, {i0, Nq, p.causal, Nk, drop}, lse);  // P, dropped with a rate
    matmul_key_split(Sc, row_chunk(v, 0, W), Oc, key_splits);
    if (r < Nq) copy(Oc, row_chunk(out, i0, n));
  }
}

void flash_attention_backward_gemm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpm,
                                   const FlashAttentionParams& p, const Tensor& out, const Tensor& lse,
                                   const Tensor& dout, const Tensor& dlse, const Tensor& dq, const Tensor& dk,
                                   const Tensor& dv, int64_t chunk_rows, int64_t key_splits) {
  check_dtype(q);
  const RowDropout drop{p.dropout, p.dropout_seed, p.dropout_counter0, p.dropout_rebase};
  const int64_t B = q.shape()[0], H = q.shape()[1], Nq = q.shape()[2], Dk = q.shape()[3], Nk = k.shape()[2];
  if (B == 0 || H == 0 || Nq == 0 || Nk == 0) {
    fill(dq, 0.0);
    fill(dk, 0.0);
    fill(dv, 0.0);
    return;
  }
  // D_i = dO_i . O_i - dlse_i (FlashAttention-2 Alg. 2 line 4, plus the lse gradient: d lse_i / d S_ij = P_ij).
  const Tensor D4 = Tensor::empty({B, H, Nq, 1}, out.dtype(), out.device());
  {
    const Tensor prod = Tensor::empty(out.shape(), out.dtype(), out.device());
    binary(BinaryOp::Mul, dout, out, prod);
    reduce(ReduceOp::Sum, prod, {3}, D4);
  }
  const Tensor D3 = make_view(D4, {B, H, Nq}, {H * Nq, Nq, 1}, D4.offset(), "flash_attention");
  if (dlse.defined()) binary(BinaryOp::Sub, D3, dlse, D3);
  const int64_t r = rows_per_chunk(q, k, v, chunk_rows);
  const Tensor scale = scalar_like(q, p.scale);
  const Tensor qs = scaled(q, scale);
  const Tensor P = Tensor::empty({B, H, r, Nk}, q.dtype(), q.device());
  const Tensor dS = Tensor::empty({B, H, r, Nk}, q.dtype(), q.device());
  const Tensor dQc = Tensor::empty({B, H, r, Dk}, q.dtype(), q.device());
  // A chunk seeing every key while dk, dv are still unwritten (the first, unless causal) writes
  // them; the others add theirs, over their key prefix, through these.
  Tensor dKc, dVc;
  bool fresh = true;
  for (int64_t i0 = 0; i0 < Nq; i0 += r) {
    const int64_t n = std::min(r, Nq - i0), W = key_width(p.causal, i0, n, Nq, Nk);
    if (W == 0) {  // rows with nothing allowed: no gradient
      fill(row_chunk(dq, i0, n), 0.0);
      continue;
    }
    const bool direct = fresh && W == Nk;
    if (fresh && !direct) {
      fill(dk, 0.0);
      fill(dv, 0.0);
    }
    if (!direct && !dKc.defined()) {
      dKc = Tensor::empty(k.shape(), k.dtype(), k.device());
      dVc = Tensor::empty(v.shape(), v.dtype(), v.device());
    }
    fresh = false;
    const Tensor kw = row_chunk(k, 0, W), vw = row_chunk(v, 0, W), dkw = row_chunk(dk, 0, W),
                 dvw = row_chunk(dv, 0, W);
    const Tensor Pc = leading(P, n, W), dSc = leading(dS, n, W), qc = row_chunk(qs, i0, n),
                 dOc = row_chunk(dout, i0, n);
    matmul(qc, transposed(kw), Pc);
    matmul(dOc, transposed(vw), dSc);                                  // dP
    // P = exp(S - lse), dS = P (dP - D); with a rate Pc holds the dropped weights Z that met v (attention.h)
    attention_rows_grad(Pc, dSc, kpm, {i0, Nq, p.causal, Nk, drop}, lse, D3);
    if (direct) {
      matmul(transposed(Pc), dOc, dv);
    } else {
      const Tensor t = leading(dVc, W, v.shape()[3]);
      matmul(transposed(Pc), dOc, t);
      add_scaled(dvw, t, 1.0, dvw);
    }
    const Tensor dQn = leading(dQc, n, Dk);
    matmul_key_split(dSc, kw, dQn, key_splits);
    binary(BinaryOp::Mul, dQn, scale, row_chunk(dq, i0, n));  // dq = scale dS k
    if (direct) {                                              // dk = scale dS^T q, q scaled already
      matmul(transposed(dSc), qc, dk);
    } else {
      const Tensor t = leading(dKc, W, Dk);
      matmul(transposed(dSc), qc, t);
      add_scaled(dkw, t, 1.0, dkw);
    }
  }
  // The last chunk sees every key (W = Nk > 0), so dk and dv are always written by here.
}

void set_block_attention_path(BlockAttentionPath path) { g_block_path.store(int(path)); }

BlockAttentionPath parse_block_attention_path(const std::string& s) {
  CF_CHECK(s == "auto" || s == "fused" || s == "gemm" || s == "mma", ValueError,
           "[block_attention] CF_BLOCK_ATTENTION_PATH must be auto, fused, gemm or mma, got '", s, "'");
  return s == "fused" ? BlockAttentionPath::kFused
         : s == "gemm" ? BlockAttentionPath::kGemm
         : s == "mma"  ? BlockAttentionPath::kMma
                       : BlockAttentionPath::kAuto;
}

BlockAttentionPath block_attention_path() {
  return path_setting(g_block_path, "CF_BLOCK_ATTENTION_PATH", parse_block_attention_path);
}

void set_flash_attention_path(FlashAttentionPath path) { g_flash_path.store(int(path)); }

FlashAttentionPath parse_flash_attention_path(const std::string& s) {
  CF_CHECK(s == "auto" || s == "gemm" || s == "mma", ValueError,
           "[flash_attention] CF_FLASH_ATTENTION_PATH must be auto, gemm or mma, got '", s, "'");
  return s == "gemm" ? FlashAttentionPath::kGemm : s == "mma" ? FlashAttentionPath::kMma : FlashAttentionPath::kAuto;
}

FlashAttentionPath flash_attention_path() {
  return path_setting(g_flash_path, "CF_FLASH_ATTENTION_PATH", parse_flash_attention_path);
}

bool flash_attention_takes_mma(const Tensor& q, const Tensor& k, const Tensor& v, double dropout) {
  // The backward's sizes (head size 64) are the forward's for float32.
  return dropout == 0 && flash_attention_path() == FlashAttentionPath::kMma && q.dtype() == kFloat32 &&
         flash_attention_backward_mma_supported(q, k, v) && dense_aligned(q, k, v);
}

void set_routed_attention_path(RoutedAttentionPath path) { g_routed_path.store(int(path)); }

RoutedAttentionPath parse_routed_attention_path(const std::string& s) {
  CF_CHECK(s == "auto" || s == "fused" || s == "mma", ValueError,
           "[routed_attention] CF_ROUTED_ATTENTION_PATH must be auto, fused or mma, got '", s, "'");
  return s == "fused" ? RoutedAttentionPath::kFused : s == "mma" ? RoutedAttentionPath::kMma : RoutedAttentionPath::kAuto;
}

RoutedAttentionPath routed_attention_path() {
  return path_setting(g_routed_path, "CF_ROUTED_ATTENTION_PATH", parse_routed_attention_path);
}

bool routed_attention_takes_mma(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qm,
                                const Tensor& km, double dropout) {
  return dropout == 0 && routed_attention_path() != RoutedAttentionPath::kFused && q.dtype() == kFloat32 &&
         routed_attention_mma_supported(q, k, v, qm, km) && dense_aligned(q, k, v);
}

bool block_attention_takes_mma(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                               const BlockAttentionParams& p, bool backward) {
  const BlockAttentionPath path = block_attention_path();
  if (path != BlockAttentionPath::kMma && path != BlockAttentionPath::kAuto) return false;
  if (p.dropout != 0 || q.dtype() != kFloat32 || !block_attention_mma_supported(q, k, v, members, p.rounds) ||
      !dense_aligned(q, k, v))
    return false;
  return path == BlockAttentionPath::kMma || block_attention_mma_preferred(q, members, backward, p.rounds);
}

bool block_attention_takes_gemm(const Tensor& q, const Tensor& members, const BlockAttentionParams& p) {
  if (p.dropout > 0) return true;  // the fused CUDA kernel has no dropout
  const BlockAttentionPath path = block_attention_path();
  if (path == BlockAttentionPath::kFused || path == BlockAttentionPath::kGemm) return path == BlockAttentionPath::kGemm;
  const Shape& ms = members.shape();
  const int64_t BHo = q.shape()[0] * q.shape()[1] * p.rounds, C = ms[2], w = ms[3],
                W = int64_t(p.offsets.size()) * w;
  // The fused kernel's grid holds at most 65535 blocks and 65535 batch*heads (check_grid in
  // attention_cuda.cu); the GEMM path has no such limit, so a call past them takes it at any size.
  const bool fused_fits = C <= 65535 && BHo <= 65535;
  return !fused_fits || q.shape()[0] * q.shape()[1] * C * w * W >= kBlockGemmMinScores;
}

void block_attention_forward_gemm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                  const Tensor& kpm, const BlockAttentionParams& p, const Tensor& out,
                                  const Tensor& lse, int64_t chunk_blocks) {
  check_dtype(q, "block_attention");
  const int64_t B = q.shape()[0], Ho = q.shape()[1] * p.rounds, N = q.shape()[2], Dk = q.shape()[3],
                Dv = v.shape()[3], C = members.shape()[2], w = members.shape()[3],
                W = int64_t(p.offsets.size()) * w;
  // Tokens in no slot, and queries with nothing allowed, keep these.
  fill(out, 0.0);
  fill(lse, -std::numeric_limits<double>::infinity());
  if (B * Ho * N == 0 || C * w == 0) return;
  const Tensor win = window_table(members, p.offsets);
  const int64_t n = blocks_per_chunk(q, k, v, win, Ho, C, w, W, false, chunk_blocks);
  const Tensor scale = scalar_like(q, p.scale);
  const Device dev = q.device();
  const Tensor Qg = Tensor::empty({B, Ho, n, w, Dk}, q.dtype(), dev), Kg = Tensor::empty({B, Ho, n, W, Dk}, q.dtype(), dev),
               Vg = Tensor::empty({B, Ho, n, W, Dv}, q.dtype(), dev), S = Tensor::empty({B, Ho, n, w, W}, q.dtype(), dev),
               Og = Tensor::empty({B, Ho, n, w, Dv}, q.dtype(), dev);
  const BlockRows br{p.causal, p.self_mask, p.self_score, {p.dropout, p.dropout_seed, p.dropout_counter0, p.dropout_rebase}};
  for (int64_t c0 = 0; c0 < C; c0 += n) {
    const int64_t m = std::min(n, C - c0);
    const Tensor tq = table_view(win, Ho, c0, m, 0, w), tk = table_view(win, Ho, c0, m, 0, W);
    const Tensor Qc = leading_as(Qg, {B, Ho, m, w, Dk}), Kc = leading_as(Kg, {B, Ho, m, W, Dk}),
                 Vc = leading_as(Vg, {B, Ho, m, W, Dv}), Sc = leading_as(S, {B, Ho, m, w, W}),
                 Oc = leading_as(Og, {B, Ho, m, w, Dv});
    gather_slot_rows(q, tq, p.rounds, Qc);
    binary(BinaryOp::Mul, Qc, scale, Qc);
    gather_slot_rows(k, tk, p.rounds, Kc);
    gather_slot_rows(v, tk, p.rounds, Vc);
    matmul(Qc, transposed5(Kc), Sc);
    block_rows_softmax(Sc, tk, kpm, br, lse);  // P (dropped with a rate)
    matmul(Sc, Vc, Oc);
    scatter_slot_rows(Oc, tq, 1, 0, false, out);
  }
}

void block_attention_backward_gemm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members,
                                   const Tensor& kpm, const BlockAttentionParams& p, const Tensor& out,
                                   const Tensor& lse, const Tensor& dout, const Tensor& dlse, const Tensor& dq,
                                   const Tensor& dk, const Tensor& dv, int64_t chunk_blocks) {
  check_dtype(q, "block_attention");
  const int64_t B = q.shape()[0], R = p.rounds, Ho = q.shape()[1] * R, N = q.shape()[2], Dk = q.shape()[3],
                Dv = v.shape()[3], C = members.shape()[2], w = members.shape()[3],
                T = int64_t(p.offsets.size()), W = T * w;
  fill(dq, 0.0);
  fill(dk, 0.0);
  fill(dv, 0.0);
  if (B * Ho * N == 0 || C * w == 0) return;
  // dlse as rows of one element, for the slot gather.
  const Tensor dlse_rows = dlse.defined() ? make_view(dlse, {B, Ho, N, 1},
                                                      {dlse.strides()[0], dlse.strides()[1], dlse.strides()[2], 1},
                                                      dlse.offset(), "block_attention")
                                          : Tensor();
  const Tensor win = window_table(members, p.offsets);
  const int64_t n = blocks_per_chunk(q, k, v, win, Ho, C, w, W, true, chunk_blocks);
  const Tensor scale = scalar_like(q, p.scale);
  const Device dev = q.device();
  const DType dt = q.dtype();
  const Tensor Qg = Tensor::empty({B, Ho, n, w, Dk}, dt, dev), Kg = Tensor::empty({B, Ho, n, W, Dk}, dt, dev),
               Vg = Tensor::empty({B, Ho, n, W, Dv}, dt, dev), dOg = Tensor::empty({B, Ho, n, w, Dv}, dt, dev),
               S = Tensor::empty({B, Ho, n, w, W}, dt, dev), dP = Tensor::empty({B, Ho, n, w, W}, dt, dev),
               dQg = Tensor::empty({B, Ho, n, w, Dk}, dt, dev), dKw = Tensor::empty({B, Ho, n, W, Dk}, dt, dev),
               dVw = Tensor::empty({B, Ho, n, W, Dv}, dt, dev), Og = Tensor::empty({B, Ho, n, w, Dv}, dt, dev),
               Dg = Tensor::empty({B, Ho, n, w, 1}, dt, dev), dLg = Tensor::empty({B, Ho, n, w, 1}, dt, dev);
  const BlockRows br{p.causal, p.self_mask, p.self_score, {p.dropout, p.dropout_seed, p.dropout_counter0, p.dropout_rebase}};
  for (int64_t c0 = 0; c0 < C; c0 += n) {
    const int64_t m = std::min(n, C - c0);
    const Tensor tq = table_view(win, Ho, c0, m, 0, w), tk = table_view(win, Ho, c0, m, 0, W);
    const Tensor Qc = leading_as(Qg, {B, Ho, m, w, Dk}), Kc = leading_as(Kg, {B, Ho, m, W, Dk}),
                 Vc = leading_as(Vg, {B, Ho, m, W, Dv}), dOc = leading_as(dOg, {B, Ho, m, w, Dv}),
                 Sc = leading_as(S, {B, Ho, m, w, W}), dPc = leading_as(dP, {B, Ho, m, w, W}),
                 dQc = leading_as(dQg, {B, Ho, m, w, Dk}), dKc = leading_as(dKw, {B, Ho, m, W, Dk}),
                 dVc = leading_as(dVw, {B, Ho, m, W, Dv}), Oc = leading_as(Og, {B, Ho, m, w, Dv}),
                 Dc = leading_as(Dg, {B, Ho, m, w, 1});
    // D = dO . O - dlse per query slot (FlashAttention-2 Alg. 2 line 4, plus the lse gradient: d lse_i / d S_ij
    // = P_ij), in slot order, so nothing of the size of out (R times q's with rounds) is ever allocated.
    gather_slot_rows(dout, tq, 1, dOc);
    gather_slot_rows(out, tq, 1, Oc);
    binary(BinaryOp::Mul, Oc, dOc, Oc);
    reduce(ReduceOp::Sum, Oc, {4}, Dc);
    if (dlse.defined()) {
      const Tensor dLc = leading_as(dLg, {B, Ho, m, w, 1});
      gather_slot_rows(dlse_rows, tq, 1, dLc);
      binary(BinaryOp::Sub, Dc, dLc, Dc);
    }
    gather_slot_rows(q, tq, R, Qc);
    binary(BinaryOp::Mul, Qc, scale, Qc);
    gather_slot_rows(k, tk, R, Kc);
    gather_slot_rows(v, tk, R, Vc);
    matmul(Qc, transposed5(Kc), Sc);
    matmul(dOc, transposed5(Vc), dPc);
    block_rows_grad(Sc, dPc, tk, kpm, br, lse, Dc);  // Sc = P (with a rate the dropped Z), dPc = dS
    matmul(transposed5(Sc), dOc, dVc);               // dV window = P^T dO (Z^T dO)
    matmul(transposed5(dPc), Qc, dKc);               // dK window = scale dS^T q (Qc holds scale q)
    matmul(dPc, Kc, dQc);
    binary(BinaryOp::Mul, dQc, scale, dQc);          // dQ = scale dS K
    // Back to token order, round by round (a position sits once per round and table head); dK and dV window
    // part by window part (a key sits in T windows, once per part).
    for (int64_t r = 0; r < R; ++r) {
      scatter_slot_rows(dQc, tq, R, r, true, dq);
      for (int64_t t = 0; t < T; ++t) {
        const Tensor part = table_view(win, Ho, c0, m, t * w, w);
        auto slots = [&](const Tensor& g, int64_t D) {
          return make_view(g, {B, Ho, m, w, D}, {Ho * m * W * D, m * W * D, W * D, D, 1}, g.offset() + t * w * D,
                           "block_attention");
        };
        scatter_slot_rows(slots(dKc, Dk), part, R, r, true, dk);
        scatter_slot_rows(slots(dVc, Dv), part, R, r, true, dv);
      }
    }
  }
}

}  // namespace cf::kernels
