#pragma once
/// \file
/// What one step moves for one rank, counted rather than listed: messages, elements sent
/// and received, what is kept, whether a reduce_scatter's pieces tile its block. This is
/// what pricing needs (the cost model, `xshard-plan`), and it costs O(tensor rank x mesh
/// axes) per rank whatever the size of the step's group, so a plan is priced on a mesh of
/// 10^8 ranks as fast as on 4. The executor needs the per-peer regions themselves
/// (geometry.hpp lists them); the two agree exactly (tests/redistribute/test_planner.cpp
/// checks it on random meshes, layouts and shapes).
///
/// Why counting suffices: a peer's block on dimension d depends only on its coordinates on
/// the axes splitting d, and an axis splits one dimension at most; so a count over a group's
/// members (how many blocks meet this rank's block, in how many elements) is a product over
/// dimensions of one-dimensional counts. On one dimension the blocks a group's members hold
/// have block indices with some mixed-radix digits fixed (axes outside the group) and the
/// others free; the blocks meeting an interval are a contiguous range of indices, all of
/// them whole but the two at its ends, and whole blocks have two extents at most (the
/// partition rule, core/partition.hpp). So each dimension contributes at most five
/// (extent, how many members) classes.

#include <xshard/compiled.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/core/static_vector.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/redistribute/copy.hpp>
#include <xshard/redistribute/planner.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <utility>

namespace xshard {

/// One rank's traffic in one step (see the file comment). For exchange-like steps and
/// reduce_scatter, `sends` and `recvs` count the peers this rank sends a non-empty region
/// to and receives one from; `elements_sent` and `elements_received` add up those regions.
/// all_reduce and zero leave them 0 (their cost follows from the block and the group).
template <std::size_t N>
struct step_traffic {
    step planned;
    axis_set group; ///< the axes spanning the step's communicator
    int group_size = 1;
    int group_rank = 0;
    box<N> in_block;  ///< this rank's block before the step
    box<N> out_block; ///< and after
    box<N> kept;      ///< the region copied from the input to the output locally
    std::size_t sends = 0;
    std::size_t recvs = 0;
    std::size_t elements_sent = 0;
    std::size_t elements_received = 0;
    bool holds_term = true; ///< zero: whether this rank keeps the values
    bool valid = true;      ///< reduce_scatter: whether the pieces tile the block
    bool pipelined = false; ///< reduce_scatter: whether every piece is one contiguous run

    friend constexpr bool operator==(const step_traffic&, const step_traffic&) = default;
};

namespace detail {

/// a x b, or the largest std::size_t when that does not fit: a price is never an error, and
/// one beyond counting is beyond any budget (a reduce_scatter on 2^30 ranks can really ask
/// each rank to receive more than 2^64 bytes).
constexpr std::size_t saturating_mul(std::size_t a, std::size_t b) {
    return b != 0 && a > std::numeric_limits<std::size_t>::max() / b
               ? std::numeric_limits<std::size_t>::max()
               : a * b;
}

/// The least k with 2^k >= p (0 for p <= 1): the rounds of a recursive-halving or
/// recursive-doubling collective over p ranks.
constexpr std::size_t ceil_log2(std::size_t p) {
    std::size_t k = 0;
    while (k < 64 && (std::size_t(1) << k) < p)
        ++k;
    return k;
}

/// a + b, or the largest std::size_t when that does not fit.
constexpr std::size_t saturating_add(std::size_t a, std::size_t b) {
    return a > std::numeric_limits<std::size_t>::max() - b ? std::numeric_limits<std::size_t>::max()
                                                           : a + b;
}

/// The mesh axes named by `names`.
XSHARD_DECL axis_set axes_of(const mesh_shape& mesh, const dim_axes& names);

/// The block indices that the members of a group hold along one dimension: row-major
/// mixed-radix digits, one per axis splitting the dimension (the first axis major); a
/// digit is fixed (this rank's coordinate) when its axis is outside the group, free
/// otherwise.
struct block_digits {
    static constexpr std::size_t free = std::size_t(-1);
    static_vector<std::size_t, max_mesh_axes> radix;
    static_vector<std::size_t, max_mesh_axes> fixed; ///< the digit, or `free`

    /// The number of blocks the dimension is split into.
    constexpr std::size_t blocks() const {
        std::size_t k = 1;
        for (auto r : radix)
            k *= r;
        return k;
    }

    /// The number of digit choices (members with distinct blocks).
    constexpr std::size_t choices() const {
        std::size_t n = 1;
        for (std::size_t j = 0; j < radix.size(); ++j)
            if (fixed[j] == free)
                n *= radix[j];
        return n;
    }

