#pragma once
// The memory bank of Cluster-Former (Wang et al. 2021, section 3.2, Algorithm 1):
// a fixed-capacity FIFO of the most recent hidden states of one layer, from which
// K-Means recomputes that layer's cluster centroids every F training steps.
//
// Everything needed to resume is a buffer, so it travels in the model's
// state_dict: "memory" (capacity, d) (unless save_memory is false), "centroids"
// (p, d) and "counters" int64 (4,) = [vectors held, next write row, steps, updates].
#include <cstdint>
#include <memory>

#include "core/rng.h"
#include "nn/module.h"

namespace cf {
namespace nn {

struct MemoryBankOptions {
  int64_t dim = 0;              // d, the width of the stored hidden states
  int64_t num_clusters = 64;    // p, the number of centroids
  int64_t capacity = 100000;    // M in Algorithm 1 (the paper's value)
  int64_t update_every = 1000;  // ClusterUpdateFrequency in Algorithm 1, in training steps
  int64_t kmeans_iters = 50;    // Lloyd iterations per recomputation (max)
  uint64_t seed = 0;            // K-Means seed (update u uses seed + u)
  bool save_memory = true;      // the FIFO contents join the state_dict (exact resume)
  // Data-parallel training (nn/parallel/ddp.h): each rank's bank holds the states
  // of its own shard; with distributed = true (and a process group of several
  // ranks) the centroids are computed by kmeans_distributed over the union of all
  // ranks' banks, so every rank gets the same centroids. All ranks must then
  // reach each update together (they do: the same steps in the same order).
  bool distributed = false;
};

class MemoryBank : public Module {
 public:
  // The initial centroids are random normal vectors ordered by GetCentroids
  // (Algorithm 1: "Centroids = GetCentroids(RandomVector)"), drawn from gen.
  explicit MemoryBank(const MemoryBankOptions& options, Generator& gen = default_generator());

  // Memory.add(States) + "while len(Memory) > M: Memory.pop()": appends the rows
  // of states (..., d) whose padding_mask (...) entry is false (true = padding,
  // never stored), dropping the oldest rows beyond the capacity. Stored detached.
  // A zero row has no direction to cluster by cosine and is skipped like padding;
  // a row with a NaN or infinity is a ValueError naming it.
  void add(const Tensor& states, const Tensor& padding_mask = {});
  // One training step is done: every update_every steps ("i % F == 0") the
  // centroids are recomputed from the memory. Returns true when they were. A
  // bank holding fewer vectors than num_clusters keeps its centroids (K-Means
  // needs at least k points) and returns false. On CUDA only the update steps
  // read the device (the bank's size); the others queue one kernel.
  bool step();
  // GetCentroids(Memory) now: spherical K-Means (cosine, the similarity of eq. 5)
  // from k-means++ over the held vectors, then the greedy nearest-neighbour order.
  // ValueError when fewer than num_clusters vectors are held. Held vectors with
  // fewer than num_clusters distinct directions give that many clusters, and the
  // other centroids repeat one of them (their ids then stay empty).
  void update_centroids();

  // The held vectors, oldest first, (size(), d).
  Tensor contents() const;
  int64_t size() const;
  int64_t steps() const;
  int64_t updates() const;  // how many times the centroids were recomputed
  const MemoryBankOptions& options() const { return options_; }
  // DistributedDataParallel turns this on for every bank of the model it wraps.
  void set_distributed(bool on) override { options_.distributed = on; }
  // Counters loaded without the FIFO (save_memory false, or a non-strict load of such a dict)
  // would claim rows this bank does not hold (zeros, which cosine K-Means refused at the next
  // update): the bank restarts its FIFO empty, keeping the loaded steps, updates and centroids.
  // A load that wrote neither, or both, leaves the FIFO as it is.
  void on_state_loaded(const std::vector<std::string>& loaded) override;
  void check_state(const std::map<std::string, const Tensor*>& own) const override;

  Tensor memory;     // (capacity, d) ring buffer
  Tensor centroids;  // (p, d), ordered so neighbouring ids are similar
  Tensor counters;   // int64 (4,): size, next write row, steps, updates

 private:
  // The host's copy of counters[steps], valid while the counters are the storage
  // (held weakly: a new one never matches) and version this bank last wrote: step()
  // then decides without a device read (issue 25). Any other write (load_state_dict,
  // to(), a user's copy_) makes the next step() read the counters once.
  void remember_steps(int64_t steps);
  bool steps_known() const;
  int64_t host_steps_ = 0;
  std::weak_ptr<Storage> steps_storage_;
  int64_t steps_version_ = -1;

  MemoryBankOptions options_;
};

// GetCentroids' ordering (Algorithm 1, lines 19-25): the first centroid stays
// first; each next one is the centroid most cosine-similar (section 3.2) to the
// previous pick among those not yet picked (ties: the lowest index). c (p, d)
// -> (p, d). Sorting tokens by cluster id then keeps similar clusters adjacent.
Tensor order_centroids_greedy(const Tensor& centroids);

// One training step of every memory bank in model (its submodules, in named_modules() order): the
// MemoryBank::step() of each; returns how many recomputed their centroids. A ClusterFormer model's
// on_train_step() is this; any other model whose attention is "cluster-former" (chosen by config: an
// encoder classifier, a causal LM) calls it once per optimizer step, or its centroids stay the random
// initial ones.
int64_t step_memory_banks(Module& model);

}  // namespace nn
}  // namespace cf
