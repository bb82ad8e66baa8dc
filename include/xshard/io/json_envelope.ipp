#pragma once
/// \file
/// The definitions of what io/json_envelope.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/json_envelope.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL mesh_shape parse_mesh(const nlohmann::json& mesh) {
    if (!mesh.is_object())
        throw io_error("xshard: a mesh is not an object");
    const auto* axes = mesh.contains("axes") ? &mesh["axes"] : nullptr;
    const auto* sizes = mesh.contains("sizes") ? &mesh["sizes"] : nullptr;
    if (!axes || !sizes || !axes->is_array() || !sizes->is_array() ||
        axes->size() != sizes->size() || axes->size() > max_mesh_axes)
        throw io_error("xshard: the mesh needs lists of at most " + std::to_string(max_mesh_axes) +
                       " axes and as many sizes");
    static_vector<axis_name, max_mesh_axes> names;
    static_vector<int, max_mesh_axes> counts;
    std::size_t ranks = 1;
    for (std::size_t i = 0; i < axes->size(); ++i) {
        const auto& a = (*axes)[i];
        if (!a.is_string() || !is_valid_axis_name(a.get<std::string>()))
            throw io_error("xshard: mesh axis " + a.dump() + " is not an axis name");
        names.push_back(axis_name(a.get<std::string>()));
        counts.push_back(int(json_count((*sizes)[i], "a mesh size", 1, INT_MAX)));
        ranks = checked_mul(ranks, std::size_t(counts.back()), "the mesh's size");
    }
    if (ranks > std::size_t(INT_MAX))
        throw io_error("xshard: a mesh of " + std::to_string(ranks) + " ranks");
    try {
        return mesh_shape(names, counts);
    } catch (const std::invalid_argument& e) {
        throw io_error(e.what()); // (an axis named twice)
    }
}

XSHARD_DECL json_document read_envelope(std::string_view text, const json_file_kind& kind) {
    json_document doc;
    try {
        doc.json = parse_json(text);
    } catch (const io_error& e) {
        throw io_error("xshard: malformed " + std::string(kind.description) + ": " +
                       std::string(without_prefix(e.what())));
    }
    const auto& j = doc.json;
    if (!j.is_object() || !j.contains("format") || !j["format"].is_string() ||
        j["format"].get<std::string>() != kind.format)
        throw io_error("xshard: not an xshard " + std::string(kind.description) +
                       " (no \"format\": \"" + std::string(kind.format) + "\")");
    if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != kind.version)
        throw io_error("xshard: " + std::string(kind.description) + " version " +
                       (j.contains("version") ? j["version"].dump() : "(none)") +
                       " is not supported (this xshard reads version " +
                       std::to_string(kind.version) + ")");
    if (kind.has_mesh) {
        if (!j.contains("mesh"))
            throw io_error("xshard: the " + std::string(kind.description) + " has no mesh");
        doc.mesh = parse_mesh(j["mesh"]);
    }
    return doc;
}

} // namespace detail

} // namespace xshard

