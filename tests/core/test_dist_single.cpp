// dist/ in one process without a launcher (the multi-process tests are
// cf_dist_tests under mpirun): errors before init, and the "none" backend.
#include <cstdlib>
#include <string>

#include "test_util.h"

using namespace cf;
using namespace cf::test;
namespace d = cf::dist;

TEST_CASE("dist: errors before init and for unknown backends") {
  REQUIRE_FALSE(d::is_initialized());
  CHECK(d::rank() == 0);
  CHECK(d::world_size() == 1);
  Tensor t = Tensor::ones({2});
  CHECK_THROWS_MSG(d::all_reduce(t), d::DistError, "[all_reduce] the process group is not initialised",
                   "cf::dist::init()");
  CHECK_THROWS_MSG(d::barrier(), d::DistError, "[barrier]", "not initialised");
  d::InitOptions o;
  o.backend = "gloo";
  CHECK_THROWS_MSG(d::init(o), d::DistError, "[dist::init] unknown backend 'gloo'");
  o.backend = "none";
  o.world_size = 2;
  CHECK_THROWS_MSG(d::init(o), d::DistError, "asked for rank", "rank 0 of 1");
  CHECK_FALSE(d::is_initialized());
  if (!d::built_with("nccl")) {
    o.backend = "nccl";
    o.world_size = -1;
    CHECK_THROWS_MSG(d::init(o), d::DistError, "built without NCCL");
  }
  CHECK_THROWS_MSG(d::set_timeout(0), d::DistError, "positive");
  CHECK_THROWS_MSG(nn::DistributedDataParallel(std::make_shared<nn::Linear>(2, 2)), d::DistError,
                   "[DistributedDataParallel]", "not initialised");
  CHECK_THROWS_MSG(nn::kmeans_distributed(Tensor::ones({4, 2}), {}), d::DistError, "[kmeans_distributed]",
                   "not initialised");
}

TEST_CASE("dist: the local GPU index follows the launcher's local rank") {
  // Saved and restored: ctest may run this under a launcher's environment.
  const char* saved = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const char* saved_mpich = std::getenv("MPI_LOCALRANKID");
  const char* saved_slurm = std::getenv("SLURM_LOCALID");
  const std::string old = saved ? saved : "", old_mpich = saved_mpich ? saved_mpich : "",
                    old_slurm = saved_slurm ? saved_slurm : "";
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  ::unsetenv("MPI_LOCALRANKID");
  ::unsetenv("SLURM_LOCALID");
  ::setenv("SLURM_LOCALID", "3", 1);  // Slurm's name, the last asked
  CHECK(d::launcher_env().local_rank == 3);
  ::unsetenv("SLURM_LOCALID");
  CHECK(d::launcher_env().local_rank == -1);
  CHECK(d::local_device_index(4) == 0);
  ::setenv("MPI_LOCALRANKID", "2", 1);  // MPICH's name
  CHECK(d::launcher_env().local_rank == 2);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "5", 1);  // Open MPI's name wins
  CHECK(d::launcher_env().local_rank == 5);
  CHECK(d::local_device_index(4) == 1);
  CHECK(d::local_device_index(1) == 0);
  CHECK(d::local_device_index(0) == 0);  // no GPU visible
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x", 1);  // not a rank: MPICH's then
  CHECK(d::launcher_env().local_rank == 2);
  auto restore = [](const char* name, const char* was, const std::string& value) {
    if (was)
      ::setenv(name, value.c_str(), 1);
    else
      ::unsetenv(name);
  };
  restore("OMPI_COMM_WORLD_LOCAL_RANK", saved, old);
  restore("MPI_LOCALRANKID", saved_mpich, old_mpich);
  restore("SLURM_LOCALID", saved_slurm, old_slurm);
}

TEST_CASE("dist: backend none is a world of one where every collective is the identity") {
  d::InitOptions o;
  o.backend = "none";
  d::init(o);
  CHECK(d::is_initialized());
  CHECK(d::world_size() == 1);
  CHECK(d::backend_name() == "none");
  Tensor t = Tensor::from_vector(std::vector<double>{1.5, -2}, {2});
  d::all_reduce(t, d::ReduceOp::mean);
  check_close(t, std::vector<double>{1.5, -2}, 0.0);
  d::broadcast(t, 0);
  check_close(d::all_gather(t), std::vector<double>{1.5, -2}, 0.0);
  check_close(d::reduce_scatter(t), std::vector<double>{1.5, -2}, 0.0);
  d::barrier();
  auto w = d::all_reduce_async(t);
  w->wait();
  CHECK_THROWS_MSG(d::broadcast(t, 1), d::DistError, "[broadcast] root 1");
  // DDP over a world of one: gradients untouched.
  auto lin = std::make_shared<nn::Linear>(3, 2);
  {
    nn::DistributedDataParallel ddp(lin);
    Tensor x = Tensor::ones({4, 3});
    sum(lin->forward(x)).backward();
    check_close(lin->bias.grad(), std::vector<double>{4, 4}, 0.0);
    // Module::to keeps the tensors DDP holds: its buckets are laid out again (they were fixed at
    // construction, and the first backward after a move failed inside DDP's callback, leaving it
    // stuck for every later backward)
    lin->to(kFloat64);
    for (int i = 0; i < 2; ++i) {
      lin->zero_grad();
      sum(lin->forward(to(x, kFloat64))).backward();
      CHECK(lin->weight.grad().dtype() == kFloat64);
      check_close(lin->bias.grad(), std::vector<double>{4, 4}, 0.0);
    }
    // A backward that fails after DDP's hooks began (here a later hook of the same leaf throws, as a
    // user's hook or an engine error would) used to leave DDP waiting for a finish() that never came:
    // no later backward was averaged, silently.
    const int64_t bad = autograd::add_grad_accumulated_hook(lin->bias, [](const Tensor&) {
      throw ValueError("a failing hook");
    });
    lin->zero_grad();
    CHECK_THROWS_MSG(sum(lin->forward(to(x, kFloat64))).backward(), ValueError, "a failing hook");
    autograd::remove_grad_hook(bad);
    lin->zero_grad();
    CHECK_THROWS_MSG(sum(lin->forward(to(x, kFloat64))).backward(), d::DistError,
                     "[DistributedDataParallel] an earlier backward failed", "restart the processes");
  }
  d::finalize();
  CHECK_FALSE(d::is_initialized());
  d::finalize();  // twice: a no-op
}
