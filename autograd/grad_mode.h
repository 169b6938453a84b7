#pragma once

namespace cf {

// Whether ops record autograd history on this thread (default: true).
bool grad_enabled();
void set_grad_enabled(bool on);

// Disables history recording for its lifetime (optimizer steps, evaluation).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace cf
