// libFuzzer target: load_checkpoint (safetensors plus cf's checkpoint metadata).
#include "fuzz_util.h"
#include "nn/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cf::fuzz::MemFile f(data, size);
  cf::fuzz::expect_cf_errors_only([&] {
    cf::nn::TrainingCheckpoint ck = cf::nn::load_checkpoint(f.path());
    // Touch every loaded value; unsigned, because a valid checkpoint may hold a
    // step near INT64_MAX (the first long campaign's finding was this sum overflowing).
    uint64_t n = uint64_t(ck.step);
    for (const auto& e : ck.model) n += uint64_t(e.second.numel());
    for (const auto& e : ck.optimizer) n += uint64_t(e.second.numel());
    for (const auto& g : ck.generators) n += g.second.seed ^ g.second.offset;
    if (n == 1) std::puts("");
  });
  return 0;
}
