#pragma once
// MetricsWriter: training metrics as JSON lines (DESIGN.md section 9), one JSON
// object per line, keys in the order given:
//
//   {"step":10,"split":"train","loss":0.5,"lr":0.001}
//   {"step":10,"split":"val","loss":0.61}
//
// To a file (appended to, or truncated, at construction) or to any std::ostream.
// Every line is flushed as soon as it is written, so a crash leaves only whole
// lines behind (at most the last one can be missing).
//
// JSON has no NaN or infinity: every non-finite number (at any depth of a
// record) is written as null. Readers should treat null as "not a number".
#include <cstdint>
#include <fstream>
#include <iosfwd>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace cf {
namespace nn {

class MetricsWriter {
 public:
  enum class Mode { Append, Truncate };
  // Opens (creating if needed) `path`; IOError naming the file and the reason
  // when it cannot be opened.
  explicit MetricsWriter(const std::string& path, Mode mode = Mode::Append);
  // Writes to `out`, which must outlive the writer.
  explicit MetricsWriter(std::ostream& out);
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // One record: {"step": step, "split": split, <name>: <value>, ...}.
  // ValueError when a name is empty, repeated, or "step"/"split".
  void log(int64_t step, const std::string& split,
           const std::vector<std::pair<std::string, double>>& values);
  // Any JSON object as one line (ValueError when `record` is not an object).
  void write(const nlohmann::ordered_json& record);

  // The file name ("" when writing to a stream).
  const std::string& path() const { return path_; }
  int64_t lines_written() const { return lines_; }

 private:
  std::string path_;
  std::unique_ptr<std::ofstream> file_;
  std::ostream* out_ = nullptr;
  int64_t lines_ = 0;
};

// A copy of j with every non-finite float replaced by null (what MetricsWriter writes).
nlohmann::ordered_json json_finite_or_null(const nlohmann::ordered_json& j);

}  // namespace nn
}  // namespace cf
