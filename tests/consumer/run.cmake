# Consumer test driver: cmake -DMODE=add_subdirectory|find_package -DCF_SOURCE_DIR=...
#   -DCF_BUILD_DIR=<cf build tree> -DWORK_DIR=<scratch> [-DGENERATOR=...] [-DCXX=...]
#   [-DBUILD_TYPE=...] [-DJOBS=2] -P run.cmake
# find_package: `cmake --install` the cf build into WORK_DIR/prefix, then configure,
# build and run the consumer against it. add_subdirectory: configure the consumer
# with -DCF_SOURCE_DIR (this builds libcf again inside the consumer's tree).
cmake_minimum_required(VERSION 3.25)

foreach(v MODE CF_SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run.cmake: -D${v}=... is required")
  endif()
endforeach()
if(NOT DEFINED JOBS)
  set(JOBS 2)
endif()
if(NOT DEFINED BUILD_TYPE OR BUILD_TYPE STREQUAL "")
  set(BUILD_TYPE Release)
endif()
set(consumer_src ${CMAKE_CURRENT_LIST_DIR})

function(step what)
  message(STATUS "consumer[${MODE}]: ${what}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer[${MODE}]: ${what} failed (${rc})")
  endif()
endfunction()

set(gen_args)
if(DEFINED GENERATOR AND NOT GENERATOR STREQUAL "")
  list(APPEND gen_args -G ${GENERATOR})
endif()
if(DEFINED CXX AND NOT CXX STREQUAL "")
  list(APPEND gen_args -DCMAKE_CXX_COMPILER=${CXX})
endif()

set(build ${WORK_DIR}/build)
if(MODE STREQUAL "find_package")
  if(NOT DEFINED CF_BUILD_DIR)
    message(FATAL_ERROR "run.cmake: find_package mode needs -DCF_BUILD_DIR=<cf build tree>")
  endif()
  set(prefix ${WORK_DIR}/prefix)
  file(REMOVE_RECURSE ${prefix} ${build})
  step("install cf" ${CMAKE_COMMAND} --install ${CF_BUILD_DIR} --prefix ${prefix} --config ${BUILD_TYPE})
  foreach(f include/cf/cf.h include/cf/core/tensor.h)
    if(NOT EXISTS ${prefix}/${f})
      message(FATAL_ERROR "consumer[${MODE}]: ${f} was not installed")
    endif()
  endforeach()
  step("configure" ${CMAKE_COMMAND} -S ${consumer_src} -B ${build} ${gen_args}
       -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DCMAKE_PREFIX_PATH=${prefix} -DCF_SOURCE_DIR=)
elseif(MODE STREQUAL "add_subdirectory")
  # The build tree is kept between runs: libcf rebuilds incrementally. This test
  # checks packaging, not speed: the library is built unoptimised (an empty build
  # type, -O0), several times faster than Release (elementwise_cpu.cpp: 3.4 s of
  # CPU at -O0, 28 s at -O3), and as a unity build (CF_UNITY_BUILD: 56 s on 2 cores against 148 s).
  set(BUILD_TYPE "")
  step("configure" ${CMAKE_COMMAND} -S ${consumer_src} -B ${build} ${gen_args}
       -DCMAKE_BUILD_TYPE= -DCF_SOURCE_DIR=${CF_SOURCE_DIR}
       -DCF_BUILD_TESTS=OFF -DCF_BUILD_APPS=OFF -DCF_CUDA=OFF -DCF_UNITY_BUILD=ON)
else()
  message(FATAL_ERROR "run.cmake: MODE must be add_subdirectory or find_package, got '${MODE}'")
endif()
set(config_args)
if(NOT BUILD_TYPE STREQUAL "")
  set(config_args --config ${BUILD_TYPE})
endif()
step("build" ${CMAKE_COMMAND} --build ${build} ${config_args} -j ${JOBS})

find_program(exe NAMES consumer PATHS ${build} ${build}/${BUILD_TYPE} NO_DEFAULT_PATH)
if(NOT exe)
  message(FATAL_ERROR "consumer[${MODE}]: no consumer executable in ${build}")
endif()
step("run" ${exe})
