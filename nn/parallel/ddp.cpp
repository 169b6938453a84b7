// DistributedDataParallel (nn/parallel/ddp.h explains the protocol).
#include "nn/parallel/ddp.h"

#include "autograd/grad_mode.h"
#include "autograd/hooks.h"
#include "autograd/ops/elementwise.h"
#include "nn/clustering/memory_bank.h"

namespace cf {
namespace nn {

namespace {
Tensor flat_view(const Tensor& flat, const Shape& shape, int64_t offset) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return make_view(flat, shape, strides, offset);
}
}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<Module> module, DDPOptions options)
    : module_(std::move(module)), options_(options) {
  CF_CHECK(module_ != nullptr, ValueError, "[DistributedDataParallel] null module");
  CF_CHECK(dist::is_initialized(), dist::DistError,
           "[DistributedDataParallel] the process group is not initialised: call cf::dist::init() first");
  CF_CHECK(options_.bucket_bytes > 0, ValueError, "[DistributedDataParallel] bucket_bytes must be positive, got ",
           options_.bucket_bytes);
  // A frozen parameter (requires_grad false) gets no gradient, hook or bucket slot, as in
  // PyTorch's DDP; it is still compared and broadcast below, so replicas agree on it.
  StateDict named = module_->named_parameters();
  std::vector<Tensor> every;
  for (auto& kv : named) {
    every.push_back(kv.second);
    if (kv.second.requires_grad()) params_.push_back(kv.second);
  }

  // Every rank must hold the same parameters: compare count, sizes and a hash of
  // the shapes and dtypes (a mismatch would otherwise pair unrelated buffers).
  uint64_t h = 1469598103934665603ull;
  int64_t total = 0;
  for (const Tensor& p : every) {
    for (int64_t d : p.shape()) h = (h ^ uint64_t(d + 1)) * 1099511628211ull;
    h = (h ^ uint64_t(p.dtype()) * 977u) * 1099511628211ull;
    h = (h ^ uint64_t(p.requires_grad() ? 2 : 1)) * 1099511628211ull;  // frozen on one rank only: refused
    total += p.numel();
  }
  Tensor mine = Tensor::from_vector(std::vector<int64_t>{int64_t(every.size()), total, int64_t(h >> 2)}, {1, 3});
  Tensor all = dist::all_gather(mine);
  std::vector<int64_t> v = all.to_vector<int64_t>();
  for (int r = 1; r < dist::world_size(); ++r)
    if (v[size_t(r) * 3] != v[0] || v[size_t(r) * 3 + 1] != v[1] || v[size_t(r) * 3 + 2] != v[2])
      throw dist::DistError(str("[DistributedDataParallel] ranks hold different models: rank 0 has ", v[0],
                                " parameters (", v[1], " values), rank ", r, " has ", v[size_t(r) * 3], " (",
                                v[size_t(r) * 3 + 1], " values) or other shapes, dtypes or frozen parameters"));
  for (const Tensor& p : every)
    CF_CHECK(p.is_contiguous(), dist::DistError, "[DistributedDataParallel] parameter ", p.describe(),
             " is not contiguous");

  if (options_.broadcast_at_init) {
    NoGradGuard ng;
    for (Tensor& p : every) {
      Tensor d = p.detach();
      dist::broadcast(d, 0);
    }
    sync_buffers();
  }

  // Memory banks (Cluster-Former) cluster the union of every rank's bank from now on, and
  // routing attention's centroids follow the whole batch (Module::set_distributed).
  if (dist::world_size() > 1)
    for (auto& [name, m] : module_->named_modules()) m->set_distributed(true);

  build_buckets();
  marked_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i)
    hook_ids_.push_back(autograd::add_grad_accumulated_hook(params_[i], [this, i](const Tensor&) {
      on_grad(int64_t(i));
    }));
}

DistributedDataParallel::~DistributedDataParallel() {
  for (int64_t id : hook_ids_) autograd::remove_grad_hook(id);
}

