#pragma once
/// \file
/// Program strategy files: a program's per-node layouts keyed by node name, MindSpore's
/// operator strategy file for any traced network. A search run in one process for a mesh of
/// N ranks (a dry run) saves one; the real run loads it and annotates its program with it; a
/// file that names only some nodes pins those, and sharding propagation fills in the rest:
///
///     {"format": "xshard-program-strategy", "version": 1,
///      "mesh": {"axes": ["dp", "tp"], "sizes": [4, 2]},
///      "predicted_step_seconds": 0.0123,
///      "nodes": [{"name": "layer1.matmul", "op": "matmul", "in": ["[dp, -]", "[-, tp]"]},
///                {"name": "head.add", "op": "add", "in": ["[dp, tp]", "[tp]"],
///                 "out": ["[dp, -]"]}]}
///
/// "in" are the layouts the node reads its operands in, "out" (optional) those its results
/// are kept in where an annotation asked for them. Reading checks the envelope, every
/// layout's notation, and the mesh against the run's; applying checks every node name against
/// the program, and compile checks each layout against its node's sharding rule.

#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/json_envelope.hpp>
#include <xshard/search/program_search.hpp>

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace xshard {

namespace detail {

inline constexpr json_file_kind program_strategy_kind{"xshard-program-strategy", 1,
                                                      "program strategy file"};

inline nlohmann::ordered_json layouts_json(const std::vector<layout>& ls) {
    auto a = nlohmann::ordered_json::array();
    for (const auto& l : ls)
        a.push_back(l.to_string());
    return a;
}

inline std::vector<layout> parse_layouts(const nlohmann::json& a, const std::string& node) {
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

/// The text of a program strategy file for `s` (see the file comment).
inline std::string program_strategy_json(const program_strategy& s) {
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

/// Writes `s` to `path` atomically (io_error naming the path on failure). No communication:
/// call it on one rank.
inline void save_program_strategy(const std::string& path, const program_strategy& s) {
    try {
        detail::write_file_atomically(path, program_strategy_json(s));
    } catch (const io_error&) {
        throw;
    } catch (const std::exception& e) {
        throw io_error("xshard: cannot write the program strategy file " + path + ": " + e.what());
    }
}

/// Reads a program strategy file's text (`path` names it in messages). With `mesh`, raises
/// io_error when the file was written for another mesh. The nodes read have their operands'
/// layouts (`layouts.operands`) and kept result layouts (`out_layouts`); apply() annotates a
/// program with them.
inline program_strategy
parse_program_strategy(std::string_view text, const std::string& path = "",
                       const std::optional<mesh_shape>& mesh = std::nullopt) {
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

/// Reads the program strategy file at `path` (parse_program_strategy). No communication.
inline program_strategy
load_program_strategy(const std::string& path,
                      const std::optional<mesh_shape>& mesh = std::nullopt) {
    return parse_program_strategy(detail::read_file(path), path, mesh);
}

} // namespace xshard
