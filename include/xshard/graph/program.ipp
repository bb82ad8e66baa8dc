#pragma once
/// \file
/// The definitions of what graph/program.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/graph/program.hpp>

namespace xshard {

XSHARD_DECL std::string shape_text(const value_shape& s) {
    std::string t = "(";
    for (std::size_t i = 0; i < s.size(); ++i)
        t += (i ? ", " : "") + std::to_string(s[i]);
    return t + (s.size() == 1 ? ",)" : ")");
}

} // namespace xshard

