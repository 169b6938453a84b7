#pragma once
// Vector instruction tiers of the CPU kernels that are compiled more than once.
//
// libcf is built for plain x86-64 (SSE2), so that one build runs on any x86-64 CPU. The few loops
// where the vector width decides the speed (kernels/common/row_math.cpp: the exp, maximum, sum and
// softmax-gradient rows of softmax and of every fused attention kernel, the block and routed
// kernels' score mask, dropout; kernels/sparse/
// sparse_cpu.cpp: improved clustered attention's sparse products) are compiled three times, with
// function target attributes, and the tier this CPU runs is chosen at run time:
//   baseline  SSE2 (every x86-64 CPU; the only tier elsewhere)
//   avx2      AVX2 (Intel from Haswell, AMD from Zen 1)
//   avx512    AVX-512 F, VL, BW, DQ (Intel server CPUs from Skylake-SP, Ice Lake and Tiger Lake
//             laptops, AMD from Zen 4; not Intel's Alder Lake and later desktop parts)
// Every tier computes the same operations in the same order (no FMA contraction in those files,
// fixed partial sums), so all of them give the same bits: the tier changes the speed only. Two
// exceptions that no kernel output shows: which NaN a NaN result is (its sign and payload follow
// the operand order of a vector add), and the sign of a zero maximum (max_row of a row whose
// largest entries are +0 and -0).
//
// The tier in use is the best one the CPU (and the OS, for the AVX-512 register state) supports,
// unless CF_CPU_ISA (auto|baseline|avx2|avx512; empty means auto) or set_cpu_isa asks for another.
// `cf-bench cpu-isa` times the tiers against each other in one run, `--cpu-isa` forces one in any
// cf-bench run, tests compare their bits. Asking for a tier this CPU lacks is a ValueError.
#include <optional>
#include <string>

// Function attributes for the tiers' copies of a loop: the body must be inlined into the
// attributed function (CF_ROW_INLINE, row_math.h) and hold no lambda or call of its own that
// is not inlined (those compile for the baseline). CF_CPU_TIERS: whether the x86 tiers exist.
#if defined(__x86_64__) && defined(__GNUC__)
#define CF_CPU_TIERS 1
#define CF_TARGET_AVX2 __attribute__((target("avx2")))
#define CF_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2")))
#endif

namespace cf::kernels {

enum class CpuIsa { kAuto, kBaseline, kAvx2, kAvx512 };

const char* cpu_isa_name(CpuIsa isa);            // "auto", "baseline", "avx2", "avx512"
// The names above; ValueError naming `from` (the variable or option read) otherwise.
CpuIsa parse_cpu_isa(const std::string& name, const char* from = "CF_CPU_ISA");
CpuIsa cpu_isa_supported();                      // the best tier this CPU runs (never kAuto)
bool cpu_isa_runs(CpuIsa isa);                   // whether this CPU runs the tier (kAuto: true)
// The tier the kernels use now (never kAuto): set_cpu_isa's, else CF_CPU_ISA's (read on the first
// call), else the supported one. ValueError when CF_CPU_ISA is not a tier name or names a tier this
// CPU lacks.
CpuIsa cpu_isa();
// kAuto: back to the best supported tier. ValueError naming the tier when this CPU lacks it.
void set_cpu_isa(CpuIsa isa);


// An on/off environment variable of the CPU kernels (CF_BF16_DOT, CF_BF16_AMX): nullopt when unset or
// empty, false for "0", true for "1"; anything else is a ValueError naming `who`, the variable and the
// value (a typo such as CF_BF16_DOT=off silently kept the default). Reads the environment on every call;
// its users read it once.
std::optional<bool> env_switch(const char* variable, const char* who);

}  // namespace cf::kernels
