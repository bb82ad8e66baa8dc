#pragma once
/// \file
/// MindSpore strategies: split counts per tensor dimension, e.g. (2, 4), resolved against
/// a mesh into layouts.
///
/// The rule is MindSpore's device matrix. With p ranks and counts (s0, ..., s(r-1)) whose
/// product q divides p, the ranks form the row-major device matrix
/// [p / q, s0, ..., s(r-1)]: the leading p / q is *repeated computation* (those ranks hold
/// the same blocks). On a mesh, whose ranks are row-major too, each count must therefore be
/// the product of a run of consecutive mesh axes, matched from the last axis backwards:
/// the last dimension takes the trailing axes whose sizes multiply to its count, the
/// dimension before it the axes before those, and so on; a count of 1 takes none; the
/// leading axes left over are replicated. On mesh(dp=2, mp=4):
///
///     (2, 4) -> [dp, mp]      (8, 1) -> [(dp,mp), -]      (4, 1) -> [mp, -]   (dp repeats)
///     (1, 2) -> error: count 2 of dimension 1 fits no run of axes ending at mp (size 4)
///
/// Axes of size 1 are never used.

#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/static_vector.hpp>

#include <cstddef>
#include <initializer_list>
#include <ostream>
#include <stdexcept>
#include <string>

namespace xshard {

/// Split counts per tensor dimension.
struct strategy {
    static_vector<int, max_tensor_rank> counts;

    constexpr strategy() = default;
    constexpr strategy(std::initializer_list<int> c)
        : counts(c) {}

    constexpr std::size_t rank() const { return counts.size(); }

    /// The number of ranks that hold distinct blocks (the product of the counts).
    constexpr int blocks() const {
        int n = 1;
        for (int c : counts)
            n *= c;
        return n;
    }

    /// "(2, 4)".
    std::string to_string() const {
        std::string s = "(";
        for (std::size_t i = 0; i < counts.size(); ++i)
            s += (i ? ", " : "") + std::to_string(counts[i]);
        return s + (counts.size() == 1 ? ",)" : ")");
    }

    friend std::ostream& operator<<(std::ostream& os, const strategy& s) {
        return os << s.to_string();
    }
    friend constexpr bool operator==(const strategy&, const strategy&) = default;
};

/// The layout of strategy `s` on `mesh` (see the file comment for the rule). Throws
/// std::invalid_argument naming the count that fits no axis.
constexpr layout resolve(const strategy& s, const mesh_shape& mesh) {
    for (int c : s.counts)
        if (c < 1)
            throw std::invalid_argument("xshard: strategy " + s.to_string() +
                                        ": split counts must be at least 1");
    if (mesh.size() % s.blocks() != 0)
        throw std::invalid_argument("xshard: strategy " + s.to_string() + " needs " +
                                    std::to_string(s.blocks()) + " blocks, which do not divide " +
                                    "the " + std::to_string(mesh.size()) + " ranks of mesh(" +
                                    mesh.to_string() + ")");
    layout l = layout::replicated(s.rank());
    std::size_t next = mesh.ndim(); // mesh axes [next, ndim) are taken
    for (std::size_t d = s.rank(); d-- > 0;) {
        dim_axes axes; // collected minor to major, reversed below
        int product = 1;
        while (product < s.counts[d] && next > 0) {
            --next;
            if (mesh.sizes[next] == 1)
                continue;
            product *= mesh.sizes[next];
            axes.push_back(mesh.names[next]);
        }
        if (product != s.counts[d])
            throw std::invalid_argument(
                "xshard: strategy " + s.to_string() + ": count " + std::to_string(s.counts[d]) +
                " of dimension " + std::to_string(d) +
                " fits no run of mesh axes (matched from the last axis of mesh(" +
                mesh.to_string() + ") backwards)");
        for (std::size_t i = axes.size(); i-- > 0;)
            l.dims[d].push_back(axes[i]);
    }
    return l;
}

} // namespace xshard
