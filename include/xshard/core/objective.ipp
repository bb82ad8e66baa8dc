#pragma once
/// \file
/// The definitions of what core/objective.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/core/objective.hpp>

namespace xshard {

XSHARD_DECL std::string bad_objective_level(std::string_view who, int level) {
    return std::string(who) + " is " + std::string(objective_levels) + ", not " +
           std::to_string(level);
}

} // namespace xshard
