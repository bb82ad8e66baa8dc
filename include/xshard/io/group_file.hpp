#pragma once
/// \file
/// Communication-group files (MindSpore's set_group_ckpt_save_file): the groups a mesh's
/// collectives run over, one per non-empty set of mesh axes, each with its rank lists. JSON:
///
///     {"format": "xshard-groups", "version": 1,
///      "mesh": {"axes": ["dp", "tp"], "sizes": [2, 2]},
///      "groups": [{"axes": ["dp"], "ranks": [[0, 2], [1, 3]]}, ...]}
///
/// Ranks are the mesh's (its communicator's) ranks, row-major as in core/mesh.hpp. The
/// envelope (format, version, mesh) is io/json_envelope.hpp's.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/io/everywhere.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/json_envelope.hpp>

#include <nlohmann/json.hpp>

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
    static constexpr int current_version = 1;
    /// The envelope of group files (io/json_envelope.hpp).
    static constexpr json_file_kind kind{"xshard-groups", current_version, "group file"};
    std::vector<std::string> axes;
    std::vector<int> sizes;
    std::vector<comm_group_entry> groups;
    friend bool operator==(const comm_group_file&, const comm_group_file&) = default;

    /// The groups of a mesh shape: every non-empty set of its axes, in increasing bit order.
    static comm_group_file of(const mesh_shape& shape);

    std::string to_json() const;

    /// Parses a group file's text (read from `path`); throws io_error naming the file and
    /// what is wrong.
    static comm_group_file from_json(const std::string& text, const std::string& path);
};

/// Writes the groups of `mesh` to `path` (durably, atomically): rank 0 of the mesh writes,
/// the others wait. Collective over the mesh (one agreement); an I/O error raises io_error on
/// every rank (detail::on_rank0).
template <mesh_type Mesh>
void save_group_file(const std::string& path, const Mesh& mesh) {
    detail::on_rank0(mesh.comm(), [&] {
        detail::write_file_atomically(path, comm_group_file::of(mesh.shape()).to_json());
    });
}

/// Reads a group file (no communication).
inline comm_group_file load_group_file(const std::string& path) {
    return comm_group_file::from_json(detail::read_file(path), path);
}

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/group_file.ipp>
#endif
