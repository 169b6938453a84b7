#pragma once
// Input validation shared by the ops: each throws a cf::Error whose message
// starts with "[op]" and shows the dtypes, shapes and devices involved.
#include <initializer_list>
#include <vector>

#include "autograd/node.h"
#include "core/tensor.h"

namespace cf::ops {

void check_defined(const Tensor& t, const char* op, const char* arg);
// Same device for all (defined) tensors.
void check_same_device(const char* op, std::initializer_list<const Tensor*> ts);
// Same dtype for all (defined) tensors.
void check_same_dtype(const char* op, std::initializer_list<const Tensor*> ts);
void check_float(const Tensor& t, const char* op, const char* arg);
void check_dtype(const Tensor& t, DType want, const char* op, const char* arg);
// Axes normalised, sorted, unique; empty input means all axes.
std::vector<int64_t> normalize_axes(const std::vector<int64_t>& axes, int64_t ndim, const char* op);
// Refuse in-place writes that would corrupt autograd history.
void check_inplace(const Tensor& t, const char* op);
// A 0-d tensor of t's dtype and device holding v.
Tensor scalar_like(const Tensor& t, double v);
// A new tensor filled with v on any device (Tensor::full is CPU-only, being in core).
Tensor filled(const Shape& shape, double v, DType dtype, Device device);

}  // namespace cf::ops