void DistributedDataParallel::build_buckets() {
  buckets_.clear();
  layout_.clear();
  for (const Tensor& p : params_) layout_.push_back({p.dtype(), p.device(), p.numel()});
  for (int64_t i = int64_t(params_.size()) - 1; i >= 0; --i) {
    const Tensor& p = params_[size_t(i)];
    int64_t bytes = p.numel() * int64_t(dtype_size(p.dtype()));
    bool fresh = buckets_.empty() || buckets_.back().dtype != p.dtype() || !(buckets_.back().device == p.device()) ||
                 (buckets_.back().numel * int64_t(dtype_size(p.dtype())) + bytes > options_.bucket_bytes &&
                  !buckets_.back().params.empty());
    if (fresh) {
      buckets_.emplace_back();
      buckets_.back().dtype = p.dtype();
      buckets_.back().device = p.device();
    }
    Bucket& b = buckets_.back();
    b.params.push_back(i);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
  }
  bucket_of_.assign(params_.size(), -1);
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (int64_t i : buckets_[b].params) bucket_of_[size_t(i)] = int64_t(b);
}

bool DistributedDataParallel::layout_changed() const {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    if (p.dtype() != layout_[i].dtype || !(p.device() == layout_[i].device) || p.numel() != layout_[i].numel ||
        !p.is_contiguous())
      return true;
  }
  return false;
}

std::vector<std::vector<int64_t>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::vector<int64_t>> out;
  for (const Bucket& b : buckets_) out.push_back(b.params);
  return out;
}

void DistributedDataParallel::sync_buffers() {
  NoGradGuard ng;
  for (auto& kv : module_->named_buffers()) {
    Tensor b = kv.second;
    if (!b.defined() || b.numel() == 0) continue;
    CF_CHECK(b.is_contiguous(), dist::DistError, "[DistributedDataParallel] buffer '", kv.first, "' ",
             b.describe(), " is not contiguous");
    dist::broadcast(b, 0);
  }
}

void DistributedDataParallel::on_grad(int64_t param) {
  if (!sync_) return;
  if (!in_backward_) {
    // The model was converted or moved since the buckets were laid out (Module::to keeps the
    // tensors, so these hooks still fire): lay them out again, the same way on every rank, which
    // made the same move. Checked before this backward marks anything.
    if (layout_changed()) {
      for (size_t i = 0; i < params_.size(); ++i)
        CF_CHECK(params_[i].is_contiguous(), dist::DistError, "[DistributedDataParallel] parameter ", i, " ",
                 params_[i].describe(), " is not contiguous");
      build_buckets();
    }
    CF_CHECK(!failed_backward_, dist::DistError, "[DistributedDataParallel] an earlier backward failed after "
             "this rank had begun averaging its gradients: the ranks' collectives are out of step and their "
             "gradients may disagree; restart the processes (from the last checkpoint)");
    in_backward_ = true;
    autograd::queue_callback(
        [this] {
          try {
            finish();
          } catch (...) {
            abandon();
            throw;
          }
        },
        [this] { abandon(); });
  }
  if (marked_[size_t(param)]) return;
  marked_[size_t(param)] = true;
  Bucket& b = buckets_[size_t(bucket_of_[size_t(param)])];
  ++b.ready;
  launch_ready();
  // Drive the progress of buckets in flight (MPI progresses inside its calls).
  for (size_t i = 0; i < next_launch_; ++i)
    if (buckets_[i].work) buckets_[i].work->test();
}

void DistributedDataParallel::launch_ready() {
  while (next_launch_ < buckets_.size() &&
         buckets_[next_launch_].ready == int64_t(buckets_[next_launch_].params.size()))
    launch(buckets_[next_launch_++]);
}

void DistributedDataParallel::launch(Bucket& b) {
  NoGradGuard ng;
  b.flat = Tensor::zeros({b.numel}, b.dtype, b.device);
  for (size_t j = 0; j < b.params.size(); ++j) {
    const Tensor& p = params_[size_t(b.params[j])];
    Tensor g = p.grad();
    if (!g.defined()) continue;  // no gradient here: this rank contributes zeros
    Tensor dst = flat_view(b.flat, p.shape(), b.offsets[j]);
    copy_(dst, g);
  }
  b.launched = true;
  b.work = dist::all_reduce_async(b.flat, dist::ReduceOp::mean);
}

