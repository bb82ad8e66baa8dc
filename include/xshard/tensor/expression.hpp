#pragma once
/// \file
/// Lazy elementwise arithmetic on distributed tensors.
///
/// `a + 2.0 * b` on tensors of one layout builds an xtensor expression over the local
/// shards together with the mesh, shape and layout; nothing is computed until it is
/// assigned to a dtensor (or `eval`uated), and no communication is ever needed: operands of
/// one layout hold matching blocks. Operands of different layouts are a compile error that
/// names `xshard::redistribute` (an exception, for run-time layouts).
///
/// The rule is the elementwise rule of the operations in ops/ (core/elementwise_rule.hpp,
/// `lazy_elementwise_rule`), with the operands taken as they are. So partial tensors
/// (pending reductions) take part only where the result stays right: sums and differences
/// of partial(sum) tensors, their negation and their products with (and quotients by)
/// scalars. Adding a scalar to a partial tensor, multiplying two partial tensors, or any
/// arithmetic on a partial(max/min) tensor is a compile error (an exception, for run-time
/// layouts), in the sentences every operation uses (core/rule.hpp).

#include <xshard/core/elementwise_rule.hpp>
#include <xshard/core/rule.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <xtensor/xtensor.hpp>

#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace xshard {

/// A lazy elementwise expression on the shards of distributed tensors of one layout.
template <mesh_type Mesh, layout L, class E>
class dexpression {
public:
    using mesh_type = Mesh;
    static constexpr std::size_t rank = L.rank();
    using shape_type = std::array<std::size_t, rank>;
    using value_type = typename std::remove_cvref_t<E>::value_type;
    static constexpr xshard::layout static_layout = L;
    static constexpr bool is_distributed = true;

    dexpression(const Mesh& mesh, const shape_type& shape, E expr, const xshard::layout& l)
        : mesh_(mesh)
        , shape_(shape)
        , expr_(std::move(expr)) {
        if constexpr (L.dynamic)
            layout_ = l;
    }

    const xshard::layout& layout() const noexcept {
        if constexpr (L.dynamic)
            return layout_;
        else
            return static_layout;
    }
    const Mesh& mesh() const noexcept { return mesh_; }
    const shape_type& shape() const noexcept { return shape_; }
    /// The xtensor expression over the local shards.
    const E& local() const& noexcept { return expr_; }
    E&& local() && noexcept { return std::move(expr_); }

private:
    Mesh mesh_;
    shape_type shape_;
    E expr_;
    [[no_unique_address]] std::conditional_t<L.dynamic, xshard::layout, detail::no_layout>
        layout_{};
};

/// Evaluates a distributed expression into a tensor.
template <distributed E>
auto eval(E&& e) {
    using X = std::remove_cvref_t<E>;
    return dtensor<typename X::value_type, typename X::mesh_type, X::static_layout>(
        std::forward<E>(e));
}

