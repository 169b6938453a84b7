#include "nn/data/tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io.h"
#include "core/json.h"

namespace cf {
namespace data {

namespace {

const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is invalid.
size_t utf8_valid_len(const std::string& s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;  // continuation byte, overlong lead (C0, C1) or F5-FF
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if (n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
  if (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
  return n;
}

bool is_space(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
// A word character: ASCII letter/digit/underscore or any non-ASCII code point.
bool is_word_cp(const std::string& cp) {
  unsigned char c = static_cast<unsigned char>(cp[0]);
  if (c >= 0x80) return true;
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

std::string lower_ascii(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return s;
}

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> cps = utf8_code_points(text);
  std::vector<std::string> out;
  std::string word;
  auto flush = [&] {
    if (!word.empty()) out.push_back(std::move(word));
    word.clear();
  };
  for (size_t i = 0; i < cps.size(); ++i) {
    const std::string& cp = cps[i];
    if (cp.size() == 1 && is_space(static_cast<unsigned char>(cp[0]))) {
      flush();
    } else if (is_word_cp(cp)) {
      word += cp;
    } else if (cp == "'" && !word.empty() && i + 1 < cps.size() && is_word_cp(cps[i + 1])) {
      word += cp;
    } else {
      flush();
      out.push_back(cp);
    }
  }
  flush();
  return out;
}

}  // namespace

const char* tokenizer_kind_name(TokenizerKind k) { return k == TokenizerKind::Char ? "char" : "word"; }

std::vector<std::string> utf8_code_points(const std::string& text) {
  std::vector<std::string> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    size_t n = utf8_valid_len(text, i);
    if (n == 0) {
      out.emplace_back(kReplacement);
      ++i;
    } else {
      out.push_back(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string utf8_repair(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const std::string& cp : utf8_code_points(text)) out += cp;
  return out;
}

const std::vector<std::string>& Tokenizer::special_tokens() {
  static const std::vector<std::string> s{"<pad>", "<unk>", "<bos>", "<eos>", "<cls>", "<sep>"};
  return s;
}

Tokenizer::Tokenizer(TokenizerKind kind, std::vector<std::string> tokens, bool lowercase)
    : kind_(kind), lowercase_(lowercase), tokens_(std::move(tokens)) {
  const auto& sp = special_tokens();
  CF_CHECK(tokens_.size() >= sp.size() && std::equal(sp.begin(), sp.end(), tokens_.begin()),
           ValueError, "[Tokenizer] the vocabulary must start with <pad> <unk> <bos> <eos> <cls> <sep>");
  index_.reserve(tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const std::string& t = tokens_[i];
    CF_CHECK(!t.empty(), ValueError, "[Tokenizer] token ", i, " is empty");
    CF_CHECK(utf8_valid_len(t, 0) != 0 && utf8_repair(t) == t, ValueError, "[Tokenizer] token ", i,
             " is not valid UTF-8");
    if (kind_ == TokenizerKind::Char && int64_t(i) >= kNumSpecial)
      CF_CHECK(utf8_valid_len(t, 0) == t.size(), ValueError, "[Tokenizer] token ", i, " '", t,
               "' of a char tokenizer is not a single code point");
    // A token encode can never produce (and decode would not give back as itself) is refused: a word
    // token holding a space re-encodes as two words, an upper-case one is unreachable when lowercasing.
    if (kind_ == TokenizerKind::Word && int64_t(i) >= kNumSpecial)
      CF_CHECK(split_words(t) == std::vector<std::string>{t}, ValueError, "[Tokenizer] token ", i, " '", t,
               "' of a word tokenizer is not one word (encode splits it)");
    if (lowercase_ && int64_t(i) >= kNumSpecial)
      CF_CHECK(lower_ascii(t) == t, ValueError, "[Tokenizer] token ", i, " '", t,
               "' has upper-case letters, which a lowercasing tokenizer never produces");
    CF_CHECK(index_.emplace(t, int64_t(i)).second, ValueError, "[Tokenizer] token ", i, " '", t,
             "' appears twice (first at ", index_[t], ")");
  }
}

Tokenizer Tokenizer::build(TokenizerKind kind, const std::vector<std::string>& corpus,
                           const TokenizerOptions& o) {
  CF_CHECK(o.min_count >= 1, ValueError, "[Tokenizer::build] min_count must be >= 1, got ",
           o.min_count);
  CF_CHECK(o.max_size == 0 || o.max_size >= kNumSpecial, ValueError,
           "[Tokenizer::build] max_size must be 0 (no limit) or >= ", kNumSpecial,
           " (the special tokens), got ", o.max_size);
  Tokenizer proto(kind, special_tokens(), o.lowercase);
  std::unordered_map<std::string, int64_t> counts;
  for (const std::string& text : corpus)
    for (std::string& piece : proto.split(text)) ++counts[piece];
  std::vector<std::pair<std::string, int64_t>> items;
  for (auto& kv : counts)
    if (kv.second >= o.min_count && !proto.contains(kv.first)) items.emplace_back(kv);
  // Count descending, ties byte-wise: a total order, so the result is deterministic.
  std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  std::vector<std::string> tokens = special_tokens();
  for (auto& it : items) {
    if (o.max_size > 0 && int64_t(tokens.size()) >= o.max_size) break;
    tokens.push_back(it.first);
  }
  return Tokenizer(kind, std::move(tokens), o.lowercase);
}

const std::string& Tokenizer::token(int64_t id) const {
  CF_CHECK(id >= 0 && id < vocab_size(), IndexError, "[Tokenizer::token] id ", id,
           " out of range for a vocabulary of ", vocab_size());
  return tokens_[size_t(id)];
}

int64_t Tokenizer::id(const std::string& token) const {
  auto it = index_.find(token);
  return it == index_.end() ? kUnk : it->second;
}

std::vector<std::string> Tokenizer::split(const std::string& text) const {
  std::string t = lowercase_ ? lower_ascii(text) : text;
  return kind_ == TokenizerKind::Char ? utf8_code_points(t) : split_words(t);
}

std::vector<int64_t> Tokenizer::encode(const std::string& text, bool add_bos, bool add_eos) const {
  std::vector<std::string> pieces = split(text);
  std::vector<int64_t> ids;
  ids.reserve(pieces.size() + 2);
  if (add_bos) ids.push_back(kBos);
  for (const std::string& p : pieces) ids.push_back(id(p));
  if (add_eos) ids.push_back(kEos);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  std::string out;
  bool first = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    int64_t id = ids[i];
    CF_CHECK(id >= 0 && id < vocab_size(), IndexError, "[Tokenizer::decode] id ", id,
             " at position ", i, " out of range for a vocabulary of ", vocab_size());
    if (skip_special && id < kNumSpecial && id != kUnk) continue;
    if (kind_ == TokenizerKind::Word && !first) out += ' ';
    out += tokens_[size_t(id)];
    first = false;
  }
  return out;
}

// ---------------------------------------------------------------- files

void Tokenizer::save(const std::string& path) const {
  nlohmann::json j;
  j["format"] = "cf-tokenizer";
  j["version"] = 1;
  j["kind"] = tokenizer_kind_name(kind_);
  j["lowercase"] = lowercase_;
  j["tokens"] = tokens_;
  io::write_file_atomic(path, j.dump(1) + "\n", "Tokenizer::save");
}

Tokenizer Tokenizer::load(const std::string& path) {
  const char* op = "Tokenizer::load";
  std::string text = io::read_file(path, op);
  nlohmann::json j;
  try {
    j = io::parse_json(text);
  } catch (const io::JsonStructureError& e) {
    throw IOError(str("[", op, "] '", path, "' is not valid: ", e.what()));
  } catch (const nlohmann::json::exception& e) {
    throw IOError(str("[", op, "] '", path, "' is not valid JSON: ", e.what()));
  }
  auto bad = [&](const std::string& why) {
    return IOError(str("[", op, "] '", path, "' ", why));
  };
  if (!j.is_object() || !j.contains("format") || !j["format"].is_string() ||
      j["format"].get<std::string>() != "cf-tokenizer")
    throw bad("is not a cf tokenizer file (no \"format\": \"cf-tokenizer\")");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int64_t>() != 1)
    throw bad(str("has unsupported version ", j.contains("version") ? j["version"].dump() : "(none)",
                  "; this build reads version 1"));
  if (!j.contains("kind") || !j["kind"].is_string())
    throw bad("has no \"kind\" string");
  std::string k = j["kind"].get<std::string>();
  TokenizerKind kind;
  if (k == "char")
    kind = TokenizerKind::Char;
  else if (k == "word")
    kind = TokenizerKind::Word;
  else
    throw bad(str("has unknown kind '", k, "' (expected char or word)"));
  if (!j.contains("lowercase") || !j["lowercase"].is_boolean())
    throw bad("has no \"lowercase\" boolean");
  if (!j.contains("tokens") || !j["tokens"].is_array()) throw bad("has no \"tokens\" array");
  std::vector<std::string> tokens;
  for (size_t i = 0; i < j["tokens"].size(); ++i) {
    const auto& t = j["tokens"][i];
    if (!t.is_string()) throw bad(str("is corrupt: token ", i, " is not a string"));
    tokens.push_back(t.get<std::string>());
  }
  try {
    return Tokenizer(kind, std::move(tokens), j["lowercase"].get<bool>());
  } catch (const ValueError& e) {
    throw bad(str("is corrupt: ", e.what()));
  }
}

Tokenizer Tokenizer::load(const std::string& path, TokenizerKind expected) {
  Tokenizer t = load(path);
  CF_CHECK(t.kind() == expected, IOError, "[Tokenizer::load] '", path, "' holds a ",
           tokenizer_kind_name(t.kind()), " tokenizer, expected ", tokenizer_kind_name(expected));
  return t;
}

}  // namespace data
}  // namespace cf
