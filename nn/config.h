#pragma once
// Checked JSON configuration (DESIGN.md section 9): apps and models read their
// settings through a Config, which knows the type each key must have and, in
// finish(), refuses every key that was present but never read, so a misspelt or
// stray key is an error instead of a silently ignored setting.
//
//   nlohmann::json j = cf::nn::load_json_file("run.json");
//   cf::nn::Config cfg(j, "", "run.json");
//   int64_t steps = cfg.get<int64_t>("steps", 1000);
//   cf::nn::Config model = cfg.child("model");          // errors say "model.d_model"
//   int64_t d = model.require<int64_t>("d_model");
//   std::string att = model.child("attention").get<std::string>("type", "full");
//   cfg.finish();  // ValueError: "[config] unknown key 'model.d_modle' (in run.json)"
//
// Types: int64_t, int, uint64_t, double, float, bool, std::string and
// std::vector<int64_t>, std::vector<double>, std::vector<std::string>.
// Integers accept JSON integers and floats with an integral value (1e6), never
// 2.5; unsigned refuses negatives; double and float accept any JSON number; bool
// only true/false; strings only strings. A JSON null counts as absent for get()
// (the default is returned) and as missing for require(). All errors are
// cf::ValueError naming the key path, the expected type and the value seen.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace cf {
namespace nn {

// Parse a JSON file (comments allowed). IOError naming the file when it cannot be
// read, and the line, column and byte of the problem when it does not parse.
nlohmann::json load_json_file(const std::string& path);

namespace detail {
// Convert j to out, or throw ValueError naming `where` (the key path + source).
void config_convert(const nlohmann::json& j, const std::string& where, int64_t& out);
void config_convert(const nlohmann::json& j, const std::string& where, int& out);
void config_convert(const nlohmann::json& j, const std::string& where, uint64_t& out);
void config_convert(const nlohmann::json& j, const std::string& where, double& out);
void config_convert(const nlohmann::json& j, const std::string& where, float& out);
void config_convert(const nlohmann::json& j, const std::string& where, bool& out);
void config_convert(const nlohmann::json& j, const std::string& where, std::string& out);
void config_convert(const nlohmann::json& j, const std::string& where, std::vector<int64_t>& out);
void config_convert(const nlohmann::json& j, const std::string& where, std::vector<double>& out);
void config_convert(const nlohmann::json& j, const std::string& where,
                    std::vector<std::string>& out);
}  // namespace detail

class Config {
 public:
  // A reader over the JSON object `json` (copied; ValueError if not an object).
  // `name` prefixes key paths in messages ("model" gives "model.d_model");
  // `source`, e.g. the file name, is added to every message.
  explicit Config(const nlohmann::json& json, const std::string& name = "",
                  const std::string& source = "");
  // load_json_file(path) read with the file name as source.
  static Config from_file(const std::string& path, const std::string& name = "");

  // True when `key` is present and not null. Does not count as reading it.
  bool has(const std::string& key) const;
  // The value of `key` as T, or default_value when absent or null.
  template <class T>
  T get(const std::string& key, const T& default_value) const {
    const nlohmann::json* v = lookup(key);
    if (!v || v->is_null()) return default_value;
    T out;
    detail::config_convert(*v, where(key), out);
    return out;
  }
  // Overload so that get("name", "text") yields a std::string.
  std::string get(const std::string& key, const char* default_value) const {
    return get<std::string>(key, std::string(default_value));
  }
  // The value of `key` as T; ValueError when absent or null.
  template <class T>
  T require(const std::string& key) const {
    const nlohmann::json* v = lookup(key);
    if (!v || v->is_null()) missing(key);
    T out;
    detail::config_convert(*v, where(key), out);
    return out;
  }
  // The nested object at `key` (ValueError when absent or not an object); its
  // keys are tracked by the same finish().
  Config child(const std::string& key) const;
  // Like child(), but an absent or null key gives an empty Config.
  Config optional_child(const std::string& key) const;

  // Keys of this object, sorted (nlohmann::json keeps objects sorted).
  std::vector<std::string> keys() const;
  // The full path of `key` ("model.attention.type").
  std::string path_of(const std::string& key) const;
  const std::string& name() const { return name_; }
  // The raw JSON of this object (reading it does not mark keys as read).
  const nlohmann::json& raw() const { return *node_; }

  // ValueError listing every key under this object that was present but never
  // read (by get, require, or child followed by reads of its keys), sorted by
  // path within each object.
  void finish() const;

 private:
  struct State;
  Config(std::shared_ptr<State> state, const nlohmann::json* node, std::string name);
  // The value at key (marked read), or nullptr.
  const nlohmann::json* lookup(const std::string& key) const;
  std::string where(const std::string& key) const;
  [[noreturn]] void missing(const std::string& key) const;
  void collect_unknown(const nlohmann::json& node, const std::string& prefix,
                       std::vector<std::string>& out) const;

  std::shared_ptr<State> state_;
  const nlohmann::json* node_ = nullptr;
  std::string name_;
};

}  // namespace nn
}  // namespace cf
