# cmake -DINCLUDE_DIR=<include> -P umbrella_check.cmake
# The umbrella headers offer everything, each public header once it is placed:
# - every public header of a folder (xshard/<folder>/<name>.hpp) is included by at least one
#   capability header (xshard/<capability>.hpp, e.g. xshard/core.hpp), so that a program can
#   reach it through the capability it belongs to;
# - the everything header xshard/xshard.hpp includes every top-level header (each capability
#   header and xshard/version.hpp), and through them every public header;
# - no umbrella header names a header that does not exist.
# Fails naming the headers that break a rule.
cmake_policy(SET CMP0057 NEW)
get_filename_component(INCLUDE_DIR "${INCLUDE_DIR}" ABSOLUTE)
file(GLOB_RECURSE headers RELATIVE ${INCLUDE_DIR} ${INCLUDE_DIR}/xshard/*/*.hpp)
file(GLOB top RELATIVE ${INCLUDE_DIR} ${INCLUDE_DIR}/xshard/*.hpp)
list(REMOVE_ITEM top xshard/xshard.hpp)

# The xshard/ headers an umbrella header includes.
function(included_by umbrella out)
  file(STRINGS ${INCLUDE_DIR}/${umbrella} lines REGEX "^#include <xshard/")
  set(found)
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^#include <(.*)>.*$" "\\1" header "${line}")
    list(APPEND found ${header})
  endforeach()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

set(problems)
set(placed)
foreach(capability IN LISTS top)
  included_by(${capability} found)
  foreach(header IN LISTS found)
    if(NOT header IN_LIST headers)
      list(APPEND problems "${capability} includes ${header}, which is not a public header of a folder")
    endif()
  endforeach()
  list(APPEND placed ${found})
endforeach()
foreach(header IN LISTS headers)
  if(NOT header IN_LIST placed)
    list(APPEND problems "${header} is in no capability header (add it to the xshard/<capability>.hpp that covers its folder)")
  endif()
endforeach()

included_by(xshard/xshard.hpp everything)
foreach(capability IN LISTS top)
  if(NOT capability IN_LIST everything)
    list(APPEND problems "xshard/xshard.hpp does not include ${capability}")
  endif()
endforeach()
foreach(header IN LISTS everything)
  if(NOT header IN_LIST top)
    list(APPEND problems "xshard/xshard.hpp includes ${header}, not a top-level header of xshard/")
  endif()
endforeach()

if(problems)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "umbrella headers:\n  ${text}")
endif()
list(LENGTH headers count)
list(LENGTH top capabilities)
message(STATUS "xshard/xshard.hpp includes all ${capabilities} top-level headers, which include all ${count} public headers")
