// Storage over borrowed memory (core/storage.h): what the Python package's
// cf.from_dlpack wraps NumPy's and PyTorch's buffers in.
#include <memory>
#include <vector>

#include "test_util.h"

using namespace cf;

TEST_SUITE("core") {

TEST_CASE("storage: borrowed memory is used in place and released once, by the last view") {
  std::vector<float> buffer{1, 2, 3, 4, 5, 6};
  int released = 0;
  const int64_t live_before = memory_stats().live_bytes;
  Tensor row;
  {
    auto impl = std::make_shared<TensorImpl>();
    impl->shape = {2, 3};
    impl->strides = {3, 1};
    impl->storage = std::make_shared<Storage>(buffer.data(), buffer.size() * sizeof(float), Device::cpu(),
                                              [&released] { ++released; });
    Tensor t(impl);
    CHECK(memory_stats().live_bytes == live_before);  // not cf's allocation
    CHECK(t.raw_data() == buffer.data());
    row = slice(t, 0, 1, 2);  // a view keeps the storage alive
    Tensor doubled = t * 2.0;
    CHECK(doubled.to_vector<float>() == std::vector<float>{2, 4, 6, 8, 10, 12});
    fill_(row, 0.0);  // writes go to the borrowed buffer
    CHECK(buffer[3] == 0.0f);
    CHECK(buffer[0] == 1.0f);
  }
  CHECK(released == 0);
  row = Tensor();
  CHECK(released == 1);
}

}  // TEST_SUITE
