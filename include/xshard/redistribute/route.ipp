#pragma once
/// \file
/// The definitions of what redistribute/route.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/redistribute/route.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL std::vector<int> corner_ranks(const mesh_shape& mesh) {
    std::vector<std::vector<int>> coords;
    for (int size : mesh.sizes) {
        std::vector<int> c{0, 1, size / 2, size - 1};
        std::erase_if(c, [&](int x) { return x >= size; });
        std::sort(c.begin(), c.end());
        c.erase(std::unique(c.begin(), c.end()), c.end());
        coords.push_back(c);
    }
    std::vector<int> ranks;
    std::vector<std::size_t> at(coords.size(), 0);
    while (true) { // row-major over ascending coordinates: ascending ranks
        long long r = 0;
        for (std::size_t a = 0; a < coords.size(); ++a)
            r = r * mesh.sizes[a] + coords[a][at[a]];
        ranks.push_back(int(r));
        std::size_t a = coords.size();
        while (a > 0 && ++at[a - 1] == coords[a - 1].size())
            at[--a] = 0;
        if (a == 0)
            break;
    }
    return ranks;
}

XSHARD_DECL std::vector<int> priced_ranks(const mesh_shape& mesh) {
    auto ranks = candidate_ranks(mesh);
    if (mesh.size() <= 256)
        return ranks;
    const auto corners = corner_ranks(mesh);
    ranks.insert(ranks.end(), corners.begin(), corners.end());
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    return ranks;
}

XSHARD_DECL layout canonical(const layout& l, const mesh_shape& mesh) {
    layout c = l;
    c.partial.clear();
    for (const auto& a : mesh.names)
        if (l.partial.contains(a))
            c.partial.push_back(a);
    if (c.partial.empty())
        c.op = reduction::sum;
    c.dynamic = false;
    return c;
}

XSHARD_DECL dim_axes unit_axes(const mesh_shape& mesh) {
    dim_axes unit;
    for (std::size_t i = 0; i < mesh.ndim(); ++i)
        if (mesh.sizes[i] == 1)
            unit.push_back(mesh.names[i]);
    return unit;
}

XSHARD_DECL mesh_shape without_unit_axes(const mesh_shape& mesh) {
    mesh_shape m;
    for (std::size_t i = 0; i < mesh.ndim(); ++i)
        if (mesh.sizes[i] > 1) {
            m.names.push_back(mesh.names[i]);
            m.sizes.push_back(mesh.sizes[i]);
        }
    return m;
}

XSHARD_DECL layout without_axes(const layout& l, const dim_axes& unit) {
    layout r = l;
    for (auto& d : r.dims)
        for (const auto& a : unit)
            remove_axis(d, a);
    for (const auto& a : unit)
        remove_axis(r.partial, a);
    if (!r.is_partial())
        r.op = reduction::sum;
    return r;
}

XSHARD_DECL std::vector<layout> all_layouts_on(const mesh_shape& mesh, std::size_t rank,
                                               const static_vector<reduction, 2>& ops,
                                               std::size_t limit) {
    std::vector<layout> done;
    bool over = false;
    std::vector<layout> partial_free{layout::replicated(rank)};
    // Place the axes one by one; an axis marked partial goes to `partial` (op set later).
    for (const auto& a : mesh.names) {
        std::vector<layout> next;
        for (const auto& l : partial_free) {
            next.push_back(l); // replicated
            layout p = l;
            p.partial.push_back(a);
            next.push_back(p);
            for (std::size_t d = 0; d < rank; ++d)
                for (std::size_t pos = 0; pos <= l.dims[d].size(); ++pos) {
                    layout s = l;
                    dim_axes axes;
                    for (std::size_t i = 0; i < l.dims[d].size(); ++i) {
                        if (i == pos)
                            axes.push_back(a);
                        axes.push_back(l.dims[d][i]);
                    }
                    if (pos == l.dims[d].size())
                        axes.push_back(a);
                    s.dims[d] = axes;
                    next.push_back(s);
                }
            if (next.size() > limit) {
                over = true;
                break;
            }
        }
        if (over)
            return {};
        partial_free = std::move(next);
    }
    for (const auto& l : partial_free) {
        if (l.partial.empty()) {
            done.push_back(l);
            continue;
        }
        for (auto op : ops) {
            layout c = l;
            c.op = op;
            done.push_back(c);
        }
    }
    return done;
}

