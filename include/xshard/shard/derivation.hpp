#pragma once
/// \file
/// Derived layouts: how shard() with the option `xshard::sharding_propagation{level}` (named
/// after MindSpore's `sharding_propagation` mode, where a `none` in in_strategy is derived)
/// chooses the layouts of the inputs whose spec is `none`: distributed tensors and arrays
/// every rank holds whole. `fn` is any callable, so the graph of its operations is known only
/// by running it: on the first call with given layouts, shapes and element types, every
/// candidate layout of the derived inputs (every layout that is not partial over the axes of
/// more than one rank; all combinations up to 64, else each input in turn) runs the whole
/// call twice on copies of the arguments (a trial), and the cheapest by `level` is kept:
///  * 0, the least communication: the call's redistributions (the inputs', those the
///    operations insert under auto_redistribute, the outputs') priced by the planner's
///    alpha-beta model (redistribute/meter.hpp), then the time;
///  * 1, the least memory: the bytes of the shards `fn` receives and returns, then the time;
///  * 2, the fastest: the measured time of the call, then the memory.
/// The costs are the maxima over the ranks, all-reduced, so every rank derives alike; a
/// candidate whose call raises (layouts an operation's rule refuses) is not one; when every
/// candidate raises, the call runs with the kept layouts and raises what it raises. The
/// choice is cached by the derived inputs' layouts, shapes and element sizes; the next calls
/// run `fn` once. The strategy search's propagation of operator strategies along a network
/// (search/sharding_propagation.hpp) is another thing: it prices a chain of operators its cost
/// model knows, without running them.

#include <xshard/compiled.hpp>
#include <xshard/comm/agree.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/axis.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/objective.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/core/static_vector.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/redistribute/route.hpp>
#include <xshard/shard/inputs.hpp>
#include <xshard/shard/relayout.hpp>
#include <xshard/shard/spec.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard::detail {

/// An argument whose `none` spec sharding_propagation derives: a distributed tensor or an
/// array every rank holds whole (a parameter keeps its plan or its layout).
template <class A>
constexpr bool derivable = distributed_tensor<A> || is_xtensor<A>::value;

/// The spec an input gets when layouts are derived: a run-time layout where `none` meets a
/// derivable argument, the given spec elsewhere.
template <class Spec, class Arg>
using derived_spec_t =
    std::conditional_t<std::is_same_v<Spec, none_t> && derivable<std::remove_cvref_t<Arg>>, layout,
                       Spec>;

template <class Spec, class Given>
Spec derived_spec(const Given& given, const std::optional<layout>& derived) {
    if constexpr (std::is_same_v<Spec, Given>)
        return given;
    else
        return *derived;
}

/// The derived layouts by the key of the derived inputs' layouts, shapes and types.
using derivation_cache = std::map<std::string, std::vector<std::optional<layout>>>;

/// The inputs of a call whose layouts are derived, as this rank sees them.
template <std::size_t N>
struct derived_inputs {
    std::vector<std::optional<layout>> kept =
        std::vector<std::optional<layout>>(N); ///< the layout `none` keeps; empty elsewhere
    std::array<std::size_t, N> ranks{};        ///< their tensor ranks
    std::string key;                           ///< their layouts, shapes and element sizes
    bool arrays = false;                       ///< an array held whole among them
};

/// The inputs that derive their layout among `args`, input I by its spec in `In`.
template <class In, class Mesh, std::size_t... I, class... Args>
derived_inputs<sizeof...(I)> derived_inputs_of(const Mesh& mesh, std::index_sequence<I...>,
                                               const Args&... args) {
    derived_inputs<sizeof...(I)> out;
    (
        [&] {
            using A = std::remove_cvref_t<Args>;
            if constexpr (std::is_same_v<std::tuple_element_t<I, In>, none_t> && derivable<A>) {
                out.arrays = out.arrays || !distributed_tensor<A>;
                out.kept[I] = kept_layout(mesh, args);
                out.ranks[I] = A::rank;
                out.key += std::to_string(I) + ':' + out.kept[I]->to_string() +
                           shape_string(args.shape()) + '/' +
                           std::to_string(sizeof(typename A::value_type)) + ';';
            }
        }(),
        ...);
    return out;
}

/// Raises on every rank unless every rank of `c` holds the same derivation key. The ranks
/// must look the cache up with one key: tensors' layouts and global shapes are the same on
/// every rank, but an array held whole has each rank's own shape. Collective: one all-reduce
/// of the key's hash.
XSHARD_DECL void check_key_agrees(const communicator& c, const std::string& key);

