# What every app's CTest script (apps/<app>/app_test.cmake, run as
# cmake -DAPP=<binary> -DWORK_DIR=<dir> [-DMODE=smoke|errors] -P app_test.cmake)
# shares: a fresh work folder, running the app with an expected exit status,
# matching its output, reading its JSON summary, and the checks of the option
# table (apps/common/options.h) that every app must pass.
cmake_minimum_required(VERSION 3.25)
get_filename_component(APP_NAME "${APP}" NAME)
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# write_fashion_mnist(<folder under WORK_DIR> <training images> <test images> <side>): a Fashion-MNIST
# folder of black side x side images (labels i % 10) in IDX format, for tests of folders smaller than the
# real one. Written with Python's standard library; fails the test when python3 is missing.
function(write_fashion_mnist dir n_train n_test side)
  find_program(PY3 python3 REQUIRED)
  set(make_idx [=[
import os, struct, sys
d, n_train, n_test, side = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.makedirs(d, exist_ok=True)
def images(name, n):
    open(os.path.join(d, name), 'wb').write(struct.pack('>IIII', 0x803, n, side, side) + bytes(n * side * side))
def labels(name, n):
    open(os.path.join(d, name), 'wb').write(struct.pack('>II', 0x801, n) + bytes(i % 10 for i in range(n)))
images('train-images-idx3-ubyte', n_train); labels('train-labels-idx1-ubyte', n_train)
images('t10k-images-idx3-ubyte', n_test); labels('t10k-labels-idx1-ubyte', n_test)
]=])
  file(WRITE "${WORK_DIR}/make_idx.py" "${make_idx}")
  execute_process(COMMAND "${PY3}" make_idx.py "${dir}" ${n_train} ${n_test} ${side}
                  WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "writing the IDX folder '${dir}' failed")
  endif()
endfunction()

# run(<expected status> <var for stdout> <var for stderr> args...), in WORK_DIR.
function(run expected out_var err_var)
  execute_process(COMMAND "${APP}" ${ARGN} WORKING_DIRECTORY "${WORK_DIR}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL expected)
    message(FATAL_ERROR "${APP_NAME} ${ARGN}: exit status ${rc}, expected ${expected}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
  set(${err_var} "${err}" PARENT_SCOPE)
endfunction()

function(expect_match text regex what)
  if(NOT text MATCHES "${regex}")
    message(FATAL_ERROR "${what}: expected to match '${regex}', got:\n${text}")
  endif()
endfunction()

# The value at a JSON path (the remaining arguments: keys) must be the same string
# in two summaries: `what` names the runs being compared in the error.
function(expect_same_json first second what)
  string(JSON a GET "${first}" ${ARGN})
  string(JSON b GET "${second}" ${ARGN})
  if(NOT a STREQUAL b)
    message(FATAL_ERROR "smoke: ${what}: ${ARGN} is ${b}, expected ${a}")
  endif()
endfunction()

# A model reused from its checkpoint reports no training time: null at the JSON
# path (the remaining arguments), never a 0.
function(expect_null_json summary what)
  string(JSON t TYPE "${summary}" ${ARGN})
  if(NOT t STREQUAL "NULL")
    message(FATAL_ERROR "smoke: ${what}: ${ARGN} is not null: ${summary}")
  endif()
endfunction()

# The last line of stdout: the JSON summary.
function(last_line text out_var)
  string(STRIP "${text}" text)
  string(REGEX REPLACE ".*\n" "" line "${text}")
  set(${out_var} "${line}" PARENT_SCOPE)
endfunction()

# The option table's errors, the same in every app: --help, an unknown option,
# a missing value, a non-integer for `int_option`, unknown and mistyped config
# keys (`int_option` as a string), a file that is not JSON, a missing file.
function(check_option_errors int_option)
  run(0 out err --help)
  expect_match("${out}" "usage: ${APP_NAME}" "--help")
  # The list is generated from the option table: every option with its value
  # placeholder, its default read from the field.
  expect_match("${out}" "\n  --${int_option} N " "--help lists --${int_option}")
  expect_match("${out}" "\\(default [^)\n]+\\)" "--help prints the defaults")
  expect_match("${out}" "\n  --config FILE " "--help lists --config")
  run(2 out err --bogus 1)
  expect_match("${err}" "unknown option '--bogus'" "unknown option")
  expect_match("${err}" "run '${APP_NAME} --help' for usage" "usage hint")
  run(2 out err --${int_option})
  expect_match("${err}" "--${int_option} needs a value" "missing value")
  run(2 out err --${int_option} ten)
  expect_match("${err}" "--${int_option} expects an integer, got 'ten'" "non-integer")
  string(REPLACE "-" "_" key "${int_option}")
  file(WRITE "${WORK_DIR}/bad_key.json" "{\"${key}x\": 3}")
  run(2 out err --config bad_key.json)
  expect_match("${err}" "unknown config key '${key}x'" "unknown config key")
  file(WRITE "${WORK_DIR}/bad_type.json" "{\"${key}\": \"three\"}")
  run(2 out err --config bad_type.json)
  expect_match("${err}" "config key '${key}' must be an integer" "mistyped config key")
  file(WRITE "${WORK_DIR}/not_json.json" "{${key}: 3")
  run(2 out err --config not_json.json)
  expect_match("${err}" "config file 'not_json.json' is not valid JSON" "invalid JSON")
  run(2 out err --config missing.json)
  expect_match("${err}" "cannot read config file 'missing.json'" "missing config")
  file(WRITE "${WORK_DIR}/twice.json" "{\"${key}\": 3, \"${key}\": 4}")
  run(2 out err --config twice.json)
  expect_match("${err}" "config file 'twice.json' is not valid: key '${key}' appears twice" "repeated config key")
  run(2 out err --config bad_key.json --config=bad_type.json)
  expect_match("${err}" "--config given twice \\('bad_key.json' and 'bad_type.json'\\)" "second --config")
  run(2 out err --device tpu)
  expect_match("${err}" "tpu" "unknown device")
endfunction()
