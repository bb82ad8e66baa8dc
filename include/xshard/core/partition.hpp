#pragma once
/// \file
/// Block partition arithmetic: which part of a tensor each rank holds.
///
/// A global extent n split k ways gives block i the extent n / k, plus one for the first
/// n % k blocks (so extents differ by at most one and the larger blocks come first), at
/// offset i * (n / k) + min(i, n % k). When n < k the last k - n blocks are empty. Every
/// rank computes every rank's blocks from the layout, the mesh shape and the global
/// shape alone, without communication.

#include <xshard/comm/datatype.hpp>
#include <xshard/comm/subarray.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/volume.hpp>

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <string>
#include <vector>

namespace xshard {

/// The extent of block `i` of `n` elements split `k` ways.
constexpr std::size_t block_extent(std::size_t n, std::size_t k, std::size_t i) {
    return n / k + (i < n % k ? 1 : 0);
}

/// The offset of block `i` of `n` elements split `k` ways.
constexpr std::size_t block_offset(std::size_t n, std::size_t k, std::size_t i) {
    return i * (n / k) + std::min(i, n % k);
}

/// The block of `n` elements split `k` ways that holds element `x` (x < n).
constexpr std::size_t block_holding(std::size_t n, std::size_t k, std::size_t x) {
    const std::size_t big = n / k + 1; // extent of the first n % k blocks
    const std::size_t in_big = (n % k) * big;
    return x < in_big ? x / big : n % k + (x - in_big) / (n / k);
}

/// A box of a rank-N tensor: per dimension an offset and an extent.
template <std::size_t N>
struct box {
    std::array<std::size_t, N> offset{};
    std::array<std::size_t, N> extent{};

    /// The number of elements (throws `xshard::error` when it does not fit a std::size_t).
    constexpr std::size_t size() const { return volume(extent); }
    constexpr bool empty() const { return size() == 0; }

    /// The intersection with `other` (extents 0 where they do not meet).
    constexpr box intersect(const box& other) const {
        box r;
        for (std::size_t d = 0; d < N; ++d) {
            const auto lo = std::max(offset[d], other.offset[d]);
            const auto hi = std::min(offset[d] + extent[d], other.offset[d] + other.extent[d]);
            r.offset[d] = lo;
            r.extent[d] = hi > lo ? hi - lo : 0;
        }
        return r;
    }

    friend constexpr bool operator==(const box&, const box&) = default;
};

/// The block of a tensor of global shape `shape` with layout `l` that the rank at
/// coordinates `c` of `mesh` holds.
template <std::size_t N>
constexpr box<N> block_of(const layout& l, const mesh_shape& mesh,
                          const std::array<std::size_t, N>& shape, const mesh_coords& c) {
    box<N> b;
    for (std::size_t d = 0; d < N; ++d) {
        const auto k = std::size_t(l.split_count(d, mesh));
        const auto i = std::size_t(l.block_index(d, mesh, c));
        b.offset[d] = block_offset(shape[d], k, i);
        b.extent[d] = block_extent(shape[d], k, i);
    }
    return b;
}

/// The block rank `rank` of `mesh` holds.
template <std::size_t N>
constexpr box<N> block_of(const layout& l, const mesh_shape& mesh,
                          const std::array<std::size_t, N>& shape, int rank) {
    return block_of(l, mesh, shape, mesh.coords(rank));
}

/// The ranks holding global element `index` (all the ranks along replicated and
/// partial axes of its block), in increasing order.
template <std::size_t N>
std::vector<int> ranks_holding(const layout& l, const mesh_shape& mesh,
                               const std::array<std::size_t, N>& shape,
                               const std::array<std::size_t, N>& index) {
    // Fix the coordinates of the splitting axes from the block index of each dimension;
    // the other axes are free.
    mesh_coords c;
    c.count = mesh.ndim();
    for (std::size_t d = 0; d < N; ++d) {
        const auto& axes = l.axes(d);
        auto block = block_holding(shape[d], std::size_t(l.split_count(d, mesh)), index[d]);
        for (std::size_t j = axes.size(); j-- > 0;) {
            const auto a = mesh.index(axes[j]);
            c[a] = int(block % std::size_t(mesh.sizes[a]));
            block /= std::size_t(mesh.sizes[a]);
        }
    }
    return mesh.group_ranks(mesh.rank_of(c), mesh.all_axes() - l.split_axes(mesh));
}

namespace detail {

/// "(6, 5)".
template <class Shape>
std::string shape_string(const Shape& shape) {
    std::string s = "(";
    std::size_t i = 0;
    for (auto e : shape)
        s += (i++ ? ", " : "") + std::to_string(e);
    return s + (i == 1 ? ",)" : ")");
}

/// The MPI datatype of box `b` inside a row-major array of shape `shape`, for any extents
/// (comm/subarray.hpp).
template <class T, std::size_t N>
derived_datatype box_datatype(const std::array<std::size_t, N>& shape, const box<N>& b) {
    return subarray_datatype(shape, b.offset, b.extent, datatype_of<T>());
}

} // namespace detail

} // namespace xshard
