#pragma once
/// \file
/// The definitions of what io/group_file.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/group_file.hpp>

namespace xshard {

XSHARD_DECL comm_group_file comm_group_file::of(const mesh_shape& shape) {
    comm_group_file f;
    for (std::size_t i = 0; i < shape.ndim(); ++i) {
        f.axes.emplace_back(shape.names[i].view());
        f.sizes.push_back(shape.sizes[i]);
    }
    const int n = shape.group_size(shape.all_axes());
    for (std::uint32_t bits = 1; bits < (1u << shape.ndim()); ++bits) {
        axis_set axes;
        axes.bits = bits;
        comm_group_entry e;
        for (std::size_t i = 0; i < shape.ndim(); ++i)
            if (axes.contains(i))
                e.axes.push_back(f.axes[i]);
        std::set<std::vector<int>> seen;
        for (int r = 0; r < n; ++r)
            if (auto g = shape.group_ranks(r, axes); seen.insert(g).second)
                e.ranks.push_back(std::move(g));
        f.groups.push_back(std::move(e));
    }
    return f;
}

XSHARD_DECL std::string comm_group_file::to_json() const {
    nlohmann::ordered_json j;
    detail::write_envelope(j, kind, detail::mesh_json(axes, sizes));
    j["groups"] = nlohmann::ordered_json::array();
    for (const auto& g : groups)
        j["groups"].push_back({{"axes", g.axes}, {"ranks", g.ranks}});
    return j.dump(1) + "\n";
}

XSHARD_DECL comm_group_file comm_group_file::from_json(const std::string& text,
                                                       const std::string& path) {
    return detail::read_json_file(kind, path, [&] {
        const auto doc = detail::read_envelope(text, kind);
        comm_group_file f;
        for (std::size_t i = 0; i < doc.mesh.ndim(); ++i) {
            f.axes.emplace_back(doc.mesh.names[i].view());
            f.sizes.push_back(doc.mesh.sizes[i]);
        }
        for (const auto& g : doc.json.at("groups"))
            f.groups.push_back({g.at("axes").get<std::vector<std::string>>(),
                                g.at("ranks").get<std::vector<std::vector<int>>>()});
        return f;
    });
}

} // namespace xshard
