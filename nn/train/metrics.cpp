#include "nn/train/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <ostream>

#include "core/error.h"
#include "core/json.h"

namespace cf {
namespace nn {

nlohmann::ordered_json json_finite_or_null(const nlohmann::ordered_json& j) {
  if (j.is_number_float()) {
    double v = j.get<double>();
    return std::isfinite(v) ? j : nlohmann::ordered_json(nullptr);
  }
  if (j.is_object()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (auto it = j.begin(); it != j.end(); ++it) out[it.key()] = json_finite_or_null(it.value());
    return out;
  }
  if (j.is_array()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& e : j) out.push_back(json_finite_or_null(e));
    return out;
  }
  return j;
}

MetricsWriter::MetricsWriter(const std::string& path, Mode mode) : path_(path) {
  CF_CHECK(!path.empty(), ValueError, "[MetricsWriter] empty file name");
  auto flags = std::ios::out | std::ios::binary | (mode == Mode::Append ? std::ios::app : std::ios::trunc);
  errno = 0;
  file_ = std::make_unique<std::ofstream>(path, flags);
  if (!file_->is_open()) {
    int err = errno;
    throw IOError(str("[MetricsWriter] cannot open '", path, "' for writing",
                      err ? str(": ", std::strerror(err)) : std::string()));
  }
  out_ = file_.get();
}

MetricsWriter::MetricsWriter(std::ostream& out) : out_(&out) {}

void MetricsWriter::write(const nlohmann::ordered_json& record) {
  CF_CHECK(record.is_object(), ValueError, "[MetricsWriter.write] a record must be a JSON object, got ",
           record.type_name());
  std::string line = io::json_line(json_finite_or_null(record));  // (a name that is not UTF-8: U+FFFD)
  *out_ << line << '\n';
  out_->flush();
  if (!*out_) {
    std::string where = path_.empty() ? std::string("the output stream") : "'" + path_ + "'";
    throw IOError(str("[MetricsWriter] writing to ", where, " failed"));
  }
  ++lines_;
}

void MetricsWriter::log(int64_t step, const std::string& split,
                        const std::vector<std::pair<std::string, double>>& values) {
  nlohmann::ordered_json rec = nlohmann::ordered_json::object();
  rec["step"] = step;
  rec["split"] = split;
  for (const auto& [name, v] : values) {
    CF_CHECK(!name.empty(), ValueError, "[MetricsWriter.log] empty metric name");
    CF_CHECK(name != "step" && name != "split", ValueError, "[MetricsWriter.log] metric name '", name,
             "' is reserved");
    CF_CHECK(!rec.contains(name), ValueError, "[MetricsWriter.log] metric '", name, "' given twice");
    rec[name] = v;
  }
  write(rec);
}

}  // namespace nn
}  // namespace cf
