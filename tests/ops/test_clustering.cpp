// Clustering ops (autograd/ops/clustering.h): sign hashing of projections and
// Hamming K-Means, against hand-computed references, with their errors and CUDA
// parity (integers: the same on both devices, bit for bit).
#include <algorithm>
#include <limits>
#include <map>
#include <random>

#include "autograd/ops/clustering.h"
#include "kernels/kmeans/hamming.h"
#include "cuda/cuda_test_util.h"

using namespace cf;
using namespace cf::test;

namespace {

Tensor bools(const std::vector<bool>& v, const Shape& s) { return Tensor::from_vector(v, s); }

// Codes of `bits` bits around `groups` random centres per row, each bit flipped
// with probability 0.1: planted clusters for Hamming K-Means.
Tensor planted_codes(int64_t rows, int64_t n, int64_t groups, int64_t bits, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution flip(0.1);
  std::vector<int64_t> v;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<uint64_t> centre(static_cast<size_t>(groups));
    for (auto& c : centre) c = rng() & ((uint64_t(1) << bits) - 1);
    for (int64_t i = 0; i < n; ++i) {
      uint64_t c = centre[size_t(i % groups)];
      for (int64_t b = 0; b < bits; ++b)
        if (flip(rng)) c ^= uint64_t(1) << b;
      v.push_back(int64_t(c));
    }
  }
  return Tensor::from_vector(v, {rows, n});
}

}  // namespace

TEST_SUITE("ops/clustering") {

TEST_CASE("hash_codes: sign bits of random projections, packed in int64") {
  Tensor x = leaf64({2, 5, 4}, 3).detach();
  Generator g(1);
  Tensor planes = random_hyperplanes(7, 4, kFloat64, g);
  auto codes = hash_codes(x, planes).to_vector<int64_t>();
  auto xv = values(x), pv = values(planes);
  for (int64_t r = 0; r < 10; ++r) {
    int64_t want = 0;
    for (int64_t b = 0; b < 7; ++b) {
      double s = 0;
      for (int64_t d = 0; d < 4; ++d) s += xv[size_t(r * 4 + d)] * pv[size_t(b * 4 + d)];
      if (s > 0) want |= int64_t(1) << b;
    }
    CHECK(codes[size_t(r)] == want);
  }
  // 63 bits fit in a non-negative int64.
  Generator g2(2);
  for (int64_t c : hash_codes(x, random_hyperplanes(63, 4, kFloat64, g2)).to_vector<int64_t>()) CHECK(c >= 0);
}

TEST_CASE("Hamming K-Means recovers planted clusters exactly, excludes padding, and clamps the cluster count") {
  const int64_t C = 5, per = 9, N = C * per, bits = 63;
  Generator g(3);
  // Centers 63 random bits apart by ~31; members flip at most 3 bits, so every
  // member is far nearer its own center than any other.
  std::vector<int64_t> centers;
  for (int64_t j = 0; j < C; ++j) centers.push_back(randint(0, int64_t(1) << 62, {1}, g).item<int64_t>());
  std::vector<int64_t> codes, truth;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t j = (i * 7) % C;  // interleaved, so no cluster is contiguous
    int64_t c = centers[size_t(j)];
    auto flips = randint(0, bits, {3}, g).to_vector<int64_t>();
    for (int64_t f : flips) c ^= int64_t(1) << f;
    codes.push_back(c);
    truth.push_back(j);
  }
  // Two rows: the planted data, and the same with the last 4 entries excluded.
  std::vector<int64_t> both = codes;
  both.insert(both.end(), codes.begin(), codes.end());
  std::vector<bool> excl(size_t(2 * N), false);
  for (int64_t i = N - 4; i < N; ++i) excl[size_t(N + i)] = true;
  auto got = hamming_kmeans(ti64(both, {2, N}), C, 10, bits, bools(excl, {2, N})).to_vector<int64_t>();
  for (int row = 0; row < 2; ++row) {
    std::map<int64_t, int64_t> to_truth, from_truth;
    bool consistent = true;
    for (int64_t i = 0; i < N; ++i) {
      int64_t id = got[size_t(row * N + i)];
      if (row == 1 && i >= N - 4) {
        CHECK(id == -1);
        continue;
      }
      auto [it, fresh] = to_truth.emplace(id, truth[size_t(i)]);
      auto [jt, fresh2] = from_truth.emplace(truth[size_t(i)], id);
      consistent = consistent && it->second == truth[size_t(i)] && jt->second == id;
      (void)fresh;
      (void)fresh2;
    }
    CHECK_MESSAGE(consistent, "row ", row, ": the partition differs from the planted one");
    CHECK(to_truth.size() == size_t(C));
  }
  // More clusters than entries: each valid entry alone, ids in [0, n).
  auto few = hamming_kmeans(ti64({1, 2, 4, 8, 16}, {1, 5}), 100, 10, 8, bools({false, false, false, true, true}, {1, 5}))
                 .to_vector<int64_t>();
  CHECK(few == std::vector<int64_t>{0, 1, 2, -1, -1});
  // Duplicate codes only: fewer distinct codes than clusters is no error.
  auto dup = hamming_kmeans(ti64({5, 5, 5, 5}, {1, 4}), 3, 10, 8).to_vector<int64_t>();
  CHECK(dup == std::vector<int64_t>{0, 0, 0, 0});
  // Everything excluded.
  auto none = hamming_kmeans(ti64({1, 2}, {1, 2}), 2, 10, 8, bools({true, true}, {1, 2})).to_vector<int64_t>();
  CHECK(none == std::vector<int64_t>{-1, -1});
}

