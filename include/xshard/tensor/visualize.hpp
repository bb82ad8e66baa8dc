#pragma once
/// \file
/// Drawing which ranks hold which block of a tensor (like jax.debug.visualize_array_sharding).

#include <xshard/comm/watch.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace xshard {

namespace detail {

inline std::string centered(const std::string& text, std::size_t width) {
    const std::size_t pad = width > text.size() ? width - text.size() : 0;
    return std::string(pad / 2, ' ') + text + std::string(pad - pad / 2, ' ');
}

} // namespace detail

/// A text grid of the blocks of a tensor of global shape `shape` laid out as `l` on `mesh`,
/// along dimensions `row_dim` and `col_dim` (the column dimension alone for a rank-1
/// tensor): each cell shows the ranks holding (part of) the block and its global index
/// ranges. A rank-0 tensor is one cell. No communication.
template <std::size_t N>
std::string draw_sharding(const layout& l, const mesh_shape& mesh,
                          const std::array<std::size_t, N>& shape, std::size_t row_dim = 0,
                          std::size_t col_dim = 1) {
    if constexpr (N == 1) {
        row_dim = col_dim = 0;
    } else if constexpr (N >= 2) {
        if (row_dim >= N || col_dim >= N || row_dim == col_dim)
            throw std::invalid_argument("xshard: draw_sharding: pick two distinct dimensions of "
                                        "the tensor");
    }
    const bool two_d = N >= 2;
    // Cells: the distinct (row block, column block) pairs, in order of their offsets.
    std::vector<std::size_t> row_starts, col_starts;
    for (int r = 0; r < mesh.size(); ++r) {
        const auto b = block_of(l, mesh, shape, r);
        if (b.empty())
            continue;
        if constexpr (N > 0) {
            row_starts.push_back(b.offset[row_dim]);
            col_starts.push_back(b.offset[col_dim]);
        }
    }
    auto unique_sorted = [](std::vector<std::size_t>& v) {
        std::sort(v.begin(), v.end());
        v.erase(std::unique(v.begin(), v.end()), v.end());
    };
    unique_sorted(row_starts);
    unique_sorted(col_starts);
    if (!two_d)
        row_starts.assign(1, 0);
    if (N == 0)
        col_starts.assign(1, 0);

    struct cell {
        std::vector<int> ranks;
        std::string range;
    };
    std::vector<std::vector<cell>> grid(row_starts.size(), std::vector<cell>(col_starts.size()));
    auto index_of = [](const std::vector<std::size_t>& v, std::size_t x) {
        return std::size_t(std::lower_bound(v.begin(), v.end(), x) - v.begin());
    };
    for (int r = 0; r < mesh.size(); ++r) {
        const auto b = block_of(l, mesh, shape, r);
        if (b.empty())
            continue;
        std::size_t i = 0, j = 0;
        std::string range = "[]";
        if constexpr (N > 0) {
            i = two_d ? index_of(row_starts, b.offset[row_dim]) : 0;
            j = index_of(col_starts, b.offset[col_dim]);
            auto span = [&](std::size_t d) {
                return std::to_string(b.offset[d]) + ":" +
                       std::to_string(b.offset[d] + b.extent[d]);
            };
            range = "[" + (two_d ? span(row_dim) + ", " : std::string()) + span(col_dim) + "]";
        }
        auto& c = grid[i][j];
        c.range = range;
        c.ranks.push_back(r);
    }

    auto holders = [](const cell& c) {
        return c.ranks.empty()
                   ? std::string()
                   : (c.ranks.size() == 1 ? "rank " : "ranks ") + detail::rank_list(c.ranks);
    };
    std::size_t width = 0;
    for (auto& row : grid)
        for (auto& c : row)
            width = std::max({width, c.range.size(), holders(c).size()});
    width += 2;
    std::string rule = "+";
    for (std::size_t j = 0; j < col_starts.size(); ++j)
        rule += std::string(width, '-') + "+";
    std::string out =
        l.to_string() + " " + detail::shape_string(shape) + " on mesh(" + mesh.to_string() + ")";
    if constexpr (N > 2)
        out += ", dims " + std::to_string(row_dim) + " x " + std::to_string(col_dim);
    out += "\n" + rule + "\n";
    for (auto& row : grid) {
        std::string names = "|", ranges = "|";
        for (auto& c : row) {
            names += detail::centered(holders(c), width) + "|";
            ranges += detail::centered(c.range, width) + "|";
        }
        out += names + "\n" + ranges + "\n" + rule + "\n";
    }
    return out;
}

/// The drawing of a distributed tensor's layout (see above).
template <class D>
requires distributed<D> std::string draw_sharding(const D& t, std::size_t row_dim = 0,
                                                  std::size_t col_dim = 1) {
    return draw_sharding(t.layout(), t.mesh().shape(), t.shape(), row_dim, col_dim);
}

} // namespace xshard
