#pragma once
// Dropout under data parallelism. W processes that train one model on shards of a batch
// hold generators in the same state (one seed, the same draws: LSH rotations, hash planes and
// other draws the ranks must share stay equal). Dropout masks must not be shared: rank r's
// j-th example got rank 0's j-th mask, so W ranks drew one rank's worth of masks. Every
// dropout (the dropout op and the attention kernels' weight dropout) therefore reserves its n
// counters W times on every rank, keeping the generators in step, and rank r reads the r-th
// block of n. For an op whose counters run over the batch axis first (dropout, flash and block
// attention) that is the mask one process draws for the concatenated batch: W processes then
// train as one does, dropout included. dist::init sets the share (rank, world size) and
// dist::finalize resets it; a program that runs its own data parallelism can set it itself.
#include <cstdint>

#include "core/rng.h"

namespace cf {

struct DropoutShare {
  int64_t index = 0, count = 1;  // this process's block, of count
};

// index in [0, count), count >= 1 (ValueError otherwise). Process-wide.
void set_dropout_share(int64_t index, int64_t count);
DropoutShare dropout_share();

// Reserves n * count counters of gen and returns the first of this process's n. Inside a CUDA
// graph capture, call cuda::philox_rebase_for(gen, ...) first (core/cuda_graph.h).
uint64_t reserve_dropout_counters(Generator& gen, uint64_t n);

}  // namespace cf