namespace {
// Clears every bucket's per-backward state for the next backward (finish and abandon).
template <class Buckets>
void clear_buckets(Buckets& buckets) {
  for (auto& b : buckets) {
    b.work.reset();
    b.flat = Tensor();
    b.ready = 0;
    b.launched = false;
  }
}
}  // namespace

void DistributedDataParallel::abandon() {
  // The backward failed before finish(): its reduction is dropped, and the next backward says so
  // (training on would average nothing, silently: every later backward waited for this finish()).
  // An all-reduce already posted keeps writing into its buffer: both stay alive with this object
  // (freeing the buffer let MPI write into whatever the allocator placed there next).
  for (Bucket& b : buckets_)
    if (b.work) abandoned_.emplace_back(std::move(b.work), std::move(b.flat));
  clear_buckets(buckets_);
  std::fill(marked_.begin(), marked_.end(), false);
  next_launch_ = 0;
  in_backward_ = false;
  failed_backward_ = true;
}

void DistributedDataParallel::finish() {
  // Buckets with parameters that got no gradient in this backward start now, in order.
  while (next_launch_ < buckets_.size()) launch(buckets_[next_launch_++]);
  // Which parameters some rank has a gradient for: one with none anywhere keeps no gradient, as
  // in one process (a zero one would let weight decay and momentum move it; PyTorch's DDP does
  // the same since pytorch#28883). A host bitmap summed over the CPU group (MPI): no device read.
  std::vector<int64_t> has(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) has[i] = params_[i].grad().defined() ? 1 : 0;
  if (dist::world_size() > 1 && !params_.empty()) {
    Tensor counts = Tensor::from_vector(has, {int64_t(has.size())});
    dist::all_reduce(counts, dist::ReduceOp::sum);
    has = counts.to_vector<int64_t>();
  }
  for (Bucket& b : buckets_) {
    b.work->wait();
    for (size_t j = 0; j < b.params.size(); ++j) {
      const Tensor& p = params_[size_t(b.params[j])];
      if (has[size_t(b.params[j])] > 0) p.set_grad(flat_view(b.flat, p.shape(), b.offsets[j]));
    }
  }
  clear_buckets(buckets_);
  std::fill(marked_.begin(), marked_.end(), false);
  next_launch_ = 0;
  in_backward_ = false;
}

void save_checkpoint_rank0(const std::string& path, const TrainingCheckpoint& ckpt) {
  if (!dist::is_initialized() || dist::world_size() == 1) {
    save_checkpoint(path, ckpt);
    return;
  }
  std::string error;
  if (dist::rank() == 0) {
    try {
      save_checkpoint(path, ckpt);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  // Everyone learns whether it worked (a barrier alone would leave the others
  // believing in a file that is not there), and rank 0's reason: whichever rank
  // reports first (an app ends the job at its first error) names the real cause.
  Tensor length = Tensor::from_vector(std::vector<int64_t>{int64_t(error.size())}, {1});
  dist::all_reduce(length, dist::ReduceOp::max);
  const int64_t n = length.to_vector<int64_t>()[0];
  if (n == 0) return;
  Tensor text = Tensor::zeros({n}, kInt64);
  if (dist::rank() == 0)
    for (int64_t i = 0; i < n; ++i) text.data<int64_t>()[i] = static_cast<unsigned char>(error[size_t(i)]);
  dist::broadcast(text, 0);
  std::string message;
  for (int64_t v : text.to_vector<int64_t>()) message += char(static_cast<unsigned char>(v));
  throw IOError(dist::rank() == 0 ? message : message + " (rank 0's error, on rank " + std::to_string(dist::rank()) + ")");
}

}  // namespace nn
}  // namespace cf
