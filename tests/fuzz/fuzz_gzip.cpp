// libFuzzer target: read_idx on gzip streams (zlib's inflate behind cf's checks:
// lying headers, truncated or corrupt streams, trailing data).
#include "fuzz_util.h"
#include "nn/data/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2 || data[0] != 0x1f || data[1] != 0x8b) return 0;  // plain IDX: fuzz_idx's job
  cf::fuzz::MemFile f(data, size);
  cf::fuzz::expect_cf_errors_only([&] { (void)cf::data::read_idx(f.path(), cf::kFloat32); });
  return 0;
}
