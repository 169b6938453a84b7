// Placeholder until the indexing family lands.
#include "autograd/ops/index.h"
namespace cf {
Tensor scatter_add(const Tensor&, int64_t, const Tensor&, const Tensor&) {
  throw NotImplementedError("[scatter_add] not implemented yet");
}
}  // namespace cf
