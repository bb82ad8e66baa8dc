#pragma once
/// \file
/// How a sharded call hands back its outputs, each by its spec (shard/spec.hpp). Under
/// global semantics an output is a distributed tensor the callable returned: redistributed
/// to its spec, or kept (laid out by the mesh's dataset strategy when the mesh has one), back
/// on the plain mesh type. Under local semantics an output is a local array the callable
/// returned on each rank: wrapped as a distributed tensor laid out by its required spec, its
/// global shape worked out from every rank's local shape.

#include <xshard/comm/collectives.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/shard/inputs.hpp>
#include <xshard/shard/relayout.hpp>
#include <xshard/shard/spec.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <array>
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard::detail {

/// One output of a call, redistributed by its spec and back on the plain mesh type.
template <class Mesh, class Out, class Spec>
auto shard_output(const Mesh& mesh, Out&& out, const Spec& spec, const call_log& log,
                  const slot& what) {
    using O = std::remove_cvref_t<Out>;
    if constexpr (!distributed_tensor<O>) {
        return O(std::forward<Out>(out));
    } else {
        auto plain = on_mesh(std::forward<Out>(out), mesh);
        if constexpr (is_layout_spec<Spec>) {
            return relayout<Spec::value>(std::move(plain), Spec::value, log, what);
        } else if constexpr (std::is_same_v<Spec, none_t>) {
            // Kept, or laid out by the mesh's dataset strategy: a run-time layout follows it;
            // a layout type must already agree (the result's type cannot depend on a setting).
            const layout l = dataset_layout(mesh, O::rank, plain.layout());
            if constexpr (O::static_layout.dynamic) {
                return relayout<O::static_layout>(std::move(plain), l, log, what);
            } else {
                if (!(l == plain.layout()))
                    throw error("xshard: shard: " + what.label() + " has layout type " +
                                plain.layout().to_string() + " but the dataset strategy asks for " +
                                l.to_string() + "; give the output a spec");
                note(log, what, "", l, l, "");
                return plain;
            }
        } else {
            const layout l = spec_layout(spec, O::rank, mesh.shape());
            return relayout<dynamic_layout(O::rank)>(std::move(plain), l, log, what);
        }
    }
}

/// The global shape of a tensor laid out as `l` whose shard on this rank has shape `local`:
/// from every rank's local shape (an all-gather). Throws on every rank if a rank's local
/// shape contradicts the layout.
template <class Mesh, std::size_t N>
std::array<std::size_t, N> global_shape_of(const Mesh& mesh, const layout& l,
                                           const std::array<std::size_t, N>& local,
                                           const slot& what) {
    const auto& ms = mesh.shape();
    std::vector<unsigned long long> all(std::size_t(mesh.size()) * N);
    std::array<unsigned long long, N> mine{};
    for (std::size_t d = 0; d < N; ++d)
        mine[d] = local[d];
    if constexpr (N > 0)
        allgather(mesh.comm(), mine, all);
    auto extent = [&](int r, std::size_t d) {
        return std::size_t(all[std::size_t(r) * N + d]);
    };
    std::array<std::size_t, N> shape{};
    for (std::size_t d = 0; d < N; ++d) {
        // Walk the blocks of dimension d on the ranks at coordinate 0 off its axes.
        const auto axes = l.split_axes(d, ms);
        for (int r : ms.group_ranks(0, axes))
            shape[d] += extent(r, d);
    }
    for (int r = 0; r < mesh.size(); ++r) {
        const auto b = block_of(l, ms, shape, r);
        for (std::size_t d = 0; d < N; ++d)
            if (b.extent[d] != extent(r, d))
                throw error("xshard: " + what.label() + ": the local result of rank " +
                            std::to_string(r) + " has extent " + std::to_string(extent(r, d)) +
                            " in dimension " + std::to_string(d) + ", which layout " +
                            l.to_string() + " cannot give it (global shape " + shape_string(shape) +
                            ")");
    }
    return shape;
}

/// A local result wrapped as a distributed tensor laid out by its (required) spec.
template <class Mesh, class Local, class Spec>
auto wrap_local(const Mesh& mesh, Local&& local, const Spec& spec, const call_log& log,
                const slot& what) {
    using L = std::remove_cvref_t<Local>;
    static_assert(is_xtensor<L>::value,
                  "xshard: shard_local: the callable must return xt::xtensor results (a tuple of "
                  "them for several outputs)");
    static_assert(!std::is_same_v<Spec, none_t>,
                  "xshard: shard_local needs a layout for every output (spec<...> or a layout)");
    constexpr std::size_t N = L::rank;
    const auto extent = to_array<N>(local.shape());
    if constexpr (is_layout_spec<Spec>) {
        const auto shape = global_shape_of(mesh, Spec::value, extent, what);
        note(log, what, " (declared)", Spec::value, Spec::value, "");
        return dtensor<typename L::value_type, Mesh, Spec::value>(unchecked, mesh, shape,
                                                                  std::forward<Local>(local));
    } else {
        const layout l = spec_layout(spec, N, mesh.shape());
        const auto shape = global_shape_of(mesh, l, extent, what);
        note(log, what, " (declared)", l, l, "");
        return dtensor<typename L::value_type, Mesh, dynamic_layout(N)>(
            unchecked, mesh, shape, std::forward<Local>(local), l);
    }
}

} // namespace xshard::detail
