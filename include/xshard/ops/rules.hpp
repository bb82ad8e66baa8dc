#pragma once
/// \file
/// Sharding rules: from the layouts of an operation's inputs, the layouts the inputs must
/// take and the layout of the output. constexpr functions of layout values, evaluated at
/// compile time for layout types (a problem is a static_assert with a sentence) and at run
/// time for run-time layouts (a problem is an exception) — one rule, two uses.
///
/// Every rule reconciles operands only with *free* steps (a replicated operand is sliced to
/// the other's split, or keeps one term where the other is a pending sum); a mismatch that
/// would need messages is reported as a problem, which the operation turns into a
/// redistribution only when the operands' mesh type allows it (`shard(..., auto)`).

#include <xshard/core/layout.hpp>
#include <xshard/redistribute/planner.hpp>

#include <cstddef>
#include <cstdint>

namespace xshard {

/// Why an operation cannot run on the layouts it was given.
enum class rule_problem : std::uint8_t {
    none,
    split_mismatch,    ///< operands split one dimension differently (needs a redistribution)
    axis_conflict,     ///< the rule would use a mesh axis twice
    partial_product,   ///< both operands of a product are pending sums
    nonlinear_partial, ///< a pending sum (or max/min) enters a non-linear operation
    rank_mismatch,     ///< operand ranks do not fit the operation
};

constexpr const char* describe(rule_problem p) {
    switch (p) {
    case rule_problem::none:
        return "no problem";
    case rule_problem::split_mismatch:
        return "the operands split a dimension over different mesh axes; redistribute one of "
               "them (or let shard() insert redistributions)";
    case rule_problem::axis_conflict:
        return "the operands' layouts would put one mesh axis on two dimensions of the result; "
               "redistribute one of them (or let shard() insert redistributions)";
    case rule_problem::partial_product:
        return "both operands are partial (pending reductions): their product is not the "
               "product of the sums; redistribute one to a non-partial layout";
    case rule_problem::nonlinear_partial:
        return "a partial tensor (pending reduction) cannot enter a non-linear operation; "
               "redistribute it to a non-partial layout first (or let shard() insert it)";
    case rule_problem::rank_mismatch:
        return "the operands' ranks do not fit the operation";
    }
    return "?";
}

/// The outcome of a rule: the layouts the operands must take, and the output's.
struct rule_result {
    layout a;
    layout b;
    layout out;
    rule_problem problem = rule_problem::none;
};

namespace detail {

/// Whether `from` -> `to` needs no message: equal, or only slices and zero steps.
constexpr bool is_free(const layout& from, const layout& to) {
    if (from == to)
        return true;
    for (const auto& s : plan_redistribution(from, to).paths[0])
        if (s.kind != step_kind::slice && s.kind != step_kind::zero)
            return false;
    return true;
}

/// The common split of one dimension of two operands: equal splits, or one unsplit.
constexpr bool merge_dim(const dim_axes& x, const dim_axes& y, dim_axes& out) {
    if (x.empty()) {
        out = y;
        return true;
    }
    if (y.empty() || x == y) {
        out = x;
        return true;
    }
    out = x;
    return false;
}

constexpr bool uses_twice(const layout& l) {
    dim_axes seen;
    for (const auto& d : l.dims)
        for (const auto& a : d) {
            if (seen.contains(a))
                return true;
            seen.push_back(a);
        }
    for (const auto& a : l.partial) {
        if (seen.contains(a))
            return true;
        seen.push_back(a);
    }
    return false;
}

/// Whether any axis of `axes` splits a dimension of `l` or is partial in it.
constexpr bool touches(const layout& l, const dim_axes& axes) {
    for (const auto& a : axes)
        if (l.uses(a))
            return true;
    return false;
}

constexpr bool same_axes(const dim_axes& x, const dim_axes& y) {
    if (x.size() != y.size())
        return false;
    for (const auto& a : x)
        if (!y.contains(a))
            return false;
    return true;
}

constexpr layout with_partial(layout l, const dim_axes& partial, reduction op) {
    l.partial = partial;
    l.op = op;
    return l;
}

constexpr rule_result fail(rule_result r, rule_problem p) {
    if (r.problem == rule_problem::none)
        r.problem = p;
    return r;
}

} // namespace detail

/// matmul(a, b): a [batch.., i, k] @ b [batch.., k, j] (or b [k, j] shared by every batch).
/// The contraction dimension must be split alike (a replicated side is sliced to the other);
/// batch dimensions too. The product is [batch.., I, J] partial(sum: K + the operands'
/// partial axes): a split contraction leaves a pending sum, resolved by an all-reduce (or a
/// reduce-scatter) when a consumer needs it. At most one operand may be partial (a sum).
/// When the operands do not fit, the result says how `b` (then `a`) would be redistributed.
constexpr rule_result matmul_rule(const layout& a, const layout& b) {
    const std::size_t ra = a.rank(), rb = b.rank();
    rule_result r{a, b, layout::replicated(ra >= 2 ? ra : 0)};
    if (ra < 2 || rb < 2 || (rb != 2 && rb != ra))
        return detail::fail(r, rule_problem::rank_mismatch);
    // Pending max/min and a second pending sum are reduced first.
    if (a.is_partial() && a.op != reduction::sum) {
        r = detail::fail(r, rule_problem::nonlinear_partial);
        r.a.partial.clear();
    }
    if (b.is_partial() && (b.op != reduction::sum || r.a.is_partial())) {
        r = detail::fail(r, b.op != reduction::sum ? rule_problem::nonlinear_partial
                                                   : rule_problem::partial_product);
        r.b.partial.clear();
    }
    // The contraction and the batch dimensions: a's split wins where they differ.
    dim_axes k;
    if (!detail::merge_dim(a.dims[ra - 1], b.dims[rb - 2], k))
        r = detail::fail(r, rule_problem::split_mismatch);
    if (a.dims[ra - 1].empty()) {
        // k comes from b: it cannot use an axis a splits elsewhere.
        dim_axes usable;
        for (const auto& x : k) {
            bool taken = false;
            for (std::size_t d = 0; d + 1 < ra; ++d)
                taken = taken || a.dims[d].contains(x);
            if (taken)
                r = detail::fail(r, rule_problem::axis_conflict);
            else
                usable.push_back(x);
        }
        k = usable;
    }
    r.a.dims[ra - 1] = r.b.dims[rb - 2] = k;
    for (std::size_t d = 0; d + 2 < ra && rb == ra; ++d) {
        dim_axes batch;
        if (!detail::merge_dim(a.dims[d], b.dims[d], batch))
            r = detail::fail(r, rule_problem::split_mismatch);
        r.a.dims[d] = r.b.dims[d] = batch;
    }
    // A pending sum over an axis the merged splits now use is reduced first.
    for (layout* x : {&r.a, &r.b}) {
        if (detail::uses_twice(*x)) {
            r = detail::fail(r, rule_problem::axis_conflict);
            x->partial.clear();
        }
    }
    // b gives up every axis a uses (split or partial) outside the shared dimensions.
    auto shared = [&](std::size_t d) {
        return d == rb - 2 || (rb == ra && d + 2 < rb);
    };
    for (std::size_t d = 0; d < rb; ++d) {
        if (shared(d))
            continue;
        dim_axes clean;
        for (const auto& x : r.b.dims[d]) {
            if (r.a.uses(x))
                r = detail::fail(r, rule_problem::axis_conflict);
            else
                clean.push_back(x);
        }
        r.b.dims[d] = clean;
    }
    if (detail::touches(r.a, r.b.partial)) {
        r = detail::fail(r, rule_problem::axis_conflict);
        r.b.partial.clear();
    }
    if (detail::uses_twice(r.a) || detail::uses_twice(r.b))
        return detail::fail(r, rule_problem::axis_conflict);
    for (std::size_t d = 0; d + 2 < ra; ++d)
        r.out.dims[d] = r.a.dims[d];
    r.out.dims[ra - 2] = r.a.dims[ra - 2];
    r.out.dims[ra - 1] = r.b.dims[rb - 1];
    dim_axes partial = k;
    for (const auto* p : {&r.a.partial, &r.b.partial})
        for (const auto& x : *p)
            partial.push_back(x);
    r.out = detail::with_partial(r.out, partial, reduction::sum);
    return r;
}

/// How an elementwise operation treats pending sums.
enum class elementwise_kind : std::uint8_t {
    additive,       ///< a + b, a - b: sums of sums; a non-partial operand keeps one term
    multiplicative, ///< a * b: one operand may be partial, the other scales every term
    division,       ///< a / b: the dividend may be partial, never the divisor
    nonlinear,      ///< anything else: no partial operand
};

/// An elementwise operation with broadcasting (dimensions aligned at the end, as numpy). Each
/// output dimension takes the split of the operand that splits it (a replicated operand is
/// sliced, or broadcast if its extent is 1); two different splits are a mismatch.
constexpr rule_result elementwise_rule(const layout& a, const layout& b, elementwise_kind kind) {
    const std::size_t ra = a.rank(), rb = b.rank(), r = ra > rb ? ra : rb;
    rule_result res{a, b, layout::replicated(r)};
    for (std::size_t i = 0; i < r; ++i) {
        const bool in_a = i < ra, in_b = i < rb;
        const std::size_t da = ra - 1 - i, db = rb - 1 - i, d = r - 1 - i;
        dim_axes x = in_a ? a.dims[da] : dim_axes{}, y = in_b ? b.dims[db] : dim_axes{}, m;
        if (!detail::merge_dim(x, y, m))
            res = detail::fail(res, rule_problem::split_mismatch);
        res.out.dims[d] = m;
        if (in_a)
            res.a.dims[da] = m;
        if (in_b)
            res.b.dims[db] = m;
    }
    const bool pa = a.is_partial(), pb = b.is_partial();
    if (pa || pb) {
        const layout& p = pa ? a : b;
        const bool sums = (!pa || a.op == reduction::sum) && (!pb || b.op == reduction::sum);
        bool ok = false;
        switch (kind) {
        case elementwise_kind::additive:
            ok = sums && (!pa || !pb || detail::same_axes(a.partial, b.partial));
            break;
        case elementwise_kind::multiplicative:
            ok = sums && !(pa && pb);
            break;
        case elementwise_kind::division:
            ok = sums && !pb;
            break;
        case elementwise_kind::nonlinear:
            break;
        }
        if (ok && kind != elementwise_kind::additive &&
            detail::touches(pa ? res.b : res.a, p.partial))
            ok = false; // a scaling factor must be the same on every term
        if (!ok) {
            // Reduce the pending sums first.
            res = detail::fail(res, pa && pb && kind == elementwise_kind::multiplicative
                                        ? rule_problem::partial_product
                                        : rule_problem::nonlinear_partial);
            res.a.partial.clear();
            res.b.partial.clear();
        } else {
            res.out = detail::with_partial(res.out, p.partial, reduction::sum);
            if (kind == elementwise_kind::additive) {
                // The non-partial operand of a sum keeps one term (a zero step).
                res.a = detail::with_partial(res.a, p.partial, reduction::sum);
                res.b = detail::with_partial(res.b, p.partial, reduction::sum);
            }
        }
    }
    if (detail::uses_twice(res.out)) {
        // Reduce the pending sums, then keep each axis on its first dimension only (the
        // operands gather the others).
        res = detail::fail(res, rule_problem::axis_conflict);
        res.a.partial.clear();
        res.b.partial.clear();
        res.out.partial.clear();
        dim_axes seen;
        for (std::size_t d = 0; d < r; ++d) {
            dim_axes kept;
            for (const auto& x : res.out.dims[d])
                if (!seen.contains(x)) {
                    seen.push_back(x);
                    kept.push_back(x);
                }
            res.out.dims[d] = kept;
            if (r - 1 - d < ra)
                res.a.dims[ra - (r - d)] = kept;
            if (r - 1 - d < rb)
                res.b.dims[rb - (r - d)] = kept;
        }
    }
    return res;
}

/// A unary elementwise operation: linear ones (negation, scaling) keep pending sums,
/// non-linear ones refuse them.
constexpr rule_result unary_rule(const layout& a, bool linear) {
    rule_result r{a, a, a};
    if (a.is_partial() && (!linear || a.op != reduction::sum)) {
        r.problem = rule_problem::nonlinear_partial;
        r.a.partial.clear();
        r.out = r.a;
    }
    return r;
}

/// A reduction (sum, mean, max, min) along dimension `dim`: the output drops the dimension
/// (keeps it unsplit with extent 1 with `keepdims`). A split dimension leaves a pending
/// reduction over its axes (sum for sum and mean). A partial input enters only sums and means.
constexpr rule_result reduction_rule(const layout& a, std::size_t dim, reduction op,
                                     bool keepdims) {
    rule_result r{a, a, a};
    if (dim >= a.rank())
        return detail::fail(r, rule_problem::rank_mismatch);
    if (a.is_partial() && (op != reduction::sum || a.op != reduction::sum)) {
        r = detail::fail(r, rule_problem::nonlinear_partial);
        r.a.partial.clear();
    }
    const layout& in = r.a;
    layout out;
    for (std::size_t d = 0; d < in.rank(); ++d)
        if (d != dim)
            out.dims.push_back(in.dims[d]);
        else if (keepdims)
            out.dims.push_back({});
    out.partial = in.partial;
    for (const auto& x : in.dims[dim])
        out.partial.push_back(x);
    out.op = in.is_partial() ? in.op : op;
    r.out = out;
    return r;
}

/// A normalisation along dimension `dim` (softmax, log-softmax, layer norm): the output
/// keeps the input's layout; a split `dim` costs all-reduces of per-row statistics.
constexpr rule_result normalization_rule(const layout& a, std::size_t dim) {
    rule_result r{a, a, a};
    if (dim >= a.rank()) {
        r.problem = rule_problem::rank_mismatch;
    } else if (a.is_partial()) {
        r.problem = rule_problem::nonlinear_partial;
        r.a.partial.clear();
        r.out = r.a;
    }
    return r;
}

/// transpose: the layout follows the permutation of the dimensions.
template <class Perm>
constexpr rule_result transpose_rule(const layout& a, const Perm& perm) {
    rule_result r{a, a, a};
    if (perm.size() != a.rank())
        return detail::fail(r, rule_problem::rank_mismatch);
    for (std::size_t d = 0; d < a.rank(); ++d) {
        if (perm[d] >= a.rank())
            return detail::fail(r, rule_problem::rank_mismatch);
        r.out.dims[d] = a.dims[perm[d]];
    }
    return r;
}

} // namespace xshard
