#pragma once
/// \file
/// Elementwise operations on distributed tensors, with numpy broadcasting.
///
/// Rule (core/elementwise_rule.hpp, `elementwise_rule`, the one the lazy operators + - * /
/// follow too): dimensions align at the end; each output dimension
/// is split like the operand that splits it (the other is sliced, or broadcast when its
/// extent is 1); two different splits are a mismatch. Pending sums pass through the linear
/// operations: a + b keeps them (the non-partial operand keeps one term), a * b and a / b
/// scale them by a factor that must not be partial; every other function refuses them.
/// No messages, except the redistributions a mesh type that inserts them asks for.
///
/// Binary: add, sub, mul, div, maximum, minimum, bias_add. Unary: neg, relu, gelu, exp, log,
/// tanh, sigmoid, abs, sqrt, square; all in namespace xshard::ops, where `exp` or `abs`
/// cannot hide std's. (For two operands of one layout, the operators + - * / of
/// tensor/expression.hpp are the lazy form.)

#include <xshard/ops/operand.hpp>
#include <xshard/ops/rules.hpp>

#include <xtensor/xmath.hpp>
#include <xtensor/xtensor.hpp>

#include <algorithm>
#include <array>
#include <cmath>

namespace xshard {

namespace detail {

template <elementwise_kind Kind>
struct elementwise_rule_fn {
    constexpr rule_result operator()(const layout& a, const layout& b) const {
        return elementwise_rule(a, b, Kind);
    }
};

template <bool Linear>
struct unary_rule_fn {
    constexpr rule_result operator()(const layout& a) const { return unary_rule(a, Linear); }
};

/// Applies a binary elementwise function `f` on the local shards, after the rule.
template <elementwise_kind Kind, class A, class B, class F>
auto binary(const A& a, const B& b, const char* name, F f) {
    using T = typename A::value_type;
    static_assert(std::is_same_v<T, typename B::value_type>,
                  "xshard: elementwise operands must have the same element type");
    static_assert(std::is_same_v<typename A::mesh_type, typename B::mesh_type>,
                  "xshard: elementwise operands live on meshes of different types");
    constexpr std::size_t ra = A::rank, rb = B::rank, r = ra > rb ? ra : rb;
    using rule = rule_for<elementwise_rule_fn<Kind>, A, B>;
    if (!(a.mesh() == b.mesh()))
        throw error(std::string("xshard: ") + name + ": the operands live on different meshes");
    // The broadcast shape (numpy rules).
    std::array<std::size_t, r> shape{};
    for (std::size_t i = 0; i < r; ++i) {
        const std::size_t ea = i < ra ? a.shape()[ra - 1 - i] : 1,
                          eb = i < rb ? b.shape()[rb - 1 - i] : 1;
        if (ea != eb && ea != 1 && eb != 1)
            throw error(std::string("xshard: ") + name + ": shapes " + shape_string(a.shape()) +
                        " and " + shape_string(b.shape()) + " do not broadcast");
        shape[r - 1 - i] = std::max(ea, eb);
    }
    auto res = rule::get(name, a, b);
    // A dimension broadcast from extent 1 stays whole on its operand.
    for (std::size_t i = 0; i < r; ++i) {
        if (i < ra && a.shape()[ra - 1 - i] == 1 && shape[r - 1 - i] != 1)
            res.a.dims[ra - 1 - i].clear();
        if (i < rb && b.shape()[rb - 1 - i] == 1 && shape[r - 1 - i] != 1)
            res.b.dims[rb - 1 - i].clear();
    }
    const auto pa = prepare(a, res.a, rule::may_redistribute, name);
    const auto pb = prepare(b, res.b, rule::may_redistribute, name);
    xt::xtensor<T, r> local = f(pa.get(), pb.get());
    using result = result_t<T, typename A::mesh_type, rule::is_static, rule::value.out, r>;
    return result(unchecked, a.mesh(), shape, std::move(local), res.out);
}

/// Applies a unary elementwise function `f` on the local shard, after the rule.
template <bool Linear, class A, class F>
auto unary(const A& a, const char* name, F f) {
    using T = typename A::value_type;
    using rule = rule_for<unary_rule_fn<Linear>, A>;
    const auto& res = rule::get(name, a);
    const auto pa = prepare(a, res.a, rule::may_redistribute, name);
    xt::xtensor<T, A::rank> local = f(pa.get());
    using result = result_t<T, typename A::mesh_type, rule::is_static, rule::value.out, A::rank>;
    return result(unchecked, a.mesh(), a.shape(), std::move(local), res.out);
}

template <elementwise_kind Kind, class F>
struct binary_fn : ops::shardable<binary_fn<Kind, F>> {
    const char* name;
    F f;
    constexpr binary_fn(const char* n, F fn)
        : name(n)
        , f(fn) {}
    template <distributed_tensor A, distributed_tensor B>
    auto operator()(const A& a, const B& b) const {
        return binary<Kind>(a, b, name, f);
    }
    /// On traced tensors: records the operation in the program being traced.
    template <ops::traced_operand A, ops::traced_operand B>
    auto operator()(const A& a, const B& b) const {
        return trace_call(std::string_view(name), op_attributes{}, op_annotation{}, a, b);
    }
};

template <bool Linear, class F>
struct unary_fn : ops::shardable<unary_fn<Linear, F>> {
    const char* name;
    F f;
    constexpr unary_fn(const char* n, F fn)
        : name(n)
        , f(fn) {}
    template <distributed_tensor A>
    auto operator()(const A& a) const {
        return unary<Linear>(a, name, f);
    }
    /// On traced tensors: records the operation in the program being traced.
    template <ops::traced_operand A>
    auto operator()(const A& a) const {
        return trace_call(std::string_view(name), op_attributes{}, op_annotation{}, a);
    }
};

template <elementwise_kind Kind, class F>
constexpr binary_fn<Kind, F> make_binary(const char* name, F f) {
    return binary_fn<Kind, F>(name, f);
}
template <bool Linear, class F>
constexpr unary_fn<Linear, F> make_unary(const char* name, F f) {
    return unary_fn<Linear, F>(name, f);
}

} // namespace detail

namespace ops {

inline constexpr auto add = detail::make_binary<elementwise_kind::additive>(
    "add", [](const auto& x, const auto& y) { return x + y; });
inline constexpr auto sub = detail::make_binary<elementwise_kind::additive>(
    "sub", [](const auto& x, const auto& y) { return x - y; });
inline constexpr auto mul = detail::make_binary<elementwise_kind::multiplicative>(
    "mul", [](const auto& x, const auto& y) { return x * y; });
inline constexpr auto div = detail::make_binary<elementwise_kind::division>(
    "div", [](const auto& x, const auto& y) { return x / y; });
inline constexpr auto maximum = detail::make_binary<elementwise_kind::nonlinear>(
    "maximum", [](const auto& x, const auto& y) { return xt::maximum(x, y); });
inline constexpr auto minimum = detail::make_binary<elementwise_kind::nonlinear>(
    "minimum", [](const auto& x, const auto& y) { return xt::minimum(x, y); });
/// x [.., n] + bias [n]: `add` under its usual name for layers. On a pending sum the bias is
/// added by one term only.
inline constexpr auto bias_add = add;

inline constexpr auto neg = detail::make_unary<true>("neg", [](const auto& x) { return -x; });
inline constexpr auto relu = detail::make_unary<false>("relu", [](const auto& x) {
    return xt::maximum(x, typename std::decay_t<decltype(x)>::value_type(0));
});
/// GELU, exact form: x * (1 + erf(x / sqrt 2)) / 2.
inline constexpr auto gelu = detail::make_unary<false>("gelu", [](const auto& x) {
    using T = typename std::decay_t<decltype(x)>::value_type;
    return T(0.5) * x * (T(1) + xt::erf(x / T(std::sqrt(2.0))));
});
inline constexpr auto exp =
    detail::make_unary<false>("exp", [](const auto& x) { return xt::exp(x); });
inline constexpr auto log =
    detail::make_unary<false>("log", [](const auto& x) { return xt::log(x); });
inline constexpr auto tanh =
    detail::make_unary<false>("tanh", [](const auto& x) { return xt::tanh(x); });
inline constexpr auto sigmoid = detail::make_unary<false>("sigmoid", [](const auto& x) {
    using T = typename std::decay_t<decltype(x)>::value_type;
    return T(1) / (T(1) + xt::exp(-x));
});
inline constexpr auto abs =
    detail::make_unary<false>("abs", [](const auto& x) { return xt::abs(x); });
inline constexpr auto sqrt =
    detail::make_unary<false>("sqrt", [](const auto& x) { return xt::sqrt(x); });
inline constexpr auto square =
    detail::make_unary<false>("square", [](const auto& x) { return x * x; });

} // namespace ops

} // namespace xshard
