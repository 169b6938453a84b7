// libFuzzer target: load_checkpoint (safetensors plus cf's checkpoint metadata).
#include "fuzz_util.h"
#include "nn/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cf::fuzz::MemFile f(data, size);
  cf::fuzz::expect_cf_errors_only([&] {
    cf::nn::TrainingCheckpoint ck = cf::nn::load_checkpoint(f.path());
    int64_t n = ck.step;
    for (const auto& e : ck.model) n += e.second.numel();
    for (const auto& e : ck.optimizer) n += e.second.numel();
    for (const auto& g : ck.generators) n += int64_t(g.second.seed ^ g.second.offset);
    if (n == 1) std::puts("");
  });
  return 0;
}
