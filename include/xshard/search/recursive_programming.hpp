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
inline std::vector<parallel_degrees> candidate_degrees(const network_spec& net, int ranks,
                                                       const std::vector<int>& levels) {
    std::vector<parallel_degrees> r;
    for (int pp = 1; pp <= ranks; ++pp) {
        if (ranks % pp != 0 || std::size_t(pp) > net.ops.size())
            continue;
        for (int dp = 1; dp <= ranks / pp; ++dp) {
            if ((ranks / pp) % dp != 0)
                continue;
            const int tp = ranks / pp / dp;
            std::vector<int> ms =
                pp == 1 ? std::vector<int>{1} : std::vector<int>{pp, 2 * pp, 4 * pp};
            for (int m : ms) {
                if (net.batch % (std::size_t(m) * std::size_t(dp)) != 0)
                    continue;
                for (int level : levels)
                    r.push_back({dp, tp, pp, m, level});
            }
        }
    }
    return r;
}

namespace detail {

/// Throws std::invalid_argument for what the search cannot take: fewer than one rank, a
/// network without operators or without a batch, an unknown objective level.
inline void check_search(const network_spec& net, const search_options& o) {
    if (o.ranks < 1)
        throw std::invalid_argument("xshard: search: ranks must be at least 1");
    if (net.ops.empty() || net.batch == 0)
        throw std::invalid_argument("xshard: search: the network has no operators or no batch");
    if (!is_objective_level(o.level))
        throw std::invalid_argument(bad_objective_level("xshard: search: the level", o.level));
}

/// The degrees to search: `o.degrees` at each of `o.hsdp_levels` when set, else every
/// candidate (candidate_degrees) of at most `o.max_pipeline_stages` stages when that is set.
inline std::vector<parallel_degrees> degrees_to_search(const network_spec& net,
                                                       const search_options& o) {
    std::vector<parallel_degrees> cands;
    if (o.degrees) {
        for (int level : o.hsdp_levels) {
            auto d = *o.degrees;
            d.hsdp_level = level;
            cands.push_back(d);
        }
    } else {
        cands = candidate_degrees(net, o.ranks, o.hsdp_levels);
        if (o.max_pipeline_stages > 0)
            std::erase_if(cands,
                          [&](const parallel_degrees& d) { return d.pp > o.max_pipeline_stages; });
    }
    return cands;
}

/// Sorts `fitting` by the objective of `level` and sets `r.best` to the first and
/// `r.runner_up` to the best on other degrees (another hsdp level alone is a footnote, not an
/// alternative), else the second.
inline void rank_strategies(std::vector<searched_strategy>& fitting, search_result& r, int level) {
    std::stable_sort(fitting.begin(), fitting.end(), [&](const auto& a, const auto& b) {
        return plan_key(a, level) < plan_key(b, level);
    });
    r.best.reset();
    r.runner_up.reset();
    if (fitting.empty())
        return;
    r.best = fitting.front();
    for (const auto& f : fitting) {
        auto a = f.degrees, b = r.best->degrees;
        a.hsdp_level = b.hsdp_level = 0;
        if (!(a == b)) {
            r.runner_up = f;
            break;
        }
    }
    if (!r.runner_up && fitting.size() > 1)
        r.runner_up = fitting[1];
}

/// The search's redistribution pricers, one per (dp, tp) mesh.
using pricer_map = std::map<std::pair<int, int>, redistribution_pricer>;

/// The pricer of the (dp, tp) mesh of `d`, made on first use.
inline redistribution_pricer& pricer_of(pricer_map& pricers, const parallel_degrees& d,
                                        const machine_model& m) {
    auto it = pricers.find({d.dp, d.tp});
    if (it == pricers.end())
        it = pricers
                 .emplace(std::pair{d.dp, d.tp},
                          redistribution_pricer(
                              mesh_shape({axis_name("dp"), axis_name("tp")}, {d.dp, d.tp}), m.links,
                              m.element))
                 .first;
    return it->second;
}

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
inline std::vector<capped_candidate>
search_uncapped(const network_spec& net, const search_options& o,
                const std::vector<parallel_degrees>& cands, pricer_map& pricers,
                std::vector<searched_strategy>& fitting, search_result& r) {
    std::vector<capped_candidate> again;
    for (const auto& d : cands) {
        auto& pricer = pricer_of(pricers, d, o.machine);
        ++r.candidates;
        auto p = search_degrees(net, d, o, pricer, o.exhaustive);
        if (!p)
            continue;
        if (p->fits) {
            fitting.push_back(std::move(*p));
            continue;
        }
        if (!r.over_cap || plan_key(*p, o.level) < plan_key(*r.over_cap, o.level))
            r.over_cap = p;
        if (!o.exhaustive)
            again.push_back({d, plan_key(*p, o.level), &pricer});
    }
    return again;
}

/// The second pass: the candidates of `again` searched under the cap (Pareto fronts), best
/// bound first, while their bound could still beat the runner-up; then `r.best` and
/// `r.runner_up` chosen among `fitting` (rank_strategies).
inline void search_capped(const network_spec& net, const search_options& o,
                          std::vector<capped_candidate> again,
                          std::vector<searched_strategy>& fitting, search_result& r) {
    std::stable_sort(
        again.begin(), again.end(),
        [](const capped_candidate& a, const capped_candidate& b) { return a.bound < b.bound; });
    for (const auto& c : again) {
        rank_strategies(fitting, r, o.level);
        if (r.best && r.runner_up && !(c.bound < plan_key(*r.runner_up, o.level)))
            break;
        auto p = search_degrees(net, c.d, o, *c.pricer, true);
        if (p && p->fits)
            fitting.push_back(std::move(*p));
    }
    rank_strategies(fitting, r, o.level);
}

} // namespace detail

/// MindSpore's recursive_programming: the best plan for `net` over every candidate degree
/// (or `o.degrees`), the runner-up with the reason it lost, and the fastest plan the cap
/// ruled out when it would have won (see the file comment). When nothing fits the cap, the
/// plan of least memory is reported as `over_cap`. Throws std::invalid_argument when nothing
/// is valid.
inline search_result search_strategy(const network_spec& net, const search_options& o) {
    detail::check_search(net, o);
    search_result r;
    r.level = o.level;
    r.memory_cap = o.memory_per_rank;
    r.network = net.description;
    detail::pricer_map pricers;
    std::vector<searched_strategy> fitting;
    auto again =
        detail::search_uncapped(net, o, detail::degrees_to_search(net, o), pricers, fitting, r);
    detail::search_capped(net, o, std::move(again), fitting, r);
    if (!r.best && !r.over_cap)
        throw std::invalid_argument("xshard: search: no valid strategy for " + net.description +
                                    " on " + std::to_string(o.ranks) +
                                    " ranks (the batch must split over the data-parallel ranks)");
    if (r.over_cap && r.best && !(plan_key(*r.over_cap, o.level) < plan_key(*r.best, o.level)))
        r.over_cap.reset();
    if (!r.best && o.level != 1) {
        // Nothing fits: report the plan of least memory instead (level 1, no cap).
        auto least = o;
        least.level = 1;
        least.memory_per_rank = std::numeric_limits<double>::infinity();
        r.over_cap = search_strategy(net, least).best;
    }
    if (r.best && r.runner_up)
        r.runner_up_lost = detail::why_lost(*r.best, *r.runner_up, o.level);
    return r;
}

} // namespace xshard
