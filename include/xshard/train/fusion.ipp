#pragma once
/// \file
/// The definitions of what train/fusion.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/train/fusion.hpp>

namespace xshard {

XSHARD_DECL std::optional<std::string> fusion_threshold::problem(std::size_t n) const {
    if (how == mode::size && !(threshold_mib >= 0))
        return "xshard: comm_fusion: the size threshold must be >= 0 MB";
    if (how == mode::index)
        for (std::size_t k = 0; k < indices.size(); ++k)
            if (indices[k] == 0 || indices[k] >= n || (k > 0 && indices[k] <= indices[k - 1]))
                return "xshard: comm_fusion: index mode needs strictly increasing parameter "
                       "indices in (0, " +
                       std::to_string(n) + "), not " + std::to_string(indices[k]) +
                       " at position " + std::to_string(k);
    return std::nullopt;
}

namespace detail {

XSHARD_DECL void take_layouts(std::vector<param_ref>& refs, const layout_dict* layouts) {
    std::size_t found = 0;
    for (auto& r : refs) {
        layout l = r.lay;
        if (layouts) {
            if (const auto it = layouts->find(r.name); it != layouts->end()) {
                ++found;
                try {
                    it->second.validate(r.mesh);
                    if (it->second.rank() != r.shape.size())
                        throw std::invalid_argument("xshard: the layout " +
                                                    it->second.to_string() +
                                                    " has another rank than the tensor");
                    l = it->second;
                } catch (const std::invalid_argument& e) {
                    r.problem = std::string(e.what()) + " (parameter '" + r.name + "')";
                }
            }
        }
        const auto coords = r.mesh.coords(r.mesh_rank);
        bool given = r.local.size() == r.shape.size();
        for (std::size_t d = 0; given && d < r.local.size(); ++d)
            given = r.local[d] == block_extent(r.shape[d], std::size_t(l.split_count(d, r.mesh)),
                                               std::size_t(l.block_index(d, r.mesh, coords)));
        if (!given)
            r.problem = "xshard: parameter '" + r.name + "' has a local shard of shape " +
                        shape_string(r.local) + ", which its layout " + l.to_string() +
                        " does not give rank " + std::to_string(r.mesh_rank);
        r.lay = l;
        r.replicated = l.replicated_axes(r.mesh);
        r.group = &r.sub(r.replicated);
    }
    if (layouts && found != layouts->size() && !refs.empty()) {
        for (const auto& entry : *layouts)
            if (std::none_of(refs.begin(), refs.end(),
                             [&](const auto& r) { return r.name == entry.first; })) {
                refs.back().problem = "xshard: the layout dictionary names parameter '" +
                                      entry.first + "', which the container does not have";
                break;
            }
    }
}

XSHARD_DECL std::optional<std::string> first_problem(const std::vector<param_ref>& refs) {
    for (const auto& r : refs) {
        if (!r.problem.empty())
            return r.problem;
        if (r.mesh_comm != refs.front().mesh_comm)
            return "xshard: parameter '" + r.name + "' lives on another mesh than '" +
                   refs.front().name + "'";
    }
    return std::nullopt;
}

XSHARD_DECL derived_datatype fused_datatype(const std::vector<param_ref>& refs, const bucket& b) {
    std::vector<std::size_t> lengths;
    std::vector<const void*> addresses;
    for (std::size_t i : b.members) {
        lengths.push_back(refs[i].count);
        addresses.push_back(refs[i].data);
    }
    return derived_datatype::at_addresses(lengths, addresses, refs[b.members.front()].mpi_type);
}

XSHARD_DECL void pack(const std::vector<param_ref>& refs, const bucket& b, std::byte* buffer) {
    for (std::size_t i : b.members) {
        std::memcpy(buffer, refs[i].data, refs[i].bytes());
        buffer += refs[i].bytes();
    }
}

XSHARD_DECL void unpack(const std::vector<param_ref>& refs, const bucket& b,
                        const std::byte* buffer) {
    for (std::size_t i : b.members) {
        std::memcpy(refs[i].data, buffer, refs[i].bytes());
        buffer += refs[i].bytes();
    }
}

} // namespace detail

} // namespace xshard

