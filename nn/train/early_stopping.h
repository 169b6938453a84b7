#pragma once
// EarlyStopping: watches a validation metric and says when to stop.
//
//   mode "min": value improves when value < best - min_delta
//   mode "max": value improves when value > best + min_delta
//
// The first finite value is always an improvement. NaN never is (it counts as an
// evaluation without improvement). should_stop() is true once `patience`
// consecutive evaluations brought no improvement (patience 0: the first one
// without improvement); a new best resets the count.
//
// state()/set_state() and state_dict()/load_state_dict() save and restore the
// counters (not the options), so a resumed run continues identically. The state
// dict holds 0-d tensors: "best" (float64; 0 while there is none, which
// "best_step" -1 tells: a NaN would be refused by the checkpoint writer as a
// diverged run), "best_step", "num_bad", "num_evals" (int64); loading is
// strict and takes the NaN that states saved before 2026-11-30 hold.
#include <cstdint>
#include <limits>
#include <string>

#include "nn/state_dict.h"

namespace cf {
namespace nn {

struct EarlyStoppingOptions {
  std::string mode = "min";  // "min" or "max"
  int64_t patience = 10;     // >= 0
  double min_delta = 0.0;    // finite, >= 0
};

class EarlyStopping {
 public:
  struct State {
    double best = std::numeric_limits<double>::quiet_NaN();  // NaN: no best yet
    int64_t best_step = -1;
    int64_t num_bad = 0;    // consecutive evaluations without improvement
    int64_t num_evals = 0;  // evaluations seen
    bool operator==(const State& o) const;
  };

  // ValueError for an unknown mode, patience < 0, or a negative/non-finite min_delta.
  explicit EarlyStopping(const EarlyStoppingOptions& options = {});

  // Record one evaluation at `step` (default: the evaluation's 1-based index).
  // Returns true when it is a new best.
  bool update(double value, int64_t step = -1);
  bool should_stop() const;
  // True when `value` would be an improvement over the current best.
  bool is_improvement(double value) const;

  bool has_best() const;
  double best() const { return state_.best; }
  int64_t best_step() const { return state_.best_step; }
  int64_t num_bad() const { return state_.num_bad; }
  int64_t num_evals() const { return state_.num_evals; }
  const EarlyStoppingOptions& options() const { return opt_; }
  bool maximize() const { return maximize_; }

  const State& state() const { return state_; }
  // ValueError when the counters are inconsistent (negative, best_step without a best).
  void set_state(const State& s);
  StateDict state_dict() const;
  void load_state_dict(const StateDict& dict);
  void reset() { state_ = State{}; }

 private:
  EarlyStoppingOptions opt_;
  bool maximize_ = false;
  State state_;
};

}  // namespace nn
}  // namespace cf
