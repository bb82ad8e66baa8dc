#pragma once
// Generators of layouts and shapes for property tests, and the partition rule written out
// element by element (an expectation independent of core/partition.hpp).

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

/// Whether the rank at mesh coordinates `coords` holds global element `index` in layout
/// `l`, from the partition rule as the design states it (n elements split k ways: block i
/// has n / k elements, one more for the first n % k blocks, dealt out in order; the axes of
/// a dimension number the blocks major to minor), written here independently of
/// core/partition.hpp.
template <std::size_t N>
bool holds(const layout& l, const mesh_shape& mesh, const std::array<std::size_t, N>& shape,
           const std::vector<int>& coords, const std::array<std::size_t, N>& index) {
    for (std::size_t d = 0; d < N; ++d) {
        std::size_t k = 1, i = 0;
        for (const auto& a : l.dims[d]) {
            std::size_t pos = 0;
            while (!(mesh.names[pos] == a))
                ++pos;
            k *= std::size_t(mesh.sizes[pos]);
            i = i * std::size_t(mesh.sizes[pos]) + std::size_t(coords[pos]);
        }
        const std::size_t n = shape[d];
        std::size_t lo = 0;
        for (std::size_t j = 0; j < i; ++j)
            lo += n / k + (j < n % k ? 1 : 0);
        const std::size_t hi = lo + n / k + (i < n % k ? 1 : 0);
        if (index[d] < lo || index[d] >= hi)
            return false;
    }
    return true;
}

/// The coordinates of rank `rank` of `mesh` (row-major: the last axis varies fastest).
inline std::vector<int> coords_of(const mesh_shape& mesh, int rank) {
    std::vector<int> coords(mesh.ndim());
    for (std::size_t a = mesh.ndim(); a-- > 0; rank /= mesh.sizes[a])
        coords[a] = rank % mesh.sizes[a];
    return coords;
}

/// The number of elements of a tensor of `shape` for which `pred(index)` holds, by visiting
/// every element.
template <std::size_t N, class Pred>
std::size_t count_elements(const std::array<std::size_t, N>& shape, Pred&& pred) {
    std::size_t total = 1;
    for (auto e : shape)
        total *= e;
    std::size_t n = 0;
    for (std::size_t flat = 0; flat < total; ++flat) {
        std::array<std::size_t, N> index{};
        std::size_t f = flat;
        for (std::size_t d = N; d-- > 0; f /= shape[d])
            index[d] = f % shape[d];
        n += pred(index) ? 1 : 0;
    }
    return n;
}

/// The elements the rank `rank` of `mesh` holds in `to` but not in `from`: what it must
/// receive, at least.
template <std::size_t N>
std::size_t elements_lacking(const mesh_shape& mesh, const std::array<std::size_t, N>& shape,
                             const layout& from, const layout& to, int rank) {
    const auto coords = coords_of(mesh, rank);
    return count_elements(shape, [&](const std::array<std::size_t, N>& index) {
        return holds(to, mesh, shape, coords, index) && !holds(from, mesh, shape, coords, index);
    });
}

/// The elements the rank `rank` of `mesh` holds in layout `l`.
template <std::size_t N>
std::size_t elements_held(const mesh_shape& mesh, const std::array<std::size_t, N>& shape,
                          const layout& l, int rank) {
    const auto coords = coords_of(mesh, rank);
    return count_elements(shape, [&](const std::array<std::size_t, N>& index) {
        return holds(l, mesh, shape, coords, index);
    });
}

} // namespace xshard::testing
