#pragma once
/// \file
/// The definitions of what data/views.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/data/views.hpp>

namespace xshard::data {

XSHARD_DECL std::vector<index_type> permutation(std::size_t n, std::uint64_t seed,
                                                std::uint64_t epoch) {
    std::vector<index_type> order(detail::checked_index(n, "shuffle"));
    std::iota(order.begin(), order.end(), index_type{0});
    auto engine = seeded_engine(seed, epoch);
    for (std::size_t i = n; i > 1; --i)
        std::swap(order[i - 1], order[uniform_below(engine, i)]);
    return order;
}

} // namespace xshard::data

