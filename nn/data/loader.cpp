#include "nn/data/loader.h"

#include <algorithm>
#include <new>
#include <numeric>
#include <utility>

#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/shape.h"
#include "core/rng.h"

namespace cf {
namespace data {

namespace {

// A token sequence: 1-d int64 (whatever the other examples hold, so every rank of a distributed loader
// decides alike; Python's data bridge turns an empty list into an empty int64 one).
bool is_sequence(const Tensor& t) { return t.defined() && t.dtype() == kInt64 && t.dim() == 1; }
// A field is padded when every example's is a token sequence.
bool all_sequences(const std::vector<Tensor>& ts) { return std::all_of(ts.begin(), ts.end(), is_sequence); }

int64_t round_up(int64_t n, int64_t m) { return m <= 1 ? n : (n + m - 1) / m * m; }

// Collate one field ("input" or "target") of every example.
// Returns the batched tensor; for sequences also fills `lengths`.
Tensor collate_field(const std::vector<Tensor>& ts, const std::vector<int64_t>& idx,
                     const char* field, int64_t pad_value, int64_t multiple,
                     std::vector<int64_t>* lengths, int64_t at_least, bool stack_anyway) {
  const Tensor& t0 = ts[0];
  // Token sequences (every example's field 1-d int64) are padded; anything else is stacked, its dtypes
  // promoted as PyTorch's default_collate does (an int label beside a float one gives float labels).
  const bool seq = !stack_anyway && all_sequences(ts);
  DType common = t0.dtype();
  for (const Tensor& t : ts) common = promote_types(common, t.dtype());
  if (!seq && !stack_anyway && is_sequence(t0))
    for (size_t i = 0; i < ts.size(); ++i)
      if (!is_sequence(ts[i]) && ts[i].shape() != t0.shape())
        // Token sequences but for this example (so nothing is padded, and lengths cannot stack): name it,
        // not the first sequence whose length differs.
        throw ShapeError(str("[collate] example ", idx[i], " has ", field, " ", ts[i].describe(), " but example ",
                             idx[0], " has a token sequence ", t0.describe(), "; token sequences are 1-d int64 "
                             "tensors, padded to the longest"));
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    CF_CHECK(t.device().is_cpu(), DeviceError, "[collate] example ", idx[i], " has its ", field,
             " on ", t.device(), "; datasets must return CPU tensors");
    if (!seq) {
      CF_CHECK(t.shape() == t0.shape(), ShapeError, "[collate] example ", idx[i], " has ", field,
               " shape ", shape_str(t.shape()), " (", t.dtype(), ") but example ", idx[0], " has ",
               shape_str(t0.shape()), " (", t0.dtype(), "); only 1-d int64 token sequences are padded, when "
               "every example's ", field, " is one");
    }
  }
  if (!seq) {
    if (std::all_of(ts.begin(), ts.end(), [&](const Tensor& t) { return t.dtype() == common; })) return stack(ts, 0);
    std::vector<Tensor> same;
    same.reserve(ts.size());
    for (const Tensor& t : ts) same.push_back(to(t, common));
    return stack(same, 0);
  }