TEST_CASE("Hamming K-Means: the AVX-512 VPOPCNTDQ form of the loops gives the scalar form's ids") {
  // Few bits make many equal distances, so the tie rules (lower id when assigning,
  // first farthest code when seeding) decide most choices; rows with padding, the
  // planted codes, more clusters than distinct codes, and 1, 3 and 10 Lloyd steps.
  if (!kernels::hamming_kmeans_vectorised())
    MESSAGE("this CPU has no AVX-512 VPOPCNTDQ: both calls run the scalar form");
  std::mt19937_64 rng(11);
  for (int64_t bits : {int64_t(4), int64_t(8), int64_t(63)}) {
    const int64_t G = 6, N = 300;
    std::vector<int64_t> v(size_t(G * N));
    for (auto& e : v) e = int64_t(rng() & ((uint64_t(1) << bits) - 1));
    std::vector<bool> excl(v.size());
    for (size_t i = 0; i < excl.size(); ++i) excl[i] = (i / N) % 2 == 1 && i % 7 == 0;
    for (const Tensor& codes : {ti64(v, {G, N}), planted_codes(G, N, 12, bits, 5)})
      for (int64_t clusters : {int64_t(1), int64_t(12), int64_t(100), int64_t(400)})
        for (int64_t iterations : {int64_t(1), int64_t(3), int64_t(10)}) {
          CAPTURE(bits);
          CAPTURE(clusters);
          CAPTURE(iterations);
          Tensor scalar = Tensor::empty({G, N}, kInt64), vec = Tensor::empty({G, N}, kInt64);
          kernels::hamming_kmeans_cpu(codes, bools(excl, {G, N}), clusters, iterations, bits, scalar, false);
          kernels::hamming_kmeans_cpu(codes, bools(excl, {G, N}), clusters, iterations, bits, vec, true);
          CHECK(scalar.to_vector<int64_t>() == vec.to_vector<int64_t>());
          CHECK(hamming_kmeans(codes, clusters, iterations, bits, bools(excl, {G, N})).to_vector<int64_t>() ==
                scalar.to_vector<int64_t>());
        }
  }
}

TEST_CASE("Hamming K-Means: the Lloyd iterations move a wrong farthest-point split to the right one") {
  // Thermometer codes (value v -> its lowest v bits set) make Hamming distance |v - w|
  // and the majority-vote centroid the median, so the run can be followed by hand.
  // Values 0..9 (one wide group) and 14, 15 (a narrow one), the first entry 0.
  // Farthest-point seeds: 0 and 15 (ids 0 and 1). Assignment: 8 and 9 are nearer 15,
  // so the split is {0..7} | {8, 9, 14, 15}. Iteration 1: medians 3 and 14 (tied
  // bits keep the old ones), 8 moves back: {0..8} | {9, 14, 15}. Iteration 2:
  // medians 4 and 14, 9 is 5 from both and goes to the lower id: {0..9} | {14, 15},
  // the planted split, a fixed point.
  const std::vector<int64_t> value = {0, 14, 1, 8, 2, 15, 3, 9, 4, 5, 6, 7};
  std::vector<int64_t> codes;
  for (int64_t v : value) codes.push_back((int64_t(1) << v) - 1);
  auto split = [&](int64_t iterations) {
    auto ids = hamming_kmeans(ti64(codes, {1, int64_t(codes.size())}), 2, iterations, 16).to_vector<int64_t>();
    std::vector<int64_t> second;  // the values put in cluster 1
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == 1) second.push_back(value[i]);
    std::sort(second.begin(), second.end());
    return second;
  };
  CHECK(split(0) == std::vector<int64_t>{8, 9, 14, 15});
  CHECK(split(1) == std::vector<int64_t>{9, 14, 15});
  CHECK(split(2) == std::vector<int64_t>{14, 15});
  CHECK(split(10) == std::vector<int64_t>{14, 15});
}

