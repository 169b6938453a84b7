#pragma once
// The one interface every communication backend implements (internal to dist/).
// It moves raw, contiguous buffers of one dtype on the backend's device; the
// front end (dist/process_group.cpp) validates tensors, checks descriptors
// across ranks, applies the mean and enforces the timeout by polling test().
#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "dist/dist.h"

namespace cf {
namespace dist {
namespace detail {

// One started operation. test() returns true once it is complete (and drives
// the backend's progress); it throws a DistError when the backend reports a failure.
class Request {
 public:
  virtual ~Request() = default;
  virtual bool test() = 0;
};

// async = false: the caller waits for the result at once (under the process
// group's watchdog), and a backend may run its blocking call, which can be much
// faster (Open MPI's blocking collectives use its tuned algorithms; its
// non-blocking ones go through libnbc). async = true: return while it runs.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // op is sum or max (mean is a sum the front end divides).
  virtual std::unique_ptr<Request> all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op, bool async) = 0;
  virtual std::unique_ptr<Request> broadcast(void* buf, int64_t count, DType dtype, int root, bool async) = 0;
  // recv holds world_size * count elements, rank r's block at r * count.
  virtual std::unique_ptr<Request> all_gather(const void* send, void* recv, int64_t count, DType dtype,
                                              bool async) = 0;
  // send holds world_size * count elements; recv gets this rank's reduced block.
  virtual std::unique_ptr<Request> reduce_scatter(const void* send, void* recv, int64_t count,
                                                  DType dtype, ReduceOp op, bool async) = 0;
  virtual std::unique_ptr<Request> barrier(bool async) = 0;
};

// dist/mpi_backend.cpp (CF_WITH_MPI). Initialises MPI unless it already is.
std::unique_ptr<Backend> make_mpi_backend();
void mpi_finalize();
bool mpi_initialized();  // MPI_Initialized and not MPI_Finalized
[[noreturn]] void mpi_abort(int code);
// dist/nccl_backend.cpp (CF_WITH_NCCL): one communicator over the same ranks,
// its unique id broadcast from rank 0 over `bootstrap` (the MPI backend).
std::unique_ptr<Backend> make_nccl_backend(Backend& bootstrap);

}  // namespace detail
}  // namespace dist
}  // namespace cf
