# Read by CTest (tests/CMakeLists.txt adds it after doctest's discovery file):
# labels every doctest case of the suite "slow" (CF_SLOW in test_util.h) `slow`,
# and of the suite "tsan" (tests/core/test_threads.cpp, the concurrency tests the
# ThreadSanitizer build runs) `tsan`. CF_TESTS_EXE is the cf_tests binary.
# It also refuses a case name holding ';': CMake's list separator, which splits the
# name into two CTest tests, each failing as "no test matched" (stop 54 hit it).
execute_process(COMMAND "${CF_TESTS_EXE}" --list-test-cases OUTPUT_VARIABLE all RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "listing the tests failed (${rc}): ${CF_TESTS_EXE} --list-test-cases")
endif()
string(REGEX MATCHALL "[^\n]*;[^\n]*" split_names "${all}")
if(split_names)
  string(REPLACE ";" "<;>" shown "${split_names}")
  message(FATAL_ERROR "doctest case names may not hold ';' (CTest would split them in two): ${shown}")
endif()
foreach(suite slow tsan)
  execute_process(COMMAND "${CF_TESTS_EXE}" --test-suite=${suite} --list-test-cases
    OUTPUT_VARIABLE cases RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "listing the ${suite} tests failed (${rc}): ${CF_TESTS_EXE} --test-suite=${suite} --list-test-cases")
  endif()
  string(REPLACE "\n" ";" cases "${cases}")
  foreach(name IN LISTS cases)
    # doctest frames the list with "[doctest] ..." and "====" lines.
    if(name STREQUAL "" OR name MATCHES "^\\[doctest\\]" OR name MATCHES "^====")
      continue()
    endif()
    set_tests_properties("${name}" PROPERTIES LABELS ${suite})
  endforeach()
endforeach()
