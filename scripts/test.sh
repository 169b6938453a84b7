#!/usr/bin/env bash
# The test command (README, .ci/run). Stages, each timed:
#  release   Release build with warnings as errors (the CUDA backend compiled when
#            nvcc is found: to PTX alone when no GPU is visible), then the whole CTest suite, slow tier included; CUDA
#            tests run when a GPU is visible and report themselves skipped otherwise.
#  python    the Python package built against that library (python/, nanobind),
#            then its pytest suite in the .venv of scripts/setup.sh.
#  sanitize  ASan + UBSan build of the library, ASan build of the doctest suite (no
#            apps, no CUDA), then the unit tier: `ctest -LE slow`. The learning tests (label
#            `slow`, over about 10 s in Release or 5 s here) add little there that the unit
#            cases lack, and cost minutes under the sanitizers.
#  fuzz      the file readers' libFuzzer targets (tests/fuzz), built alone with
#            clang + ASan + UBSan, each run for CF_FUZZ_SECONDS: `ctest -L fuzz`.
#  tsan      (CF_TEST_TSAN=1 only) ThreadSanitizer build, `ctest -L tsan`.
# At the end: each stage's wall time and the ten slowest tests of the Release run.
# Exits non-zero on the first failure. Environment knobs: CF_JOBS (default 2),
# CF_BUILD_DIR, CF_SAN_BUILD_DIR, CF_TEST_SANITIZE=0 skips the sanitizer stage,
# CF_TEST_PYTHON=0 the Python stage, CF_TEST_FUZZ=0 the fuzz stage, CF_FUZZ_SECONDS
# sets its time per target (default 15), CF_TEST_TSAN=1 adds the ThreadSanitizer
# stage (off by default: it does not fit CI's time).
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

# With no GPU visible (CI) the CUDA code is compiled for compute_90 as PTX alone:
# that is the check that it compiles, and the machine code ptxas would make from
# it (about half of nvcc's time: attention_mma_cuda.cu 119 s -> 46 s, the whole
# backend about 470 -> 230 s of CPU) could run nowhere here. A resource error only
# ptxas reports (registers, shared memory per block) then waits for a GPU run
# (scripts/gpu_check.sh builds sm_90 machine code).
cuda_arch=()
if ! nvidia-smi -L >/dev/null 2>&1; then cuda_arch=(-DCMAKE_CUDA_ARCHITECTURES=90-virtual); fi

stage_begin "release: build"
configure "$build" -DCMAKE_BUILD_TYPE=Release -DCF_WERROR=ON "${cuda_arch[@]}"
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
else

# LeakSanitizer: OpenBLAS keeps its thread pool and buffers and libgomp its team
# until process exit; some versions of these libraries show up as LSan leaks that
# are not ours. As a precaution those two libraries are suppressed (none was
# reported with OpenBLAS 0.3.21 / gcc 12), and leaks in cf itself still fail.
export LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp:print_suppressions=0"
# allocator_may_return_null: a request too large for memory is an error cf reports
# ("[allocate] out of CPU memory"), as in a plain build, not an ASan abort.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:check_initialization_order=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# (Exported before the build: doctest test discovery runs the test binary then.)
# No -Werror here: gcc warns differently with sanitizer instrumentation; the
# warnings gate is the first build.
# CPU only (CF_CUDA=OFF): nvcc does not take the sanitizer flags, the CUDA
# runtime is not ASan-clean, and the first build already compiles the CUDA code.
stage_begin "sanitize: ASan + UBSan build"
# -O1 -g1 (line tables: ASan's and UBSan's reports keep file:line): the
# instrumented build is this run's longest stage, and -O2 -g compiled the largest
# translation unit (elementwise_cpu.cpp) in 38.5 s of CPU against 22.4 s. The library as a
# unity build (CF_UNITY_BUILD): its headers parsed once per 8 files; the Release build above
# already compiled each file alone.
configure "$build_san" -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DCF_SANITIZE=ON -DCF_BUILD_APPS=OFF -DCF_CUDA=OFF -DCF_UNITY_BUILD=ON
cmake --build "$build_san" -j "$jobs"
stage_end

stage_begin "sanitize: ctest -LE slow (unit tier)"
ctest --test-dir "$build_san" --output-on-failure -j "$jobs" -LE slow
stage_end
fi

# Fuzzing (tests/fuzz/README.md): the file readers' libFuzzer targets, built
# alone with clang under ASan + UBSan (not the whole library), each run for
# CF_FUZZ_SECONDS (default 15) from the seed corpus in tests/fuzz/corpus/.
if [ "${CF_TEST_FUZZ:-1}" = "0" ]; then
  echo "== test: fuzz stage skipped (CF_TEST_FUZZ=0) =="
else
  build_fuzz="${CF_FUZZ_BUILD_DIR:-$root/build-fuzz}"
  stage_begin "fuzz: clang build of the fuzz targets"
  configure "$build_fuzz" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="${CF_FUZZ_CXX:-clang++}" \
    -DCF_FUZZ=ON -DCF_FUZZ_SECONDS="${CF_FUZZ_SECONDS:-15}" -DCF_BUILD_TESTS=OFF -DCF_BUILD_APPS=OFF \
    -DCF_CUDA=OFF -DCF_INSTALL=OFF
  cmake --build "$build_fuzz" -j "$jobs" --target cf_fuzz_all
  stage_end
  stage_begin "fuzz: ctest -L fuzz (${CF_FUZZ_SECONDS:-15} s per target)"
  ctest --test-dir "$build_fuzz" --output-on-failure -j "$jobs" -L fuzz
  stage_end
fi

# ThreadSanitizer (off by default: a third full build of the library does not
# fit CI's time): CF_TEST_TSAN=1 builds build-tsan (clang) with -DCF_SANITIZE=thread and
# runs the concurrency tests, `ctest -L tsan` (tests/core/test_threads.cpp).
if [ "${CF_TEST_TSAN:-0}" = "1" ]; then
  build_tsan="${CF_TSAN_BUILD_DIR:-$root/build-tsan}"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$root/scripts/tsan.supp"
  archer="$(ls /usr/lib/llvm-*/lib/libarcher.so 2>/dev/null | tail -1 || true)"
  if [ -n "$archer" ]; then export OMP_TOOL_LIBRARIES="$archer"; fi
  stage_begin "tsan: ThreadSanitizer build"
  # clang: its OpenMP runtime (libomp) tells TSan about its barriers through the
  # Archer tool (OMP_TOOL_LIBRARIES, set above); GCC's libgomp is not instrumented, so
  # every OpenMP kernel would report false races there.
  configure "$build_tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="${CF_TSAN_CXX:-clang++}" \
    -DCF_SANITIZE=thread -DCF_BUILD_APPS=OFF -DCF_CUDA=OFF -DCF_INSTALL=OFF
  cmake --build "$build_tsan" -j "$jobs" --target cf_tsan_tests
  stage_end
  stage_begin "tsan: ctest -L tsan"
  ctest --test-dir "$build_tsan" --output-on-failure -j "$jobs" -L tsan
  stage_end
fi
echo "== test: all passed =="
