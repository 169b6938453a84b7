#include "core/json.h"

#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

namespace cf {
namespace io {
namespace {

// Follows the parser's events to know the path of the object being read and the
// keys it already holds.
class KeyTracker {
 public:
  template <class J>
  void on(typename J::parse_event_t event, const J& parsed) {
    using E = typename J::parse_event_t;
    switch (event) {
      case E::object_start: open(true); break;
      case E::array_start: open(false); break;
      case E::object_end:
      case E::array_end: close(); break;
      case E::key: {
        Frame& f = frames_.back();
        const std::string& key = parsed.template get_ref<const std::string&>();
        if (!f.keys.insert(key).second)
          throw DuplicateJsonKey("key '" + key + "' appears twice in " +
                                 (frames_.size() == 1 ? std::string("the top-level object")
                                                      : "object '" + path() + "'"));
        f.last_key = key;
        break;
      }
      case E::value: element_done(); break;
    }
  }

 private:
  struct Frame {
    bool object;
    std::set<std::string> keys;  // objects: the keys read so far
    std::string last_key;        // objects: the key whose value is being read
    size_t index = 0;            // arrays: the element being read
  };
  std::vector<Frame> frames_;

  void open(bool object) { frames_.push_back(Frame{object, {}, {}, 0}); }
  void close() {
    frames_.pop_back();
    element_done();
  }
  // A value (scalar, object or array) ended: an enclosing array moves on.
  void element_done() {
    if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
  }
  // "model.layers[2]": the path of the innermost frame, from the root's children.
  std::string path() const {
    std::string out;
    for (size_t i = 0; i + 1 < frames_.size(); ++i) {
      const Frame& f = frames_[i];
      if (f.object) out += (out.empty() ? "" : ".") + f.last_key;
      else out += "[" + std::to_string(f.index) + "]";
    }
    return out;
  }
};

template <class J>
J parse_unique(const std::string& text, bool ignore_comments) {
  // nlohmann's lexer reads a NUL byte between tokens as the end of the input (for C strings), so
  // '{"k": 3}\0{"k": 9}' parsed as {"k": 3} and the rest was ignored without a word. Refused when the text
  // before the NUL is a whole document (a NUL elsewhere, in a string or a comment, gets nlohmann's own
  // answer, as before); NULs with nothing but NULs and white space after them (padding) stay allowed.
  const size_t nul = text.find('\0');
  if (nul != std::string::npos &&
      text.find_first_not_of(std::string(" \t\r\n\0", 5), nul) != std::string::npos &&
      J::accept(text.substr(0, nul), ignore_comments))
    throw J::parse_error::create(101, nul + 1, "syntax error: a NUL byte ends the JSON text before the rest of it",
                                 nullptr);
  KeyTracker tracker;
  typename J::parser_callback_t callback = [&tracker](int depth, typename J::parse_event_t event, J& parsed) {
    if (depth >= kMaxJsonDepth &&
        (event == J::parse_event_t::object_start || event == J::parse_event_t::array_start))
      throw JsonTooDeep("arrays and objects nest deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    tracker.on<J>(event, parsed);
    return true;  // keep every value
  };
  return J::parse(text, callback, /*allow_exceptions=*/true, ignore_comments);
}

}  // namespace

std::string json_line(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }
std::string json_line(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

nlohmann::json parse_json(const std::string& text, bool ignore_comments) {
  return parse_unique<nlohmann::json>(text, ignore_comments);
}

nlohmann::ordered_json parse_ordered_json(const std::string& text, bool ignore_comments) {
  return parse_unique<nlohmann::ordered_json>(text, ignore_comments);
}

}  // namespace io
}  // namespace cf
