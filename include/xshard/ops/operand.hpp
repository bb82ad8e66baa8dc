#pragma once
/// \file
/// What every operation does with its operands: check its sharding rule (at compile time
/// for layout types), bring each operand to the layout the rule asks for (free local steps;
/// a redistribution only where the mesh type allows it), and wrap the local result.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/core/rule.hpp>
#include <xshard/ops/annotated.hpp>
#include <xshard/ops/rules.hpp>
#include <xshard/redistribute/copy.hpp>
#include <xshard/redistribute/redistribute.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <xtensor/xtensor.hpp>

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace xshard {

/// The mesh type of tensors whose operations may insert redistributions (MindSpore's
/// behaviour): a mesh of type M that says so. `shard(mesh, fn, in, out,
/// xshard::auto_redistribute)` hands `fn` its inputs on this mesh type; elsewhere an
/// operation that would need a redistribution is a compile error (an exception for run-time
/// layouts).
template <mesh_type M>
class redistributing_mesh : public M {
public:
    static constexpr bool inserts_redistributions = true;
    using plain_mesh = M;
    explicit redistributing_mesh(const M& m)
        : M(m) {}
    const M& plain() const noexcept { return *this; }
};

/// Whether operations on tensors of mesh type M may insert redistributions.
template <class M>
constexpr bool inserts_redistributions_v = requires {
    M::inserts_redistributions;
};

namespace detail {

/// Whether every operand has a layout type (not a run-time layout).
template <class... D>
constexpr bool all_static = (!std::remove_cvref_t<D>::static_layout.dynamic && ...);

/// Raises the rule's problem at run time (an exception, the same on every rank: every rank
/// holds the layouts), unless the mesh type may redistribute and the rule worked out a fix
/// (every problem but a rank mismatch has one).
XSHARD_DECL void check_rule(const rule_result& r, const char* operation, bool may_redistribute);

/// A local shard that is either borrowed from an operand or owned (sliced, redistributed).
template <class T, std::size_t N>
struct prepared {
    const xt::xtensor<T, N>* borrowed = nullptr;
    xt::xtensor<T, N> owned;
    const xt::xtensor<T, N>& get() const noexcept { return borrowed ? *borrowed : owned; }
};

/// The local shard of `t` in layout `to`. Free steps (replicated -> split: a slice;
/// replicated -> partial: one rank keeps the values) run locally; anything else is a
/// redistribution, which needs `may_redistribute`. A dimension the caller broadcasts (extent
/// 1 against a longer one) is whole in `to` already (ops/elementwise.hpp clears its split).
template <distributed_tensor D>
auto prepare(const D& t, const layout& to, bool may_redistribute, const char* operation) {
    using T = typename D::value_type;
    constexpr std::size_t N = D::rank;
    prepared<T, N> p;
    const auto& from = t.layout();
    if (from == to) {
        p.borrowed = &t.local();
        return p;
    }
    const auto& mesh = t.mesh().shape();
    // Free: every dimension keeps its split or goes from whole to split; partial axes are
    // kept or added (one term keeps the values).
    bool free =
        from.partial.size() <= to.partial.size() && (!from.is_partial() || from.op == to.op);
    for (const auto& a : from.partial)
        free = free && to.partial.contains(a);
    for (std::size_t d = 0; d < N; ++d)
        free = free && (from.dims[d] == to.dims[d] || from.dims[d].empty());
    for (const auto& a : to.partial)
        free = free && !from.dim_of(a); // a split axis cannot become partial locally
    if (free && !uses_twice(to)) {
        const auto in = t.block(), out = block_of(to, mesh, t.shape(), t.mesh().rank());
        p.owned = xt::xtensor<T, N>::from_shape(out.extent);
        copy_region(t.local().data(), in.extent, in.offset, p.owned.data(), out.extent, out.offset,
                    out);
        bool term = true;
        if (to.op == reduction::sum) {
            const auto c = mesh.coords(t.mesh().rank());
            for (const auto& a : to.partial)
                if (!from.partial.contains(a))
                    term = term && c[mesh.index(a)] == 0;
        }
        if (!term)
            p.owned.fill(T{});
        return p;
    }
    if (!may_redistribute)
        throw error(std::string("xshard: ") + operation + ": operand layout " + from.to_string() +
                    " would need a redistribution to " + to.to_string() +
                    "; redistribute it (or pass xshard::auto_redistribute to shard())");
    p.owned = redistribute<dynamic_layout(N)>(t, to).local();
    return p;
}

/// A sharding rule applied to operands D...: at compile time when every operand has a layout
/// type (then checked by static_asserts unless the mesh type inserts redistributions), at
/// run time otherwise (then checked by an exception, the same on every rank).
template <class Rule, class... D>
struct rule_for {
    using mesh_type =
        typename std::remove_cvref_t<std::tuple_element_t<0, std::tuple<D...>>>::mesh_type;
    static constexpr bool is_static = all_static<D...>;
    static constexpr bool may_redistribute = inserts_redistributions_v<mesh_type>;
    static constexpr rule_result value = Rule{}(std::remove_cvref_t<D>::static_layout...);

    /// The rule's result: a reference to the compile-time constant for layout types (no
    /// work at run time), a value computed now for run-time layouts.
    static decltype(auto) get(const char* operation, const D&... operands) {
        if constexpr (is_static) {
            if constexpr (!may_redistribute)
                static_assert(rule_holds_v<value.problem>);
            else
                check_rule(value, operation, may_redistribute);
            return (value);
        } else {
            const rule_result r = Rule{}(operands.layout()...);
            check_rule(r, operation, may_redistribute);
            return r;
        }
    }
};

/// The output tensor type of an operation: layout Out when the operands have layout types
/// (`Static`), a run-time layout otherwise.
template <class T, class Mesh, bool Static, layout Out, std::size_t N>
struct result_type {
    using type = dtensor<T, Mesh, Out>;
};
template <class T, class Mesh, layout Out, std::size_t N>
struct result_type<T, Mesh, false, Out, N> {
    using type = dtensor<T, Mesh, dynamic_layout(N)>;
};
template <class T, class Mesh, bool Static, layout Out, std::size_t N>
using result_t = typename result_type<T, Mesh, Static, Out, N>::type;

} // namespace detail

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/ops/operand.ipp>
#endif
