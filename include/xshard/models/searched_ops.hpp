#pragma once
/// \file
/// The operators of the searched models (models/searched_mlp.hpp,
/// models/searched_transformer.hpp): each runs one operator of the search's chain
/// (search/network_spec.hpp) under its run-time strategy (`op_choice`), as the cost model
/// (search/cost.hpp) prices it, on a mesh with axes dp and tp.
///
///  * `searched_linear`: the product with the weight laid out by the strategy ([-, -], [-, tp]
///    or [tp, -]), the bias added where the product has no pending sum (after the reduction
///    otherwise, as a row-parallel layer does), the output redistributed to the strategy's
///    split.
///  * `searched_embedding`: token ids [tokens] over dp to rows of a table laid out likewise
///    (split by vocabulary, the rows' terms summed by the output's redistribution).
///  * `redistributed_op`: a layer without a strategy of its own (activation, normalisation,
///    attention's core), its output redistributed to the strategy's split.
/// Backward passes are the adjoints (as nn's layers): an operator's input gradient is laid out
/// as the dual of its input's layout. Weights are drawn replicated (the same values on any
/// mesh) and `set` moves them to a strategy's layouts keeping their values.

#include <xshard/core/layout.hpp>
#include <xshard/core/op_choice.hpp>
#include <xshard/nn/attention.hpp>
#include <xshard/nn/linear.hpp>
#include <xshard/nn/module.hpp>
#include <xshard/ops/embedding.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace xshard::detail {

/// Moves `w` to layout `l` keeping its values (a new weight: gradient zeroed), unless it is
/// laid out so already.
template <class D>
void move_weight(weight<D>& w, const layout& l) {
    if (!(w.value.layout() == l))
        w = weight<D>(xshard::redistribute<dynamic_layout(D::rank)>(w.value, l));
}

/// A linear operator [in, out] under a run-time strategy (see the file comment).
template <class T, mesh_type Mesh>
struct searched_linear {
    using tensor_type = nn::tensor<T, Mesh>;
    weight<nn::tensor<T, Mesh, 2>> w;
    std::optional<weight<nn::tensor<T, Mesh, 1>>> b;
    layout out = activation_layout(activation_split::rows);
    std::optional<tensor_type> x;
    layout z_layout;
    bool reduce_first = false;
    nn::kept_redistribution<T, Mesh> redistribute, adjoint, to_input_gradient;
    nn::kept_redistribution<T, Mesh, 1> to_bias_terms;

    /// Weights uniform in +-1/sqrt(in) from `seed` (as nn/linear.hpp's), the bias zero.
    searched_linear(const Mesh& mesh, std::size_t in, std::size_t outs, unsigned seed, bool bias)
        : w(nn::make_weight<T>(mesh, std::array{in, outs}, weight_layout(weight_split::replicated),
                               seed,
                               std::uniform_real_distribution<T>(-T(1) / std::sqrt(T(in)),
                                                                 T(1) / std::sqrt(T(in))))) {
        if (bias)
            b.emplace(nn::constant_weight<T>(mesh, std::array{outs},
                                             bias_layout(weight_split::replicated), T(0)));
    }

    void set(const op_choice& c) {
        move_weight(w, weight_layout(c.weight));
        if (b)
            move_weight(*b, bias_layout(c.weight));
        out = activation_layout(c.out);
    }

    tensor_type forward(const tensor_type& in) {
        x = in;
        auto z = xshard::ops::matmul(in, w.value);
        z_layout = z.layout();
        reduce_first = z.layout().is_partial();
        if (!b)
            return redistribute(std::move(z), out);
        if (reduce_first)
            return xshard::ops::add(redistribute(std::move(z), out), b->value);
        return redistribute(xshard::ops::add(z, b->value), out);
    }

    tensor_type backward(const tensor_type& dy) {
        const auto g = adjoint.adjoint(dy, z_layout);
        if (b)
            nn::accumulate(*b, xshard::ops::sum<0>(reduce_first ? dy : g), to_bias_terms);
        nn::accumulate_product(w, xshard::ops::transposed(*x), g);
        // dx laid out as x's gradient (the dual of x's layout), as nn's layers do.
        return to_input_gradient(xshard::ops::matmul(g, xshard::ops::transposed(w.value)),
                                 dual(x->layout(), x->mesh().shape()));
    }

    friend void visit_parameters(searched_linear& l, auto&& visit) {
        visit("weight", l.w);
        if (l.b)
            visit("bias", *l.b);
    }
};

