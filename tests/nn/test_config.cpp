// Checked JSON configuration: typed reads, nested paths, unknown keys, and
// load_json_file's messages.
#include <filesystem>
#include <fstream>
#include <random>

#include "nn/config.h"
#include "test_util.h"

using namespace cf;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {
std::string temp_json(const std::string& text) {
  std::random_device rd;
  fs::path p = fs::temp_directory_path() /
               ("cf_config_test_" + std::to_string(rd()) + "_" + std::to_string(rd()) + ".json");
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}
}  // namespace

TEST_CASE("config: typed reads, defaults and nesting") {
  json j = json::parse(R"({
    "steps": 100, "lr": 0.5, "lr_int": 2, "name": "run", "verbose": true, "big": 1e6,
    "seed": 18446744073709551615, "dims": [1, 2, 3], "weights": [0.5, 1], "tags": ["a", "b"],
    "nothing": null,
    "model": {"d_model": 64, "attention": {"type": "flash", "heads": 4}}
  })");
  nn::Config cfg(j);
  CHECK(cfg.has("steps"));
  CHECK_FALSE(cfg.has("missing"));
  CHECK_FALSE(cfg.has("nothing"));
  CHECK(cfg.get<int64_t>("steps", 1) == 100);
  CHECK(cfg.get<int>("missing", 7) == 7);
  CHECK(cfg.get<double>("lr", 0.0) == 0.5);
  CHECK(cfg.get<double>("lr_int", 0.0) == 2.0);
  CHECK(cfg.get<float>("lr", 0.f) == 0.5f);
  CHECK(cfg.require<std::string>("name") == "run");
  CHECK(cfg.get("missing_s", "dflt") == "dflt");
  CHECK(cfg.get<bool>("verbose", false));
  CHECK(cfg.get<int64_t>("big", 0) == 1000000);
  CHECK(cfg.require<uint64_t>("seed") == 18446744073709551615ull);
  CHECK(cfg.get<std::vector<int64_t>>("dims", {}) == std::vector<int64_t>{1, 2, 3});
  CHECK(cfg.get<std::vector<double>>("weights", {}) == std::vector<double>{0.5, 1.0});
  CHECK(cfg.get<std::vector<std::string>>("tags", {}) == std::vector<std::string>{"a", "b"});
  CHECK(cfg.get<int>("nothing", 3) == 3);  // null means "use the default"
  nn::Config model = cfg.child("model");
  CHECK(model.name() == "model");
  CHECK(model.require<int>("d_model") == 64);
  nn::Config att = model.child("attention");
  CHECK(att.path_of("type") == "model.attention.type");
  CHECK(att.get<std::string>("type", "") == "flash");
  CHECK(att.get<int>("heads", 1) == 4);
  nn::Config opt = cfg.optional_child("optim");
  CHECK(opt.get<double>("lr", 0.1) == 0.1);
  CHECK(opt.keys().empty());
  CHECK(model.keys() == std::vector<std::string>{"attention", "d_model"});
  cfg.finish();  // everything was read
}

TEST_CASE("config: unknown keys are listed with their paths") {
  json j = json::parse(R"({"steps": 1, "stpes": 2, "model": {"d_model": 4, "d_modle": 5,
                           "attention": {"type": "x", "typo": 1}}, "extra": {"a": 1}})");
  nn::Config cfg(j, "", "run.json");
  (void)cfg.get<int>("steps", 0);
  nn::Config model = cfg.child("model");
  (void)model.get<int>("d_model", 0);
  nn::Config att = model.child("attention");
  (void)att.get<std::string>("type", "");
  CHECK_THROWS_MSG(att.finish(), ValueError, "[config] unknown key 'model.attention.typo'");
  CHECK_THROWS_MSG(model.finish(), ValueError, "unknown key 'model.d_modle'",
                   "unknown key 'model.attention.typo'");
  bool thrown = false;
  try {
    cfg.finish();
  } catch (const ValueError& e) {
    thrown = true;
    CHECK(std::string(e.what()) ==
          "[config] unknown key 'extra'; unknown key 'model.attention.typo'; unknown key "
          "'model.d_modle'; unknown key 'stpes' (in run.json)");
  }
  CHECK(thrown);
  // has() does not count as reading.
  nn::Config c2(json::parse(R"({"a": 1})"));
  CHECK(c2.has("a"));
  CHECK_THROWS_MSG(c2.finish(), ValueError, "unknown key 'a'");
}

