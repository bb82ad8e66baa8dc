#pragma once
/// \file
/// The cheapest route of a redistribution: the planner's candidates (planner.hpp) are three
/// greedy step sequences, and a greedy sequence can cost more than going through a third
/// layout (on random layout triples about one in twenty: an all-reduce priced above its
/// reduce-scatter plus all-gather, an exchange whose bytes an all-gather moves cheaper, an
/// exchange that feeds ranks a later zero step clears). A price with that flaw is not a
/// distance, and a search minimising it (search/cost.hpp) is misled, as PyTorch's planner was.
///
/// So a plan also searches the graph whose nodes are every layout of the tensor on the mesh
/// and whose edges are single steps (an exchange-like step between any two layouts with the
/// same pending reduction, named when it is one: all_gather, slice, all_to_all; all_reduce
/// of some partial axes; reduce_scatter of one into a dimension's minor end; zero of some
/// replicated axes), each edge priced for the slowest priced rank under the cost model.
/// A route's price is the sum of its steps' (steps are collective: each waits for its
/// slowest member), and the shortest route (Dijkstra) is a distance by construction: for
/// any layouts a, b, c, price(a, c) <= price(a, b) + price(b, c), and never above the
/// cheapest candidate's. The graph has 4 layouts for a matrix on one axis, 18 on two (28 and
/// 40 for rank-3 and rank-4 tensors), 92 on three (176 for a rank-3 tensor; 168 for a vector
/// on four axes); past `max_route_layouts` (a rank-4 tensor on three axes: 296; a matrix on
/// four: 536) the plan keeps the candidates alone, and the property is not promised there.
///
/// Axes of size 1 take no part: a plan on a mesh with such axes is the plan on the mesh
/// without them, for the layouts without them (a split over one rank keeps the whole
/// dimension, a reduction over one rank is done), so `[mp, -]` -> `[-, -]` on (dp=1, mp=4) is
/// one all_gather(mp), never a slice over dp followed by an exchange.
///
/// Speed: the graph's structure depends on the axis names, the tensor's rank and the
/// reductions only, so it is built once per thread and kept (route_graph_of); the search
/// prices an edge rank by rank and drops it as soon as one rank prices it past what could
/// shorten the route (rank 0 first: it holds the largest blocks), so most edges cost one
/// rank's count. Measured (one core, 4-byte elements, random layout pairs with partial
/// states and shapes up to 3000, sum and max): a matrix on 2x2x2 1.8 ms per plan (worst
/// 4.7 ms), on 2x4x8 / 4x4x4 / 2x2x16 (64 ranks) 5.8-6.9 ms (worst 17 ms); a rank-3 tensor
/// 7.7 ms on 2x2x2 and 10-16 ms at 64 ranks; a vector 0.2-1.8 ms. Before (a graph built
/// per plan, every edge priced on every rank): 9.6 ms and 58-66 ms for a matrix, 25-1200 ms
/// for rank 3 and 4. A rank-4 tensor on three axes would take 20-40 ms, hence the bound.
/// The prices of the steps depend on the tensor and the mesh, not on the pair of layouts,
/// so a thread keeps what it priced per tensor, mesh and model (arc_prices_of), and the
/// routes between other pairs of layouts of that tensor read those prices instead of pricing
/// again: the same routes, an order of magnitude sooner (benchmarks/README.md).

#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/redistribute/geometry.hpp>
#include <xshard/redistribute/planner.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace xshard {

/// Most layouts (with one reduction) the route search enumerates: tensors up to rank 3 on
/// meshes of three axes (see the file comment).
inline constexpr std::size_t max_route_layouts = 176;

/// A sequence of steps and its price (seconds, the sum over steps of the slowest priced
/// rank's).
struct priced_route {
    step_list steps;
    double seconds = 0;
    bool valid = true;
};

