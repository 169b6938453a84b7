// CPU instruction tiers (kernels/common/cpu_isa.h): detection and the setting.
#include "kernels/common/cpu_isa.h"

#include <atomic>
#include <cstdlib>

#include "core/error.h"

namespace cf::kernels {

namespace {

// -1: not read yet (CF_CPU_ISA is read on the first cpu_isa()); else a CpuIsa other than kAuto.
std::atomic<int> g_isa{-1};

CpuIsa detect() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();  // (needed only before constructors run; harmless after)
  // __builtin_cpu_supports reports a feature only when the OS saves its registers (XCR0).
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
    return CpuIsa::kAvx512;
  if (__builtin_cpu_supports("avx2")) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kBaseline;
}

// The tier to use for a request: kAuto is the supported one; a tier the CPU lacks is an error.
CpuIsa resolve(CpuIsa want, const char* from) {
  if (want == CpuIsa::kAuto) return cpu_isa_supported();
  CF_CHECK(cpu_isa_runs(want), ValueError, "[cpu_isa] ", from, " asks for ", cpu_isa_name(want),
           " but this CPU runs at most ", cpu_isa_name(cpu_isa_supported()));
  return want;
}

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto: return "auto";
    case CpuIsa::kBaseline: return "baseline";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "?";
}

CpuIsa parse_cpu_isa(const std::string& s, const char* from) {
  CF_CHECK(s == "auto" || s == "baseline" || s == "avx2" || s == "avx512", ValueError, "[cpu_isa] ", from,
           " must be auto, baseline, avx2 or avx512, got '", s, "'");
  return s == "baseline" ? CpuIsa::kBaseline : s == "avx2" ? CpuIsa::kAvx2 : s == "avx512" ? CpuIsa::kAvx512
                                                                                          : CpuIsa::kAuto;
}

CpuIsa cpu_isa_supported() {
  static const CpuIsa best = detect();
  return best;
}

bool cpu_isa_runs(CpuIsa isa) { return int(isa) <= int(cpu_isa_supported()); }

CpuIsa cpu_isa() {
  int v = g_isa.load();
  if (v < 0) {
    const char* env = std::getenv("CF_CPU_ISA");
    v = int(resolve(parse_cpu_isa(env && *env ? env : "auto", "CF_CPU_ISA"), "CF_CPU_ISA"));
    int expected = -1;
    g_isa.compare_exchange_strong(expected, v);  // a set_cpu_isa in between wins
    v = g_isa.load();
  }
  return CpuIsa(v);
}

std::optional<bool> env_switch(const char* variable, const char* who) {
  const char* env = std::getenv(variable);
  if (!env || !*env) return std::nullopt;
  const std::string v = env;
  CF_CHECK(v == "0" || v == "1", ValueError, "[", who, "] the environment variable ", variable,
           " must be 0 or 1 (or unset), got '", v, "'");
  return v == "1";
}

void set_cpu_isa(CpuIsa isa) { g_isa.store(int(resolve(isa, "set_cpu_isa"))); }

}  // namespace cf::kernels
