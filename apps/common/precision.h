#pragma once
// --precision fp32|bf16|fp16: the check of the value and the autocast dtype it
// names (train_run.h's training loop, cf-efficiency, cf-neural-cluster; cf-bench
// has its own BenchOptions), and the one rule for a part that has no 16-bit path yet.
#include <functional>
#include <optional>
#include <string>

#include "cf.h"
#include "common/cli.h"

namespace cf::apps {

// A UsageError (exit status 2) unless `p` is fp32, bf16 or fp16; the message is
// cf-bench's too.
inline void check_precision(const std::string& p) {
  if (p != "fp32" && p != "bf16" && p != "fp16")
    throw UsageError("--precision must be fp32, bf16 or fp16, got '" + p + "'");
}

// The autocast dtype of a checked --precision value: nullopt for fp32.
inline std::optional<cf::DType> precision_dtype(const std::string& p) {
  if (p == "bf16") return cf::kBFloat16;
  if (p == "fp16") return cf::kFloat16;
  return std::nullopt;
}

// Runs f. Under a 16-bit precision (`low` true), a part without a 16-bit path
// yet (the clustered-attention kernels, K-Means: docs/design-notes.md, "Not done
// yet (issue 26)") throws cf::DTypeError; its message is returned, for the
// caller to report the measurement as skipped while the other variants still
// run. Returns nullopt when f ran. In fp32 a DTypeError is a failure and
// propagates.
inline std::optional<std::string> skip_without_16bit(bool low, const std::function<void()>& f) {
  try {
    f();
  } catch (const cf::DTypeError& e) {
    if (!low) throw;
    return std::string(e.what());
  }
  return std::nullopt;
}

}  // namespace cf::apps
