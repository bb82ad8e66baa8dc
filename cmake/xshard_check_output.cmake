# cmake -DEXPECT=<regex> [-DEXPECT_FILE=<file>] -P xshard_check_output.cmake -- <command> [args...]
# Runs the command, shows its output, and fails unless it exits 0 AND its output (stdout and
# stderr together) matches EXPECT, or, with EXPECT_FILE, contains that file's text verbatim.
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

if(NOT status STREQUAL "0")
  message(FATAL_ERROR "xshard_check_output: the command exited with status '${status}'")
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
message(STATUS "xshard_check_output: exit status 0 and the expected output")
