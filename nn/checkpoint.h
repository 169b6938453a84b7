#pragma once
// Training checkpoints: model and optimizer state, the step, generator states and
// free-form strings, in ONE safetensors file written atomically (write a
// temporary, fsync, rename), so a crash never leaves a half checkpoint.
//
// File layout (readable by any safetensors reader):
//   tensors   "model.<name>" for the model state, "optim.<name>" for the optimizer's,
//             "scaler.<name>" for a dynamic loss scaler's (nn/optim/grad_scaler.h)
//   metadata  "cf.format" = "cf.checkpoint", "cf.format_version" = "1",
//             "step" = decimal int64,
//             "rng.count" = N, "rng.<i>.name" / "rng.<i>.seed" / "rng.<i>.offset"
//             (seed and offset as decimal u64, exact), "extra.<key>" = value.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "nn/state_dict.h"

namespace cf {
namespace nn {

// The state of a cf::Generator (which itself is not copyable).
struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;

  static GeneratorState of(const Generator& g) {  // read under one lock (Generator::state)
    const std::pair<uint64_t, uint64_t> s = g.state();
    return {s.first, s.second};
  }
  void restore(Generator& g) const { g.set_state(seed, offset); }
  bool operator==(const GeneratorState& o) const { return seed == o.seed && offset == o.offset; }
};

struct TrainingCheckpoint {
  StateDict model;
  StateDict optimizer;
  StateDict scaler;  // GradScaler::state_dict() (mixed precision), or empty
  int64_t step = 0;
  // Named generator states, in order (e.g. {"default", GeneratorState::of(default_generator())}).
  std::vector<std::pair<std::string, GeneratorState>> generators;
  // Anything else worth keeping (config text, epoch, best metric, ...).
  std::map<std::string, std::string> extra;
};

// The format version this build writes; load_checkpoint refuses newer ones.
constexpr int kCheckpointFormatVersion = 1;

// Write atomically to `path`. Tensors must be on the CPU (DeviceError); names
// within model / optimizer must be unique and non-empty (ValueError); generator
// names must be unique and non-empty (ValueError); a float tensor holding NaN (a diverged run)
// is a ValueError before anything is written. IOError when writing fails; an existing file at
// `path` then stays as it was.
void save_checkpoint(const std::string& path, const TrainingCheckpoint& ckpt);

// Read a checkpoint written by save_checkpoint. Corrupt files give the
// "[load_safetensors] <path>: ..." IOError; a safetensors file that is not a cf
// checkpoint, or of a newer format version, or with malformed cf metadata gives
// an IOError starting "[load_checkpoint] <path>:", as does a float tensor holding NaN (the weights of a diverged run;
// infinities are kept: a mask buffer holds -inf). Entries keep
// the saved order.
TrainingCheckpoint load_checkpoint(const std::string& path);

}  // namespace nn
}  // namespace cf
