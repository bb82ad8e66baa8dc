#pragma once
/// \file
/// The definitions of what pipeline/slots.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/pipeline/slots.hpp>

namespace xshard::pipeline::detail {

XSHARD_DECL std::size_t activation_slots::acquire(int stage, int mb) {
    auto& pool = free_[stage];
    std::size_t slot;
    if (pool.empty()) {
        slot = count_[stage]++;
    } else {
        slot = pool.back();
        pool.pop_back();
    }
    slot_of_[{stage, mb}] = slot;
    peak_ = std::max(peak_, ++in_flight_);
    return slot;
}

} // namespace xshard::pipeline::detail
