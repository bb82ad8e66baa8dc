#pragma once
/// \file
/// The definitions of what core/annotation.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/core/annotation.hpp>

namespace xshard {

XSHARD_DECL std::string op_annotation::to_string() const {
    std::string s;
    if (!in_strategies.empty()) {
        s = "(";
        for (std::size_t i = 0; i < in_strategies.size(); ++i)
            s += (i ? ", " : "") + in_strategies[i].to_string();
        s += in_strategies.size() == 1 ? ",)" : ")";
    }
    for (std::size_t i = 0; i < in_layouts.size(); ++i)
        s += (i ? ", " : "in ") + in_layouts[i].to_string();
    for (std::size_t i = 0; i < out_layouts.size(); ++i)
        s += (i ? ", " : (s.empty() ? "out " : " out ")) + out_layouts[i].to_string();
    return s;
}

} // namespace xshard
