#include "nn/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/io.h"
#include "core/json.h"

namespace cf {
namespace nn {

using nlohmann::json;

json load_json_file(const std::string& path) {
  const std::string text = io::read_file(path, "load_json_file");  // regular files only, never blocks
  try {
    return io::parse_json(text, /*ignore_comments=*/true);
  } catch (const io::JsonStructureError& e) {
    throw IOError(str("[load_json_file] ", path, ": ", e.what()));
  } catch (const json::parse_error& e) {
    // e.byte is 1-based and points just past the offending character.
    size_t byte = e.byte == 0 ? 0 : e.byte - 1;
    if (byte > text.size()) byte = text.size();
    size_t line = 1, col = 1;
    for (size_t i = 0; i < byte; ++i) {
      if (text[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw IOError(str("[load_json_file] ", path, ": JSON parse error at line ", line, ", column ",
                      col, " (byte ", e.byte, "): ", e.what()));
  } catch (const json::exception& e) {
    // Not a syntax error but still the file's fault: a number beyond double's
    // range (1e400) is nlohmann's out_of_range 406, which escaped unnamed.
    throw IOError(str("[load_json_file] ", path, ": ", e.what()));
  }
}

// ---- conversions ----
namespace detail {
namespace {

std::string shown(const json& j) {
  std::string s = j.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  const char* kind = j.is_string() ? "string " : j.is_boolean() ? "boolean " :
                     j.is_number_float() ? "float " : j.is_number() ? "integer " :
                     j.is_array() ? "array " : j.is_object() ? "object " : "";
  return kind + s;
}

[[noreturn]] void bad(const json& j, const std::string& where, const char* expected) {
  throw ValueError(str("[config] ", where, ": expected ", expected, ", got ", shown(j)));
}

// An integral value in [lo, hi] as long double (exact for every int64/uint64).
long double integral(const json& j, const std::string& where, const char* expected, long double lo,
                     long double hi) {
  long double v;
  if (j.is_number_unsigned()) v = (long double)j.get<uint64_t>();
  else if (j.is_number_integer()) v = (long double)j.get<int64_t>();
  else if (j.is_number_float()) {
    double d = j.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d) bad(j, where, expected);
    v = d;
  } else {
    bad(j, where, expected);
  }
  if (v < lo || v > hi) {
    throw ValueError(str("[config] ", where, ": expected ", expected, ", got ", shown(j),
                         v < 0 && lo >= 0 ? " (negative)" : " (out of range)"));
  }
  return v;
}

}  // namespace

void config_convert(const json& j, const std::string& where, int64_t& out) {
  if (j.is_number_integer() && !j.is_number_unsigned()) {
    out = j.get<int64_t>();
    return;
  }
  // 2^63 is exactly representable; the upper bound is checked as < 2^63.
  long double v = integral(j, where, "an integer (int64)", -9223372036854775808.0L,
                           9223372036854775807.0L);
  out = int64_t(v);
}
void config_convert(const json& j, const std::string& where, int& out) {
  long double v = integral(j, where, "an integer (int)", (long double)std::numeric_limits<int>::min(),
                           (long double)std::numeric_limits<int>::max());
  out = int(v);
}
void config_convert(const json& j, const std::string& where, uint64_t& out) {
  if (j.is_number_unsigned()) {
    out = j.get<uint64_t>();
    return;
  }
  long double v = integral(j, where, "a non-negative integer (uint64)", 0.0L, 18446744073709551615.0L);
  out = uint64_t(v);
}
void config_convert(const json& j, const std::string& where, double& out) {
  if (!j.is_number()) bad(j, where, "a number");
  out = j.get<double>();
}
void config_convert(const json& j, const std::string& where, float& out) {
  if (!j.is_number()) bad(j, where, "a number (float32)");
  double d = j.get<double>();
  if (std::isfinite(d) && std::fabs(d) > double(std::numeric_limits<float>::max()))
    throw ValueError(str("[config] ", where, ": expected a number (float32), got ", shown(j),
                         " (out of range)"));
  out = float(d);
}
void config_convert(const json& j, const std::string& where, bool& out) {
  if (!j.is_boolean()) bad(j, where, "a boolean");
  out = j.get<bool>();
}
void config_convert(const json& j, const std::string& where, std::string& out) {
  if (!j.is_string()) bad(j, where, "a string");
  out = j.get<std::string>();
}

namespace {
template <class T>
void convert_list(const json& j, const std::string& where, std::vector<T>& out, const char* expected) {
  if (!j.is_array()) bad(j, where, expected);
  out.clear();
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    T v;
    config_convert(j[i], where + " element [" + std::to_string(i) + "]", v);
    out.push_back(std::move(v));
  }
}
}  // namespace

void config_convert(const json& j, const std::string& where, std::vector<int64_t>& out) {
  convert_list(j, where, out, "an array of integers");
}
void config_convert(const json& j, const std::string& where, std::vector<double>& out) {
  convert_list(j, where, out, "an array of numbers");
}
void config_convert(const json& j, const std::string& where, std::vector<std::string>& out) {
  convert_list(j, where, out, "an array of strings");
}

}  // namespace detail

// ---- Config ----

struct Config::State {
  json root;
  std::string source;
  std::set<const json*> read;  // values read by get/require/child
  json empty = json::object();
};

Config::Config(const json& j, const std::string& name, const std::string& source)
    : state_(std::make_shared<State>()), name_(name) {
  state_->source = source;
  if (!j.is_object())
    throw ValueError(str("[config] ", name.empty() ? std::string("the configuration") : "'" + name + "'",
                         source.empty() ? std::string() : " (in " + source + ")",
                         " must be a JSON object, got ", detail::shown(j)));
  state_->root = j;
  node_ = &state_->root;
}

Config::Config(std::shared_ptr<State> state, const json* node, std::string name)
    : state_(std::move(state)), node_(node), name_(std::move(name)) {}

Config Config::from_file(const std::string& path, const std::string& name) {
  return Config(load_json_file(path), name, path);
}

std::string Config::path_of(const std::string& key) const {
  return name_.empty() ? key : name_ + "." + key;
}

std::string Config::where(const std::string& key) const {
  std::string s = "key '" + path_of(key) + "'";
  if (!state_->source.empty()) s += " (in " + state_->source + ")";
  return s;
}

namespace {
// Levenshtein distance of two short keys (a misspelt option name is a few edits away).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}
}  // namespace

void Config::missing(const std::string& key) const {
  // A key of this object within two edits of the missing one is most likely it, misspelt: named here, since the
  // unknown-key check (finish) never runs after this error ("clusterz" was reported as 'clusters' missing only)
  std::string near;
  for (auto it = node_->begin(); it != node_->end(); ++it)
    if (it.key() != key && edit_distance(it.key(), key) <= 2)
      near += (near.empty() ? "" : ", ") + ("'" + path_of(it.key()) + "'");
  throw ValueError(str("[config] missing required ", where(key),
                       near.empty() ? std::string() : " (given: " + near + ", misspelt?)"));
}

const json* Config::lookup(const std::string& key) const {
  auto it = node_->find(key);
  if (it == node_->end()) return nullptr;
  const json* v = &*it;
  state_->read.insert(v);
  return v;
}

bool Config::has(const std::string& key) const {
  auto it = node_->find(key);
  return it != node_->end() && !it->is_null();
}

Config Config::child(const std::string& key) const {
  const json* v = lookup(key);
  if (!v || v->is_null()) missing(key);
  if (!v->is_object())
    throw ValueError(str("[config] ", where(key), ": expected an object, got ", detail::shown(*v)));
  return Config(state_, v, path_of(key));
}

Config Config::optional_child(const std::string& key) const {
  const json* v = lookup(key);
  if (!v || v->is_null()) return Config(state_, &state_->empty, path_of(key));
  if (!v->is_object())
    throw ValueError(str("[config] ", where(key), ": expected an object, got ", detail::shown(*v)));
  return Config(state_, v, path_of(key));
}

std::vector<std::string> Config::keys() const {
  std::vector<std::string> out;
  for (auto it = node_->begin(); it != node_->end(); ++it) out.push_back(it.key());
  return out;
}

void Config::collect_unknown(const json& node, const std::string& prefix,
                             std::vector<std::string>& out) const {
  for (auto it = node.begin(); it != node.end(); ++it) {
    std::string p = prefix.empty() ? it.key() : prefix + "." + it.key();
    const json* v = &*it;
    if (!state_->read.count(v)) out.push_back(p);
    else if (v->is_object()) collect_unknown(*v, p, out);
  }
}

void Config::finish() const {
  std::vector<std::string> unknown;
  collect_unknown(*node_, name_, unknown);
  if (unknown.empty()) return;
  std::string msg = "[config]";
  for (size_t i = 0; i < unknown.size(); ++i)
    msg += (i ? "; unknown key '" : " unknown key '") + unknown[i] + "'";
  if (!state_->source.empty()) msg += " (in " + state_->source + ")";
  throw ValueError(msg);
}

}  // namespace nn
}  // namespace cf
