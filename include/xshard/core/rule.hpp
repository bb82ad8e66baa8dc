#pragma once
/// \file
/// The vocabulary of sharding rules: what a rule returns (its outcome: the layouts the
/// operands must take and the output's, and a problem) and why an operation cannot run on
/// the layouts it is given (a problem, with one sentence per problem). `rule_result` and
/// `rule_problem` are the operations'; ops/conv_rule.hpp adds the convolutional layers'
/// (`conv_rule_result`, `conv_problem`) on the same vocabulary: the concepts
/// `rule_problem_type` and `rule_outcome`, `rule_holds_v` and `detail::fail` serve both.
///
/// Rules are constexpr functions of layout values, so one rule serves two uses: evaluated at
/// compile time for layout types (a problem is a compile error) and at run time for
/// run-time layouts (a problem is an `xshard::error`, the same on every rank, since every
/// rank holds the layouts). The overloads of `raise_rule_problem` are the only places the
/// sentences are written: the compile error is their `throw` evaluated in a constant
/// expression, which the compiler quotes. The elementwise rule (core/elementwise_rule.hpp) is
/// the one shared by the lazy operators of tensor/expression.hpp and the operations of ops/;
/// ops/rules.hpp adds the rules of the other operations.

#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace xshard {

/// Why an operation cannot run on the layouts it was given.
enum class rule_problem : std::uint8_t {
    none,
    split_mismatch,       ///< operands split one dimension differently (needs a redistribution)
    axis_conflict,        ///< the rule would use a mesh axis twice
    partial_product,      ///< both operands of a product are pending sums
    nonlinear_partial,    ///< a pending sum (or max/min) enters a non-linear operation
    partial_terms_differ, ///< pending sums over different axes, or a factor unlike per term
    partial_plus_scalar,  ///< a scalar added to a pending sum (lazy operators only)
    layouts_differ,       ///< lazy operators on tensors of different layouts
    rank_mismatch,        ///< operand ranks do not fit the operation
};

/// The outcome of a rule: the layouts the operands must take, and the output's.
struct rule_result {
    layout a;
    layout b;
    layout out;
    rule_problem problem = rule_problem::none;
};

namespace detail {

/// "xshard: <operation>: ", the start of every rule problem's message.
constexpr std::string rule_where(std::string_view operation) {
    return "xshard: " + std::string(operation) + ": ";
}

} // namespace detail

/// Throws `xshard::error` "xshard: <operation>: <sentence>" for problem `p` (nothing for
/// `rule_problem::none`). In a constant expression (see `rule_holds_v`) the throw is a
/// compile error that quotes the sentence.
constexpr void raise_rule_problem(rule_problem p, std::string_view operation) {
    const std::string where = detail::rule_where(operation);
    // Each sentence starts on a line of its own: a compile error quotes these lines.
    switch (p) {
    case rule_problem::none:
        return;
    case rule_problem::split_mismatch:
        throw error(where +
                    "the operands split a dimension over different mesh axes; redistribute one "
                    "of them (or pass xshard::auto_redistribute to shard())");
    case rule_problem::axis_conflict:
        throw error(where +
                    "the operands' layouts would put one mesh axis on two dimensions; "
                    "redistribute one of them (or pass xshard::auto_redistribute to shard())");
    case rule_problem::partial_product:
        throw error(where +
                    "both operands of a product are partial (pending reductions), and a product "
                    "of sums is not the sum of the products; resolve one of them first");
    case rule_problem::nonlinear_partial:
        throw error(where +
                    "a partial tensor (pending reduction) cannot enter a non-linear operation "
                    "(nor a pending max or min any arithmetic); resolve it first (or pass "
                    "xshard::auto_redistribute to shard())");
    case rule_problem::partial_terms_differ:
        throw error(where +
                    "the pending sums do not line up (partial over different mesh axes, or a "
                    "factor that differs between the terms); resolve the partial operand first "
                    "(or pass xshard::auto_redistribute to shard())");
    case rule_problem::partial_plus_scalar:
        throw error(where +
                    "a scalar added to a partial tensor (pending reduction) would be added once "
                    "per term; resolve the partial tensor first");
    case rule_problem::layouts_differ:
        throw error(where +
                    "the elementwise operands have different layouts; call xshard::redistribute "
                    "on one of them first (the lazy operators need one layout; "
                    "xshard::ops::add and its kin slice a replicated operand)");
    case rule_problem::rank_mismatch:
        throw error(where + "the operands' ranks do not fit the operation");
    }
}

/// A rule's problem type: an enumeration whose `none` means the rule holds, with an overload
/// of `raise_rule_problem(p, operation)` (found by argument-dependent lookup) that throws
/// each problem's sentence.
template <class P>
concept rule_problem_type = std::is_enum_v<P> && requires(P p, std::string_view operation) {
    P::none;
    raise_rule_problem(p, operation);
};

/// A rule's outcome: the layouts its operands take, the output's (`out`), and its `problem`
/// (`rule_problem::none` and its kin when the rule holds).
template <class R>
concept rule_outcome = requires(const R& r) {
    { r.out } -> std::convertible_to<const layout&>;
    requires rule_problem_type<std::remove_cvref_t<decltype(r.problem)>>;
};

/// Whether problem P (of any rule problem type) is none, as a constant: naming
/// `rule_holds_v<P>` with another problem is a compile error quoting the problem's sentence.
template <rule_problem_type auto P>
inline constexpr bool rule_holds_v = (raise_rule_problem(P, "sharding rule"), true);

namespace detail {

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

/// Whether `l` uses a mesh axis twice (split and partial count alike).
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

/// Whether two axis lists hold the same axes, in any order.
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

/// `r` with problem `p`, unless it already has one (the first problem found is reported).
template <rule_outcome R>
constexpr R fail(R r, decltype(R::problem) p) {
    if (r.problem == decltype(R::problem)::none)
        r.problem = p;
    return r;
}

} // namespace detail

} // namespace xshard
