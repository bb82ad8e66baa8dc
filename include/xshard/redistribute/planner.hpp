#pragma once
/// \file
/// The redistribution planner: from two layouts, the candidate sequences of steps that turn
/// one into the other. A constexpr function of layout values: at compile time for layout
/// types, at run time for run-time layouts (strategy files, the xshard-plan tool).
///
/// The steps, by name (Elemental's habit: a reader finds the collective of a transition by
/// its name), each acting on one mesh axis unless said otherwise:
///
/// | step           | transition on the axis          | communication                        |
/// |----------------|---------------------------------|--------------------------------------|
/// | all_gather     | split(d) -> replicated          | all-gather over the axis             |
/// | slice          | replicated -> split(d)          | none (each rank keeps its block)     |
/// | all_to_all     | split(d1) -> split(d2)          | all-to-all over the axis             |
/// | all_reduce     | partial -> replicated           | all-reduce over the axes             |
/// | reduce_scatter | partial -> split(d)             | reduce-scatter over the axis         |
/// | zero           | replicated -> partial           | none (one rank keeps the values for  |
/// |                |                                 | a sum, the others zeros)             |
/// | exchange       | anything else, several axes     | one exchange of exactly the block    |
/// |                | at once, reorders               | intersections (point to point)       |
/// | halo           | split(d) -> split(d) + the rows | point to point with the neighbouring |
/// |                | a window needs from neighbours  | bands only (halo.hpp; not planned    |
/// |                | (its adjoint sums them back)    | between layouts, made by halo_plan)  |
///
/// An axis joins or leaves a split dimension at its minor end (the last axis listed), so a
/// dimension split over (dp, mp) loses mp before dp. Three candidates are planned:
///  * *per axis*: one named step per axis change, greedy: shrinking steps first
///    (reduce_scatter, slice), then all_to_all, then growing steps (all_gather,
///    all_reduce), then zero;
///  * *reduce, then exchange*: the partial axes are reduced (reduce_scatter into the
///    dimension the destination splits over them, all_reduce otherwise), every other change
///    is one exchange, then zero;
///  * *all-reduce, then exchange*: the same with every partial axis all-reduced. A
///    reduce_scatter needs the destination pieces to tile the block it reduces, which uneven
///    extents can prevent; this candidate is always valid.
/// A plan (plan.hpp) prices each with the cost model for the actual shape and mesh sizes
/// and runs the cheapest valid one.

#include <xshard/core/layout.hpp>
#include <xshard/core/static_vector.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace xshard {

enum class step_kind : std::uint8_t {
    all_gather,
    slice,
    all_to_all,
    all_reduce,
    reduce_scatter,
    zero,
    exchange,
    halo,
};

constexpr std::string_view to_string(step_kind k) {
    switch (k) {
    case step_kind::all_gather:
        return "all_gather";
    case step_kind::slice:
        return "slice";
    case step_kind::all_to_all:
        return "all_to_all";
    case step_kind::all_reduce:
        return "all_reduce";
    case step_kind::reduce_scatter:
        return "reduce_scatter";
    case step_kind::zero:
        return "zero";
    case step_kind::exchange:
        return "exchange";
    case step_kind::halo:
        return "halo";
    }
    return "?";
}

/// One step of a redistribution: the layouts on either side, and for the named steps the
/// axes they act on and the dimensions involved.
struct step {
    step_kind kind = step_kind::exchange;
    layout from;
    layout to;
    dim_axes axes;         ///< the mesh axes the step acts on
    std::uint8_t dim = 0;  ///< the dimension gathered, sliced, scattered into, or left
    std::uint8_t dim2 = 0; ///< all_to_all: the dimension the axis moves to

    friend constexpr bool operator==(const step&, const step&) = default;
};

/// Most steps a candidate has.
inline constexpr std::size_t max_plan_steps = 2 * max_mesh_axes + 2;

using step_list = static_vector<step, max_plan_steps>;

/// The candidates of a redistribution (see the file comment). Identical layouts give one
/// empty candidate.
struct plan_candidates {
    layout from;
    layout to;
    static_vector<step_list, 3> paths;
};