XSHARD_DECL std::optional<step> edge(const layout& x, const layout& y) {
    if (x == y)
        return std::nullopt;
    const bool same_splits = x.dims == y.dims;
    if (x.partial == y.partial && x.op == y.op)
        return classify(x, y);
    if (same_splits) {
        // all_reduce of the partial axes y lacks (y's partial a subset of x's).
        bool subset = y.partial.size() < x.partial.size() && (y.partial.empty() || y.op == x.op);
        for (const auto& a : y.partial)
            subset = subset && x.partial.contains(a);
        if (subset) {
            dim_axes reduced;
            for (const auto& a : x.partial)
                if (!y.partial.contains(a))
                    reduced.push_back(a);
            return step{step_kind::all_reduce, x, y, reduced, 0, 0};
        }
        // zero of axes replicated in x (x's partial a subset of y's).
        bool grows = x.partial.size() < y.partial.size() && (x.partial.empty() || y.op == x.op);
        for (const auto& a : x.partial)
            grows = grows && y.partial.contains(a);
        if (grows) {
            dim_axes zeroed;
            for (const auto& a : y.partial)
                if (!x.partial.contains(a))
                    zeroed.push_back(a);
            return step{step_kind::zero, x, y, zeroed, 0, 0};
        }
        return std::nullopt;
    }
    // reduce_scatter of one partial axis into the minor end of one dimension: y keeps every
    // other partial axis of x (a subset: on three axes or more, y could otherwise name a
    // partial axis x splits or replicates, and the edge would claim a reduction it skips).
    if (y.partial.size() + 1 != x.partial.size() || (!y.partial.empty() && y.op != x.op))
        return std::nullopt;
    std::optional<axis_name> axis;
    for (const auto& a : y.partial)
        if (!x.partial.contains(a))
            return std::nullopt;
    for (const auto& a : x.partial)
        if (!y.partial.contains(a))
            axis = a;
    if (!axis)
        return std::nullopt;
    for (std::size_t d = 0; d < x.rank(); ++d) {
        if (y.dims[d] == x.dims[d])
            continue;
        layout grown = x;
        grown.dims[d].push_back(*axis);
        if (!(grown.dims == y.dims))
            return std::nullopt;
        return make_step(step_kind::reduce_scatter, x, y, *axis, d);
    }
    return std::nullopt;
}

XSHARD_DECL std::shared_ptr<const route_graph>
route_graph_of(const mesh_shape& mesh, std::size_t rank, const static_vector<reduction, 2>& ops,
               std::size_t limit) {
    std::string key = std::to_string(rank) + "/" + std::to_string(limit) + "/";
    for (auto op : ops)
        key += std::to_string(int(op)) + ",";
    for (const auto& a : mesh.names)
        key += "/" + std::string(a.view());
    thread_local std::vector<std::pair<std::string, std::shared_ptr<const route_graph>>> cache;
    for (const auto& [k, g] : cache)
        if (k == key)
            return g;
    auto g = std::make_shared<route_graph>();
    g->nodes = all_layouts_on(mesh, rank, ops, limit);
    if (g->nodes.empty()) {
        g = nullptr;
    } else {
        const std::size_t n = g->nodes.size();
        g->out.resize(n);
        for (std::size_t i = 0; i < n; ++i)
            for (std::size_t j = 0; j < n; ++j)
                if (auto e = edge(g->nodes[i], g->nodes[j]))
                    g->out[i].push_back({j, e->kind, e->dim, e->dim2, e->axes});
    }
    if (cache.size() == 64)
        cache.erase(cache.begin());
    cache.emplace_back(std::move(key), g);
    return g;
}

XSHARD_DECL arc_prices& arc_prices_of(const std::shared_ptr<const route_graph>& graph,
                                      const mesh_shape& mesh, std::span<const std::size_t> shape,
                                      std::size_t element, const cost_model& model,
                                      const reduce_tuning& tuning, const std::vector<int>& ranks) {
    struct key {
        std::shared_ptr<const route_graph> graph; // held, so that its address stays its own
        mesh_shape mesh;
        std::vector<std::size_t> shape;
        std::size_t element;
        cost_model model;
        reduce_tuning tuning;
        std::vector<int> ranks;
        bool operator==(const key&) const = default;
    };
    thread_local std::vector<std::pair<key, std::unique_ptr<arc_prices>>> cache;
    key k{graph, mesh, {shape.begin(), shape.end()}, element, model, tuning, ranks};
    const auto hit =
        std::find_if(cache.begin(), cache.end(), [&](const auto& e) { return e.first == k; });
    if (hit != cache.end()) {
        std::rotate(hit, hit + 1, cache.end());
        return *cache.back().second;
    }
    if (cache.size() == 128)
        cache.erase(cache.begin());
    auto prices = std::make_unique<arc_prices>();
    prices->out.resize(graph->out.size());
    for (std::size_t i = 0; i < graph->out.size(); ++i)
        prices->out[i].resize(graph->out[i].size());
    cache.emplace_back(std::move(k), std::move(prices));
    return *cache.back().second;
}

