#pragma once
// cf-bench allreduce and ddp (apps/bench/dist_bench.cpp), run under mpirun.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cf.h"

namespace cf::bench {

// Per message size (bytes, float32): cf::dist::all_reduce with and without the
// descriptor check and a raw MPI_Allreduce on the same buffer, in one run.
nlohmann::json allreduce_rows(const std::vector<int64_t>& sizes_bytes, int64_t repeat);

struct DdpBenchOptions {
  std::vector<std::string> variants = {"full"};
  std::vector<int64_t> sizes = {128};
  int64_t batch_size = 16;
  int64_t d_model = 128;
  int64_t repeat = 0;
};
// One training step (forward, backward, AdamW) of a 2-layer encoder classifier:
// one process on the global batch vs W DDP processes on B / W each.
nlohmann::json ddp_rows(const DdpBenchOptions& o);

}  // namespace cf::bench