namespace detail {

/// Where an axis is in a layout.
struct axis_place {
    enum kind_t : std::uint8_t { replicated, partial, split } kind = replicated;
    std::uint8_t dim = 0;
    std::uint8_t pos = 0;
};

constexpr axis_place place_of(const layout& l, const axis_name& a) {
    for (std::size_t d = 0; d < l.rank(); ++d)
        for (std::size_t i = 0; i < l.dims[d].size(); ++i)
            if (l.dims[d][i] == a)
                return {axis_place::split, std::uint8_t(d), std::uint8_t(i)};
    if (l.partial.contains(a))
        return {axis_place::partial, 0, 0};
    return {};
}

/// Whether dimension `d` of `x` is the destination's prefix of length `pos`: an axis going
/// to position `pos` of `d` can join it now.
constexpr bool ready(const layout& x, const layout& dst, std::size_t d, std::size_t pos) {
    if (x.dims[d].size() != pos)
        return false;
    for (std::size_t i = 0; i < pos; ++i)
        if (!(x.dims[d][i] == dst.dims[d][i]))
            return false;
    return true;
}

/// Whether split axis `a` (at dim `d`, position `pos` of `x`) is where the destination
/// wants it, with everything major to it in place too.
constexpr bool settled(const layout& x, const layout& dst, std::size_t d, std::size_t pos) {
    if (dst.dims[d].size() <= pos)
        return false;
    for (std::size_t i = 0; i <= pos; ++i)
        if (!(x.dims[d][i] == dst.dims[d][i]))
            return false;
    return true;
}

/// Whether a partial axis of `x` stays partial in `dst` (same reduction).
constexpr bool keeps_partial(const layout& x, const layout& dst, const axis_name& a) {
    return dst.partial.contains(a) && dst.op == x.op;
}

constexpr void remove_axis(dim_axes& axes, const axis_name& a) {
    dim_axes kept;
    for (const auto& b : axes)
        if (!(b == a))
            kept.push_back(b);
    axes = kept;
}

constexpr step make_step(step_kind kind, const layout& from, const layout& to, const axis_name& a,
                         std::size_t dim = 0, std::size_t dim2 = 0) {
    step s{kind, from, to, {}, std::uint8_t(dim), std::uint8_t(dim2)};
    s.axes.push_back(a);
    return s;
}

/// The axes named by either layout, in order of appearance.
constexpr dim_axes named_axes(const layout& a, const layout& b) {
    dim_axes all;
    for (const layout* l : {&a, &b}) {
        for (const auto& d : l->dims)
            for (const auto& x : d)
                if (!all.contains(x))
                    all.push_back(x);
        for (const auto& x : l->partial)
            if (!all.contains(x))
                all.push_back(x);
    }
    return all;
}

/// The next per-axis step from `x` towards `dst`, by priority.
constexpr step next_axis_step(const layout& x, const layout& dst) {
    const auto axes = named_axes(x, dst);
    // 1. Shrinking: partial -> split, replicated -> split, when the dimension is ready.
    for (const auto& a : axes) {
        const auto here = place_of(x, a), there = place_of(dst, a);
        if (there.kind != axis_place::split || !ready(x, dst, there.dim, there.pos))
            continue;
        layout y = x;
        y.dims[there.dim].push_back(a);
        if (here.kind == axis_place::partial && !keeps_partial(x, dst, a)) {
            remove_axis(y.partial, a);
            return make_step(step_kind::reduce_scatter, x, y, a, there.dim);
        }
        if (here.kind == axis_place::replicated)
            return make_step(step_kind::slice, x, y, a, there.dim);
    }
    // 2. all_to_all: a minor-most axis leaves its dimension for another that is ready.
    for (const auto& a : axes) {
        const auto here = place_of(x, a), there = place_of(dst, a);
        if (here.kind != axis_place::split || here.pos + 1u != x.dims[here.dim].size() ||
            settled(x, dst, here.dim, here.pos))
            continue;
        if (there.kind == axis_place::split && there.dim != here.dim &&
            ready(x, dst, there.dim, there.pos)) {
            layout y = x;
            y.dims[here.dim].pop_back();
            y.dims[there.dim].push_back(a);
            return make_step(step_kind::all_to_all, x, y, a, here.dim, there.dim);
        }
    }
    // 3. Growing: a minor-most axis that must leave is gathered; a partial axis that must
    //    not stay partial and cannot be scattered is all-reduced.
    for (const auto& a : axes) {
        const auto here = place_of(x, a);
        if (here.kind == axis_place::split && here.pos + 1u == x.dims[here.dim].size() &&
            !settled(x, dst, here.dim, here.pos)) {
            layout y = x;
            y.dims[here.dim].pop_back();
            return make_step(step_kind::all_gather, x, y, a, here.dim);
        }
    }
    for (const auto& a : axes) {
        const auto here = place_of(x, a), there = place_of(dst, a);
        if (here.kind == axis_place::partial && !keeps_partial(x, dst, a) &&
            there.kind != axis_place::split) {
            layout y = x;
            remove_axis(y.partial, a);
            return make_step(step_kind::all_reduce, x, y, a);
        }
    }
    // 4. replicated -> partial.
    for (const auto& a : axes) {
        const auto here = place_of(x, a), there = place_of(dst, a);
        if (here.kind == axis_place::replicated && there.kind == axis_place::partial) {
            layout y = x;
            if (y.partial.empty())
                y.op = dst.op;
            y.partial.push_back(a);
            return make_step(step_kind::zero, x, y, a);
        }
    }
    throw std::logic_error("xshard: the redistribution planner is stuck (a bug)");
}

constexpr step_list per_axis_path(const layout& src, const layout& dst) {
    step_list steps;
    layout x = src;
    while (!(x == dst)) {
        if (steps.size() == max_plan_steps)
            throw std::logic_error("xshard: the redistribution planner does not converge (a bug)");
        steps.push_back(next_axis_step(x, dst));
        x = steps.back().to;
    }
    if (!steps.empty())
        steps.back().to = dst;
    return steps;
}

/// Names a single transition: the named step if it is one, exchange otherwise.
constexpr step classify(const layout& from, const layout& to) {
    layout a = from, b = to; // compare the partial parts only
    a.dims.clear();
    b.dims.clear();
    if (!(a == b) || from.rank() != to.rank())
        return step{step_kind::exchange, from, to, {}, 0, 0};
    // The axes whose place differs.
    dim_axes moved;
    for (const auto& a : named_axes(from, to)) {
        const auto p = place_of(from, a), q = place_of(to, a);
        if (p.kind != q.kind || p.dim != q.dim || p.pos != q.pos)
            moved.push_back(a);
    }
    step s{step_kind::exchange, from, to, moved, 0, 0};
    if (moved.size() != 1)
        return s;
    const auto p = place_of(from, moved[0]), q = place_of(to, moved[0]);
    const bool minor_in_from = p.kind == axis_place::split && p.pos + 1u == from.dims[p.dim].size();
    const bool minor_in_to = q.kind == axis_place::split && q.pos + 1u == to.dims[q.dim].size();
    if (minor_in_from && q.kind == axis_place::replicated)
        return make_step(step_kind::all_gather, from, to, moved[0], p.dim);
    if (p.kind == axis_place::replicated && minor_in_to)
        return make_step(step_kind::slice, from, to, moved[0], q.dim);
    if (minor_in_from && minor_in_to && p.dim != q.dim)
        return make_step(step_kind::all_to_all, from, to, moved[0], p.dim, q.dim);
    return s;
}

constexpr step_list reduce_then_exchange_path(const layout& src, const layout& dst, bool scatter) {
    step_list steps;
    layout x = src;
    // Reduce the partial axes the destination does not keep.
    dim_axes to_reduce;
    for (const auto& a : src.partial)
        if (!keeps_partial(src, dst, a))
            to_reduce.push_back(a);
    dim_axes all_reduced;
    for (const auto& a : to_reduce) {
        const auto there = place_of(dst, a);
        layout y = x;
        remove_axis(y.partial, a);
        if (scatter && there.kind == axis_place::split) {
            y.dims[there.dim].push_back(a);
            steps.push_back(make_step(step_kind::reduce_scatter, x, y, a, there.dim));
            x = y;
        } else {
            all_reduced.push_back(a);
        }
    }
    if (!all_reduced.empty()) {
        layout y = x;
        for (const auto& a : all_reduced)
            remove_axis(y.partial, a);
        step s{step_kind::all_reduce, x, y, all_reduced, 0, 0};
        steps.push_back(s);
        x = y;
    }
    // One exchange to the destination's splits, with the partial axes kept so far; then
    // zero the partial axes the destination adds.
    layout target = dst;
    target.partial.clear();
    dim_axes zeroed;
    for (const auto& a : dst.partial)
        (x.partial.contains(a) ? target.partial : zeroed).push_back(a);
    if (!(x == target))
        steps.push_back(classify(x, target));
    if (!zeroed.empty())
        steps.push_back(step{step_kind::zero, target, dst, zeroed, 0, 0});
    if (!steps.empty())
        steps.back().to = dst;
    return steps;
}

} // namespace detail

/// The candidate step sequences from `src` to `dst` (same rank, layouts that fit one mesh).
constexpr plan_candidates plan_redistribution(const layout& src, const layout& dst) {
    if (src.rank() != dst.rank())
        throw std::invalid_argument("xshard: redistribution between layouts of different ranks");
    plan_candidates c{src, dst, {}};
    for (const auto& path :
         {detail::per_axis_path(src, dst), detail::reduce_then_exchange_path(src, dst, true),
          detail::reduce_then_exchange_path(src, dst, false)}) {
        bool known = false;
        for (const auto& p : c.paths)
            known = known || p == path;
        if (!known)
            c.paths.push_back(path);
    }
    return c;
}

} // namespace xshard
