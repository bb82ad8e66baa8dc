#pragma once
/// \file
/// The definitions of what core/op_choice.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/core/op_choice.hpp>

namespace xshard {

XSHARD_DECL std::optional<activation_split> parse_activation_split(std::string_view text) {
    const auto l = layout::parse(text);
    for (auto a : activation_splits)
        if (layout::parse(to_string(a)) == l)
            return a;
    return std::nullopt;
}

XSHARD_DECL std::optional<weight_split> parse_weight_split(std::string_view text) {
    for (auto w : {weight_split::replicated, weight_split::output, weight_split::input})
        if (text == to_string(w))
            return w;
    return std::nullopt;
}

XSHARD_DECL layout weight_layout(weight_split w) {
    switch (w) {
    case weight_split::output:
        return layout::parse("[-, tp]");
    case weight_split::input:
        return layout::parse("[tp, -]");
    default:
        return layout::parse("[-, -]");
    }
}

} // namespace xshard

