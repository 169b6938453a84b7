#pragma once
// The planted-bigram classification task of the classifier tests: "does the
// sequence (N tokens from 1..V-1) contain the bigram (3, 5)?". It needs
// attention between neighbours (position-aware), not just a bag of tokens.
// Even examples are positive (the bigram planted at a random place when the draw
// lacks it), odd ones negative (redrawn until the bigram is absent).
#include <cstdint>
#include <vector>

#include "autograd/ops/random.h"

namespace cf::test {

// Appends `count` examples (count * N token ids) to ids and their labels (1 =
// has the bigram) to labels, drawing from `data`.
inline void make_bigram_set(Generator& data, int64_t V, int64_t N, int64_t count, std::vector<int64_t>& ids,
                            std::vector<int64_t>& labels) {
  for (int64_t i = 0; i < count; ++i) {
    const bool positive = i % 2 == 0;
    for (;;) {
      auto r = randint(1, V, {N}, data).to_vector<int64_t>();
      bool has = false;
      for (int64_t t = 0; t + 1 < N; ++t) has = has || (r[size_t(t)] == 3 && r[size_t(t + 1)] == 5);
      if (positive && !has) {
        const int64_t at = randint(0, N - 1, {1}, data).item<int64_t>();
        r[size_t(at)] = 3;
        r[size_t(at + 1)] = 5;
        has = true;
      }
      if (has == positive) {
        ids.insert(ids.end(), r.begin(), r.end());
        break;
      }
    }
    labels.push_back(positive ? 1 : 0);
  }
}

}  // namespace cf::test
