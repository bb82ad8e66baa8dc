# cmake [-DEXPECT=<regex>] [-DEXPECT_FILE=<file>] [-DEXPECT_ONCE=<regex>] [-DEXIT=<status>]
#       -P xshard_check_output.cmake -- <command> [args...]
# Runs the command, shows its output, and fails unless it exits with EXIT (0 by default) AND
# its output (stdout and stderr together) matches EXPECT, contains EXPECT_FILE's text
# verbatim, and matches EXPECT_ONCE exactly once (a message printed by one rank, not by each).
# (ctest's PASS_REGULAR_EXPRESSION alone ignores the exit status: a program that prints
# "ok" and then crashes would pass.)

set(command)
set(seen_separator FALSE)
foreach(i RANGE 1 ${CMAKE_ARGC})
  if(i EQUAL CMAKE_ARGC)
    break()
  endif()
  if(seen_separator)
    # A ';' inside an argument stays in it (not a list separator).
    string(REPLACE ";" "\\;" argument "${CMAKE_ARGV${i}}")
    list(APPEND command "${argument}")
  elseif("${CMAKE_ARGV${i}}" STREQUAL "--")
    set(seen_separator TRUE)
  endif()
endforeach()
if(NOT command)
  message(FATAL_ERROR "xshard_check_output: no command after --")
endif()

execute_process(COMMAND ${command} RESULT_VARIABLE status OUTPUT_VARIABLE output
  ERROR_VARIABLE output)
# Shown as it was printed, so that ctest --output-on-failure has it.
execute_process(COMMAND ${CMAKE_COMMAND} -E echo_append "${output}")

if(NOT DEFINED EXIT)
  set(EXIT 0)
endif()
if(NOT status STREQUAL "${EXIT}")
  message(FATAL_ERROR "xshard_check_output: the command exited with status '${status}', not ${EXIT}")
endif()
if(DEFINED EXPECT AND NOT output MATCHES "${EXPECT}")
  message(FATAL_ERROR "xshard_check_output: the output does not match the expected pattern:\n${EXPECT}")
endif()
if(DEFINED EXPECT_FILE)
  file(READ "${EXPECT_FILE}" expected)
  string(FIND "${output}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "xshard_check_output: the output does not contain the expected text:\n${expected}")
  endif()
endif()
if(DEFINED EXPECT_ONCE)
  string(REGEX MATCHALL "${EXPECT_ONCE}" found "${output}")
  list(LENGTH found times)
  if(NOT times EQUAL 1)
    message(FATAL_ERROR "xshard_check_output: the output matches ${times} times, not once:\n${EXPECT_ONCE}")
  endif()
endif()
message(STATUS "xshard_check_output: exit status ${EXIT} and the expected output")
