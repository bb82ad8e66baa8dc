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

#include <xshard/compiled.hpp>
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
XSHARD_DECL std::vector<int> corner_ranks(const mesh_shape& mesh);

/// The ranks a plan is priced on: every rank of a mesh of at most 256; on larger ones a stride
/// of 64 ranks (choose_candidate's) and the corner ranks. Every rank works out the same list.
XSHARD_DECL std::vector<int> priced_ranks(const mesh_shape& mesh);

/// `l` with its partial axes in mesh order and the reduction `sum` when nothing is partial:
/// layouts that mean the same compare equal.
XSHARD_DECL layout canonical(const layout& l, const mesh_shape& mesh);

/// The axes of `mesh` of size 1.
XSHARD_DECL dim_axes unit_axes(const mesh_shape& mesh);

/// `mesh` without its axes of size 1. A rank keeps its number: the row-major numbering does
/// not see an axis whose only coordinate is 0.
XSHARD_DECL mesh_shape without_unit_axes(const mesh_shape& mesh);

/// `l` without the axes `unit`: the same block on every rank, since a split over one rank
/// keeps the whole dimension and a sum or max over one rank is that rank's value.
XSHARD_DECL layout without_axes(const layout& l, const dim_axes& unit);

/// Every layout of a rank-`rank` tensor on `mesh` (each axis replicated, partial with one of
/// `ops`, or splitting a dimension at any position), canonical; empty when there are more
/// than `limit` with one reduction.
XSHARD_DECL std::vector<layout> all_layouts_on(const mesh_shape& mesh, std::size_t rank,
                                               const static_vector<reduction, 2>& ops,
                                               std::size_t limit);

/// The single step from `x` to `y` (canonical layouts), if the graph has that edge.
XSHARD_DECL std::optional<step> edge(const layout& x, const layout& y);

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
XSHARD_DECL std::shared_ptr<const route_graph>
route_graph_of(const mesh_shape& mesh, std::size_t rank, const static_vector<reduction, 2>& ops,
               std::size_t limit);

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
XSHARD_DECL arc_prices& arc_prices_of(const std::shared_ptr<const route_graph>& graph,
                                      const mesh_shape& mesh, std::span<const std::size_t> shape,
                                      std::size_t element, const cost_model& model,
                                      const reduce_tuning& tuning, const std::vector<int>& ranks);

/// Whether route `a` is to run rather than `b`: it is cheaper, or as cheap (within a
/// relative 1e-12: sums of the same terms in another order) and plainer: fewer steps, or as
/// many with fewer exchanges (a reader finds a named collective by its name).
XSHARD_DECL bool preferred(const priced_route& a, const priced_route& b);

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
XSHARD_DECL std::optional<priced_route>
shortest_route(const layout& from, const layout& to, const mesh_shape& mesh,
               std::span<const std::size_t> shape, std::size_t element, const cost_model& model,
               const reduce_tuning& tuning, double bound, const std::vector<int>& priced,
               const step_pricer& price);

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

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/redistribute/route.ipp>
#else
namespace xshard {
#define XSHARD_DETAIL_ROUTE(N)                                                                     \
    XSHARD_INSTANTIATE priced_route choose_route<N>(                                               \
        const plan_candidates&, const mesh_shape&, const std::array<std::size_t, N>&, std::size_t, \
        const cost_model&, const reduce_tuning&, const std::vector<int>&);
XSHARD_COMPILED_RANKS(XSHARD_DETAIL_ROUTE)
#undef XSHARD_DETAIL_ROUTE
} // namespace xshard
#endif
