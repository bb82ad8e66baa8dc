#pragma once
/// \file
/// The definitions of what train/hsdp_units.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/train/hsdp_units.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL hsdp_units::hsdp_units(std::vector<hsdp_entry> &entries,
                                   hsdp_timings &timings, int level)
    : entries_(&entries), timings_(&timings), level_(level) {}

XSHARD_DECL hsdp_unit& hsdp_units::of_weight(const std::string& name) {
    const auto p = name.substr(0, name.find('.'));
    if (const auto u = find(p))
        return units_[*u];
    index_[p] = units_.size();
    units_.push_back({});
    units_.back().prefix = p;
    return units_.back();
}

} // namespace detail
} // namespace xshard
