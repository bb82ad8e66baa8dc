#pragma once
/// \file
/// Custom-VJP operations (JAX's custom_vjp, PyTorch's autograd.Function): a node whose
/// forward and backward are the user's own, on distributed tensors. Any layer of xshard/nn/
/// (its tuned forward and hand-written backward) or a user's fused kernel enters a program so,
/// mixed with traced code:
///
///     nn::column_parallel_linear<double, mesh_t> up(mesh, 512, 2048, seed);
///     auto net = [&](xshard::traced_tensor x) {
///         auto h = xshard::apply_layer(up, mesh, "up", x, 2048, xshard::features_split("tp"));
///         return xshard::ops::relu(h);
///     };
///
/// The node's result has the operand's shape with the last dimension `out_features`, laid out
/// as a `custom_layout` rule says (by default: the operand's rows as they are split, the
/// features whole). The layer's weights are the compiled program's weights too (named
/// "<name>.<weight>"), so optimizers, gradient synchronisation and checkpoints see them.
/// A layer node belongs to the layer's mesh and element type: compiling its program onto
/// another raises. A copy of a compiled program (a pipeline's activation slot) runs its own
/// copy of each node's layer: copies of the weights and room for its own activations.

#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/graph/primitive.hpp>
#include <xshard/graph/trace.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/param/weight.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace xshard {

/// A pointer to a weight of rank 1 to 4 of element type T on mesh type Mesh.
template <class T, mesh_type Mesh>
using weight_ref = std::variant<weight<dtensor<T, Mesh, dynamic_layout(1)>>*,
                                weight<dtensor<T, Mesh, dynamic_layout(2)>>*,
                                weight<dtensor<T, Mesh, dynamic_layout(3)>>*,
                                weight<dtensor<T, Mesh, dynamic_layout(4)>>*>;

/// The typed half of a custom node: its kernels for element type T on mesh type Mesh, and
/// its weights.
template <class T, mesh_type Mesh>
struct custom_kernels : custom_op_base {
    virtual void forward(const forward_args& x) const = 0;
    virtual void vjp(const vjp_args& v) const = 0;
    /// Calls `f(name, weight)` for each weight the operation holds.
    virtual void visit_weights(
        const std::function<void(const std::string&, weight_ref<T, Mesh>)>& f) const = 0;
    /// The same operation with a state of its own: a copy of its layer (weights, kept
    /// activations). Throws xshard::error naming `node` when the layer cannot be copied.
    virtual std::shared_ptr<const custom_kernels> clone(const std::string& node) const = 0;
};

/// The layout of a custom node's result from its operand's: the rows as they are split, the
/// last dimension whole (`features_whole`) or split over an axis (`features_split`: the
/// operand's rows are then whole along that axis, as a column-parallel layer reads them).
struct custom_layout {
    std::string feature_axis; ///< "" for whole
};
inline custom_layout features_whole() { return {}; }
inline custom_layout features_split(std::string axis) { return {std::move(axis)}; }

