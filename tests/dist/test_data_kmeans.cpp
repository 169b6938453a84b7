// The distributed sampler, rank-0 checkpoints and distributed K-Means.
#include <cstdio>
#include <filesystem>

#include "nn/kmeans_test_util.h"
#include "test_util.h"

using namespace cf;
using namespace cf::test;
namespace d = cf::dist;

namespace {
std::shared_ptr<data::TensorDataset> numbered(int64_t n) {
  return std::make_shared<data::TensorDataset>(Tensor::arange(n, kInt64));
}
// The dataset indices every rank's batch b holds, concatenated in rank order.
std::vector<int64_t> gathered_indices(const data::Batch& b) {
  Tensor mine = Tensor::from_vector(b.indices, {int64_t(b.indices.size())});
  return d::all_gather(mine).to_vector<int64_t>();
}
}  // namespace

TEST_CASE("sampler: W ranks together deliver one process's batches of batch_size * W") {
  const int R = d::rank(), W = d::world_size();
  for (bool drop_last : {false, true}) {
    CAPTURE(drop_last);
    const int64_t n = 23;  // not a multiple of 3 * W: exercises the padding
    data::DataLoaderOptions one;
    one.batch_size = 3 * W;
    one.shuffle = true;
    one.seed = 4;
    one.drop_last = drop_last;
    data::DataLoaderOptions mine = one;
    mine.batch_size = 3;
    mine.num_replicas = W;
    mine.rank = R;
    data::DataLoader ref(numbered(n), one), loader(numbered(n), mine);
    if (!drop_last && W > 1) {
      // The one process sees n examples; W ranks see the order padded to a multiple of W.
      CHECK(loader.size() == (n + W - 1) / W * W / (3 * W) + ((n + W - 1) / W * W % (3 * W) ? 1 : 0));
    } else {
      CHECK(loader.size() == ref.size());
    }
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      std::vector<int64_t> seen;
      for (int64_t b = 0; b < loader.size(); ++b) {
        data::Batch x = loader.batch(epoch, b);
        std::vector<int64_t> all = gathered_indices(x);
        if (b < ref.size() && (drop_last || W == 1 || (b + 1) * 3 * W <= n)) {
          CHECK(all == ref.batch(epoch, b).indices);  // the one process's batch, in order
        }
        seen.insert(seen.end(), all.begin(), all.end());
      }
      if (!drop_last) {
        std::sort(seen.begin(), seen.end());
        seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
        CHECK(int64_t(seen.size()) == n);  // every example, some repeated by the padding
      }
    }
  }
  // Token sequences: every rank's share is padded to the global batch's longest, the width one process
  // pads to (each rank padded to its own longest before, so length-dependent attentions saw another N).
  {
    std::vector<std::vector<int64_t>> seqs, tseqs;
    for (int64_t i = 0; i < 24; ++i) {
      seqs.push_back(std::vector<int64_t>(size_t(2 + (i * 7) % 11), i + 1));
      tseqs.push_back(std::vector<int64_t>(size_t(1 + (i * 5) % 9), i));
    }
    auto ds = std::make_shared<data::SequenceDataset>(seqs, tseqs);
    data::DataLoaderOptions one;
    one.batch_size = 2 * W;
    one.shuffle = true;
    one.seed = 6;
    data::DataLoaderOptions mine = one;
    mine.batch_size = 2;
    mine.num_replicas = W;
    mine.rank = R;
    data::DataLoader ref(ds, one), loader(ds, mine);
    for (int64_t b = 0; b < ref.size(); ++b) {
      data::Batch whole = ref.batch(0, b), part = loader.batch(0, b);
      CHECK(part.input.size(1) == whole.input.size(1));
      CHECK(part.target.size(1) == whole.target.size(1));
      CHECK(part.key_padding_mask.size(1) == whole.key_padding_mask.size(1));
    }
  }
  // Resumable: the state counts global batches; a loader set to it continues exactly.
  data::DataLoaderOptions o;
  o.batch_size = 2;
  o.shuffle = true;
  o.seed = 9;
  o.num_replicas = W;
  o.rank = R;
  data::DataLoader a(numbered(17), o);
  data::Batch x;
  a.next(x);
  a.next(x);
  data::LoaderState s = a.state();
  a.next(x);
  data::DataLoader b(numbered(17), o);
  b.set_state(s);
  data::Batch y;
  b.next(y);
  CHECK(y.indices == x.indices);
  // Bad input names the problem.
  data::DataLoaderOptions bad = o;
  bad.rank = W;
  CHECK_THROWS_MSG(data::DataLoader(numbered(4), bad), ValueError, "[DataLoader] rank", "num_replicas");
  bad.rank = 0;
  bad.num_replicas = 0;
  CHECK_THROWS_MSG(data::DataLoader(numbered(4), bad), ValueError, "num_replicas must be >= 1");
}

TEST_CASE("checkpoint: rank 0 writes, every rank can read it after") {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / "cf_dist_ckpt").string();
  if (d::is_main()) fs::create_directories(dir);
  d::barrier();
  nn::TrainingCheckpoint c;
  c.model.push_back({"w", Tensor::full({2}, 1.5 + d::rank())});  // only rank 0's is written
  c.step = 7;
  const std::string path = dir + "/ckpt.safetensors";
  nn::save_checkpoint_rank0(path, c);
  nn::TrainingCheckpoint back = nn::load_checkpoint(path);
  CHECK(back.step == 7);
  REQUIRE(back.model.size() == 1);
  CHECK(back.model[0].first == "w");
  check_close(back.model[0].second, std::vector<double>{1.5, 1.5}, 0.0);
  // A failed write on rank 0 is an error on every rank, with rank 0's reason (the others said only that it failed).
  CHECK_THROWS_MSG(nn::save_checkpoint_rank0(dir + "/no/such/dir/ckpt.safetensors", c), IOError, "no/such/dir",
                   "No such file or directory");
  d::barrier();
  if (d::is_main()) fs::remove_all(dir);
}

