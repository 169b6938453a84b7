#pragma once
// DataLoader: batches of a Dataset, optionally shuffled (seeded, reproducible on
// every standard library), padded, prefetched on a background thread, and
// resumable mid-epoch at the exact same batch.
//
//   auto ds = std::make_shared<data::SequenceDataset>(
//       data::SequenceDataset::language_model(token_lists));
//   data::DataLoaderOptions o;
//   o.batch_size = 32; o.shuffle = true; o.seed = 7; o.prefetch = 2;
//   data::DataLoader loader(ds, o);
//   for (int e = 0; e < epochs; ++e)
//     for (const data::Batch& b : loader) { ... b.input (B,N) int64, b.key_padding_mask (B,N) ... }
//
// Iteration and state. The loader keeps a position state() = {epoch, batch}: the
// next batch it will deliver. next() (and a range-for, which calls it) delivers that
// batch and advances; when batch == size() the epoch is over, next() returns false
// (a range-for ends) and the state becomes {epoch + 1, 0}. A range-for that stops
// early (break, exception) leaves the state at the first batch not yet delivered,
// so the next range-for continues the epoch there. To restart training from a
// checkpoint, store state() and call set_state() on a loader built with the same
// dataset and options: the batches that follow are bit-identical.
//
// Shuffle. Epoch e's order is a Fisher-Yates shuffle driven by Philox4x32-10 with
// key = seed and counter = 2^63 + e * 2^32 + i for the swap at position i, so it
// depends only on (seed, e, dataset size): not on the standard library, on
// prefetching, or on where a run was resumed. j = (64 random bits) mod (i + 1); the
// modulo bias is below 2^-32 for any dataset we can index. The top counter bit keeps
// these draws apart from the counters that random ops take from a Generator.
//
// Distributed sampling. With num_replicas = W > 1 every rank builds the same epoch
// order (same seed) and cuts it into global batches of G = batch_size * W; rank r
// gets rows [r * g / W, (r + 1) * g / W) of each global batch of g rows. So W ranks
// together see exactly the batches one process with batch_size G would see (but for
// the repeated examples of the last batch without drop_last, below; token
// sequences padded to the global batch's longest, as one process pads them), and a
// mean loss over one target per example averaged over ranks (DDP) is the one
// process's mean loss (a mean over each rank's non-padding target tokens is not: the
// ranks' counts differ, and DDP averages the ranks' means). Without
// drop_last the order is first padded to a multiple of W by repeating its first
// examples (at most W - 1), so the last global batch splits evenly. The state
// {epoch, batch} counts global batches: it is the same on every rank and means the
// same position for any W, so a run resumes on any world size that divides G.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "nn/data/dataset.h"

namespace cf {
namespace data {

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  uint64_t seed = 0;
  bool drop_last = false;       // drop a last batch smaller than batch_size
  int64_t pad_id = 0;           // input padding token (<pad> of the tokenizers is 0)
  int64_t target_pad = -100;    // target sequence padding (cross_entropy's ignore_index)
  int64_t pad_to_multiple = 1;  // padded length rounded up to a multiple of this
  int64_t prefetch = 0;         // batches a background thread builds ahead; 0 = none
  // Distributed sampling (DistributedDataParallel): num_replicas ranks each take
  // their share of every global batch of batch_size * num_replicas examples (see top).
  int64_t num_replicas = 1;
  int64_t rank = 0;
};

struct Batch {
  Tensor input;             // (B, ...) stacked, or (B, N) int64 padded sequences
  Tensor target;            // (B, ...) stacked, (B, M) padded sequences, or undefined
  Tensor key_padding_mask;  // (B, N) bool, true = padding; undefined unless inputs are sequences
  int64_t size = 0;         // B
  std::vector<int64_t> indices;  // the dataset index of each row
};

struct LoaderState {
  int64_t epoch = 0;
  int64_t batch = 0;  // the next batch to deliver; size() means the epoch is over
  bool operator==(const LoaderState& o) const { return epoch == o.epoch && batch == o.batch; }
  bool operator!=(const LoaderState& o) const { return !(*this == o); }
};

// Padded lengths a batch's sequences reach at least (0: their own longest). A distributed
// loader pads each rank's share to the longest of the whole global batch, as one process
// pads it: an attention whose result depends on the padded length N (neural clustering's
// cluster count, LSH's buckets, routing) sees the N one process sees.
struct PadAtLeast {
  int64_t input = 0;
  int64_t target = 0;
  // Another rank's share holds an example whose field is no token sequence: one process would stack
  // the global batch's field, not pad it, and so does every rank.
  bool stack_input = false;
  bool stack_target = false;
};

// Turn examples into a batch (rules in nn/data/dataset.h). Uses pad_id, target_pad
// and pad_to_multiple from `options`. `indices` (the dataset index of each example,
// for error messages and Batch::indices) may be empty: positions 0..B-1 are used.
// Mismatched examples give a ShapeError / DTypeError naming both indices and shapes.
Batch collate(const std::vector<Example>& examples, const DataLoaderOptions& options,
              const std::vector<int64_t>& indices = {}, PadAtLeast at_least = {});

class DataLoader {
 public:
  class Iterator;

  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  ~DataLoader();  // stops and joins the prefetch thread
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Batches per epoch.
  int64_t size() const { return num_batches_; }
  const DataLoaderOptions& options() const { return opt_; }
  const Dataset& dataset() const { return *dataset_; }