  int64_t b = int64_t(ts.size()), longest = at_least;
  for (const Tensor& t : ts) longest = std::max(longest, t.size(0));
  int64_t n = round_up(longest, multiple);
  Tensor out = Tensor::full({b, n}, double(pad_value), kInt64);
  int64_t* o = out.data<int64_t>();
  if (lengths) lengths->resize(size_t(b));
  for (int64_t i = 0; i < b; ++i) {
    std::vector<int64_t> v = ts[size_t(i)].to_vector<int64_t>();
    std::copy(v.begin(), v.end(), o + i * n);
    if (lengths) (*lengths)[size_t(i)] = int64_t(v.size());
  }
  return out;
}

}  // namespace

Batch collate(const std::vector<Example>& examples, const DataLoaderOptions& options,
              const std::vector<int64_t>& indices, PadAtLeast at_least) {
  CF_CHECK(!examples.empty(), ValueError, "[collate] no examples");
  CF_CHECK(indices.empty() || indices.size() == examples.size(), ValueError, "[collate] ",
           examples.size(), " examples but ", indices.size(), " indices");
  CF_CHECK(options.pad_to_multiple >= 1, ValueError, "[collate] pad_to_multiple must be >= 1, got ",
           options.pad_to_multiple);
  std::vector<int64_t> idx = indices;
  if (idx.empty()) {
    idx.resize(examples.size());
    std::iota(idx.begin(), idx.end(), int64_t(0));
  }
  std::vector<Tensor> in, tg;
  in.reserve(examples.size());
  bool has_target = examples[0].target.defined();
  for (size_t i = 0; i < examples.size(); ++i) {
    const Example& e = examples[i];
    CF_CHECK(e.input.defined(), ValueError, "[collate] example ", idx[i], " has no input");
    CF_CHECK(e.target.defined() == has_target, ValueError, "[collate] example ", idx[i],
             (has_target ? " has no target but example " : " has a target but example "), idx[0],
             (has_target ? " has one" : " has none"));
    in.push_back(e.input);
    if (has_target) tg.push_back(e.target);
  }
  Batch b;
  b.size = int64_t(examples.size());
  b.indices = std::move(idx);
  std::vector<int64_t> lengths;
  b.input = collate_field(in, b.indices, "input", options.pad_id, options.pad_to_multiple, &lengths,
                          at_least.input, at_least.stack_input);
  if (!at_least.stack_input && all_sequences(in)) {
    int64_t n = b.input.size(1);
    std::vector<bool> mask(size_t(b.size * n));
    for (int64_t i = 0; i < b.size; ++i)
      for (int64_t j = 0; j < n; ++j) mask[size_t(i * n + j)] = j >= lengths[size_t(i)];
    b.key_padding_mask = Tensor::from_vector(mask, Shape{b.size, n});
  }
  if (has_target)
    b.target = collate_field(tg, b.indices, "target", options.target_pad, options.pad_to_multiple,
                             nullptr, at_least.target, at_least.stack_target);
  return b;
}

// ---------------------------------------------------------------- DataLoader

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), opt_(options) {
  CF_CHECK(dataset_ != nullptr, ValueError, "[DataLoader] dataset is null");
  CF_CHECK(opt_.batch_size >= 1, ValueError, "[DataLoader] batch_size must be >= 1, got ",
           opt_.batch_size);
  CF_CHECK(opt_.pad_to_multiple >= 1, ValueError,
           "[DataLoader] pad_to_multiple must be >= 1, got ", opt_.pad_to_multiple);
  CF_CHECK(opt_.prefetch >= 0, ValueError, "[DataLoader] prefetch must be >= 0, got ",
           opt_.prefetch);
  CF_CHECK(opt_.num_replicas >= 1, ValueError, "[DataLoader] num_replicas must be >= 1, got ",
           opt_.num_replicas);
  CF_CHECK(opt_.rank >= 0 && opt_.rank < opt_.num_replicas, ValueError, "[DataLoader] rank ", opt_.rank,
           " is outside [0, ", opt_.num_replicas, ") (num_replicas)");
  n_ = dataset_->size();
  CF_CHECK(n_ >= 0 && n_ < (int64_t(1) << 32), ValueError,
           "[DataLoader] dataset size ", n_, " is outside [0, 2^32)");
  const int64_t W = opt_.num_replicas, G = opt_.batch_size * W;
  // Distributed without drop_last: the order padded to a multiple of W (see loader.h).
  padded_n_ = (W > 1 && !opt_.drop_last) ? (n_ + W - 1) / W * W : n_;
  num_batches_ = opt_.drop_last ? n_ / G : (padded_n_ + G - 1) / G;
}

DataLoader::~DataLoader() { stop_worker(); }

class DataLoader::ConsumerGuard {
 public:
  ConsumerGuard(DataLoader& l, const char* op) : flag_(l.consuming_) {
    CF_CHECK(!flag_.exchange(true), ValueError, "[", op, "] another thread is inside this DataLoader: a loader is one "
             "stream of batches; give each thread its own DataLoader (or take batches under a lock)");
  }
  ~ConsumerGuard() { flag_.store(false); }
  ConsumerGuard(const ConsumerGuard&) = delete;
  ConsumerGuard& operator=(const ConsumerGuard&) = delete;

 private:
  std::atomic<bool>& flag_;
};

