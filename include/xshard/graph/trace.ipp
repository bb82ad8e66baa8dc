#pragma once
/// \file
/// The definitions of what graph/trace.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/graph/trace.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL trace_state& current_trace(std::string_view what) {
    auto* s = active_trace();
    if (!s)
        throw error("xshard: " + std::string(what) +
                    " is called outside xshard::trace (it records into the program being traced)");
    return *s;
}

XSHARD_DECL std::string scoped_name(const trace_state& s, std::string_view name) {
    std::string out;
    for (const auto& part : s.scopes)
        out += part + ".";
    return out + std::string(name);
}

} // namespace detail

XSHARD_DECL traced_tensor param(std::string_view name, value_shape shape,
                                initializer init) {
    auto& s = detail::current_trace("xshard::param");
    const std::string full = detail::scoped_name(s, name);
    if (auto id = s.target->weight_named(full)) {
        if (s.target->value(*id).shape != shape)
            throw error("xshard: trace: the weight " + full + " is declared with shape " +
                        shape_text(shape) + " after " + shape_text(s.target->value(*id).shape));
        return traced_tensor(s.target, *id);
    }
    const auto id = s.target->add_argument(value_kind::weight, full, std::move(shape),
                                           s.floating.value_or(dtype::f64), init);
    return traced_tensor(s.target, id);
}

} // namespace xshard

