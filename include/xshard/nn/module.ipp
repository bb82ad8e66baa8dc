#pragma once
/// \file
/// The definitions of what nn/module.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/nn/module.hpp>

namespace xshard::nn {

XSHARD_DECL layout make_layout(std::initializer_list<std::string> dims) {
    std::string text = "[";
    for (const auto& d : dims)
        text += (text.size() > 1 ? ", " : "") + (d.empty() ? std::string("-") : d);
    return layout::parse(text + "]");
}

XSHARD_DECL layout with_features(layout l, const std::string& axis) {
    l.dims[1] = axis.empty() ? dim_axes{} : dim_axes{axis_name(axis)};
    l.partial.clear();
    return l;
}

} // namespace xshard::nn

