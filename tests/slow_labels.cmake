# Read by CTest (tests/CMakeLists.txt adds it after doctest's discovery file):
# labels `slow` every doctest case of the suite "slow" (CF_SLOW in test_util.h).
# CF_TESTS_EXE is the cf_tests binary.
execute_process(COMMAND "${CF_TESTS_EXE}" --test-suite=slow --list-test-cases
  OUTPUT_VARIABLE slow_cases RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "listing the slow tests failed (${rc}): ${CF_TESTS_EXE} --test-suite=slow --list-test-cases")
endif()
string(REPLACE "\n" ";" slow_cases "${slow_cases}")
foreach(name IN LISTS slow_cases)
  # doctest frames the list with "[doctest] ..." and "====" lines.
  if(name STREQUAL "" OR name MATCHES "^\\[doctest\\]" OR name MATCHES "^====")
    continue()
  endif()
  set_tests_properties("${name}" PROPERTIES LABELS slow)
endforeach()
