// nn::DeviceTableCache: size-dependent index tables built once per (sizes, device)
// and kept for the most recently used sizes.
#include "nn/nn_test_util.h"
#include "nn/table_cache.h"

using namespace cf;
using namespace cf::test;

TEST_CASE("DeviceTableCache builds once per key, keeps the 8 most recently used, rebuilds after eviction") {
  nn::DeviceTableCache cache;
  int builds = 0;
  auto get = [&](int64_t n) {
    return cache.get({n, 2 * n}, Device::cpu(), [&] {
      ++builds;
      return std::vector<Tensor>{Tensor::arange(n, kInt64), Tensor()};
    });
  };
  std::vector<Tensor> a = get(3);
  REQUIRE(a.size() == 2);
  CHECK(values(a[0]) == std::vector<double>{0, 1, 2});
  CHECK_FALSE(a[1].defined());  // an undefined table stays undefined
  CHECK(builds == 1);
  // Alternating lengths (batches padded to their longest) reuse both entries.
  for (int i = 0; i < 4; ++i) {
    CHECK(values(get(5)[0]).size() == 5);
    CHECK(values(get(3)[0]).size() == 3);
  }
  CHECK(builds == 2);
  CHECK(get(3)[0].raw_data() == a[0].raw_data());  // the same tensor, not a copy
  // Six more lengths fill the 8 entries: 5 is now the least recently used (3 was used after it).
  for (int64_t n = 10; n < 16; ++n) get(n);
  CHECK(builds == 8);
  get(3);
  CHECK(builds == 8);
  get(17);  // a ninth length evicts 5
  CHECK(builds == 9);
  get(3);
  get(15);
  CHECK(builds == 9);
  get(5);
  CHECK(builds == 10);
  // Another device is another entry.
  cache.get({3, 6}, Device::cuda(0), [&] {
    ++builds;
    return std::vector<Tensor>{};
  });
  CHECK(builds == 11);
}
