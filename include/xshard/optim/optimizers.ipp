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

XSHARD_DECL void throw_slot_count(std::string_view who, std::span<const std::string_view> slots,
                                  const std::string& name, std::size_t held) {
    std::string kept;
    for (auto s : slots)
        kept += (kept.empty() ? "" : ", ") + std::string(s);
    throw error("xshard: " + std::string(who) + ": weight '" + name + "' has " +
                std::to_string(held) + " state slot(s) but " + std::string(who) + " keeps " +
                std::to_string(slots.size()) +
                (kept.empty() ? std::string() : " (" + kept + ")") +
                "; another optimizer stepped it: xshard::optim::clear_state(model) drops "
                "its state");
}

} // namespace detail

} // namespace xshard