TEST_CASE("hash_codes and hamming_kmeans refuse bad input with messages naming the problem") {
  CHECK_THROWS_MSG(hamming_kmeans(ti64({1, 300}, {1, 2}), 2, 10, 8), ValueError,
                   "[hamming_kmeans] code 300", "beyond the 8 given");
  CHECK_THROWS_MSG(hamming_kmeans(ti64({1, -5}, {1, 2}), 2, 10, 63), ValueError,
                   "[hamming_kmeans] code -5 at position 1", "beyond the 63 given");
  // 63 bits take every non-negative int64, the largest too.
  CHECK(hamming_kmeans(ti64({1, std::numeric_limits<int64_t>::max()}, {1, 2}), 2, 10, 63).numel() == 2);
  CHECK_THROWS_MSG(hamming_kmeans(ti64({1, 3}, {1, 2}), 0, 10, 8), ValueError, "clusters must be >= 1");
  CHECK_THROWS_MSG(hamming_kmeans(t64({1, 3}, {1, 2}), 2, 10, 8), DTypeError, "codes must be int64 (G, N)");
  CHECK_THROWS_MSG(hamming_kmeans(ti64({1, 3}, {1, 2}), 2, 10, 8, bools({true}, {1, 1})), ShapeError,
                   "exclude must be bool of the codes' shape (1,2)");
  CHECK_THROWS_MSG(hash_codes(leaf64({2, 3}, 1), leaf64({2, 4}, 2)), ShapeError,
                   "[hash_codes] expected x (..., D) and planes (bits, D)");
  CHECK_THROWS_MSG(random_hyperplanes(0, 4, kFloat32, default_generator()), ValueError, "bits must be in [1, 63]");
  // Operands on two devices are refused by name before any kernel runs (any
  // build: fake_cuda has no storage and is never read).
  CHECK_THROWS_MSG(hash_codes(leaf64({2, 4}, 1), fake_cuda({3, 4}, kFloat64)), DeviceError, "[hash_codes]",
                   "one device", "cuda:0");
  CHECK_THROWS_MSG(hamming_kmeans(ti64({1, 2, 3}, {1, 3}), 2, 10, 8, fake_cuda({1, 3}, kBool)), DeviceError,
                   "[hamming_kmeans] exclude is on cuda:0");
}

PARITY_CASE(hash_codes) {
  Generator g(3);
  const Tensor x = rand({2, 3, 40, 16}, kFloat64, g, -1, 1);
  const Tensor planes = random_hyperplanes(63, 16, kFloat64, g);
  const Tensor c = hash_codes(x, planes), gc = hash_codes(cuda0(x), cuda0(planes));
  CHECK(gc.device().is_cuda());
  CHECK(gc.shape() == c.shape());
  CHECK(gc.cpu().to_vector<int64_t>() == c.to_vector<int64_t>());
}

CUDA_TEST_CASE("a hamming_kmeans code beyond its bits is a deferred check with the CPU's message") {
  const Tensor codes = cuda0(ti64({1, 2, 3, 300, 4, 1000}, {2, 3}));
  cuda::synchronize();
  const cuda::TransferStats before = cuda::transfer_stats();
  const Tensor ids = hamming_kmeans(codes, 2, 10, 8);  // returns without reading the codes back
  const cuda::TransferStats d = cuda::transfer_stats() - before;
  CHECK(d.device_to_host == 0);
  CHECK(d.synchronizations == 0);
  CHECK_THROWS_MSG(ids.to_vector<int64_t>(), ValueError, "[hamming_kmeans] code 300 at position 3",
                   "beyond the 8 given");
  CHECK(hamming_kmeans(codes, 2, 10, 10).cpu().to_vector<int64_t>() ==
        hamming_kmeans(codes.cpu(), 2, 10, 10).to_vector<int64_t>());
}

PARITY_CASE(hamming_kmeans) {
  for (int64_t bits : {8, 31, 63}) {
    INFO("bits ", bits);
    const int64_t rows = 5, n = 70;
    const Tensor codes = planted_codes(rows, n, 6, bits, uint32_t(bits));
    // Row 1: padded tail; row 2: all padding; row 3: only 3 valid entries (fewer
    // than the clusters); rows 0 and 4: everything valid.
    std::vector<bool> ex(size_t(rows * n), false);
    for (int64_t i = 50; i < n; ++i) ex[size_t(1 * n + i)] = true;
    for (int64_t i = 0; i < n; ++i) ex[size_t(2 * n + i)] = true;
    for (int64_t i = 3; i < n; ++i) ex[size_t(3 * n + i)] = true;
    const Tensor excl = Tensor::from_vector(ex, {rows, n});
    for (int64_t clusters : {1, 6, 20, 100}) {
      INFO("clusters ", clusters);
      for (int64_t iterations : {0, 1, 10}) {
        const Tensor c = hamming_kmeans(codes, clusters, iterations, bits, excl);
        const Tensor gc = hamming_kmeans(cuda0(codes), clusters, iterations, bits, cuda0(excl));
        CHECK(gc.device().is_cuda());
        CHECK(gc.cpu().to_vector<int64_t>() == c.to_vector<int64_t>());
      }
    }
    // Without an exclusion mask, and with duplicate codes (re-seeding stops).
    const Tensor dup = Tensor::from_vector(std::vector<int64_t>(40, 5), {1, 40});
    CHECK(hamming_kmeans(cuda0(dup), 4, 10, bits).cpu().to_vector<int64_t>() ==
          hamming_kmeans(dup, 4, 10, bits).to_vector<int64_t>());
    CHECK(hamming_kmeans(cuda0(codes), 6, 10, bits).cpu().to_vector<int64_t>() ==
          hamming_kmeans(codes, 6, 10, bits).to_vector<int64_t>());
  }
}

}  // TEST_SUITE
