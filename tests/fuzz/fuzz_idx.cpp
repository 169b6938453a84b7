// libFuzzer target: read_idx on plain (uncompressed) bytes, in each output dtype.
#include "fuzz_util.h"
#include "nn/data/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 0 && data[0] == 0x1f) return 0;  // gzip magic: fuzz_gzip's job
  cf::fuzz::MemFile f(data, size);
  for (cf::DType dt : {cf::kFloat32, cf::kFloat64, cf::kInt64})
    cf::fuzz::expect_cf_errors_only([&] { (void)cf::data::read_idx(f.path(), dt); });
  return 0;
}
