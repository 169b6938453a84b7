#include "nn/data/labelled_text.h"

#include "core/error.h"
#include "core/io.h"

namespace cf {
namespace data {

namespace {

// "\n" -> line break, "\\" -> backslash; any other backslash stays.
std::string unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && (s[i + 1] == 'n' || s[i + 1] == '\\')) {
      out += s[i + 1] == 'n' ? '\n' : '\\';
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

std::vector<LabelledText> read_labelled_texts(const std::string& path) {
  constexpr const char* op = "read_labelled_texts";
  std::string text = io::read_file_maybe_gzip(path, op);
  // A UTF-8 byte-order mark (as Windows editors save) is no part of the first label ("\xEF\xBB\xBFlaw" was
  // a topic of its own beside "law")
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);
  std::vector<LabelledText> out;
  io::for_each_line(text, [&](int64_t line, std::string_view row) {
    if (row.find_first_not_of(" \t") == std::string_view::npos) return;  // blank
    const size_t tab = row.find('\t');
    CF_CHECK(tab != std::string_view::npos, IOError, "[", op, "] '", path, "' line ", line,
             ": expected label<TAB>text, found no tab");
    CF_CHECK(tab > 0, IOError, "[", op, "] '", path, "' line ", line, ": the label (before the tab) is empty");
    CF_CHECK(tab + 1 < row.size(), IOError, "[", op, "] '", path, "' line ", line,
             ": the text (after the tab) is empty");
    out.push_back({std::string(row.substr(0, tab)), unescape(row.substr(tab + 1))});
  });
  CF_CHECK(!out.empty(), IOError, "[", op, "] '", path, "' holds no text");
  return out;
}

}  // namespace data
}  // namespace cf