/// An embedding [vocabulary, features] under a run-time strategy: ids [tokens] (taken over dp)
/// to [tokens, features] rows; the table replicated, split by features ([-, tp]) or by
/// vocabulary ([tp, -]: each rank's rows of its block, summed by the output's
/// redistribution). Rows drawn from N(0, 0.02^2), as nn/embedding.hpp's.
template <class T, mesh_type Mesh>
struct searched_embedding {
    using tensor_type = nn::tensor<T, Mesh>;
    using ids_type = nn::tensor<std::int64_t, Mesh, 1>;
    weight<nn::tensor<T, Mesh, 2>> table;
    layout out = activation_layout(activation_split::rows);
    layout z_layout;
    std::optional<ids_type> ids;
    nn::kept_redistribution<T, Mesh> redistribute, adjoint;

    searched_embedding(const Mesh& mesh, std::size_t vocabulary, std::size_t features,
                       unsigned seed)
        : table(nn::make_weight<T>(mesh, std::array{vocabulary, features},
                                   weight_layout(weight_split::replicated), seed,
                                   std::normal_distribution<T>(T(0), T(0.02)))) {}

    void set(const op_choice& c) {
        move_weight(table, weight_layout(c.weight));
        out = activation_layout(c.out);
    }

    /// Collective: the ids' range is checked on every rank (one all-reduce of an int).
    tensor_type forward(const ids_type& in) {
        const auto over_dp = layout::parse("[dp]");
        ids = in.layout() == over_dp ? in : xshard::redistribute<dynamic_layout(1)>(in, over_dp);
        const auto& mesh = in.mesh();
        check_labels(mesh.comm(), ids->local(), table.value.shape()[0], "embedding");
        const auto tb = table.value.block();
        // Each rank's rows of its vocabulary block: a pending sum over the axes splitting it.
        z_layout = layout::parse("[dp, -]");
        z_layout.dims[1] = table.value.layout().axes(1);
        z_layout.partial = table.value.layout().axes(0);
        const std::array<std::size_t, 2> shape{in.shape()[0], table.value.shape()[1]};
        auto z = tensor_type(unchecked, mesh, shape,
                             embedding_rows<2>(ids->local(), table.value.local(), tb), z_layout);
        return redistribute(std::move(z), out);
    }

    /// Adds the gradient rows to the table; the ids have no gradient.
    void backward(const tensor_type& dy) {
        const auto dz = adjoint.adjoint(dy, z_layout);
        add_embedding_rows(table.terms().local(), ids->local(), dz.local(), table.value.block());
    }

    friend void visit_parameters(searched_embedding& e, auto&& visit) { visit("table", e.table); }
};

/// Attention's core on [tokens, 3 x features] (queries, keys, values grouped by head, as
/// nn/attention.hpp's) to [tokens, features], in the input's layout: whole sequences per
/// rank (checked on every rank alike) and whole heads (the columns over tp hold heads / tp
/// heads each).
template <class T, mesh_type Mesh>
struct attention_core {
    using tensor_type = nn::tensor<T, Mesh>;
    std::size_t sequence;
    nn::attention_heads<T> heads;
    attention_core(const Mesh&, std::size_t features, std::size_t head_count, std::size_t seq)
        : sequence(seq)
        , heads(features / head_count, seq, true) {}

    tensor_type forward(const tensor_type& qkv) {
        nn::check_whole_sequences(qkv, sequence, "attention");
        const std::array<std::size_t, 2> shape{qkv.shape()[0], qkv.shape()[1] / 3};
        return tensor_type(unchecked, qkv.mesh(), shape, heads.forward(qkv.local()),
                           qkv.layout());
    }
    tensor_type backward(const tensor_type& dy) {
        const std::array<std::size_t, 2> shape{dy.shape()[0], 3 * dy.shape()[1]};
        return tensor_type(unchecked, dy.mesh(), shape, heads.backward(dy.local()), dy.layout());
    }
};

/// A layer whose output is redistributed to its strategy's split (see the file comment).
/// `Layer` has forward(x) and backward(dy) on [rows, features] tensors.
template <class T, mesh_type Mesh, class Layer>
struct redistributed_op {
    using tensor_type = nn::tensor<T, Mesh>;
    Layer f;
    layout out = activation_layout(activation_split::rows);
    layout y_layout;
    nn::kept_redistribution<T, Mesh> redistribute, adjoint;

    template <class... A>
    explicit redistributed_op(const Mesh& mesh, A&&... a)
        : f(mesh, std::forward<A>(a)...) {}

    void set(const op_choice& c) { out = activation_layout(c.out); }

    tensor_type forward(const tensor_type& x) {
        auto y = f.forward(x);
        y_layout = y.layout();
        return redistribute(std::move(y), out);
    }
    tensor_type backward(const tensor_type& dy) { return f.backward(adjoint.adjoint(dy, y_layout)); }

    /// The layer's parameters, under the layer's own names (none for an activation).
    friend void visit_parameters(redistributed_op& op, auto&& visit) {
        if constexpr (has_visit_parameters<Layer>)
            visit_parameters(op.f, visit);
    }
};

} // namespace xshard::detail
