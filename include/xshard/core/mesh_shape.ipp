#pragma once
/// \file
/// The definitions of what core/mesh_shape.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/core/mesh_shape.hpp>

namespace xshard {

XSHARD_DECL std::vector<int> mesh_shape::group_ranks(int rank, axis_set axes) const {
    std::vector<int> ranks;
    auto c = coords(rank);
    const int n = group_size(axes);
    ranks.reserve(std::size_t(n));
    for (int g = 0; g < n; ++g) {
        int rest = g;
        for (std::size_t i = ndim(); i-- > 0;) {
            if (!axes.contains(i))
                continue;
            c[i] = rest % sizes[i];
            rest /= sizes[i];
        }
        ranks.push_back(rank_of(c));
    }
    return ranks;
}

XSHARD_DECL std::string
mesh_shape::describe(const static_vector<axis_name, max_mesh_axes>& axis_names,
                     const static_vector<int, max_mesh_axes>& axis_sizes) {
    std::string text;
    for (std::size_t i = 0; i < axis_names.size(); ++i) {
        if (i > 0)
            text += ", ";
        text += axis_names[i].view();
        text += '=';
        text += i < axis_sizes.size() && axis_sizes[i] != auto_size
                    ? std::to_string(axis_sizes[i])
                    : std::string("?");
    }
    return text;
}

} // namespace xshard
