#pragma once
/// \file
/// The backward pass of a shard()'d callable (global semantics), JAX's `jax.vjp`:
///
///     auto f = xshard::shard(mesh, fn, std::tuple(xshard::layout("[dp, mp]"), xshard::strategy{4, 1}));
///     auto [y, pullback] = xshard::vjp(f, x, w);    // y = f(x, w)
///     auto [dx, dw] = pullback(dy);                 // the cotangents of x and w
///
/// The callable is traced on its arguments' shapes (so it must be written with xshard's
/// operations on its arguments, a generic callable: `[](auto x, auto w) { ... }`), compiled
/// onto the mesh as a program (graph/executable.hpp) whose inputs take the input specs'
/// layouts (an input spec of `none` keeps the argument's), and run forward; the pullback runs
/// the program's backward pass. The result is laid out as the output spec says (as the
/// program computes it for `none`), and each cotangent as the dual of its input's layout
/// (core/layout.hpp: replicated axes pending sums). Each call traces and compiles anew: for a
/// loop, compile the program once (graph/).

#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/graph/executable.hpp>
#include <xshard/graph/trace.hpp>
#include <xshard/redistribute/redistribute.hpp>
#include <xshard/shard/sharded.hpp>
#include <xshard/shard/spec.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace xshard {

namespace detail {

/// The layout spec `s` gives an argument `a`.
template <class Mesh, class S, class A>
layout vjp_input_layout(const Mesh& mesh, const S& s, const A& a) {
    if constexpr (std::is_same_v<S, none_t>)
        return a.layout();
    else if constexpr (is_layout_spec<S>)
        return S::value;
    else
        return spec_layout(s, A::rank, mesh.shape());
}

} // namespace detail

/// The value of `f` (a shard() of global semantics, one output of rank N) at `args` and its
/// pullback (see the file comment). Collective over f's mesh.
template <std::size_t N = 2, class Sharded, distributed_tensor... Args>
auto vjp(const Sharded& f, const Args&... args) {
    static_assert(!Sharded::local_semantics,
                  "xshard: vjp differentiates shard() of global semantics; shard_local's callable "
                  "works on local arrays, which cannot be traced");
    static_assert(sizeof...(Args) > 0, "xshard: vjp needs the callable's arguments");
    using T = typename std::tuple_element_t<0, std::tuple<Args...>>::value_type;
    using Mesh = std::remove_cvref_t<decltype(f.mesh())>;
    const auto& mesh = f.mesh();
    compile_options options;
    options.input_gradients = true;
    // Input I takes the layout of the I-th spec.
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        ((options.layouts.input_layouts["input" + std::to_string(I)] =
              detail::vjp_input_layout(mesh, std::get<I>(f.in_specs()), std::get<I>(std::tie(args...)))),
         ...);
    }(std::index_sequence_for<Args...>{});
    auto p = [&]<std::size_t... I>(std::index_sequence<I...>) {
        return trace([&](auto... t) { return f.function()(t...); },
                     input<T>("input" + std::to_string(I),
                              value_shape(args.shape().begin(), args.shape().end()))...);
    }(std::index_sequence_for<Args...>{});
    auto program = std::make_shared<compiled_program<T, Mesh>>(std::move(p), mesh, options);
    program->run(args...);
    auto y = program->template output<N>(0);
    if constexpr (!std::is_same_v<std::remove_cvref_t<decltype(f.out_specs())>, none_t>) {
        const auto to = detail::vjp_input_layout(mesh, f.out_specs(), y);
        y = redistribute<dynamic_layout(N)>(std::move(y), to);
    }
    auto pullback = [program]<distributed_tensor G>(const G& dy) {
        program->backward(dy);
        return [&]<std::size_t... I>(std::index_sequence<I...>) {
            return std::tuple(program->template input_gradient<Args::rank>(I)...);
        }(std::index_sequence_for<Args...>{});
    };
    return std::pair(std::move(y), std::move(pullback));
}

} // namespace xshard
