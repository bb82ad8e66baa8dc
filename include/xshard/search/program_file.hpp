#pragma once
/// \file
/// Program files: a traced program (graph/program.hpp) as JSON, so that a strategy search
/// can run on it in another process, without the code that traced it (`xshard-plan search
/// --program FILE --mesh ...`, MindSpore's dry run):
///
///     {"format": "xshard-program", "version": 1,
///      "inputs": [{"name": "x", "type": "f64", "shape": [64, 784]}],
///      "weights": [{"name": "fc1.weight", "type": "f64", "shape": [784, 512],
///                   "init": {"kind": "uniform", "a": -0.1, "b": 0.1}}],
///      "nodes": [{"name": "fc1.matmul", "op": "matmul", "operands": ["x", "fc1.weight"],
///                 "ints": [], "reals": [], "strategies": [[4, 1], [1, 2]]}],
///      "outputs": ["fc1.matmul"]}
///
/// Operands and outputs are named as the program's listing names values: an input's or a
/// weight's name, a node's name for its result ("node:i" for its i-th of several). A node's
/// annotation, where it has one, is "strategies" (split counts per operand), "in" and "out"
/// (layouts). Reading builds the program again node by node: every operation is looked up
/// by name, its results' shapes and types come from its shape rule, and every operand must
/// name a value defined before it, so a file that does not describe a program raises
/// io_error naming the file and the node. A custom-VJP node (graph/custom.hpp) holds the
/// user's code, which a file cannot: saving a program with one raises.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/strategy.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/graph/program.hpp>
#include <xshard/graph/registry.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/json_envelope.hpp>
#include <xshard/io/safetensors.hpp>

#include <nlohmann/json.hpp>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xshard {

namespace detail {

inline constexpr json_file_kind program_file_kind{"xshard-program", 1, "program file", false};

XSHARD_DECL std::string_view initializer_kind_name(initializer::kind k);

XSHARD_DECL initializer::kind parse_initializer_kind(const std::string& name);

XSHARD_DECL dtype parse_dtype(const std::string& name);

XSHARD_DECL nlohmann::ordered_json argument_json(const program_value& v);

XSHARD_DECL value_shape parse_shape(const nlohmann::json& a);

XSHARD_DECL std::vector<layout> parse_node_layouts(const nlohmann::json& a);

/// Checks a node's "in" or "out" layouts (`key`) against its values' ranks: none, or one of
/// the value's rank per value.
XSHARD_DECL void check_node_layouts(const std::vector<layout>& ls,
                                    const std::vector<std::size_t>& ranks, const char* key);

/// A node's "strategies": a list of split counts per operand.
XSHARD_DECL std::vector<strategy> parse_strategies(const nlohmann::json& a);

} // namespace detail

/// The text of a program file for `p` (see the file comment). Throws xshard::error naming
/// the node when `p` holds a custom-VJP node.
XSHARD_DECL std::string program_json(const program& p);

/// Writes `p` to `path` atomically (io_error naming the path on failure; xshard::error for a
/// custom-VJP node). No communication: call it on one rank.
XSHARD_DECL void save_program(const std::string& path, const program& p);

/// Builds the program a program file's text describes (`path` names it in messages; see the
/// file comment). Throws io_error naming the file and what is wrong.
XSHARD_DECL program parse_program(std::string_view text, const std::string& path = "");

/// Reads the program file at `path` (parse_program). No communication.
inline program load_program(const std::string& path) {
    return parse_program(detail::read_file(path), path);
}

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/search/program_file.ipp>
#endif
