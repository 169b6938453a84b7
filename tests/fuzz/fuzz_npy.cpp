// libFuzzer target: read_npy, and save_npy of whatever it accepted (round trip).
#include <cstring>

#include "core/io.h"
#include "fuzz_util.h"
#include "nn/data/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cf::fuzz::MemFile f(data, size);
  cf::fuzz::expect_cf_errors_only([&] {
    cf::Tensor t = cf::data::read_npy(f.path());
    // An accepted file round-trips: what cf writes, cf reads back to the same bytes.
    if (t.nbytes() > (size_t(1) << 20)) return;
    const std::string out = "/dev/shm/cf-fuzz-npy-" + std::to_string(::getpid()) + ".npy";
    cf::data::save_npy(out, t);
    cf::Tensor back = cf::data::read_npy(out);
    ::unlink(out.c_str());
    if (back.shape() != t.shape() || back.dtype() != t.dtype() ||
        std::memcmp(back.raw_data(), t.raw_data(), t.nbytes()) != 0) {
      std::fprintf(stderr, "cf-fuzz: .npy round trip changed %s\n", t.describe().c_str());
      std::abort();
    }
  });
  return 0;
}
