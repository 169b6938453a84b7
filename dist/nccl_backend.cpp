// The NCCL backend: CUDA tensors' collectives on the legacy default stream (the
// stream every cf kernel runs on, so a collective is ordered after the kernels
// that produced its input). The communicator is created over the same ranks as
// MPI: rank 0 makes the unique id and broadcasts it over the MPI backend.
// Completion is a CUDA event polled by the front end's timeout loop; an
// asynchronous NCCL error (a peer gone) surfaces as a DistError.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>

#include "core/cuda.h"
#include "core/error.h"
#include "dist/backend.h"

namespace cf {
namespace dist {
namespace detail {

namespace {

void check_nccl(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess && rc != ncclInProgress)
    throw DistError(str("[dist] ", what, " failed: ", ncclGetErrorString(rc)));
}
void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw DistError(str("[dist] ", what, " failed: ", cudaGetErrorString(rc)));
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Int64: return ncclInt64;
    case DType::Bool: return ncclUint8;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Float16: return ncclFloat16;
  }
  throw DistError("[dist] internal error: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  if (op == ReduceOp::sum) return ncclSum;
  if (op == ReduceOp::max) return ncclMax;
  throw DistError("[dist] internal error: the NCCL backend reduces with sum or max only");
}

class NcclRequest : public Request {
 public:
  NcclRequest(ncclComm_t comm, const char* op) : comm_(comm), op_(op) {
    check_cuda(cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(ev_, cudaStreamLegacy), "cudaEventRecord");
  }
  ~NcclRequest() override { cudaEventDestroy(ev_); }
  bool test() override {
    if (done_) return true;
    cudaError_t q = cudaEventQuery(ev_);
    if (q == cudaSuccess) return done_ = true;
    if (q != cudaErrorNotReady) check_cuda(q, op_);
    ncclResult_t async = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
    check_nccl(async, op_);
    return false;
  }

 private:
  ncclComm_t comm_;
  const char* op_;
  cudaEvent_t ev_ = nullptr;
  bool done_ = false;
};

// NCCL runs on the legacy stream, which a CUDA graph capture (core/cuda_graph.h) does not hold: refused
// by name rather than ending the capture with cudaErrorStreamCaptureImplicit.
void refuse_in_capture(const char* what) {
  CF_CHECK(!cuda::capturing(), DeviceError, "[dist] ", what,
           " (NCCL) while this thread captures a CUDA graph: run collectives between replays, outside the "
           "captured step");
}

class NcclBackend : public Backend {
 public:
  explicit NcclBackend(Backend& bootstrap) : rank_(bootstrap.rank()), size_(bootstrap.world_size()) {
    // One GPU per process: the local rank's device.
    int count = 0;
    check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    device_ = local_device_index(count);
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    ncclUniqueId id;
    if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    auto r = bootstrap.broadcast(&id, int64_t(sizeof(id)), DType::Bool, 0, false);
    while (!r->test()) {
    }
    check_nccl(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
  }
  ~NcclBackend() override {
    if (comm_) ncclCommDestroy(comm_);
  }
  const char* name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }

  std::unique_ptr<Request> all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op, bool) override {
    refuse_in_capture("all_reduce");
    check_nccl(ncclAllReduce(buf, buf, size_t(count), nccl_type(dtype), nccl_op(op), comm_, cudaStreamLegacy),
               "ncclAllReduce");
    return std::make_unique<NcclRequest>(comm_, "ncclAllReduce");
  }
  std::unique_ptr<Request> broadcast(void* buf, int64_t count, DType dtype, int root, bool) override {
    refuse_in_capture("broadcast");
    check_nccl(ncclBroadcast(buf, buf, size_t(count), nccl_type(dtype), root, comm_, cudaStreamLegacy),
               "ncclBroadcast");
    return std::make_unique<NcclRequest>(comm_, "ncclBroadcast");
  }
  std::unique_ptr<Request> all_gather(const void* send, void* recv, int64_t count, DType dtype, bool) override {
    refuse_in_capture("all_gather");
    check_nccl(ncclAllGather(send, recv, size_t(count), nccl_type(dtype), comm_, cudaStreamLegacy),
               "ncclAllGather");
    return std::make_unique<NcclRequest>(comm_, "ncclAllGather");
  }
  std::unique_ptr<Request> reduce_scatter(const void* send, void* recv, int64_t count, DType dtype,
                                          ReduceOp op, bool) override {
    refuse_in_capture("reduce_scatter");
    check_nccl(ncclReduceScatter(send, recv, size_t(count), nccl_type(dtype), nccl_op(op), comm_,
                                 cudaStreamLegacy),
               "ncclReduceScatter");
    return std::make_unique<NcclRequest>(comm_, "ncclReduceScatter");
  }
  std::unique_ptr<Request> barrier(bool) override {
    // NCCL has no barrier; the process group's barrier goes over MPI.
    throw DistError("[dist] internal error: barrier runs on the MPI backend");
  }

 private:
  int rank_;
  int size_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend> make_nccl_backend(Backend& bootstrap) { return std::make_unique<NcclBackend>(bootstrap); }

}  // namespace detail
}  // namespace dist
}  // namespace cf
