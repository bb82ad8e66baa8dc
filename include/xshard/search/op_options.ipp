#pragma once
/// \file
/// The definitions of what search/op_options.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/search/op_options.hpp>

namespace xshard {

XSHARD_DECL std::vector<std::pair<weight_split, layout>>
op_options(const op_spec& op, activation_split in, int dp, int tp, std::size_t samples) {
    using enum activation_split;
    std::vector<std::pair<weight_split, layout>> r;
    const auto keep = [&] {
        r.push_back({weight_split::replicated, activation_layout(in)});
    };
    switch (op.kind) {
    case op_kind::linear:
        if (in == rows) {
            r.push_back({weight_split::output, layout::parse("[dp, tp]")});
            r.push_back({weight_split::replicated, layout::parse("[dp, -]")});
        } else if (in == features) {
            r.push_back({weight_split::input, layout::parse("[dp, -] partial(sum: tp)")});
        } else {
            keep();
        }
        break;
    case op_kind::embedding: // the input is token ids: rows, whatever their features
        if (in == all_rows)
            keep();
        else {
            r.push_back({weight_split::replicated, layout::parse("[dp, -]")});
            r.push_back({weight_split::output, layout::parse("[dp, tp]")});
            r.push_back({weight_split::input, layout::parse("[dp, -] partial(sum: tp)")});
        }
        break;
    case op_kind::elementwise:
        keep();
        break;
    case op_kind::normalization:
        if (in != features)
            keep();
        break;
    case op_kind::attention:
        if (in == rows || (in == features && op.heads % std::size_t(tp) == 0) ||
            (in == all_rows && samples % std::size_t(dp * tp) == 0))
            keep();
        break;
    }
    return r;
}

} // namespace xshard