void DataLoader::set_state(const LoaderState& s) {
  ConsumerGuard consumer(*this, "DataLoader::set_state");
  CF_CHECK(s.epoch >= 0 && s.epoch < (int64_t(1) << 31), ValueError,
           "[DataLoader::set_state] epoch ", s.epoch, " is outside [0, 2^31)");
  CF_CHECK(s.batch >= 0 && s.batch <= num_batches_, ValueError, "[DataLoader::set_state] batch ",
           s.batch, " is outside [0, ", num_batches_, "] (batches per epoch)");
  stop_worker();
  state_ = s;
}

std::vector<int64_t> DataLoader::epoch_order(int64_t epoch) const {
  CF_CHECK(epoch >= 0 && epoch < (int64_t(1) << 31), ValueError,
           "[DataLoader::epoch_order] epoch ", epoch, " is outside [0, 2^31)");
  std::vector<int64_t> order;
  try {
    order.reserve(static_cast<size_t>(padded_n_));
  } catch (const std::bad_alloc&) {  // (a bare bad_alloc reaches Python as a MemoryError with no message)
    throw Error(str("[DataLoader] out of CPU memory for the order of an epoch: ", padded_n_, " examples take ",
                    padded_n_ * int64_t(sizeof(int64_t)), " bytes"));
  }
  order.resize(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), int64_t(0));
  if (!opt_.shuffle) {
    for (int64_t i = n_; i < padded_n_; ++i) order.push_back(order[size_t(i - n_)]);
    return order;
  }
  const uint64_t base = (uint64_t(1) << 63) | (uint64_t(epoch) << 32);
  for (int64_t i = n_ - 1; i > 0; --i) {
    PhiloxOut r = philox4x32_10(opt_.seed, base | uint64_t(i));
    uint64_t x = (uint64_t(r.v[0]) << 32) | uint64_t(r.v[1]);
    int64_t j = int64_t(x % uint64_t(i + 1));
    std::swap(order[size_t(i)], order[size_t(j)]);
  }
  for (int64_t i = n_; i < padded_n_; ++i) order.push_back(order[size_t(i - n_)]);
  return order;
}

std::shared_ptr<const std::vector<int64_t>> DataLoader::order_for(int64_t epoch) {
  if (order_epoch_ != epoch || !order_) {
    order_ = std::make_shared<const std::vector<int64_t>>(epoch_order(epoch));
    order_epoch_ = epoch;
  }
  return order_;
}

Batch DataLoader::make_batch(const std::vector<int64_t>& order, int64_t b) const {
  const int64_t W = opt_.num_replicas, G = opt_.batch_size * W;
  const int64_t global_lo = b * G, global_hi = std::min(padded_n_, global_lo + G);
  int64_t lo = global_lo, hi = global_hi;
  if (W > 1) {  // this rank's share of the global batch [lo, hi)
    const int64_t g = hi - lo;
    hi = lo + (opt_.rank + 1) * g / W;
    lo = lo + opt_.rank * g / W;
  }
  std::vector<int64_t> idx(order.begin() + lo, order.begin() + hi);
  std::vector<Example> ex;
  ex.reserve(idx.size());
  for (int64_t i : idx) ex.push_back(dataset_->get(i));
  PadAtLeast at_least;
  const bool seq_in = std::any_of(ex.begin(), ex.end(), [](const Example& e) { return is_sequence(e.input); });
  const bool seq_tg = std::any_of(ex.begin(), ex.end(), [](const Example& e) { return is_sequence(e.target); });
  if (W > 1 && (seq_in || seq_tg)) {
    // the other ranks' rows of this global batch: their lengths, and whether they are sequences at all
    // (PadAtLeast says why)
    for (int64_t j = global_lo; j < global_hi; ++j) {
      if (j >= lo && j < hi) continue;
      const Example e = dataset_->get(order[size_t(j)]);
      if (is_sequence(e.input)) at_least.input = std::max(at_least.input, e.input.size(0));
      else at_least.stack_input = true;
      if (is_sequence(e.target)) at_least.target = std::max(at_least.target, e.target.size(0));
      else at_least.stack_target = true;
    }
  }
  return collate(ex, opt_, idx, at_least);
}

Batch DataLoader::batch(int64_t epoch, int64_t b) const {
  CF_CHECK(b >= 0 && b < num_batches_, IndexError, "[DataLoader::batch] batch ", b,
           " out of range for ", num_batches_, " batches per epoch");
  return make_batch(epoch_order(epoch), b);
}