namespace detail {

/// A copy of a shard into an xtensor of rank N (the layer's operand).
template <class T, mesh_type Mesh, std::size_t N>
dtensor<T, Mesh, dynamic_layout(N)> as_dtensor(const Mesh& mesh, const shard_type& s,
                                               const void* data) {
    using D = dtensor<T, Mesh, dynamic_layout(N)>;
    std::array<std::size_t, N> g{}, l{};
    for (std::size_t d = 0; d < N; ++d) {
        g[d] = s.global[d];
        l[d] = s.local[d];
    }
    auto local = D::local_type::from_shape(l);
    std::memcpy(local.data(), data, local.size() * sizeof(T));
    return D(unchecked, mesh, g, std::move(local), s.l);
}

/// Writes (or adds) `t`'s shard into `out`, which holds `count` elements.
template <class D>
void store_shard(const D& t, void* out, std::size_t count, bool add) {
    using T = typename D::value_type;
    if (t.local().size() != count)
        throw error("xshard: a custom operation's result has " +
                    std::to_string(t.local().size()) + " local elements where its layout gives " +
                    std::to_string(count));
    T* o = static_cast<T*>(out);
    const T* in = t.local().data();
    for (std::size_t i = 0; i < count; ++i)
        o[i] = add ? o[i] + in[i] : in[i];
}

/// A layer of xshard/nn/ (forward(x), backward(dy), visit_parameters) as a custom node of
/// rank-N operand and result: the user's layer (which outlives the program), or one the node
/// owns (a custom_vjp's functions, a clone's copy).
template <class Layer, class T, mesh_type Mesh, std::size_t N>
class layer_node final : public custom_kernels<T, Mesh> {
public:
    layer_node(Layer& layer, const Mesh& mesh, std::size_t out_features, custom_layout out)
        : layer_(&layer)
        , mesh_(mesh)
        , out_features_(out_features)
        , out_(std::move(out)) {}
    layer_node(std::shared_ptr<Layer> owned, const Mesh& mesh, std::size_t out_features,
               custom_layout out)
        : layer_node(*owned, mesh, out_features, std::move(out)) {
        owned_ = std::move(owned);
    }

    std::vector<result_spec> infer(std::span<const operand_type> ops) const override {
        if (ops.size() != 1 || ops[0].shape.size() != N || ops[0].type != dtype_for<T>())
            throw std::invalid_argument("the layer takes one " + std::string(to_string(dtype_for<T>())) +
                                        " operand of " + std::to_string(N) + " dimensions");
        value_shape s = ops[0].shape;
        s.back() = out_features_;
        return {{s, ops[0].type}};
    }

    layout_choice rule(std::span<const operand_type>, std::vector<layout> asked,
                       const mesh_shape& mesh) const override {
        layout in = whole_terms(asked[0]);
        in.dims[N - 1] = {};
        if (!out_.feature_axis.empty()) {
            if (!mesh.find(out_.feature_axis))
                throw std::invalid_argument("the feature axis '" + out_.feature_axis +
                                            "' is not an axis of mesh(" + mesh.to_string() + ")");
            // The layer splits its features over the axis, so its rows are whole there.
            const axis_name feature(out_.feature_axis);
            for (std::size_t d = 0; d + 1 < N; ++d) {
                dim_axes kept;
                for (const auto& a : in.dims[d])
                    if (!(a == feature))
                        kept.push_back(a);
                in.dims[d] = kept;
            }
        }
        layout out = in;
        if (!out_.feature_axis.empty())
            out.dims[N - 1] = {axis_name(out_.feature_axis)};
        return {{in}, {out}};
    }

    void forward(const forward_args& x) const override {
        check_mesh(x.shards);
        const auto in = as_dtensor<T, Mesh, N>(mesh_, x.shards.operands[0], x.operands[0]);
        const auto y = layer_->forward(in);
        if (!(y.layout() == x.shards.results[0].l))
            throw error("xshard: the layer of node " + x.shards.node->name + " returned " +
                        y.layout().to_string() + " where the program expects " +
                        x.shards.results[0].l.to_string() + " (say so with custom_layout)");
        store_shard(y, x.results[0], x.shards.results[0].count(), false);
    }

    void vjp(const vjp_args& v) const override {
        const auto& s = v.shards;
        if (!v.result_cotangents[0]) {
            if (v.operand_cotangents[0] && !v.accumulate[0])
                std::memset(v.operand_cotangents[0], 0, s.operands[0].count() * sizeof(T));
            return;
        }
        shard_type dy = s.results[0];
        dy.l = cotangent_layout(dy.l, s.mesh->shape);
        const auto dx = layer_->backward(as_dtensor<T, Mesh, N>(mesh_, dy, v.result_cotangents[0]));
        if (v.operand_cotangents[0])
            store_shard(dx, v.operand_cotangents[0], s.operands[0].count(), v.accumulate[0]);
    }

