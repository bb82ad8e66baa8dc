#pragma once
/// \file
/// The best strategy of every operator under fixed parallel degrees. Within a pipeline stage
/// the strategy is a dynamic programme over the operators whose state is the activation's
/// split: exact for the objective (each stage's time and memory are sums over its operators,
/// and the stages are independent given their boundaries, search/evaluate_strategy.hpp),
/// keeping per state the front of the objective's two figures, and when the best breaks the
/// memory cap the front of those and memory. Small chains can be searched exhaustively
/// instead (`search_options::exhaustive`), which the tests use to check the programme.

#include <xshard/compiled.hpp>
#include <xshard/core/objective.hpp>
#include <xshard/core/op_choice.hpp>
#include <xshard/core/parallel_degrees.hpp>
#include <xshard/search/evaluate_strategy.hpp>
#include <xshard/search/network_spec.hpp>
#include <xshard/search/redistribution_pricer.hpp>
#include <xshard/search/search_options.hpp>
#include <xshard/search/searched_strategy.hpp>

#include <array>
#include <cstddef>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

namespace xshard {

namespace detail {

/// An entry of a state's front: the stage's sums so far and where it came from.
struct dp_entry {
    double step = 0, comm = 0, memory = 0; // step and comm: per-step seconds so far
    int prev_state = -1, prev_index = -1;
    op_choice choice{};
};

/// The best strategies of operators [first, last) of one stage by dynamic programming (see
/// the file comment); empty when none is valid. `pareto`: the fronts weigh memory too, and
/// keep entries within `cap` only.
XSHARD_DECL std::optional<std::vector<op_choice>>
stage_programme(const network_spec& net, candidate_pricer& cp, std::size_t first, std::size_t last,
                int level, bool pareto, double cap, const search_options& o);

/// Every valid strategy of the whole chain, evaluated; the best by the objective among those
/// within the cap (or, if none is, the least memory).
XSHARD_DECL std::optional<searched_strategy> exhaustive_search(const network_spec& net,
                                                               const parallel_degrees& d,
                                                               const search_options& o,
                                                               redistribution_pricer& pricer);

} // namespace detail

/// The best strategies of every operator under degrees `d` (the dynamic programme, or the
/// enumeration with `o.exhaustive`), evaluated; nullopt when no strategy is valid or fits.
XSHARD_DECL std::optional<searched_strategy>
search_degrees(const network_spec& net, const parallel_degrees& d, const search_options& o,
               redistribution_pricer& pricer, bool within_cap = true);

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/search/search_degrees.ipp>
#endif
