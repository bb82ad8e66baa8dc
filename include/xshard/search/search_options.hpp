#pragma once
/// \file
/// What the strategy search searches for (search/recursive_programming.hpp,
/// search/sharding_propagation.hpp): the world size, the per-rank memory cap, the objective
/// (core/objective.hpp's levels: 2 the fastest step, 1 the least memory, 0 the least
/// communication), the machine it prices with, and what it may or must choose.

#include <xshard/core/op_choice.hpp>
#include <xshard/core/parallel_degrees.hpp>
#include <xshard/search/machine_model.hpp>

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

namespace xshard {

/// What to search for (see the file comment).
struct search_options {
    int ranks = 1;
    /// Bytes a rank may hold (weights, gradients, optimizer state, activations).
    double memory_per_rank = std::numeric_limits<double>::infinity();
    /// The objective: 2 fastest, 1 least memory, 0 least communication.
    int level = 2;
    machine_model machine{};
    /// Enumerate every strategy of every operator instead of the dynamic programme.
    bool exhaustive = false;
    /// Strategies given for some operators (sharding_propagation): the search keeps them.
    std::vector<std::optional<op_choice>> fixed{};
    /// Search only these degrees (e.g. the mesh a run has).
    std::optional<parallel_degrees> degrees{};
    /// The most pipeline stages to consider (0: any).
    int max_pipeline_stages = 0;
    /// hsdp levels to consider (0: none, 1, 2).
    std::vector<int> hsdp_levels{0, 1, 2};
    /// The splits the network's output may have (what the loss takes).
    std::vector<activation_split> output_splits{activation_split::rows, activation_split::all_rows};

    bool output_allowed(activation_split a) const {
        return std::find(output_splits.begin(), output_splits.end(), a) != output_splits.end();
    }
};

} // namespace xshard
