#include "nn/clustering/memory_bank.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/linalg.h"
#include "autograd/ops/random.h"
#include "dist/dist.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "core/cuda.h"
#include "core/error.h"
#include "nn/clustering/kmeans.h"

namespace cf {
namespace nn {

namespace {
enum Counter { kSize = 0, kNext = 1, kSteps = 2, kUpdates = 3 };
}  // namespace

Tensor order_centroids_greedy(const Tensor& c) {
  CF_CHECK(c.defined() && c.dim() == 2 && c.shape()[0] > 0 && is_floating(c.dtype()), ValueError,
           "[order_centroids_greedy] expected float centroids (p, d) with p > 0, got ",
           c.defined() ? c.describe() : std::string("undefined"));
  NoGradGuard ng;
  AutocastGuard off(std::nullopt);  // an ordering: in float32 at least, never autocast's 16 bits
  const int64_t p = c.shape()[0];
  const Tensor cw = is_low_precision(c.dtype()) ? to(c.detach(), kFloat32) : c.detach();
  // Cosine similarities of every pair, p x p (p is small: the paper uses <= 512).
  Tensor norms = clamp(sqrt(sum(square(cw), {1}, true)), 1e-12, INFINITY);
  Tensor u = cw / norms;
  std::vector<double> sim = to(contiguous(matmul(u, transpose(u, 0, 1))), kFloat64).to_vector<double>();
  std::vector<int64_t> order{0};
  std::vector<char> used(size_t(p), 0);
  used[0] = 1;
  for (int64_t i = 1; i < p; ++i) {
    const int64_t prev = order.back();
    int64_t best = -1;
    double best_sim = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < p; ++j)
      if (!used[size_t(j)] && (best < 0 || sim[size_t(prev * p + j)] > best_sim)) {
        best = j;
        best_sim = sim[size_t(prev * p + j)];
      }
    used[size_t(best)] = 1;
    order.push_back(best);
  }
  return contiguous(index_select(c, 0, Tensor::from_vector(order, {p}, c.device())));
}

MemoryBank::MemoryBank(const MemoryBankOptions& o, Generator& gen) : options_(o) {
  CF_CHECK(o.dim > 0 && o.num_clusters > 0 && o.capacity > 0 && o.update_every > 0 && o.kmeans_iters > 0,
           ValueError,
           "[MemoryBank] dim, num_clusters, capacity, update_every and kmeans_iters must be positive; got dim=",
           o.dim, " num_clusters=", o.num_clusters, " capacity=", o.capacity, " update_every=", o.update_every,
           " kmeans_iters=", o.kmeans_iters);
  CF_CHECK(o.num_clusters <= o.capacity, ValueError, "[MemoryBank] num_clusters (", o.num_clusters,
           ") exceeds the capacity (", o.capacity, "): K-Means could never run");
  memory = Tensor::zeros({o.capacity, o.dim});
  centroids = order_centroids_greedy(randn({o.num_clusters, o.dim}, kFloat32, gen));
  counters = Tensor::zeros({4}, kInt64);
  register_buffer("memory", &memory, o.save_memory);
  register_buffer("centroids", &centroids);
  register_buffer("counters", &counters);
  // K-Means runs in float32 or float64 and the FIFO feeds it: a 16-bit model keeps them float32.
  keep_float32_under_16bit(&memory);
  keep_float32_under_16bit(&centroids);
}

// The counters live wherever the module was moved; the bookkeeping reads them
// into host code and writes them back (4 integers, on any device).
int64_t MemoryBank::size() const { return counters.to_vector<int64_t>()[kSize]; }
int64_t MemoryBank::steps() const { return counters.to_vector<int64_t>()[kSteps]; }
int64_t MemoryBank::updates() const { return counters.to_vector<int64_t>()[kUpdates]; }

namespace {
void store_counters(Tensor& counters, const std::vector<int64_t>& c) {
  copy_bytes(counters.raw_data(), counters.device(), c.data(), Device::cpu(), c.size() * sizeof(int64_t),
             "MemoryBank");
  counters.bump_version();
}
}  // namespace

namespace {
// Why counters [size, next write row, steps, updates] do not fit a bank of capacity cap, or "" when they do.
// Counters from a damaged or edited state with a size or write row outside the bank made the next add() write
// outside the memory (a segfault, or a corrupted heap). Without the memory loaded, size and row are reset
// (on_state_loaded), so only steps and updates are checked.
std::string counters_misfit(const std::vector<int64_t>& c, int64_t cap, bool with_memory) {
  const bool ring_ok = !with_memory || (c[kSize] >= 0 && c[kSize] <= cap && c[kNext] >= 0 && c[kNext] < cap);
  if (ring_ok && c[kSteps] >= 0 && c[kUpdates] >= 0) return "";
  return str("[MemoryBank] loaded counters [", c[kSize], ", ", c[kNext], ", ", c[kSteps], ", ", c[kUpdates],
             "] (size, next write row, steps, updates) do not fit a bank of capacity ", cap,
             with_memory ? str(": size in [0, ", cap, "], next row in [0, ", cap, "), ") : std::string(": "),
             "steps and updates >= 0");
}
}  // namespace

void MemoryBank::check_state(const std::map<std::string, const Tensor*>& own) const {
  auto it = own.find("counters");
  if (it == own.end()) return;
  const Tensor& given = *it->second;
  CF_CHECK(given.numel() == 4, ValueError, "[MemoryBank] loaded counters must hold 4 values, got ", given.describe());
  const std::string why =
      counters_misfit(cf::to(given.detach(), kInt64).to_vector<int64_t>(), options_.capacity, own.count("memory") > 0);
  CF_CHECK(why.empty(), ValueError, why, "; nothing was loaded");
}

void MemoryBank::on_state_loaded(const std::vector<std::string>& loaded) {
  auto has = [&](const char* name) { return std::find(loaded.begin(), loaded.end(), name) != loaded.end(); };
  if (!has("counters")) return;
  std::vector<int64_t> c = counters.to_vector<int64_t>();
  // load_state_dict checked them before copying (check_state); a loader that wrote the tensors itself (cf.torch)
  // is checked here, after the fact: the bank is emptied, the rest of what it wrote stays.
  const std::string why = counters_misfit(c, options_.capacity, has("memory"));
  if (!why.empty()) {
    store_counters(counters, {0, 0, 0, 0});
    throw ValueError(why + "; the bank was emptied (the rest of the state was loaded)");
  }
  if (has("memory")) return;
  c[kSize] = 0;
  c[kNext] = 0;
  store_counters(counters, c);
}

void MemoryBank::add(const Tensor& states, const Tensor& mask) {
  const int64_t d = options_.dim;
  CF_CHECK(states.defined() && states.dim() >= 1 && states.shape()[states.dim() - 1] == d, ShapeError,
           "[MemoryBank] add expects float states (..., ", d, "), got ",
           states.defined() ? states.describe() : std::string("undefined"));
  CF_CHECK(is_floating(states.dtype()), DTypeError, "[MemoryBank] add expects float states (..., ", d, "), got ",
           states.describe());
  CF_CHECK(states.device() == memory.device(), DeviceError, "[MemoryBank] states on ", states.device(),
           " but the bank is on ", memory.device());
  Shape lead(states.shape().begin(), states.shape().end() - 1);
  if (mask.defined())
    CF_CHECK(mask.dtype() == kBool && mask.shape() == lead, ShapeError, "[MemoryBank] padding_mask must be bool ",
             shape_str(lead), " (true = padding), got ", mask.describe());
  NoGradGuard ng;
  const int64_t rows = numel_of(lead);
  Tensor x = contiguous(cf::to(reshape(states.detach(), {rows, d}), memory.dtype()));
  // Which rows to store, decided on the bank's device, where the rows and the
  // counters stay (this runs in every training forward: nothing comes back to the
  // host). A state with a non-finite value is an error (it would poison every later
  // clustering), a data check that on CUDA is reported at the next host read; a zero
  // state has no direction for the cosine K-Means (and eq. 5), so it is not stored,
  // like padding.
  const Tensor norm2 = sum(square(cf::to(x, kFloat64)), {1});  // (rows,); NaN or inf for a non-finite row
  const Tensor valid = mask.defined() ? logical_not(reshape(mask, {rows})) : Tensor::ones({rows}, kBool, x.device());
  const Tensor bad = logical_and(valid, logical_not(lt(norm2, INFINITY)));
  // A bad row is a 1 where only 0 is in range: the check's first failure names it.
  check_indices("MemoryBank", cf::to(bad, kInt64), 1, [desc = states.describe()](int64_t i, int64_t) {
    throw ValueError(str("[MemoryBank] add: state ", i, " of ", desc,
                         " (row-major over the leading dimensions) has a non-finite value"));
  });
  if (rows == 0) return;
  // The newest `capacity` kept rows go into the ring from the next write row on. On
  // CUDA the check above does not stop this call: a call holding a bad row stores
  // nothing (a device-side flag in the mask), as on the CPU, where it threw.
  const Tensor none_bad = eq(amax(cf::to(bad, kInt64)), 0.0);
  const bool known = steps_known();  // ring_append writes size and next row, never the steps
  ring_append(memory, counters, x, logical_and(logical_and(valid, gt(norm2, 0.0)), none_bad), kSize, kNext);
  if (known) remember_steps(host_steps_);
}

Tensor MemoryBank::contents() const {
  const int64_t n = size(), cap = options_.capacity, next = counters.to_vector<int64_t>()[kNext];
  if (n < cap) return narrow(memory, 0, 0, n);  // not wrapped yet: rows [0, n) in order
  return cat({narrow(memory, 0, next, cap - next), narrow(memory, 0, 0, next)}, 0);
}

namespace {
// The vectors held by every rank's bank together (distributed), else by this one:
// every rank must take the same decision to cluster or not (the ranks' padding
// differs, so their banks' sizes may too).
int64_t held_for_kmeans(const MemoryBankOptions& o, int64_t local) {
  if (!o.distributed || !dist::is_initialized() || dist::world_size() == 1) return local;
  Tensor n = Tensor::from_vector(std::vector<int64_t>{local}, {1});
  dist::all_reduce(n, dist::ReduceOp::sum);
  return n.to_vector<int64_t>()[0];
}
}  // namespace

void MemoryBank::remember_steps(int64_t steps) {
  host_steps_ = steps;
  steps_storage_ = counters.impl_ptr()->storage;
  steps_version_ = counters.version();
}

bool MemoryBank::steps_known() const {
  if (!counters.defined()) return false;
  const std::shared_ptr<Storage> held = steps_storage_.lock();
  return held && held == counters.impl_ptr()->storage && counters.version() == steps_version_;
}

bool MemoryBank::step() {
  // The step count is a fill's argument and the update a host decision: a CUDA graph would
  // repeat the captured step's (core/cuda_graph.h). Between replays, step() runs eagerly.
  CF_CHECK(!cuda::capturing(), DeviceError,
           "[MemoryBank] step() counts steps and decides on the host when to recompute the centroids, while this "
           "thread captures a CUDA graph: call nn::step_memory_banks between replays, outside the captured step");
  const int64_t steps = (steps_known() ? host_steps_ : counters.to_vector<int64_t>()[kSteps]) + 1;
  {
    NoGradGuard ng;
    Tensor at = narrow(counters, 0, kSteps, 1);
    fill_(at, double(steps));  // a kernel on CUDA: no host-to-device copy
  }
  remember_steps(steps);
  if (steps % options_.update_every != 0) return false;
  if (held_for_kmeans(options_, size()) < options_.num_clusters) return false;
  update_centroids();
  return true;
}

void MemoryBank::update_centroids() {
  const int64_t n_held = held_for_kmeans(options_, size());
  CF_CHECK(n_held >= options_.num_clusters, ValueError, "[MemoryBank] cannot compute ", options_.num_clusters,
           " centroids from ", n_held, " stored vectors", options_.distributed ? " (all ranks' banks)" : "");
  NoGradGuard ng;
  KMeansOptions ko;
  ko.k = options_.num_clusters;
  ko.max_iter = options_.kmeans_iters;
  ko.metric = KMeansMetric::cosine;
  ko.init = KMeansInit::kmeans_plus_plus;
  ko.seed = options_.seed + uint64_t(updates());
  // K-Means needs num_clusters distinct directions. A bank holding fewer (a layer fed
  // by a small vocabulary without positions, say) is clustered into as many as it
  // has, and the remaining centroids repeat the last one: eq. 5 sends ties to the
  // lower id, so those ids stay empty until a later update finds more directions.
  const Tensor held = contents();
  KMeansResult r;
  for (;;) {
    try {
      r = options_.distributed && dist::is_initialized() && dist::world_size() > 1 ? kmeans_distributed(held, ko)
                                                                                 : kmeans(held, ko);
      break;
    } catch (const KMeansTooFewPointsError& e) {
      CF_CHECK(e.at_most() >= 1 && e.at_most() < ko.k, Error, "[MemoryBank] internal error: K-Means found ",
               e.at_most(), " distinct directions for k = ", ko.k);
      ko.k = e.at_most();
    }
  }
  Tensor found = r.centroids;
  if (ko.k < options_.num_clusters)
    found = cat({found, expand(narrow(found, 0, ko.k - 1, 1), {options_.num_clusters - ko.k, options_.dim})}, 0);
  Tensor ordered = order_centroids_greedy(found);
  copy_(centroids, ordered);
  std::vector<int64_t> c = counters.to_vector<int64_t>();
  c[kUpdates] += 1;
  store_counters(counters, c);
  remember_steps(c[kSteps]);
}

int64_t step_memory_banks(Module& model) {
  int64_t updated = 0;
  std::vector<MemoryBank*> stepped;  // a bank registered at two places is one bank: one step
  for (auto& entry : model.named_modules())
    if (auto* bank = dynamic_cast<MemoryBank*>(entry.second)) {
      if (std::find(stepped.begin(), stepped.end(), bank) != stepped.end()) continue;
      stepped.push_back(bank);
      updated += bank->step() ? 1 : 0;
    }
  return updated;
}

}  // namespace nn
}  // namespace cf
