#pragma once
/// \file
/// The definitions of what io/strategy_file.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/strategy_file.hpp>

namespace xshard {

XSHARD_DECL const strategy_entry* strategy_file::find(std::string_view name) const {
    for (const auto& p : parameters)
        if (p.name == name)
            return &p;
    return nullptr;
}

XSHARD_DECL layout_dict strategy_file::layouts() const {
    layout_dict d;
    for (const auto& p : parameters)
        d[p.name] = p.lay;
    return d;
}

XSHARD_DECL std::string strategy_file::to_json() const {
    nlohmann::ordered_json j;
    detail::write_envelope(j, kind, mesh);
    j["pipeline_stages"] = pipeline_stages;
    j["parameters"] = nlohmann::ordered_json::array();
    for (const auto& p : parameters) {
        nlohmann::ordered_json e{{"name", p.name},
                                 {"shape", p.shape},
                                 {"dtype", p.dtype},
                                 {"layout", p.lay.to_string()},
                                 {"trainable", p.trainable}};
        if (p.stage >= 0)
            e["stage"] = p.stage;
        if (p.mesh)
            e["mesh"] = detail::mesh_json(*p.mesh);
        if (!p.ranks.empty())
            e["ranks"] = p.ranks;
        j["parameters"].push_back(std::move(e));
    }
    return j.dump(2) + "\n";
}

XSHARD_DECL strategy_file strategy_file::from_json(std::string_view text,
                                                   const std::string& path) {
    return detail::read_json_file(kind, path, [&] {
        auto doc = detail::read_envelope(text, kind);
        const auto& j = doc.json;
        strategy_file f;
        f.mesh = doc.mesh;
        if (j.contains("pipeline_stages"))
            f.pipeline_stages =
                int(detail::json_count(j["pipeline_stages"], "pipeline_stages", 1, INT_MAX));
        if (!j.contains("parameters") || !j["parameters"].is_array())
            throw io_error("xshard: 'parameters' is not a list");
        std::set<std::string> seen;
        for (const auto& p : j["parameters"])
            f.parameters.push_back(parse_parameter(p, f, seen));
        return f;
    });
}

XSHARD_DECL void strategy_file::check_mesh(const mesh_shape& current) const {
    if (!(mesh == current))
        throw io_error("xshard: the strategy file's mesh(" + mesh.to_string() +
                       ") does not fit this mesh(" + current.to_string() + ")");
}

XSHARD_DECL strategy_entry strategy_file::parse_parameter(const nlohmann::json& p,
                                                          const strategy_file& f,
                                                          std::set<std::string>& seen) {
    if (!p.is_object() || !p.contains("name") || !p["name"].is_string() ||
        !p.contains("dtype") || !p["dtype"].is_string() || !p.contains("layout") ||
        !p["layout"].is_string() || !p.contains("shape") || !p["shape"].is_array())
        throw io_error("xshard: a parameter needs a string name, dtype and layout and a "
                       "list shape: " +
                       p.dump().substr(0, 200));
    strategy_entry e;
    e.name = p["name"].get<std::string>();
    const auto name = "parameter '" + detail::printable(e.name) + "'";
    if (!seen.insert(e.name).second)
        throw io_error("xshard: " + name + " appears twice");
    if (e.name == "__metadata__")
        throw io_error("xshard: " + name + " is reserved by safetensors");
    if (p["shape"].size() > max_tensor_rank)
        throw io_error("xshard: " + name + " has more than " + std::to_string(max_tensor_rank) +
                       " dimensions");
    for (const auto& d : p["shape"])
        e.shape.push_back(std::size_t(detail::json_count(d, "a dimension of " + name)));
    e.dtype = p["dtype"].get<std::string>();
    if (dtype_size(e.dtype) == 0)
        throw io_error("xshard: " + name + " has unknown dtype '" + detail::printable(e.dtype) +
                       "'");
    // Its size in bytes must be representable.
    checked_mul(volume(e.shape), dtype_size(e.dtype), "a parameter's size");
    e.lay = layout::parse(p["layout"].get<std::string>());
    if (p.contains("trainable")) {
        if (!p["trainable"].is_boolean())
            throw io_error("xshard: " + name + "'s 'trainable' is not true or false");
        e.trainable = p["trainable"].get<bool>();
    }
    if (p.contains("stage"))
        e.stage = int(detail::json_count(p["stage"], "the stage of " + name, 0, INT_MAX));
    if (p.contains("mesh"))
        e.mesh = detail::parse_mesh(p["mesh"]);
    if (p.contains("ranks"))
        e.ranks = parse_ranks(p["ranks"], e, f, name);
    if (e.lay.rank() != e.shape.size())
        throw io_error("xshard: " + name + " has a layout of another rank than its shape");
    e.lay.validate(f.mesh_of(e));
    return e;
}

XSHARD_DECL std::vector<int> strategy_file::parse_ranks(const nlohmann::json& r,
                                                        const strategy_entry& e,
                                                        const strategy_file& f,
                                                        const std::string& name) {
    if (!e.mesh || !r.is_array() || r.size() != std::size_t(e.mesh->size()))
        throw io_error("xshard: " + name +
                       "'s 'ranks' is not a list of one rank per rank of its own mesh");
    // The file's ranks: a pipeline's stages each have the file's mesh's size.
    const std::size_t file_ranks = std::size_t(f.mesh.size()) * std::size_t(f.pipeline_stages);
    std::vector<int> ranks;
    std::set<int> distinct;
    for (const auto& k : r) {
        ranks.push_back(int(detail::json_count(k, "a rank of " + name, 0, file_ranks - 1)));
        if (!distinct.insert(ranks.back()).second)
            throw io_error("xshard: " + name + "'s 'ranks' names rank " +
                           std::to_string(ranks.back()) + " twice");
    }
    return ranks;
}

} // namespace xshard
