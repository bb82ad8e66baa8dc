#pragma once
/// \file
/// The geometry of optimizer sharding (train/hsdp.hpp): the ranks a weight's update is split
/// over under `hsdp_options::shard_size`, as a set of mesh axes of which some are cut into
/// copies of consecutive ranks (hybrid sharding over part of the data-parallel group), and
/// where a rank sits in such a cut. Arithmetic on mesh shapes only: no communication.

#include <xshard/compiled.hpp>
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

XSHARD_DECL hsdp_copy hsdp_copy_of(const mesh_shape& mesh, mesh_coords coords,
                                   const std::vector<std::pair<int, int>>& parts);

/// The axes of `replicated` of more than one rank: a weight's data-parallel group.
XSHARD_DECL axis_set data_parallel_axes(axis_set replicated, const mesh_shape& mesh);

/// The subset of `axes` whose sizes multiply to `size` and that is minor-most (the largest
/// bit pattern: the subsets are visited largest index first), if there is one.
XSHARD_DECL std::optional<axis_set> minor_most_subset_of_size(axis_set axes, const mesh_shape& mesh,
                                                              int size);

/// `shard_size` ranks as a set of whole axes of `group` and `inner` consecutive ranks of one
/// more (the minor-most such choice: dp = 4 with shard_size 2 splits dp into copies of 2),
/// if there is one.
XSHARD_DECL std::optional<hsdp_group>
whole_axes_and_part_of_one(axis_set group, const mesh_shape& mesh, int shard_size);

/// `shard_size` ranks as parts of several axes of `group`, minor axes first, each the
/// greatest common divisor of what remains and the axis ((4, 9) with shard_size 6 takes 3 of
/// 9 and 2 of 4; this needs 36 ranks or more). shard_size divides the group's size, so every
/// prime factor it takes is left in some axis.
XSHARD_DECL hsdp_group parts_of_several_axes(axis_set group, const mesh_shape& mesh, int shard_size,
                                             const std::string& name);

/// The mesh axes (a subset of `replicated`, sizes > 1) a weight's update is split over under
/// `shard_size`: all of them for -1, else the set whose sizes multiply to shard_size (the
/// minor-most such set); when no set of whole axes has that size, a set of whole axes and
/// the `inner` consecutive ranks of one more axis; when neither exists, parts of several
/// axes. Empty: the weight stays unsharded. Throws xshard::error when shard_size does not
/// divide the group.
XSHARD_DECL hsdp_group hsdp_axes(axis_set replicated, const mesh_shape& mesh, int shard_size,
                                 const std::string& name);

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/train/hsdp_group.ipp>
#endif
