#pragma once
// JSON text parsing shared by cf's readers (configs, safetensors headers,
// tokenizer files, the apps' --config files).
//
// nlohmann's parser keeps the last of a key repeated in one object without a
// word, so {"lr": 0.1, "lr": 1.0} would train with 1.0 and a safetensors header
// naming a tensor twice would load one of the two. These parse like
// nlohmann::json::parse (its exceptions pass through unchanged) and throw
// DuplicateJsonKey for a repeated key, naming it and the object it is in, and
// JsonTooDeep for arrays and objects nested deeper than kMaxJsonDepth (nlohmann's
// copies, comparisons and dump() recurse: 100,000 '[' overflowed the stack).
// Both are JsonStructureError.
#include <nlohmann/json_fwd.hpp>

#include <stdexcept>
#include <string>

namespace cf {
namespace io {

// what(): "key 'lr' appears twice in object 'optimizer'" (the object's path from
// the root, e.g. 'model.layers[2]'; "the top-level object" at the root).
class JsonStructureError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class DuplicateJsonKey : public JsonStructureError {
 public:
  using JsonStructureError::JsonStructureError;
};
// what(): "arrays and objects nest deeper than 256 levels (at 'a.b[0]...')"
class JsonTooDeep : public JsonStructureError {
 public:
  using JsonStructureError::JsonStructureError;
};
constexpr int kMaxJsonDepth = 256;

nlohmann::json parse_json(const std::string& text, bool ignore_comments = false);

// One line of JSON text (no newline) for cf's JSON-lines outputs (the apps' events, MetricsWriter). Text
// that is not UTF-8 (a label or file name from the user's data, a metric's name) is written with U+FFFD in
// place of the bad bytes, as the tokenizers repair text: nlohmann's dump() throws on it, which ended a
// run at its first report with a message naming nothing.
std::string json_line(const nlohmann::json& j);
std::string json_line(const nlohmann::ordered_json& j);
nlohmann::ordered_json parse_ordered_json(const std::string& text, bool ignore_comments = false);

}  // namespace io
}  // namespace cf
