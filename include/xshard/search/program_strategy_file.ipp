#pragma once
/// \file
/// The definitions of what search/program_strategy_file.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/search/program_strategy_file.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL nlohmann::ordered_json layouts_json(const std::vector<layout>& ls) {
    auto a = nlohmann::ordered_json::array();
    for (const auto& l : ls)
        a.push_back(l.to_string());
    return a;
}

XSHARD_DECL std::vector<layout> parse_layouts(const nlohmann::json& a, const std::string& node) {
    std::vector<layout> ls;
    for (const auto& text : a) {
        try {
            ls.push_back(layout::parse(text.get<std::string>()));
        } catch (const std::invalid_argument& e) {
            throw io_error("xshard: node " + node + ": " + std::string(without_prefix(e.what())));
        }
    }
    return ls;
}

} // namespace detail

XSHARD_DECL std::string program_strategy_json(const program_strategy& s) {
    nlohmann::ordered_json j;
    detail::write_envelope(j, detail::program_strategy_kind, s.mesh);
    j["predicted_step_seconds"] = s.seconds;
    auto nodes = nlohmann::ordered_json::array();
    for (const auto& n : s.nodes) {
        nlohmann::ordered_json e;
        e["name"] = n.node;
        e["op"] = n.op;
        e["in"] = detail::layouts_json(n.layouts.operands);
        if (!n.out_layouts.empty())
            e["out"] = detail::layouts_json(n.out_layouts);
        nodes.push_back(std::move(e));
    }
    j["nodes"] = std::move(nodes);
    return j.dump(1) + "\n";
}

XSHARD_DECL void save_program_strategy(const std::string& path, const program_strategy& s) {
    try {
        detail::write_file_atomically(path, program_strategy_json(s));
    } catch (const io_error&) {
        throw;
    } catch (const std::exception& e) {
        throw io_error("xshard: cannot write the program strategy file " + path + ": " + e.what());
    }
}

XSHARD_DECL program_strategy
parse_program_strategy(std::string_view text, const std::string& path,
                       const std::optional<mesh_shape>& mesh) {
    const auto& kind = detail::program_strategy_kind;
    return detail::read_json_file(kind, path, [&] {
        auto doc = detail::read_envelope(text, kind);
        program_strategy s;
        s.mesh = doc.mesh;
        if (mesh && !(doc.mesh == *mesh))
            throw io_error("xshard: the program strategy file is for mesh(" + doc.mesh.to_string() +
                           "), not this run's mesh(" + mesh->to_string() + ")");
        const auto& j = doc.json;
        if (j.contains("predicted_step_seconds"))
            s.seconds = j.at("predicted_step_seconds").get<double>();
        for (const auto& e : j.at("nodes")) {
            node_strategy n;
            n.node = e.at("name").get<std::string>();
            n.op = e.contains("op") ? e.at("op").get<std::string>() : std::string();
            n.layouts.operands = detail::parse_layouts(e.at("in"), n.node);
            if (e.contains("out"))
                n.out_layouts = detail::parse_layouts(e.at("out"), n.node);
            n.annotated = true;
            s.nodes.push_back(std::move(n));
        }
        return s;
    });
}

} // namespace xshard

