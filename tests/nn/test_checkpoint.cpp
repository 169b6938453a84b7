// Training checkpoints: exact round trip of model/optimizer state, step,
// generator states (full u64 range) and extras; refusal of foreign or newer files.
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "core/serialization.h"
#include "nn/checkpoint.h"
#include "test_files.h"
#include "test_util.h"

using namespace cf;
using cf::test::read_bytes;
using cf::test::TempDir;
namespace fs = std::filesystem;

namespace {
}  // namespace

TEST_CASE("checkpoint round trip") {
  TempDir tmp;
  std::string path = tmp.file("run.ckpt");
  Generator g(7);
  (void)rand({5}, kFloat32, g);  // advance the offset

  nn::TrainingCheckpoint ck;
  Tensor w = test::t32({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  ck.model = {{"fc.weight", transpose(w, 0, 1)}, {"fc.bias", Tensor::zeros({3})},
              {"bn.num_batches", Tensor::scalar(12, kInt64)}};
  ck.optimizer = {{"state.0.exp_avg", test::t64({0.25, -0.5}, {2})},
                  {"state.0.step", Tensor::scalar(3, kInt64)},
                  {"mask", Tensor::from_vector(std::vector<bool>{true, false}, {2})}};
  ck.step = (int64_t(1) << 40) + 3;  // beyond int32: the metadata keeps every digit
  const uint64_t big = std::numeric_limits<uint64_t>::max();
  ck.generators = {{"default", nn::GeneratorState::of(g)},
                   {"data", {big, big - 1}},
                   {"dropout", {0, 0}}};
  ck.extra = {{"config", "{\"lr\": 0.1}"}, {"epoch", "4"}};
  nn::save_checkpoint(path, ck);

  nn::TrainingCheckpoint r = nn::load_checkpoint(path);
  REQUIRE(r.model.size() == 3);
  REQUIRE(r.optimizer.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(r.model[i].first == ck.model[i].first);
    test::check_close(r.model[i].second, ck.model[i].second, 0);
    CHECK(r.optimizer[i].first == ck.optimizer[i].first);
    CHECK(r.optimizer[i].second.dtype() == ck.optimizer[i].second.dtype());
    test::check_close(r.optimizer[i].second, ck.optimizer[i].second, 0);
  }
  CHECK(r.step == ck.step);
  REQUIRE(r.generators.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(r.generators[i].first == ck.generators[i].first);
    CHECK(r.generators[i].second == ck.generators[i].second);
  }
  CHECK(r.generators[1].second.seed == big);
  CHECK(r.extra == ck.extra);

  // Restoring the generator reproduces the stream exactly.
  Generator g2(0);
  r.generators[0].second.restore(g2);
  CHECK(g2.seed() == 7);
  CHECK(g2.offset() == 5);
  test::check_close(rand({4}, kFloat32, g2), rand({4}, kFloat32, g), 0);

  // The file is plain safetensors with prefixed names.
  SafetensorsFile f = load_safetensors(path);
  CHECK(f.find("model.fc.weight") != nullptr);
  CHECK(f.find("optim.state.0.step") != nullptr);
  CHECK(f.metadata.at("cf.format") == "cf.checkpoint");
  CHECK(f.metadata.at("rng.1.seed") == "18446744073709551615");
}

TEST_CASE("checkpoint: empty checkpoint and overwrite") {
  TempDir tmp;
  std::string path = tmp.file("e.ckpt");
  nn::save_checkpoint(path, {});
  nn::TrainingCheckpoint r = nn::load_checkpoint(path);
  CHECK(r.model.empty());
  CHECK(r.optimizer.empty());
  CHECK(r.step == 0);
  CHECK(r.generators.empty());
  nn::TrainingCheckpoint ck;
  ck.step = std::numeric_limits<int64_t>::max();
  nn::save_checkpoint(path, ck);
  CHECK(nn::load_checkpoint(path).step == std::numeric_limits<int64_t>::max());
}

TEST_CASE("checkpoint: bad input is refused before writing") {
  TempDir tmp;
  std::string path = tmp.file("keep.ckpt");
  nn::TrainingCheckpoint good;
  good.step = 3;
  nn::save_checkpoint(path, good);
  const std::string before = read_bytes(path);

  nn::TrainingCheckpoint dup;
  dup.model = {{"w", Tensor::ones({1})}, {"w", Tensor::ones({1})}};
  CHECK_THROWS_MSG(nn::save_checkpoint(path, dup), ValueError, "[save_checkpoint]", "keep.ckpt",
                   "duplicate name 'w' in the model state");
  nn::TrainingCheckpoint gpu;
  gpu.optimizer = {{"m", test::fake_cuda({2})}};
  CHECK_THROWS_MSG(nn::save_checkpoint(path, gpu), DeviceError, "keep.ckpt", "optim.m", "cuda:0");
  nn::TrainingCheckpoint gens;
  gens.generators = {{"a", {}}, {"a", {}}};
  CHECK_THROWS_MSG(nn::save_checkpoint(path, gens), ValueError, "duplicate generator name 'a'");
  nn::TrainingCheckpoint negative;
  negative.step = -1;
  CHECK_THROWS_MSG(nn::save_checkpoint(path, negative), ValueError, "[save_checkpoint]", "keep.ckpt",
                   "step must be >= 0, got -1");
  // The same name in model and optimizer is fine: the prefixes keep them apart.
  nn::TrainingCheckpoint both;
  both.model = {{"w", Tensor::ones({1})}};
  both.optimizer = {{"w", Tensor::zeros({1})}};
  CHECK(read_bytes(path) == before);
  nn::save_checkpoint(path, both);
  CHECK(nn::load_checkpoint(path).optimizer.at(0).second.item<float>() == 0.0f);
  CHECK(std::distance(fs::directory_iterator(tmp.dir), fs::directory_iterator()) == 1);
}

TEST_CASE("checkpoint: foreign, newer and damaged files") {
  TempDir tmp;
  std::string path = tmp.file("x.safetensors");
  CHECK_THROWS_MSG(nn::load_checkpoint(tmp.file("absent.ckpt")), IOError, "absent.ckpt", "no such file");

  save_safetensors(path, {{"weight", Tensor::ones({2})}});
  CHECK_THROWS_MSG(nn::load_checkpoint(path), IOError, "[load_checkpoint]", "x.safetensors",
                   "not a cf training checkpoint", "missing");
  save_safetensors(path, {}, {{"cf.format", "something.else"}});
  CHECK_THROWS_MSG(nn::load_checkpoint(path), IOError, "not a cf training checkpoint",
                   "'something.else'");

  std::map<std::string, std::string> meta = {{"cf.format", "cf.checkpoint"},
                                             {"cf.format_version", "2"},
                                             {"step", "0"},
                                             {"rng.count", "0"}};
  save_safetensors(path, {}, meta);
  CHECK_THROWS_MSG(nn::load_checkpoint(path), IOError, "[load_checkpoint]", "x.safetensors",
                   "format version 2 is newer", "(up to 1)");
  meta["cf.format_version"] = "1";
  meta["step"] = "12x";
  save_safetensors(path, {}, meta);
  CHECK_THROWS_MSG(nn::load_checkpoint(path), IOError, "bad step '12x'");
  meta["step"] = "9223372036854775808";  // int64 max + 1
  save_safetensors(path, {}, meta);
  CHECK_THROWS_MSG(nn::load_checkpoint(path), IOError, "bad step");
  meta["step"] = "-4";  // save_checkpoint refuses it; loaded, it was taken as given
  save_safetensors(path, {}, meta);
  CHECK_THROWS_MSG(nn::load_checkpoint(path), IOError, "bad step '-4'");
  meta["step"] = "5";
  meta["rng.count"] = "1";
  save_safetensors(path, {}, meta);
  CHECK_THROWS_MSG(nn::load_checkpoint(path), IOError, "metadata has no 'rng.0.");
  meta["rng.0.name"] = "g";
  meta["rng.0.seed"] = "18446744073709551616";  // 2^64
  meta["rng.0.offset"] = "0";
  save_safetensors(path, {}, meta);
  CHECK_THROWS_MSG(nn::load_checkpoint(path), IOError, "bad 'rng.0.seed'");
  meta["rng.0.seed"] = "1";
  save_safetensors(path, {{"other.x", Tensor::ones({1})}}, meta);
  CHECK_THROWS_MSG(nn::load_checkpoint(path), IOError, "tensor 'other.x' is neither");

  // Truncated checkpoint: the safetensors reader's message, naming the file.
  nn::TrainingCheckpoint ck;
  ck.model = {{"w", Tensor::ones({16})}};
  nn::save_checkpoint(path, ck);
  std::string bytes = read_bytes(path);
  std::ofstream(path, std::ios::binary) << bytes.substr(0, bytes.size() - 10);
  CHECK_THROWS_MSG(nn::load_checkpoint(path), IOError, "[load_safetensors]", "x.safetensors",
                   "run past the data buffer");
}
