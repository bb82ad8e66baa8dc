#pragma once
/// \file
/// What a planned step means for one rank: its communicator, the regions it sends to and
/// receives from each peer, what it keeps, and what that costs. Pure arithmetic on a mesh
/// shape (no communicator). The executor (plan.hpp) runs these lists (geometry_of, one
/// entry per peer); pricing counts the same traffic without listing peers (traffic.hpp),
/// so a plan is priced on a mesh of 10^8 ranks as fast as on 4, and the two agree exactly.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/pairwise_reduce.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/core/static_vector.hpp>
#include <xshard/redistribute/copy.hpp>
#include <xshard/redistribute/cost_model.hpp>
#include <xshard/redistribute/planner.hpp>
#include <xshard/redistribute/traffic.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace xshard {

/// One rank's part in one step.
template <std::size_t N>
struct step_geometry {
    step planned;
    axis_set group; ///< the axes spanning the step's communicator
    int group_size = 1;
    int group_rank = 0;
    box<N> in_block;  ///< this rank's block before the step
    box<N> out_block; ///< and after
    /// Exchange-like steps: the global region sent to / received from each peer (by group
    /// rank). reduce_scatter: the term of each peer's piece sent, of this rank's received.
    std::vector<std::pair<int, box<N>>> sends, recvs;
    box<N> kept;            ///< the region copied from the input to the output locally
    bool holds_term = true; ///< zero: whether this rank keeps the values
    bool valid = true;      ///< reduce_scatter: whether the pieces tile the block (else unusable)
};

/// What one step costs one rank. Byte counts beyond a std::size_t read as its largest value.
struct step_summary {
    step planned;
    std::string group; ///< the axes of the communicator, "dp,mp" ("" for none)
    int group_size = 1;
    std::size_t messages = 0;
    std::size_t bytes_sent = 0;
    std::size_t bytes_received = 0;
    std::size_t bytes_copied = 0;
    std::size_t scratch_bytes = 0; ///< temporary buffers of the step
    std::size_t output_bytes = 0;  ///< the step's output block
    double seconds = 0;
};

/// What a whole plan costs one rank.
struct plan_summary {
    std::vector<step_summary> steps;
    std::size_t source_bytes = 0;
    std::size_t destination_bytes = 0;
    std::size_t peak_extra_bytes = 0; ///< intermediates and scratch, beyond source and destination
    double seconds = 0;
    bool valid = true;

    std::size_t bytes_sent() const {
        std::size_t n = 0;
        for (const auto& s : steps)
            n = detail::saturating_add(n, s.bytes_sent);
        return n;
    }
    std::size_t bytes_received() const {
        std::size_t n = 0;
        for (const auto& s : steps)
            n = detail::saturating_add(n, s.bytes_received);
        return n;
    }
};

namespace detail {

XSHARD_DECL std::string axes_string(const mesh_shape& mesh, axis_set axes);

template <std::size_t N>
bool contains(const box<N>& outer, const box<N>& inner) {
    return inner.empty() || outer.intersect(inner) == inner;
}

} // namespace detail

/// Whether a reduce_scatter's transfers are pipelined in chunks: when every piece is one
/// contiguous run of the (common) input block. Every member decides alike.
template <std::size_t N>
bool pipelined(const step_geometry<N>& g) {
    bool all = detail::is_contiguous_in(g.in_block.extent, g.out_block);
    for (const auto& [peer, region] : g.sends)
        all = all && detail::is_contiguous_in(g.in_block.extent, region);
    return all;
}

