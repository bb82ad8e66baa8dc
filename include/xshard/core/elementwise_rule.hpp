#pragma once
/// \file
/// The sharding rule of elementwise operations, one rule for the lazy operators + - * / of
/// tensor/expression.hpp and the operations of ops/elementwise.hpp.
///
/// Dimensions align at the end (numpy broadcasting). Each output dimension is split like the
/// operand that splits it (the other is sliced, or broadcast when its extent is 1); two
/// different splits are a mismatch. Pending sums pass through the linear operations only:
/// a + b keeps them (both partial over the same axes, or the non-partial operand keeps one
/// term), a * b and a / b scale them by a factor that is not partial and is the same on every
/// term; every other function, and any arithmetic on a pending max or min, refuses them.

#include <xshard/core/layout.hpp>
#include <xshard/core/rule.hpp>

#include <cstddef>
#include <cstdint>

namespace xshard {

/// How an elementwise operation treats pending sums.
enum class elementwise_kind : std::uint8_t {
    additive,       ///< a + b, a - b: sums of sums; a non-partial operand keeps one term
    multiplicative, ///< a * b: one operand may be partial, the other scales every term
    division,       ///< a / b: the dividend may be partial, never the divisor
    nonlinear,      ///< anything else: no partial operand
};

/// The rule of a binary elementwise operation of kind `kind` on operands laid out `a` and
/// `b` (see the file comment). A problem comes with the layouts that would fix it (pending
/// sums reduced, one split kept), which an operation applies when it may redistribute.
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
        rule_problem why = sums ? rule_problem::none : rule_problem::nonlinear_partial;
        if (sums) {
            switch (kind) {
            case elementwise_kind::additive:
                if (pa && pb && !detail::same_axes(a.partial, b.partial))
                    why = rule_problem::partial_terms_differ;
                break;
            case elementwise_kind::multiplicative:
                if (pa && pb)
                    why = rule_problem::partial_product;
                break;
            case elementwise_kind::division:
                if (pb)
                    why = rule_problem::nonlinear_partial; // 1 / (sum of terms)
                break;
            case elementwise_kind::nonlinear:
                why = rule_problem::nonlinear_partial;
                break;
            }
        }
        if (why == rule_problem::none && kind != elementwise_kind::additive &&
            detail::touches(pa ? res.b : res.a, p.partial))
            why = rule_problem::partial_terms_differ; // the factor must be one on every term
        if (why != rule_problem::none) {
            // Reduce the pending sums first.
            res = detail::fail(res, why);
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

/// The rule of a unary elementwise operation: linear ones (negation, scaling) keep pending
/// sums, non-linear ones refuse them.
constexpr rule_result unary_rule(const layout& a, bool linear) {
    rule_result r{a, a, a};
    if (a.is_partial() && (!linear || a.op != reduction::sum)) {
        r.problem = rule_problem::nonlinear_partial;
        r.a.partial.clear();
        r.out = r.a;
    }
    return r;
}

/// The rule of the lazy operators + - * / (tensor/expression.hpp): `elementwise_rule`, with
/// every operand taken as it is, since the expression is evaluated later on the local shards
/// alone (no slice, no zero step). So two tensors must have one layout, and a scalar (a null
/// layout) cannot be added to a pending sum, as it would be added once per term.
constexpr rule_result lazy_elementwise_rule(const layout* a, const layout* b,
                                            elementwise_kind kind) {
    const layout scalar = layout::replicated(0);
    const layout& la = a ? *a : scalar;
    const layout& lb = b ? *b : scalar;
    rule_result r = elementwise_rule(la, lb, kind);
    if (a && b && !(*a == *b))
        r.problem = rule_problem::layouts_differ;
    else if (r.problem == rule_problem::none && !(r.a == la && r.b == lb))
        r.problem = la.is_partial() || lb.is_partial() ? rule_problem::partial_plus_scalar
                                                       : rule_problem::layouts_differ;
    return r;
}

} // namespace xshard
