#pragma once
/// \file
/// Where optimizer sharding (hsdp) puts a weight's data-parallel axes: the layout that
/// train/hsdp.hpp shards a weight's state to, and that search/cost.hpp prices. One rule, so that
/// the search prices the layout that runs.

#include <xshard/core/axis.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>

#include <cstddef>
#include <span>

namespace xshard {

/// The sharded layout of a tensor laid out as `value` with global `shape`: the mesh axes
/// `axes` (which `value` must not use) appended, in mesh order, to the axes of the dimension
/// whose block (the product over dimensions of the largest pieces) then comes out smallest
/// (the lowest such dimension). `value` itself when `axes` is empty or the tensor has rank 0.
/// No communication.
inline layout sharded_layout(const layout& value, const mesh_shape& mesh,
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
