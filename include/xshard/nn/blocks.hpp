#pragma once
/// \file
/// Blocks of tensor-parallel layers: Megatron's MLP (column-parallel, GELU, row-parallel: one
/// all-reduce forward, one backward) and a pre-norm transformer block
/// (x + attention(norm(x)), then + mlp(norm(.))).

#include <xshard/nn/activation.hpp>
#include <xshard/nn/attention.hpp>
#include <xshard/nn/layer_normalization.hpp>
#include <xshard/nn/linear.hpp>

namespace xshard::nn {

template <class T, mesh_type Mesh>
class mlp_block {
public:
    mlp_block(const Mesh& mesh, std::size_t features, std::size_t hidden, unsigned seed,
              nn::axes axes = {})
        : up_(mesh, features, hidden, seed, {.axes = axes})
        , act_(mesh)
        , down_(mesh, hidden, features, seed + 1, {.axes = axes}) {}

    tensor<T, Mesh> forward(const tensor<T, Mesh>& x) {
        return down_.forward(act_.forward(up_.forward(x)));
    }
    tensor<T, Mesh> backward(const tensor<T, Mesh>& dy) {
        return up_.backward(act_.backward(down_.backward(dy)));
    }

    friend void visit_parameters(mlp_block& b, auto&& visit) {
        visit("up", b.up_);
        visit("down", b.down_);
    }

private:
    column_parallel_linear<T, Mesh> up_;
    gelu_activation<T, Mesh> act_;
    row_parallel_linear<T, Mesh> down_;
};

template <class T, mesh_type Mesh>
class transformer_block {
public:
    struct options {
        nn::axes axes = {};
        std::size_t heads = 1;
        std::size_t sequence = 1;
        std::size_t hidden = 0; ///< of the MLP; 4 x features if 0
    };

    transformer_block(const Mesh& mesh, std::size_t features, unsigned seed, options o)
        : norm1_(mesh, features)
        , attention_(mesh, features, seed, {o.axes, o.heads, o.sequence, true})
        , norm2_(mesh, features)
        , mlp_(mesh, features, o.hidden ? o.hidden : 4 * features, seed + 2, o.axes) {}

    tensor<T, Mesh> forward(const tensor<T, Mesh>& x) {
        auto h = xshard::ops::add(x, attention_.forward(norm1_.forward(x)));
        return xshard::ops::add(h, mlp_.forward(norm2_.forward(h)));
    }

    tensor<T, Mesh> backward(const tensor<T, Mesh>& dy) {
        const auto dh = xshard::ops::add(dy, norm2_.backward(mlp_.backward(dy)));
        return xshard::ops::add(dh, norm1_.backward(attention_.backward(dh)));
    }

    friend void visit_parameters(transformer_block& b, auto&& visit) {
        visit("norm1", b.norm1_);
        visit("attention", b.attention_);
        visit("norm2", b.norm2_);
        visit("mlp", b.mlp_);
    }

private:
    layer_normalization<T, Mesh> norm1_;
    self_attention<T, Mesh> attention_;
    layer_normalization<T, Mesh> norm2_;
    mlp_block<T, Mesh> mlp_;
};

} // namespace xshard::nn
