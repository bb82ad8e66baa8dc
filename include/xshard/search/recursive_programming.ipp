#pragma once
/// \file
/// The definitions of what search/recursive_programming.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/search/recursive_programming.hpp>

namespace xshard {

XSHARD_DECL std::vector<parallel_degrees> candidate_degrees(const network_spec& net, int ranks,
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

XSHARD_DECL void check_search(const network_spec& net, const search_options& o) {
    if (o.ranks < 1)
        throw std::invalid_argument("xshard: search: ranks must be at least 1");
    if (net.ops.empty() || net.batch == 0)
        throw std::invalid_argument("xshard: search: the network has no operators or no batch");
    if (!is_objective_level(o.level))
        throw std::invalid_argument(bad_objective_level("xshard: search: the level", o.level));
}

XSHARD_DECL std::vector<parallel_degrees> degrees_to_search(const network_spec& net,
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

XSHARD_DECL void rank_strategies(std::vector<searched_strategy>& fitting, search_result& r,
                                 int level) {
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

XSHARD_DECL redistribution_pricer& pricer_of(pricer_map& pricers, const parallel_degrees& d,
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

XSHARD_DECL std::vector<capped_candidate>
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

XSHARD_DECL void search_capped(const network_spec& net, const search_options& o,
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

XSHARD_DECL search_result search_strategy(const network_spec& net, const search_options& o) {
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

