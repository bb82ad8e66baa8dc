#pragma once
/// \file
/// The specs of shard(): how a call asks for the layout of an input or an output. A spec is
/// `xshard::spec<"[dp, mp]">` (a layout type: the plan is fixed at compile time), a `layout`
/// value, a MindSpore `strategy{4, 2}` (resolved on the mesh, see core/strategy.hpp), or
/// `xshard::none`: keep the layout, where an array every rank holds whole is replicated, or
/// split over the data-parallel axis by the mesh's dataset strategy (the layouts
/// `kept_layout` and `dataset_layout` give).

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/strategy.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <cstddef>
#include <stdexcept>
#include <tuple>

namespace xshard {

/// The spec "keep the layout / derive it".
struct none_t {};
inline constexpr none_t none{};

/// A layout type as a spec: `spec<"[dp, -]">`.
template <layout L>
struct layout_spec {
    static constexpr layout value = L;
};
template <layout L>
inline constexpr layout_spec<L> spec{};

namespace detail {

template <class S>
constexpr bool is_layout_spec = false;
template <layout L>
constexpr bool is_layout_spec<layout_spec<L>> = true;

/// A spec's layout for a tensor of rank `rank` on `mesh` (run-time specs only).
inline layout spec_layout(const layout& l, std::size_t, const mesh_shape&) {
    return l;
}
XSHARD_DECL layout spec_layout(const strategy& s, std::size_t, const mesh_shape& mesh);

/// The layout the mesh's dataset strategy gives an input or output of rank N without a spec.
template <class Mesh>
layout dataset_layout(const Mesh& mesh, std::size_t rank, const layout& current) {
    switch (mesh.dataset()) {
    case dataset_strategy::full_batch:
        return layout::replicated(rank);
    case dataset_strategy::data_parallel: {
        layout l = layout::replicated(rank);
        if (rank > 0)
            l.dims[0].push_back(mesh.shape().names[mesh.data_axis()]);
        return l;
    }
    default:
        return current;
    }
}

/// The layout `none` gives an argument without derivation: its own, or the dataset
/// strategy's for an array held whole.
template <class Mesh, class A>
layout kept_layout(const Mesh& mesh, const A& a) {
    if constexpr (distributed_tensor<A>)
        return a.layout();
    else
        return dataset_layout(mesh, A::rank, layout::replicated(A::rank));
}

/// Output J's spec: the J-th of a tuple of specs, or the one spec of a single output.
template <class Specs, std::size_t I>
const auto& spec_at(const Specs& specs) {
    if constexpr (is_tuple<Specs>::value)
        return std::get<I>(specs);
    else
        return specs;
}

} // namespace detail

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/shard/spec.ipp>
#endif
