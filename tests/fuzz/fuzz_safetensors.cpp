// libFuzzer target: load_safetensors on arbitrary bytes.
#include "core/serialization.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cf::fuzz::MemFile f(data, size);
  cf::fuzz::expect_cf_errors_only([&] {
    cf::SafetensorsFile st = cf::load_safetensors(f.path());
    // Touch what was read: every tensor's bytes and metadata.
    size_t sum = 0;
    for (const auto& e : st.tensors) {
      const unsigned char* p = static_cast<const unsigned char*>(e.second.raw_data());
      for (size_t i = 0; i < e.second.nbytes(); ++i) sum += p[i];
    }
    for (const auto& kv : st.metadata) sum += kv.first.size() + kv.second.size();
    if (sum == 1) std::puts("");  // keep the reads
  });
  return 0;
}
