#include "nn/checkpoint.h"

#include <cmath>
#include <limits>
#include <set>

#include "core/half.h"
#include "core/serialization.h"

namespace cf {
namespace nn {
namespace {

const char* kFormatKey = "cf.format";
const char* kFormatValue = "cf.checkpoint";
const char* kVersionKey = "cf.format_version";

// Strict decimal parsing: digits only (and a leading '-' for signed), no overflow.
bool parse_u64(const std::string& s, uint64_t& out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    uint64_t d = uint64_t(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  out = v;
  return true;
}

bool parse_i64(const std::string& s, int64_t& out) {
  bool neg = !s.empty() && s[0] == '-';
  uint64_t mag = 0;
  if (!parse_u64(neg ? s.substr(1) : s, mag)) return false;
  const uint64_t limit = neg ? uint64_t(std::numeric_limits<int64_t>::max()) + 1
                             : uint64_t(std::numeric_limits<int64_t>::max());
  if (mag > limit) return false;
  out = neg ? int64_t(0 - mag) : int64_t(mag);  // 0 - mag wraps to the right value
  return true;
}

void add_prefixed(std::vector<std::pair<std::string, Tensor>>& out, const StateDict& dict,
                  const std::string& prefix, const std::string& path, const char* what) {
  std::set<std::string> seen;
  for (const auto& e : dict) {
    CF_CHECK(!e.first.empty(), ValueError, "[save_checkpoint] ", path, ": an entry of the ", what,
             " state has an empty name");
    CF_CHECK(seen.insert(e.first).second, ValueError, "[save_checkpoint] ", path,
             ": duplicate name '", e.first, "' in the ", what, " state");
    out.emplace_back(prefix + e.first, e.second);
  }
}

template <typename T>
int64_t count_nan_of(const Tensor& t) {
  int64_t bad = 0;
  for (const T& v : t.to_vector<T>()) bad += std::isnan(float(v)) ? 1 : 0;
  return bad;
}

// NaN marks a diverged run: such weights give chance-level results, or a later "non-finite
// loss" that does not name the file. Infinities are legitimate (a buffer of -inf mask
// entries), so they are kept. Every float dtype is checked (16-bit ones were not).
// (Core only, no autograd ops: the fuzz build links the readers alone.)
int64_t count_nan(const Tensor& t) {
  switch (t.dtype()) {
    case kFloat32: return count_nan_of<float>(t);
    case kFloat64: {
      int64_t bad = 0;
      for (double v : t.to_vector<double>()) bad += std::isnan(v) ? 1 : 0;
      return bad;
    }
    case kBFloat16: return count_nan_of<BFloat16>(t);
    case kFloat16: return count_nan_of<Half>(t);
    default: return 0;
  }
}

}  // namespace

void save_checkpoint(const std::string& path, const TrainingCheckpoint& ckpt) {
  CF_CHECK(ckpt.step >= 0, ValueError, "[save_checkpoint] ", path, ": step must be >= 0, got ", ckpt.step);
  std::vector<std::pair<std::string, Tensor>> tensors;
  tensors.reserve(ckpt.model.size() + ckpt.optimizer.size());
  add_prefixed(tensors, ckpt.model, "model.", path, "model");
  add_prefixed(tensors, ckpt.optimizer, "optim.", path, "optimizer");
  add_prefixed(tensors, ckpt.scaler, "scaler.", path, "scaler");
  // Refused before anything is written, so the last good checkpoint at `path` stays (a diverged
  // run used to replace it with a file that load_checkpoint then refused).
  for (const auto& [n, t] : tensors) {
    const int64_t bad = t.defined() && t.device().is_cpu() ? count_nan(t) : 0;
    CF_CHECK(bad == 0, ValueError, "[save_checkpoint] ", path, ": tensor '", n, "' ", t.describe(), " holds ", bad,
             " NaN value(s): the run diverged; nothing was written (a file already at that path is unchanged)");
  }

  std::map<std::string, std::string> meta;
  meta[kFormatKey] = kFormatValue;
  meta[kVersionKey] = std::to_string(kCheckpointFormatVersion);
  meta["step"] = std::to_string(ckpt.step);
  meta["rng.count"] = std::to_string(ckpt.generators.size());
  std::set<std::string> gen_names;
  for (size_t i = 0; i < ckpt.generators.size(); ++i) {
    const auto& g = ckpt.generators[i];
    CF_CHECK(!g.first.empty(), ValueError, "[save_checkpoint] ", path, ": generator #", i,
             " has an empty name");
    CF_CHECK(gen_names.insert(g.first).second, ValueError, "[save_checkpoint] ", path,
             ": duplicate generator name '", g.first, "'");
    std::string k = "rng." + std::to_string(i) + ".";
    meta[k + "name"] = g.first;
    meta[k + "seed"] = std::to_string(g.second.seed);
    meta[k + "offset"] = std::to_string(g.second.offset);
  }
  for (const auto& kv : ckpt.extra) meta["extra." + kv.first] = kv.second;

  save_safetensors(path, tensors, meta);
}

TrainingCheckpoint load_checkpoint(const std::string& path) {
  SafetensorsFile f = load_safetensors(path);
  auto fail = [&](const auto&... a) { return IOError(str("[load_checkpoint] ", path, ": ", a...)); };
  const auto& meta = f.metadata;
  auto get = [&](const std::string& key) -> const std::string& {
    auto it = meta.find(key);
    if (it == meta.end()) throw fail("metadata has no '", key, "'");
    return it->second;
  };

  auto fmt = meta.find(kFormatKey);
  if (fmt == meta.end() || fmt->second != kFormatValue)
    throw fail("not a cf training checkpoint (metadata '", kFormatKey, "' is ",
               fmt == meta.end() ? std::string("missing") : "'" + fmt->second + "'",
               ", expected '", kFormatValue, "')");
  uint64_t version = 0;
  if (!parse_u64(get(kVersionKey), version) || version == 0)
    throw fail("bad format version '", get(kVersionKey), "'");
  if (version > uint64_t(kCheckpointFormatVersion))
    throw fail("checkpoint format version ", version,
               " is newer than this build of cf reads (up to ", kCheckpointFormatVersion, ")");

  TrainingCheckpoint ck;
  // (a negative step, which save_checkpoint refuses, loaded as given)
  if (!parse_i64(get("step"), ck.step) || ck.step < 0) throw fail("bad step '", get("step"), "'");
  uint64_t count = 0;
  if (!parse_u64(get("rng.count"), count) || count > meta.size())
    throw fail("bad generator count '", get("rng.count"), "'");
  for (uint64_t i = 0; i < count; ++i) {
    std::string k = "rng." + std::to_string(i) + ".";
    GeneratorState s;
    if (!parse_u64(get(k + "seed"), s.seed)) throw fail("bad '", k, "seed' '", get(k + "seed"), "'");
    if (!parse_u64(get(k + "offset"), s.offset))
      throw fail("bad '", k, "offset' '", get(k + "offset"), "'");
    ck.generators.emplace_back(get(k + "name"), s);
  }
  const std::string extra = "extra.";
  for (const auto& kv : meta)
    if (kv.first.compare(0, extra.size(), extra) == 0)
      ck.extra[kv.first.substr(extra.size())] = kv.second;

  for (auto& e : f.tensors) {
    const std::string& n = e.first;
    // A diverged run's weights: resuming or evaluating them gives chance-level
    // results or a later "non-finite loss" that does not name this file.
    const int64_t bad = count_nan(e.second);
    if (bad > 0)
      throw fail("tensor '", n, "' ", e.second.describe(), " holds ", bad,
                 " NaN value(s): the run that saved it diverged");
    if (n.compare(0, 6, "model.") == 0 && n.size() > 6)
      ck.model.emplace_back(n.substr(6), std::move(e.second));
    else if (n.compare(0, 6, "optim.") == 0 && n.size() > 6)
      ck.optimizer.emplace_back(n.substr(6), std::move(e.second));
    else if (n.compare(0, 7, "scaler.") == 0 && n.size() > 7)
      ck.scaler.emplace_back(n.substr(7), std::move(e.second));
    else
      throw fail("tensor '", n, "' is neither 'model.*', 'optim.*' nor 'scaler.*'");
  }
  return ck;
}

}  // namespace nn
}  // namespace cf
