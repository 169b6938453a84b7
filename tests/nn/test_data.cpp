// Data loading: datasets, collate (stacking, padding, masks), seeded shuffle,
// drop_last, resumable state and background prefetch.
#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "nn/data/dataset.h"
#include "nn/data/loader.h"
#include "test_util.h"

using namespace cf;
using namespace cf::data;
using cf::test::ti64;

namespace {

std::vector<int64_t> iv(const Tensor& t) { return t.to_vector<int64_t>(); }
std::vector<bool> bv(const Tensor& t) { return t.to_vector<bool>(); }

// Bitwise equality of two batches (all fields).
void check_same_batch(const Batch& a, const Batch& b) {
  REQUIRE(a.size == b.size);
  CHECK(a.indices == b.indices);
  REQUIRE(a.input.shape() == b.input.shape());
  REQUIRE(a.input.dtype() == b.input.dtype());
  CHECK(cf::test::values(a.input) == cf::test::values(b.input));
  REQUIRE(a.target.defined() == b.target.defined());
  if (a.target.defined()) {
    REQUIRE(a.target.shape() == b.target.shape());
    CHECK(cf::test::values(a.target) == cf::test::values(b.target));
  }
  REQUIRE(a.key_padding_mask.defined() == b.key_padding_mask.defined());
  if (a.key_padding_mask.defined()) CHECK(bv(a.key_padding_mask) == bv(b.key_padding_mask));
}

// Sequences of varying length whose tokens encode their index: seq i = [i*10, i*10+1, ...].
std::vector<std::vector<int64_t>> make_seqs(int n) {
  std::vector<std::vector<int64_t>> s;
  for (int i = 0; i < n; ++i) {
    std::vector<int64_t> v;
    for (int k = 0; k < 1 + (i * 7) % 5; ++k) v.push_back(i * 10 + k + 1);
    s.push_back(v);
  }
  return s;
}

// A dataset that returns whatever a callback builds, or throws at one index.
class FnDataset : public Dataset {
 public:
  using Fn = std::function<Example(int64_t)>;
  FnDataset(int64_t n, Fn f) : n_(n), f_(std::move(f)) {}
  int64_t size() const override { return n_; }
  Example get(int64_t i) const override { return f_(i); }

 private:
  int64_t n_;
  Fn f_;
};

// Throws ValueError at index `bad` while `fail` is set.
class FlakyDataset : public Dataset {
 public:
  FlakyDataset(int64_t n, int64_t bad) : n_(n), bad_(bad) {}
  int64_t size() const override { return n_; }
  Example get(int64_t i) const override {
    if (i == bad_ && fail.load()) throw ValueError(str("[FlakyDataset] example ", i, " is broken"));
    return {Tensor::full({2}, double(i)), Tensor::scalar(double(i % 3), kInt64)};
  }
  mutable std::atomic<bool> fail{true};

 private:
  int64_t n_, bad_;
};

std::vector<Batch> drain_epoch(DataLoader& l) {
  std::vector<Batch> out;
  for (const Batch& b : l) out.push_back(b);
  return out;
}

}  // namespace