/// The part rank `rank` of `mesh` plays in step `s` on a tensor of global `shape`.
template <std::size_t N>
step_geometry<N> geometry_of(const step& s, const mesh_shape& mesh,
                             const std::array<std::size_t, N>& shape, int rank) {
    step_geometry<N> g;
    g.planned = s;
    g.in_block = block_of(s.from, mesh, shape, rank);
    g.out_block = block_of(s.to, mesh, shape, rank);
    auto enter_group = [&](axis_set axes) {
        g.group = axes;
        g.group_size = mesh.group_size(axes);
        g.group_rank = mesh.group_rank(rank, axes);
    };
    switch (s.kind) {
    case step_kind::all_reduce:
        enter_group(detail::axes_of(mesh, s.axes));
        break;
    case step_kind::zero: {
        g.kept = g.out_block;
        const auto c = mesh.coords(rank);
        if (s.to.op == reduction::sum)
            for (const auto& a : s.axes)
                g.holds_term = g.holds_term && c[mesh.index(a)] == 0;
        break;
    }
    case step_kind::reduce_scatter: {
        enter_group(detail::axes_of(mesh, s.axes));
        const auto members = mesh.group_ranks(rank, g.group);
        std::size_t covered = 0;
        for (int q = 0; q < g.group_size; ++q) {
            const auto piece = block_of(s.to, mesh, shape, members[std::size_t(q)]);
            g.valid = g.valid && detail::contains(g.in_block, piece);
            covered += piece.size();
            if (q != g.group_rank && !piece.empty())
                g.sends.emplace_back(q, piece);
            if (q != g.group_rank && !g.out_block.empty())
                g.recvs.emplace_back(q, g.out_block);
        }
        g.valid = g.valid && covered == g.in_block.size();
        g.kept = g.out_block;
        break;
    }
    case step_kind::halo:
        throw std::logic_error("xshard: a halo step's geometry needs its window (halo.hpp)");
    default: { // every exchange-like step: exactly the block intersections
        enter_group(s.from.split_axes(mesh));
        const auto members = mesh.group_ranks(rank, g.group);
        for (int q = 0; q < g.group_size; ++q) {
            if (q == g.group_rank)
                continue;
            const int peer = members[std::size_t(q)];
            const auto out = g.in_block.intersect(block_of(s.to, mesh, shape, peer));
            const auto in = block_of(s.from, mesh, shape, peer).intersect(g.out_block);
            if (!out.empty())
                g.sends.emplace_back(q, out);
            if (!in.empty())
                g.recvs.emplace_back(q, in);
        }
        g.kept = g.in_block.intersect(g.out_block);
        break;
    }
    }
    return g;
}

/// The traffic of a step's geometry: its lists counted (the reference the counted
/// traffic_of(step, ...) agrees with).
template <std::size_t N>
step_traffic<N> traffic_of(const step_geometry<N>& g) {
    step_traffic<N> t;
    t.planned = g.planned;
    t.group = g.group;
    t.group_size = g.group_size;
    t.group_rank = g.group_rank;
    t.in_block = g.in_block;
    t.out_block = g.out_block;
    t.kept = g.kept;
    t.sends = g.sends.size();
    t.recvs = g.recvs.size();
    for (const auto& [peer, region] : g.sends)
        t.elements_sent += region.size();
    for (const auto& [peer, region] : g.recvs)
        t.elements_received += region.size();
    t.holds_term = g.holds_term;
    t.valid = g.valid;
    t.pipelined = g.planned.kind == step_kind::reduce_scatter && pipelined(g);
    return t;
}

/// Whether a reduce-scatter runs through MPI's collective: short pieces (`tuning`), each one
/// run of the input block (they then lie in group order: the step acts on one axis). As the
/// plan decides (plan.hpp), except for the 16-bit floats MPI cannot add, which a plan always
/// reduces pairwise.
template <std::size_t N>
bool mpi_reduce_scatter(const step_traffic<N>& t, const reduce_tuning& tuning,
                        std::size_t element) {
    return t.valid && t.pipelined &&
           !tuning.pairwise_reduce_scatter(t.in_block.size(), std::size_t(t.group_size), element);
}

namespace detail {

/// The bytes a member of an all-reduce over p ranks moves each way, 2 (p-1) n / p for n
/// bytes, rounded down as 2n - ceil(2n / p) (no overflow for any p).
constexpr std::size_t all_reduce_bytes(std::size_t n, std::size_t p) {
    const std::size_t twice = saturating_mul(2, n);
    return twice - (twice / p + (twice % p != 0 ? 1 : 0));
}

} // namespace detail

/// Seconds of MPI_Allreduce of `bytes` bytes over the ranks of `group` (`p` of them) with a
/// latency-optimal algorithm (recursive doubling, or halving and doubling): 2 ceil(log2 p)
/// rounds, 2 (p-1) / p of the bytes each way; the all_reduce link (or the group's own).
XSHARD_DECL double mpi_all_reduce_seconds(const cost_model& model, const mesh_shape& mesh,
                                          axis_set group, std::size_t p, std::size_t bytes);

