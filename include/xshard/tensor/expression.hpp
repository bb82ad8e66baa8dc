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
/// Partial tensors (pending reductions) take part only where the result stays right: sums
/// and differences of partial(sum) tensors, their negation and their products with (and
/// quotients by) scalars. Adding a scalar to a partial tensor, multiplying two tensors
/// of which one is partial, or any arithmetic on a partial(max/min) tensor is a compile
/// error (an exception, for run-time layouts).

#include <xshard/tensor/dtensor.hpp>

#include <xtensor/xtensor.hpp>

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

enum class op_kind { additive, multiplicative, divide_by };

/// Whether `a op b` is defined, given which operands are distributed and their layouts
/// (null for scalars).
constexpr bool partial_allowed(op_kind kind, const layout* a, const layout* b) {
    const bool pa = a && a->is_partial(), pb = b && b->is_partial();
    if (!pa && !pb)
        return true;
    if ((pa && a->op != reduction::sum) || (pb && b->op != reduction::sum))
        return false; // max/min terms do not commute with arithmetic
    switch (kind) {
    case op_kind::additive:
        return a && b; // a sum of sums; never partial + scalar
    case op_kind::multiplicative:
        return !(a && b); // scalar * partial only
    case op_kind::divide_by:
        return !b; // partial / scalar only
    }
    return false;
}

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

/// Rejects partial operands where the operation would be wrong: at compile time for
/// layout types, at run time for run-time layouts.
template <op_kind Kind, class A, class B>
void check_partial(const A& a, const B& b) {
    constexpr const layout* sa = static_layout_of<A>();
    constexpr const layout* sb = static_layout_of<B>();
    if constexpr ((sa && sa->dynamic) || (sb && sb->dynamic)) {
        if (!partial_allowed(Kind, layout_of(a), layout_of(b)))
            throw error("xshard: a partial tensor (pending reduction) cannot enter this "
                        "operation; redistribute it to a non-partial layout first");
    } else {
        static_assert(partial_allowed(Kind, sa, sb),
                      "xshard: a partial tensor (pending reduction) cannot enter this "
                      "operation; redistribute it to a non-partial layout first");
    }
}

/// Builds the expression `f(a, b)` after the compile-time and run-time checks.
template <op_kind Kind, class A, class B, class F>
auto combine(A&& a, B&& b, F f) {
    if constexpr (distributed<A> && distributed<B>) {
        using XA = std::remove_cvref_t<A>;
        using XB = std::remove_cvref_t<B>;
        static_assert(std::is_same_v<typename XA::mesh_type, typename XB::mesh_type>,
                      "xshard: elementwise operands live on meshes of different types");
        static_assert(XA::static_layout == XB::static_layout,
                      "xshard: elementwise operands have different layouts; call "
                      "xshard::redistribute<layout>(tensor) on one of them first");
        if (!(a.mesh() == b.mesh()) || a.shape() != b.shape())
            throw error("xshard: elementwise operands have different meshes or global shapes");
        if (!(a.layout() == b.layout()))
            throw error("xshard: elementwise operands have different layouts (" +
                        a.layout().to_string() + " and " + b.layout().to_string() +
                        "); call xshard::redistribute on one of them first");
    }
    check_partial<Kind>(a, b);
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
    return detail::combine<detail::op_kind::additive>(
        std::forward<A>(a), std::forward<B>(b), [](auto&& x, auto&& y) {
            return std::forward<decltype(x)>(x) + std::forward<decltype(y)>(y);
        });
}

/// Elementwise difference (lazy).
template <class A, class B>
requires detail::elementwise_operands<A, B>
auto operator-(A&& a, B&& b) {
    return detail::combine<detail::op_kind::additive>(
        std::forward<A>(a), std::forward<B>(b), [](auto&& x, auto&& y) {
            return std::forward<decltype(x)>(x) - std::forward<decltype(y)>(y);
        });
}

/// Elementwise product (lazy).
template <class A, class B>
requires detail::elementwise_operands<A, B>
auto operator*(A&& a, B&& b) {
    return detail::combine<detail::op_kind::multiplicative>(
        std::forward<A>(a), std::forward<B>(b), [](auto&& x, auto&& y) {
            return std::forward<decltype(x)>(x) * std::forward<decltype(y)>(y);
        });
}

/// Elementwise quotient (lazy).
template <class A, class B>
requires detail::elementwise_operands<A, B>
auto operator/(A&& a, B&& b) {
    return detail::combine<detail::op_kind::divide_by>(
        std::forward<A>(a), std::forward<B>(b), [](auto&& x, auto&& y) {
            return std::forward<decltype(x)>(x) / std::forward<decltype(y)>(y);
        });
}

/// Negation (lazy); fine on partial(sum) tensors, whose negated terms sum to the negation.
template <distributed A>
auto operator-(A&& a) {
    detail::check_partial<detail::op_kind::multiplicative>(a, 0);
    using X = std::remove_cvref_t<A>;
    auto mesh = a.mesh();
    auto shape = a.shape();
    auto l = a.layout();
    auto e = -std::forward<A>(a).local();
    return dexpression<typename X::mesh_type, X::static_layout, decltype(e)>(mesh, shape,
                                                                             std::move(e), l);
}

} // namespace xshard
