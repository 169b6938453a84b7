#!/usr/bin/env bash
# The test command (README, .ci/run):
#  1. Release build with warnings as errors, whole CTest suite (doctest cases,
#     consumer tests of add_subdirectory and find_package); the CUDA backend is
#     compiled when nvcc is found, and its tests run when a GPU is visible
#     (reported as skipped by CTest otherwise);
#  2. a second build under AddressSanitizer + UndefinedBehaviorSanitizer and the
#     doctest suite again.
# Exits non-zero on the first failure. CF_JOBS (default 2) sets the parallelism,
# CF_TEST_SANITIZE=0 skips step 2 (quick local runs).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${CF_JOBS:-2}"
build="${CF_BUILD_DIR:-$root/build}"
build_san="${CF_SAN_BUILD_DIR:-$root/build-sanitize}"

echo "== test: Release build, -Werror =="
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCF_WERROR=ON
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs"

if [ "${CF_TEST_SANITIZE:-1}" = "0" ]; then
  echo "== test: sanitizer run skipped (CF_TEST_SANITIZE=0) =="
  exit 0
fi

echo "== test: ASan + UBSan build =="
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
cmake -S "$root" -B "$build_san" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCF_SANITIZE=ON \
  -DCF_BUILD_APPS=OFF -DCF_CUDA=OFF
cmake --build "$build_san" -j "$jobs"
ctest --test-dir "$build_san" --output-on-failure -j "$jobs"
echo "== test: all passed =="