namespace detail {

/// The ranks whose coordinates are 0, 1, the middle or the last on every axis of `mesh`,
/// ascending: blocks of a dimension have at most two sizes, the larger first, so these meet
/// every kind of block and neighbour.
inline std::vector<int> corner_ranks(const mesh_shape& mesh) {
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

/// The ranks a plan is priced on: every rank of a mesh of at most 256; on larger ones a stride
/// of 64 ranks (choose_candidate's) and the corner ranks. Every rank works out the same list.
inline std::vector<int> priced_ranks(const mesh_shape& mesh) {
    auto ranks = candidate_ranks(mesh);
    if (mesh.size() <= 256)
        return ranks;
    const auto corners = corner_ranks(mesh);
    ranks.insert(ranks.end(), corners.begin(), corners.end());
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    return ranks;
}

/// `l` with its partial axes in mesh order and the reduction `sum` when nothing is partial:
/// layouts that mean the same compare equal.
inline layout canonical(const layout& l, const mesh_shape& mesh) {
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

/// The axes of `mesh` of size 1.
inline dim_axes unit_axes(const mesh_shape& mesh) {
    dim_axes unit;
    for (std::size_t i = 0; i < mesh.ndim(); ++i)
        if (mesh.sizes[i] == 1)
            unit.push_back(mesh.names[i]);
    return unit;
}

/// `mesh` without its axes of size 1. A rank keeps its number: the row-major numbering does
/// not see an axis whose only coordinate is 0.
inline mesh_shape without_unit_axes(const mesh_shape& mesh) {
    mesh_shape m;
    for (std::size_t i = 0; i < mesh.ndim(); ++i)
        if (mesh.sizes[i] > 1) {
            m.names.push_back(mesh.names[i]);
            m.sizes.push_back(mesh.sizes[i]);
        }
    return m;
}

/// `l` without the axes `unit`: the same block on every rank, since a split over one rank
/// keeps the whole dimension and a sum or max over one rank is that rank's value.
inline layout without_axes(const layout& l, const dim_axes& unit) {
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

/// Every layout of a rank-`rank` tensor on `mesh` (each axis replicated, partial with one of
/// `ops`, or splitting a dimension at any position), canonical; empty when there are more
/// than `limit` with one reduction.
inline std::vector<layout> all_layouts_on(const mesh_shape& mesh, std::size_t rank,
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

/// The single step from `x` to `y` (canonical layouts), if the graph has that edge.
inline std::optional<step> edge(const layout& x, const layout& y) {
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

/// The graph of a tensor's layouts on a mesh: its nodes (all_layouts_on) and, per node, the
/// single steps out of it (edge). It depends on the axis names, the tensor's rank and the
/// reductions only (not on sizes or shapes), so it is built once per thread for each and kept.
struct route_graph {
    /// A step between two nodes, without its layouts (a step holds two: about 2 KiB).
    struct arc {
        std::size_t to = 0;
        step_kind kind = step_kind::exchange;
        std::uint8_t dim = 0, dim2 = 0;
        dim_axes axes;
    };
    std::vector<layout> nodes;
    std::vector<std::vector<arc>> out; ///< the steps out of each node

    step step_of(std::size_t from, const arc& a) const {
        return step{a.kind, nodes[from], nodes[a.to], a.axes, a.dim, a.dim2};
    }
};

/// The route graph of a rank-`rank` tensor on meshes with `mesh`'s axis names; null past
/// `limit` layouts. Cached per thread (at most 64 graphs; the oldest go first).
inline std::shared_ptr<const route_graph> route_graph_of(const mesh_shape& mesh, std::size_t rank,
                                                         const static_vector<reduction, 2>& ops,
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

/// What is known of the prices of a route graph's steps for one tensor on one mesh, per arc
/// (mirroring `route_graph::out`): a lower bound on the step's price, and whether the bound
/// is the price. `cheapest_route` fills it as it prices, so that the routes between other
/// pairs of layouts of the same tensor reuse what earlier searches priced.
struct arc_prices {
    struct known {
        double bound = 0; ///< prices are never negative
        bool exact = false;
    };
    std::vector<std::vector<known>> out;
};

/// The arc prices of `graph` for a tensor of global `shape` and `element` bytes on `mesh`,
/// priced on `ranks` under `model` and `tuning`. Cached per thread (at most 128 tensors; the
/// least recently used go first).
inline arc_prices& arc_prices_of(const std::shared_ptr<const route_graph>& graph,
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

/// Whether route `a` is to run rather than `b`: it is cheaper, or as cheap (within a
/// relative 1e-12: sums of the same terms in another order) and plainer: fewer steps, or as
/// many with fewer exchanges (a reader finds a named collective by its name).
inline bool preferred(const priced_route& a, const priced_route& b) {
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

} // namespace detail

/// The price of one step for a tensor of global `shape`: the slowest of `ranks` (as
/// `summarize` prices it inside a plan), and whether it is valid on all of them.
template <std::size_t N>
std::pair<double, bool> price_step(const step& s, const mesh_shape& mesh,
                                   const std::array<std::size_t, N>& shape, std::size_t element,
                                   const std::vector<int>& ranks, const cost_model& model,
                                   const reduce_tuning& tuning = {}) {
    std::size_t tensor_bytes = element;
    for (const auto e : shape)
        tensor_bytes = detail::saturating_mul(tensor_bytes, e);
    double worst = 0;
    bool valid = true;
    for (int rank : ranks) {
        const auto t = traffic_of(s, mesh, shape, rank);
        valid = valid && t.valid;
        const bool shared = model.node_local && t.valid &&
                            node_path_applies(t.planned.kind, t.group_size, tensor_bytes, tuning);
        worst = std::max(worst, summarize(t, mesh, element, model, tuning, shared).seconds);
    }
    return {worst, valid};
}

/// `price_step`, or nullopt as soon as some rank of `ranks` prices the step at `limit` or
/// more, or finds it invalid (the route search skips such edges: they cannot shorten a
/// route; the first of `ranks`, rank 0, holds the largest blocks and usually decides).
template <std::size_t N>
std::optional<double> price_step_below(const step& s, const mesh_shape& mesh,
                                       const std::array<std::size_t, N>& shape, std::size_t element,
                                       const std::vector<int>& ranks, const cost_model& model,
                                       const reduce_tuning& tuning, double limit) {
    std::size_t tensor_bytes = element;
    for (const auto e : shape)
        tensor_bytes = detail::saturating_mul(tensor_bytes, e);
    double worst = 0;
    for (int rank : ranks) {
        const auto t = traffic_of(s, mesh, shape, rank);
        if (!t.valid)
            return std::nullopt;
        const bool shared = model.node_local &&
                            node_path_applies(t.planned.kind, t.group_size, tensor_bytes, tuning);
        worst = std::max(worst, summarize(t, mesh, element, model, tuning, shared).seconds);
        if (worst >= limit)
            return std::nullopt;
    }
    return worst;
}

/// The price of `steps` for a tensor of global `shape`: per step the slowest of `ranks`,
/// summed; invalid when a step is on some rank (a reduce_scatter whose pieces do not tile).
template <std::size_t N>
priced_route price_route(const step_list& steps, const mesh_shape& mesh,
                         const std::array<std::size_t, N>& shape, std::size_t element,
                         const std::vector<int>& ranks, const cost_model& model,
                         const reduce_tuning& tuning = {}) {
    priced_route r{steps, 0, true};
    for (const auto& s : steps) {
        const auto [seconds, valid] = price_step(s, mesh, shape, element, ranks, model, tuning);
        r.valid = r.valid && valid;
        r.seconds += seconds;
    }
    return r;
}

namespace detail {

/// How `shortest_route` prices a step: its price on the given ranks, or nullopt when some
/// rank prices it at the limit or more, or finds it invalid (`price_step_below`).
using step_pricer = std::function<std::optional<double>(const step&, const std::vector<int>& ranks,
                                                         double limit)>;

/// `cheapest_route` for a tensor of global `shape` whose steps `price` prices: the part that
/// does not depend on the tensor's rank.
inline std::optional<priced_route>
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

/// The cheapest route `from` -> `to` (see the file comment): the shortest in the graph of
/// single steps when the tensor has at most `max_route_layouts` layouts on the mesh, nullopt
/// otherwise. Every rank computes the same route from the same data.
template <std::size_t N>
std::optional<priced_route>
cheapest_route(const layout& from, const layout& to, const mesh_shape& mesh,
               const std::array<std::size_t, N>& shape, std::size_t element,
               const cost_model& model, const reduce_tuning& tuning = {},
               double bound = std::numeric_limits<double>::infinity(),
               const std::vector<int>& priced = {}) {
    return detail::shortest_route(
        from, to, mesh, shape, element, model, tuning, bound, priced,
        [&](const step& s, const std::vector<int>& ranks, double limit) {
            return price_step_below(s, mesh, shape, element, ranks, model, tuning, limit);
        });
}

/// The candidates a plan on `mesh` weighs for `from` -> `to`: `plan_redistribution`'s for the
/// layouts without the mesh's axes of size 1 (see the file comment).
inline plan_candidates candidates_on(const mesh_shape& mesh, const layout& from, const layout& to) {
    const auto unit = detail::unit_axes(mesh);
    return plan_redistribution(detail::without_axes(from, unit), detail::without_axes(to, unit));
}

/// The steps a plan runs for `c.from` -> `c.to`, and their price: the cheapest of the
/// candidates and the route, and among equally cheap ones the plainest (`preferred`: fewer
/// steps, then named collectives; `choose_candidate`'s pick among equals after that).
/// Priced on `priced` ranks (`detail::priced_ranks` when empty). Every rank computes the
/// same from the same data. On a mesh with axes of size 1 the candidates are
/// `candidates_on`'s, planned on the mesh without those axes: no step acts on one.
template <std::size_t N>
priced_route choose_route(const plan_candidates& c, const mesh_shape& mesh,
                          const std::array<std::size_t, N>& shape, std::size_t element,
                          const cost_model& model, const reduce_tuning& tuning = {},
                          const std::vector<int>& priced = {}) {
    if (c.paths.empty())
        return {};
    if (const auto unit = detail::unit_axes(mesh); !unit.empty()) {
        // Planned as on the mesh without them: steps over one rank move nothing, and a
        // route through them would price a detour that is not one.
        const auto reduced = detail::without_unit_axes(mesh);
        const auto r = candidates_on(mesh, c.from, c.to);
        if (detail::canonical(r.from, reduced) == detail::canonical(r.to, reduced))
            return {};
        return choose_route(r, reduced, shape, element, model, tuning, priced);
    }
    const auto ranks = priced.empty() ? detail::priced_ranks(mesh) : priced;
    // The candidates are priced once on choose_candidate's ranks; where those are the ranks
    // priced here (every mesh of at most 256 ranks), the same summaries give the routes'.
    const auto chosen_on = detail::candidate_ranks(mesh);
    const auto prices = price_candidates(c, mesh, shape, element, chosen_on, model, tuning);
    const auto priced_path = [&](std::size_t i) {
        if (ranks == chosen_on)
            return priced_route{c.paths[i], prices[i].step_by_step, prices[i].valid};
        return price_route(c.paths[i], mesh, shape, element, ranks, model, tuning);
    };
    auto best = priced_path(pick_candidate(prices));
    for (std::size_t i = 0; i < c.paths.size(); ++i) {
        auto p = priced_path(i);
        if (p.valid && detail::preferred(p, best))
            best = std::move(p);
    }
    const auto route = cheapest_route(c.from, c.to, mesh, shape, element, model, tuning,
                                      best.seconds * (1 + 1e-12), ranks);
    if (route && detail::preferred(*route, best))
        return *route;
    return best;
}

} // namespace xshard
