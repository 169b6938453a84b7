// cf.dist (dist/dist.h: the process group and its collectives) and cf.nn.DistributedDataParallel
// (nn/parallel/ddp.h), so a Python script runs data-parallel under mpirun as cf's apps do:
//
//   mpirun -np 2 python train.py      # each process: cf.dist.init(); ddp = cf.nn.DistributedDataParallel(model)
//
// Every collective and DDP's construction (a broadcast) waits for the other ranks with the GIL released.
#include <optional>

#include "common.h"

namespace cfpy {

using cf::Tensor;
namespace cnn = cf::nn;
namespace dist = cf::dist;

namespace {

dist::ReduceOp reduce_op(const std::string& op, const char* where) {
  if (op == "sum") return dist::ReduceOp::sum;
  if (op == "mean") return dist::ReduceOp::mean;
  if (op == "max") return dist::ReduceOp::max;
  throw cf::ValueError(cf::str("[", where, "] op must be \"sum\", \"mean\" or \"max\", got \"", op, "\""));
}

// `with ddp.no_sync():` (DistributedDataParallel::NoSync for the with block).
struct NoSyncScope {
  cnn::DistributedDataParallel* ddp;
  std::optional<cnn::DistributedDataParallel::NoSync> guard;
};

}  // namespace

void bind_dist(nb::module_& m, nb::module_& d, nb::module_& nn) {
  (void)m;
  d.def("built_with", &dist::built_with, nb::arg("backend"), "Whether this build has the backend (\"mpi\", \"nccl\").");
  d.def(
      "init",
      [](const std::string& backend, int rank, int world_size, double timeout) {
        dist::InitOptions o;
        o.backend = backend;
        o.rank = rank;
        o.world_size = world_size;
        o.timeout_s = timeout;
        nb::gil_scoped_release g;
        dist::init(o);
      },
      nb::arg("backend") = "auto", nb::arg("rank") = -1, nb::arg("world_size") = -1, nb::arg("timeout") = -1.0,
      "Joins the process group (once per process): rank and world size from the launcher (mpirun), or given "
      "(they must agree with it). backend: \"auto\" (MPI when built with it, NCCL added for CUDA tensors when a "
      "GPU is visible, else \"none\" for a world of one), \"mpi\", \"nccl\" or \"none\". timeout: seconds a "
      "collective waits for its peers (-1: CF_DIST_TIMEOUT, else 300).");
  d.def("is_initialized", &dist::is_initialized, "Whether init() ran (and finalize() has not).");
  d.def("finalize", &dist::finalize, release_gil(),
        "Leaves the group (finalises MPI when init() started it); call it before the script ends: mpirun counts a "
        "rank that exits without it as failed. Safe to call twice.");
  d.def("rank", &dist::rank, "This process's rank (0 before init()).");
  d.def("world_size", &dist::world_size, "The number of processes (1 before init()).");
  d.def("is_main", &dist::is_main, "rank() == 0.");
  d.def("backend_name", [](const cf::Device& device) { return dist::backend_name(device); },
        nb::arg("device") = cf::Device::cpu(), "The backend that moves tensors of that device (\"mpi\", ...).");
  d.def("local_rank", []() { return dist::launcher_env().local_rank; },
        "This process's rank among those of its node, from the launcher (-1: not known).");
  d.def("local_device_index", &dist::local_device_index, nb::arg("device_count"),
        "The GPU this process takes among device_count visible ones (its local rank modulo device_count).");
  d.def(
      "all_reduce",
      [](Tensor& t, const std::string& op) {
        const dist::ReduceOp r = reduce_op(op, "all_reduce");
        nb::gil_scoped_release g;
        dist::all_reduce(t, r);
        return t;
      },
      nb::arg("tensor"), nb::arg("op") = "sum",
      "In place on every rank: the sum, mean or max over ranks; returns the tensor. A contiguous float32, float64 "
      "or int64 tensor, on the CPU (MPI) or a GPU (NCCL); every rank calls the same collectives in the same order.");
  d.def(
      "broadcast",
      [](Tensor& t, int root) {
        nb::gil_scoped_release g;
        dist::broadcast(t, root);
        return t;
      },
      nb::arg("tensor"), nb::arg("root") = 0, "In place: every rank gets root's values; returns the tensor.");
  d.def("all_gather", &dist::all_gather, nb::arg("tensor"), release_gil(),
        "Rank r's tensor becomes rows [r n0, (r+1) n0) of the result, shape (world n0, ...).");
  d.def(
      "reduce_scatter",
      [](const Tensor& t, const std::string& op) {
        const dist::ReduceOp r = reduce_op(op, "reduce_scatter");
        nb::gil_scoped_release g;
        return dist::reduce_scatter(t, r);
      },
      nb::arg("tensor"), nb::arg("op") = "sum",
      "t has world m rows; the result is this rank's (m, ...) block of their reduction over ranks.");
  d.def("barrier", &dist::barrier, release_gil(), "Waits until every rank reached it.");

  nb::class_<NoSyncScope>(nn, "_NoSync", "What DistributedDataParallel.no_sync() returns: a `with` block.")
      .def("__enter__",
           [](NoSyncScope& s) -> NoSyncScope& {
             s.guard.emplace(s.ddp->no_sync());
             return s;
           },
           nb::rv_policy::reference)
      .def("__exit__", [](NoSyncScope& s, nb::args) { s.guard.reset(); });

  nb::class_<cnn::DistributedDataParallel>(
      nn, "DistributedDataParallel",
      "Data-parallel training over cf.dist (nn/parallel/ddp.h): after backward every parameter's grad is the mean "
      "over ranks, bucketed all-reduces overlapping backward, so the replicas stay identical and equal to one "
      "process training on the combined batch (a loss that is a mean over equal shards). Build it after cf.dist.init() "
      "and after moving the model to its device and dtype; rank 0's parameters and buffers are broadcast. Calling it "
      "calls the module; the optimizer takes the module's parameters. Every rank's loss must reach a parameter in "
      "every backward.")
      .def("__init__",
           [](cnn::DistributedDataParallel* self, std::shared_ptr<cnn::Module> module, int64_t bucket_bytes,
              bool broadcast_at_init) {
             CF_CHECK(module != nullptr, ValueError, "[DistributedDataParallel] module is None");
             cnn::DDPOptions o;
             o.bucket_bytes = bucket_bytes;
             o.broadcast_at_init = broadcast_at_init;
             nb::gil_scoped_release g;
             new (self) cnn::DistributedDataParallel(std::move(module), o);
           },
           nb::arg("module"), nb::arg("bucket_bytes") = int64_t(25) << 20, nb::arg("broadcast_at_init") = true)
      .def_prop_ro("module", [](const cnn::DistributedDataParallel& d) { return d.module_ptr(); },
                   "The wrapped module.")
      .def("__call__",
           [](nb::handle self, nb::args args, nb::kwargs kwargs) -> nb::object {
             return self.attr("module")(*args, **kwargs);
           },
           nb::sig("def __call__(self, *args: typing.Any, **kwargs: typing.Any) -> typing.Any"),
           "The module's call (its forward).")
      .def("no_sync", [](cnn::DistributedDataParallel& d) { return NoSyncScope{&d, std::nullopt}; },
           nb::keep_alive<0, 1>(),
           "`with ddp.no_sync():` backward only accumulates local gradients (gradient accumulation); the first "
           "backward after the block all-reduces the accumulated sums.")
      .def_prop_ro("sync_enabled", &cnn::DistributedDataParallel::sync_enabled)
      .def("sync_buffers", &cnn::DistributedDataParallel::sync_buffers, release_gil(),
           "Broadcasts rank 0's buffers to every rank.")
      .def_prop_ro("num_buckets", &cnn::DistributedDataParallel::num_buckets)
      .def("bucket_layout", &cnn::DistributedDataParallel::bucket_layout,
           "The indices of each bucket's parameters among those that require grad (named_parameters order).");
}

}  // namespace cfpy
