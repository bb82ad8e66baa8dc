#pragma once
/// \file
/// Derived datatypes for boxes of row-major arrays and for long runs of bytes, safe for
/// counts beyond `INT_MAX` (MPI's count arguments are `int`): the one place xshard builds
/// the datatype of a block, for redistribution and gathers alike.

#include <xshard/compiled.hpp>
#include <xshard/comm/datatype.hpp>
#include <xshard/comm/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <limits>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace xshard {

namespace detail {

/// The largest count passed to one MPI datatype constructor: counts above it are split.
inline constexpr std::size_t max_type_count = std::size_t(INT_MAX);

XSHARD_DECL MPI_Aint to_aint(std::size_t n);

/// The extent in bytes of `type` (its upper minus its lower bound).
XSHARD_DECL std::size_t extent_of(MPI_Datatype type);

/// `count` copies of `element`, `stride` bytes apart (an hvector), for any count: a count
/// above `limit` becomes a vector of whole groups of `limit` plus one for the rest.
XSHARD_DECL derived_datatype strided(std::size_t count, std::size_t stride, MPI_Datatype element,
                                     std::size_t limit = max_type_count);

/// The box (`offset`, `extent`) of a row-major array of `shape` made of `element`s, built
/// from hvectors (any counts); `limit` is for tests of the split.
XSHARD_DECL derived_datatype box_from_vectors(std::span<const std::size_t> shape,
                                              std::span<const std::size_t> offset,
                                              std::span<const std::size_t> extent,
                                              MPI_Datatype element,
                                              std::size_t limit = max_type_count);

} // namespace detail

/// The datatype of the box (`offset`, `extent`) inside a row-major array of `shape` whose
/// elements are `element`: what MPI_Type_create_subarray (MPI_ORDER_C) gives, with the whole
/// array's extent, but for extents and offsets of any size (MPI's are `int`) and for empty
/// boxes (no data). Preconditions: equal lengths, offset + extent <= shape per dimension.
XSHARD_DECL derived_datatype subarray_datatype(std::span<const std::size_t> shape,
                                               std::span<const std::size_t> offset,
                                               std::span<const std::size_t> extent,
                                               MPI_Datatype element);

/// `bytes` consecutive bytes (MPI_BYTE), for any count.
inline derived_datatype byte_run_datatype(std::size_t bytes) {
    return derived_datatype::contiguous_large(bytes, MPI_BYTE);
}

/// The box (`offset`, `extent`) of a row-major array of `shape` whose elements are
/// `element_bytes` bytes, as bytes (for files and untyped buffers); see subarray_datatype.
inline derived_datatype byte_subarray_datatype(std::span<const std::size_t> shape,
                                               std::span<const std::size_t> offset,
                                               std::span<const std::size_t> extent,
                                               std::size_t element_bytes) {
    const auto element = byte_run_datatype(element_bytes);
    return subarray_datatype(shape, offset, extent, element.native());
}

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/comm/subarray.ipp>
#endif
