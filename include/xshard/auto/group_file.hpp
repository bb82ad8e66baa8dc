#pragma once
/// \file
/// Communication-group files (MindSpore's set_group_ckpt_save_file): the groups a mesh's
/// collectives run over, one per non-empty set of mesh axes, each with its rank lists. JSON:
///
///     {"format": "xshard-groups", "version": 1,
///      "mesh": {"axes": ["dp", "tp"], "sizes": [2, 2]},
///      "groups": [{"axes": ["dp"], "ranks": [[0, 2], [1, 3]]}, ...]}
///
/// Ranks are the mesh's (its communicator's) ranks, row-major as in core/mesh.hpp.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/io/files.hpp>

#include <nlohmann/json.hpp>

#include <optional>
#include <set>
#include <string>
#include <vector>

namespace xshard {

/// One communication group kind: a set of mesh axes and the rank lists of its groups.
struct comm_group_entry {
    std::vector<std::string> axes;
    std::vector<std::vector<int>> ranks;
    friend bool operator==(const comm_group_entry&, const comm_group_entry&) = default;
};

/// The contents of a group file.
struct comm_group_file {
    std::vector<std::string> axes;
    std::vector<int> sizes;
    std::vector<comm_group_entry> groups;
    friend bool operator==(const comm_group_file&, const comm_group_file&) = default;

    /// The groups of a mesh shape: every non-empty set of its axes, in increasing bit order.
    static comm_group_file of(const mesh_shape& shape) {
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

    std::string to_json() const {
        nlohmann::ordered_json j;
        j["format"] = "xshard-groups";
        j["version"] = 1;
        j["mesh"] = {{"axes", axes}, {"sizes", sizes}};
        j["groups"] = nlohmann::ordered_json::array();
        for (const auto& g : groups)
            j["groups"].push_back({{"axes", g.axes}, {"ranks", g.ranks}});
        return j.dump(1) + "\n";
    }

    /// Parses a group file's text; throws io_error naming what is wrong.
    static comm_group_file from_json(const std::string& text, const std::string& path) {
        try {
            const auto j = nlohmann::json::parse(text);
            if (j.at("format").get<std::string>() != "xshard-groups" ||
                j.at("version").get<int>() != 1)
                throw io_error("xshard: " + path + " is not an xshard-groups file of version 1");
            comm_group_file f;
            f.axes = j.at("mesh").at("axes").get<std::vector<std::string>>();
            f.sizes = j.at("mesh").at("sizes").get<std::vector<int>>();
            for (const auto& g : j.at("groups"))
                f.groups.push_back({g.at("axes").get<std::vector<std::string>>(),
                                    g.at("ranks").get<std::vector<std::vector<int>>>()});
            return f;
        } catch (const nlohmann::json::exception& e) {
            throw io_error("xshard: the group file " + path + " is malformed: " + e.what());
        }
    }
};

/// Writes the groups of `mesh` to `path` (durably, atomically): rank 0 of the mesh writes,
/// the others wait. Collective over the mesh (one agreement); an I/O error raises io_error on
/// every rank.
template <mesh_type Mesh>
void save_group_file(const std::string& path, const Mesh& mesh) {
    std::optional<std::string> problem;
    if (mesh.rank() == 0) {
        try {
            detail::write_file_atomically(path, comm_group_file::of(mesh.shape()).to_json());
        } catch (const std::exception& e) {
            problem = e.what();
        }
    }
    agree_on_error<io_error>(mesh.comm(), problem);
}

/// Reads a group file (no communication).
inline comm_group_file load_group_file(const std::string& path) {
    return comm_group_file::from_json(detail::read_file(path), path);
}

} // namespace xshard
