#pragma once
/// \file
/// The definitions of what optim/optimizers.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/optim/optimizers.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL std::string optim_number(double x) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", x);
    return text;
}

XSHARD_DECL void require_nonnegative(std::string_view who, std::string_view option, double value) {
    if (!(std::isfinite(value) && value >= 0))
        throw error("xshard: " + std::string(who) + ": " + std::string(option) +
                    " must be a finite number >= 0, not " + optim_number(value));
}

XSHARD_DECL void require_unit(std::string_view who, std::string_view option, double value) {
    if (!(value >= 0 && value < 1))
        throw error("xshard: " + std::string(who) + ": " + std::string(option) +
                    " must lie in [0, 1), not " + optim_number(value));
}

} // namespace detail

} // namespace xshard

