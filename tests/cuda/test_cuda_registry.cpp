// Coverage of the CUDA backend: runs in every build (it needs no GPU), so a
// CUDA kernel without a parity case fails here even on a machine without one.
#include "cuda/cuda_test_util.h"

using namespace cf;
using namespace cf::test;

TEST_SUITE("cuda") {

TEST_CASE("every op in the registry has a CUDA parity case") {
  std::string missing, unknown;
  for (const OpInfo& op : op_registry()) {
    CHECK_MESSAGE(op.cuda == cuda_built(), op.name, ": registry cuda flag ", op.cuda, " in a build with",
                  cuda_built() ? "" : "out", " CUDA");
    if (!parity_cases().count(op.name)) missing += std::string(op.name) + " ";
  }
  for (const std::string& c : parity_cases())
    if (!find_op(c)) unknown += c + " ";
  CHECK_MESSAGE(missing.empty(), "ops without a CUDA parity case: ", missing);
  CHECK_MESSAGE(unknown.empty(), "parity cases for ops the registry does not know: ", unknown);
}

}
