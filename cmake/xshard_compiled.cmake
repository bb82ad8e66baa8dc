# xshard::compiled: the code of xshard that depends on no template argument, and the templates
# instantiated for the common element types and ranks, compiled once into a static library
# (include/xshard/compiled.hpp). A program that links it compiles that code no more.
#
# The library is defined where xshard is used (xshard's own CMakeLists.txt, add_subdirectory,
# or find_package's config file) from XSHARD_COMPILED_CPP, so that it is compiled with the
# using project's compiler and options, and only when a target links it. A program links
# either xshard::xshard alone (header-only) or xshard::compiled.
if(NOT TARGET xshard_compiled)
  add_library(xshard_compiled STATIC EXCLUDE_FROM_ALL ${XSHARD_COMPILED_CPP})
  add_library(xshard::compiled ALIAS xshard_compiled)
  set_target_properties(xshard_compiled PROPERTIES OUTPUT_NAME xshard POSITION_INDEPENDENT_CODE ON)
  target_compile_definitions(xshard_compiled PUBLIC XSHARD_SEPARATE_COMPILATION)
  target_link_libraries(xshard_compiled PUBLIC xshard::xshard)
endif()
