# Helpers for xshard's own tests, examples and benchmarks (not installed).

find_package(GTest REQUIRED)

# Warnings for xshard's own code (third-party headers come in as system includes).
function(xshard_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic $<$<BOOL:${XSHARD_WERROR}>:-Werror>)
endfunction()

# The environment Open MPI needs here: running as root, more ranks than cores.
set(XSHARD_MPI_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1)

# xshard_add_mpi_test(NAME name COMMAND target [ARGS ...] RANKS n... [TIMEOUT s] [LABELS l...]
#                     [PASS_REGULAR_EXPRESSION re])
# Registers `name.npN` for each N: the target run under mpirun with N ranks, with a timeout
# so that a deadlock fails instead of hanging.
function(xshard_add_mpi_test)
  cmake_parse_arguments(T "" "NAME;COMMAND;TIMEOUT;PASS_REGULAR_EXPRESSION" "ARGS;RANKS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  foreach(n IN LISTS T_RANKS)
    set(test ${T_NAME}.np${n})
    add_test(NAME ${test}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${T_COMMAND}> ${T_ARGS})
    set_tests_properties(${test} PROPERTIES
      TIMEOUT ${T_TIMEOUT} PROCESSORS ${n} LABELS "${T_LABELS}"
      ENVIRONMENT "${XSHARD_MPI_ENV}")
    if(T_PASS_REGULAR_EXPRESSION)
      set_tests_properties(${test} PROPERTIES PASS_REGULAR_EXPRESSION "${T_PASS_REGULAR_EXPRESSION}")
    endif()
  endforeach()
endfunction()

# xshard_add_compile_fail_test(NAME name SOURCE file REGEX message)
# A test that passes when `file` fails to compile with a diagnostic matching `message`.
function(xshard_add_compile_fail_test)
  cmake_parse_arguments(T "" "NAME;SOURCE;REGEX" "" ${ARGN})
  set(target compile_fail_${T_NAME})
  add_library(${target} OBJECT EXCLUDE_FROM_ALL ${T_SOURCE})
  target_link_libraries(${target} PRIVATE xshard::xshard)
  add_test(NAME compile_fail.${T_NAME}
    COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target ${target})
  set_tests_properties(compile_fail.${T_NAME} PROPERTIES
    PASS_REGULAR_EXPRESSION "${T_REGEX}" RESOURCE_LOCK build_tree LABELS compile_fail
    TIMEOUT 300)
endfunction()