XSHARD_DECL bool preferred(const priced_route& a, const priced_route& b) {
    if (a.seconds < b.seconds * (1 - 1e-12))
        return true;
    if (a.seconds > b.seconds * (1 + 1e-12))
        return false;
    const auto exchanges = [](const priced_route& r) {
        return std::count_if(r.steps.begin(), r.steps.end(),
                             [](const step& s) { return s.kind == step_kind::exchange; });
    };
    return a.steps.size() < b.steps.size() ||
           (a.steps.size() == b.steps.size() && exchanges(a) < exchanges(b));
}

XSHARD_DECL std::optional<priced_route>
shortest_route(const layout& from, const layout& to, const mesh_shape& mesh,
               std::span<const std::size_t> shape, std::size_t element, const cost_model& model,
               const reduce_tuning& tuning, double bound, const std::vector<int>& priced,
               const step_pricer& price) {
    if (from == to)
        return priced_route{};
    static_vector<reduction, 2> ops;
    for (const layout* l : {&from, &to})
        if (l->is_partial() && !ops.contains(l->op))
            ops.push_back(l->op);
    if (ops.empty())
        ops.push_back(reduction::sum);
    const auto graph = route_graph_of(mesh, from.rank(), ops, max_route_layouts);
    if (!graph)
        return std::nullopt;
    const auto& nodes = graph->nodes;
    const auto a = canonical(from, mesh), c = canonical(to, mesh);
    const auto index = [&](const layout& l) {
        return std::size_t(std::find(nodes.begin(), nodes.end(), l) - nodes.begin());
    };
    const std::size_t n = nodes.size(), source = index(a), target = index(c);
    if (source == n || target == n)
        return std::nullopt;
    if (source == target) { // the same layout written differently: nothing moves
        priced_route r;
        return r;
    }
    const auto ranks = priced.empty() ? priced_ranks(mesh) : priced;
    auto& prices = arc_prices_of(graph, mesh, shape, element, model, tuning, ranks);
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<double> dist(n, inf);
    std::vector<std::size_t> prev(n, n);
    std::vector<const route_graph::arc*> via(n, nullptr);
    std::vector<bool> settled(n, false);
    using entry = std::pair<double, std::size_t>;
    std::priority_queue<entry, std::vector<entry>, std::greater<>> queue;
    dist[source] = 0;
    queue.push({0, source});
    while (!queue.empty()) {
        const auto [d, i] = queue.top();
        queue.pop();
        if (settled[i])
            continue;
        settled[i] = true;
        if (i == target || d >= bound)
            break;
        for (std::size_t k = 0; k < graph->out[i].size(); ++k) {
            const auto& arc = graph->out[i][k];
            const std::size_t j = arc.to;
            if (settled[j])
                continue;
            // Priced only as far as it could shorten the route to j (or stay within bound):
            // the same shortest routes, most edges dismissed on their first rank. A price
            // known at or past the limit dismisses the edge without pricing it again.
            const double limit = std::min(dist[j], std::max(bound, d)) - d;
            auto& known = prices.out[i][k];
            if (known.bound >= limit)
                continue;
            std::optional<double> seconds = known.bound;
            if (!known.exact) {
                seconds = price(graph->step_of(i, arc), ranks, limit);
                // Without a price, the step costs at least `limit` (or is invalid).
                known = seconds ? arc_prices::known{*seconds, true}
                                : arc_prices::known{limit, false};
                if (!seconds)
                    continue;
            }
            dist[j] = d + *seconds;
            prev[j] = i;
            via[j] = &arc;
            queue.push({dist[j], j});
        }
    }
    if (!settled[target] || dist[target] == inf)
        return std::nullopt;
    priced_route r;
    r.seconds = dist[target];
    std::vector<step> back;
    for (std::size_t j = target; j != source; j = prev[j])
        back.push_back(graph->step_of(prev[j], *via[j]));
    for (auto it = back.rbegin(); it != back.rend(); ++it)
        r.steps.push_back(*it);
    // The ends as the caller wrote them (the same layouts; partial axes in its order).
    r.steps[0].from = from;
    r.steps.back().to = to;
    return r;
}

} // namespace detail

} // namespace xshard

