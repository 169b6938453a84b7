#include "nn/train/early_stopping.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace cf {
namespace nn {

bool EarlyStopping::State::operator==(const State& o) const {
  bool same_best = (std::isnan(best) && std::isnan(o.best)) || best == o.best;
  return same_best && best_step == o.best_step && num_bad == o.num_bad && num_evals == o.num_evals;
}

EarlyStopping::EarlyStopping(const EarlyStoppingOptions& options) : opt_(options) {
  CF_CHECK(opt_.mode == "min" || opt_.mode == "max", ValueError,
           "[EarlyStopping] mode must be \"min\" or \"max\", got \"", opt_.mode, "\"");
  CF_CHECK(opt_.patience >= 0, ValueError, "[EarlyStopping] patience must be >= 0, got ", opt_.patience);
  CF_CHECK(std::isfinite(opt_.min_delta) && opt_.min_delta >= 0, ValueError,
           "[EarlyStopping] min_delta must be finite and >= 0, got ", opt_.min_delta);
  maximize_ = opt_.mode == "max";
}

bool EarlyStopping::has_best() const { return !std::isnan(state_.best); }

bool EarlyStopping::is_improvement(double value) const {
  if (std::isnan(value)) return false;
  if (!has_best()) return true;
  return maximize_ ? value > state_.best + opt_.min_delta : value < state_.best - opt_.min_delta;
}

bool EarlyStopping::update(double value, int64_t step) {
  ++state_.num_evals;
  if (is_improvement(value)) {
    state_.best = value;
    state_.best_step = step >= 0 ? step : state_.num_evals;
    state_.num_bad = 0;
    return true;
  }
  ++state_.num_bad;
  return false;
}

bool EarlyStopping::should_stop() const {
  return state_.num_bad > 0 && state_.num_bad >= opt_.patience;
}

void EarlyStopping::set_state(const State& s) {
  CF_CHECK(s.num_evals >= 0 && s.num_bad >= 0 && s.num_bad <= s.num_evals, ValueError,
           "[EarlyStopping.set_state] inconsistent counters: num_bad ", s.num_bad, ", num_evals ",
           s.num_evals);
  CF_CHECK(std::isnan(s.best) ? s.best_step == -1 : s.best_step >= 0, ValueError,
           "[EarlyStopping.set_state] best_step ", s.best_step, " does not fit best ", s.best);
  state_ = s;
}

StateDict EarlyStopping::state_dict() const {
  // No best yet is best_step -1, and "best" then 0: a NaN would read as a diverged run to the checkpoint
  // writer, which refuses NaN (no checkpoint could be taken before the first finite evaluation).
  return {{"best", Tensor::scalar(has_best() ? state_.best : 0.0, kFloat64)},
          {"best_step", Tensor::scalar(double(state_.best_step), kInt64)},
          {"num_bad", Tensor::scalar(double(state_.num_bad), kInt64)},
          {"num_evals", Tensor::scalar(double(state_.num_evals), kInt64)}};
}

void EarlyStopping::load_state_dict(const StateDict& dict) {
  const char* names[] = {"best", "best_step", "num_bad", "num_evals"};
  std::vector<std::string> problems;
  for (const auto& e : dict) {
    bool known = false;
    for (const char* n : names) known = known || e.first == n;
    if (!known) problems.push_back("unexpected entry '" + e.first + "'");
  }
  double v[4] = {0, 0, 0, 0};
  for (int i = 0; i < 4; ++i) {
    const Tensor* t = find_entry(dict, names[i]);
    if (!t) {
      problems.push_back(str("missing entry '", names[i], "'"));
      continue;
    }
    bool integral = i > 0;
    if (!t->defined() || t->dim() != 0 || !t->device().is_cpu() ||
        (t->dtype() != kFloat64 && t->dtype() != kInt64)) {
      problems.push_back(str("'", names[i], "' must be a 0-d int64 or float64 CPU tensor, got ",
                             t->defined() ? t->describe() : std::string("an undefined tensor")));
      continue;
    }
    v[i] = t->dtype() == kInt64 ? double(t->item<int64_t>()) : t->item();
    if (integral && !(std::isfinite(v[i]) && v[i] == std::floor(v[i])))
      problems.push_back(str("'", names[i], "' must hold an integer, got ", v[i]));
  }
  if (!problems.empty()) {
    std::string msg = "[EarlyStopping.load_state_dict]";
    for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : " ") + problems[i];
    throw ValueError(msg);
  }
  State s;
  s.best = v[1] == -1 ? std::numeric_limits<double>::quiet_NaN() : v[0];  // (NaN or 0 when saved: none)
  s.best_step = int64_t(v[1]);
  s.num_bad = int64_t(v[2]);
  s.num_evals = int64_t(v[3]);
  set_state(s);
}

}  // namespace nn
}  // namespace cf
