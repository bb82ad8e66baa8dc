#pragma once
/// \file
/// The definitions of what data/loader.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/data/loader.hpp>

namespace xshard::data {

namespace detail {

XSHARD_DECL std::vector<index_type> identity_order(std::size_t n) {
    std::vector<index_type> order(checked_index(n, "loader"));
    std::iota(order.begin(), order.end(), index_type{0});
    return order;
}

} // namespace detail

} // namespace xshard::data

