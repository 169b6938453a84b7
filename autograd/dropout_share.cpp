#include "autograd/dropout_share.h"

#include <atomic>

#include "core/error.h"

namespace cf {

namespace {
// One word, so that a reader never sees the index of one share with the count of another.
std::atomic<uint64_t> g_share{1};  // count in the low 32 bits, index in the high 32
}  // namespace

void set_dropout_share(int64_t index, int64_t count) {
  CF_CHECK(count >= 1 && count <= INT32_MAX && index >= 0 && index < count, ValueError,
           "[set_dropout_share] index must be in [0, count) with 1 <= count < 2^31, got index ", index, " count ",
           count);
  g_share.store((uint64_t(index) << 32) | uint64_t(count));
}

DropoutShare dropout_share() {
  const uint64_t s = g_share.load();
  return {int64_t(s >> 32), int64_t(s & 0xFFFFFFFFu)};
}

uint64_t reserve_dropout_counters(Generator& gen, uint64_t n) {
  const DropoutShare s = dropout_share();
  return gen.reserve(n * uint64_t(s.count)) + uint64_t(s.index) * n;
}

}  // namespace cf
