#pragma once
/// \file
/// The definitions of what pipeline/action.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/pipeline/action.hpp>

namespace xshard::pipeline {

XSHARD_DECL schedule_kind parse_schedule(std::string_view text) {
    for (auto k : {schedule_kind::gpipe, schedule_kind::one_f_one_b, schedule_kind::interleaved,
                   schedule_kind::zero_bubble})
        if (text == name(k))
            return k;
    if (text == "zbh1" || text == "zb" || text == "zero-bubble")
        return schedule_kind::zero_bubble;
    throw error(detail::concat("xshard: unknown pipeline schedule '", text,
                               "' (known: gpipe, 1f1b, interleaved, zero_bubble)"));
}

} // namespace xshard::pipeline

