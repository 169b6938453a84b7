#pragma once
// Labelled texts in one tab-separated file (the corpus format of cf-textcls and
// cf-approx --data-file; scripts/bible_corpus.sh writes one), plain or gzip:
//
//   label<TAB>text<NEWLINE>
//
// One text per line; the label is everything before the first tab (non-empty,
// spaces allowed), the text everything after it (non-empty; tabs inside it are
// kept). A line break inside a text is written as the two characters "\n", a
// backslash as "\\" (the reader turns them back; any other backslash is kept
// as it is). A trailing '\r' (CRLF files) is dropped; blank lines are skipped.
// Bytes are passed through unchanged (a tokenizer repairs invalid UTF-8).
#include <string>
#include <vector>

namespace cf {
namespace data {

struct LabelledText {
  std::string label;
  std::string text;
};

// IOError naming the file (and the line) when it cannot be read, a line has no
// tab, an empty label or an empty text, or the file holds no text.
std::vector<LabelledText> read_labelled_texts(const std::string& path);

}  // namespace data
}  // namespace cf
