// Data: char and word tokenizers, vocabulary rules, UTF-8 handling, save/load.
#include <filesystem>
#include <string>
#include <vector>

#include "nn/data/tokenizer.h"
#include "test_files.h"
#include "test_util.h"

using namespace cf;
using namespace cf::data;

TEST_SUITE("data") {

TEST_CASE("data: char tokenizer works on code points and round-trips") {
  std::vector<std::string> corpus{"héllo wörld", "hello ☃\n", "bb"};
  Tokenizer t = Tokenizer::build_char(corpus);
  CHECK(t.kind() == TokenizerKind::Char);
  // 13 distinct code points: l x5; space b h o x2; \n d e r w é ö ☃ x1.
  CHECK(t.vocab_size() == 6 + 13);
  // Specials first, then count desc, ties byte-wise.
  CHECK(t.token(0) == "<pad>");
  CHECK(t.token(5) == "<sep>");
  CHECK(t.tokens() == std::vector<std::string>{"<pad>", "<unk>", "<bos>", "<eos>", "<cls>", "<sep>",
                                               "l", " ", "b", "h", "o", "\n", "d", "e", "r", "w",
                                               "é", "ö", "☃"});
  CHECK(t.id("é") > 0);
  CHECK(t.token(t.id("☃")) == "☃");
  std::string s = "hé ☃\nbow";
  std::vector<int64_t> ids = t.encode(s);
  CHECK(ids.size() == 8);
  CHECK(t.decode(ids) == s);
  CHECK(t.encode("x") == std::vector<int64_t>{Tokenizer::kUnk});
  CHECK(t.decode(t.encode("xl")) == "<unk>l");
  std::vector<int64_t> framed = t.encode("lo", true, true);
  CHECK(framed.front() == Tokenizer::kBos);
  CHECK(framed.back() == Tokenizer::kEos);
  CHECK(t.decode(framed) == "lo");
  CHECK(t.decode(framed, false) == "<bos>lo<eos>");
  CHECK(t.decode({0, 0, t.id("l")}) == "l");
  CHECK_THROWS_MSG(t.decode({3, 400}), IndexError, "[Tokenizer::decode]", "id 400", "position 1");
  CHECK_THROWS_MSG(t.token(-1), IndexError, "[Tokenizer::token]", "id -1");
}

TEST_CASE("data: invalid UTF-8 is replaced by U+FFFD") {
  std::string bad = std::string("a\xff") + "b\xc3" + "\xe2\x82" + "c\xed\xa0\x80";
  std::vector<std::string> cps = utf8_code_points(bad);
  std::vector<std::string> want{"a", "\xEF\xBF\xBD", "b", "\xEF\xBF\xBD", "\xEF\xBF\xBD",
                                "\xEF\xBF\xBD", "c", "\xEF\xBF\xBD", "\xEF\xBF\xBD", "\xEF\xBF\xBD"};
  CHECK(cps == want);
  CHECK(utf8_repair("ok é") == "ok é");
  CHECK(utf8_repair("\xc0\xaf") == "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong '/'
  Tokenizer t = Tokenizer::build_char({bad});
  CHECK(t.contains("\xEF\xBF\xBD"));
  CHECK(t.decode(t.encode(bad)) == utf8_repair(bad));
}

TEST_CASE("data: word tokenizer splitting rule, lowercase, min_count and max_size") {
  Tokenizer t = Tokenizer::build_word({"Hello, world's end!  (it's 3.5)\tnaïve_x 'quoted'"});
  CHECK(t.split("Hello, world's end!  (it's 3.5)\tnaïve_x 'quoted'") ==
        std::vector<std::string>{"Hello", ",", "world's", "end", "!", "(", "it's", "3", ".", "5",
                                 ")", "naïve_x", "'", "quoted", "'"});
  std::vector<int64_t> ids = t.encode("end, Hello!");
  CHECK(t.decode(ids) == "end , Hello !");
  CHECK(t.encode(t.decode(ids)) == ids);
  CHECK(t.encode("hello") == std::vector<int64_t>{Tokenizer::kUnk});

  TokenizerOptions o;
  o.lowercase = true;
  o.min_count = 2;
  Tokenizer lw = Tokenizer::build_word({"The cat. the CAT sat", "a dog, the dog"}, o);
  // the:3 cat:2 dog:2 (ties lexicographic); '.', ',', sat, a appear once -> dropped.
  CHECK(lw.tokens() == std::vector<std::string>{"<pad>", "<unk>", "<bos>", "<eos>", "<cls>", "<sep>",
                                                 "the", "cat", "dog"});
  CHECK(lw.encode("THE Cat sat") == std::vector<int64_t>{6, 7, 1});
  o.min_count = 1;
  o.max_size = 8;
  Tokenizer capped = Tokenizer::build_word({"The cat. the CAT sat", "a dog, the dog"}, o);
  CHECK(capped.vocab_size() == 8);
  CHECK(capped.token(7) == "cat");
  o.max_size = 3;
  CHECK_THROWS_MSG(Tokenizer::build_word({"x"}, o), ValueError, "[Tokenizer::build]", "max_size", "3");
  o.max_size = 0;
  o.min_count = 0;
  CHECK_THROWS_MSG(Tokenizer::build_char({"x"}, o), ValueError, "[Tokenizer::build]", "min_count");
  CHECK_THROWS_MSG(Tokenizer(TokenizerKind::Word, {"a", "b"}), ValueError, "[Tokenizer]", "<pad>");
  std::vector<std::string> dup = Tokenizer::special_tokens();
  dup.push_back("x");
  dup.push_back("x");
  CHECK_THROWS_MSG(Tokenizer(TokenizerKind::Word, dup), ValueError, "[Tokenizer]", "token 7", "twice");
  std::vector<std::string> two = Tokenizer::special_tokens();
  two.push_back("ab");
  CHECK_THROWS_MSG(Tokenizer(TokenizerKind::Char, two), ValueError, "[Tokenizer]", "single code point");
}

TEST_CASE("data: tokenizer save and load") {
  cf::test::TempDir dir;
  Tokenizer c = Tokenizer::build_char({"Grüße, ☃!"}, {true, 1, 0});
  Tokenizer w = Tokenizer::build_word({"a b b c c c"});
  c.save(dir.file("c.json"));
  w.save(dir.file("w.json"));
  Tokenizer c2 = Tokenizer::load(dir.file("c.json"));
  CHECK(c2.kind() == TokenizerKind::Char);
  CHECK(c2.lowercase());
  CHECK(c2.tokens() == c.tokens());
  CHECK(c2.encode("grüSSe") == c.encode("grüSSe"));
  Tokenizer w2 = Tokenizer::load(dir.file("w.json"), TokenizerKind::Word);
  CHECK(w2.tokens() == w.tokens());
  CHECK_FALSE(w2.lowercase());
  // Overwrite in place; no temporary file is left behind.
  w.save(dir.file("c.json"));
  CHECK(Tokenizer::load(dir.file("c.json")).kind() == TokenizerKind::Word);
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.dir)) {
    (void)e;
    ++files;
  }
  CHECK(files == 2);

  std::string p = dir.file("bad.json");
  CHECK_THROWS_MSG(Tokenizer::load(dir.file("w.json"), TokenizerKind::Char), IOError,
                   "[Tokenizer::load]", "w.json", "holds a word tokenizer, expected char");
  CHECK_THROWS_MSG(Tokenizer::load(dir.file("missing.json")), IOError, "[Tokenizer::load]",
                   "missing.json", "cannot open");
  CHECK_THROWS_MSG(Tokenizer::load(dir.str()), IOError, "[Tokenizer::load]", "directory");
  cf::test::write_bytes(p, "{\"format\": \"cf-tokenizer\", \"version\": 1, \"kind\": \"wo");
  CHECK_THROWS_MSG(Tokenizer::load(p), IOError, "[Tokenizer::load]", "bad.json", "not valid JSON");
  cf::test::write_bytes(p, "{\"format\": \"cf-tokenizer\", \"version\": 1, \"version\": 2}");
  CHECK_THROWS_MSG(Tokenizer::load(p), IOError, "[Tokenizer::load]", "bad.json",
                   "key 'version' appears twice in the top-level object");
  cf::test::write_bytes(p, "{\"format\": \"cf-checkpoint\"}");
  CHECK_THROWS_MSG(Tokenizer::load(p), IOError, "bad.json", "not a cf tokenizer file");
  cf::test::write_bytes(p, "[1, 2]");
  CHECK_THROWS_MSG(Tokenizer::load(p), IOError, "bad.json", "not a cf tokenizer file");
  cf::test::write_bytes(p, "{\"format\": \"cf-tokenizer\", \"version\": 2}");
  CHECK_THROWS_MSG(Tokenizer::load(p), IOError, "bad.json", "version 2");
  cf::test::write_bytes(p, "{\"format\": \"cf-tokenizer\", \"version\": 1, \"kind\": \"bpe\", "
                           "\"lowercase\": false, \"tokens\": []}");
  CHECK_THROWS_MSG(Tokenizer::load(p), IOError, "bad.json", "unknown kind 'bpe'");
  cf::test::write_bytes(p, "{\"format\": \"cf-tokenizer\", \"version\": 1, \"kind\": \"word\", "
                           "\"lowercase\": false, \"tokens\": [\"<pad>\", 3]}");
  CHECK_THROWS_MSG(Tokenizer::load(p), IOError, "bad.json", "token 1 is not a string");
  cf::test::write_bytes(p, "{\"format\": \"cf-tokenizer\", \"version\": 1, \"kind\": \"word\", "
                           "\"lowercase\": false, \"tokens\": [\"<pad>\", \"<unk>\"]}");
  CHECK_THROWS_MSG(Tokenizer::load(p), IOError, "bad.json", "corrupt", "must start with");
  cf::test::write_bytes(p, "{\"format\": \"cf-tokenizer\", \"version\": 1, \"kind\": \"word\", "
                           "\"tokens\": []}");
  CHECK_THROWS_MSG(Tokenizer::load(p), IOError, "bad.json", "lowercase");
  // Tokens encode could never produce: a word holding a space (it re-encodes as two words), an upper-case
  // token of a lowercasing tokenizer.
  const std::string specials = "\"<pad>\", \"<unk>\", \"<bos>\", \"<eos>\", \"<cls>\", \"<sep>\"";
  cf::test::write_bytes(p, "{\"format\": \"cf-tokenizer\", \"version\": 1, \"kind\": \"word\", "
                           "\"lowercase\": false, \"tokens\": [" + specials + ", \"a b\"]}");
  CHECK_THROWS_MSG(Tokenizer::load(p), IOError, "bad.json", "token 6 'a b' of a word tokenizer is not one word");
  cf::test::write_bytes(p, "{\"format\": \"cf-tokenizer\", \"version\": 1, \"kind\": \"char\", "
                           "\"lowercase\": true, \"tokens\": [" + specials + ", \"a\", \"A\"]}");
  CHECK_THROWS_MSG(Tokenizer::load(p), IOError, "bad.json", "token 7 'A' has upper-case letters");
  CHECK_THROWS_MSG(Tokenizer(TokenizerKind::Word, {"<pad>", "<unk>", "<bos>", "<eos>", "<cls>", "<sep>", "x\ty"}),
                   ValueError, "[Tokenizer] token 6 'x\ty' of a word tokenizer is not one word");
  CHECK_THROWS_MSG(w.save(dir.file("no/such/dir/t.json")), IOError, "[Tokenizer::save]", "t.json");
}

}  // TEST_SUITE
