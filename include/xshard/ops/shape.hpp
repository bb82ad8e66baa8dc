#pragma once
/// \file
/// Transpose and reshape, where the layout can follow.
///
/// transpose<P...>(t): dimension d of the result is dimension P[d] of t, and so is its split;
/// a local transpose, no messages.
///
/// reshape<To>(t, shape): the caller names the result's layout To. Dimensions are grouped
/// (consecutive dimensions whose extents multiply to the same product on both sides); in each
/// group only the first dimension may be split, over the same axes on both sides, and its
/// extent on both sides must be divisible by the split count: then every rank's block is the
/// same run of the group's elements before and after, and the reshape is local. Anything
/// else is an error (an exception, the same on every rank) that names `redistribute`: the
/// reshape follows a redistribution to a layout where it can.

#include <xshard/comm/error.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/ops/operand.hpp>
#include <xshard/ops/rules.hpp>

#include <xtensor/xmanipulation.hpp>
#include <xtensor/xtensor.hpp>

#include <array>
#include <string>

namespace xshard {

namespace detail {

template <std::size_t... P>
struct transpose_rule_fn {
    constexpr rule_result operator()(const layout& a) const {
        return transpose_rule(a, std::array<std::size_t, sizeof...(P)>{P...});
    }
};

/// Whether reshaping `from` (layout lf) to `to` (layout lt) keeps every rank's block the same
/// run of elements (see the file comment).
template <std::size_t N, std::size_t M>
bool reshape_follows(const mesh_shape& mesh, const std::array<std::size_t, N>& from,
                     const layout& lf, const std::array<std::size_t, M>& to, const layout& lt) {
    if (!(lf.partial == lt.partial) || (lf.is_partial() && lf.op != lt.op))
        return false;
    std::size_t i = 0, j = 0;
    while (i < N || j < M) {
        // One group: [i, i2) and [j, j2) with equal products.
        const std::size_t gi = i, gj = j;
        std::size_t pi = i < N ? from[i++] : 1, pj = j < M ? to[j++] : 1;
        while (pi != pj) {
            if (pi < pj && i < N)
                pi *= from[i++];
            else if (pj < pi && j < M)
                pj *= to[j++];
            else
                return false;
        }
        for (; i < N && from[i] == 1 && lf.dims[i].empty(); ++i) {
        }
        for (; j < M && to[j] == 1 && lt.dims[j].empty(); ++j) {
        }
        // Only the group's first dimension may be split, alike, divisibly.
        for (std::size_t d = gi + 1; d < i; ++d)
            if (!lf.dims[d].empty())
                return false;
        for (std::size_t d = gj + 1; d < j; ++d)
            if (!lt.dims[d].empty())
                return false;
        const dim_axes none{};
        const auto& af = gi < N ? lf.dims[gi] : none;
        const auto& at = gj < M ? lt.dims[gj] : none;
        if (!(af == at))
            return false;
        if (!af.empty()) {
            const auto k = std::size_t(lf.split_count(gi, mesh));
            if (from[gi] % k != 0 || to[gj] % k != 0)
                return false;
        }
    }
    return true;
}

} // namespace detail

namespace ops {

/// The tensor with its dimensions permuted: result dimension d is t's dimension P[d].
template <std::size_t... P, distributed_tensor A>
auto transpose(const A& a) {
    static_assert(sizeof...(P) == A::rank, "xshard: transpose needs one index per dimension");
    using rule = detail::rule_for<detail::transpose_rule_fn<P...>, A>;
    const auto& res = rule::get("transpose", a);
    constexpr std::array<std::size_t, sizeof...(P)> perm{P...};
    std::array<std::size_t, A::rank> shape{};
    for (std::size_t d = 0; d < A::rank; ++d)
        shape[d] = a.shape()[perm[d]];
    xt::xtensor<typename A::value_type, A::rank> local = xt::transpose(a.local(), {P...});
    using result = detail::result_t<typename A::value_type, typename A::mesh_type, rule::is_static,
                                    rule::value.out, A::rank>;
    return result(detail::unchecked, a.mesh(), shape, std::move(local), res.out);
}

/// The tensor reshaped to `shape`, laid out as To (with `To = dynamic_layout(M)`, as the
/// run-time `to`); see the file comment for when the layout can follow.
template <layout To, distributed_tensor A, std::size_t M>
auto reshape(const A& a, const std::array<std::size_t, M>& shape, const layout& to = To) {
    static_assert(To.rank() == M, "xshard: the layout's rank differs from the new shape's");
    const auto& lay = detail::layout_for<To>(to, a.mesh().shape());
    const std::size_t n = volume(shape);
    if (n != a.size())
        throw error("xshard: reshape: " + detail::shape_string(a.shape()) + " has " +
                    std::to_string(a.size()) + " elements, " + detail::shape_string(shape) + " " +
                    std::to_string(n));
    if (!detail::reshape_follows(a.mesh().shape(), a.shape(), a.layout(), shape, lay))
        throw error("xshard: reshape " + detail::shape_string(a.shape()) + " " +
                    a.layout().to_string() + " -> " + detail::shape_string(shape) + " " +
                    lay.to_string() +
                    ": the layout cannot follow; call xshard::redistribute "
                    "first (e.g. to a layout with only the leading dimension of each merged "
                    "group split, divisibly)");
    const auto block = block_of(lay, a.mesh().shape(), shape, a.mesh().rank());
    auto local = xt::xtensor<typename A::value_type, M>::from_shape(block.extent);
    std::copy_n(a.local().data(), local.size(), local.data());
    return dtensor<typename A::value_type, typename A::mesh_type, To>(detail::unchecked, a.mesh(),
                                                                      shape, std::move(local), lay);
}

/// On traced tensors (ops/annotated.hpp): the permutation recorded in the program.
template <std::size_t... P, traced_operand A>
auto transpose(const A& a) {
    return trace_call("transpose", op_attributes{{std::int64_t(P)...}, {}}, op_annotation{}, a);
}

/// On traced tensors: the reshape recorded in the program (the layout follows where it can:
/// a split first dimension of unchanged extent; graph/primitives/shape.hpp).
template <traced_operand A, std::size_t M>
auto reshape(const A& a, const std::array<std::size_t, M>& shape) {
    op_attributes at;
    for (auto e : shape)
        at.ints.push_back(std::int64_t(e));
    return trace_call("reshape", std::move(at), op_annotation{}, a);
}

/// Elements [begin, end) of dimension `dim` of a traced tensor (MindSpore's StridedSlice
/// with stride 1 along one dimension).
template <traced_operand A>
auto slice(const A& a, std::int64_t dim, std::size_t begin, std::size_t end) {
    return trace_call("slice", op_attributes{{dim, std::int64_t(begin), std::int64_t(end)}, {}},
                      op_annotation{}, a);
}

/// Traced tensors one after another along dimension `dim` (MindSpore's Concat(axis)): the
/// same element type and extents in every other dimension.
template <traced_operand A, traced_operand... Rest>
auto concat(std::int64_t dim, const A& first, const Rest&... rest) {
    return trace_call("concat", op_attributes{{dim}, {}}, op_annotation{}, first, rest...);
}

/// A traced tensor [d0, d1, ...] as [d0, d1 * ...] (MindSpore's Flatten).
template <traced_operand A>
auto flatten(const A& a) {
    const auto& s = a.shape();
    std::size_t rest = 1;
    for (std::size_t d = 1; d < s.size(); ++d)
        rest *= s[d];
    return reshape(a, std::array<std::size_t, 2>{s.empty() ? 1 : s[0], rest});
}

} // namespace ops

} // namespace xshard