TEST_SUITE("data") {

TEST_CASE("data: TensorDataset slices along axis 0 and the loader stacks them") {
  std::vector<float> x(5 * 2 * 3);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);
  auto ds = std::make_shared<TensorDataset>(Tensor::from_vector(x, {5, 2, 3}),
                                            ti64({0, 1, 2, 3, 4}, {5}));
  CHECK(ds->size() == 5);
  Example e = ds->get(3);
  CHECK(e.input.shape() == Shape{2, 3});
  CHECK(e.target.dim() == 0);
  CHECK(e.target.item<int64_t>() == 3);
  CHECK_THROWS_MSG(ds->get(5), IndexError, "[TensorDataset::get]", "index 5", "5 examples");
  CHECK_THROWS_MSG(ds->get(-1), IndexError, "index -1");

  DataLoaderOptions o;
  o.batch_size = 2;
  DataLoader l(ds, o);
  CHECK(l.size() == 3);
  std::vector<Batch> bs = drain_epoch(l);
  REQUIRE(bs.size() == 3);
  CHECK(bs[0].input.shape() == Shape{2, 2, 3});
  CHECK(bs[2].input.shape() == Shape{1, 2, 3});
  CHECK(bs[2].size == 1);
  CHECK(bs[1].indices == std::vector<int64_t>{2, 3});
  cf::test::check_close(bs[1].input, std::vector<double>{12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                                          22, 23});
  CHECK(iv(bs[1].target) == std::vector<int64_t>{2, 3});
  CHECK(bs[1].target.shape() == Shape{2});
  CHECK_FALSE(bs[0].key_padding_mask.defined());
  CHECK(l.state() == LoaderState{1, 0});

  o.drop_last = true;
  DataLoader l2(ds, o);
  CHECK(l2.size() == 2);
  bs = drain_epoch(l2);
  CHECK(bs.size() == 2);
  // Without targets the batch has none.
  DataLoader l3(std::make_shared<TensorDataset>(Tensor::from_vector(x, {5, 2, 3})), o);
  CHECK_FALSE(drain_epoch(l3)[0].target.defined());

  CHECK_THROWS_MSG(TensorDataset(Tensor::zeros({4, 2}), ti64({0, 1, 2}, {3})), ShapeError,
                   "[TensorDataset]", "(4,2)", "(3)");
  CHECK_THROWS_MSG(TensorDataset(Tensor::scalar(1.0)), ShapeError, "[TensorDataset]", "axis 0");
}

TEST_CASE("data: token sequences are padded, with a mask that is true on padding") {
  auto ds = std::make_shared<SequenceDataset>(
      std::vector<std::vector<int64_t>>{{5, 6, 7}, {8}, {9, 10}, {}}, std::vector<int64_t>{1, 0, 1, 0});
  DataLoaderOptions o;
  o.batch_size = 4;
  DataLoader l(ds, o);
  Batch b;
  REQUIRE(l.next(b));
  CHECK(b.input.shape() == Shape{4, 3});
  CHECK(b.input.dtype() == kInt64);
  CHECK(iv(b.input) == std::vector<int64_t>{5, 6, 7, 8, 0, 0, 9, 10, 0, 0, 0, 0});
  CHECK(b.key_padding_mask.dtype() == kBool);
  CHECK(b.key_padding_mask.shape() == Shape{4, 3});
  CHECK(bv(b.key_padding_mask) ==
        std::vector<bool>{false, false, false, false, true, true, false, false, true, true, true, true});
  CHECK(iv(b.target) == std::vector<int64_t>{1, 0, 1, 0});
  CHECK(b.target.shape() == Shape{4});
  CHECK_FALSE(l.next(b));

  o.pad_id = 99;
  o.pad_to_multiple = 4;
  o.batch_size = 2;
  DataLoader l2(ds, o);
  REQUIRE(l2.next(b));
  CHECK(b.input.shape() == Shape{2, 4});
  CHECK(iv(b.input) == std::vector<int64_t>{5, 6, 7, 99, 8, 99, 99, 99});
  CHECK(bv(b.key_padding_mask) == std::vector<bool>{false, false, false, true, false, true, true, true});
  REQUIRE(l2.next(b));  // {9, 10} and {}: longest 2 -> padded to 4
  CHECK(iv(b.input) == std::vector<int64_t>{9, 10, 99, 99, 99, 99, 99, 99});

  // Equal lengths are still sequences: an all-false mask.
  Batch c = collate({{ti64({1, 2}, {2}), Tensor()}, {ti64({3, 4}, {2}), Tensor()}}, {});
  CHECK(bv(c.key_padding_mask) == std::vector<bool>{false, false, false, false});
  CHECK(c.indices == std::vector<int64_t>{0, 1});
}

