#pragma once
// Small command-line helpers shared by the apps: `--name value` / `--name=value`
// options, numbers parsed strictly, and usage errors that exit with status 2.
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace cf::apps {

// Thrown for a bad command line; main prints it with the usage hint and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Thrown by train_model (train_run.h) when --stop-after steps are done and the
// model is not finished: its checkpoint is written and the same command
// continues from it (for machines that give a job a time limit); run_app exits 3.
struct TrainingStopped : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline int64_t parse_int(const std::string& opt, const std::string& s, int64_t min_value) {
  size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &pos);
  } catch (const std::exception&) {
    throw UsageError(opt + " expects an integer, got '" + s + "'");
  }
  if (pos != s.size()) throw UsageError(opt + " expects an integer, got '" + s + "'");
  if (v < min_value)
    throw UsageError(opt + " must be at least " + std::to_string(min_value) + ", got " + s);
  return int64_t(v);
}

inline double parse_double(const std::string& opt, const std::string& s) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    throw UsageError(opt + " expects a number, got '" + s + "'");
  }
  if (pos != s.size()) throw UsageError(opt + " expects a number, got '" + s + "'");
  return v;
}

// "256,512,1024" -> {256, 512, 1024}
inline std::vector<int64_t> parse_int_list(const std::string& opt, const std::string& s,
                                           int64_t min_value) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    out.push_back(parse_int(opt, s.substr(start, comma - start), min_value));
    start = comma + 1;
  }
  return out;
}

// Walks argv: options are "--name value" or "--name=value"; flags have no value.
class ArgReader {
 public:
  ArgReader(int argc, char** argv, int first) {
    for (int i = first; i < argc; ++i) args_.emplace_back(argv[i]);
  }
  bool done() const { return i_ >= args_.size(); }
  // Next option name (without its "=value" part); throws for a non-option word.
  std::string next() {
    std::string a = args_[i_++];
    inline_value_.clear();
    has_inline_ = false;
    if (a.rfind("--", 0) != 0 && a != "-h")
      throw UsageError("unexpected argument '" + a + "'");
    size_t eq = a.find('=');
    if (eq != std::string::npos) {
      inline_value_ = a.substr(eq + 1);
      has_inline_ = true;
      a = a.substr(0, eq);
    }
    return a;
  }
  std::string value(const std::string& opt) {
    if (has_inline_) {
      has_inline_ = false;
      return inline_value_;
    }
    if (i_ >= args_.size()) throw UsageError(opt + " needs a value");
    return args_[i_++];
  }
  // Whether the option just read came as --name=value.
  bool has_inline_value() const { return has_inline_; }
  void no_value(const std::string& opt) const {
    if (has_inline_) throw UsageError(opt + " takes no value");
  }

 private:
  std::vector<std::string> args_;
  size_t i_ = 0;
  std::string inline_value_;
  bool has_inline_ = false;
};

}  // namespace cf::apps
