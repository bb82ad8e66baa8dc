#pragma once
/// \file
/// The definitions of what redistribute/traffic.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/redistribute/traffic.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL axis_set axes_of(const mesh_shape& mesh, const dim_axes& names) {
    axis_set s;
    for (const auto& a : names)
        s = s.with(mesh.index(a));
    return s;
}

XSHARD_DECL block_digits digits_of(const layout& l, std::size_t d, const mesh_shape& mesh,
                                   const mesh_coords& c, axis_set group) {
    block_digits b;
    for (const auto& a : l.axes(d)) {
        const auto i = mesh.index(a);
        b.radix.push_back(std::size_t(mesh.sizes[i]));
        b.fixed.push_back(group.contains(i) ? block_digits::free : std::size_t(c[i]));
    }
    return b;
}

} // namespace detail

} // namespace xshard

