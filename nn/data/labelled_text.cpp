#include "nn/data/labelled_text.h"

#include "core/error.h"
#include "core/io.h"

namespace cf {
namespace data {

namespace {

// "\n" -> line break, "\\" -> backslash; any other backslash stays.
std::string unescape(const std::string& s) {
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
  const std::string text = io::read_file_maybe_gzip(path, op);
  std::vector<LabelledText> out;
  size_t pos = 0;
  int64_t line = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    ++line;
    size_t stop = end;
    if (stop > pos && text[stop - 1] == '\r') --stop;
    const std::string row = text.substr(pos, stop - pos);
    pos = end + 1;
    if (row.find_first_not_of(" \t") == std::string::npos) continue;  // blank
    const size_t tab = row.find('\t');
    CF_CHECK(tab != std::string::npos, IOError, "[", op, "] '", path, "' line ", line,
             ": expected label<TAB>text, found no tab");
    CF_CHECK(tab > 0, IOError, "[", op, "] '", path, "' line ", line, ": the label (before the tab) is empty");
    CF_CHECK(tab + 1 < row.size(), IOError, "[", op, "] '", path, "' line ", line,
             ": the text (after the tab) is empty");
    out.push_back({row.substr(0, tab), unescape(row.substr(tab + 1))});
  }
  CF_CHECK(!out.empty(), IOError, "[", op, "] '", path, "' holds no text");
  return out;
}

}  // namespace data
}  // namespace cf
