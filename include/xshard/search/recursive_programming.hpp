#pragma once
/// \file
/// MindSpore's `recursive_programming` parallel mode: the strategy search. Over every
/// factorisation of the world into data, tensor and pipeline parallel degrees (dp x tp x pp),
/// the micro-batch counts of a pipeline and the hsdp levels, it chooses each operator's
/// strategy (search/cost.hpp prices them, search/search_degrees.hpp chooses them per degrees)
/// to optimise the objective under a per-rank memory cap, in one process, for any world size:
///
///     const auto net = xshard::mlp_network({784, 512, 512, 10}, 64);
///     auto r = xshard::search_strategy(net, {.ranks = 16384,
///                                            .memory_per_rank = 2.0 * (1 << 30)});
///     std::cout << xshard::describe(r, net);
///
/// Objectives (`search_options::level`): 2 the fastest step; 1 the least memory; 0 the best
/// computation/communication ratio, i.e. the least communication (compute is the same work
/// whatever the split, bar repeated computation, which the tie-break on time rules out).
///
/// Every candidate is first searched without the cap (one scalar programme per stage); those
/// whose optimum breaks the cap are searched again under it (Pareto fronts), best bound first,
/// while their bound (the unconstrained optimum) could still beat the runner-up.

#include <xshard/compiled.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/objective.hpp>
#include <xshard/core/parallel_degrees.hpp>
#include <xshard/search/evaluate_strategy.hpp>
#include <xshard/search/machine_model.hpp>
#include <xshard/search/network_spec.hpp>
#include <xshard/search/redistribution_pricer.hpp>
#include <xshard/search/search_degrees.hpp>
#include <xshard/search/search_options.hpp>
#include <xshard/search/search_result.hpp>
#include <xshard/search/searched_strategy.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace xshard {

/// The degrees the search considers for `net` on `ranks` ranks (see the file comment): every
/// dp x tp x pp = ranks with dp dividing the samples of a micro-batch and at most one stage
/// per operator, with m in {pp, 2 pp, 4 pp} micro-batches for a pipeline.
XSHARD_DECL std::vector<parallel_degrees> candidate_degrees(const network_spec& net, int ranks,
                                                            const std::vector<int>& levels);

namespace detail {

/// Throws std::invalid_argument for what the search cannot take: fewer than one rank, a
/// network without operators or without a batch, an unknown objective level.
XSHARD_DECL void check_search(const network_spec& net, const search_options& o);

/// The degrees to search: `o.degrees` at each of `o.hsdp_levels` when set, else every
/// candidate (candidate_degrees) of at most `o.max_pipeline_stages` stages when that is set.
XSHARD_DECL std::vector<parallel_degrees> degrees_to_search(const network_spec& net,
                                                            const search_options& o);

/// Sorts `fitting` by the objective of `level` and sets `r.best` to the first and
/// `r.runner_up` to the best on other degrees (another hsdp level alone is a footnote, not an
/// alternative), else the second.
XSHARD_DECL void rank_strategies(std::vector<searched_strategy>& fitting, search_result& r,
                                 int level);

/// The search's redistribution pricers, one per (dp, tp) mesh.
using pricer_map = std::map<std::pair<int, int>, redistribution_pricer>;

/// The pricer of the (dp, tp) mesh of `d`, made on first use.
XSHARD_DECL redistribution_pricer& pricer_of(pricer_map& pricers, const parallel_degrees& d,
                                             const machine_model& m);

/// A candidate whose optimum breaks the memory cap: its degrees, its bound (that optimum's
/// objective) and its pricer.
struct capped_candidate {
    parallel_degrees d;
    search_key bound;
    redistribution_pricer* pricer;
};

/// The first pass: every candidate of `cands` searched without the cap (within it when
/// exhaustive), counted in `r.candidates`; those that fit are added to `fitting`, the best of
/// those that do not is kept as `r.over_cap`, and they are returned to be searched again
/// under the cap (none when exhaustive).
XSHARD_DECL std::vector<capped_candidate>
search_uncapped(const network_spec& net, const search_options& o,
                const std::vector<parallel_degrees>& cands, pricer_map& pricers,
                std::vector<searched_strategy>& fitting, search_result& r);

/// The second pass: the candidates of `again` searched under the cap (Pareto fronts), best
/// bound first, while their bound could still beat the runner-up; then `r.best` and
/// `r.runner_up` chosen among `fitting` (rank_strategies).
XSHARD_DECL void search_capped(const network_spec& net, const search_options& o,
                               std::vector<capped_candidate> again,
                               std::vector<searched_strategy>& fitting, search_result& r);

} // namespace detail

/// MindSpore's recursive_programming: the best plan for `net` over every candidate degree
/// (or `o.degrees`), the runner-up with the reason it lost, and the fastest plan the cap
/// ruled out when it would have won (see the file comment). When nothing fits the cap, the
/// plan of least memory is reported as `over_cap`. Throws std::invalid_argument when nothing
/// is valid.
XSHARD_DECL search_result search_strategy(const network_spec& net, const search_options& o);

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/search/recursive_programming.ipp>
#endif
