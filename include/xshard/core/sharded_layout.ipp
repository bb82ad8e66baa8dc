#pragma once
/// \file
/// The definitions of what core/sharded_layout.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/core/sharded_layout.hpp>

namespace xshard {

XSHARD_DECL layout sharded_layout(const layout& value, const mesh_shape& mesh,
                                  std::span<const std::size_t> shape, axis_set axes) {
    if (axes.empty() || shape.empty())
        return value;
    const auto g = std::size_t(mesh.group_size(axes));
    std::size_t best_dim = 0, best = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) {
        std::size_t v = 1;
        for (std::size_t e = 0; e < shape.size(); ++e) {
            const auto k = std::size_t(value.split_count(e, mesh)) * (e == d ? g : 1);
            v *= (shape[e] + k - 1) / k;
        }
        if (d == 0 || v < best) {
            best = v;
            best_dim = d;
        }
    }
    layout out = value;
    for (std::size_t i = 0; i < mesh.ndim(); ++i)
        if (axes.contains(i))
            out.dims[best_dim].push_back(mesh.names[i]);
    return out;
}

} // namespace xshard

