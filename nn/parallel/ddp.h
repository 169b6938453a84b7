#pragma once
// DistributedDataParallel: data-parallel training over the process group of
// dist/dist.h. Each rank runs the same model on its shard of the batch; after
// backward every parameter's .grad is the mean over ranks of the local
// gradients, so an optimizer step keeps all replicas identical and equal to one
// process training on the combined batch (with a loss that is a mean over the
// batch and equal shard sizes).
//
//   cf::dist::init();
//   auto model = std::make_shared<MyModel>(...);       // same seed on every rank, or not:
//   cf::nn::DistributedDataParallel ddp(model);        // rank 0's values are broadcast
//   optim::Adam opt(model->named_parameters(), ...);
//   loss = model->forward(my_shard) ...; loss.backward();  // gradients averaged here
//   opt.step();
//
// How. Parameters are grouped into buckets (reverse registration order, the
// order backward tends to produce gradients; at most bucket_bytes each, one
// dtype and device each). A hook per parameter (autograd/hooks.h) marks its
// gradient ready; when a bucket is complete -- and every earlier bucket has been
// started, so all ranks start them in the same order -- its gradients are
// copied into one flat buffer whose asynchronous all-reduce (mean) starts at
// once and runs while backward goes on. A callback at the end of backward
// starts the buckets still waiting (a parameter that got no gradient on this
// rank contributes zeros), waits for all, and gives every parameter its
// averaged gradient (a view of the bucket's buffer, a new buffer each step).
// A parameter no rank has a gradient for keeps none (a small host all-reduce of
// who has which, over the CPU group), so the optimizer skips it as one process
// would. Frozen parameters (requires_grad false) are broadcast at construction
// and otherwise left alone.
//
// no_sync(): while the returned guard lives, backward only accumulates local
// gradients (gradient accumulation); the first backward after it all-reduces
// the accumulated sums.
//
// State that is not a parameter: buffers are broadcast from rank 0 at
// construction and then kept per rank; a model whose buffers must agree calls
// sync_buffers(). Modules that learn state from their inputs combine every rank's
// shard once DDP calls Module::set_distributed(true) on them: routing attention's
// online K-Means centroids average the whole batch's assigned queries and keys (so
// every rank holds the same ones, those one process would, and a rank-0 checkpoint
// resumes them on every rank); Cluster-Former's memory banks (nn/clustering/memory_bank.h)
// each hold their rank's states and switch to distributed K-Means (both stay switched
// on when the DDP object is destroyed: a model re-wrapped by a new DDP keeps them): every
// update clusters the union of all ranks' banks, and all ranks get the same
// centroids (the banks' update steps are reached by all ranks together).
// Construct DDP after moving the model to its device and dtype (the hooks
// belong to the parameter tensors of that moment); float32 or float64
// parameters: the collectives take no 16-bit tensors (train 16-bit under
// autocast, with float32 parameters).
//
// Every rank's loss must reach at least one parameter in every backward: the
// first gradient hook starts DDP's averaging, so a rank whose backward reaches
// none posts nothing, and its next step's all-reduces are matched with the
// others' current ones (wrong gradients, then a timeout). A rank with nothing
// to contribute still runs its loss through the model (an empty shard, or a
// loss times 0). The equality with one process holds for a loss that is a mean
// over examples with equal shards (not for a mean over each rank's own count of
// non-padding tokens: README "Distributed").
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "dist/dist.h"
#include "nn/checkpoint.h"
#include "nn/module.h"

namespace cf {
namespace nn {

struct DDPOptions {
  int64_t bucket_bytes = 25 << 20;  // PyTorch's default bucket cap
  bool broadcast_at_init = true;    // rank 0's parameters and buffers to every rank
};

class DistributedDataParallel {
 public:
  explicit DistributedDataParallel(std::shared_ptr<Module> module, DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  Module& module() { return *module_; }
  const std::shared_ptr<Module>& module_ptr() const { return module_; }
  int64_t num_buckets() const { return int64_t(buckets_.size()); }
  // The indices of each bucket's parameters among those that require grad (named_parameters() order).
  std::vector<std::vector<int64_t>> bucket_layout() const;

  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel* d) : d_(d) { d_->sync_ = false; }
    ~NoSync() {
      if (d_) d_->sync_ = true;
    }
    NoSync(NoSync&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    DistributedDataParallel* d_;
  };
  NoSync no_sync() { return NoSync(this); }
  bool sync_enabled() const { return sync_; }

  // Broadcast rank 0's buffers (persistent and not) to every rank.
  void sync_buffers();

 private:
  struct Bucket {
    std::vector<int64_t> params;   // indices into params_
    std::vector<int64_t> offsets;  // element offset of each in the flat buffer
    int64_t numel = 0;
    DType dtype = kFloat32;
    Device device;
    int64_t ready = 0;
    bool launched = false;
    Tensor flat;
    std::shared_ptr<dist::Work> work;
  };
  // Buckets in reverse registration order, one dtype and device each, from the parameters' current
  // dtypes, devices and sizes (recorded in layout_).
  void build_buckets();
  // Whether a parameter's dtype, device or size differs from layout_ (Module::to and set_data
  // change them in place, under the same tensors these hooks hold).
  bool layout_changed() const;
  void on_grad(int64_t param);
  void launch_ready();
  void launch(Bucket& b);
  void finish();
  void abandon();  // the backward failed before finish(): reset, and refuse the next one

  std::shared_ptr<Module> module_;
  DDPOptions options_;
  std::vector<Tensor> params_;
  std::vector<int64_t> bucket_of_;  // param index -> bucket
  std::vector<bool> marked_;        // got its gradient in this backward
  std::vector<Bucket> buckets_;
  struct ParamLayout {
    DType dtype;
    Device device;
    int64_t numel;
  };
  std::vector<ParamLayout> layout_;
  std::vector<int64_t> hook_ids_;
  size_t next_launch_ = 0;
  bool in_backward_ = false;
  bool failed_backward_ = false;
  // all-reduces posted by a backward that then failed, with their buffers (see abandon)
  std::vector<std::pair<std::shared_ptr<dist::Work>, Tensor>> abandoned_;
  bool sync_ = true;
};

// Rank-0 checkpoints: rank 0 writes `ckpt` with save_checkpoint (atomic), the
// others only wait; every rank returns once the file is complete, and every rank
// throws when the write failed (rank 0's IOError text). A single process just saves.
void save_checkpoint_rank0(const std::string& path, const TrainingCheckpoint& ckpt);

}  // namespace nn
}  // namespace cf
