// The MPI backend: blocking collectives (MPI_Allreduce, ...) for calls the
// caller waits for (Open MPI's tuned algorithms; the process group's watchdog
// bounds their time), non-blocking MPI-3 ones (MPI_Iallreduce, ...) for the
// asynchronous path, polled against the timeout, with which DDP overlaps
// communication and backward. Errors return (MPI_ERRORS_RETURN) instead
// of aborting, so they become DistErrors with MPI's own message.
#include <mpi.h>

#include "dist/backend.h"

namespace cf {
namespace dist {
namespace detail {

namespace {

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, size_t(len));
}

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw DistError(str("[dist] ", what, " failed: ", mpi_error_string(rc)));
}

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Int64: return MPI_INT64_T;
    case DType::Bool: return MPI_UINT8_T;  // one byte per element
    // MPI has no 16-bit float type: moved as 16-bit words, never reduced (reducible()).
    case DType::BFloat16:
    case DType::Float16: return MPI_UINT16_T;
  }
  throw DistError("[dist] internal error: unknown dtype");
}

// The dtypes MPI's built-in reductions can combine.
void check_reducible(DType d, const char* op) {
  if (d == DType::BFloat16 || d == DType::Float16)
    throw DistError(str("[", op, "] the MPI backend cannot reduce ", d,
                        " tensors (MPI has no 16-bit float type): reduce a float32 copy"));
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::mean: break;
  }
  throw DistError("[dist] internal error: the MPI backend reduces with sum or max only");
}

int checked_count(int64_t n, const char* op) {
  if (n > int64_t(INT32_MAX))
    throw DistError(str("[", op, "] ", n, " elements exceed MPI's int count (2^31 - 1); split the tensor"));
  return int(n);
}

class MpiRequest : public Request {
 public:
  MpiRequest(MPI_Request r, const char* op) : r_(r), op_(op) {}
  ~MpiRequest() override {
    // An abandoned request (a timeout) is left to MPI: freeing an active
    // collective request is not allowed, and the process is about to exit.
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    check(MPI_Test(&r_, &flag, MPI_STATUS_IGNORE), op_);
    done_ = flag != 0;
    return done_;
  }

 private:
  MPI_Request r_;
  const char* op_;
  bool done_ = false;
};

// A blocking call's result: already complete.
class Done : public Request {
 public:
  bool test() override { return true; }
};

class MpiBackend : public Backend {
 public:
  MpiBackend() {
    int inited = 0, finalized = 0;
    MPI_Finalized(&finalized);
    // MPI cannot start twice in a process: any MPI call after MPI_Finalize aborts the job with MPI's own text
    if (finalized)
      throw DistError("[dist::init] MPI was finalised in this process (cf::dist::finalize()): MPI cannot be started "
                      "again; initialise once per process");
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      // Funneled: only the thread that called init() communicates (DDP's hooks
      // run on the thread that runs backward).
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    }
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }
  const char* name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }

  std::unique_ptr<Request> all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op, bool async) override {
    check_reducible(dtype, "all_reduce");
    if (!async) {
      check(MPI_Allreduce(MPI_IN_PLACE, buf, checked_count(count, "all_reduce"), mpi_type(dtype), mpi_op(op), comm_),
            "MPI_Allreduce");
      return std::make_unique<Done>();
    }
    MPI_Request r;
    check(MPI_Iallreduce(MPI_IN_PLACE, buf, checked_count(count, "all_reduce"), mpi_type(dtype),
                         mpi_op(op), comm_, &r),
          "MPI_Iallreduce");
    return std::make_unique<MpiRequest>(r, "MPI_Iallreduce");
  }
  std::unique_ptr<Request> broadcast(void* buf, int64_t count, DType dtype, int root, bool async) override {
    if (!async) {
      check(MPI_Bcast(buf, checked_count(count, "broadcast"), mpi_type(dtype), root, comm_), "MPI_Bcast");
      return std::make_unique<Done>();
    }
    MPI_Request r;
    check(MPI_Ibcast(buf, checked_count(count, "broadcast"), mpi_type(dtype), root, comm_, &r),
          "MPI_Ibcast");
    return std::make_unique<MpiRequest>(r, "MPI_Ibcast");
  }
  std::unique_ptr<Request> all_gather(const void* send, void* recv, int64_t count, DType dtype, bool async) override {
    MPI_Request r;
    int n = checked_count(count, "all_gather");
    checked_count(count * size_, "all_gather");
    if (!async) {
      check(MPI_Allgather(send, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_), "MPI_Allgather");
      return std::make_unique<Done>();
    }
    check(MPI_Iallgather(send, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_, &r), "MPI_Iallgather");
    return std::make_unique<MpiRequest>(r, "MPI_Iallgather");
  }
  std::unique_ptr<Request> reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                                          bool async) override {
    MPI_Request r;
    int n = checked_count(count, "reduce_scatter");
    checked_count(count * size_, "reduce_scatter");
    check_reducible(dtype, "reduce_scatter");
    if (!async) {
      check(MPI_Reduce_scatter_block(send, recv, n, mpi_type(dtype), mpi_op(op), comm_), "MPI_Reduce_scatter_block");
      return std::make_unique<Done>();
    }
    check(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(dtype), mpi_op(op), comm_, &r),
          "MPI_Ireduce_scatter_block");
    return std::make_unique<MpiRequest>(r, "MPI_Ireduce_scatter_block");
  }
  std::unique_ptr<Request> barrier(bool async) override {
    if (!async) {
      check(MPI_Barrier(comm_), "MPI_Barrier");
      return std::make_unique<Done>();
    }
    MPI_Request r;
    check(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
    return std::make_unique<MpiRequest>(r, "MPI_Ibarrier");
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<Backend> make_mpi_backend() { return std::make_unique<MpiBackend>(); }

bool mpi_initialized() {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  return inited && !finalized;
}

void mpi_finalize() {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Finalize();
}

void mpi_abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace detail
}  // namespace dist
}  // namespace cf
