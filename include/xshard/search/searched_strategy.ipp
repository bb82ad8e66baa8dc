#pragma once
/// \file
/// The definitions of what search/searched_strategy.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/search/searched_strategy.hpp>

namespace xshard {

XSHARD_DECL std::vector<std::size_t> searched_strategy::stage_starts() const {
    std::vector<std::size_t> starts;
    for (std::size_t i = 1; i < stage_of.size(); ++i)
        if (stage_of[i] != stage_of[i - 1])
            starts.push_back(i);
    return starts;
}

} // namespace xshard
