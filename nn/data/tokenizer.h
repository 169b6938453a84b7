#pragma once
// Char-level and word-level tokenizers with a vocabulary built from a corpus.
//
// Text handling (both kinds):
//   - Text is UTF-8. Invalid UTF-8 (a stray continuation byte, a truncated or
//     overlong sequence, a surrogate, a value above U+10FFFF) is not an error: each
//     offending byte is replaced by U+FFFD, so every token is valid UTF-8.
//   - lowercase = true lowercases ASCII letters only (A-Z); other letters are kept.
// Char tokenizer: one token per Unicode code point, whitespace and newlines included,
//   so decode(encode(s)) == s whenever every code point of s is in the vocabulary.
// Word tokenizer: the text is split on ASCII whitespace; within each piece a word is
//   a maximal run of ASCII letters, digits, '_' and non-ASCII code points, where an
//   apostrophe between two such characters stays inside the word ("don't", "o'clock");
//   every other character (ASCII punctuation and symbols) is a token by itself.
//   "Hello, world's end!" -> [Hello] [,] [world's] [end] [!]. decode() joins tokens
//   with single spaces, so spacing is not restored (encode(decode(ids)) == ids).
//
// Vocabulary: ids 0-5 are the special tokens <pad> <unk> <bos> <eos> <cls> <sep>
// (never produced from text); then every token seen at least min_count times, by
// count descending, ties by byte-wise lexicographic order; max_size (0 = no limit)
// caps the whole vocabulary, specials included. Unknown tokens encode to <unk>.
//
// Files: save() writes JSON {"format": "cf-tokenizer", "version": 1, "kind":
// "char"|"word", "lowercase": bool, "tokens": [...]} atomically (a temporary file in
// the same folder, then rename). load() checks all of it and names the file in any
// error (IOError).
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace cf {
namespace data {

enum class TokenizerKind { Char, Word };
const char* tokenizer_kind_name(TokenizerKind k);

struct TokenizerOptions {
  bool lowercase = false;
  int64_t min_count = 1;
  int64_t max_size = 0;  // 0 = unlimited; otherwise >= 6 (the special tokens)
};

class Tokenizer {
 public:
  static constexpr int64_t kPad = 0, kUnk = 1, kBos = 2, kEos = 3, kCls = 4, kSep = 5;
  static constexpr int64_t kNumSpecial = 6;
  // {"<pad>", "<unk>", "<bos>", "<eos>", "<cls>", "<sep>"}
  static const std::vector<std::string>& special_tokens();

  static Tokenizer build(TokenizerKind kind, const std::vector<std::string>& corpus,
                         const TokenizerOptions& options = {});
  static Tokenizer build_char(const std::vector<std::string>& corpus,
                              const TokenizerOptions& options = {}) {
    return build(TokenizerKind::Char, corpus, options);
  }
  static Tokenizer build_word(const std::vector<std::string>& corpus,
                              const TokenizerOptions& options = {}) {
    return build(TokenizerKind::Word, corpus, options);
  }
  // From a token list that starts with the six special tokens (ValueError otherwise).
  Tokenizer(TokenizerKind kind, std::vector<std::string> tokens, bool lowercase = false);

  static Tokenizer load(const std::string& path);
  // Also checks the kind: a word tokenizer file loaded as Char is an IOError.
  static Tokenizer load(const std::string& path, TokenizerKind expected);
  void save(const std::string& path) const;

  TokenizerKind kind() const { return kind_; }
  bool lowercase() const { return lowercase_; }
  int64_t vocab_size() const { return int64_t(tokens_.size()); }
  const std::vector<std::string>& tokens() const { return tokens_; }
  const std::string& token(int64_t id) const;  // IndexError when out of range
  int64_t id(const std::string& token) const;  // kUnk when absent
  bool contains(const std::string& token) const { return index_.count(token) != 0; }

  // The pieces encode() looks up (after UTF-8 repair and optional lowercasing).
  std::vector<std::string> split(const std::string& text) const;
  std::vector<int64_t> encode(const std::string& text, bool add_bos = false,
                              bool add_eos = false) const;
  // skip_special drops <pad> <bos> <eos> <cls> <sep> (<unk> is kept, as "<unk>").
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = true) const;

 private:
  TokenizerKind kind_;
  bool lowercase_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int64_t> index_;
};

// UTF-8 helpers (invalid bytes become U+FFFD, as described above).
std::vector<std::string> utf8_code_points(const std::string& text);
std::string utf8_repair(const std::string& text);

}  // namespace data
}  // namespace cf
