#pragma once
/// \file
/// The definitions of what search/program_search.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/search/program_search.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL double least_figure(const std::vector<std::vector<double>>& figure) {
    double f = 0;
    for (const auto& values : figure)
        f += *std::min_element(values.begin(), values.end());
    return f;
}

XSHARD_DECL std::optional<capped_solution>
minimize_within(const cost_problem& p, const std::vector<std::vector<double>>& figure, double cap,
                std::size_t branch_budget) {
    if (least_figure(figure) > cap)
        return std::nullopt;
    const auto inf = std::numeric_limits<double>::infinity();
    const cost_minimizer base(p, branch_budget);
    auto figure_of = [&](const std::vector<std::size_t>& pick) {
        double f = 0;
        for (std::size_t v = 0; v < pick.size(); ++v)
            f += figure[v][pick[v]];
        return f;
    };
    capped_solution best;
    best.cost = inf;
    best.bound = -inf;
    bool solves_exact = true;
    double over = 0, over_cost = 0; // the figure and cost of the last pick over the cap
    // The minimum at `lambda`: whether its pick is within the cap.
    auto within_at = [&](double lambda) {
        cost_minimizer m = base;
        if (lambda > 0)
            m.add_to_unary(figure, lambda);
        const auto s = m.solve();
        best.branched += s.branched;
        solves_exact = solves_exact && s.exact;
        if (s.exact)
            best.bound = std::max(best.bound, lambda > 0 ? s.cost - lambda * cap : s.cost);
        const double f = figure_of(s.pick);
        if (f > cap) {
            over = f;
            over_cost = p.total(s.pick);
            return false;
        }
        const double c = p.total(s.pick);
        if (c < best.cost) {
            best.cost = c;
            best.figure = f;
            best.pick = s.pick;
        }
        return true;
    };
    auto settled = [&] {
        return best.cost - best.bound <= 1e-9 * std::abs(best.cost);
    };
    if (!within_at(0)) {
        // A multiplier that prices the figure above the cost, then bisected (geometrically
        // once both ends are positive).
        double lo = 0, hi = std::max(std::abs(over_cost), 1e-300) / std::max(over - cap, 1.0);
        while (hi < 1e300 && !within_at(hi)) {
            lo = hi;
            hi *= 16;
        }
        if (best.pick.empty()) { // no multiplier reached the cap: the least figure's pick
            best.pick.assign(p.unary.size(), 0);
            for (std::size_t v = 0; v < p.unary.size(); ++v)
                for (std::size_t c = 0; c < figure[v].size(); ++c)
                    if (figure[v][c] < figure[v][best.pick[v]] ||
                        (figure[v][c] == figure[v][best.pick[v]] &&
                         p.unary[v][c] < p.unary[v][best.pick[v]]))
                        best.pick[v] = c;
            best.cost = p.total(best.pick);
            best.figure = figure_of(best.pick);
        }
        for (int i = 0; i < 60 && hi < 1e300 && !settled(); ++i) {
            if (lo > 0 && hi / lo < 1 + 1e-9)
                break;
            const double mid = lo > 0 ? std::sqrt(lo * hi) : hi / 16;
            (within_at(mid) ? hi : lo) = mid;
        }
        // Moves of one variable, or of both ends of an edge, that stay within the cap.
        std::vector<std::vector<std::size_t>> touching(p.unary.size());
        for (std::size_t i = 0; i < p.edges.size(); ++i) {
            touching[p.edges[i].a].push_back(i);
            touching[p.edges[i].b].push_back(i);
        }
        auto& pick = best.pick;
        auto edge_cost = [&](const cost_problem::edge& e) {
            return e.cost[pick[e.a] * p.unary[e.b].size() + pick[e.b]];
        };
        // The cost of the terms that involve v or w (w may equal v).
        auto around = [&](std::size_t v, std::size_t w) {
            double t = p.unary[v][pick[v]] + (w != v ? p.unary[w][pick[w]] : 0.0);
            for (auto i : touching[v])
                t += edge_cost(p.edges[i]);
            if (w != v)
                for (auto i : touching[w])
                    if (p.edges[i].a != v && p.edges[i].b != v)
                        t += edge_cost(p.edges[i]);
            return t;
        };
        // Moves v to cv and w to cw where that is cheaper and within the cap.
        auto try_move = [&](std::size_t v, std::size_t cv, std::size_t w, std::size_t cw) {
            const std::size_t was_v = pick[v], was_w = pick[w];
            if (cv == was_v && cw == was_w)
                return false;
            const double now = around(v, w);
            double f = best.figure - figure[v][was_v] + figure[v][cv];
            if (w != v)
                f += figure[w][cw] - figure[w][was_w];
            if (f > cap)
                return false;
            pick[v] = cv;
            pick[w] = cw;
            if (around(v, w) < now - 1e-12 * std::abs(now)) {
                best.figure = f;
                return true;
            }
            pick[v] = was_v;
            pick[w] = was_w;
            return false;
        };
        for (bool moved = true; moved;) {
            moved = false;
            for (std::size_t v = 0; v < pick.size(); ++v)
                for (std::size_t c = 0; c < p.unary[v].size(); ++c)
                    moved = try_move(v, c, v, c) || moved;
            for (const auto& e : p.edges)
                for (std::size_t ca = 0; ca < p.unary[e.a].size(); ++ca)
                    for (std::size_t cb = 0; cb < p.unary[e.b].size(); ++cb)
                        moved = try_move(e.a, ca, e.b, cb) || moved;
        }
        best.cost = p.total(pick);
        best.figure = figure_of(pick);
    }
    best.bound = std::min(best.bound, best.cost);
    best.exact = solves_exact && settled();
    return best;
}

