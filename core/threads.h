#pragma once
// The CPU thread count of cf's kernels, one setting for the whole process.
//
// Without it, each kernel takes OpenMP's own count, which is a per-thread setting: OMP_NUM_THREADS, or
// omp_set_num_threads() called in that same thread. A library loaded beside cf changes it behind cf's back
// (importing PyTorch sets the importing thread's count to PyTorch's: 1 on a machine whose topology it reads as
// one physical core), and threads that call cf then run with different counts. Results are the same bits for
// the same count only (docs/design-notes.md, "Parallelism"), so such a process gave different last bits in
// different threads. set_num_threads fixes the count for every calling thread, as torch.set_num_threads does for
// PyTorch's kernels.
#include <cstdint>

namespace cf {

// Every later CPU kernel, called from any thread, runs on at most n threads (1 <= n <= 1024). n = 0 returns to
// OpenMP's count of the calling thread (the default). Out-of-range n: ValueError naming it. Kernels already
// running keep their team.
void set_num_threads(int64_t n);

// The thread count the next CPU kernel called from this thread may use: set_num_threads's n, or OpenMP's count
// of this thread when none is set (1 in a build without OpenMP). A kernel called inside another's parallel
// region runs on one thread whatever this says (no nested teams), and OMP_THREAD_LIMIT caps every team.
int get_num_threads();

// True when set_num_threads holds a count (n >= 1); false when OpenMP's per-thread count rules.
bool num_threads_is_set();

}  // namespace cf
