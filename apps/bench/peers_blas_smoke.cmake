cmake_minimum_required(VERSION 3.25)
# peers.py runs cf-bench and torch on one OpenBLAS kernel family (cmake -DPYTHONS=<candidates>
# -DPEERS=peers.py -DAPP=cf-bench -DROOT=<repo> -DWORK_DIR=... -P this file): with OPENBLAS_CORETYPE
# unset it takes the value scripts/openblas-env.sh gives (set before torch loads OpenBLAS, inherited by
# cf-bench) and records it; a value the user set is kept. It runs under the first of PYTHONS that imports
# torch (the set-up's .venv sees Debian's); with none there is no peer to run, and the test says
# SKIPPED (the test's SKIP_REGULAR_EXPRESSION).
set(PYTHON "")
foreach(candidate IN LISTS PYTHONS)
  if(PYTHON STREQUAL "" AND EXISTS "${candidate}")
    execute_process(COMMAND "${candidate}" -c "import torch" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
    if(rc EQUAL 0)
      set(PYTHON "${candidate}")
    endif()
  endif()
endforeach()
if(PYTHON STREQUAL "")
  message("SKIPPED: no Python here imports torch (tried ${PYTHONS}), so peers.py runs no peer")
  return()
endif()
file(MAKE_DIRECTORY "${WORK_DIR}")
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=OPENBLAS_CORETYPE
                        bash -c ". \"$1\" && printf %s \"\${OPENBLAS_CORETYPE:-}\"" rule "${ROOT}/scripts/openblas-env.sh"
                RESULT_VARIABLE rc OUTPUT_VARIABLE want ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "scripts/openblas-env.sh: exit status ${rc}: ${err}")
endif()

function(peers env_arg expected)
  set(json "${WORK_DIR}/peers-blas.json")
  file(REMOVE "${json}")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${env_arg} "${PYTHON}" "${PEERS}" --cf-bench "${APP}"
                          --only chain3 --quick --threads 1 --out "${json}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT EXISTS "${json}")
    message(FATAL_ERROR "peers.py (${env_arg}): exit status ${rc}\n${out}\n${err}")
  endif()
  file(READ "${json}" text)
  string(JSON got GET "${text}" openblas_coretype)
  if(NOT got STREQUAL expected)
    message(FATAL_ERROR "peers.py (${env_arg}): openblas_coretype '${got}', expected '${expected}'")
  endif()
  # ... and the family reached OpenBLAS: cf-bench's machine block names the kernels it loaded.
  string(JSON config GET "${text}" machine openblas_config)
  if(NOT expected STREQUAL "" AND NOT config MATCHES " ${expected} ")
    message(FATAL_ERROR "peers.py (${env_arg}): cf-bench ran OpenBLAS '${config}', not the ${expected} kernels")
  endif()
  if(NOT out MATCHES "OpenBLAS kernels of both sides: ")
    message(FATAL_ERROR "peers.py (${env_arg}) does not say which OpenBLAS kernels both sides run:\n${out}")
  endif()
endfunction()

peers(--unset=OPENBLAS_CORETYPE "${want}")
peers(OPENBLAS_CORETYPE=Prescott "Prescott")  # (kernels every x86-64 CPU runs)
message("peers.py under ${PYTHON}: unset -> '${want}' (scripts/openblas-env.sh's rule), a set value kept")
