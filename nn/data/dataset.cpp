#include "nn/data/dataset.h"

#include "autograd/ops/shape.h"

namespace cf {
namespace data {

namespace {
Tensor seq_tensor(const std::vector<int64_t>& s) {
  return Tensor::from_vector(s, Shape{int64_t(s.size())});
}
void check_index(const char* op, int64_t i, int64_t n) {
  CF_CHECK(i >= 0 && i < n, IndexError, "[", op, "] index ", i, " out of range for a dataset of ",
           n, " examples");
}
}  // namespace

TensorDataset::TensorDataset(Tensor inputs, Tensor targets)
    : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  CF_CHECK(inputs_.defined(), ValueError, "[TensorDataset] inputs are undefined");
  CF_CHECK(inputs_.dim() >= 1, ShapeError,
           "[TensorDataset] inputs need an axis 0 of examples, got shape ",
           shape_str(inputs_.shape()));
  CF_CHECK(inputs_.device().is_cpu(), DeviceError, "[TensorDataset] inputs are on ",
           inputs_.device(), "; datasets hold CPU tensors");
  n_ = inputs_.size(0);
  if (targets_.defined()) {
    CF_CHECK(targets_.dim() >= 1 && targets_.size(0) == n_, ShapeError,
             "[TensorDataset] inputs ", shape_str(inputs_.shape()), " and targets ",
             shape_str(targets_.shape()), " differ in their number of examples (axis 0)");
    CF_CHECK(targets_.device().is_cpu(), DeviceError, "[TensorDataset] targets are on ",
             targets_.device(), "; datasets hold CPU tensors");
  }
  inputs_ = inputs_.detach();
  if (targets_.defined()) targets_ = targets_.detach();
}

Example TensorDataset::get(int64_t i) const {
  check_index("TensorDataset::get", i, n_);
  Example e;
  e.input = squeeze(narrow(inputs_, 0, i, 1), 0);
  if (targets_.defined()) e.target = squeeze(narrow(targets_, 0, i, 1), 0);
  return e;
}

SequenceDataset::SequenceDataset(std::vector<std::vector<int64_t>> inputs)
    : inputs_(std::move(inputs)) {}

SequenceDataset::SequenceDataset(std::vector<std::vector<int64_t>> inputs,
                                 std::vector<int64_t> labels)
    : inputs_(std::move(inputs)), labels_(std::move(labels)), kind_(TargetKind::Label) {
  CF_CHECK(labels_.size() == inputs_.size(), ShapeError, "[SequenceDataset] ", inputs_.size(),
           " sequences but ", labels_.size(), " labels");
}

SequenceDataset::SequenceDataset(std::vector<std::vector<int64_t>> inputs,
                                 std::vector<std::vector<int64_t>> target_sequences)
    : inputs_(std::move(inputs)),
      target_seqs_(std::move(target_sequences)),
      kind_(TargetKind::Sequence) {
  CF_CHECK(target_seqs_.size() == inputs_.size(), ShapeError, "[SequenceDataset] ",
           inputs_.size(), " input sequences but ", target_seqs_.size(), " target sequences");
}

SequenceDataset SequenceDataset::language_model(const std::vector<std::vector<int64_t>>& sequences) {
  std::vector<std::vector<int64_t>> in, tg;
  in.reserve(sequences.size());
  tg.reserve(sequences.size());
  for (size_t i = 0; i < sequences.size(); ++i) {
    const auto& s = sequences[i];
    CF_CHECK(s.size() >= 2, ValueError, "[SequenceDataset::language_model] sequence ", i, " has ",
             s.size(), " token(s); next-token examples need at least 2");
    in.emplace_back(s.begin(), s.end() - 1);
    tg.emplace_back(s.begin() + 1, s.end());
  }
  return SequenceDataset(std::move(in), std::move(tg));
}

Example SequenceDataset::get(int64_t i) const {
  check_index("SequenceDataset::get", i, size());
  Example e;
  e.input = seq_tensor(inputs_[size_t(i)]);
  if (kind_ == TargetKind::Label)
    e.target = Tensor::from_vector(std::vector<int64_t>{labels_[size_t(i)]}, Shape{});
  else if (kind_ == TargetKind::Sequence)
    e.target = seq_tensor(target_seqs_[size_t(i)]);
  return e;
}

}  // namespace data
}  // namespace cf
