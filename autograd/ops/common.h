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
// Refuse an in-place write whose source requires grad while grad mode is on: in-place ops are
// not recorded, so the source's gradient would be lost without a word (PyTorch records the write).
void check_inplace_source(const Tensor& src, const char* op);
// In-place writes through a view whose elements share memory (a stride 0 over a size above 1, an
// expand()) would write one element several times: refused, as PyTorch does (fill_ excepted).
void check_no_internal_overlap(const Tensor& t, const char* op);
// The source of an in-place write into dst: src itself, or a copy of it when the two share memory
// other than as the very same view (t[1:] = t[:-1], t += t.T, t += t[0]): the kernels would read
// elements of src that they already overwrote. NumPy's rule (its result, not an error).
Tensor inplace_source(const Tensor& dst, const Tensor& src);
// A 0-d tensor of t's dtype and device holding v: a constant shared by every call for the
// same (device, dtype, v) on this thread (no fill kernel after the first), so never write into
// it; take it as an operand only.
Tensor scalar_like(const Tensor& t, double v);
// A number operand of arithmetic on t (op's name for errors; scalar_like's shared constant): the number takes t's dtype (cf's rule), so
// for an int64 or bool tensor a number that is not one of its values (2.5, 1e30, NaN) is a DTypeError
// naming op, t and the number, where a cast would truncate it (t * 2.5 was t * 2).
Tensor number_like(const Tensor& t, double v, const char* op);
void check_number(const Tensor& t, double v, const char* op);  // number_like's check alone
// The operand a comparison of t with the number v runs on: t itself, or t in float64 when v is not one
// of an int64 or bool tensor's values (so i == 0.5 is false and i < 1.5 holds for 1, instead of comparing
// with the truncated number).
Tensor compare_operand(const Tensor& t, double v);
// A new tensor filled with v on any device (Tensor::full is CPU-only, being in core).
Tensor filled(const Shape& shape, double v, DType dtype, Device device);
// What a fused kernel reads: t itself (detached) when contiguous, else a contiguous copy with no
// autograd history (the kernels index rows directly and are recorded as one node each);
// undefined stays undefined.
Tensor dense_data(const Tensor& t);

}  // namespace cf::ops
