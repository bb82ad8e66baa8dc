# Configures, builds and runs a consumer project of xshard (cmake -P script, run by ctest).
# KIND=find_package installs the build tree into a fresh prefix first.
file(REMOVE_RECURSE ${WORK_DIR})
# No build type: the consumer and xshard::compiled build unoptimised (-O0, no -g). The test
# checks what the package holds and how its targets link; the main build compiles the same
# sources optimised.
set(configure_args -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=)
if(LAUNCHER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()

if(KIND STREQUAL "find_package")
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
  list(APPEND configure_args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
else()
  list(APPEND configure_args -DXSHARD_SOURCE_DIR=${SOURCE_DIR})
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/${KIND} -B ${WORK_DIR}/build ${configure_args})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${MPIEXEC} -n 2 --oversubscribe ${WORK_DIR}/build/consumer)
