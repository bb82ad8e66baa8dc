#pragma once
/// \file
/// The geometry of optimizer sharding (train/hsdp.hpp): the ranks a weight's update is split
/// over under `hsdp_options::shard_size`, as a set of mesh axes of which some are cut into
/// copies of consecutive ranks (hybrid sharding over part of the data-parallel group), and
/// where a rank sits in such a cut. Arithmetic on mesh shapes only: no communication.

#include <xshard/comm/error.hpp>
#include <xshard/core/axis.hpp>
#include <xshard/core/mesh_shape.hpp>

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace xshard::detail {

/// The ranks a weight's update is split over (see hsdp_axes): `axes`, a set of mesh axes,
/// of which those in `parts` only in part: axis a of part (a, inner) is cut into copies of
/// `inner` consecutive ranks (coordinates [o inner, (o + 1) inner) for copy o), and a copy
/// of the state is one such block of every part's axis (with the whole other axes), each
/// copy holding the whole sharded state, replicated across the copies (hybrid sharding over
/// part of the group). The state then lives on the mesh of one copy: the mesh with each
/// part's axis of size `inner`.
struct hsdp_group {
    axis_set axes;
    std::vector<std::pair<int, int>> parts; ///< (axis, inner), by axis
    bool empty() const noexcept { return axes.empty(); }
};

/// Where the rank at `coords` of `mesh` sits when the axes of `parts` are cut into copies
/// (hsdp_group): the copy (its index `outer`, counting the parts' blocks row-major in axis
/// order), the copy's mesh shape, and the rank's coordinates in it.
struct hsdp_copy {
    int outer = 0;
    mesh_shape shape;
    mesh_coords coords;
};

inline hsdp_copy hsdp_copy_of(const mesh_shape& mesh, mesh_coords coords,
                              const std::vector<std::pair<int, int>>& parts) {
    hsdp_copy c{0, mesh, coords};
    for (const auto& [axis, inner] : parts) {
        const auto a = std::size_t(axis);
        c.outer = c.outer * (mesh.sizes[a] / inner) + coords[a] / inner;
        c.shape.sizes[a] = inner;
        c.coords[a] = coords[a] % inner;
    }
    return c;
}

/// The axes of `replicated` of more than one rank: a weight's data-parallel group.
inline axis_set data_parallel_axes(axis_set replicated, const mesh_shape& mesh) {
    axis_set group;
    for (std::size_t i = 0; i < mesh.ndim(); ++i)
        if (replicated.contains(i) && mesh.sizes[i] > 1)
            group = group.with(i);
    return group;
}

/// The subset of `axes` whose sizes multiply to `size` and that is minor-most (the largest
/// bit pattern: the subsets are visited largest index first), if there is one.
inline std::optional<axis_set> minor_most_subset_of_size(axis_set axes, const mesh_shape& mesh,
                                                         int size) {
    std::optional<axis_set> best;
    for (std::uint32_t bits = axes.bits;; bits = (bits - 1) & axes.bits) {
        const axis_set s{bits};
        if (mesh.group_size(s) == size && (!best || s.bits > best->bits))
            best = s;
        if (bits == 0)
            break;
    }
    return best;
}

/// `shard_size` ranks as a set of whole axes of `group` and `inner` consecutive ranks of one
/// more (the minor-most such choice: dp = 4 with shard_size 2 splits dp into copies of 2),
/// if there is one.
inline std::optional<hsdp_group> whole_axes_and_part_of_one(axis_set group, const mesh_shape& mesh,
                                                            int shard_size) {
    for (std::size_t a = mesh.ndim(); a-- > 0;) {
        if (!group.contains(a))
            continue;
        const axis_set rest{group.bits & ~axis_set::of(a).bits};
        std::optional<axis_set> whole;
        int inner = 0;
        for (std::uint32_t bits = rest.bits;; bits = (bits - 1) & rest.bits) {
            const axis_set s{bits};
            const int w = mesh.group_size(s);
            if (shard_size % w == 0) {
                const int k = shard_size / w;
                if (k > 1 && k < mesh.sizes[a] && mesh.sizes[a] % k == 0 &&
                    (!whole || s.bits > whole->bits)) {
                    whole = s;
                    inner = k;
                }
            }
            if (bits == 0)
                break;
        }
        if (whole)
            return hsdp_group{whole->with(a), {{int(a), inner}}};
    }
    return std::nullopt;
}

/// `shard_size` ranks as parts of several axes of `group`, minor axes first, each the
/// greatest common divisor of what remains and the axis ((4, 9) with shard_size 6 takes 3 of
/// 9 and 2 of 4; this needs 36 ranks or more). shard_size divides the group's size, so every
/// prime factor it takes is left in some axis.
inline hsdp_group parts_of_several_axes(axis_set group, const mesh_shape& mesh, int shard_size,
                                        const std::string& name) {
    hsdp_group g;
    int left = shard_size;
    for (std::size_t a = mesh.ndim(); a-- > 0 && left > 1;) {
        if (!group.contains(a))
            continue;
        const int k = std::gcd(left, mesh.sizes[a]);
        if (k == 1)
            continue;
        g.axes = g.axes.with(a);
        if (k < mesh.sizes[a])
            g.parts.insert(g.parts.begin(), {int(a), k});
        left /= k;
    }
    if (left != 1) // unreachable: shard_size divides the group
        throw error("xshard: hsdp: shard_size " + std::to_string(shard_size) + " for weight '" +
                    name + "' does not factor over the mesh " + mesh.to_string());
    return g;
}

/// The mesh axes (a subset of `replicated`, sizes > 1) a weight's update is split over under
/// `shard_size`: all of them for -1, else the set whose sizes multiply to shard_size (the
/// minor-most such set); when no set of whole axes has that size, a set of whole axes and
/// the `inner` consecutive ranks of one more axis; when neither exists, parts of several
/// axes. Empty: the weight stays unsharded. Throws xshard::error when shard_size does not
/// divide the group.
inline hsdp_group hsdp_axes(axis_set replicated, const mesh_shape& mesh, int shard_size,
                            const std::string& name) {
    const axis_set group = data_parallel_axes(replicated, mesh);
    const int size = mesh.group_size(group);
    if (shard_size == -1 || size == 1)
        return {group, {}};
    if (size % shard_size != 0)
        throw error("xshard: hsdp: shard_size " + std::to_string(shard_size) +
                    " does not divide the data-parallel group of weight '" + name + "' (" +
                    std::to_string(size) + " ranks)");
    if (shard_size == 1)
        return {};
    if (const auto whole = minor_most_subset_of_size(group, mesh, shard_size))
        return {*whole, {}};
    if (auto part = whole_axes_and_part_of_one(group, mesh, shard_size))
        return std::move(*part);
    return parts_of_several_axes(group, mesh, shard_size, name);
}

} // namespace xshard::detail