    /// How many choices give a block index below `x`: walk the digits of `x` from the
    /// major end, counting the choices that fall below it at each digit.
    constexpr std::size_t below(std::size_t x) const {
        if (x >= blocks())
            return choices();
        std::array<std::size_t, max_mesh_axes> digit{}, free_below{};
        std::size_t rest = x, under = 1;
        for (std::size_t j = radix.size(); j-- > 0;) {
            digit[j] = rest % radix[j];
            rest /= radix[j];
            free_below[j] = under;
            if (fixed[j] == free)
                under *= radix[j];
        }
        std::size_t n = 0;
        for (std::size_t j = 0; j < radix.size(); ++j) {
            if (fixed[j] == free) {
                n += digit[j] * free_below[j];
            } else if (fixed[j] != digit[j]) {
                if (fixed[j] < digit[j])
                    n += free_below[j];
                return n;
            }
        }
        return n;
    }

    /// How many choices give a block index in [lo, hi).
    constexpr std::size_t count(std::size_t lo, std::size_t hi) const {
        return hi > lo ? below(hi) - below(lo) : 0;
    }
};

/// The digits of dimension `d` of layout `l` for the members of the group spanned by
/// `group` that holds the rank at coordinates `c`.
XSHARD_DECL block_digits digits_of(const layout& l, std::size_t d, const mesh_shape& mesh,
                                   const mesh_coords& c, axis_set group);

/// A class of members on one dimension: `members` of them hold a block meeting the
/// interval in `extent` elements.
struct extent_class {
    std::size_t extent;
    std::size_t members;
};

/// Per dimension: the classes, at most five (the blocks at either end of the interval,
/// whole large and whole small blocks, and the blocks missing it).
using dim_classes = static_vector<extent_class, 5>;

/// How the blocks of `n` elements that `digits` allows meet the interval [a, a + e).
constexpr dim_classes meeting(std::size_t n, const block_digits& digits, std::size_t a,
                              std::size_t e) {
    dim_classes out;
    std::size_t counted = 0;
    auto add = [&](std::size_t extent, std::size_t members) {
        if (members == 0)
            return;
        out.push_back({extent, members});
        counted += members;
    };
    if (n > 0 && e > 0) {
        const std::size_t k = digits.blocks(), rem = n % k, q = n / k;
        const std::size_t lo = block_holding(n, k, a), hi = block_holding(n, k, a + e - 1);
        auto meet = [&](std::size_t i) {
            const auto start = block_offset(n, k, i), end = start + block_extent(n, k, i);
            return std::min(a + e, end) - std::max(a, start);
        };
        add(meet(lo), digits.count(lo, lo + 1));
        if (hi > lo)
            add(meet(hi), digits.count(hi, hi + 1));
        // Whole blocks strictly inside: the large ones (before rem), then the small ones.
        add(q + 1, digits.count(lo + 1, std::min(hi, rem)));
        add(q, digits.count(std::max(lo + 1, rem), hi));
    }
    add(0, digits.choices() - counted);
    return out;
}

/// How many members of `classes` have an extent `pred` accepts.
constexpr std::size_t members_where(const dim_classes& classes, auto pred) {
    std::size_t n = 0;
    for (const auto& c : classes)
        if (pred(c.extent))
            n += c.members;
    return n;
}

/// The members whose regions, one class per dimension, are all non-empty; and the sum of
/// their region sizes (saturating). Both times `copies` (members holding the same blocks).
template <std::size_t N>
constexpr std::pair<std::size_t, std::size_t> regions(const std::array<dim_classes, N>& dims,
                                                      std::size_t copies) {
    std::size_t nonempty = copies, elements = copies;
    for (const auto& classes : dims) {
        std::size_t sum = 0;
        for (const auto& c : classes)
            sum = saturating_add(sum, saturating_mul(c.extent, c.members));
        elements = saturating_mul(elements, sum);
        nonempty *= members_where(classes, [](std::size_t x) { return x > 0; });
    }
    return {nonempty, elements};
}

/// How the blocks of layout `l` that the members of `group` hold meet `region`, per
/// dimension.
template <std::size_t N>
std::array<dim_classes, N> meeting(const layout& l, const mesh_shape& mesh,
                                   const std::array<std::size_t, N>& shape, const mesh_coords& c,
                                   axis_set group, const box<N>& region) {
    std::array<dim_classes, N> dims;
    for (std::size_t d = 0; d < N; ++d)
        dims[d] =
            meeting(shape[d], digits_of(l, d, mesh, c, group), region.offset[d], region.extent[d]);
    return dims;
}

/// The number of members of `group` holding each block of `l` (the group's axes that do
/// not split `l`).
inline std::size_t copies_of(const layout& l, const mesh_shape& mesh, axis_set group) {
    return std::size_t(mesh.group_size(group - l.split_axes(mesh)));
}

/// Whether some member's non-empty piece (the whole blocks `pieces` classifies) is not one
/// contiguous run of `block` (is_contiguous_in): counts the contiguous ones by their first
/// dimension of extent other than 1.
template <std::size_t N>
constexpr bool some_piece_scattered(const std::array<dim_classes, N>& pieces, const box<N>& block) {
    auto where = [&](std::size_t d, auto pred) {
        return members_where(pieces[d], pred);
    };
    std::size_t contiguous = 1; // all extents 1
    for (std::size_t d = 0; d < N; ++d)
        contiguous *= where(d, [](std::size_t x) { return x == 1; });
    for (std::size_t d0 = 0; d0 < N; ++d0) {
        std::size_t n = where(d0, [](std::size_t x) { return x > 1; });
        for (std::size_t j = 0; j < N; ++j) {
            if (j < d0)
                n *= where(j, [](std::size_t x) { return x == 1; });
            else if (j > d0)
                n *= where(j, [&](std::size_t x) { return x > 0 && x == block.extent[j]; });
        }
        contiguous += n;
    }
    return regions(pieces, 1).first != contiguous;
}

/// How many of the blocks `digits` allows are non-empty, and how many of those lie inside
/// the interval [a, a + e).
constexpr std::pair<std::size_t, std::size_t> inside(std::size_t n, const block_digits& digits,
                                                     std::size_t a, std::size_t e) {
    const std::size_t k = digits.blocks();
    const std::size_t filled = std::min(k, n); // blocks past n are empty (when n < k)
    const std::size_t nonempty = digits.count(0, filled);
    if (e == 0)
        return {nonempty, 0};
    // The blocks starting at or after a, and ending at or before a + e.
    const std::size_t first = a == 0 ? 0 : block_holding(n, k, a - 1) + 1;
    const std::size_t end = a + e == n ? filled : block_holding(n, k, a + e);
    return {nonempty, digits.count(first, std::min(end, filled))};
}

} // namespace detail

/// The traffic of step `s` for rank `rank` of `mesh`, for a tensor of global `shape`:
/// counted, in time independent of the group's size (see the file comment).
template <std::size_t N>
step_traffic<N> traffic_of(const step& s, const mesh_shape& mesh,
                           const std::array<std::size_t, N>& shape, int rank) {
    step_traffic<N> t;
    t.planned = s;
    const auto c = mesh.coords(rank);
    t.in_block = block_of(s.from, mesh, shape, c);
    t.out_block = block_of(s.to, mesh, shape, c);
    auto enter_group = [&](axis_set axes) {
        t.group = axes;
        t.group_size = mesh.group_size(axes);
        t.group_rank = mesh.group_rank(rank, axes);
    };
    switch (s.kind) {
    case step_kind::all_reduce:
        enter_group(detail::axes_of(mesh, s.axes));
        break;
    case step_kind::zero:
        t.kept = t.out_block;
        if (s.to.op == reduction::sum)
            for (const auto& a : s.axes)
                t.holds_term = t.holds_term && c[mesh.index(a)] == 0;
        break;
    case step_kind::reduce_scatter: {
        // Every member's piece (its destination block) goes to that member, whole.
        enter_group(detail::axes_of(mesh, s.axes));
        const box<N> whole{{}, shape};
        const auto pieces = detail::meeting(s.to, mesh, shape, c, t.group, whole);
        const auto copies = detail::copies_of(s.to, mesh, t.group);
        const auto [nonempty, covered] = detail::regions(pieces, copies);
        const bool own = !t.out_block.empty();
        t.sends = nonempty - (own ? 1 : 0);
        t.elements_sent = covered - t.out_block.size();
        t.recvs = own ? std::size_t(t.group_size - 1) : 0;
        t.elements_received = detail::saturating_mul(t.recvs, t.out_block.size());
        // Valid: the pieces tile the input block (inside it, and as many elements). Some
        // non-empty piece is outside when every dimension has a non-empty block and one
        // dimension has one outside (the dimensions vary independently).
        bool all_inside = true, all_dims_filled = true;
        for (std::size_t d = 0; d < N; ++d) {
            const auto [filled, in] =
                detail::inside(shape[d], detail::digits_of(s.to, d, mesh, c, t.group),
                               t.in_block.offset[d], t.in_block.extent[d]);
            all_dims_filled = all_dims_filled && filled > 0;
            all_inside = all_inside && in == filled;
        }
        t.valid = (all_inside || !all_dims_filled) && covered == t.in_block.size();
        t.pipelined = detail::is_contiguous_in(t.in_block.extent, t.out_block) &&
                      !detail::some_piece_scattered(pieces, t.in_block);
        t.kept = t.out_block;
        break;
    }
    case step_kind::halo:
        throw std::logic_error("xshard: a halo step is counted from its geometry (halo.hpp)");
    default: { // every exchange-like step: exactly the block intersections
        enter_group(s.from.split_axes(mesh));
        t.kept = t.in_block.intersect(t.out_block);
        // Counted over every member, this rank included (its share is what it keeps).
        const std::size_t kept = t.kept.size(), self = kept > 0 ? 1 : 0;
        const auto [to_peers, sent] =
            detail::regions(detail::meeting(s.to, mesh, shape, c, t.group, t.in_block),
                            detail::copies_of(s.to, mesh, t.group));
        const auto [from_peers, received] =
            detail::regions(detail::meeting(s.from, mesh, shape, c, t.group, t.out_block),
                            detail::copies_of(s.from, mesh, t.group));
        t.sends = to_peers - self;
        t.elements_sent = sent - kept;
        t.recvs = from_peers - self;
        t.elements_received = received - kept;
        break;
    }
    }
    return t;
}

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/redistribute/traffic.ipp>
#endif
