#pragma once
/// \file
/// Operator strategy files of described networks (search/network_spec.hpp): the strategies
/// the search (recursive_programming) or propagation (sharding_propagation) chose, per
/// operator, with the degrees they were chosen for (search/operator_strategy.hpp makes the
/// contents from a searched strategy; `xshard-plan search --model` writes them). A program's
/// are program strategy files (search/program_strategy_file.hpp). JSON, version 1:
///
///     {
///       "format": "xshard-operator-strategy", "version": 1,
///       "network": "mlp:784,512,512,10", "batch": 64, "ranks": 16384,
///       "degrees": {"dp": 64, "tp": 256, "pp": 1, "micro_batches": 1, "hsdp_level": 0},
///       "mesh": {"axes": ["dp", "tp"], "sizes": [64, 256]},
///       "predicted": {"step_seconds": 0.0012, "memory_bytes": 123456, "comm_bytes": 4567},
///       "operators": [
///         {"name": "linear1", "kind": "linear", "stage": 0, "in": "[dp, -]",
///          "weight": "output", "weight_layout": "[-, tp]", "out": "[dp, tp]"}
///       ]
///     }
///
/// `weight` is how the weight is split (replicated, output, input); layouts are in xshard's
/// notation over the stage mesh (dp, tp). The envelope (format, version, mesh) is
/// io/json_envelope.hpp's. Loading checks everything and raises io_error with the path and
/// what is wrong.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/op_choice.hpp>
#include <xshard/core/parallel_degrees.hpp>
#include <xshard/io/files.hpp>
#include <xshard/io/json_envelope.hpp>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace xshard {

/// One operator of an operator strategy file.
struct operator_strategy_entry {
    std::string name;
    std::string kind;
    int stage = 0;
    op_choice choice{};
};

/// The contents of an operator strategy file.
struct operator_strategy {
    static constexpr int current_version = 1;
    /// The envelope of operator strategy files (io/json_envelope.hpp).
    static constexpr json_file_kind kind{"xshard-operator-strategy", current_version,
                                         "operator strategy file"};
    std::string network;
    std::size_t batch = 0;
    int ranks = 1;
    parallel_degrees degrees{};
    double step_seconds = 0, memory_bytes = 0, comm_bytes = 0;
    std::vector<operator_strategy_entry> operators;

    /// The strategies in operator order.
    std::vector<op_choice> choices() const;

    std::string to_json() const;

    /// Parses `text` (read from `path`, for the messages); io_error on anything malformed.
    static operator_strategy from_json(const std::string& text, const std::string& path);

private:
    /// One entry of "operators"; io_error naming an unknown split.
    static operator_strategy_entry parse_operator(const nlohmann::json& o);
};

/// Writes `s` to `path` atomically (io_error naming the path on failure). No communication:
/// call it on one rank, or on every rank with distinct paths.
XSHARD_DECL void save_operator_strategy(const std::string& path, const operator_strategy& s);

/// Reads an operator strategy file (io_error naming the path when missing or malformed). No
/// communication.
inline operator_strategy load_operator_strategy(const std::string& path) {
    return operator_strategy::from_json(detail::read_file(path), path);
}

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/io/operator_strategy_file.ipp>
#endif
