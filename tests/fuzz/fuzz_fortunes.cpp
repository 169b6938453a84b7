// libFuzzer target: read_fortune_file (text split on "%" lines, NUL bytes refused).
#include "fuzz_util.h"
#include "nn/data/fortunes.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cf::fuzz::MemFile f(data, size);
  cf::fuzz::expect_cf_errors_only([&] {
    size_t n = 0;
    for (const std::string& s : cf::data::read_fortune_file(f.path())) n += s.size();
    if (n == 1) std::puts("");
  });
  return 0;
}
