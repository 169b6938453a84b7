#pragma once
// Datasets: random access to (input, target) examples.
//
// An Example holds CPU tensors. The DataLoader (nn/data/loader.h) collates them by
// these rules, which also say what each kind of data looks like here:
//   - a 1-d int64 tensor is a token sequence: when every example's field is one, the
//     sequences of a batch may differ in length and are padded (inputs with pad_id,
//     targets with target_pad); an empty text is an empty int64 tensor, a row of padding
//     (Python's data bridge makes one of an empty list or tuple; an empty float tensor beside
//     token sequences is refused, naming it);
//   - anything else (images, feature vectors, a 0-d class id) has a fixed shape and the
//     examples of a batch are stacked along a new axis 0, their dtypes promoted as
//     PyTorch's default_collate does (an int label beside a float one: float labels);
//   - an undefined target (Tensor()) means "no target"; a batch then has none.
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace cf {
namespace data {

struct Example {
  Tensor input;
  Tensor target;  // may be undefined
};

// Random access to examples. get() is const and must be safe to call from the
// DataLoader's prefetch thread while the caller holds no other reference that
// writes to the dataset (all datasets in this folder are immutable after
// construction, so concurrent get() calls are fine).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Example i, 0 <= i < size(); anything else throws IndexError.
  virtual Example get(int64_t i) const = 0;
};

// Examples are the slices along axis 0 of `inputs` and `targets` (which must agree
// in their first dimension; targets may be undefined). Slices are views: get() does
// not copy. Class labels are an int64 tensor of shape (N,), each slice 0-d.
class TensorDataset : public Dataset {
 public:
  TensorDataset(Tensor inputs, Tensor targets = Tensor());
  int64_t size() const override { return n_; }
  Example get(int64_t i) const override;
  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor inputs_, targets_;
  int64_t n_ = 0;
};

// Variable-length int64 token sequences as inputs (1-d tensors), with
//   - no target,
//   - a class id per sequence (0-d int64 target), or
//   - a token sequence per example (1-d int64 target, e.g. a translation).
// language_model() builds next-token examples: input seq[0..n-2], target seq[1..n-1].
class SequenceDataset : public Dataset {
 public:
  explicit SequenceDataset(std::vector<std::vector<int64_t>> inputs);
  SequenceDataset(std::vector<std::vector<int64_t>> inputs, std::vector<int64_t> labels);
  SequenceDataset(std::vector<std::vector<int64_t>> inputs,
                  std::vector<std::vector<int64_t>> target_sequences);
  // Each sequence needs at least 2 tokens (ValueError naming the first that has fewer).
  static SequenceDataset language_model(const std::vector<std::vector<int64_t>>& sequences);

  int64_t size() const override { return int64_t(inputs_.size()); }
  Example get(int64_t i) const override;

 private:
  enum class TargetKind { None, Label, Sequence };
  std::vector<std::vector<int64_t>> inputs_;
  std::vector<int64_t> labels_;
  std::vector<std::vector<int64_t>> target_seqs_;
  TargetKind kind_ = TargetKind::None;
};

}  // namespace data
}  // namespace cf