TEST_CASE("data: language-model and sequence targets are padded with target_pad") {
  auto ds = std::make_shared<SequenceDataset>(
      SequenceDataset::language_model({{1, 2, 3, 4}, {5, 6}}));
  CHECK(ds->size() == 2);
  DataLoaderOptions o;
  o.batch_size = 2;
  DataLoader l(ds, o);
  Batch b;
  REQUIRE(l.next(b));
  CHECK(iv(b.input) == std::vector<int64_t>{1, 2, 3, 5, 0, 0});
  CHECK(iv(b.target) == std::vector<int64_t>{2, 3, 4, 6, -100, -100});
  CHECK(b.target.shape() == b.input.shape());
  CHECK(bv(b.key_padding_mask) == std::vector<bool>{false, false, false, false, true, true});
  CHECK_THROWS_MSG(SequenceDataset::language_model({{1, 2}, {3}}), ValueError,
                   "[SequenceDataset::language_model]", "sequence 1", "1 token");

  // Sequence-to-sequence: the target is padded to its own longest length.
  auto s2s = std::make_shared<SequenceDataset>(std::vector<std::vector<int64_t>>{{1}, {2, 3}},
                                               std::vector<std::vector<int64_t>>{{7, 8, 9}, {4}});
  o.target_pad = -1;
  DataLoader l2(s2s, o);
  REQUIRE(l2.next(b));
  CHECK(b.input.shape() == Shape{2, 2});
  CHECK(iv(b.target) == std::vector<int64_t>{7, 8, 9, 4, -1, -1});
  CHECK_THROWS_MSG(SequenceDataset({{1}, {2}}, std::vector<int64_t>{1}), ShapeError,
                   "[SequenceDataset]", "2 sequences", "1 labels");
}

TEST_CASE("data: mismatched examples give errors naming indices and shapes") {
  auto ds = std::make_shared<FnDataset>(4, [](int64_t i) {
    return Example{Tensor::zeros({2, i == 2 ? 4 : 3}), Tensor::scalar(0, kInt64)};
  });
  DataLoaderOptions o;
  o.batch_size = 4;
  DataLoader l(ds, o);
  Batch b;
  CHECK_THROWS_MSG(l.next(b), ShapeError, "[collate]", "example 2", "input shape (2,4)",
                   "example 0 has (2,3)");
  CHECK(l.state() == LoaderState{0, 0});

  auto dt = std::make_shared<FnDataset>(2, [](int64_t i) {
    return Example{Tensor::zeros({3}, i == 0 ? kFloat32 : kFloat64), Tensor()};
  });
  DataLoader l2(dt, o);  // dtypes promote, as PyTorch's default_collate (float32 with float64: float64)
  l2.next(b);
  CHECK(b.input.dtype() == kFloat64);
  CHECK(b.input.shape() == Shape{2, 3});
  // an int label beside a float one: float labels; a 1-d int64 row beside a float row is stacked, not padded
  Batch mixed = collate({{ti64({1, 2}, {2}), Tensor::scalar(3, kInt64)}, {Tensor::full({2}, 0.5), Tensor::scalar(2.5)}}, {});
  CHECK(mixed.input.dtype() == kFloat32);
  CHECK(mixed.input.to_vector<float>() == std::vector<float>{1, 2, 0.5f, 0.5f});
  CHECK_FALSE(mixed.key_padding_mask.defined());
  CHECK(mixed.target.to_vector<float>() == std::vector<float>{3, 2.5f});
  CHECK_THROWS_MSG(collate({{ti64({1, 2}, {2}), Tensor()}, {Tensor::full({3}, 0.5), Tensor()}}, {}), ShapeError,
                   "[collate] example 1 has input float32 (3)", "but example 0 has a token sequence int64 (2)");
  // Token sequences of several lengths and one that is not: the error names that one, not the first
  // sequence of another length.
  CHECK_THROWS_MSG(collate({{ti64({1, 2, 3}, {3}), Tensor()}, {ti64({4}, {1}), Tensor()}, {Tensor::zeros({2, 2}), Tensor()}},
                           {}),
                   ShapeError, "[collate] example 2 has input float32 (2,2)", "but example 0 has a token sequence");
  // An empty sequence (an empty text) is a row of padding.
  Batch with_empty = collate({{ti64({5, 6}, {2}), Tensor()}, {Tensor::empty({0}, kInt64), Tensor()}, {ti64({7}, {1}), Tensor()}},
                             {});
  CHECK(with_empty.input.to_vector<int64_t>() == std::vector<int64_t>{5, 6, 0, 0, 7, 0});
  CHECK(with_empty.key_padding_mask.to_vector<bool>() == std::vector<bool>{false, false, true, true, false, true});
  // A rank whose share is all sequences, where another rank's is not, stacks as one process would.
  PadAtLeast stack_in;
  stack_in.stack_input = true;
  Batch stacked = collate({{ti64({1, 2}, {2}), Tensor()}, {ti64({3, 4}, {2}), Tensor()}}, {}, {}, stack_in);
  CHECK(stacked.input.shape() == Shape{2, 2});
  CHECK_FALSE(stacked.key_padding_mask.defined());
  CHECK_THROWS_MSG(collate({{ti64({1, 2}, {2}), Tensor()}, {ti64({3}, {1}), Tensor()}}, {}, {}, stack_in), ShapeError,
                   "[collate]", "example 1 has input shape (1) (int64)");
  CHECK_THROWS_MSG(collate({{ti64({1}, {1}), Tensor()}, {Tensor::zeros({1, 1}, kInt64), Tensor()}},
                           {}, {7, 9}),
                   ShapeError, "[collate]", "example 9", "(1,1)", "example 7", "token sequence");
  CHECK_THROWS_MSG(collate({{ti64({1}, {1}), ti64({1}, {1})}, {ti64({1}, {1}), Tensor()}}, {}),
                   ValueError, "[collate]", "example 1 has no target", "example 0 has one");
  CHECK_THROWS_MSG(collate({{ti64({1}, {1}), Tensor::zeros({2})}, {ti64({1}, {1}), Tensor::zeros({1})}},
                           {}, {3, 4}),
                   ShapeError, "[collate]", "example 4 has target shape (1)", "example 3 has (2)");
  CHECK_THROWS_MSG(collate({}, {}), ValueError, "[collate] no examples");
  CHECK_THROWS_MSG(collate({{Tensor(), Tensor()}}, {}), ValueError, "[collate]", "example 0 has no input");
}

