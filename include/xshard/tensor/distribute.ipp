#pragma once
/// \file
/// The definitions of what tensor/distribute.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/tensor/distribute.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL bool holds_term(const layout& l, const mesh_shape& mesh, const mesh_coords& c) {
    if (l.op != reduction::sum)
        return true;
    for (const auto& a : l.partial)
        if (c[mesh.index(a)] != 0)
            return false;
    return true;
}

} // namespace detail

} // namespace xshard

