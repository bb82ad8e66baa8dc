# The packages xshard's target needs: included by the build and by xshardConfig.cmake,
# so the two lists cannot drift apart.
include(CMakeFindDependencyMacro)
find_dependency(xtensor REQUIRED)
find_dependency(xsimd REQUIRED)
find_dependency(xtensor-blas REQUIRED)
find_dependency(BLAS REQUIRED)
find_dependency(MPI REQUIRED COMPONENTS CXX)
find_dependency(range-v3 REQUIRED)
find_dependency(nlohmann_json REQUIRED)
find_dependency(ZLIB REQUIRED)
# A save closes the checkpoint it replaced on a thread of its own (io/files.hpp).
find_dependency(Threads REQUIRED)
# libdeflate's CRC-32 (twice zlib's speed, same values) for checkpoints; it ships no CMake
# package in Debian, only a pkg-config file.
find_dependency(PkgConfig REQUIRED)
if(NOT TARGET PkgConfig::libdeflate)
  pkg_check_modules(libdeflate REQUIRED IMPORTED_TARGET GLOBAL libdeflate)
endif()
# oneDNN (libdnnl-dev) for the convolution kernels (ops/conv_kernels.hpp). Found by library
# and header: Debian's dnnl-config.cmake requires OpenCL's development files for its GPU
# runtime, which the CPU kernels never use.
if(NOT TARGET xshard::dnnl)
  find_library(XSHARD_DNNL_LIBRARY NAMES dnnl REQUIRED)
  find_path(XSHARD_DNNL_INCLUDE_DIR NAMES dnnl.hpp REQUIRED)
  add_library(xshard::dnnl UNKNOWN IMPORTED)
  set_target_properties(xshard::dnnl PROPERTIES IMPORTED_LOCATION "${XSHARD_DNNL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${XSHARD_DNNL_INCLUDE_DIR}")
endif()