namespace detail {

template <class A>
constexpr const layout* static_layout_of() {
    if constexpr (distributed<A>)
        return &std::remove_cvref_t<A>::static_layout;
    else
        return nullptr;
}

template <class A>
const layout* layout_of(const A& a) {
    if constexpr (distributed<A>)
        return &a.layout();
    else
        return nullptr;
}

template <class A>
decltype(auto) local_of(A&& a) {
    if constexpr (distributed<A>)
        return std::forward<A>(a).local();
    else
        return std::forward<A>(a);
}

template <class A, class B>
const auto& distributed_of(const A& a, const B& b) {
    if constexpr (distributed<A>)
        return a;
    else
        return b;
}

/// Checks the elementwise rule for the lazy operator `name` (core/elementwise_rule.hpp): at
/// compile time for layout types, at run time (the same exception on every rank) for
/// run-time layouts.
template <elementwise_kind Kind, class A, class B>
void check_rule(const A& a, const B& b, std::string_view name) {
    constexpr const layout* sa = static_layout_of<A>();
    constexpr const layout* sb = static_layout_of<B>();
    if constexpr ((sa && sa->dynamic) || (sb && sb->dynamic))
        raise_rule_problem(lazy_elementwise_rule(layout_of(a), layout_of(b), Kind).problem, name);
    else
        static_assert(rule_holds_v<lazy_elementwise_rule(sa, sb, Kind).problem>);
}

/// Builds the expression `f(a, b)` after the compile-time and run-time checks.
template <elementwise_kind Kind, class A, class B, class F>
auto combine(A&& a, B&& b, std::string_view name, F f) {
    if constexpr (distributed<A> && distributed<B>) {
        using XA = std::remove_cvref_t<A>;
        using XB = std::remove_cvref_t<B>;
        static_assert(std::is_same_v<typename XA::mesh_type, typename XB::mesh_type>,
                      "xshard: elementwise operands live on meshes of different types");
        if (!(a.mesh() == b.mesh()) || a.shape() != b.shape())
            throw error("xshard: " + std::string(name) +
                        ": the elementwise operands have different meshes or global shapes");
    }
    check_rule<Kind>(a, b, name);
    const auto& d = distributed_of(a, b);
    using X = std::remove_cvref_t<decltype(d)>;
    auto mesh = d.mesh();
    auto shape = d.shape();
    auto l = d.layout();
    auto e = f(local_of(std::forward<A>(a)), local_of(std::forward<B>(b)));
    return dexpression<typename X::mesh_type, X::static_layout, decltype(e)>(mesh, shape,
                                                                             std::move(e), l);
}

template <class A, class B>
concept elementwise_operands = (distributed<A> && distributed<B>) ||
                               (distributed<A> && std::is_arithmetic_v<std::remove_cvref_t<B>>) ||
                               (std::is_arithmetic_v<std::remove_cvref_t<A>> && distributed<B>);

} // namespace detail

/// Elementwise sum (lazy).
template <class A, class B>
requires detail::elementwise_operands<A, B>
auto operator+(A&& a, B&& b) {
    return detail::combine<elementwise_kind::additive>(
        std::forward<A>(a), std::forward<B>(b), "a + b", [](auto&& x, auto&& y) {
            return std::forward<decltype(x)>(x) + std::forward<decltype(y)>(y);
        });
}

/// Elementwise difference (lazy).
template <class A, class B>
requires detail::elementwise_operands<A, B>
auto operator-(A&& a, B&& b) {
    return detail::combine<elementwise_kind::additive>(
        std::forward<A>(a), std::forward<B>(b), "a - b", [](auto&& x, auto&& y) {
            return std::forward<decltype(x)>(x) - std::forward<decltype(y)>(y);
        });
}

/// Elementwise product (lazy).
template <class A, class B>
requires detail::elementwise_operands<A, B>
auto operator*(A&& a, B&& b) {
    return detail::combine<elementwise_kind::multiplicative>(
        std::forward<A>(a), std::forward<B>(b), "a * b", [](auto&& x, auto&& y) {
            return std::forward<decltype(x)>(x) * std::forward<decltype(y)>(y);
        });
}

/// Elementwise quotient (lazy).
template <class A, class B>
requires detail::elementwise_operands<A, B>
auto operator/(A&& a, B&& b) {
    return detail::combine<elementwise_kind::division>(
        std::forward<A>(a), std::forward<B>(b), "a / b", [](auto&& x, auto&& y) {
            return std::forward<decltype(x)>(x) / std::forward<decltype(y)>(y);
        });
}

/// Negation (lazy); fine on partial(sum) tensors, whose negated terms sum to the negation.
template <distributed A>
auto operator-(A&& a) {
    using X = std::remove_cvref_t<A>;
    if constexpr (X::static_layout.dynamic)
        raise_rule_problem(unary_rule(a.layout(), true).problem, "-a");
    else
        static_assert(rule_holds_v<unary_rule(X::static_layout, true).problem>);
    auto mesh = a.mesh();
    auto shape = a.shape();
    auto l = a.layout();
    auto e = -std::forward<A>(a).local();
    return dexpression<typename X::mesh_type, X::static_layout, decltype(e)>(mesh, shape,
                                                                             std::move(e), l);
}

} // namespace xshard