TEST_CASE("config: wrong types name the key, the expected type and the value") {
  json j = json::parse(R"({"s": "abc", "f": 2.5, "neg": -3, "huge": 1e30, "b": 1, "n": 3,
    "arr": [1, "x"], "obj": {"k": 1}, "i64big": 9223372036854775808, "intbig": 3000000000,
    "fbig": 1e300})");
  nn::Config cfg(j, "train", "cfg.json");
  CHECK_THROWS_MSG(cfg.get<int64_t>("s", 0), ValueError, "[config] key 'train.s' (in cfg.json)",
                   "expected an integer (int64), got string \"abc\"");
  CHECK_THROWS_MSG(cfg.get<int>("f", 0), ValueError, "key 'train.f'", "expected an integer (int)",
                   "got float 2.5");
  CHECK_THROWS_MSG(cfg.get<uint64_t>("neg", 0), ValueError, "expected a non-negative integer (uint64)",
                   "got integer -3", "negative");
  CHECK_THROWS_MSG(cfg.get<int64_t>("huge", 0), ValueError, "out of range");
  CHECK_THROWS_MSG(cfg.get<int64_t>("i64big", 0), ValueError, "out of range");
  CHECK_THROWS_MSG(cfg.get<int>("intbig", 0), ValueError, "expected an integer (int)", "out of range");
  CHECK(cfg.get<uint64_t>("i64big", 0) == 9223372036854775808ull);
  CHECK_THROWS_MSG(cfg.get<float>("fbig", 0.f), ValueError, "float32", "out of range");
  CHECK_THROWS_MSG(cfg.get<bool>("b", false), ValueError, "expected a boolean, got integer 1");
  CHECK_THROWS_MSG(cfg.get<std::string>("n", ""), ValueError, "expected a string, got integer 3");
  CHECK_THROWS_MSG(cfg.get<double>("s", 0.0), ValueError, "expected a number, got string");
  CHECK_THROWS_MSG(cfg.get<std::vector<int64_t>>("arr", {}), ValueError, "key 'train.arr'",
                   "element [1]", "got string \"x\"");
  CHECK_THROWS_MSG(cfg.get<std::vector<std::string>>("n", {}), ValueError,
                   "expected an array of strings, got integer 3");
  CHECK_THROWS_MSG(cfg.get<int>("obj", 0), ValueError, "got object {\"k\":1}");
  CHECK_THROWS_MSG(cfg.require<int>("absent"), ValueError, "[config] missing required key 'train.absent'");
  CHECK_THROWS_MSG(cfg.child("absent"), ValueError, "missing required key 'train.absent'");
  // a key a few edits away is named with it (the unknown-key check never runs after this error)
  nn::Config typo(nlohmann::json{{"clusterz", 2}, {"dropout", 0.1}}, "attention");
  CHECK_THROWS_MSG(typo.require<int>("clusters"), ValueError,
                   "[config] missing required key 'attention.clusters' (given: 'attention.clusterz', misspelt?)");
  CHECK_THROWS_MSG(cfg.child("n"), ValueError, "key 'train.n'", "expected an object, got integer 3");
  CHECK_THROWS_MSG(cfg.optional_child("s"), ValueError, "expected an object");
  CHECK_THROWS_MSG(nn::Config(json::array()), ValueError, "[config]", "must be a JSON object");
}

