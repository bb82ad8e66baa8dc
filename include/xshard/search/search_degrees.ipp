#pragma once
/// \file
/// The definitions of what search/search_degrees.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/search/search_degrees.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL std::optional<std::vector<op_choice>>
stage_programme(const network_spec& net, candidate_pricer& cp, std::size_t first, std::size_t last,
                int level, bool pareto, double cap, const search_options& o) {
    const auto& fixed = o.fixed;
    const int stage = cp.stage_of()[first];
    const double slots = cp.slots(), in_flight = cp.in_flight(stage);
    const double boundary = slots * cp.boundary_seconds(first, last);
    using front = std::vector<dp_entry>;
    std::vector<std::array<front, 3>> fronts(last - first + 1);
    fronts[0][std::size_t(activation_split::rows)].push_back({boundary, boundary, 0, -1, -1, {}});
    const auto key = [&](const dp_entry& e) {
        return objective_of(level, e.step, e.comm, e.memory);
    };
    const auto better = [&](const dp_entry& a, const dp_entry& b) {
        return key(a) < key(b);
    };
    // A state keeps every entry that no other is at least as good as on both figures of the
    // objective (and on memory, under a cap): a front rather than the best alone, since the
    // key's primary figures tie to 40 bits (objective_key), and a prefix ahead by its last
    // bits can end level with another that is ahead on the secondary figure.
    const auto dominates = [&](const dp_entry& a, const dp_entry& b) {
        const auto ka = key(a), kb = key(b);
        return ka.first <= kb.first && ka.second <= kb.second && (!pareto || a.memory <= b.memory);
    };
    for (std::size_t i = first; i < last; ++i) {
        auto& next = fronts[i - first + 1];
        const bool stage_end = i + 1 == last;
        for (auto in : activation_splits) {
            const auto& here = fronts[i - first][std::size_t(in)];
            if (here.empty())
                continue;
            for (auto w : {weight_split::replicated, weight_split::output, weight_split::input}) {
                for (auto out : activation_splits) {
                    const op_choice c{in, w, out};
                    if (i < fixed.size() && fixed[i] && !(*fixed[i] == c))
                        continue;
                    if (stage_end && i + 1 < net.ops.size() && out != activation_split::rows)
                        continue;
                    if (i + 1 == net.ops.size() && !o.output_allowed(out))
                        continue;
                    const auto& k = cp.cost(i, c);
                    if (!k.valid)
                        continue;
                    const double step = slots * (k.compute + k.communication) + k.synchronization;
                    const double comm = slots * k.communication + k.synchronization;
                    const double mem =
                        double(k.weight_memory) + in_flight * double(k.activation_memory);
                    auto& dst = next[std::size_t(out)];
                    for (std::size_t j = 0; j < here.size(); ++j) {
                        dp_entry e{here[j].step + step,
                                   here[j].comm + comm,
                                   here[j].memory + mem,
                                   int(in),
                                   int(j),
                                   c};
                        if (pareto && e.memory > cap)
                            continue;
                        bool dominated = false;
                        for (const auto& f : dst)
                            dominated = dominated || dominates(f, e);
                        if (dominated)
                            continue;
                        std::erase_if(dst, [&](const dp_entry& f) { return dominates(e, f); });
                        dst.push_back(e);
                    }
                }
            }
        }
    }
    // The best end state (entries in the cap when pareto).
    int best_state = -1, best_index = -1;
    const auto& end = fronts.back();
    for (int s = 0; s < 3; ++s)
        for (std::size_t j = 0; j < end[std::size_t(s)].size(); ++j)
            if (best_state < 0 || better(end[std::size_t(s)][j],
                                         end[std::size_t(best_state)][std::size_t(best_index)])) {
                best_state = s;
                best_index = int(j);
            }
    if (best_state < 0)
        return std::nullopt;
    std::vector<op_choice> r(last - first);
    for (std::size_t i = last; i-- > first;) {
        const auto& e = fronts[i - first + 1][std::size_t(best_state)][std::size_t(best_index)];
        r[i - first] = e.choice;
        best_state = e.prev_state;
        best_index = e.prev_index;
    }
    return r;
}

XSHARD_DECL std::optional<searched_strategy> exhaustive_search(const network_spec& net,
                                                               const parallel_degrees& d,
                                                               const search_options& o,
                                                               redistribution_pricer& pricer) {
    candidate_pricer cp(net, d, o.machine, pricer);
    const auto& stage = cp.stage_of();
    const std::size_t n = net.ops.size();
    std::vector<op_choice> all;
    for (auto in : activation_splits)
        for (auto w : {weight_split::replicated, weight_split::output, weight_split::input})
            for (auto out : activation_splits)
                all.push_back({in, w, out});
    std::vector<std::size_t> index(n, 0);
    std::optional<searched_strategy> best;
    std::vector<op_choice> c(n);
    std::function<void(std::size_t)> go = [&](std::size_t i) {
        if (i == n) {
            auto p = evaluate_strategy(net, d, c, o, cp);
            if (!p.valid || !p.fits)
                return;
            if (!best || plan_key(p, o.level) < plan_key(*best, o.level))
                best = std::move(p);
            return;
        }
        for (const auto& x : all) {
            if (i < o.fixed.size() && o.fixed[i] && !(*o.fixed[i] == x))
                continue;
            const bool boundary = i == 0 || stage[i] != stage[i - 1];
            if (boundary ? x.in != activation_split::rows : x.in != c[i - 1].out)
                continue;
            if (!cp.cost(i, x).valid)
                continue;
            c[i] = x;
            go(i + 1);
        }
    };
    go(0);
    return best;
}

} // namespace detail

XSHARD_DECL std::optional<searched_strategy>
search_degrees(const network_spec& net, const parallel_degrees& d, const search_options& o,
               redistribution_pricer& pricer, bool within_cap) {
    if (o.exhaustive)
        return detail::exhaustive_search(net, d, o, pricer);
    detail::candidate_pricer cp(net, d, o.machine, pricer);
    const std::size_t n = net.ops.size();
    std::vector<op_choice> choices;
    const auto& stage = cp.stage_of();
    for (std::size_t first = 0; first < n;) {
        std::size_t last = first;
        while (last < n && stage[last] == stage[first])
            ++last;
        auto part =
            detail::stage_programme(net, cp, first, last, o.level, false, o.memory_per_rank, o);
        if (!part)
            return std::nullopt;
        // The unconstrained best breaks the cap: the Pareto fronts find the best within it.
        auto probe = choices;
        probe.insert(probe.end(), part->begin(), part->end());
        double mem = 0;
        for (std::size_t i = first; i < last; ++i) {
            const auto& k = cp.cost(i, probe[i]);
            mem += double(k.weight_memory) +
                   double(cp.in_flight(stage[first])) * double(k.activation_memory);
        }
        if (within_cap && mem > o.memory_per_rank) {
            auto within =
                detail::stage_programme(net, cp, first, last, o.level, true, o.memory_per_rank, o);
            if (within)
                part = within;
        }
        choices.insert(choices.end(), part->begin(), part->end());
        first = last;
    }
    auto p = evaluate_strategy(net, d, choices, o);
    if (!p.valid)
        return std::nullopt;
    return p;
}

} // namespace xshard