    void visit_weights(
        const std::function<void(const std::string&, weight_ref<T, Mesh>)>& f) const override {
        for_each_weight(*layer_, [&](const std::string& name, auto& w) {
            f(name, weight_ref<T, Mesh>(&w));
        });
    }

    std::shared_ptr<const custom_kernels<T, Mesh>> clone(const std::string& node) const override {
        if constexpr (std::is_copy_constructible_v<Layer>)
            return std::make_shared<layer_node>(std::make_shared<Layer>(*layer_), mesh_,
                                                out_features_, out_);
        else
            throw error("xshard: the custom node " + node +
                        " runs a layer that cannot be copied, so a copy of its program (a "
                        "pipeline's activation slot) cannot hold activations of its own");
    }

private:
    void check_mesh(const node_shards& s) const {
        if (!(mesh_.shape() == s.mesh->shape) || mesh_.rank() != s.mesh->rank)
            throw error("xshard: node " + s.node->name +
                        ": the layer lives on another mesh than the program is compiled onto");
    }

    Layer* layer_;
    std::shared_ptr<Layer> owned_;
    Mesh mesh_;
    std::size_t out_features_;
    custom_layout out_;
};

} // namespace detail

/// Records `layer` (a layer of xshard/nn/ on `mesh`: forward(x), backward(dy) and
/// visit_parameters on rank-N distributed tensors of run-time layout) as one node named
/// `name` applied to `x`, whose result has `out_features` last features laid out as `out`
/// says (see the file comment). The layer must outlive the compiled program.
template <std::size_t N = 2, class T, mesh_type Mesh, template <class, class> class Layer>
traced_tensor apply_layer(Layer<T, Mesh>& layer, const Mesh& mesh, std::string_view name,
                          const traced_tensor& x, std::size_t out_features,
                          custom_layout out = features_whole()) {
    auto node = std::make_shared<detail::layer_node<Layer<T, Mesh>, T, Mesh, N>>(
        layer, mesh, out_features, std::move(out));
    return traced_tensor::record(name, {}, {}, {x}, std::move(node)).front();
}

namespace detail {

/// A user's forward and backward on rank-N distributed tensors, as a layer without weights.
template <class T, mesh_type Mesh, std::size_t N, class Forward, class Backward>
struct function_layer {
    using tensor_type = dtensor<T, Mesh, dynamic_layout(N)>;
    Forward f;
    Backward b;
    std::optional<tensor_type> x;
    tensor_type forward(const tensor_type& in) {
        x = in;
        return f(in);
    }
    tensor_type backward(const tensor_type& dy) { return b(*x, dy); }
    friend void visit_parameters(function_layer&, auto&&) {}
};

} // namespace detail

/// Records a custom-VJP operation named `name` on `x` (JAX's custom_vjp): `forward(x)` gives
/// the result and `backward(x, dy)` the cotangent of x from the result's, both on rank-N
/// distributed tensors of element type T on `mesh` (x laid out with its rows as the program
/// splits them and its last dimension whole; dy laid out as the dual of the result's layout,
/// and the returned cotangent as the dual of x's: core/layout.hpp). The result has x's shape
/// with `out_features` last features, laid out as `out` says.
template <class T, std::size_t N = 2, mesh_type Mesh, class Forward, class Backward>
traced_tensor custom_vjp(const Mesh& mesh, std::string_view name, const traced_tensor& x,
                         Forward forward, Backward backward, std::size_t out_features = 0,
                         custom_layout out = features_whole()) {
    using L = detail::function_layer<T, Mesh, N, Forward, Backward>;
    const std::size_t features = out_features ? out_features : x.shape().back();
    auto node = std::make_shared<detail::layer_node<L, T, Mesh, N>>(
        std::make_shared<L>(L{std::move(forward), std::move(backward), std::nullopt}), mesh,
        features, std::move(out));
    return traced_tensor::record(name, {}, {}, {x}, std::move(node)).front();
}

} // namespace xshard
