#pragma once
/// \file
/// The definitions of what comm/datatype.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/comm/datatype.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL int to_int_count(std::size_t n) {
    if (n > std::size_t(INT_MAX))
        throw error("xshard: a count of " + std::to_string(n) + " exceeds MPI's int limit");
    return int(n);
}

} // namespace detail

} // namespace xshard

