#include "nn/layers/sequence.h"

#include <cmath>

#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/shape.h"
#include "core/error.h"
#include "nn/init.h"

namespace cf {
namespace nn {

namespace {
void check_sequence(const char* layer, const Tensor& x, int64_t dim, int64_t max_len) {
  CF_CHECK(x.defined(), ValueError, "[", layer, "] input is undefined");
  CF_CHECK(x.dim() == 3 && x.shape()[2] == dim, ShapeError, "[", layer, "] expected input (B, N, ", dim,
           "), got ", shape_str(x.shape()));
  CF_CHECK(max_len < 0 || x.shape()[1] <= max_len, ShapeError, "[", layer, "] sequence length ", x.shape()[1],
           " exceeds max_len ", max_len);
}
// table[positions]: (B, N, D) rows of a (max_len, D) table for x's (B, N) tokens. The range of the
// positions is index_select's check (deferred on the device: no host read).
Tensor rows_at(const char* layer, const Tensor& table, const Tensor& x, const Tensor& positions) {
  CF_CHECK(positions.defined() && positions.dtype() == kInt64 && positions.dim() == 2 &&
               positions.shape()[0] == x.shape()[0] && positions.shape()[1] == x.shape()[1],
           ShapeError, "[", layer, "] positions must be int64 (B, N) = (", x.shape()[0], ", ", x.shape()[1],
           ") for input ", shape_str(x.shape()), ", got ",
           positions.defined() ? positions.describe() : std::string("undefined"));
  CF_CHECK(positions.device() == x.device(), DeviceError, "[", layer, "] positions on ",
           positions.device().str(), ", input on ", x.device().str());
  Tensor rows;
  try {
    // Checks every position: at once on the CPU, where the layer's name is added; on CUDA the check is
    // deferred to the next host read, whose error is index_select's own.
    rows = index_select(table, 0, reshape(positions, {-1}));
  } catch (const IndexError& e) {
    throw IndexError(str("[", layer, "] positions ", shape_str(positions.shape()), " for max_len ",
                         table.shape()[0], ": ", e.what()));
  }
  return reshape(rows, {x.shape()[0], x.shape()[1], table.shape()[1]});
}
// The depthwise convolutions' checks, sizes and initialisation (PyTorch's
// Conv1d/Conv2d with groups = C: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
// fan_in = the taps of one channel's kernel, k or k*k).
void check_depthwise(const char* layer, int64_t channels, int64_t kernel_size, int64_t stride, int64_t padding) {
  CF_CHECK(channels > 0 && kernel_size > 0 && stride > 0 && padding >= 0, ValueError, "[", layer,
           "] needs channels, kernel_size, stride > 0 and padding >= 0, got channels=", channels,
           " kernel_size=", kernel_size, " stride=", stride, " padding=", padding);
}
Tensor depthwise_uniform(const Shape& shape, int64_t taps, Generator& gen) {
  const double bound = 1.0 / std::sqrt(double(taps));
  Tensor t = Tensor::empty(shape);
  init::uniform_(t, -bound, bound, gen);
  return t;
}
// Output length along one axis: floor((n + 2p - k) / s) + 1, or 0 when the kernel does not fit.
int64_t conv_output_size(const char* layer, int64_t n, int64_t kernel, int64_t stride, int64_t padding) {
  // (a padding of 2^62 overflowed: the output length came out 0)
  const int64_t span = checked_add(n, checked_mul(2, padding, layer, "2 x padding"), layer, "length + 2 x padding") -
                       kernel;
  return span < 0 ? 0 : span / stride + 1;
}
// The (max_len, dim) table (float32 unless asked); a size that overflows or does not fit in
// memory is an error naming the layer and its sizes.
Tensor table_for(const char* layer, int64_t max_len, int64_t dim, DType dtype = kFloat32) {
  try {
    return Tensor::empty({max_len, dim}, dtype);
  } catch (const ShapeError& e) {
    throw ShapeError(str("[", layer, "] max_len ", max_len, " x dim ", dim, ": ", e.what()));
  } catch (const Error& e) {
    throw Error(str("[", layer, "] max_len ", max_len, " x dim ", dim, ": ", e.what()));
  }
}

// PE[pos, i] computed in double, stored as T (each value rounded once).
template <typename T>
void fill_sinusoids(T* v, int64_t max_len, int64_t dim) {
  for (int64_t pos = 0; pos < max_len; ++pos)
    for (int64_t i = 0; i < dim; ++i) {
      double freq = std::pow(10000.0, -double(i - i % 2) / double(dim));
      double a = double(pos) * freq;
      v[pos * dim + i] = T(i % 2 == 0 ? std::sin(a) : std::cos(a));
    }
}

}  // namespace

SinusoidalPositionalEncoding::SinusoidalPositionalEncoding(int64_t max_len, int64_t dim)
    : max_len_(max_len), dim_(dim) {
  CF_CHECK(max_len > 0 && dim > 0, ValueError, "[SinusoidalPositionalEncoding] sizes must be positive, got max_len=",
           max_len, " dim=", dim);
  // Filled in place: a std::vector staging copy sized max_len * dim wrapped for
  // huge sizes and failed as a bare std::bad_alloc (issue 27, max_len = 1e9).
  table = table_for("SinusoidalPositionalEncoding", max_len, dim);
  fill_sinusoids(table.data<float>(), max_len, dim);
  register_buffer("table", &table, /*persistent=*/false);
  // to(bfloat16) and back rounded the table for good (it is in no state dict to restore it): it stays
  // float32, and forward casts its rows to the input's dtype
  keep_float32_under_16bit(&table);
}

Tensor SinusoidalPositionalEncoding::current_table() {
  std::lock_guard<std::mutex> lock(mu_);
  if (table.dtype() == kFloat64 && exact64_.lock() != table.impl_ptr()->storage) {
    // Module::to(kFloat64) widened the float32 table, whose values are float32's (3e-8 off): fill
    // the float64 sinusoids once (on the host, then to the table's device; no device read).
    Tensor t = table_for("SinusoidalPositionalEncoding", max_len_, dim_, kFloat64);
    fill_sinusoids(t.data<double>(), max_len_, dim_);
    table.set_data(t.device() == table.device() ? t : t.to(table.device()));
    exact64_ = table.impl_ptr()->storage;
  }
  return table;
}

Tensor SinusoidalPositionalEncoding::forward(const Tensor& x) {
  check_sequence("SinusoidalPositionalEncoding", x, dim_, max_len_);
  Tensor pe = narrow(current_table(), 0, 0, x.shape()[1]);
  if (pe.dtype() != x.dtype()) pe = cf::to(pe, x.dtype());
  return x + pe;
}

Tensor SinusoidalPositionalEncoding::forward_at(const Tensor& x, const Tensor& positions) {
  check_sequence("SinusoidalPositionalEncoding", x, dim_, -1);
  Tensor pe = rows_at("SinusoidalPositionalEncoding", current_table(), x, positions);
  if (pe.dtype() != x.dtype()) pe = cf::to(pe, x.dtype());
  return x + pe;
}

LearnedPositionalEncoding::LearnedPositionalEncoding(int64_t max_len, int64_t dim, Generator& gen)
    : max_len_(max_len), dim_(dim) {
  CF_CHECK(max_len > 0 && dim > 0, ValueError, "[LearnedPositionalEncoding] sizes must be positive, got max_len=",
           max_len, " dim=", dim);
  weight = table_for("LearnedPositionalEncoding", max_len, dim);
  init::normal_(weight, 0.0, 0.02, gen);
  register_parameter("weight", &weight);
}

Tensor LearnedPositionalEncoding::forward(const Tensor& x) {
  check_sequence("LearnedPositionalEncoding", x, dim_, max_len_);
  return x + narrow(weight, 0, 0, x.shape()[1]);
}

Tensor LearnedPositionalEncoding::forward_at(const Tensor& x, const Tensor& positions) {
  check_sequence("LearnedPositionalEncoding", x, dim_, -1);
  return x + rows_at("LearnedPositionalEncoding", weight, x, positions);
}

DepthwiseConv1d::DepthwiseConv1d(int64_t channels, int64_t kernel_size, int64_t stride, int64_t padding,
                                 bool with_bias, Generator& gen)
    : channels_(channels), kernel_(kernel_size), stride_(stride), padding_(padding) {
  check_depthwise("DepthwiseConv1d", channels, kernel_size, stride, padding);
  weight = depthwise_uniform({channels, kernel_size}, kernel_size, gen);
  register_parameter("weight", &weight);
  if (with_bias) {
    bias = depthwise_uniform({channels}, kernel_size, gen);
    register_parameter("bias", &bias);
  }
}

int64_t DepthwiseConv1d::output_length(int64_t n) const {
  return conv_output_size("DepthwiseConv1d", n, kernel_, stride_, padding_);
}

Tensor DepthwiseConv1d::forward(const Tensor& x) {
  check_sequence("DepthwiseConv1d", x, channels_, -1);
  int64_t n_out = output_length(x.shape()[1]);
  CF_CHECK(n_out > 0, ShapeError, "[DepthwiseConv1d] sequence of length ", x.shape()[1], " with padding ",
           padding_, " is shorter than the kernel (", kernel_, ")");
  Tensor xp = padding_ > 0 ? pad(x, {0, 0, padding_, padding_, 0, 0}) : x;
  // y[:, t, c] = sum_j w[c, j] x[:, t*s + j, c]: one strided slice per tap, so the
  // cost is k passes over the output and no (B, N_out, C, k) unfolded copy.
  Tensor y;
  for (int64_t j = 0; j < kernel_; ++j) {
    Tensor tap = slice(xp, 1, j, j + stride_ * (n_out - 1) + 1, stride_);
    Tensor term = tap * reshape(narrow(weight, 1, j, 1), {channels_});
    y = j == 0 ? term : y + term;
  }
  return bias.defined() ? y + bias : y;
}

DepthwiseConv2d::DepthwiseConv2d(int64_t channels, int64_t kernel_size, int64_t stride, int64_t padding,
                                 bool with_bias, Generator& gen)
    : channels_(channels), kernel_(kernel_size), stride_(stride), padding_(padding) {
  check_depthwise("DepthwiseConv2d", channels, kernel_size, stride, padding);
  weight = depthwise_uniform({channels, kernel_size * kernel_size}, kernel_size * kernel_size, gen);
  register_parameter("weight", &weight);
  if (with_bias) {
    bias = depthwise_uniform({channels}, kernel_size * kernel_size, gen);
    register_parameter("bias", &bias);
  }
}

int64_t DepthwiseConv2d::output_side(int64_t side) const {
  return conv_output_size("DepthwiseConv2d", side, kernel_, stride_, padding_);
}

Tensor DepthwiseConv2d::forward(const Tensor& x) {
  CF_CHECK(x.defined() && x.dim() == 3 && x.shape()[2] == channels_, ShapeError,
           "[DepthwiseConv2d] expected input (B, N, ", channels_, "), got ", x.defined() ? x.describe() : std::string("undefined"));
  const int64_t b = x.shape()[0], n = x.shape()[1];
  const int64_t side = int64_t(std::llround(std::sqrt(double(n))));
  CF_CHECK(side * side == n, ShapeError, "[DepthwiseConv2d] N = ", n,
           " tokens is not a square grid (the tokens are read as sqrt(N) x sqrt(N))");
  const int64_t so = output_side(side);
  CF_CHECK(so > 0, ShapeError, "[DepthwiseConv2d] a ", side, "x", side, " grid with padding ", padding_,
           " is smaller than the kernel (", kernel_, ")");
  Tensor img = reshape(x, {b, side, side, channels_});
  if (padding_ > 0) img = pad(img, {0, 0, padding_, padding_, padding_, padding_, 0, 0});
  // One strided window per tap (k*k passes over the output, no unfolded copy), as DepthwiseConv1d.
  Tensor y;
  const int64_t span = stride_ * (so - 1) + 1;
  for (int64_t a = 0; a < kernel_; ++a)
    for (int64_t c = 0; c < kernel_; ++c) {
      Tensor tap = slice(slice(img, 1, a, a + span, stride_), 2, c, c + span, stride_);
      Tensor term = tap * reshape(narrow(weight, 1, a * kernel_ + c, 1), {channels_});
      y = y.defined() ? y + term : term;
    }
  if (bias.defined()) y = y + bias;
  return reshape(y, {b, so * so, channels_});
}

}  // namespace nn
}  // namespace cf