TEST_CASE("data: a loader entered by a second consumer while one is inside refuses it (no race, no hang)") {
  // Two threads sharing a prefetching loader raced on its state: one got an internal-sounding
  // error and the other waited forever. Here the dataset itself re-enters the loader.
  DataLoader* self = nullptr;
  std::string seen;
  auto ds = std::make_shared<FnDataset>(4, [&](int64_t i) {
    if (i == 0 && self) {
      Batch b;
      try {
        self->next(b);
      } catch (const ValueError& e) {
        seen = e.what();
      }
      try {
        self->stop();  // stop() is a consumer call too: it would end the prefetch another one waits on
      } catch (const ValueError& e) {
        seen += e.what();
      }
    }
    return Example{Tensor::scalar(double(i)), Tensor()};
  });
  DataLoaderOptions o;
  o.batch_size = 2;
  DataLoader loader(ds, o);
  self = &loader;
  Batch b;
  CHECK(loader.next(b));
  CHECK(seen.find("[DataLoader::next] another thread is inside this DataLoader") != std::string::npos);
  CHECK(seen.find("[DataLoader::stop] another thread is inside") != std::string::npos);
  CHECK(loader.next(b));  // the guard was released
}

TEST_CASE("data: bad options and states are refused") {
  auto ds = std::make_shared<SequenceDataset>(make_seqs(5));
  DataLoaderOptions o;
  o.batch_size = 0;
  CHECK_THROWS_MSG(DataLoader(ds, o), ValueError, "[DataLoader]", "batch_size", "0");
  o.batch_size = 2;
  o.prefetch = -1;
  CHECK_THROWS_MSG(DataLoader(ds, o), ValueError, "[DataLoader]", "prefetch");
  o.prefetch = 0;
  o.pad_to_multiple = 0;
  CHECK_THROWS_MSG(DataLoader(ds, o), ValueError, "[DataLoader]", "pad_to_multiple");
  CHECK_THROWS_MSG(DataLoader(nullptr), ValueError, "[DataLoader] dataset is null");
  o.pad_to_multiple = 1;
  DataLoader l(ds, o);
  CHECK(l.size() == 3);
  CHECK_THROWS_MSG(l.set_state({0, 4}), ValueError, "[DataLoader::set_state]", "batch 4", "[0, 3]");
  CHECK_THROWS_MSG(l.set_state({-1, 0}), ValueError, "[DataLoader::set_state]", "epoch -1");
  CHECK_THROWS_MSG(l.batch(0, 3), IndexError, "[DataLoader::batch]", "batch 3");
}