TEST_CASE("load_json_file: comments, missing file, parse errors with line and column") {
  std::string ok = temp_json("// settings\n{\"a\": 1, /* inline */ \"b\": [1, 2]}\n");
  json j = nn::load_json_file(ok);
  CHECK(j["a"] == 1);
  nn::Config cfg = nn::Config::from_file(ok);
  CHECK(cfg.get<int>("a", 0) == 1);
  CHECK_THROWS_MSG(cfg.finish(), ValueError, "unknown key 'b'", ok.c_str());
  fs::remove(ok);

  CHECK_THROWS_MSG(nn::load_json_file("/nonexistent/dir/cfg.json"), IOError, "[load_json_file]",
                   "/nonexistent/dir/cfg.json", "cannot open");
  std::string bad = temp_json("{\n  \"a\": 1,\n  \"b\": tru\n}\n");
  CHECK_THROWS_MSG(nn::load_json_file(bad), IOError, "[load_json_file]", bad.c_str(), "line 3",
                   "column", "byte");
  fs::remove(bad);
  std::string trunc = temp_json("{\"a\": [1, 2");
  CHECK_THROWS_MSG(nn::load_json_file(trunc), IOError, "line 1", "parse error");
  fs::remove(trunc);
}

TEST_CASE("load_json_file: a NUL byte before more text is an error, trailing NUL padding is not") {
  // nlohmann's lexer reads NUL as the end of the input: {"k": 3}\0{"k": 9} parsed as {"k": 3}, the rest unread.
  std::string p = temp_json(std::string("{\"k\": 3}\0{\"k\": 9}", 17));
  CHECK_THROWS_MSG(nn::load_json_file(p), IOError, "[load_json_file]", "(byte 9)",
                   "a NUL byte ends the JSON text before the rest of it");
  fs::remove(p);
  p = temp_json(std::string("{\"k\": 3}\0\0 \n", 12));
  CHECK(nn::load_json_file(p).at("k").get<int>() == 3);
  fs::remove(p);
}

TEST_CASE("load_json_file: nesting deeper than 256 levels is an error naming the file (it overflowed the stack)") {
  auto nested = [](int depth, const char* open, const char* close) {
    std::string t;
    for (int i = 0; i < depth; ++i) t += open;
    t += "1";
    for (int i = 0; i < depth; ++i) t += close;
    return t;
  };
  std::string p = temp_json(nested(256, "[", "]"));
  CHECK(nn::load_json_file(p).is_array());
  fs::remove(p);
  p = temp_json(nested(100000, "[", "]"));
  CHECK_THROWS_MSG(nn::load_json_file(p), IOError, "[load_json_file]", p.c_str(),
                   "arrays and objects nest deeper than 256 levels");
  fs::remove(p);
  p = temp_json(nested(300, "{\"a\": ", "}"));
  CHECK_THROWS_MSG(nn::load_json_file(p), IOError, "nest deeper than 256 levels");
  fs::remove(p);
}

TEST_CASE("load_json_file: a key given twice in one object is an error, naming the key and the object") {
  // nlohmann keeps the last of two equal keys without a word: {"lr": 0.1, "lr": 1} trained with 1.
  std::string p = temp_json("{\"lr\": 0.1, \"lr\": 1}");
  CHECK_THROWS_MSG(nn::load_json_file(p), IOError, "[load_json_file]", p.c_str(),
                   "key 'lr' appears twice in the top-level object");
  fs::remove(p);
  p = temp_json("{\"model\": {\"layers\": [{\"d\": 1}, {\"d\": 2, \"h\": 1, \"d\": 3}]}}");
  CHECK_THROWS_MSG(nn::load_json_file(p), IOError, "key 'd' appears twice in object 'model.layers[1]'");
  fs::remove(p);
  p = temp_json("[[1, {\"a\": [2, {\"b\": 1}]}], {\"x\": {}, \"x\": 2}]");
  CHECK_THROWS_MSG(nn::load_json_file(p), IOError, "key 'x' appears twice in object '[1]'");
  fs::remove(p);

  // The same key in sibling or nested objects is fine, and values are kept as given.
  p = temp_json("{\"a\": {\"x\": 1, \"a\": {\"x\": 2}}, \"b\": [{\"x\": 3}, {\"x\": 4}], \"x\": 5}");
  json j = nn::load_json_file(p);
  CHECK(j["a"]["x"] == 1);
  CHECK(j["a"]["a"]["x"] == 2);
  CHECK(j["b"][1]["x"] == 4);
  CHECK(j["x"] == 5);
  fs::remove(p);
}
