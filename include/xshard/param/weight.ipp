#pragma once
/// \file
/// The definitions of what param/weight.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/param/weight.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL layout without_unit_sums(const layout& l, const mesh_shape& mesh) {
    if (!l.is_partial())
        return l;
    layout out = l;
    out.partial.clear();
    for (const auto& a : l.partial)
        if (mesh.sizes[mesh.index(a)] > 1)
            out.partial.push_back(a);
    if (out.partial.empty())
        out.op = reduction::sum;
    return out;
}

} // namespace detail

} // namespace xshard