TEST_CASE("data: shuffle is seeded, differs between epochs and is the same everywhere") {
  auto ds = std::make_shared<SequenceDataset>(make_seqs(10));
  DataLoaderOptions o;
  o.shuffle = true;
  o.seed = 1234;
  DataLoader a(ds, o), b(ds, o);
  std::vector<int64_t> e0 = a.epoch_order(0), e1 = a.epoch_order(1);
  CHECK(e0 == b.epoch_order(0));
  CHECK(e0 != e1);
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 10; ++i) CHECK(sorted[size_t(i)] == i);
  // Pinned: the order comes from Philox alone, never from the standard library.
  CHECK(e0 == std::vector<int64_t>{3, 9, 5, 2, 6, 8, 7, 0, 4, 1});
  CHECK(e1 == std::vector<int64_t>{0, 6, 9, 7, 1, 8, 2, 4, 3, 5});
  o.seed = 1235;
  DataLoader c(ds, o);
  CHECK(c.epoch_order(0) != e0);
  o.shuffle = false;
  DataLoader d(ds, o);
  CHECK(d.epoch_order(5) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});

  // Batches follow the epoch order.
  o.shuffle = true;
  o.seed = 1234;
  o.batch_size = 3;
  DataLoader l(ds, o);
  std::vector<int64_t> seen;
  for (const Batch& bt : l) seen.insert(seen.end(), bt.indices.begin(), bt.indices.end());
  CHECK(seen == e0);
  seen.clear();
  for (const Batch& bt : l) seen.insert(seen.end(), bt.indices.begin(), bt.indices.end());
  CHECK(seen == e1);
  CHECK(l.state() == LoaderState{2, 0});
  // drop_last drops the tail of each epoch's order.
  o.drop_last = true;
  DataLoader dl(ds, o);
  CHECK(dl.size() == 3);
  seen.clear();
  for (const Batch& bt : dl) seen.insert(seen.end(), bt.indices.begin(), bt.indices.end());
  CHECK(seen == std::vector<int64_t>(e0.begin(), e0.begin() + 9));
}

TEST_CASE("data: state() and set_state() resume at the exact batch") {
  auto ds = std::make_shared<SequenceDataset>(SequenceDataset::language_model(
      [] {
        auto s = make_seqs(11);
        for (auto& v : s) v.push_back(0);
        return s;
      }()));
  DataLoaderOptions o;
  o.batch_size = 3;
  o.shuffle = true;
  o.seed = 5;
  DataLoader ref(ds, o);
  std::vector<Batch> all;  // epochs 0-2
  for (int e = 0; e < 3; ++e)
    for (const Batch& b : ref) all.push_back(b);
  REQUIRE(all.size() == 12);

  DataLoader r(ds, o);
  r.set_state({1, 2});
  std::vector<Batch> rest;
  Batch b;
  while (rest.size() < 6) {
    if (r.next(b)) rest.push_back(b);
  }
  for (size_t i = 0; i < rest.size(); ++i) check_same_batch(rest[i], all[6 + i]);
  CHECK(r.state() == LoaderState{2, 4});
  // The end-of-epoch state is allowed and ends the epoch at once.
  r.set_state({0, 4});
  CHECK_FALSE(r.next(b));
  CHECK(r.state() == LoaderState{1, 0});
  r.set_epoch(2);
  REQUIRE(r.next(b));
  check_same_batch(b, all[8]);
  check_same_batch(r.batch(2, 3), all[11]);

  // A range-for left early continues where it stopped.
  DataLoader c(ds, o);
  int k = 0;
  for (const Batch& x : c) {
    check_same_batch(x, all[size_t(k)]);
    if (++k == 2) break;
  }
  CHECK(c.state() == LoaderState{0, 2});
  for (const Batch& x : c) check_same_batch(x, all[size_t(k++)]);
  CHECK(k == 4);
  CHECK(c.state() == LoaderState{1, 0});
}