/// The layouts a derived input of rank N may take: first `kept`, then every layout of rank N
/// that is not partial, over the mesh's axes of more than one rank. Only `kept` past
/// `max_route_layouts` (the routes' bound).
template <class Mesh>
std::vector<layout> derivation_candidates(const Mesh& mesh, std::size_t N, const layout& kept) {
    std::vector<layout> out{kept};
    static_vector<axis_name, max_mesh_axes> names;
    static_vector<int, max_mesh_axes> sizes;
    const auto& ms = mesh.shape();
    for (std::size_t i = 0; i < ms.ndim(); ++i)
        if (ms.sizes[i] > 1) {
            names.push_back(ms.names[i]);
            sizes.push_back(ms.sizes[i]);
        }
    for (auto& l : all_layouts_on(mesh_shape(names, sizes), N, {}, max_route_layouts))
        if (l.partial.empty() && !(l == kept))
            out.push_back(std::move(l));
    return out;
}

/// The candidate layouts of each input: those of derivation_candidates for a derived input,
/// none for the others.
template <class Mesh, std::size_t N>
std::vector<std::vector<layout>> derivation_options(const Mesh& mesh,
                                                    const derived_inputs<N>& inputs) {
    std::vector<std::vector<layout>> options(N);
    for (std::size_t i = 0; i < N; ++i)
        if (inputs.kept[i])
            options[i] = derivation_candidates(mesh, inputs.ranks[i], *inputs.kept[i]);
    return options;
}

/// The bytes of the local shards a call's tensor holds on this rank (summed over a tuple).
template <class X>
std::size_t local_bytes(const X& x) {
    using A = std::remove_cvref_t<X>;
    if constexpr (distributed_tensor<A>)
        return x.local().size() * sizeof(typename A::value_type);
    else if constexpr (is_tuple<A>::value)
        return std::apply([](const auto&... e) { return (std::size_t(0) + ... + local_bytes(e)); },
                          x);
    else
        return 0;
}

/// What a candidate's call cost, the maximum over the ranks: measured seconds, the
/// redistributions' predicted seconds, the bytes of the inputs and outputs of `fn`.
struct trial_cost {
    double seconds = 0;
    double communication = 0;
    double memory = 0;
};

/// Whether `a` is cheaper than `b` by objective `level` (lexicographic: communication then
/// time at 0, memory then time at 1, time then memory at 2). Times within 2 % tie: a
/// redistribution is not worth the noise of one measurement.
XSHARD_DECL bool cheaper(int level, const trial_cost& a, const trial_cost& b);

/// The cheapest assignment of candidate layouts (`options[i]`, the kept layout first; empty
/// for an input that is not derived) by objective `level`: every combination when there are
/// at most 64, else each input in turn with the others at their best so far. `cost_of(c)`
/// is the agreed trial cost of assignment `c`, or nullopt when its call raised (then `c` is
/// not a candidate). The kept layouts stay unless another assignment is cheaper, or theirs
/// raises and another's does not.
template <class CostOf>
std::vector<std::optional<layout>>
cheapest_assignment(const std::vector<std::vector<layout>>& options, int level, CostOf&& cost_of) {
    std::vector<std::optional<layout>> best(options.size());
    std::size_t combinations = 1;
    for (std::size_t i = 0; i < options.size(); ++i)
        if (!options[i].empty()) {
            best[i] = options[i][0];
            combinations =
                options[i].size() > 64 / combinations ? 65 : combinations * options[i].size();
        }
    std::optional<trial_cost> best_cost = cost_of(best);
    auto consider = [&](const std::vector<std::optional<layout>>& c) {
        const auto cost = cost_of(c);
        if (cost && (!best_cost || cheaper(level, *cost, *best_cost))) {
            best_cost = cost;
            best = c;
        }
    };
    if (combinations <= 64) {
        std::vector<std::size_t> at(options.size(), 0);
        while (true) { // mixed-radix count over the inputs' candidates; 0...0 is done
            std::size_t i = 0;
            for (; i < options.size(); ++i) {
                if (options[i].empty())
                    continue;
                if (++at[i] < options[i].size())
                    break;
                at[i] = 0;
            }
            if (i == options.size())
                break;
            std::vector<std::optional<layout>> c(options.size());
            for (std::size_t j = 0; j < options.size(); ++j)
                if (!options[j].empty())
                    c[j] = options[j][at[j]];
            consider(c);
        }
    } else {
        for (std::size_t i = 0; i < options.size(); ++i)
            for (std::size_t k = 1; k < options[i].size(); ++k) {
                auto c = best;
                c[i] = options[i][k];
                consider(c);
            }
    }
    return best;
}

/// Appends "input i derived (level L): kept -> derived" for each derived input to the
/// report (when tracing).
XSHARD_DECL void note_derived(const call_log& log, const std::vector<std::optional<layout>>& kept,
                              const std::vector<std::optional<layout>>& derived, int level);

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/shard/derivation.ipp>
#endif
