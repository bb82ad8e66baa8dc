#pragma once
/// \file
/// The definitions of what comm/subarray.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/comm/subarray.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL MPI_Aint to_aint(std::size_t n) {
    if (n > std::size_t(std::numeric_limits<MPI_Aint>::max()))
        throw error("xshard: a byte offset " + std::to_string(n) + " exceeds MPI_Aint");
    return static_cast<MPI_Aint>(n);
}

XSHARD_DECL std::size_t extent_of(MPI_Datatype type) {
    MPI_Count lb = 0, extent = 0;
    check_mpi(MPI_Type_get_extent_x(type, &lb, &extent), "MPI_Type_get_extent_x");
    return static_cast<std::size_t>(extent);
}

XSHARD_DECL derived_datatype strided(std::size_t count, std::size_t stride, MPI_Datatype element,
                                     std::size_t limit) {
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

XSHARD_DECL derived_datatype box_from_vectors(std::span<const std::size_t> shape,
                                              std::span<const std::size_t> offset,
                                              std::span<const std::size_t> extent,
                                              MPI_Datatype element,
                                              std::size_t limit) {
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

XSHARD_DECL derived_datatype subarray_datatype(std::span<const std::size_t> shape,
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

} // namespace xshard