TEST_CASE("data: prefetch gives the same batches as no prefetch") {
  auto ds = std::make_shared<SequenceDataset>(make_seqs(23), [] {
    std::vector<int64_t> y;
    for (int i = 0; i < 23; ++i) y.push_back(i % 4);
    return y;
  }());
  DataLoaderOptions o;
  o.batch_size = 4;
  o.shuffle = true;
  o.seed = 99;
  o.pad_to_multiple = 2;
  DataLoader ref(ds, o);
  std::vector<Batch> all;
  for (int e = 0; e < 3; ++e)
    for (const Batch& b : ref) all.push_back(b);
  REQUIRE(all.size() == 18);
  for (int64_t depth : {1, 3, 8}) {
    CAPTURE(depth);
    o.prefetch = depth;
    DataLoader p(ds, o);
    std::vector<Batch> got;
    for (int e = 0; e < 3; ++e)
      for (const Batch& b : p) got.push_back(b);
    REQUIRE(got.size() == all.size());
    for (size_t i = 0; i < got.size(); ++i) check_same_batch(got[i], all[i]);
    // Abandon mid-epoch, jump around, resume.
    DataLoader q(ds, o);
    int n = 0;
    for (const Batch& b : q) {
      check_same_batch(b, all[size_t(n)]);
      if (++n == 3) break;
    }
    Batch b;
    REQUIRE(q.next(b));
    check_same_batch(b, all[3]);
    q.set_state({2, 1});
    REQUIRE(q.next(b));
    check_same_batch(b, all[13]);
    q.set_state({0, 5});
    REQUIRE(q.next(b));
    check_same_batch(b, all[5]);
    CHECK_FALSE(q.next(b));
    REQUIRE(q.next(b));
    check_same_batch(b, all[6]);
  }
}

TEST_CASE("data: an exception in the dataset reaches the caller, with or without prefetch") {
  for (int64_t depth : {0, 1, 4}) {
    CAPTURE(depth);
    auto ds = std::make_shared<FlakyDataset>(10, 5);
    DataLoaderOptions o;
    o.batch_size = 2;
    o.prefetch = depth;
    DataLoader l(ds, o);
    Batch b;
    REQUIRE(l.next(b));
    REQUIRE(l.next(b));
    CHECK(l.state() == LoaderState{0, 2});
    CHECK_THROWS_MSG(l.next(b), ValueError, "[FlakyDataset] example 5 is broken");
    CHECK(l.state() == LoaderState{0, 2});
    CHECK_THROWS_MSG(l.next(b), ValueError, "example 5");  // a retry asks for the same batch
    ds->fail = false;
    REQUIRE(l.next(b));
    CHECK(b.indices == std::vector<int64_t>{4, 5});
    // In a range-for the exception leaves the loop; the loader stays usable.
    ds->fail = true;
    l.set_state({0, 0});
    int n = 0;
    CHECK_THROWS_MSG(
        [&] {
          for (const Batch& x : l) {
            (void)x;
            ++n;
          }
        }(),
        ValueError, "example 5");
    CHECK(n == 2);
  }
}

TEST_CASE("data: a loader destroyed with a full prefetch queue joins its thread") {
  auto ds = std::make_shared<SequenceDataset>(make_seqs(40));
  DataLoaderOptions o;
  o.prefetch = 2;
  for (int i = 0; i < 5; ++i) {
    DataLoader l(ds, o);
    Batch b;
    REQUIRE(l.next(b));
    if (i % 2) l.stop();
  }
  {
    DataLoader l(ds, o);
    for (const Batch& b : l) {
      (void)b;
      break;
    }
    CHECK(l.state() == LoaderState{0, 1});
  }
  // An empty dataset has no batches; each pass just moves to the next epoch.
  DataLoader e(std::make_shared<SequenceDataset>(std::vector<std::vector<int64_t>>{}), o);
  CHECK(e.size() == 0);
  CHECK(drain_epoch(e).empty());
  CHECK(e.state() == LoaderState{1, 0});
}

}  // TEST_SUITE
