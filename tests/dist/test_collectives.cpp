// Every collective against its definition, on whatever world mpirun started
// (CTest: 2 processes). Values are small integers and halves, so every sum is
// exact in any order and results are compared for equality.
#include <chrono>
#include <csignal>
#include <thread>

#include "test_util.h"

using namespace cf;
using namespace cf::test;
namespace d = cf::dist;

namespace {
// Rank r's value at element i.
double f(int r, int64_t i) { return double(r + 1) * 0.5 + double(i % 7) - 3.0; }

Tensor rank_tensor(int r, const Shape& s, DType dt, Device dev = Device::cpu()) {
  int64_t n = numel_of(s);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = f(r, i);
  return make(dt, v, s).to(dev);
}

void collectives_on(Device dev) {
  const int R = d::rank(), W = d::world_size();
  for (DType dt : {kFloat32, kFloat64, kInt64}) {
    CAPTURE(dt);
    Shape s{3, 5};
    int64_t n = numel_of(s);
    // all_reduce sum / max / mean
    for (d::ReduceOp op : {d::ReduceOp::sum, d::ReduceOp::max, d::ReduceOp::mean}) {
      if (op == d::ReduceOp::mean && dt == kInt64) continue;
      CAPTURE(d::reduce_op_name(op));
      Tensor t = rank_tensor(R, s, dt, dev);
      if (dt == kInt64) t = make(kInt64, std::vector<double>(size_t(n), double(R * 3 - 1)), s).to(dev);
      d::all_reduce(t, op);
      std::vector<double> want(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        double acc = op == d::ReduceOp::max ? -1e300 : 0;
        for (int q = 0; q < W; ++q) {
          double x = dt == kInt64 ? double(q * 3 - 1) : f(q, i);
          if (dt == kFloat32) x = double(float(x));
          acc = op == d::ReduceOp::max ? std::max(acc, x) : acc + x;
        }
        want[size_t(i)] = op == d::ReduceOp::mean ? acc / W : acc;
      }
      check_close(t.cpu(), want, 0.0);
    }
    // broadcast from the last rank
    Tensor b = rank_tensor(R, s, dt, dev);
    d::broadcast(b, W - 1);
    check_close(b.cpu(), values(rank_tensor(W - 1, s, dt)), 0.0);
    // all_gather: rank q's rows at [q*3, q*3+3)
    Tensor g = d::all_gather(rank_tensor(R, s, dt, dev));
    REQUIRE(g.shape() == Shape{3 * W, 5});
    std::vector<double> want_g;
    for (int q = 0; q < W; ++q)
      for (double x : values(rank_tensor(q, s, dt))) want_g.push_back(x);
    check_close(g.cpu(), want_g, 0.0);
    // reduce_scatter: rank R gets block R of the sum over ranks
    Shape big{2 * W, 5};
    Tensor rs = d::reduce_scatter(rank_tensor(R, big, dt, dev), d::ReduceOp::sum);
    REQUIRE(rs.shape() == Shape{2, 5});
    std::vector<double> want_rs(10, 0.0);
    for (int q = 0; q < W; ++q) {
      std::vector<double> vq = values(rank_tensor(q, big, dt));
      for (int64_t i = 0; i < 10; ++i) want_rs[size_t(i)] += vq[size_t(R * 10 + i)];
    }
    check_close(rs.cpu(), want_rs, 0.0);
  }
  // bool broadcast and gather
  Tensor m = Tensor::from_vector(std::vector<bool>{R == 0, true, R != 0}, {3}).to(dev);
  d::broadcast(m, 0);
  CHECK(m.cpu().to_vector<bool>() == std::vector<bool>{true, true, false});
  d::barrier();
}
}  // namespace

TEST_CASE("dist: process group from the launcher") {
  d::LauncherEnv env = d::launcher_env();
  CHECK(env.rank == d::rank());
  CHECK(env.world_size == d::world_size());
  CHECK(env.local_rank == d::rank());  // the tests' processes share one node
  CHECK(d::local_device_index(2) == d::rank() % 2);
  CHECK(d::is_main() == (d::rank() == 0));
  CHECK(d::backend_name() != "none");
  CHECK_THROWS_MSG(d::init(), d::DistError, "already initialised");
}

TEST_CASE("dist: collectives against their definitions (cpu)") { collectives_on(Device::cpu()); }

TEST_CASE("nccl: collectives against their definitions (cuda)") {
  if (d::backend_name(Device::cuda(0)) != "nccl") return;  // the NCCL run (dist_nccl_np1) has it
  collectives_on(Device::cuda(0));
}

TEST_CASE("dist: async all_reduce and empty tensors") {
  const int W = d::world_size();
  Tensor t = Tensor::full({4}, 1.5, kFloat64);
  auto w = d::all_reduce_async(t, d::ReduceOp::mean);
  w->wait();
  w->wait();  // a second wait is a no-op
  check_close(t, std::vector<double>(4, 1.5), 0.0);
  Tensor e = Tensor::zeros({0, 3});
  d::all_reduce(e);
  CHECK(d::all_gather(e).shape() == Shape{0, 3});
  Tensor s = Tensor::full({2}, 2.0, kFloat64);
  d::all_reduce(s);
  check_close(s, std::vector<double>(2, 2.0 * W), 0.0);
}

