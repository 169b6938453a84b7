#include "nn/train/progress.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "core/error.h"

namespace cf {
namespace nn {

namespace {

double steady_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

bool default_tty(const std::ostream* out) {
  if (out == &std::cerr || out == &std::clog) return ::isatty(STDERR_FILENO) == 1;
  if (out == &std::cout) return ::isatty(STDOUT_FILENO) == 1;
  return false;
}

std::string format_value(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

}  // namespace

ProgressBar::ProgressBar(ProgressBarOptions o)
    : total_(o.total),
      initial_(o.initial),
      count_(o.initial),
      desc_(std::move(o.desc)),
      unit_(std::move(o.unit)),
      min_interval_(o.min_interval),
      summary_(o.summary_if_not_tty),
      out_(o.out ? o.out : &std::cerr),
      clock_(o.clock ? std::move(o.clock) : std::function<double()>(steady_seconds)) {
  CF_CHECK(total_ >= -1, ValueError, "[ProgressBar] total must be >= 0 or -1 (unknown), got ", total_);
  CF_CHECK(initial_ >= 0, ValueError, "[ProgressBar] initial must be >= 0, got ", initial_);
  CF_CHECK(total_ < 0 || initial_ <= total_, ValueError, "[ProgressBar] initial ", initial_,
           " exceeds total ", total_);
  CF_CHECK(std::isfinite(min_interval_) && min_interval_ >= 0, ValueError,
           "[ProgressBar] min_interval must be finite and >= 0, got ", min_interval_);
  tty_ = o.is_tty ? *o.is_tty : default_tty(out_);
  start_ = clock_();
  last_draw_ = start_;
}

ProgressBar::~ProgressBar() {
  try {
    finish();
  } catch (...) {
  }
}

void ProgressBar::update(int64_t n) {
  CF_CHECK(n >= 0, ValueError, "[ProgressBar.update] n must be >= 0, got ", n);
  set_count(count_ + n);
}

void ProgressBar::set_count(int64_t count) {
  CF_CHECK(count >= 0, ValueError, "[ProgressBar.set_count] count must be >= 0, got ", count);
  count_ = count;
  if (finished_ || !tty_) return;
  draw(total_ >= 0 && count_ >= total_);
}

void ProgressBar::set_field(const std::string& name, double value) {
  for (auto& f : fields_)
    if (f.first == name) {
      f.second = value;
      return;
    }
  fields_.emplace_back(name, value);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (tty_) {
    draw(true);
    *out_ << '\n' << std::flush;
  } else if (summary_) {
    *out_ << render() << '\n' << std::flush;
  }
}

double ProgressBar::elapsed() const { return clock_() - start_; }

double ProgressBar::rate() const {
  double t = elapsed();
  if (!(t > 0)) return 0.0;
  return double(count_ - initial_) / t;
}

std::string ProgressBar::format_time(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 1e12) return "?";
  int64_t s = int64_t(seconds);
  int64_t h = s / 3600, m = (s / 60) % 60, sec = s % 60;
  char buf[48];
  if (h > 0)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)h, (long long)m, (long long)sec);
  else
    std::snprintf(buf, sizeof buf, "%02lld:%02lld", (long long)m, (long long)sec);
  return buf;
}

std::string ProgressBar::render() const {
  const double t = elapsed();
  const double r = rate();
  std::string line;
  if (!desc_.empty()) line += desc_ + ": ";
  line += std::to_string(count_);
  if (total_ >= 0) line += "/" + std::to_string(total_);
  line += " [" + format_time(t);
  if (total_ >= 0) {
    double eta = -1;
    if (count_ >= total_)
      eta = 0;
    else if (r > 0)
      eta = double(total_ - count_) / r;
    line += "<" + format_time(eta);
  }
  char buf[64];
  if (r <= 0)
    std::snprintf(buf, sizeof buf, "? %s/s", unit_.c_str());
  else if (r < 1)
    std::snprintf(buf, sizeof buf, "%.2f s/%s", 1.0 / r, unit_.c_str());
  else if (r < 100)
    std::snprintf(buf, sizeof buf, "%.1f %s/s", r, unit_.c_str());
  else
    std::snprintf(buf, sizeof buf, "%.0f %s/s", r, unit_.c_str());
  line += ", ";
  line += buf;
  line += "]";
  for (const auto& f : fields_) line += " " + f.first + "=" + format_value(f.second);
  return line;
}

void ProgressBar::draw(bool force) {
  const double now = clock_();
  if (!force && drawn_ && now - last_draw_ < min_interval_) return;
  std::string line = render();
  size_t len = line.size();
  if (len < last_len_) line.append(last_len_ - len, ' ');
  *out_ << '\r' << line << std::flush;
  last_len_ = len;
  last_draw_ = now;
  drawn_ = true;
}

}  // namespace nn
}  // namespace cf
