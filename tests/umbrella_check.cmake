# cmake -DINCLUDE_DIR=<include> -DCOMPILED_CPP=<src/compiled.cpp> -P umbrella_check.cmake
# The umbrella headers offer everything, each public header once it is placed:
# - every public header of a folder (xshard/<folder>/<name>.hpp) is included by at least one
#   capability header (xshard/<capability>.hpp, e.g. xshard/core.hpp), so that a program can
#   reach it through the capability it belongs to;
# - the everything header xshard/xshard.hpp includes every top-level header (each capability
#   header, xshard/compiled.hpp and xshard/version.hpp), and through them every public header;
# - no umbrella header names a header that does not exist;
# - xshard::compiled's source (COMPILED_CPP) includes every .ipp file and every header that
#   names templates with XSHARD_INSTANTIATE (or its .ipp), and every header that declares
#   functions with XSHARD_DECL has its .ipp (xshard/compiled.hpp).
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

file(STRINGS ${COMPILED_CPP} lines REGEX "^#include <xshard/")
set(compiled)
foreach(line IN LISTS lines)
  string(REGEX REPLACE "^#include <(.*)>.*$" "\\1" file "${line}")
  list(APPEND compiled ${file})
endforeach()
file(GLOB_RECURSE definitions RELATIVE ${INCLUDE_DIR} ${INCLUDE_DIR}/xshard/*.ipp)
foreach(file IN LISTS definitions)
  if(NOT file IN_LIST compiled)
    list(APPEND problems "${COMPILED_CPP} does not include ${file}")
  endif()
endforeach()
foreach(header IN LISTS headers)
  file(READ ${INCLUDE_DIR}/${header} text)
  string(REGEX REPLACE "\\.hpp$" ".ipp" definition ${header})
  if(text MATCHES "\nXSHARD_DECL " AND NOT definition IN_LIST definitions)
    list(APPEND problems "${header} declares with XSHARD_DECL but has no ${definition}")
  endif()
  if(text MATCHES "XSHARD_INSTANTIATE " AND NOT header IN_LIST compiled
     AND NOT definition IN_LIST compiled)
    list(APPEND problems "${header} instantiates with XSHARD_INSTANTIATE but ${COMPILED_CPP} does not include it")
  endif()
endforeach()

if(problems)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "umbrella headers:\n  ${text}")
endif()
list(LENGTH headers count)
list(LENGTH top capabilities)
list(LENGTH definitions compiled_count)
message(STATUS "xshard/xshard.hpp includes all ${capabilities} top-level headers, which include all ${count} public headers; xshard::compiled's source includes all ${compiled_count} .ipp files")
