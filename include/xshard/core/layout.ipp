#pragma once
/// \file
/// The definitions of what core/layout.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/core/layout.hpp>

namespace xshard {

XSHARD_DECL void layout::validate(const mesh_shape& mesh) const {
    switch (check(mesh.names)) {
    case layout_problem::none:
        return;
    case layout_problem::axis_used_twice:
        throw std::invalid_argument("xshard: the layout " + to_string() +
                                    " uses a mesh axis twice");
    case layout_problem::unknown_axis:
        throw std::invalid_argument("xshard: the layout " + to_string() +
                                    " names an axis the mesh(" + mesh.to_string() +
                                    ") does not have");
    }
}

XSHARD_DECL std::string layout::to_string() const {
    std::string s = "[";
    for (std::size_t d = 0; d < dims.size(); ++d) {
        if (d > 0)
            s += ", ";
        const auto& axes = dims[d];
        if (axes.empty())
            s += '-';
        else if (axes.size() == 1)
            s += axes[0].view();
        else {
            s += '(';
            for (std::size_t i = 0; i < axes.size(); ++i) {
                if (i)
                    s += ',';
                s += axes[i].view();
            }
            s += ')';
        }
    }
    s += ']';
    if (is_partial()) {
        s += " partial(";
        s += xshard::to_string(op);
        s += ':';
        for (std::size_t i = 0; i < partial.size(); ++i)
            s += (i ? ", " : " ") + std::string(partial[i].view());
        s += ')';
    }
    return s;
}

} // namespace xshard

namespace std {

XSHARD_DECL std::size_t hash<xshard::layout>::operator()(const xshard::layout& l) const noexcept {
    const auto name = [](const xshard::axis_name& a) {
        return std::hash<std::string_view>{}(a.view());
    };
    std::size_t h = l.dynamic ? 0x9e3779b97f4a7c15ULL : 0;
    const auto mix = [&](std::size_t x) {
        h ^= x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    };
    for (const auto& d : l.dims) {
        mix(d.size());
        for (const auto& a : d)
            mix(name(a));
    }
    std::size_t partial = 0; // commutative: partial axes in any order
    for (const auto& a : l.partial)
        partial += name(a);
    mix(partial);
    if (!l.partial.empty())
        mix(std::size_t(l.op));
    return h;
}

} // namespace std
