# Helpers for xshard's own tests, examples and benchmarks (not installed).

find_package(GTest REQUIRED)
# clang, where installed: the io fuzzer's libFuzzer build and the examples' clang check.
find_program(XSHARD_CLANGXX NAMES clang++ clang++-19 clang++-16 clang++-15 clang++-14)

# Warnings for xshard's own code (third-party headers come in as system includes).
function(xshard_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic $<$<BOOL:${XSHARD_WERROR}>:-Werror>)
endfunction()

# GCC collects its garbage each time its heap doubles past 128 MiB, which xshard's template-heavy
# units do many times over: starting at 1 GiB and growing by 400 % makes them compile faster
# (train_mlp 34 -> 31 CPU s, auto_parallel 131 -> 104) for more memory per compile
# (train_mlp 1.5 -> 1.9 GB, auto_parallel 3.1 -> 4.9 GB). docs/installation.md gives users
# the same flags.
option(XSHARD_GCC_LARGE_HEAP "Give GCC a larger heap before it collects (faster compiles)" ON)
if(XSHARD_GCC_LARGE_HEAP AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  add_compile_options(--param=ggc-min-expand=400 --param=ggc-min-heapsize=1048576)
endif()

# The environment Open MPI needs here: running as root, more ranks than cores. When a rank
# exits with a failure status, mpirun ends the job's other processes at once instead of
# granting each a second after SIGTERM: a test that expects the failure ends 2 s sooner.
set(XSHARD_MPI_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_odls_base_sigkill_timeout=0
    OPENBLAS_NUM_THREADS=1)

# The world sizes an MPI test program runs at by default: powers of two and two that are
# not (3 and 6, so that meshes of 3, 2 x 3 and 3 x 2 ranks are tested too).
set(XSHARD_TEST_RANKS 1 2 3 4 6 8)

# Timeouts are multiplied by this (scripts/test.sh --sanitize sets 3: instrumented code
# runs slower).
set(XSHARD_TEST_TIMEOUT_SCALE 1 CACHE STRING "Factor applied to every test timeout")

set(XSHARD_CHECK_OUTPUT ${CMAKE_CURRENT_LIST_DIR}/xshard_check_output.cmake)

# xshard_checked_command(out [EXPECT re] [EXPECT_FILE file] [EXPECT_ONCE re] [EXIT status]
#                       COMMAND command args...)
# Sets `out` to a command line that runs `command` and passes when it exits with `status` (0
# by default) and its output matches `re` (contains the text of `file`, matches the
# EXPECT_ONCE pattern exactly once): both the status and the output count.
function(xshard_checked_command out)
  cmake_parse_arguments(C "" "EXPECT;EXPECT_FILE;EXPECT_ONCE;EXIT" "COMMAND" ${ARGN})
  set(defines)
  foreach(option EXPECT EXPECT_ONCE EXIT)
    if(DEFINED C_${option})
      list(APPEND defines "-D${option}=${C_${option}}")
    endif()
  endforeach()
  if(C_EXPECT_FILE)
    list(APPEND defines "-DEXPECT_FILE=${C_EXPECT_FILE}")
  endif()
  set(${out} ${CMAKE_COMMAND} ${defines} -P ${XSHARD_CHECK_OUTPUT} -- ${C_COMMAND} PARENT_SCOPE)
endfunction()

# xshard_add_mpi_test(NAME name COMMAND target [ARGS ...] [RANKS n...] [TIMEOUT s]
#                     [LABELS l...] [PASS_REGULAR_EXPRESSION re] [EXPECT_FILE file]
#                     [EXPECT_ONCE re] [EXIT status])
# Registers `name.npN` for each N (XSHARD_TEST_RANKS by default): the target run under mpirun
# with N ranks, with a timeout so that a deadlock fails instead of hanging. TIMEOUT is for up
# to 4 ranks; runs on 6 and 8 ranks (oversubscribed here) get twice as long. With
# PASS_REGULAR_EXPRESSION, EXPECT_FILE or EXPECT_ONCE the test checks the exit status (EXIT,
# 0 by default) and the output (xshard_checked_command).
function(xshard_add_mpi_test)
  cmake_parse_arguments(T "" "NAME;COMMAND;TIMEOUT;PASS_REGULAR_EXPRESSION;EXPECT_FILE;EXPECT_ONCE;EXIT"
    "ARGS;RANKS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  if(NOT T_RANKS)
    set(T_RANKS ${XSHARD_TEST_RANKS})
  endif()
  foreach(n IN LISTS T_RANKS)
    set(test ${T_NAME}.np${n})
    set(command ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} --oversubscribe
                ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${T_COMMAND}> ${T_ARGS})
    if(DEFINED T_PASS_REGULAR_EXPRESSION OR T_EXPECT_FILE OR DEFINED T_EXPECT_ONCE)
      set(expect)
      if(DEFINED T_PASS_REGULAR_EXPRESSION)
        list(APPEND expect EXPECT "${T_PASS_REGULAR_EXPRESSION}")
      endif()
      foreach(option EXPECT_ONCE EXIT)
        if(DEFINED T_${option})
          list(APPEND expect ${option} "${T_${option}}")
        endif()
      endforeach()
      xshard_checked_command(command ${expect} EXPECT_FILE "${T_EXPECT_FILE}" COMMAND ${command})
    endif()
    math(EXPR timeout "${T_TIMEOUT} * ${XSHARD_TEST_TIMEOUT_SCALE}")
    if(n GREATER 4)
      math(EXPR timeout "2 * ${timeout}")
    endif()
    add_test(NAME ${test} COMMAND ${command})
    set_tests_properties(${test} PROPERTIES
      TIMEOUT ${timeout} PROCESSORS ${n} LABELS "${T_LABELS}"
      ENVIRONMENT "${XSHARD_MPI_ENV}")
  endforeach()
endfunction()

# A test program's files compile as one translation unit (CMake's unity build): the headers
# they share are then parsed, and the templates they share instantiated and compiled, once per
# program instead of once per file. Off, each file compiles alone (quicker when editing one).
option(XSHARD_UNITY_TESTS "Compile each test program's files as one translation unit" ON)

# xshard_test_program(name sources...): an MPI GoogleTest program (with the rank-aware main
# and the helpers of tests/support).
function(xshard_test_program name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE xshard_test_main)
  set_target_properties(${name} PROPERTIES UNITY_BUILD ${XSHARD_UNITY_TESTS}
    UNITY_BUILD_BATCH_SIZE 0)
  xshard_warnings(${name})
endfunction()

# xshard_mpi_test(name SOURCES file... [RANKS n...] [TIMEOUT s] [LABELS l...] [ARGS ...])
# An MPI GoogleTest program built from SOURCES and run by ctest as `<label>.npN` at every
# rank count of RANKS (XSHARD_TEST_RANKS by default). The label (the folder's name by
# default) names the tests. Adding a test file to a program is one line in SOURCES.
function(xshard_mpi_test name)
  cmake_parse_arguments(T "" "TIMEOUT;TEST" "SOURCES;RANKS;LABELS;ARGS" ${ARGN})
  get_filename_component(folder ${CMAKE_CURRENT_SOURCE_DIR} NAME)
  if(NOT T_TEST)
    set(T_TEST ${folder})
  endif()
  if(NOT T_LABELS)
    set(T_LABELS ${folder})
  endif()
  if(NOT TARGET ${name})
    xshard_test_program(${name} ${T_SOURCES})
  endif()
  xshard_add_mpi_test(NAME ${T_TEST} COMMAND ${name} ARGS ${T_ARGS} RANKS ${T_RANKS}
    TIMEOUT ${T_TIMEOUT} LABELS ${T_LABELS})
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
