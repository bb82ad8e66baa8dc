# cmake -DEXIT=<status> -P expect_exit.cmake <command> <args...>: runs the command, prints
# its stdout and stderr unchanged, and fails unless it exits with <status>.
set(command)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE 4 ${last})
  list(APPEND command "${CMAKE_ARGV${i}}")
endforeach()
execute_process(COMMAND ${command} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
execute_process(COMMAND ${CMAKE_COMMAND} -E echo_append "${out}${err}")
if(NOT status EQUAL EXIT)
  message(FATAL_ERROR "exit status ${status}, expected ${EXIT}")
endif()