void DataLoader::stop() {
  ConsumerGuard consumer(*this, "DataLoader::stop");
  stop_worker();
}

void DataLoader::stop_if_idle() noexcept {
  // An iterator ending (break, an exception) while another thread is inside next(): the worker
  // is that thread's now; stopping it there would strand or fail its wait.
  if (consuming_.exchange(true)) return;
  stop_worker();
  consuming_.store(false);
}

void DataLoader::stop_worker() {
  {
    std::lock_guard<std::mutex> l(m_);
    stop_flag_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> l(m_);
  queue_.clear();
  worker_error_ = nullptr;
  stop_flag_ = false;
  worker_done_ = false;
  worker_running_ = false;
}

void DataLoader::worker_main(int64_t start,
                             std::shared_ptr<const std::vector<int64_t>> order) {
  // Nothing may escape this function: every failure goes to worker_error_.
  try {
    NoGradGuard no_grad;
    for (int64_t b = start; b < num_batches_; ++b) {
      {
        std::unique_lock<std::mutex> l(m_);
        cv_.wait(l, [&] { return stop_flag_ || int64_t(queue_.size()) < opt_.prefetch; });
        if (stop_flag_) break;
      }
      Batch x = make_batch(*order, b);
      {
        std::lock_guard<std::mutex> l(m_);
        queue_.push_back(std::move(x));
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> l(m_);
    worker_error_ = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> l(m_);
    worker_done_ = true;
  }
  cv_.notify_all();
}

void DataLoader::start_worker() {
  stop_worker();
  auto order = order_for(state_.epoch);
  worker_epoch_ = state_.epoch;
  worker_next_ = state_.batch;
  worker_running_ = true;
  worker_ = std::thread(&DataLoader::worker_main, this, state_.batch, std::move(order));
}

bool DataLoader::next(Batch& out) {
  ConsumerGuard consumer(*this, "DataLoader::next");
  if (state_.batch >= num_batches_) {
    stop_worker();
    CF_CHECK(state_.epoch + 1 < (int64_t(1) << 31), ValueError, "[DataLoader::next] epoch ",
             state_.epoch + 1, " is outside [0, 2^31)");
    state_ = {state_.epoch + 1, 0};
    return false;
  }
  if (opt_.prefetch == 0) {
    out = make_batch(*order_for(state_.epoch), state_.batch);
    ++state_.batch;
    return true;
  }
  if (!worker_running_ || worker_epoch_ != state_.epoch || worker_next_ != state_.batch)
    start_worker();
  Batch got;
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return !queue_.empty() || worker_error_ || worker_done_; });
    if (!queue_.empty()) {
      got = std::move(queue_.front());
      queue_.pop_front();
    } else {
      err = worker_error_;
    }
  }
  cv_.notify_all();
  if (!got.input.defined()) {
    stop_worker();  // the worker has finished; a retry starts a fresh one at this batch
    if (err) std::rethrow_exception(err);
    throw Error(str("[DataLoader::next] the prefetch thread ended before batch ", state_.batch,
                    " of epoch ", state_.epoch));
  }
  out = std::move(got);
  ++worker_next_;
  ++state_.batch;
  return true;
}

// ---------------------------------------------------------------- iteration

DataLoader::Iterator DataLoader::begin() { return Iterator(this); }
DataLoader::Iterator DataLoader::end() { return Iterator(); }

DataLoader::Iterator::Iterator(DataLoader* loader) : loader_(loader) {
  if (!loader_->next(batch_)) loader_ = nullptr;
}

DataLoader::Iterator::Iterator(Iterator&& o) noexcept
    : loader_(std::exchange(o.loader_, nullptr)), batch_(std::move(o.batch_)) {}

DataLoader::Iterator& DataLoader::Iterator::operator=(Iterator&& o) noexcept {
  if (this != &o) {
    if (loader_) loader_->stop_if_idle();
    loader_ = std::exchange(o.loader_, nullptr);
    batch_ = std::move(o.batch_);
  }
  return *this;
}

DataLoader::Iterator::~Iterator() {
  if (loader_) loader_->stop_if_idle();
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  if (!loader_) return *this;
  DataLoader* l = loader_;
  loader_ = nullptr;  // if next() throws, this iterator is finished (and stops nothing twice)
  if (l->next(batch_)) loader_ = l;
  return *this;
}

}  // namespace data
}  // namespace cf
