#pragma once
/// \file
/// The definitions of what search/machine_model.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/search/machine_model.hpp>

namespace xshard {

XSHARD_DECL double machine_model::scale_of(std::string_view op) const {
    for (const auto& [name, f] : op_scale)
        if (name == op)
            return f;
    return 1.0;
}

XSHARD_DECL void machine_model::set_scale_of(std::string_view op, double factor) {
    for (auto& [name, f] : op_scale)
        if (name == op) {
            f = factor;
            return;
        }
    op_scale.emplace_back(std::string(op), factor);
}

} // namespace xshard
