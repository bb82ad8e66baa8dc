#pragma once
/// \file
/// The sharding rules of the operations of ops/ beyond the elementwise one (matmul,
/// reductions, normalisations, transpose): from the layouts of an operation's inputs, the
/// layouts the inputs must take and the layout of the output. Their vocabulary
/// (`rule_result`, `rule_problem` and its sentences) is core/rule.hpp's, and the elementwise
/// rule, shared with the lazy operators of tensor/, is core/elementwise_rule.hpp's.
///
/// Every rule reconciles operands only with *free* steps (a replicated operand is sliced to
/// the other's split, or keeps one term where the other is a pending sum); a mismatch that
/// would need messages is reported as a problem, which the operation turns into a
/// redistribution only when the operands' mesh type allows it (a `redistributing_mesh`, what
/// `shard(mesh, fn, in, out, xshard::auto_redistribute)` hands `fn`).

#include <xshard/core/elementwise_rule.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/rule.hpp>

#include <cstddef>
#include <cstdint>

namespace xshard {

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