/// The cost of one step for one rank, under `model` (through shared memory when `shared`).
template <std::size_t N>
step_summary summarize(const step_traffic<N>& t, const mesh_shape& mesh, std::size_t element,
                       const cost_model& model, const reduce_tuning& tuning = {},
                       bool shared = false) {
    step_summary r;
    r.planned = t.planned;
    r.group = detail::axes_string(mesh, t.group);
    r.group_size = t.group_size;
    r.output_bytes = t.out_block.size() * element;
    const std::size_t p = std::size_t(t.group_size);
    switch (t.planned.kind) {
    case step_kind::all_reduce: {
        const std::size_t count = t.in_block.size(), n = count * element;
        if (p > 1) {
            r.messages = 2 * (p - 1);
            if (tuning.pairwise_all_reduce(count, p, element)) {
                // Pairwise: every other member's segment out, then this rank's segment to
                // every other member; and the same in.
                const std::size_t mine =
                    block_extent(count, p, std::size_t(t.group_rank)) * element;
                r.bytes_sent = r.bytes_received = (n - mine) + (p - 1) * mine;
                r.scratch_bytes = tuning.scratch_elements(count / p + 1, true, element) * element;
            } else {
                // MPI_Allreduce: the rounds of a latency-optimal algorithm (recursive
                // doubling, or halving and doubling).
                r.messages = 2 * detail::ceil_log2(p);
                r.bytes_sent = r.bytes_received = detail::all_reduce_bytes(n, p);
            }
        } else {
            r.bytes_copied = n;
        }
        break;
    }
    case step_kind::zero:
        r.bytes_copied = t.holds_term ? r.output_bytes : 0;
        break;
    default:
        r.bytes_sent = detail::saturating_mul(t.elements_sent, element);
        r.bytes_received = detail::saturating_mul(t.elements_received, element);
        r.messages = std::max(t.sends, t.recvs);
        r.bytes_copied = t.kept.size() * element;
        if (t.planned.kind == step_kind::reduce_scatter) {
            if (mpi_reduce_scatter(t, tuning, element)) { // recursive halving, nothing kept apart
                r.messages = detail::ceil_log2(p);
                r.bytes_copied = 0;
            } else {
                r.scratch_bytes =
                    tuning.scratch_elements(t.out_block.size(), t.pipelined, element) * element;
            }
        }
        break;
    }
    r.seconds = model.seconds(t.planned.kind, mesh, t.group, r.messages,
                              std::max(r.bytes_sent, r.bytes_received), r.bytes_copied, shared);
    if (t.planned.kind == step_kind::all_reduce && p > 1 && !shared) {
        // The pairwise algorithm is a reduce-scatter (its rounds as that step would take
        // them) and an all-gather, priced by those links without the copies the two steps
        // would make; MPI_Allreduce, which `tuning` picks where it expects it to be faster,
        // by the all_reduce link, and never above the pairwise price. So a plan never
        // prefers the two steps to the one all-reduce.
        const std::size_t count = t.in_block.size(), n = count * element;
        const std::size_t mine = block_extent(count, p, std::size_t(t.group_rank)) * element;
        const double latency_optimal = mpi_all_reduce_seconds(model, mesh, t.group, p, n);
        const double pairwise =
            model.seconds(step_kind::reduce_scatter, mesh, t.group,
                          tuning.pairwise_reduce_scatter(count, p, element) ? p - 1
                                                                            : detail::ceil_log2(p),
                          n - mine, 0) +
            model.seconds(step_kind::all_gather, mesh, t.group, p - 1,
                          detail::saturating_mul(p - 1, mine), 0);
        r.seconds = tuning.pairwise_all_reduce(count, p, element)
                        ? pairwise
                        : std::min(latency_optimal, pairwise);
    }
    return r;
}

/// The cost of one step's geometry for one rank, under `model`.
template <std::size_t N>
step_summary summarize(const step_geometry<N>& g, const mesh_shape& mesh, std::size_t element,
                       const cost_model& model, const reduce_tuning& tuning = {}) {
    return summarize(traffic_of(g), mesh, element, model, tuning);
}

/// The cost of a sequence of steps for rank `rank`: per step, and the peak of the
/// intermediate blocks and scratch buffers alive at once.
template <std::size_t N>
plan_summary summarize(const step_list& steps, const mesh_shape& mesh,
                       const std::array<std::size_t, N>& shape, std::size_t element, int rank,
                       const cost_model& model, const reduce_tuning& tuning = {}) {
    plan_summary p;
    if (steps.empty())
        return p;
    p.source_bytes = block_of(steps[0].from, mesh, shape, rank).size() * element;
    p.destination_bytes = block_of(steps.back().to, mesh, shape, rank).size() * element;
    // What a plan holds: intermediate blocks in two alternating buffers (step i writes
    // buffer i % 2), each as large as its largest block, and the largest step's scratch.
    std::size_t buffers[2] = {0, 0}, scratch = 0;
    std::size_t tensor_bytes = element;
    for (const auto e : shape)
        tensor_bytes = detail::saturating_mul(tensor_bytes, e);
    for (std::size_t i = 0; i < steps.size(); ++i) {
        const auto t = traffic_of(steps[i], mesh, shape, rank);
        p.valid = p.valid && t.valid;
        const bool shared = model.node_local && t.valid &&
                            node_path_applies(t.planned.kind, t.group_size, tensor_bytes, tuning);
        auto s = summarize(t, mesh, element, model, tuning, shared);
        if (i + 1 < steps.size())
            buffers[i % 2] = std::max(buffers[i % 2], s.output_bytes);
        scratch = std::max(scratch, s.scratch_bytes);
        p.seconds += s.seconds;
        p.steps.push_back(std::move(s));
    }
    p.peak_extra_bytes = buffers[0] + buffers[1] + scratch;
    return p;
}

