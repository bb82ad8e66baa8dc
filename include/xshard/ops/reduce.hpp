#pragma once
/// \file
/// Reductions along a dimension (sum, mean, max, min), and `resolve` for pending reductions.
///
/// Rule (rules.hpp, `reduction_rule`): the output drops dimension Dim (keeps it unsplit, of
/// extent 1, with KeepDims). Along an unsplit Dim the reduction is local. Along a split Dim
/// each rank reduces its block and the result is *partial* over Dim's axes (a pending sum
/// for sum and mean, max or min for those): no message until a consumer needs the value;
/// `resolve` (or a redistribution, or shard's out_strategy) all-reduces it then, and a
/// redistribution to a split layout reduce-scatters it. Pending sums enter sums and means
/// only.

#include <xshard/comm/combine.hpp>
#include <xshard/ops/operand.hpp>
#include <xshard/ops/rules.hpp>
#include <xshard/redistribute/redistribute.hpp>

#include <xtensor/xmath.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xtensor.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>

namespace xshard {

namespace detail {

/// The sum over the leading dimension of `rows` rows of `m` contiguous elements at `in`,
/// written to the m elements at `out`: row by row into one accumulator, each pass contiguous
/// and vectorised (comm/combine.hpp), where xtensor's reducer walks every column with a
/// stride: the bias and layer-norm gradients of a transformer block's step took 4-5 % of it
/// that way (benchmarks/README.md). The terms are added in row order.
template <class T>
void sum_leading_rows(const T* in, std::size_t rows, std::size_t m, T* out) {
    if (rows == 0) {
        std::fill_n(out, m, T(0));
        return;
    }
    std::copy_n(in, m, out);
    for (std::size_t r = 1; r < rows; ++r)
        combine(out, out, in + r * m, m, reduction::sum);
}

/// Whether E is a row-major xtensor container: its elements lie contiguous, in row order.
template <class E>
inline constexpr bool row_major_container = false;
template <class C, std::size_t N, class Tag>
inline constexpr bool
    row_major_container<xt::xtensor_container<C, N, xt::layout_type::row_major, Tag>> = true;

template <std::size_t Dim, reduction Op, bool KeepDims>
struct reduction_rule_fn {
    constexpr rule_result operator()(const layout& a) const {
        return reduction_rule(a, Dim, Op, KeepDims);
    }
};

template <reduction Op, bool Mean, std::size_t Dim, bool KeepDims, class A>
auto reduce_along(const A& a, const char* name) {
    using T = typename A::value_type;
    constexpr std::size_t N = A::rank, R = KeepDims ? N : N - 1;
    static_assert(Dim < N, "xshard: the reduced dimension is not a dimension of the tensor");
    using rule = rule_for<reduction_rule_fn<Dim, Op, KeepDims>, A>;
    const auto& res = rule::get(name, a);
    const auto pa = prepare(a, res.a, rule::may_redistribute, name);
    const auto& in = pa.get();
    // The global shape and this rank's block of the result.
    auto reduced = [](const auto& from) {
        std::array<std::size_t, R> s{};
        for (std::size_t d = 0, o = 0; d < N; ++d) {
            if (d != Dim)
                s[o++] = from[d];
            else if (KeepDims)
                s[o++] = 1;
        }
        return s;
    };
    const auto shape = reduced(a.shape()), block = reduced(in.shape());
    xt::xtensor<T, R> local;
    if (in.shape()[Dim] == 0) {
        // An empty block: the identity of the reduction.
        local = xt::xtensor<T, R>::from_shape(block);
        local.fill(Op == reduction::sum   ? T(0)
                   : Op == reduction::max ? std::numeric_limits<T>::lowest()
                                          : std::numeric_limits<T>::max());
    } else if constexpr (Dim == 0 && Op == reduction::sum &&
                         row_major_container<std::decay_t<decltype(in)>>) {
        local = xt::xtensor<T, R>::from_shape(block);
        sum_leading_rows(in.data(), in.shape()[0], in.size() / in.shape()[0], local.data());
    } else if constexpr (KeepDims) {
        if constexpr (Op == reduction::sum)
            local = xt::sum(in, {Dim}, xt::keep_dims);
        else if constexpr (Op == reduction::max)
            local = xt::amax(in, {Dim}, xt::keep_dims);
        else
            local = xt::amin(in, {Dim}, xt::keep_dims);
    } else {
        if constexpr (Op == reduction::sum)
            local = xt::sum(in, {Dim});
        else if constexpr (Op == reduction::max)
            local = xt::amax(in, {Dim});
        else
            local = xt::amin(in, {Dim});
    }
    if constexpr (Mean)
        local /= T(a.shape()[Dim]);
    using result = result_t<T, typename A::mesh_type, rule::is_static, rule::value.out, R>;
    return result(unchecked, a.mesh(), shape, std::move(local), res.out);
}

} // namespace detail

namespace ops {

/// The sum along Dim (partial over Dim's axes when Dim is split).
template <std::size_t Dim, bool KeepDims = false, distributed_tensor A>
auto sum(const A& a) {
    return detail::reduce_along<reduction::sum, false, Dim, KeepDims>(a, "sum");
}

/// The mean along Dim (a pending sum of block sums divided by the global extent when Dim is
/// split).
template <std::size_t Dim, bool KeepDims = false, distributed_tensor A>
auto mean(const A& a) {
    return detail::reduce_along<reduction::sum, true, Dim, KeepDims>(a, "mean");
}

/// The maximum along Dim (partial(max) over Dim's axes when Dim is split).
template <std::size_t Dim, bool KeepDims = false, distributed_tensor A>
auto max(const A& a) {
    return detail::reduce_along<reduction::max, false, Dim, KeepDims>(a, "max");
}

/// The minimum along Dim (partial(min) over Dim's axes when Dim is split).
template <std::size_t Dim, bool KeepDims = false, distributed_tensor A>
auto min(const A& a) {
    return detail::reduce_along<reduction::min, false, Dim, KeepDims>(a, "min");
}

/// On traced tensors (ops/annotated.hpp), sum, mean, max and min record the reduction along
/// Dim in the program being traced.
template <std::size_t Dim, bool KeepDims = false, traced_operand A>
auto sum(const A& a) {
    return trace_call("sum", op_attributes{{KeepDims, std::int64_t(Dim)}, {}}, op_annotation{}, a);
}
template <std::size_t Dim, bool KeepDims = false, traced_operand A>
auto mean(const A& a) {
    return trace_call("mean", op_attributes{{KeepDims, std::int64_t(Dim)}, {}}, op_annotation{}, a);
}
template <std::size_t Dim, bool KeepDims = false, traced_operand A>
auto max(const A& a) {
    return trace_call("max", op_attributes{{KeepDims, std::int64_t(Dim)}, {}}, op_annotation{}, a);
}
template <std::size_t Dim, bool KeepDims = false, traced_operand A>
auto min(const A& a) {
    return trace_call("min", op_attributes{{KeepDims, std::int64_t(Dim)}, {}}, op_annotation{}, a);
}

/// The sum over every dimension of a traced tensor: a scalar.
template <traced_operand A>
auto sum_all(const A& a) {
    return trace_call("sum", op_attributes{{0}, {}}, op_annotation{}, a);
}
/// The mean over every dimension of a traced tensor: a scalar.
template <traced_operand A>
auto mean_all(const A& a) {
    return trace_call("mean", op_attributes{{0}, {}}, op_annotation{}, a);
}

/// The layout `l` without its pending reduction.
constexpr layout resolved(layout l) {
    l.partial.clear();
    return l;
}

/// `t` with its pending reduction carried out: an all-reduce over its partial axes (xshard's
/// pairwise all-reduce for large tensors); `t` itself when nothing is pending.
template <distributed_tensor D>
auto resolve(D&& t) {
    using X = std::remove_cvref_t<D>;
    constexpr layout L = X::static_layout.dynamic ? X::static_layout : resolved(X::static_layout);
    const layout target = resolved(t.layout());
    return redistribute<L>(std::forward<D>(t), target);
}

} // namespace ops

} // namespace xshard
