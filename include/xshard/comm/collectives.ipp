#pragma once
/// \file
/// The definitions of what comm/collectives.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/comm/collectives.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL std::pair<int, wire_type> wire_count(std::size_t n, MPI_Datatype element) {
    if (n <= static_cast<std::size_t>(INT_MAX))
        return {static_cast<int>(n), wire_type{element, nullptr}};
    auto owner =
        std::make_shared<const derived_datatype>(derived_datatype::contiguous_large(n, element));
    return {1, wire_type{owner->native(), owner}};
}

XSHARD_DECL std::size_t bytes_of(const mpi_buffer& buffer) {
    int size = 0;
    MPI_Type_size(buffer.type, &size);
    return buffer.count * std::size_t(size);
}

} // namespace detail

} // namespace xshard

