# Sourced by scripts/test.sh and scripts/demo.sh (bash). Debian 12's OpenBLAS
# 0.3.21 picks its kernels by CPU model and does not know recent Intel server
# parts (a Xeon with AVX-512 BF16 here): it falls back to its Prescott (SSE3)
# kernels, and a 1024^3 sgemm ran at 21 GFLOP/s on one core instead of 101 with
# the SkylakeX kernels (Haswell's: 76). When OPENBLAS_CORETYPE is unset, name the
# family from the CPU's flags: AVX-512 (F, BW, VL, DQ, CD) -> SkylakeX, AVX2 + FMA
# -> Haswell (what OpenBLAS would choose for the CPUs it knows with those flags);
# anything else is left to OpenBLAS. `cf-bench` reports the kernel family in use
# (machine.openblas_config). Export OPENBLAS_CORETYPE yourself to override.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -r /proc/cpuinfo ]; then
  cf_cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  cf_has() { case "$cf_cpu_flags" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
  if cf_has avx512f && cf_has avx512bw && cf_has avx512vl && cf_has avx512dq && cf_has avx512cd; then
    export OPENBLAS_CORETYPE=SkylakeX
  elif cf_has avx2 && cf_has fma; then
    export OPENBLAS_CORETYPE=Haswell
  fi
  unset -f cf_has
  unset cf_cpu_flags
fi
