#pragma once
/// \file
/// A strategy the search found or priced (`searched_strategy`): the parallel degrees, each
/// operator's strategy and pipeline stage, and the prediction of what a step costs the
/// slowest stage's ranks (time by component, memory, bytes sent), with its objective value.

#include <xshard/compiled.hpp>
#include <xshard/core/objective.hpp>
#include <xshard/core/op_choice.hpp>
#include <xshard/core/parallel_degrees.hpp>

#include <cstddef>
#include <vector>

namespace xshard {

/// An objective value (core/objective.hpp): (time, memory) at level 2, (memory, time) at
/// level 1, (communication, time) at level 0, compared lexicographically.
using search_key = objective_key;

/// A candidate's full prediction: degrees, per-operator strategies, and what a step costs the
/// slowest stage's ranks.
struct searched_strategy {
    parallel_degrees degrees{};
    std::vector<op_choice> choices;
    std::vector<int> stage_of; ///< per operator
    double step_seconds = 0;
    double compute_seconds = 0;       ///< the slowest stage's, per step
    double communication_seconds = 0; ///< its activations' redistributions, per step
    double synchronization_seconds = 0;
    double pipeline_seconds = 0; ///< stage-boundary transfers and the bubble
    double memory_bytes = 0;     ///< the largest stage's per rank
    double comm_bytes = 0;       ///< bytes a rank of the slowest stage sends per step
    bool fits = true;            ///< within the memory cap
    bool valid = true;
    search_key objective{}; ///< the slowest stage's by the objective

    /// The index of the first operator of stages 1, 2, ... (pipeline_options::stage_starts).
    std::vector<std::size_t> stage_starts() const;
};

/// Another name of searched_strategy, kept so that code written with it compiles.
using strategy_plan = searched_strategy;

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/search/searched_strategy.ipp>
#endif
