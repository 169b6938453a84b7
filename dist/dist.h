#pragma once
// Distributed training, layer 1: a process group and collectives on cf tensors.
// A layer beside nn (DESIGN.md section 1): nn's training code (DDP, the
// distributed sampler, distributed K-Means) uses it; it uses only core/ and
// autograd/. No transport of our own: MPI moves CPU tensors and bootstraps the
// processes, NCCL moves CUDA tensors (its unique id travels over MPI).
//
//   mpirun -np 2 ./train          // each process:
//   cf::dist::init();             // rank and world size from mpirun (OMPI_*/PMI_* variables)
//   cf::dist::all_reduce(t, cf::dist::ReduceOp::mean);  // in place, every rank gets the mean
//   cf::dist::finalize();         // before returning: mpirun reports a rank that exits without
//                                 // MPI_Finalize as an improper exit (status 1), even after success
//
// Backends: one interface (dist/backend.h), two implementations. A collective
// picks the backend by the tensor's device: "mpi" for CPU tensors, "nccl" for
// CUDA tensors. Built without MPI (CF_MPI=OFF or no libopenmpi-dev) init()
// throws a DistError naming the missing backend; a CUDA collective without NCCL
// likewise. Only a world of one process needs no backend: init() with
// backend "none" runs every collective as the identity (what a program that
// can run distributed does when it is not).
//
// Checks. Before each collective the ranks exchange a small descriptor (which
// collective, dtype, device, shape, root, op); a mismatch throws a DistError on
// every rank naming both ranks' tensors, instead of corrupting memory or
// hanging. set_check(false) skips the exchange (DDP does, its buckets are
// checked once at construction).
//
// Timeouts. A collective waits at most timeout_s (InitOptions, CF_DIST_TIMEOUT
// seconds in the environment; default 300) for its peers. The asynchronous
// all-reduce (DDP) then throws a DistError saying that a rank may have died or
// called another collective, after which the group is unusable (the message
// says to exit; mpirun then stops the others). The blocking collectives run
// MPI's blocking calls (its tuned algorithms: several times faster than its
// non-blocking ones here), which cannot be interrupted: a watchdog thread prints
// the same message and ends the process (status 124) instead. A rank that dies
// outright is reported by mpirun, which ends the job.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace cf {
namespace dist {

class DistError : public Error {
  using Error::Error;
};

enum class ReduceOp { sum, mean, max };
const char* reduce_op_name(ReduceOp op);

struct InitOptions {
  // "auto": MPI when built with it (NCCL added for CUDA tensors when built with
  // it and a GPU is visible), else "none" for a world of one. "mpi", "nccl"
  // (MPI plus NCCL; an error without a GPU) or "none" ask for one explicitly.
  std::string backend = "auto";
  // Explicit rank and world size; -1 reads them from the launcher. When given,
  // they must agree with what MPI reports (a launcher that disagrees is an error).
  int rank = -1;
  int world_size = -1;
  double timeout_s = -1;  // -1: CF_DIST_TIMEOUT from the environment, else 300
};

// Rank and world size the launcher announced in the environment (Open MPI's
// OMPI_COMM_WORLD_RANK/SIZE, else PMI_RANK/PMI_SIZE, else PMIX_RANK); {-1, -1}
// when the process was not started by a launcher. local_rank: the rank among the
// processes of this node (OMPI_COMM_WORLD_LOCAL_RANK, else MPICH's MPI_LOCALRANKID, else Slurm's
// SLURM_LOCALID), -1 unknown.
struct LauncherEnv {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
};
LauncherEnv launcher_env();
// The GPU this process takes among device_count visible ones: its local rank modulo
// device_count (0 without a launcher). The NCCL backend binds it; the apps' bare "cuda" names it.
int local_device_index(int device_count);

// Which backends this build has ("mpi", "nccl").
bool built_with(const std::string& backend);

void init(const InitOptions& options = {});
bool is_initialized();
// Finalizes MPI (when init() initialised it). Safe to call twice.
void finalize();
int rank();        // 0 before init()
int world_size();  // 1 before init()
bool is_main();    // rank() == 0
std::string backend_name(const Device& device = Device::cpu());
double timeout_s();
void set_timeout(double seconds);
bool check_enabled();
void set_check(bool on);

// ---- collectives (every rank calls the same ones in the same order) ----
// t: a defined, contiguous float32/float64/int64 tensor (bool for broadcast
// and all_gather too) on the CPU or a CUDA device. In-place ones bump t's
// version (a tensor saved for backward cannot be changed under the graph).
// max on float and int64; mean on float. max does not promise to carry a NaN: MPI_MAX and ncclMax define no NaN
// rule, and a pairwise comparison keeps or drops it by the order the ranks are combined in; test finiteness
// first where it matters (sum carries a NaN).
void all_reduce(Tensor& t, ReduceOp op = ReduceOp::sum);
void broadcast(Tensor& t, int root = 0);
// Rank r's t becomes rows [r*n0, (r+1)*n0) of the result: shape (world*n0, ...).
Tensor all_gather(const Tensor& t);
// t has world*m rows; the result is rank r's (m, ...) block of the reduction.
Tensor reduce_scatter(const Tensor& t, ReduceOp op = ReduceOp::sum);
void barrier();

// Asynchronous all-reduce for overlap (DDP): starts, returns at once; wait()
// finishes it (within the timeout) and applies the mean. t must stay alive and
// unchanged until then. No descriptor check.
class Work {
 public:
  virtual ~Work() = default;
  virtual bool test() = 0;  // true once finished (drives progress)
  virtual void wait() = 0;
};
std::shared_ptr<Work> all_reduce_async(Tensor& t, ReduceOp op = ReduceOp::sum);

// A group-wide abort for fatal errors (mpirun then ends every process).
[[noreturn]] void abort(int code, const std::string& message);

}  // namespace dist
}  // namespace cf
