#pragma once
/// \file
/// The definitions of what train/hsdp_group.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/train/hsdp_group.hpp>

namespace xshard::detail {

XSHARD_DECL hsdp_copy hsdp_copy_of(const mesh_shape& mesh, mesh_coords coords,
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

XSHARD_DECL axis_set data_parallel_axes(axis_set replicated, const mesh_shape& mesh) {
    axis_set group;
    for (std::size_t i = 0; i < mesh.ndim(); ++i)
        if (replicated.contains(i) && mesh.sizes[i] > 1)
            group = group.with(i);
    return group;
}

XSHARD_DECL std::optional<axis_set> minor_most_subset_of_size(axis_set axes, const mesh_shape& mesh,
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

XSHARD_DECL std::optional<hsdp_group>
whole_axes_and_part_of_one(axis_set group, const mesh_shape& mesh, int shard_size) {
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

XSHARD_DECL hsdp_group parts_of_several_axes(axis_set group, const mesh_shape& mesh, int shard_size,
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

XSHARD_DECL hsdp_group hsdp_axes(axis_set replicated, const mesh_shape& mesh, int shard_size,
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

