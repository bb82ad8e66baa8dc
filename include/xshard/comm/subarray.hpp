#pragma once
/// \file
/// Derived datatypes for boxes of row-major arrays and for long runs of bytes, safe for
/// counts beyond `INT_MAX` (MPI's count arguments are `int`): the one place xshard builds
/// the datatype of a block, for redistribution and gathers alike.

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

inline MPI_Aint to_aint(std::size_t n) {
    if (n > std::size_t(std::numeric_limits<MPI_Aint>::max()))
        throw error("xshard: a byte offset " + std::to_string(n) + " exceeds MPI_Aint");
    return static_cast<MPI_Aint>(n);
}

/// The extent in bytes of `type` (its upper minus its lower bound).
inline std::size_t extent_of(MPI_Datatype type) {
    MPI_Count lb = 0, extent = 0;
    check_mpi(MPI_Type_get_extent_x(type, &lb, &extent), "MPI_Type_get_extent_x");
    return static_cast<std::size_t>(extent);
}

/// `count` copies of `element`, `stride` bytes apart (an hvector), for any count: a count
/// above `limit` becomes a vector of whole groups of `limit` plus one for the rest.
inline derived_datatype strided(std::size_t count, std::size_t stride, MPI_Datatype element,
                                std::size_t limit = max_type_count) {
    MPI_Datatype type = MPI_DATATYPE_NULL;
    limit = std::max<std::size_t>(limit, 2); // so that the groups are fewer than the elements
    if (count <= limit) {
        check_mpi(MPI_Type_create_hvector(int(count), 1, to_aint(stride), element, &type),
                  "MPI_Type_create_hvector");
        return derived_datatype(type);
    }
    const std::size_t groups = count / limit, rest = count % limit;
    const auto group = strided(limit, stride, element, limit);
    const auto whole = strided(groups, stride * limit, group.native(), limit);
    const auto tail = strided(rest, stride, element, limit);
    int lengths[2] = {1, 1};
    MPI_Aint at[2] = {0, to_aint(stride * limit * groups)};
    MPI_Datatype parts[2] = {whole.native(), tail.native()};
    check_mpi(MPI_Type_create_struct(rest ? 2 : 1, lengths, at, parts, &type),
              "MPI_Type_create_struct");
    return derived_datatype(type);
}

/// The box (`offset`, `extent`) of a row-major array of `shape` made of `element`s, built
/// from hvectors (any counts); `limit` is for tests of the split.
inline derived_datatype box_from_vectors(std::span<const std::size_t> shape,
                                         std::span<const std::size_t> offset,
                                         std::span<const std::size_t> extent,
                                         MPI_Datatype element,
                                         std::size_t limit = max_type_count) {
    const std::size_t n = shape.size(), size = extent_of(element);
    std::vector<std::size_t> stride(n, size);
    for (std::size_t d = n; d-- > 1;)
        stride[d - 1] = stride[d] * shape[d];
    std::size_t total = n ? stride[0] * shape[0] : size, at = 0;
    for (std::size_t d = 0; d < n; ++d)
        at += offset[d] * stride[d];
    derived_datatype inner = strided(1, size, element, limit);
    for (std::size_t d = n; d-- > 0;)
        inner = strided(extent[d], stride[d], inner.native(), limit);
    // Placed at its offset, with the whole array's extent (as MPI_Type_create_subarray does).
    MPI_Datatype placed = MPI_DATATYPE_NULL, resized = MPI_DATATYPE_NULL;
    int one = 1;
    MPI_Aint where = to_aint(at);
    MPI_Datatype t = inner.native();
    check_mpi(MPI_Type_create_struct(1, &one, &where, &t, &placed), "MPI_Type_create_struct");
    const derived_datatype p(placed);
    check_mpi(MPI_Type_create_resized(p.native(), 0, to_aint(total), &resized),
              "MPI_Type_create_resized");
    return derived_datatype(resized);
}

} // namespace detail

/// The datatype of the box (`offset`, `extent`) inside a row-major array of `shape` whose
/// elements are `element`: what MPI_Type_create_subarray (MPI_ORDER_C) gives, with the whole
/// array's extent, but for extents and offsets of any size (MPI's are `int`) and for empty
/// boxes (no data). Preconditions: equal lengths, offset + extent <= shape per dimension.
inline derived_datatype subarray_datatype(std::span<const std::size_t> shape,
                                          std::span<const std::size_t> offset,
                                          std::span<const std::size_t> extent,
                                          MPI_Datatype element) {
    if (shape.size() != offset.size() || shape.size() != extent.size())
        throw error("xshard: subarray_datatype: shape, offset and extent differ in length");
    bool fits = true, empty = false;
    for (std::size_t d = 0; d < shape.size(); ++d) {
        if (offset[d] > shape[d] || extent[d] > shape[d] - offset[d])
            throw error("xshard: subarray_datatype: the box does not fit the array");
        fits = fits && shape[d] <= detail::max_type_count;
        empty = empty || extent[d] == 0;
    }
    if (empty)
        return derived_datatype::contiguous(0, element);
    if (shape.empty())
        return derived_datatype::contiguous(1, element);
    if (!fits)
        return detail::box_from_vectors(shape, offset, extent, element);
    std::vector<int> sizes, subsizes, starts;
    for (std::size_t d = 0; d < shape.size(); ++d) {
        sizes.push_back(int(shape[d]));
        subsizes.push_back(int(extent[d]));
        starts.push_back(int(offset[d]));
    }
    return derived_datatype::subarray(sizes, subsizes, starts, element);
}

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
