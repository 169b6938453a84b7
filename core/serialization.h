#pragma once
// safetensors files (https://github.com/huggingface/safetensors), so tensors move
// to and from Python (safetensors.numpy / safetensors.torch) unchanged.
//
// Layout: an 8-byte little-endian u64 N, N bytes of JSON header
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// and then the byte buffer; offsets are relative to the buffer's start. cf reads
// and writes the dtypes F32, F64, I64 and BOOL (float32, float64, int64, bool).
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace cf {

// Write `tensors`, in the given order, and the string `metadata` to `path`.
// Non-contiguous tensors are written in logical (row-major) order; all tensors
// must be on the CPU (DeviceError otherwise). Names must be non-empty, unique and
// not "__metadata__" (ValueError). Everything is checked before the first byte is
// written.
//
// The write is atomic: the bytes go to a temporary file in the same directory,
// which is flushed, fsync'ed and renamed over `path`. On failure the temporary is
// removed and an IOError naming the file is thrown; an existing `path` is left as
// it was.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  // In the order of their data offsets in the file (which is the order they were
  // given to save_safetensors for files cf wrote); zero-size entries that share an
  // offset keep their header order. All on the CPU, contiguous, no autograd.
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;

  // The tensor called `name`, or nullptr.
  const Tensor* find(const std::string& name) const;
};

// Read a whole safetensors file. Every problem (missing or truncated file, bad
// header JSON, unknown dtype, bad shape or offsets, overlaps, holes, trailing
// bytes, non-string metadata, bool bytes other than 0/1) throws cf::IOError whose
// message starts with "[load_safetensors] <path>:" and names the problem.
SafetensorsFile load_safetensors(const std::string& path);

// The safetensors dtype string ("F32", "F64", "I64", "BOOL") for a cf dtype.
const char* safetensors_dtype_name(DType dtype);

}  // namespace cf
