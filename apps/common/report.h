#pragma once
// What every app prints and measures the same way (DESIGN.md section 9): one
// JSON line per event on stdout, wall-clock seconds, mean and sample standard
// deviation over seeds, and the output folder of checkpoints and files.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/stat.h>
#include <thread>
#include <vector>
#include "cf.h"
#include "core/json.h"
#include "common/cli.h"
#include "kernels/common/cpu_isa.h"
#include "kernels/matmul/matmul.h"

namespace cf::apps {

// One metrics line (flushed, so a pipe sees progress as it happens).
// --distributed: only rank 0 speaks (every rank computes the same lines).
inline void emit(const nlohmann::ordered_json& j) {
  if (cf::dist::rank() == 0) std::cout << cf::io::json_line(j) << std::endl;  // (bad UTF-8 from data repaired)
}

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The CPU's model name from /proc/cpuinfo, for the machine block of a benchmark's
// JSON ("unknown" where there is none).
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      size_t c = line.find(':');
      if (c != std::string::npos) return line.substr(line.find_first_not_of(' ', c + 1));
    }
  return "unknown";
}

// Where and when a run happens, for the start event of every app: RESULTS.md names the machine of each
// table, and the 2-core machines here differ in CPU (and so in BLAS kernels, which move last bits and
// timings). blas_kernels: OpenBLAS's kernel family (a warning on stderr when it is older than the CPU);
// cpu_isa: the instruction tier of cf's own vectorised rows (kernels/common/cpu_isa.h; same bits in every tier).
// utc: the start time, ISO 8601.
inline nlohmann::ordered_json machine_record() {
  char utc[32];
  const std::time_t now = std::time(nullptr);
  std::tm t{};
  gmtime_r(&now, &t);
  std::strftime(utc, sizeof utc, "%Y-%m-%dT%H:%M:%SZ", &t);
  const int threads = cf::get_num_threads();
  const cf::kernels::BlasKernels blas = cf::kernels::blas_kernels();
  static bool warned = false;
  if (blas.older_than_cpu && !warned) {
    warned = true;
    std::cerr << "warning: OpenBLAS runs its " << blas.family
              << " kernels, older than this CPU (sgemm several times slower); export OPENBLAS_CORETYPE "
                 "(source scripts/openblas-env.sh) before starting\n";
  }
  return {{"cpu", cpu_model()}, {"cores", std::thread::hardware_concurrency()}, {"openmp_threads", threads},
          {"blas_kernels", blas.family}, {"cpu_isa", cf::kernels::cpu_isa_name(cf::kernels::cpu_isa())}, {"utc", utc}};
}

struct Stats {
  double mean = 0, std = 0;  // std: sample standard deviation (0 for one value)
  int64_t n = 0;
};

inline Stats stats_of(const std::vector<double>& v) {
  Stats s;
  s.n = int64_t(v.size());
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.std = std::sqrt(ss / double(v.size() - 1));
  }
  return s;
}

// One number through a printf format ("%.2f").
inline std::string fmt(double v, const char* format) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// "mean ± std" with each number through `format`, times `scale`; the spread
// only over several values ("3.734" for one seed).
inline std::string fmt_stats(const Stats& s, const char* format, double scale = 1.0) {
  std::string out = fmt(scale * s.mean, format);
  return s.n > 1 ? out + " ± " + fmt(scale * s.std, format) : out;
}

// A fraction as percent: "61.3 ± 2.5".
inline std::string fmt_pct(const Stats& s) { return fmt_stats(s, "%.1f", 100.0); }

// The mean of what this run measured (training time, memory), or null in the
// JSON and "–" in a table when it measured nothing (every seed's model was
// reused from its checkpoint): never a 0.
inline nlohmann::json mean_or_null(const Stats& s) { return s.n > 0 ? nlohmann::json(s.mean) : nlohmann::json(nullptr); }
inline std::string fmt_mean_or_dash(const Stats& s, const char* format) {
  return s.n > 0 ? fmt(s.mean, format) : std::string("–");
}

inline bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// Creates `dir` (one level) when missing; an IOError naming the app and the
// option when it cannot be made.
inline void make_dir(const std::string& dir, const std::string& app, const std::string& option) {
  ::mkdir(dir.c_str(), 0777);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw cf::IOError("[" + app + "] cannot create " + option + " '" + dir + "'");
}

// The device named by --device, or a UsageError when this build or machine
// cannot use it.
inline cf::Device parse_device(const std::string& name) {
  cf::Device dev;
  try {
    dev = cf::Device::parse(name);
  } catch (const std::exception& e) {
    throw UsageError(std::string("--device: ") + e.what());
  }
  if (dev.is_cpu()) return dev;
  if (!cf::cuda_built())
    throw UsageError("device '" + name + "' is not available: this cf was built without CUDA");
  if (dev.index >= cf::cuda::device_count())
    throw UsageError("device '" + name + "' is not available: " + std::to_string(cf::cuda::device_count()) +
                     " CUDA device(s) visible");
  return dev;
}

}  // namespace cf::apps
