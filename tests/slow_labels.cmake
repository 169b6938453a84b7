# Read by CTest (tests/CMakeLists.txt adds it after doctest's discovery file):
# labels every doctest case of the suite "slow" (CF_SLOW in test_util.h) `slow`,
# and of the suite "tsan" (tests/core/test_threads.cpp, the concurrency tests the
# ThreadSanitizer build runs) `tsan`. CF_TESTS_EXE is the cf_tests binary.
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