TEST_CASE("kmeans_distributed: equals kmeans on the stacked data, same seeding") {
  const int R = d::rank(), W = d::world_size();
  for (auto init : {nn::KMeansInit::kmeans_plus_plus, nn::KMeansInit::random}) {
    for (auto metric : {nn::KMeansMetric::l2, nn::KMeansMetric::cosine}) {
      CAPTURE(int(init));
      CAPTURE(int(metric));
      Planted p = planted(120, 4, 5, 3.0, 0.6, 21);
      nn::KMeansOptions o;
      o.k = 5;
      o.seed = 3;
      o.init = init;
      o.metric = metric;
      nn::KMeansResult one = nn::kmeans(p.x, o);
      // Uneven shards: rank r holds rows [lo, hi).
      int64_t lo = 120 * R / W + (R > 0 ? 7 : 0), hi = R == W - 1 ? 120 : 120 * (R + 1) / W + 7;
      nn::KMeansResult mine = nn::kmeans_distributed(narrow(p.x, 0, lo, hi - lo), o);
      CHECK(mine.iterations == one.iterations);
      CHECK(mine.converged == one.converged);
      CHECK(mine.assignments.to_vector<int64_t>() == narrow(one.assignments, 0, lo, hi - lo).to_vector<int64_t>());
      check_close(mine.centroids, one.centroids, 1e-12);
      CHECK(std::abs(mine.inertia - one.inertia) <= 1e-9 * one.inertia);
    }
  }
  // Empty clusters re-seeded over all ranks (max_iter 1 from a bad start still fills every cluster).
  Planted p = planted(40, 3, 4, 2.0, 0.3, 5);
  nn::KMeansOptions o;
  o.k = 4;
  o.seed = 1;
  nn::KMeansResult one = nn::kmeans(p.x, o);
  nn::KMeansResult mine = nn::kmeans_distributed(narrow(p.x, 0, 40 * R / W, 40 * (R + 1) / W - 40 * R / W), o);
  check_close(mine.centroids, one.centroids, 1e-12);
  // Too few distinct points: the same error on every rank.
  Tensor same = Tensor::ones({3, 2}, kFloat64);
  o.k = 2;
  CHECK_THROWS_MSG(nn::kmeans_distributed(same, o), nn::KMeansTooFewPointsError, "ranks) has only 1 distinct points, fewer than k = 2");
  o.k = 100;
  CHECK_THROWS_MSG(nn::kmeans_distributed(Tensor::ones({3, 2}, kFloat64), o), ValueError, "[kmeans_distributed]",
                   "exceeds the number of points");
  CHECK_THROWS_MSG(nn::kmeans_distributed(Tensor::ones({3, 2 + R}, kFloat64), o), d::DistError, "width");
  if (W > 1) {
    // A rank without rows (kmeans.h allows it; it was refused as empty input, and the others hung): the
    // stacked data's result.
    o.k = 4;
    const int64_t lo = R == 0 ? 0 : 40 * (R - 1) / (W - 1), hi = R == 0 ? 0 : 40 * R / (W - 1);
    nn::KMeansResult shard = nn::kmeans_distributed(narrow(p.x, 0, lo, hi - lo), o);
    check_close(shard.centroids, one.centroids, 1e-12);
    CHECK(shard.assignments.size(0) == hi - lo);
    // A NaN on one rank: that rank names it, every other rank stops too (they waited until the timeout).
    Tensor x = contiguous(p.x.detach() * 1.0);
    if (R == 1) x.data<double>()[5] = std::nan("");
    if (R == 1)
      CHECK_THROWS_MSG(nn::kmeans_distributed(x, o), ValueError, "[kmeans_distributed]", "nan");
    else
      CHECK_THROWS_MSG(nn::kmeans_distributed(x, o), d::DistError, "rank 1's input failed its checks");
  }
}

TEST_CASE("sampler: a state saved by one process resumes on W processes at the same global batch") {
  const int R = d::rank(), W = d::world_size();
  data::DataLoaderOptions one;
  one.batch_size = 2 * W;
  one.shuffle = true;
  one.seed = 5;
  one.drop_last = true;
  data::DataLoader single(numbered(40), one);
  data::Batch b;
  for (int i = 0; i < 3; ++i) single.next(b);
  data::LoaderState s = single.state();
  single.next(b);  // what one process delivers next
  data::DataLoaderOptions mine = one;
  mine.batch_size = 2;
  mine.num_replicas = W;
  mine.rank = R;
  data::DataLoader loader(numbered(40), mine);
  loader.set_state(s);
  data::Batch x;
  loader.next(x);
  CHECK(gathered_indices(x) == b.indices);
}

TEST_CASE("memory bank: distributed banks get the centroids of one bank holding every rank's states") {
  const int R = d::rank(), W = d::world_size();
  nn::MemoryBankOptions o;
  o.dim = 4;
  o.num_clusters = 3;
  o.capacity = 64;
  o.update_every = 1;
  o.kmeans_iters = 10;
  o.seed = 2;
  Planted p = planted(12 * W, 4, 3, 2.0, 0.2, 9, kFloat32);
  // One bank fed every rank's rows in rank order (the union's order).
  Generator g1(1), g2(1);
  nn::MemoryBank one(o, g1);
  one.add(p.x);
  one.update_centroids();
  o.distributed = true;
  nn::MemoryBank mine(o, g2);
  mine.add(narrow(p.x, 0, 12 * R, 12));
  CHECK(mine.step());  // every rank decides from the total held
  check_close(mine.centroids, one.centroids, 1e-6);
}
