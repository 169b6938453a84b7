#pragma once
// ProgressBar: one status line for a long loop (DESIGN.md section 9):
//
//   train: 12/100 [00:03<00:22, 3.9 it/s] loss=0.512
//   train: 12 [00:03, 3.9 it/s] loss=0.512            (total unknown)
//
// i.e. "<desc>: <n>/<total> [<elapsed><<eta>, <rate>] <name>=<value> ...".
// Times are mm:ss, or h:mm:ss from one hour on; the ETA is "?" until a rate is
// known. The rate is the average since the bar was created, counted from
// `initial` (a resumed run does not inflate it), shown as "3.9 it/s" or, below
// one unit per second, "2.50 s/it". Field values are printed with %.4g.
//
// Output: on a terminal the line is redrawn in place ('\r', padded with spaces
// over a longer previous line) at most once per min_interval seconds (0.1 s by
// default), always when the count reaches the total, and ends with '\n' at
// finish(). When the stream is NOT a terminal (a log file, a pipe, CI) the bar
// writes nothing per step, so logs are not flooded; with summary_if_not_tty it
// writes the final line once, at finish().
//
// The stream, the terminal decision and the clock are injectable, so the text is
// testable. By default the stream is std::cerr and is_tty is isatty(stderr)
// (isatty(stdout) for std::cout; any other stream counts as not a terminal).
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cf {
namespace nn {

struct ProgressBarOptions {
  int64_t total = -1;          // number of steps; -1 = unknown
  int64_t initial = 0;         // starting count (a resumed run); 0 <= initial
  std::string desc;            // prefix ("train"); empty for none
  std::string unit = "it";     // "it", "batch", "img", ...
  double min_interval = 0.1;   // seconds between redraws on a terminal (>= 0)
  bool summary_if_not_tty = false;  // not a terminal: one line at finish()
  std::ostream* out = nullptr;      // default std::cerr
  std::optional<bool> is_tty;       // default: see above
  std::function<double()> clock;    // seconds (monotonic); default steady_clock
};

class ProgressBar {
 public:
  // ValueError for total < -1, initial < 0, initial > total (known total), or a
  // negative / non-finite min_interval.
  explicit ProgressBar(ProgressBarOptions options = {});
  // Calls finish() if it was not called (never throws).
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Advance the count by n (>= 0) and redraw if due.
  void update(int64_t n = 1);
  // Set the count to an absolute value (>= 0) and redraw if due.
  void set_count(int64_t count);
  // Set (or replace) a named scalar field shown after the counter, in first-set
  // order. Not drawn by itself: the next update() or finish() shows it.
  void set_field(const std::string& name, double value);
  void clear_fields() { fields_.clear(); }
  // Final draw: on a terminal the line and '\n'; otherwise the summary line if
  // summary_if_not_tty. Later calls do nothing.
  void finish();

  // The current line (no '\r' or '\n').
  std::string render() const;
  int64_t count() const { return count_; }
  int64_t total() const { return total_; }
  bool is_tty() const { return tty_; }
  bool finished() const { return finished_; }
  // Seconds since construction, and units per second since then (0 before any time passed).
  double elapsed() const;
  double rate() const;

  // "mm:ss" or "h:mm:ss" (negative or non-finite: "?"). Exposed for tests.
  static std::string format_time(double seconds);

 private:
  void draw(bool force);

  int64_t total_, initial_, count_;
  std::string desc_, unit_;
  double min_interval_;
  bool summary_;
  std::ostream* out_;
  bool tty_;
  std::function<double()> clock_;
  double start_ = 0, last_draw_ = 0;
  bool drawn_ = false, finished_ = false;
  size_t last_len_ = 0;
  std::vector<std::pair<std::string, double>> fields_;
};

}  // namespace nn
}  // namespace cf