TEST_CASE("dist: bad input gives clear errors on every rank") {
  const int R = d::rank(), W = d::world_size();
  Tensor nc = transpose(Tensor::zeros({3, 4}), 0, 1);
  CHECK_THROWS_MSG(d::all_reduce(nc), d::DistError, "[all_reduce]", "not contiguous");
  Tensor bo = Tensor::from_vector(std::vector<bool>{true}, {1});
  CHECK_THROWS_MSG(d::all_reduce(bo), d::DistError, "[all_reduce] dtype bool");
  Tensor i = Tensor::zeros({2}, kInt64);
  CHECK_THROWS_MSG(d::all_reduce(i, d::ReduceOp::mean), d::DistError, "mean needs a float tensor");
  Tensor t = Tensor::zeros({2});
  CHECK_THROWS_MSG(d::broadcast(t, W), d::DistError, "[broadcast] root");
  CHECK_THROWS_MSG(d::reduce_scatter(Tensor::zeros({2 * W + 1}), d::ReduceOp::sum), d::DistError,
                   "[reduce_scatter]", "multiple of the world size");
  CHECK_THROWS_MSG(d::all_gather(Tensor::scalar(1.0)), d::DistError, "[all_gather]", "at least one dimension");
  if (W > 1) {
    // Mismatched shapes across ranks: detected by the descriptor exchange, on every rank.
    Tensor mine = Tensor::zeros({R == 0 ? 3 : 4});
    CHECK_THROWS_MSG(d::all_reduce(mine), d::DistError, "[all_reduce] ranks disagree", "rank 0 calls",
                     "float32 (3)", "float32 (4)");
    // Mismatched dtypes and collectives too.
    Tensor md = Tensor::zeros({2}, R == 0 ? kFloat32 : kFloat64);
    CHECK_THROWS_MSG(d::all_reduce(md), d::DistError, "ranks disagree", "float64");
    Tensor mc = Tensor::zeros({2});
    if (R == 0)
      CHECK_THROWS_MSG(d::all_reduce(mc), d::DistError, "all_reduce(sum)", "broadcast(root 0)");
    else
      CHECK_THROWS_MSG(d::broadcast(mc, 0), d::DistError, "all_reduce(sum)", "broadcast(root 0)");
    // A call that fails its own checks on one rank only: every rank throws at once (the others waited for
    // the collective until the timeout).
    Tensor one_bad = R == 1 ? Tensor::from_vector(std::vector<bool>{true, false}, {2}) : Tensor::zeros({2});
    if (R == 1)
      CHECK_THROWS_MSG(d::all_reduce(one_bad), d::DistError, "[all_reduce] dtype bool", "on rank 1",
                       "the other ranks stop too");
    else
      CHECK_THROWS_MSG(d::all_reduce(one_bad), d::DistError, "[all_reduce] rank 1's call failed its own checks");
    Tensor root_bad = Tensor::zeros({2});
    if (R == 1)
      CHECK_THROWS_MSG(d::broadcast(root_bad, W), d::DistError, "[broadcast] root");
    else
      CHECK_THROWS_MSG(d::broadcast(root_bad, 0), d::DistError, "[broadcast] rank 1's call failed its own checks");
    // Shapes past the 8 sizes the descriptor lists are compared too (by a hash of all of them).
    Shape deep(9, 1);
    deep.push_back(R == 0 ? 2 : 3);
    deep.push_back(R == 0 ? 3 : 2);
    Tensor nine = Tensor::zeros(deep);
    CHECK_THROWS_MSG(d::all_reduce(nine), d::DistError, "[all_reduce] ranks disagree");
  }
  // The group still works after a detected mismatch (nothing moved).
  Tensor ok = Tensor::ones({2});
  d::all_reduce(ok);
  check_close(ok, std::vector<double>(2, double(W)), 0.0);
}

// ---- failure scenarios: test suite "failure", run by their own CTest tests
// (tests/CMakeLists.txt), never with the others ----
TEST_CASE("dist: a hung rank makes the others time out (async: a DistError)" * doctest::test_suite("failure")) {
  d::set_timeout(2.0);
  if (d::rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(60));  // hung: never joins
  Tensor t = Tensor::ones({4});
  auto start = std::chrono::steady_clock::now();
  try {
    d::all_reduce_async(t)->wait();
  } catch (const d::DistError& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // What an application does with the error: report it and end the job.
    d::abort(3, str("rank ", d::rank(), " caught after ", s, " s: ", e.what()));
  }
  FAIL("all_reduce returned without its peer");
}

TEST_CASE("dist: a hung rank makes the others time out (blocking: the watchdog)" * doctest::test_suite("failure")) {
  d::set_timeout(2.0);
  if (d::rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(60));
  Tensor t = Tensor::ones({4});
  d::all_reduce(t);  // the watchdog ends this process after 2 s
  FAIL("all_reduce returned without its peer");
}

TEST_CASE("dist: a killed rank ends the job" * doctest::test_suite("failure")) {
  d::set_timeout(5.0);
  if (d::rank() == 1) std::raise(SIGKILL);
  Tensor t = Tensor::ones({4});
  try {
    d::all_reduce(t);
  } catch (const d::DistError& e) {
    d::abort(3, str("rank ", d::rank(), ": ", e.what()));
  }
  FAIL("all_reduce returned without its peer");
}