  LoaderState state() const { return state_; }
  // Move to {epoch, batch}; 0 <= batch <= size(). Drops any prefetched batches.
  void set_state(const LoaderState& s);
  // Shorthand for set_state({epoch, 0}).
  void set_epoch(int64_t epoch) { set_state({epoch, 0}); }

  // Deliver the batch at state() and advance; false at the end of an epoch (see top).
  // An exception from the dataset or collate leaves the state unchanged (a retry
  // asks for the same batch), with or without prefetch.
  bool next(Batch& out);
  // Stop the prefetch thread and drop what it built ahead; state() is unchanged.
  void stop();

  // Stateless random access: batch b of epoch e (no prefetch).
  Batch batch(int64_t epoch, int64_t b) const;
  // Dataset indices of epoch e in delivery order (distributed: every rank's, the
  // padded global order; this rank's are its share of each global batch).
  std::vector<int64_t> epoch_order(int64_t epoch) const;

  // Range-for over the rest of the current epoch (see top).
  Iterator begin();
  Iterator end();

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = const Batch*;
    using reference = const Batch&;

    Iterator() = default;
    Iterator(Iterator&& o) noexcept;
    Iterator& operator=(Iterator&& o) noexcept;
    Iterator(const Iterator&) = delete;
    Iterator& operator=(const Iterator&) = delete;
    ~Iterator();  // an iteration abandoned early stops the prefetch thread

    const Batch& operator*() const { return batch_; }
    const Batch* operator->() const { return &batch_; }
    Iterator& operator++();
    bool operator==(const Iterator& o) const { return done() == o.done(); }
    bool operator!=(const Iterator& o) const { return !(*this == o); }

   private:
    friend class DataLoader;
    explicit Iterator(DataLoader* loader);
    bool done() const { return loader_ == nullptr; }
    DataLoader* loader_ = nullptr;
    Batch batch_;
  };

 private:
  std::shared_ptr<const std::vector<int64_t>> order_for(int64_t epoch);
  Batch make_batch(const std::vector<int64_t>& order, int64_t b) const;
  void start_worker();
  void stop_worker();             // stop() without the consumer guard (its callers hold it)
  void stop_if_idle() noexcept;   // an iterator's stop: skipped while another thread consumes
  void worker_main(int64_t start, std::shared_ptr<const std::vector<int64_t>> order);

  // The consumer side (next, set_state) is one stream: a second thread entering it while
  // another is inside gets a ValueError (two threads sharing a prefetching loader raced on its
  // state; one failed with an internal-sounding error, the other waited forever).
  class ConsumerGuard;
  std::atomic<bool> consuming_{false};

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions opt_;
  int64_t n_ = 0;
  int64_t padded_n_ = 0;  // n_, or the distributed order's padded length
  int64_t num_batches_ = 0;
  LoaderState state_;

  // cached order of one epoch
  int64_t order_epoch_ = -1;
  std::shared_ptr<const std::vector<int64_t>> order_;

  // prefetch (all below m_ except worker_ itself, which only the consumer touches)
  std::thread worker_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  std::exception_ptr worker_error_;
  bool stop_flag_ = false;
  bool worker_done_ = false;
  bool worker_running_ = false;  // a worker exists for (worker_epoch_, worker_next_)
  int64_t worker_epoch_ = 0;
  int64_t worker_next_ = 0;  // the batch index the front of the queue holds
};

}  // namespace data
}  // namespace cf
