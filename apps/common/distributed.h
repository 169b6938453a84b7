#pragma once
// --distributed for the apps (README "Distributed"):
//   mpirun -np 2 build/apps/cf-textcls --distributed ...
// Every rank runs the same program on the same data with the same seeds; each
// takes its share of every global batch (the --batch-size of one process), DDP
// averages the gradients, so W processes train the model one process trains with
// that batch. Only rank 0 prints JSON lines and the progress bar and writes
// checkpoints; an error on any rank ends the whole job (dist::abort).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "cf.h"
#include "common/cli.h"
#include "common/options.h"
#include "common/report.h"

namespace cf::apps {

// Starts the process group when `on` (rank and world size from mpirun).
inline void init_distributed(bool on) {
  if (on && !cf::dist::is_initialized()) cf::dist::init();
}

// --distributed of the training apps (data-parallel training, DDP).
inline void add_distributed_option(Options& o, bool* distributed) {
  o.add_flag("distributed", distributed,
             "data-parallel over the processes mpirun started (mpirun -np W ...): each takes 1/W of every batch "
             "of --batch-size (a multiple of W) and gradients are averaged, so the model is the one process "
             "trains; rank 0 prints and writes checkpoints");
}

// The end of a training app's command line: the --device it names (a bad one
// is a usage error) and, with --distributed, the process group started.
// Under --distributed a bare "cuda" is this rank's GPU, the local rank's as the NCCL backend binds it
// (every rank took cuda:0, while NCCL put rank 1's communicator on GPU 1); "cuda:N" stays as given.
inline cf::Device start_device(const std::string& device, bool distributed) {
  cf::Device dev = parse_device(device);
  init_distributed(distributed);
  if (distributed && dev.is_cuda() && device.find(':') == std::string::npos)
    dev = cf::Device::cuda(cf::dist::local_device_index(cf::cuda::device_count()));
  return dev;
}

inline bool distributed() { return cf::dist::is_initialized() && cf::dist::world_size() > 1; }

// This rank's rows [begin, end) of a global batch of n rows: the contiguous
// share the distributed sampler gives (nn/data/loader.h). n must be a multiple
// of the world size (every rank the same batch: DDP's mean is then the global mean).
inline std::pair<int64_t, int64_t> rank_share(int64_t n, const std::string& option) {
  const int64_t W = cf::dist::world_size(), r = cf::dist::rank();
  if (n % W != 0)
    throw UsageError(option + " (" + std::to_string(n) + ") must be a multiple of the number of processes (" +
                     std::to_string(W) + ") with --distributed");
  return {r * n / W, (r + 1) * n / W};
}

}  // namespace cf::apps