/// What a candidate costs on a set of ranks: the slowest rank's seconds for the whole
/// candidate, the sum over its steps of the slowest rank's seconds for that step (a route's
/// price, route.hpp), whether it is valid on every rank, and whether every rank's peak extra
/// memory stays within its destination block (or 64 KiB).
struct candidate_price {
    double slowest_rank = 0;
    double step_by_step = 0;
    bool valid = true;
    bool fits = true;
};

namespace detail {

/// The ranks `choose_candidate` prices on: every rank of a mesh of at most 256, else a
/// stride of 64 ranks.
XSHARD_DECL std::vector<int> candidate_ranks(const mesh_shape& mesh);

} // namespace detail

/// The prices of `c`'s candidates on `ranks`, one `summarize` per candidate and rank.
template <std::size_t N>
static_vector<candidate_price, 3>
price_candidates(const plan_candidates& c, const mesh_shape& mesh,
                 const std::array<std::size_t, N>& shape, std::size_t element,
                 const std::vector<int>& ranks, const cost_model& model,
                 const reduce_tuning& tuning = {}) {
    static_vector<candidate_price, 3> prices;
    std::vector<double> step_worst;
    for (const auto& path : c.paths) {
        candidate_price price;
        step_worst.assign(path.size(), 0);
        for (int r : ranks) {
            const auto s = summarize(path, mesh, shape, element, r, model, tuning);
            price.valid = price.valid && s.valid;
            price.fits = price.fits &&
                         s.peak_extra_bytes <= std::max(s.destination_bytes, std::size_t(1) << 16);
            price.slowest_rank = std::max(price.slowest_rank, s.seconds);
            for (std::size_t k = 0; k < s.steps.size(); ++k)
                step_worst[k] = std::max(step_worst[k], s.steps[k].seconds);
        }
        for (const double w : step_worst)
            price.step_by_step += w;
        prices.push_back(price);
    }
    return prices;
}

/// The candidate a plan runs, given its candidates' prices: the cheapest valid one for the
/// slowest rank among those that fit (the cheapest valid one if none does). Returns its
/// index; throws `error` if none is valid.
XSHARD_DECL std::size_t pick_candidate(const static_vector<candidate_price, 3>& prices);

/// The candidate a plan runs: the cheapest valid one for the slowest rank among those
/// whose peak extra memory stays within one destination block (the cheapest valid one if
/// none does), priced on `detail::candidate_ranks`. Every rank computes the same choice
/// from the same data. Returns its index in `c.paths`.
template <std::size_t N>
std::size_t choose_candidate(const plan_candidates& c, const mesh_shape& mesh,
                             const std::array<std::size_t, N>& shape, std::size_t element,
                             const cost_model& model, const reduce_tuning& tuning = {}) {
    return pick_candidate(
        price_candidates(c, mesh, shape, element, detail::candidate_ranks(mesh), model, tuning));
}

/// Prints a plan summary: one line per step (name, communicator, bytes, memory, time).
XSHARD_DECL std::string describe(const plan_summary& p, const mesh_shape& mesh);

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/redistribute/geometry.ipp>
#else
namespace xshard {
#define XSHARD_DETAIL_GEOMETRY(N)                                                                  \
    XSHARD_INSTANTIATE step_geometry<N> geometry_of<N>(const step&, const mesh_shape&,             \
                                                       const std::array<std::size_t, N>&, int);    \
    XSHARD_INSTANTIATE step_traffic<N> traffic_of<N>(const step_geometry<N>&);                     \
    XSHARD_INSTANTIATE step_summary summarize<N>(const step_traffic<N>&, const mesh_shape&,        \
                                                 std::size_t, const cost_model&,                   \
                                                 const reduce_tuning&, bool);                      \
    XSHARD_INSTANTIATE plan_summary summarize<N>(const step_list&, const mesh_shape&,              \
                                                 const std::array<std::size_t, N>&, std::size_t,   \
                                                 int, const cost_model&, const reduce_tuning&);    \
    XSHARD_INSTANTIATE static_vector<candidate_price, 3> price_candidates<N>(                      \
        const plan_candidates&, const mesh_shape&, const std::array<std::size_t, N>&, std::size_t, \
        const std::vector<int>&, const cost_model&, const reduce_tuning&);
XSHARD_COMPILED_RANKS(XSHARD_DETAIL_GEOMETRY)
#undef XSHARD_DETAIL_GEOMETRY
} // namespace xshard
#endif
