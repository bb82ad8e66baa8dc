#pragma once
/// \file
/// shard(): wrap any callable so that it runs on distributed tensors laid out as asked.
///
///     auto f = xshard::shard(mesh, fn, std::tuple(in_0, in_1, ...), out);
///     auto y = f(x0, x1, ...);
///
/// Each input spec is `xshard::spec<"[dp, mp]">` (a layout type: the plan is fixed at compile
/// time), a `layout` value, a MindSpore `strategy{4, 2}` (resolved on the mesh, see
/// core/strategy.hpp), or `xshard::none` (keep the input's layout; an array every rank holds
/// whole is replicated, or split over the data-parallel axis by the mesh's dataset
/// strategy; derived under sharding_propagation, below); see shard/spec.hpp. Inputs may be
/// distributed tensors (redistributed to their spec; nothing happens when they already have
/// it), `xt::xtensor`s every rank holds whole (distributed: local slicing), `parameter`s (laid
/// out by the parameter plan, see below) and anything else, passed through (spec `none`); see
/// shard/inputs.hpp. The output spec (one, or a tuple for a tuple of outputs) redistributes
/// the outputs; `none`, or no spec, keeps the layout the computation gives them (or applies
/// the dataset strategy when the mesh has one); see shard/outputs.hpp.
///
/// Two semantics (the modes of shard/options.hpp):
///  * `shard`: *global semantics*. `fn` receives distributed tensors and is written with
///    xshard's operations, whose sharding rules give every result its layout type: calling
///    `fn` gives the layouts. With `xshard::auto_redistribute` the tensors `fn` receives
///    live on a mesh type whose operations insert the redistributions their rules need (as
///    MindSpore does); by default such a need is a compile error (an exception for run-time
///    layouts) naming `redistribute`.
///  * `shard_local`: *local semantics* (JAX shard_map, MindSpore's hybrid mode). `fn`
///    receives the local shards (`xt::xtensor`s) and returns local arrays; the output specs,
///    required, declare their layouts, partial ones included. The global shapes are worked
///    out from every rank's local shape (an all-gather of the shapes), and a local shape that
///    contradicts its layout raises an exception on every rank.
///
/// A parameter plan (`parameter_plan{{"dense.weight", "[mp, -]"}}`) lays out the named
/// `parameter`s a call receives, in place, once; a parameter planned differently by two
/// shard() calls is an error naming it and both layouts. It also lays out the weights of a
/// module (any parameter container) passed to the call, by their dotted names, with or
/// without MindSpore's "self." before them. A name that no parameter of the call has raises
/// on every rank, naming it.
///
/// Derived layouts: with the option `xshard::sharding_propagation{level}` (after MindSpore's
/// `sharding_propagation` mode, where a `none` in in_strategy is derived) the `none` spec of a
/// distributed tensor or of an array every rank holds whole is derived rather than kept, by
/// trial calls of `fn` on every candidate layout, the cheapest by `level` (0 the least
/// communication, 1 the least memory, 2 the fastest) kept and cached; see
/// shard/derivation.hpp. `fn` must be free of side effects beyond its result, as for
/// MindSpore, which compiles it. `derived_layouts()` names the choice, `describe()` prints
/// it. An operation's own reductions of statistics (normalisation, cross entropy) are not
/// priced at level 0. shard_local keeps its specs.
///
/// A callable that throws on some ranks raises on every rank: the outcome of `fn` is agreed
/// (one all-reduce of one int) before any collective that follows it; the ranks where it
/// threw rethrow their exception, the others throw xshard::error naming the lowest of them.
///
/// Beyond the collectives of its redistributions a call costs little at run time: inputs
/// already in their layout are passed by reference; for typed specs the candidate steps
/// are computed at compile time, and the plans (the choice among them, geometry,
/// datatypes) are built at the first call and cached (shard/plan_cache.hpp). `describe()` on
/// the returned callable (after a call) prints the layouts of the inputs and outputs and the
/// redistribution steps taken.

#include <xshard/core/mesh.hpp>
#include <xshard/shard/derivation.hpp>
#include <xshard/shard/inputs.hpp>
#include <xshard/shard/options.hpp>
#include <xshard/shard/outputs.hpp>
#include <xshard/shard/plan_cache.hpp>
#include <xshard/shard/relayout.hpp>
#include <xshard/shard/sharded.hpp>
#include <xshard/shard/spec.hpp>

#include <optional>
#include <type_traits>
#include <utility>

namespace xshard {

namespace detail {

/// The sharded callable of shard() or shard_local() with options `options`.
template <bool Local, class Mesh, class F, class In, class Out, class... Options>
auto make_sharded(const Mesh& mesh, F fn, In in, Out out, Options... options) {
    static_assert((is_shard_option<Options> && ...),
                  "xshard: shard's options are xshard::auto_redistribute, a parameter_plan and "
                  "xshard::sharding_propagation{level}");
    static_assert(((option_count<Options, Options...> == 1) && ...),
                  "xshard: shard: give each option once");
    constexpr bool redistributing = option_count<auto_redistribute_t, Options...> == 1;
    constexpr bool deriving = option_count<sharding_propagation, Options...> == 1;
    static_assert(!Local || !redistributing,
                  "xshard: shard_local's callable works on local arrays: auto_redistribute is "
                  "for shard (global semantics)");
    static_assert(!Local || !deriving,
                  "xshard: sharding_propagation derives the layouts of shard (global semantics); "
                  "shard_local needs its specs");
    std::optional<parameter_plan> plan;
    int level = 0;
    (
        [&](Options& o) {
            if constexpr (std::is_same_v<Options, parameter_plan>)
                plan = std::move(o);
            else if constexpr (std::is_same_v<Options, sharding_propagation>)
                level = o.level;
        }(options),
        ...);
    return sharded<Mesh, F, In, Out, mode_of(Local, redistributing, deriving)>(
        mesh, std::move(fn), std::move(in), std::move(out), std::move(plan), level);
}

} // namespace detail

/// shard(mesh, fn, in_specs [, out_specs] [, options...]): global semantics (see the file
/// comment). Options, in any order: xshard::auto_redistribute, a parameter_plan,
/// xshard::sharding_propagation{level}.
struct shard_fn {
    template <mesh_type Mesh, class F, class In, class Out = none_t, class... Options>
    auto operator()(const Mesh& mesh, F fn, In in, Out out = {}, Options... options) const {
        return detail::make_sharded<false>(mesh, std::move(fn), std::move(in), std::move(out),
                                           std::move(options)...);
    }
};

/// shard_local(mesh, fn, in_specs, out_specs [, parameter_plan]): local semantics (see the
/// file comment).
struct shard_local_fn {
    template <mesh_type Mesh, class F, class In, class Out, class... Options>
    auto operator()(const Mesh& mesh, F fn, In in, Out out, Options... options) const {
        return detail::make_sharded<true>(mesh, std::move(fn), std::move(in), std::move(out),
                                          std::move(options)...);
    }
};

inline constexpr shard_fn shard{};
inline constexpr shard_local_fn shard_local{};

} // namespace xshard
