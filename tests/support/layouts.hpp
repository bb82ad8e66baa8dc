#pragma once
// Generators of layouts and shapes for property tests.

#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <vector>

namespace xshard::testing {

/// Every layout of a rank-`rank` tensor on `mesh`: each mesh axis splits one dimension
/// (in every order within a dimension), is replicated, or is partial (sum; with
/// `with_max` also layouts whose partial axes take max).
inline std::vector<layout> all_layouts(const mesh_shape& mesh, std::size_t rank,
                                       bool with_max = false) {
    std::vector<layout> out;
    const std::size_t n = mesh.ndim();
    const std::size_t choices =
        rank + 2; // 0..rank-1: a dimension, rank: replicated, rank+1: partial
    std::size_t total = 1;
    for (std::size_t i = 0; i < n; ++i)
        total *= choices;
    for (std::size_t code = 0; code < total; ++code) {
        std::vector<std::size_t> target(n);
        std::size_t c = code;
        for (std::size_t i = 0; i < n; ++i, c /= choices)
            target[i] = c % choices;
        // Axes per dimension, in every order.
        std::vector<std::vector<std::size_t>> per_dim(rank);
        layout base = layout::replicated(rank);
        for (std::size_t i = 0; i < n; ++i) {
            if (target[i] < rank)
                per_dim[target[i]].push_back(i);
            else if (target[i] == rank + 1)
                base.partial.push_back(mesh.names[i]);
        }
        auto add_orders = [&](auto&& self, std::size_t d, layout l) -> void {
            if (d == rank) {
                out.push_back(l);
                if (with_max && l.is_partial()) {
                    l.op = reduction::max;
                    out.push_back(l);
                }
                return;
            }
            auto axes = per_dim[d];
            std::sort(axes.begin(), axes.end());
            do {
                layout next = l;
                for (auto a : axes)
                    next.dims[d].push_back(mesh.names[a]);
                self(self, d + 1, next);
            } while (std::next_permutation(axes.begin(), axes.end()));
        };
        add_orders(add_orders, 0, base);
    }
    return out;
}

/// Shapes of rank N for property tests: even, uneven, and smaller than split counts.
template <std::size_t N>
std::vector<std::array<std::size_t, N>> test_shapes() {
    if constexpr (N == 1)
        return {{8}, {7}, {3}, {1}};
    else if constexpr (N == 2)
        return {{8, 4}, {7, 5}, {3, 1}, {2, 9}};
    else
        return {{4, 2, 8}, {5, 3, 7}, {1, 2, 3}};
}

} // namespace xshard::testing
