#pragma once
/// \file
/// The envelope of xshard's JSON files: the members every one of them opens with, which say
/// what the file is before anything else is read.
///
///     {"format": "xshard-strategy", "version": 1,
///      "mesh": {"axes": ["dp", "mp"], "sizes": [2, 2]}, ...}
///
/// `format` names the kind of file, `version` the layout of the rest (an integer: this
/// xshard reads and writes one version of each kind), `mesh` the mesh the file was written
/// for (absent from the kinds that have none: a per-rank checkpoint's checkpoint.json).
/// Strategy files, operator strategy files, group files and checkpoint.json are written and
/// read through here, so every kind is checked alike: a file of another kind, of another
/// version, or with a malformed mesh raises io_error naming the file and what is wrong.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/axis.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/io/safetensors.hpp>

#include <nlohmann/json.hpp>

#include <climits>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard {

/// One kind of xshard JSON file: its `"format"` name, the `"version"` this xshard reads and
/// writes, what a message calls it, and whether its envelope holds a mesh.
struct json_file_kind {
    std::string_view format;
    int version = 1;
    std::string_view description;
    bool has_mesh = true;
};

namespace detail {

/// `what`, without the "xshard: " that opens xshard's messages.
inline std::string_view without_prefix(std::string_view what) {
    return what.starts_with("xshard: ") ? what.substr(8) : what;
}

/// A mesh as JSON: {"axes": [names], "sizes": [sizes]}.
template <class Json = nlohmann::ordered_json, class Names, class Sizes>
Json mesh_json(const Names& names, const Sizes& sizes) {
    std::vector<std::string> axes;
    for (const auto& a : names)
        axes.emplace_back(std::string_view(a));
    return Json{{"axes", axes}, {"sizes", std::vector<int>(sizes.begin(), sizes.end())}};
}

/// `mesh` as JSON (mesh_json).
template <class Json = nlohmann::ordered_json>
Json mesh_json(const mesh_shape& mesh) {
    std::vector<std::string_view> names;
    for (const auto& a : mesh.names)
        names.push_back(a.view());
    return mesh_json<Json>(names, mesh.sizes);
}

/// Parses a mesh written by mesh_json strictly: lists of at most max_mesh_axes axis names
/// (no name twice) and as many sizes, each an integer in [1, INT_MAX], whose product fits an
/// int. Throws io_error naming what is wrong.
XSHARD_DECL mesh_shape parse_mesh(const nlohmann::json& mesh);

/// Sets the envelope of a file of `kind` in `j`: "format" and "version", in that order (the
/// mesh, where the kind has one, follows: write_envelope with a mesh).
template <class Json>
void write_envelope(Json& j, const json_file_kind& kind) {
    j["format"] = std::string(kind.format);
    j["version"] = kind.version;
}

/// Sets the envelope of a file of `kind` in `j`: "format", "version" and "mesh" (`mesh`, as
/// mesh_json writes it), in that order.
template <class Json, class Mesh>
void write_envelope(Json& j, const json_file_kind& kind, const Mesh& mesh) {
    write_envelope(j, kind);
    if constexpr (std::is_same_v<Mesh, mesh_shape>)
        j["mesh"] = mesh_json<Json>(mesh);
    else
        j["mesh"] = mesh;
}

/// A file's JSON whose envelope read_envelope checked, and its mesh (empty where the kind has
/// none).
struct json_document {
    nlohmann::json json;
    mesh_shape mesh;
};

/// Parses `text`, a file of `kind`, and checks its envelope strictly: JSON (nested at most
/// max_json_depth levels), an object whose "format" is the kind's, whose "version" is an
/// integer equal to the kind's, and whose "mesh" parse_mesh reads (where the kind has one).
/// Throws io_error "xshard: <what is wrong>"; run it under read_json_file, which names the
/// file.
XSHARD_DECL json_document read_envelope(std::string_view text, const json_file_kind& kind);

/// `parse()`, the reading of a file of `kind` read from `path`, with its errors raised as
/// io_error naming the file: "xshard: <path>: <what>" (with no path, "xshard: <what>"); an
/// exception that is not an io_error (a JSON member of the wrong type) becomes
/// "xshard: <path>: malformed <kind>: <what>".
template <class F>
auto read_json_file(const json_file_kind& kind, const std::string& path, F&& parse) {
    const std::string where = "xshard: " + (path.empty() ? std::string() : path + ": ");
    try {
        return parse();
    } catch (const io_error& e) {
        if (path.empty())
            throw;
        throw io_error(where + std::string(without_prefix(e.what())));
    } catch (const std::exception& e) {
        throw io_error(where + "malformed " + std::string(kind.description) + ": " + e.what());
    }
}

} // namespace detail

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/json_envelope.ipp>
#endif
