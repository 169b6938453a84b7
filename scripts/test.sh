#!/usr/bin/env bash
# The test command (README, .ci/run). Stages, each timed:
#  release   Release build with warnings as errors (the CUDA backend compiled when
#            nvcc is found), then the whole CTest suite, slow tier included; CUDA
#            tests run when a GPU is visible and report themselves skipped otherwise.
#  python    the Python package built against that library (python/, nanobind),
#            then its pytest suite in the .venv of scripts/setup.sh.
#  sanitize  ASan + UBSan build of the library and the doctest suite (no apps, no
#            CUDA), then the unit tier: `ctest -LE slow`. The learning tests (label
#            `slow`, over about 10 s in Release) add little there that the unit
#            cases lack, and cost minutes under the sanitizers.
# At the end: each stage's wall time and the ten slowest tests of the Release run.
# Exits non-zero on the first failure. Environment knobs: CF_JOBS (default 2),
# CF_BUILD_DIR, CF_SAN_BUILD_DIR, CF_TEST_SANITIZE=0 skips the sanitizer stage,
# CF_TEST_PYTHON=0 the Python stage.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${CF_JOBS:-2}"
build="${CF_BUILD_DIR:-$root/build}"
build_san="${CF_SAN_BUILD_DIR:-$root/build-sanitize}"

stage_names=()
stage_secs=()
stage_start=0
stage_begin() {
  echo "== test: $1 =="
  stage_names+=("$1")
  stage_start=$SECONDS
}
stage_end() { stage_secs+=($((SECONDS - stage_start))); }

summary() {
  local rc=$?
  # The report must not change the exit status: no -e or pipefail in here (a
  # `sort | head` under pipefail ends with SIGPIPE, 141, after a green run).
  set +e +o pipefail
  echo "== test: stage times =="
  local i
  for i in "${!stage_secs[@]}"; do
    printf '  %-40s %4d min %02d s\n' "${stage_names[$i]}" $((stage_secs[i] / 60)) $((stage_secs[i] % 60))
  done
  if [ "${#stage_secs[@]}" -lt "${#stage_names[@]}" ]; then
    echo "  ${stage_names[-1]}: failed after $((SECONDS - stage_start)) s"
  fi
  printf '  %-40s %4d min %02d s\n' "total" $((SECONDS / 60)) $((SECONDS % 60))
  # CTest keeps each test's last duration in CTestCostData.txt: "name runs seconds".
  local costs="$build/Testing/Temporary/CTestCostData.txt"
  if [ -f "$costs" ]; then
    echo "== test: ten slowest tests (Release) =="
    awk '/^---/ { exit } NF >= 3 { t = $NF; $NF = ""; $(NF-1) = ""; printf "%9.1f s  %s\n", t, $0 }' "$costs" |
      sort -rn | awk 'NR <= 10'
  fi
  exit $rc
}
trap summary EXIT

# configure <dir> <cmake args...>: Ninja when present (its log gives compile
# times), unless the folder was already configured with another generator.
configure() {
  local dir=$1; shift
  local gen=()
  if [ ! -f "$dir/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then gen=(-G Ninja); fi
  cmake -S "$root" -B "$dir" "${gen[@]}" "$@"
}

# CTest runs $jobs test processes at once, each with an OpenMP team as large as
# the machine: more threads than cores. libgomp's default waits by spinning, so a
# thread at a barrier burns the core its partner needs (a Cluster-Former test
# spent 25 of its 29 CPU seconds spinning; 3.5 s with passive waiting).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# OpenBLAS kernels for CPUs its version does not know (scripts/openblas-env.sh).
source "$root/scripts/openblas-env.sh"

stage_begin "release: build"
configure "$build" -DCMAKE_BUILD_TYPE=Release -DCF_WERROR=ON
cmake --build "$build" -j "$jobs"
stage_end

stage_begin "release: ctest (all tiers)"
ctest --test-dir "$build" --output-on-failure -j "$jobs"
stage_end

# The Python package (python/): the extension built against the Release
# library above, then pytest in the .venv scripts/setup.sh made. PyTorch
# interop tests report themselves skipped when torch does not import there.
if [ "${CF_TEST_PYTHON:-1}" != "0" ]; then
  stage_begin "python: extension + pytest"
  if [ ! -x "$root/.venv/bin/python" ]; then
    echo "test: $root/.venv is missing: run scripts/setup.sh (or CF_TEST_PYTHON=0 to skip this stage)" >&2
    exit 1
  fi
  configure "$build" -DCF_PYTHON=ON -DPython_EXECUTABLE="$root/.venv/bin/python"
  cmake --build "$build" -j "$jobs" --target cf_python
  PYTHONPATH="$build/python" "$root/.venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/python/tests"
  stage_end
fi

if [ "${CF_TEST_SANITIZE:-1}" = "0" ]; then
  echo "== test: sanitizer stage skipped (CF_TEST_SANITIZE=0) =="
  exit 0
fi

# LeakSanitizer: OpenBLAS keeps its thread pool and buffers and libgomp its team
# until process exit; some versions of these libraries show up as LSan leaks that
# are not ours. As a precaution those two libraries are suppressed (none was
# reported with OpenBLAS 0.3.21 / gcc 12), and leaks in cf itself still fail.
export LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp:print_suppressions=0"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# (Exported before the build: doctest test discovery runs the test binary then.)
# No -Werror here: gcc warns differently with sanitizer instrumentation; the
# warnings gate is the first build.
# CPU only (CF_CUDA=OFF): nvcc does not take the sanitizer flags, the CUDA
# runtime is not ASan-clean, and the first build already compiles the CUDA code.
stage_begin "sanitize: ASan + UBSan build"
# -O1 -g1 (line tables: ASan's and UBSan's reports keep file:line): the
# instrumented build is this run's longest stage, and -O2 -g compiled the largest
# translation unit (elementwise_cpu.cpp) in 38.5 s of CPU against 22.4 s.
configure "$build_san" -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DCF_SANITIZE=ON -DCF_BUILD_APPS=OFF -DCF_CUDA=OFF
cmake --build "$build_san" -j "$jobs"
stage_end

stage_begin "sanitize: ctest -LE slow (unit tier)"
ctest --test-dir "$build_san" --output-on-failure -j "$jobs" -LE slow
stage_end
echo "== test: all passed =="
