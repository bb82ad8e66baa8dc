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

#include <xshard/compiled.hpp>
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

XSHARD_DECL nlohmann::ordered_json layouts_json(const std::vector<layout>& ls);

XSHARD_DECL std::vector<layout> parse_layouts(const nlohmann::json& a, const std::string& node);

} // namespace detail

/// The text of a program strategy file for `s` (see the file comment).
XSHARD_DECL std::string program_strategy_json(const program_strategy& s);

/// Writes `s` to `path` atomically (io_error naming the path on failure). No communication:
/// call it on one rank.
XSHARD_DECL void save_program_strategy(const std::string& path, const program_strategy& s);

/// Reads a program strategy file's text (`path` names it in messages). With `mesh`, raises
/// io_error when the file was written for another mesh. The nodes read have their operands'
/// layouts (`layouts.operands`) and kept result layouts (`out_layouts`); apply() annotates a
/// program with them.
XSHARD_DECL program_strategy
parse_program_strategy(std::string_view text, const std::string& path = "",
                       const std::optional<mesh_shape>& mesh = std::nullopt);

/// Reads the program strategy file at `path` (parse_program_strategy). No communication.
inline program_strategy
load_program_strategy(const std::string& path,
                      const std::optional<mesh_shape>& mesh = std::nullopt) {
    return parse_program_strategy(detail::read_file(path), path, mesh);
}

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/search/program_strategy_file.ipp>
#endif
