// doctest main for cf_dist_tests: the collective and DDP tests, run by CTest
// under `mpirun -np 2` (tests/CMakeLists.txt). Every rank runs every case; the
// process group is initialised once, before the cases. CF_DIST_TEST_BACKEND
// picks the backend (default "mpi"; the single-rank NCCL test passes "nccl").
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "core/cuda.h"
#include "dist/dist.h"

int main(int argc, char** argv) {
  const char* b = std::getenv("CF_DIST_TEST_BACKEND");
  std::string backend = b && *b ? b : "mpi";
  if (backend == "nccl" && (!cf::cuda::is_available() || !cf::dist::built_with("nccl"))) {
    std::cout << "SKIPPED: the NCCL test needs " << (cf::dist::built_with("nccl") ? "a visible GPU" : "a build with NCCL")
              << "\n";
    return 77;
  }
  cf::dist::InitOptions o;
  o.backend = backend;
  cf::dist::init(o);
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  int rc = ctx.run();
  if (ctx.shouldExit()) {
    cf::dist::finalize();
    return rc;
  }
  // A failure on one rank only must not leave the others waiting in finalize:
  // agree on the worst exit code first.
  cf::Tensor worst = cf::Tensor::from_vector(std::vector<int64_t>{rc}, {1});
  cf::dist::all_reduce(worst, cf::dist::ReduceOp::max);
  cf::dist::finalize();
  return int(worst.to_vector<int64_t>()[0]);
}
