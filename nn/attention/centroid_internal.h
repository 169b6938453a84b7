#pragma once
// Checks and index helpers shared by centroid.cpp and centroid_init.cpp (not
// installed API).
#include <string>

#include "core/tensor.h"

namespace cf::nn::centroid_detail {

std::string describe(const Tensor& t);  // "undefined" for an undefined tensor
// t must be a float (B, N, C) tensor; `who` and `name` go into the error.
void check_points(const char* who, const char* name, const Tensor& t);
// An undefined mask passes; otherwise bool (B, N) = (b, n).
// axis: the mask's second axis as the message names it (N for inputs, M for centroids).
void check_mask(const char* who, const char* name, const Tensor& mask, int64_t b, int64_t n, const char* axis = "N");
// Per-batch-row indices (B, M...) -> flat row indices into (B*N, ...) (B*M...).
Tensor flat_rows(const Tensor& idx, int64_t n, const char* who);

}  // namespace cf::nn::centroid_detail