XSHARD_DECL tied_problem tie(const cost_problem& p, const std::vector<std::vector<double>>& figure,
                             const std::vector<std::size_t>& representative) {
    tied_problem t;
    std::map<std::size_t, std::size_t> index;
    t.variable.resize(p.unary.size());
    for (std::size_t v = 0; v < p.unary.size(); ++v) {
        const auto [it, fresh] = index.emplace(representative[v], index.size());
        t.variable[v] = it->second;
        if (fresh) {
            t.problem.unary.emplace_back(p.unary[v].size(), 0.0);
            t.figure.emplace_back(p.unary[v].size(), 0.0);
        }
        for (std::size_t c = 0; c < p.unary[v].size(); ++c) {
            t.problem.unary[it->second].at(c) += p.unary[v][c];
            t.figure[it->second].at(c) += figure[v][c];
        }
    }
    for (const auto& e : p.edges) {
        const auto a = t.variable[e.a], b = t.variable[e.b];
        if (a == b) {
            const std::size_t k = p.unary[e.b].size();
            for (std::size_t c = 0; c < k; ++c)
                t.problem.unary[a][c] += e.cost[c * k + c];
        } else {
            t.problem.edges.push_back({a, b, e.cost});
        }
    }
    return t;
}

XSHARD_DECL std::vector<repeated_block>
find_repeated_blocks(const std::vector<std::size_t>& signature) {
    const std::size_t n = signature.size();
    auto same = [&](std::size_t a, std::size_t b, std::size_t length) {
        return std::equal(signature.begin() + std::ptrdiff_t(a),
                          signature.begin() + std::ptrdiff_t(a + length),
                          signature.begin() + std::ptrdiff_t(b));
    };
    std::vector<repeated_block> runs;
    for (std::size_t s = 0; s < n;) {
        repeated_block best;
        for (std::size_t length = 1; s + 2 * length <= n; ++length) {
            std::size_t count = 1;
            while (s + (count + 1) * length <= n && same(s, s + count * length, length))
                ++count;
            if (count > 1 && count * length > best.count * best.nodes)
                best = {s, length, count, {}};
        }
        if (best.count > 1) {
            runs.push_back(best);
            s += best.count * best.nodes;
        } else {
            ++s;
        }
    }
    return runs;
}

XSHARD_DECL std::vector<layout> operand_layouts(std::size_t r, const mesh_shape& mesh,
                                                std::size_t most_axes) {
    std::vector<std::pair<layout, std::size_t>> out{{layout::replicated(r), 0}};
    for (std::size_t a = 0; a < mesh.ndim(); ++a) {
        if (mesh.sizes[a] == 1)
            continue;
        const std::size_t before = out.size();
        for (std::size_t k = 0; k < before; ++k) {
            if (out[k].second >= most_axes)
                continue;
            for (std::size_t d = 0; d < r; ++d) {
                auto l = out[k].first;
                l.dims[d].push_back(mesh.names[a]);
                out.push_back({l, out[k].second + 1});
            }
        }
    }
    std::vector<layout> layouts;
    for (auto& [l, placed] : out)
        layouts.push_back(std::move(l));
    return layouts;
}

} // namespace detail

XSHARD_DECL program_strategy search_program(const program& p, const mesh_shape& mesh,
                                            const program_search_options& options) {
    if (!(options.memory_per_rank >= 0))
        throw error("xshard: search: memory_per_rank must be a byte count, not " +
                    std::to_string(options.memory_per_rank));
    detail::program_costs costs(p, mesh, options);
    const auto tied = detail::tie(costs.problem(), costs.memory(), costs.representatives());
    const auto found = detail::minimize_within(tied.problem, tied.figure, options.memory_per_rank);
    if (!found)
        throw error("xshard: search: no strategy fits " +
                    std::to_string(std::uint64_t(options.memory_per_rank)) +
                    " bytes per rank on mesh(" + mesh.to_string() + "): the least is " +
                    std::to_string(std::uint64_t(detail::least_figure(tied.figure))) +
                    " bytes (weights, gradients, optimizer state and activations)");
    auto s = costs.strategy(tied.expand(found->pick), found->branched);
    s.memory_cap = options.memory_per_rank;
    s.lower_bound = found->bound;
    return s;
}

} // namespace xshard

