#pragma once
/// \file
/// The definitions of what search/program_search.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/search/program_search.hpp>

namespace xshard {

XSHARD_DECL void program_strategy::apply(program& p) const {
    for (const auto& n : nodes) {
        auto& node = p.node(n.node);
        node.annotation.in_strategies.clear();
        node.annotation.in_layouts = n.layouts.operands;
        node.annotation.out_layouts = n.out_layouts;
    }
}

XSHARD_DECL std::string program_strategy::explain() const {
    std::string s = "strategy on mesh(" + mesh.to_string() + "): " + seconds_text(seconds) +
                    " per step predicted; per rank " + std::to_string(weight_bytes) +
                    " bytes of weights, gradients and optimizer state, " +
                    std::to_string(activation_bytes) + " bytes of activations\n";
    for (const auto& r : repeated)
        s += "  " + std::to_string(r.count) + " repeated blocks of " + std::to_string(r.nodes) +
             " nodes from " + r.first_name + ", searched once\n";
    if (memory_cap != std::numeric_limits<double>::infinity()) {
        char cap[32];
        std::snprintf(cap, sizeof cap, "%.0f", memory_cap);
        s += "  within the cap of " + std::string(cap) + " bytes per rank; ";
        s += lower_bound < seconds
                 ? "no strategy within it is faster than " + seconds_text(lower_bound) + "\n"
                 : "the fastest within it\n";
    }
    for (const auto& n : nodes) {
        s += "  " + n.node + " (" + n.op + ")" + (n.annotated ? " annotated" : "") + ": " +
             choice_text(n.layouts) + "\n    compute " + seconds_text(n.compute) +
             ", communication " + seconds_text(n.communication) +
             ", gradient sync and update " + seconds_text(n.gradient_sync) + "; " +
             std::to_string(n.ways) + " ways";
        if (n.runner_up)
            s += "; runner-up " + choice_text(*n.runner_up) + " loses " +
                 seconds_text(n.runner_up_loss);
        s += "\n";
    }
    return s;
}

XSHARD_DECL std::string program_strategy::diff(const program_strategy& other) const {
    std::string s;
    std::map<std::string, const node_strategy*> theirs;
    for (const auto& n : other.nodes)
        theirs[n.node] = &n;
    for (const auto& n : nodes) {
        auto it = theirs.find(n.node);
        if (it == theirs.end()) {
            s += n.node + ": only in the first\n";
            continue;
        }
        if (it->second->layouts.operands != n.layouts.operands)
            s += n.node + ": " + choice_text(n.layouts) + " -> " +
                 choice_text(it->second->layouts) + "\n";
        theirs.erase(it);
    }
    for (const auto& [name, n] : theirs)
        s += name + ": only in the second\n";
    return s;
}

XSHARD_DECL std::string program_strategy::choice_text(const layout_choice& c) {
    std::string s = "in ";
    for (std::size_t i = 0; i < c.operands.size(); ++i)
        s += (i ? ", " : "") + c.operands[i].to_string();
    for (std::size_t i = 0; i < c.results.size(); ++i)
        s += (i ? ", " : " out ") + c.results[i].to_string();
    return s;
}

XSHARD_DECL std::string program_strategy::seconds_text(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g s", s);
    return buf;
}

namespace detail {

XSHARD_DECL double cost_problem::total(const std::vector<std::size_t>& pick) const {
    double t = 0;
    for (std::size_t v = 0; v < unary.size(); ++v)
        t += unary[v][pick[v]];
    for (const auto& e : edges)
        t += e.cost[pick[e.a] * unary[e.b].size() + pick[e.b]];
    return t;
}

XSHARD_DECL cost_minimizer::cost_minimizer(const cost_problem& p, std::size_t branch_budget)
    : unary_(p.unary)
    , nbr_(p.unary.size())
    , alive_(p.unary.size(), true)
    , budget_(branch_budget) {
    for (const auto& e : p.edges) {
        if (e.a == e.b)
            throw std::invalid_argument("xshard: cost_minimizer: an edge from a variable to "
                                        "itself");
        auto& t = table(e.a, e.b);
        for (std::size_t i = 0; i < size(e.a); ++i)
            for (std::size_t j = 0; j < size(e.b); ++j)
                t.at(i, j, e.a > e.b) += e.cost[i * size(e.b) + j];
    }
}

XSHARD_DECL void cost_minimizer::add_to_unary(const std::vector<std::vector<double>>& extra,
                                              double weight) {
    for (std::size_t v = 0; v < unary_.size(); ++v)
        for (std::size_t c = 0; c < unary_[v].size(); ++c)
            unary_[v][c] += weight * extra[v][c];
}

XSHARD_DECL cost_minimizer::solution cost_minimizer::solve() {
    solution s;
    std::size_t spent = 0;
    s.cost = run(s.pick, s.branched, spent, s.exact);
    return s;
}

XSHARD_DECL cost_minimizer::pair_table& cost_minimizer::table(std::size_t a, std::size_t b) {
    const auto key = std::minmax(a, b);
    auto it = tables_.find(key);
    if (it == tables_.end()) {
        pair_table t;
        t.cols = size(key.second);
        t.c.assign(size(key.first) * t.cols, 0.0);
        it = tables_.emplace(key, std::move(t)).first;
        nbr_[a].insert(b);
        nbr_[b].insert(a);
    }
    return it->second;
}

XSHARD_DECL void cost_minimizer::remove(std::size_t v) {
    for (auto u : nbr_[v]) {
        tables_.erase(std::minmax(u, v));
        nbr_[u].erase(v);
    }
    nbr_[v].clear();
    alive_[v] = false;
}

XSHARD_DECL double cost_minimizer::fix(std::size_t v, std::size_t c) {
    for (auto u : nbr_[v])
        for (std::size_t iu = 0; iu < size(u); ++iu)
            unary_[u][iu] += cost(v, c, u, iu);
    const double own = unary_[v][c];
    remove(v);
    return own;
}

XSHARD_DECL std::size_t cost_minimizer::greedy_value(std::size_t v) const {
    std::size_t best = 0;
    double low = std::numeric_limits<double>::infinity();
    for (std::size_t c = 0; c < size(v); ++c) {
        double t = unary_[v][c];
        for (auto u : nbr_[v]) {
            double m = std::numeric_limits<double>::infinity();
            for (std::size_t iu = 0; iu < size(u); ++iu)
                m = std::min(m, unary_[u][iu] + cost(v, c, u, iu));
            t += m;
        }
        if (t < low) {
            low = t;
            best = c;
        }
    }
    return best;
}

XSHARD_DECL cost_minimizer::record cost_minimizer::eliminate(std::size_t v) {
    record r;
    r.v = v;
    const std::vector<std::size_t> n(nbr_[v].begin(), nbr_[v].end());
    const auto inf = std::numeric_limits<double>::infinity();
    if (n.empty()) {
        r.best = {std::size_t(std::min_element(unary_[v].begin(), unary_[v].end()) -
                              unary_[v].begin())};
        r.constant = unary_[v][r.best[0]];
    } else if (n.size() == 1) {
        r.kind = 1;
        r.u = n[0];
        r.best.assign(size(r.u), 0);
        for (std::size_t iu = 0; iu < size(r.u); ++iu) {
            double low = inf;
            for (std::size_t iv = 0; iv < size(v); ++iv) {
                const double c = unary_[v][iv] + cost(v, iv, r.u, iu);
                if (c < low) {
                    low = c;
                    r.best[iu] = iv;
                }
            }
            unary_[r.u][iu] += low;
        }
    } else {
        r.kind = 2;
        r.u = n[0];
        r.w = n[1];
        r.kw = size(r.w);
        const std::size_t ku = size(r.u), kv = size(v);
        std::vector<double> folded(ku * r.kw, inf);
        r.best.assign(ku * r.kw, 0);
        for (std::size_t iu = 0; iu < ku; ++iu)
            for (std::size_t iv = 0; iv < kv; ++iv) {
                const double left = unary_[v][iv] + cost(v, iv, r.u, iu);
                for (std::size_t iw = 0; iw < r.kw; ++iw) {
                    const double c = left + cost(v, iv, r.w, iw);
                    if (c < folded[iu * r.kw + iw]) {
                        folded[iu * r.kw + iw] = c;
                        r.best[iu * r.kw + iw] = iv;
                    }
                }
            }
        remove(v);
        auto& t = table(r.u, r.w);
        for (std::size_t iu = 0; iu < ku; ++iu)
            for (std::size_t iw = 0; iw < r.kw; ++iw)
                t.at(iu, iw, r.u > r.w) += folded[iu * r.kw + iw];
        return r;
    }
    remove(v);
    return r;
}

XSHARD_DECL double cost_minimizer::back_substitute(const std::vector<record>& done,
                                                   std::vector<std::size_t>& pick) {
    double total = 0;
    for (auto it = done.rbegin(); it != done.rend(); ++it) {
        if (it->kind == 0) {
            pick[it->v] = it->best[0];
            total += it->constant;
        } else if (it->kind == 1) {
            pick[it->v] = it->best[pick[it->u]];
        } else {
            pick[it->v] = it->best[pick[it->u] * it->kw + pick[it->w]];
        }
    }
    return total;
}

XSHARD_DECL double cost_minimizer::run(std::vector<std::size_t>& pick, std::size_t& branched,
                                       std::size_t& spent, bool& exact) {
    std::vector<record> done;
    double fixed = 0;
    while (true) {
        std::size_t v = npos, low = npos;
        for (std::size_t i = 0; i < alive_.size(); ++i)
            if (alive_[i] && (v == npos || nbr_[i].size() < low)) {
                v = i;
                low = nbr_[i].size();
            }
        if (v == npos)
            break;
        if (low < 3) {
            done.push_back(eliminate(v));
            continue;
        }
        ++branched;
        if (spent + size(v) > budget_) {
            exact = false;
            const auto c = greedy_value(v);
            fixed += fix(v, c);
            done.push_back({0, v, 0, 0, 0, {c}, 0});
            continue;
        }
        spent += size(v);
        double best = std::numeric_limits<double>::infinity();
        for (std::size_t c = 0; c < size(v); ++c) {
            cost_minimizer trial = *this;
            const double own = trial.fix(v, c);
            std::vector<std::size_t> p(unary_.size(), 0);
            const double t = own + trial.run(p, branched, spent, exact);
            if (t < best) {
                best = t;
                pick = std::move(p);
                pick[v] = c;
            }
        }
        return fixed + best + back_substitute(done, pick);
    }
    pick.assign(unary_.size(), 0);
    return fixed + back_substitute(done, pick);
}

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

XSHARD_DECL std::vector<std::size_t>
tied_problem::expand(const std::vector<std::size_t>& pick) const {
    std::vector<std::size_t> all(variable.size());
    for (std::size_t v = 0; v < variable.size(); ++v)
        all[v] = pick[variable[v]];
    return all;
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

XSHARD_DECL program_costs::program_costs(const program& p, const mesh_shape& mesh,
                                         const program_search_options& o)
    : p_(p)
    , mesh_(mesh)
    , o_(o) {
    const auto& values = p.values();
    producer_.assign(values.size(), {npos, 0});
    for (std::size_t k = 0; k < p.nodes().size(); ++k)
        for (std::size_t j = 0; j < p.nodes()[k].results.size(); ++j)
            producer_[p.nodes()[k].results[j]] = {k, j};
    const auto dataset = dataset_axes_of(o.layouts, mesh);
    for (auto id : p.inputs()) {
        auto it = o.layouts.input_layouts.find(values[id].name);
        inputs_[id] = it != o.layouts.input_layouts.end()
                          ? it->second
                          : batch_layout(values[id].shape.size(), dataset);
    }
    mark_gradients();
    representative_.resize(p.nodes().size());
    for (std::size_t k = 0; k < representative_.size(); ++k)
        representative_[k] = k;
    if (o.share_repeated_blocks)
        share_repeated_blocks();
    for (std::size_t k = 0; k < p.nodes().size(); ++k)
        ways_.push_back(representative_[k] == k ? ways_of(p.nodes()[k])
                                                : ways_[representative_[k]]);
    problem_.unary.resize(ways_.size());
    memory_.resize(ways_.size());
    for (std::size_t k = 0; k < ways_.size(); ++k)
        for (const auto& w : ways_[k]) {
            problem_.unary[k].push_back(w.compute);
            memory_[k].push_back(double(w.result_bytes));
        }
    add_edges();
}

XSHARD_DECL program_strategy program_costs::strategy(const std::vector<std::size_t>& pick,
                                                     std::size_t branched) const {
    program_strategy s;
    s.mesh = mesh_;
    s.seconds = problem_.total(pick);
    s.branched = branched;
    for (std::size_t k = 0; k < ways_.size(); ++k) {
        const auto& n = p_.nodes()[k];
        const auto& w = ways_[k][pick[k]];
        node_strategy ns;
        ns.node = n.name;
        ns.op = n.op;
        ns.layouts = w.choice;
        ns.annotated = annotated(n);
        if (o_.keep_annotations)
            ns.out_layouts = n.annotation.out_layouts;
        ns.ways = ways_[k].size();
        ns.compute = w.compute;
        ns.gradient_sync = sync_[k].empty() ? 0 : sync_[k][pick[k]];
        // What the node's own price holds beyond compute and synchronisation (rounding
        // leaves a few ulps where that is nothing: 0).
        ns.communication =
            std::max(0.0, problem_.unary[k][pick[k]] - ns.compute - ns.gradient_sync);
        for (const auto& e : problem_.edges)
            if (e.b == k)
                ns.communication += e.cost[pick[e.a] * ways_[k].size() + pick[k]];
        runner_up(k, pick, ns);
        s.nodes.push_back(std::move(ns));
    }
    for (std::size_t i = 0; i < p_.weights().size(); ++i) {
        const auto id = p_.weights()[i];
        const auto [k, operand] = first_use_.at(id);
        s.weight_bytes +=
            weight_bytes(p_.value(id), whole_terms(ways_[k][pick[k]].choice.operands[operand]));
    }
    for (std::size_t k = 0; k < ways_.size(); ++k)
        s.activation_bytes += ways_[k][pick[k]].result_bytes;
    s.repeated = repeated_;
    return s;
}

XSHARD_DECL void program_costs::share_repeated_blocks() {
    const auto& nodes = p_.nodes();
    std::map<std::size_t, std::size_t> first_reader;
    std::map<std::string, std::size_t> interned;
    std::vector<std::size_t> signature;
    auto shape_of = [](const program_value& v) {
        std::string t = std::string(to_string(v.type)) + "[";
        for (auto d : v.shape)
            t += std::to_string(d) + ",";
        return t + "]";
    };
    for (std::size_t k = 0; k < nodes.size(); ++k) {
        const auto& n = nodes[k];
        std::string sig = n.op + "|";
        if (n.custom) {
            char address[32];
            std::snprintf(address, sizeof address, "%p",
                          static_cast<const void*>(n.custom.get()));
            sig += address;
        }
        for (auto i : n.attributes.ints)
            sig += std::to_string(i) + ",";
        sig += "|";
        for (auto r : n.attributes.reals) {
            char real[32];
            std::snprintf(real, sizeof real, "%a,", r);
            sig += real;
        }
        if (annotated(n) || (o_.keep_annotations && !n.annotation.out_layouts.empty()))
            sig += "|" + n.annotation.to_string();
        for (auto id : n.operands) {
            const auto& v = p_.value(id);
            sig += "|" + shape_of(v);
            if (v.kind == value_kind::input) {
                sig += "input " + v.name;
            } else if (v.kind == value_kind::weight) {
                const auto [it, first] = first_reader.emplace(id, k);
                sig += first ? "weight" : "weight read " + std::to_string(k - it->second);
            } else {
                sig +=
                    "node " + std::to_string(k - v.node) + ":" + std::to_string(v.result_index);
            }
        }
        for (auto id : n.results)
            sig += "|" + shape_of(p_.value(id)) + (gradient_[id] ? "g" : "");
        signature.push_back(interned.emplace(std::move(sig), interned.size()).first->second);
    }
    repeated_ = find_repeated_blocks(signature);
    for (auto& r : repeated_) {
        r.first_name = nodes[r.first].name;
        for (std::size_t b = 1; b < r.count; ++b)
            for (std::size_t j = 0; j < r.nodes; ++j)
                representative_[r.first + b * r.nodes + j] = r.first + j;
    }
}

XSHARD_DECL void program_costs::mark_gradients() {
    const auto& values = p_.values();
    gradient_.assign(values.size(), false);
    for (auto id : p_.weights())
        gradient_[id] = true;
    for (auto id : p_.inputs())
        gradient_[id] = o_.input_gradients && values[id].type != dtype::i64;
    for (const auto& n : p_.nodes()) {
        bool any = false;
        for (auto id : n.operands)
            any = any || gradient_[id];
        const bool differentiable = n.custom || rules_named(n.op).differentiable;
        for (auto id : n.results)
            gradient_[id] = any && differentiable && values[id].type != dtype::i64;
    }
}

XSHARD_DECL std::vector<operand_type> program_costs::types_of(const program_node& n) const {
    std::vector<operand_type> types;
    for (auto id : n.operands) {
        const auto& v = p_.value(id);
        types.push_back({v.shape, v.type, v.kind == value_kind::weight});
    }
    return types;
}

XSHARD_DECL std::optional<node_way>
program_costs::try_way(const program_node& n, std::span<const operand_type> types,
                       std::vector<layout> asked) const {
    node_way w;
    w.asked = asked;
    try {
        w.choice = n.custom
                       ? n.custom->rule(types, std::move(asked), mesh_)
                       : rules_named(n.op).rule(n.attributes, types, std::move(asked), mesh_);
        // A rule may hand back what no mesh can hold (an axis on two dimensions).
        for (const auto& l : w.choice.operands)
            l.validate(mesh_);
        for (const auto& l : w.choice.results)
            l.validate(mesh_);
    } catch (const std::invalid_argument&) {
        return std::nullopt;
    } catch (const error&) {
        return std::nullopt;
    }
    std::vector<shard_type> ops, res;
    double bytes = 0;
    for (std::size_t i = 0; i < types.size(); ++i) {
        ops.push_back(
            largest_shard(types[i].shape, w.choice.operands[i], types[i].type, mesh_));
        bytes += double(volume(ops.back().local) * element_bytes(types[i].type));
    }
    for (std::size_t i = 0; i < n.results.size(); ++i) {
        const auto& v = p_.value(n.results[i]);
        res.push_back(largest_shard(v.shape, w.choice.results[i], v.type, mesh_));
        w.result_bytes += volume(res.back().local) * element_bytes(v.type);
        bytes += double(volume(res.back().local) * element_bytes(v.type));
    }
    // The backward pass does about twice the forward's arithmetic when every floating
    // operand takes a cotangent (a matmul's two products), in proportion otherwise: a
    // first layer's input takes none, and a node that no cotangent reaches (none of its
    // results takes one) runs no VJP, so streams and evaluates nothing backward.
    bool reached = false;
    for (auto id : n.results)
        reached = reached || gradient_[id];
    double floating = 0, cotangents = 0;
    for (auto id : n.operands)
        if (p_.value(id).type != dtype::i64) {
            floating += 1;
            cotangents += reached && gradient_[id] ? 1 : 0;
        }
    const double backward = floating > 0 ? 2 * cotangents / floating : 0;
    static constexpr op_rules custom_rules{}; // a custom node's: the defaults
    const auto& rules = n.custom ? custom_rules : rules_named(n.op);
    const auto& a = n.attributes;
    const double flops = rules.flops ? rules.flops(a, ops, res) : 0;
    const double smallest = rules.gemm_dimension ? rules.gemm_dimension(a, ops, res) : 0;
    const double passes = rules.passes + (reached ? rules.backward_passes : 0);
    const double functions =
        ops.empty() ? 0
                    : (rules.transcendentals + (reached ? rules.backward_transcendentals : 0)) *
                          double(volume(ops[0].local));
    const double scratch = rules.scratch_traffic ? rules.scratch_traffic(a, ops, res) : 0;
    const double messages =
        rules.kernel_seconds ? rules.kernel_seconds(a, ops, res, mesh_, o_.machine.links) : 0;
    w.compute = (1 + backward) * o_.machine.gemm_seconds(flops, smallest) +
                (passes * bytes + scratch) / o_.machine.memory_bandwidth +
                functions * o_.machine.transcendental_seconds + messages;
    w.compute *= o_.machine.scale_of(n.op);
    return w;
}

XSHARD_DECL std::vector<node_way> program_costs::ways_of(const program_node& n) const {
    const auto types = types_of(n);
    std::vector<node_way> ways;
    if (annotated(n)) {
        const op_rules* rules = n.custom ? nullptr : &rules_named(n.op);
        std::optional<node_way> w;
        std::string why = "its sharding rule refuses it";
        try {
            std::vector<layout> asked = n.annotation.in_layouts;
            if (asked.empty())
                asked = rules ? rules->resolve(n.annotation.in_strategies, mesh_)
                              : resolve_each(n.annotation.in_strategies, mesh_);
            w = try_way(n, types, std::move(asked));
        } catch (const std::exception& e) {
            why = e.what();
        }
        if (!w)
            throw error("xshard: search: node " + n.name + " (" + n.op + ") shard " +
                        n.annotation.to_string() + " cannot run on mesh(" + mesh_.to_string() +
                        "): " + why);
        return {std::move(*w)};
    }
    // Each operand's layouts; where their combinations are too many, the later operands
    // place at most one axis.
    std::vector<std::vector<layout>> each;
    double combinations = 1;
    for (const auto& t : types) {
        each.push_back(operand_layouts(t.shape.size(), mesh_, mesh_.ndim()));
        combinations *= double(each.back().size());
    }
    for (std::size_t i = 1; combinations > 20000 && i < types.size(); ++i) {
        combinations /= double(each[i].size());
        each[i] = operand_layouts(types[i].shape.size(), mesh_, 1);
        combinations *= double(each[i].size());
    }
    std::set<std::string> seen;
    std::vector<std::size_t> at(types.size(), 0);
    while (true) {
        std::vector<layout> asked;
        for (std::size_t i = 0; i < types.size(); ++i)
            asked.push_back(each[i][at[i]]);
        if (auto w = try_way(n, types, asked)) {
            if (seen.insert(program_strategy::choice_text(w->choice)).second)
                ways.push_back(std::move(*w));
        }
        std::size_t i = 0;
        while (i < at.size() && ++at[i] == each[i].size())
            at[i++] = 0;
        if (i == at.size())
            break;
    }
    if (ways.empty())
        throw error("xshard: search: node " + n.name + " (" + n.op +
                    ") has no way to run on mesh(" + mesh_.to_string() + ")");
    if (ways.size() > o_.max_ways) {
        std::stable_sort(ways.begin(), ways.end(), [](const node_way& a, const node_way& b) {
            return a.compute < b.compute;
        });
        ways.resize(o_.max_ways);
    }
    return ways;
}

XSHARD_DECL double program_costs::price(const layout& from, const layout& to,
                                        const value_shape& shape, dtype t) const {
    if (from == to)
        return 0;
    price_key key{from, to, shape, t};
    if (auto it = prices_.find(key); it != prices_.end())
        return it->second;
    auto it = pricers_.find(element_bytes(t));
    if (it == pricers_.end())
        it = pricers_
                 .emplace(element_bytes(t),
                          redistribution_pricer(mesh_, o_.machine.links, element_bytes(t)))
                 .first;
    const double s =
        priced(it->second, from, to, shape, std::make_index_sequence<max_tensor_rank + 1>{});
    prices_.emplace(std::move(key), s);
    return s;
}

XSHARD_DECL double program_costs::edge_price(std::size_t id, const layout& from,
                                             const layout& to) const {
    const auto& v = p_.value(id);
    double s = price(from, to, v.shape, v.type);
    if (gradient_[id])
        s += price(cotangent_layout(to, mesh_), cotangent_layout(from, mesh_), v.shape, v.type);
    return s;
}

XSHARD_DECL const layout& program_costs::kept(std::size_t k, std::size_t i, std::size_t j) const {
    const auto& n = p_.nodes()[k];
    return o_.keep_annotations && j < n.annotation.out_layouts.size()
               ? n.annotation.out_layouts[j]
               : ways_[k][i].choice.results[j];
}

XSHARD_DECL void program_costs::add_edges() {
    sync_.assign(ways_.size(), {});
    for (std::size_t k = 0; k < ways_.size(); ++k) {
        const auto& n = p_.nodes()[k];
        for (std::size_t i = 0; i < n.operands.size(); ++i) {
            const auto id = n.operands[i];
            const auto& v = p_.value(id);
            if (v.kind == value_kind::input) {
                for (std::size_t c = 0; c < ways_[k].size(); ++c)
                    problem_.unary[k][c] +=
                        edge_price(id, inputs_.at(id), ways_[k][c].choice.operands[i]);
            } else if (v.kind == value_kind::weight) {
                add_weight_use(k, i, id);
            } else {
                const std::size_t u = producer_[id].first, j = producer_[id].second;
                add_value_edge(
                    id, u, k, [&](std::size_t iu) -> const layout& { return kept(u, iu, j); },
                    [&](std::size_t ik) -> const layout& {
                        return ways_[k][ik].choice.operands[i];
                    });
            }
        }
    }
}

XSHARD_DECL void program_costs::add_weight_use(std::size_t k, std::size_t i, std::size_t id) {
    auto first = first_use_.find(id);
    if (first == first_use_.end()) {
        first_use_[id] = {k, i};
        const auto& v = p_.value(id);
        if (sync_[k].empty())
            sync_[k].assign(ways_[k].size(), 0.0);
        for (std::size_t c = 0; c < ways_[k].size(); ++c) {
            const auto w = whole_terms(ways_[k][c].choice.operands[i]);
            const double local = double(local_bytes(v, w));
            const double s = price(cotangent_layout(w, mesh_), w, v.shape, v.type) +
                             o_.machine.update_seconds(local, local);
            sync_[k][c] += s;
            problem_.unary[k][c] += s;
            memory_[k][c] += double(weight_bytes(v, w));
        }
        return;
    }
    const std::size_t f = first->second.first, fi = first->second.second;
    auto weight = [&](std::size_t c) {
        return whole_terms(ways_[f][c].choice.operands[fi]);
    };
    if (f == k) {
        for (std::size_t c = 0; c < ways_[k].size(); ++c)
            problem_.unary[k][c] += edge_price(id, weight(c), ways_[k][c].choice.operands[i]);
        return;
    }
    std::vector<layout> first_layouts;
    for (std::size_t c = 0; c < ways_[f].size(); ++c)
        first_layouts.push_back(weight(c));
    add_value_edge(
        id, f, k, [&](std::size_t a) -> const layout& { return first_layouts[a]; },
        [&](std::size_t b) -> const layout& { return ways_[k][b].choice.operands[i]; });
}

XSHARD_DECL void program_costs::runner_up(std::size_t k, const std::vector<std::size_t>& pick,
                                          node_strategy& ns) const {
    double memory = 0;
    for (std::size_t v = 0; v < pick.size(); ++v)
        memory += memory_[v][pick[v]];
    auto local = [&](std::size_t c) {
        double t = problem_.unary[k][c];
        for (const auto& e : problem_.edges) {
            if (e.a == k)
                t += e.cost[c * ways_[e.b].size() + pick[e.b]];
            else if (e.b == k)
                t += e.cost[pick[e.a] * ways_[k].size() + c];
        }
        return t;
    };
    const double chosen = local(pick[k]);
    for (std::size_t c = 0; c < ways_[k].size(); ++c) {
        if (c == pick[k] || memory - memory_[k][pick[k]] + memory_[k][c] > o_.memory_per_rank)
            continue;
        const double loss = local(c) - chosen;
        if (!ns.runner_up || loss < ns.runner_up_loss) {
            ns.runner_up = ways_[k][c].choice;
            ns.runner_up_loss = loss;
        }
    }
}

XSHARD_DECL std::size_t
program_costs::price_key_hash::operator()(const price_key& k) const noexcept {
    std::size_t h = std::hash<layout>{}(k.from) * 31 + std::hash<layout>{}(k.to);
    for (const auto e : k.shape)
        h = h * 1000003 + e;
    return h * 7 + std::size_t(k.type);
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

